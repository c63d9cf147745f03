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
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::broadcast;

/// Follows the positions other processes give, so `next_pos` and the live feed include
/// their records: woken by a local append, by another replica's notification that a
/// stream grew, or at the latest every [`limits::POSTGRES_FOLLOW_POLL_MS`].
pub(super) async fn follower(inner: std::sync::Weak<Inner>) {
    let mut cursor: Option<u64> = None;
    let Some(mut notices) = inner.upgrade().map(|inner| inner.notices.subscribe()) else {
        return;
    };
    loop {
        let (appended, pool) = match inner.upgrade() {
            Some(inner) if !inner.closed.load(Ordering::SeqCst) => {
                (inner.appended.clone(), inner.pool.clone())
            }
            _ => return,
        };
        tokio::select! {
            _ = appended.notified() => {}
            _ = grown(&mut notices) => {}
            _ = tokio::time::sleep(Duration::from_millis(limits::POSTGRES_FOLLOW_POLL_MS)) => {}
        }
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let followed = follow_once(&strong, &pool, &mut cursor).await;
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
            Ok(notice) if notice.channel == EVENTS_CHANNEL || notice.channel == RESYNC => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// Keeps this replica's own appended records for the follower, which hands them to the
/// live feed in position order without reading them back (only while the feed has
/// receivers; bounded: past the bound the follower reads them as any other).
pub(super) fn keep_own(inner: &Inner, records: &[Arc<Recorded>]) {
    if inner.live.receiver_count() == 0 {
        return;
    }
    if let Ok(mut own) = inner.own.lock() {
        if own.len() + records.len() > limits::POSTGRES_OWN_RECORDS_KEPT {
            return;
        }
        for record in records {
            own.insert(record.pos.0, record.clone());
        }
    }
}

pub(super) async fn follow_once(
    inner: &Inner,
    pool: &Pool,
    cursor: &mut Option<u64>,
) -> Result<(), Error> {
    let client = pool.get().await?;
    let row = client
        .query_one(
            &client
                .prepare_cached("SELECT next_pos FROM turnstile.positions")
                .await?,
            &[],
        )
        .await?;
    let next = row.get::<_, i64>(0) as u64;
    let from = cursor.unwrap_or(next);
    if inner.live.receiver_count() == 0 {
        *cursor = Some(next);
        inner.next_pos.fetch_max(next, Ordering::SeqCst);
        if let Ok(mut own) = inner.own.lock() {
            own.clear();
        }
        return Ok(());
    }
    let mut at = from;
    while at < next {
        // This replica's own records from memory; the others' read, a page at a time.
        let kept = inner.own.lock().ok().and_then(|mut own| {
            *own = own.split_off(&at);
            own.remove(&at)
        });
        if let Some(record) = kept {
            at += 1;
            inner.next_pos.fetch_max(at, Ordering::SeqCst);
            let _ = inner.live.send(record);
            continue;
        }
        let until = inner
            .own
            .lock()
            .ok()
            .and_then(|own| own.keys().next().copied())
            .unwrap_or(next)
            .min(next);
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
            break;
        }
        for row in rows {
            let pos = row.get::<_, i64>(0) as u64;
            let bytes: Vec<u8> = row.get(1);
            let record = decode(&client, &bytes, JournalPos(pos), Hashing::Compute).await?;
            at = pos + 1;
            inner.next_pos.fetch_max(at, Ordering::SeqCst);
            let _ = inner.live.send(Arc::new(record));
        }
    }
    *cursor = Some(at);
    inner.next_pos.fetch_max(at, Ordering::SeqCst);
    Ok(())
}
