//! The follower: positions that other processes gave, so `next_pos` and the live feed
//! include their records; this replica's own records go to the feed from memory, in
//! position order with the others'.

use crate::ids::JournalPos;
use crate::pg::Inner;
use crate::pg::inbox::{EVENTS_CHANNEL, Notice, RESYNC};
use crate::pg::reads::decode;
use crate::types::{Hashing, Recorded};
use crate::{Error, limits};
use deadpool_postgres::Pool;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::broadcast;

/// Follows the positions other processes give, so `next_pos` and the live feed include
/// their records: woken by a local append, by another replica's notification that a
/// stream grew, or at the latest every [`limits::POSTGRES_FOLLOW_POLL_MS`] while other
/// replicas are alive (alone, nobody else positions records: an idle replica alone asks
/// the database nothing but its heartbeat).
pub(super) async fn follower(inner: std::sync::Weak<Inner>) {
    let Some(mut notices) = inner.upgrade().map(|inner| inner.notices.subscribe()) else {
        return;
    };
    loop {
        let (appended, pool, others) = match inner.upgrade() {
            Some(inner) if !inner.closed.load(Ordering::SeqCst) => (
                inner.appended.clone(),
                inner.pool.clone(),
                inner.others.load(Ordering::SeqCst),
            ),
            _ => return,
        };
        tokio::select! {
            _ = appended.notified() => {}
            _ = grown(&mut notices) => {}
            _ = tokio::time::sleep(Duration::from_millis(limits::POSTGRES_FOLLOW_POLL_MS)) => {
                if !others {
                    continue;
                }
            }
        }
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let followed = follow_once(&strong, &pool).await;
        if let Err(error) = followed {
            tracing::warn!(%error, "following the PostgreSQL journal failed; retrying");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Waits for a notification that a stream grew (or that some may have been missed).
async fn grown(notices: &mut broadcast::Receiver<Notice>) {
    loop {
        match notices.recv().await {
            Ok(notice) if notice.own => {}
            Ok(notice) if notice.channel == EVENTS_CHANNEL || notice.channel == RESYNC => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// The live feed's order: the next position it hands on, and this replica's own
/// records waiting there for the others' records before them.
pub(super) struct Feed {
    delivered: Option<u64>,
    own: BTreeMap<u64, Arc<Recorded>>,
}

impl Feed {
    /// A feed that hands on records from `next_pos` on.
    pub(super) fn new(next_pos: u64) -> Feed {
        Feed {
            delivered: Some(next_pos),
            own: BTreeMap::new(),
        }
    }

    /// Hands on `record` if it is the next one, then the own records that follow it.
    fn hand_on(&mut self, inner: &Inner, record: Arc<Recorded>) {
        let Some(delivered) = self.delivered.as_mut() else {
            return;
        };
        if record.pos.0 != *delivered {
            return;
        }
        *delivered += 1;
        let _ = inner.live.send(record);
        while let Some(next) = self.own.remove(delivered) {
            *delivered += 1;
            let _ = inner.live.send(next);
        }
        inner.next_pos.fetch_max(*delivered, Ordering::SeqCst);
    }
}

/// This replica's own appended records: on the live feed at once when nothing is
/// before them, else kept for the follower, which hands them on in position order
/// after the others' records before them without reading them back (kept only while
/// the feed has receivers, and bounded: past the bound they are read back). Answers
/// whether the follower has work: records of others before these (a gap).
pub(super) fn deliver_own(inner: &Inner, records: &[Arc<Recorded>]) -> bool {
    let Ok(mut feed) = inner.feed.lock() else {
        return true;
    };
    let mut gap = false;
    for record in records {
        gap |= feed.delivered != Some(record.pos.0);
        match feed.delivered {
            Some(delivered) if record.pos.0 == delivered => feed.hand_on(inner, record.clone()),
            Some(delivered)
                if record.pos.0 > delivered
                    && inner.live.receiver_count() > 0
                    && feed.own.len() < limits::POSTGRES_OWN_RECORDS_KEPT =>
            {
                feed.own.insert(record.pos.0, record.clone());
            }
            _ => {}
        }
    }
    gap
}

pub(super) async fn follow_once(inner: &Inner, pool: &Pool) -> Result<(), Error> {
    let client = pool.get().await?;
    // With an own record waiting, the others' before it are known to be there: the
    // global order's lock is held to commit, so every position below one this replica
    // was given belongs to a commit before it. They are read without asking where the
    // order ends (the others' later records come with their notification, or the poll).
    let waiting = inner
        .feed
        .lock()
        .map_err(|_| Error::Stopped)?
        .own
        .keys()
        .next_back()
        .copied();
    let next = match waiting {
        Some(own) => own,
        None => {
            let row = client
                .query_one(
                    &client
                        .prepare_cached("SELECT next_pos FROM turnstile.positions")
                        .await?,
                    &[],
                )
                .await?;
            let next = row.get::<_, i64>(0) as u64;
            inner.next_pos.fetch_max(next, Ordering::SeqCst);
            next
        }
    };
    loop {
        // What the feed still misses before `next`, up to this replica's next own record.
        let (at, until) = {
            let mut feed = inner.feed.lock().map_err(|_| Error::Stopped)?;
            let at = match feed.delivered {
                Some(at) if inner.live.receiver_count() > 0 => at,
                // Nobody listens (or a first look): the feed starts from here.
                _ => {
                    feed.delivered = Some(next.max(feed.delivered.unwrap_or(0)));
                    feed.own.clear();
                    return Ok(());
                }
            };
            let until = feed.own.keys().next().copied().unwrap_or(next).min(next);
            (at, until)
        };
        if at >= until {
            return Ok(());
        }
        let rows = client
            .query(
                &client
                    .prepare_cached(
                        "SELECT pos, record FROM turnstile.events WHERE pos >= $1 AND pos < $2 \
                         ORDER BY pos LIMIT $3",
                    )
                    .await?,
                &[
                    &(at as i64),
                    &(until as i64),
                    &limits::POSTGRES_PAGE_RECORDS,
                ],
            )
            .await?;
        if rows.is_empty() {
            return Ok(());
        }
        let mut records = Vec::with_capacity(rows.len());
        for row in rows {
            let pos = row.get::<_, i64>(0) as u64;
            let bytes: Vec<u8> = row.get(1);
            records.push(decode(&client, &bytes, JournalPos(pos), Hashing::Compute).await?);
        }
        let mut feed = inner.feed.lock().map_err(|_| Error::Stopped)?;
        for record in records {
            feed.hand_on(inner, Arc::new(record));
        }
    }
}
