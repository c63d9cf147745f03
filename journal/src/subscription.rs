//! A live reader of the whole journal that never blocks writers.
//!
//! Records arrive through a bounded broadcast channel once they are durable. A reader
//! that falls behind loses channel messages, notices the gap by position, and re-reads
//! the missing records from the journal: it may be slow, it never skips or repeats.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::broadcast;

use crate::Error;
use crate::ids::JournalPos;
use crate::journal::Journal;
use crate::limits::SUBSCRIPTION_REFILL_RECORDS;
use crate::types::Recorded;

/// See the module documentation.
pub struct Subscription {
    journal: Journal,
    live: broadcast::Receiver<Arc<Recorded>>,
    next: JournalPos,
    backlog: VecDeque<Arc<Recorded>>,
}

impl Journal {
    /// A live subscription to every record from `from` on. It never blocks writers: a
    /// reader that falls behind the bounded channel re-reads from the journal.
    pub fn subscribe_from(&self, from: JournalPos) -> Subscription {
        Subscription::new(self.clone(), self.live(), from)
    }
}

impl Subscription {
    pub(crate) fn new(
        journal: Journal,
        live: broadcast::Receiver<Arc<Recorded>>,
        from: JournalPos,
    ) -> Self {
        Subscription {
            journal,
            live,
            next: from,
            backlog: VecDeque::new(),
        }
    }

    /// The position of the record `next` returns.
    pub fn position(&self) -> JournalPos {
        self.next
    }

    /// The next record in global order; waits for one to be committed.
    /// Fails with [`Error::Stopped`] when the journal closes.
    pub async fn next(&mut self) -> Result<Arc<Recorded>, Error> {
        loop {
            if let Some(record) = self.backlog.pop_front() {
                self.next = record.pos.next();
                return Ok(record);
            }
            // A record already on the live feed first: the journal's head may be past
            // it (an append answers before its records reach the feed), and reading it
            // back would be wasted.
            match self.live.try_recv() {
                Ok(record) if record.pos < self.next => continue,
                Ok(record) if record.pos == self.next => {
                    self.next = record.pos.next();
                    return Ok(record);
                }
                // A gap or a lag: the records are durable, so read them back.
                Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    self.refill()?;
                    continue;
                }
                Err(_) => {}
            }
            if self.next < self.journal.next_pos() {
                self.refill()?;
                continue;
            }
            match self.live.recv().await {
                Ok(record) if record.pos < self.next => continue,
                Ok(record) if record.pos == self.next => {
                    self.next = record.pos.next();
                    return Ok(record);
                }
                // A gap or a lag: the records are durable, so read them back.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => self.refill()?,
                Err(broadcast::error::RecvError::Closed) => return Err(Error::Stopped),
            }
        }
    }

    fn refill(&mut self) -> Result<(), Error> {
        for record in self
            .journal
            .read_from(self.next)
            .take(SUBSCRIPTION_REFILL_RECORDS)
        {
            self.backlog.push_back(Arc::new(record?));
        }
        Ok(())
    }
}
