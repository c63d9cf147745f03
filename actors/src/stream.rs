//! A run's event stream: live events, gap-free, each once, backed by the journal.
//!
//! A stream subscribes to the run's live channel first and reads the journal second,
//! then delivers by `event_index`: an index already delivered is skipped, a gap (a
//! lagging reader, or a subscription that began late) is filled from the journal.
//! So a stream may start at any index, at any time, even long after the run ended.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::broadcast;
use turnstile_journal::limits::STREAM_FOLLOW_EVERY_MS;
use turnstile_journal::{EventIndex, Journal, RunId, Seq, SessionId};

use turnstile_journal::limits::STREAM_REFILL_EVENTS_MAX;

use crate::api::RuntimeError;
use crate::run::WireEvent;

/// See the module documentation.
pub struct RunEvents {
    journal: Journal,
    session_id: SessionId,
    run_id: RunId,
    /// Where the run's records begin in its session stream, so refills skip earlier runs.
    from_seq: Seq,
    /// The next sequence to read from the journal: a refill goes on from there, never
    /// from the run's start again.
    scan_seq: Seq,
    live: Option<broadcast::Receiver<Arc<WireEvent>>>,
    next: EventIndex,
    backlog: VecDeque<Arc<WireEvent>>,
    /// The journal has been read up to where the live feed takes over: what was
    /// journaled before the reader subscribed is delivered before it waits for more.
    caught_up: bool,
    /// The journal is shared (PostgreSQL): a run without a live feed here may be running
    /// on another replica, or be taken over by one, so the journal is followed until the
    /// run's terminal event.
    follow: bool,
    done: bool,
}

const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(STREAM_FOLLOW_EVERY_MS);

impl RunEvents {
    pub(crate) fn new(
        journal: Journal,
        session_id: SessionId,
        run_id: RunId,
        from_seq: Seq,
        live: Option<broadcast::Receiver<Arc<WireEvent>>>,
        next: EventIndex,
    ) -> Self {
        RunEvents {
            follow: journal.is_shared(),
            journal,
            session_id,
            run_id,
            from_seq,
            scan_seq: from_seq,
            live,
            next,
            backlog: VecDeque::new(),
            caught_up: false,
            done: false,
        }
    }

    /// Says the live feed was subscribed before any event this stream shows was sent
    /// (a run's own handle, from its acceptance): nothing is read from the journal
    /// unless the feed skips an index (a lagging reader).
    pub(crate) fn subscribed_before_its_events(&mut self) {
        self.caught_up = true;
    }

    /// The run.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// Where the run's records this stream reads begin in its session stream.
    pub fn from_seq(&self) -> Seq {
        self.from_seq
    }

    /// The index of the event `next` returns.
    pub fn next_index(&self) -> EventIndex {
        self.next
    }

    /// The next event, or `None` after the terminal one (or after an error). On sled a
    /// run whose process stopped before it ended also ends the stream (its terminal
    /// event comes with recovery); on a shared journal the stream follows the run to its
    /// terminal event on whichever replica ends it.
    pub async fn next(&mut self) -> Option<Result<Arc<WireEvent>, RuntimeError>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(event) = self.backlog.pop_front() {
                if event.event_index < self.next {
                    continue;
                }
                return Some(Ok(self.deliver(event)));
            }
            if self.live.is_some() && !self.caught_up {
                // A live run's earlier events are in the journal (durable before
                // visible), the later ones in the feed it subscribed to first: read the
                // journal to its end before waiting, or a run that is quiet for a while
                // would hold back events that happened already.
                if let Err(error) = self.refill() {
                    self.done = true;
                    return Some(Err(error));
                }
                if self.backlog.is_empty() {
                    self.caught_up = true;
                }
                continue;
            }
            let Some(live) = self.live.as_mut() else {
                // No live run here: on sled the journal has everything there will be;
                // on a shared journal the run may go on elsewhere.
                if let Err(error) = self.refill() {
                    self.done = true;
                    return Some(Err(error));
                }
                if self.backlog.is_empty() {
                    if self.follow {
                        self.journal
                            .wait_for_session(&self.session_id, FOLLOW_EVERY)
                            .await;
                    } else {
                        self.done = true;
                    }
                }
                continue;
            };
            match live.recv().await {
                Ok(event) if event.event_index < self.next => continue,
                Ok(event) if event.event_index == self.next => {
                    return Some(Ok(self.deliver(event)));
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    if let Err(error) = self.refill() {
                        self.done = true;
                        return Some(Err(error));
                    }
                }
                Err(broadcast::error::RecvError::Closed) => self.live = None,
            }
        }
    }

    fn deliver(&mut self, event: Arc<WireEvent>) -> Arc<WireEvent> {
        self.next = event.event_index.next();
        if event.is_terminal() {
            self.done = true;
        } else if event.event.stops_stream() && self.backlog.is_empty() {
            // A pause: the stream stops here unless the run has gone on already (a
            // replay of a run continued since reads on past it).
            match self.refill() {
                Ok(()) => self.done = self.backlog.is_empty(),
                Err(error) => {
                    tracing::warn!(run_id = %self.run_id, %error, "journal unreadable after a pause");
                    self.done = true;
                }
            }
        }
        event
    }

    fn refill(&mut self) -> Result<(), RuntimeError> {
        // Resumes where the last refill stopped; stops at the run's end, or once a
        // batch is in the backlog (memory stays bounded for a run of any length).
        let from = self.scan_seq.max(self.from_seq);
        for event in self.journal.read_session_events(&self.session_id, from) {
            let event = event?;
            self.scan_seq = event.seq.next();
            let Some(event) = WireEvent::from_session_event(event) else {
                continue;
            };
            if event.run_id != self.run_id || event.event_index < self.next {
                continue;
            }
            let terminal = event.is_terminal();
            self.backlog.push_back(Arc::new(event));
            if terminal || self.backlog.len() >= STREAM_REFILL_EVENTS_MAX {
                break;
            }
        }
        Ok(())
    }

    /// The same events as a `Stream`.
    pub fn into_stream(self) -> impl Stream<Item = Result<Arc<WireEvent>, RuntimeError>> + Send {
        futures::stream::unfold(self, |mut events| async move {
            let item = events.next().await?;
            Some((item, events))
        })
    }
}
