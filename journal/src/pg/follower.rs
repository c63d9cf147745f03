//! The follower: positions that other processes gave, so `next_pos` and the live feed
//! include their records.

use crate::ids::JournalPos;
use crate::pg::Inner;
use crate::pg::reads::decode;
use crate::types::Hashing;
use crate::{Error, limits};
use deadpool_postgres::Pool;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Follows the positions other processes give, so `next_pos` and the live feed include
/// their records.
pub(super) async fn follower(inner: std::sync::Weak<Inner>) {
    let mut cursor: Option<u64> = None;
    loop {
        let (appended, pool) = match inner.upgrade() {
            Some(inner) if !inner.closed.load(Ordering::SeqCst) => {
                (inner.appended.clone(), inner.pool.clone())
            }
            _ => return,
        };
        let _ = tokio::time::timeout(
            Duration::from_millis(limits::POSTGRES_FOLLOW_POLL_MS),
            appended.notified(),
        )
        .await;
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

pub(super) async fn follow_once(
    inner: &Inner,
    pool: &Pool,
    cursor: &mut Option<u64>,
) -> Result<(), Error> {
    let client = pool.get().await?;
    let row = client
        .query_one("SELECT next_pos FROM turnstile.positions", &[])
        .await?;
    let next = row.get::<_, i64>(0) as u64;
    let from = cursor.unwrap_or(next);
    if inner.live.receiver_count() == 0 {
        *cursor = Some(next);
        inner.next_pos.fetch_max(next, Ordering::SeqCst);
        return Ok(());
    }
    let mut at = from;
    while at < next {
        let rows = client
            .query(
                "SELECT pos, record FROM turnstile.events WHERE pos >= $1 AND pos < $2 \
                 ORDER BY pos LIMIT $3",
                &[&(at as i64), &(next as i64), &limits::POSTGRES_PAGE_RECORDS],
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
