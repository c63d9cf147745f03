//! Stored projections, written behind: a projection is derived data (rebuildable from
//! the records, as sled stores it without a sync), so `put_projection` answers at once
//! and one writer stores what waits, the newest value of each key, in one statement
//! whose commit waits for no WAL flush. Reads of this process see what waits; a write
//! lost to a crash leaves an older projection, which readers fold forward from the
//! records (`journal rebuild` compares each with the fold at its own sequence).

use crate::ids::{Seq, SessionId};
use crate::pg::{Inner, PgJournal};
use crate::{Error, limits};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// Projections not in the database yet: waiting for the writer, and being written.
#[derive(Default)]
pub(super) struct Pending {
    waiting: HashMap<String, Vec<u8>>,
    writing: HashMap<String, Vec<u8>>,
}

impl Pending {
    fn get(&self, key: &str) -> Option<&Vec<u8>> {
        self.waiting.get(key).or_else(|| self.writing.get(key))
    }
}

impl PgJournal {
    pub(crate) fn put_projection(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        {
            let mut pending = self.inner.projections.lock().map_err(|_| Error::Stopped)?;
            if pending.waiting.len() < limits::POSTGRES_PROJECTIONS_WAITING_MAX
                && !self.inner.closed.load(Ordering::SeqCst)
            {
                pending.waiting.insert(key.to_owned(), value.to_vec());
                self.inner.projections_waiting.notify_one();
                return Ok(());
            }
        }
        // Past the bound (the database slower than the projections), or closed: at once.
        let (keys, values) = (vec![key.to_owned()], vec![value.to_vec()]);
        self.with_client(move |client| async move { store(&client, &keys, &values).await })
    }

    pub(crate) fn get_projection(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        if let Some(value) = self
            .inner
            .projections
            .lock()
            .map_err(|_| Error::Stopped)?
            .get(key)
        {
            return Ok(Some(value.clone()));
        }
        let key = key.to_owned();
        self.with_client(move |client| async move {
            let row = client
                .query_opt(
                    &client
                        .prepare_cached("SELECT value FROM turnstile.projections WHERE key = $1")
                        .await?,
                    &[&key],
                )
                .await?;
            Ok(row.map(|row| row.get(0)))
        })
    }

    /// Each session's committed head and the projection under `key_prefix` + its id, in
    /// one statement for them all (this process's waiting projections first).
    pub(crate) fn heads_and_projections(
        &self,
        session_ids: &[SessionId],
        key_prefix: &str,
    ) -> Result<Vec<crate::journal::HeadAndProjection>, Error> {
        let ids: Vec<String> = session_ids
            .iter()
            .map(|id| id.as_str().to_owned())
            .collect();
        let prefix = key_prefix.to_owned();
        let rows: Vec<(i64, Option<Vec<u8>>)> = self.with_client(move |client| async move {
            let rows = client
                .query(
                    &client
                        .prepare_cached(
                            "SELECT coalesce(s.next_seq, 0), p.value \
                             FROM unnest($1::text[]) WITH ORDINALITY AS i(id, n) \
                             LEFT JOIN turnstile.streams s ON s.session_id = i.id \
                             LEFT JOIN turnstile.projections p ON p.key = $2 || i.id \
                             ORDER BY i.n",
                        )
                        .await?,
                    &[&ids, &prefix],
                )
                .await?;
            Ok(rows
                .into_iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect())
        })?;
        let pending = self.inner.projections.lock().map_err(|_| Error::Stopped)?;
        Ok(session_ids
            .iter()
            .zip(rows)
            .map(|(session_id, (next_seq, stored))| {
                let waiting = pending.get(&format!("{key_prefix}{session_id}")).cloned();
                (Seq(next_seq as u64), waiting.or(stored))
            })
            .collect())
    }

    pub(crate) fn projections(&self) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let stored: Vec<(String, Vec<u8>)> = self.with_client(move |client| async move {
            let rows = client
                .query(
                    &client
                        .prepare_cached(
                            "SELECT key, value FROM turnstile.projections ORDER BY key COLLATE \"C\"",
                        )
                        .await?,
                    &[],
                )
                .await?;
            Ok(rows
                .into_iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect())
        })?;
        let pending = self.inner.projections.lock().map_err(|_| Error::Stopped)?;
        let mut all: std::collections::BTreeMap<String, Vec<u8>> = stored.into_iter().collect();
        for (key, value) in pending.writing.iter().chain(&pending.waiting) {
            all.insert(key.clone(), value.clone());
        }
        // Byte order of the keys, as the query's `COLLATE "C"`.
        Ok(all.into_iter().collect())
    }

    /// Stores what waits before the journal closes (the writer stops with it).
    pub(super) fn flush_projections(&self) {
        let waiting = match self.inner.projections.lock() {
            Ok(mut pending) => {
                let mut all = std::mem::take(&mut pending.writing);
                all.extend(std::mem::take(&mut pending.waiting));
                all
            }
            Err(_) => return,
        };
        if waiting.is_empty() {
            return;
        }
        let (keys, values): (Vec<String>, Vec<Vec<u8>>) = waiting.into_iter().unzip();
        let stored =
            self.with_client(move |client| async move { store(&client, &keys, &values).await });
        if let Err(error) = stored {
            tracing::warn!(%error, "stored projections not written at close (they are refolded)");
        }
    }
}

/// Writes the waiting projections, one statement at a time and at most one every
/// [`limits::POSTGRES_PROJECTIONS_EVERY_MS`], until the journal closes.
pub(super) async fn writer(inner: std::sync::Weak<Inner>) {
    loop {
        let Some(waiting) = inner
            .upgrade()
            .map(|inner| inner.projections_waiting.clone())
        else {
            return;
        };
        waiting.notified().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        let (keys, values): (Vec<String>, Vec<Vec<u8>>) = match inner.projections.lock() {
            Ok(mut pending) => {
                let waiting = std::mem::take(&mut pending.waiting);
                pending.writing = waiting.clone();
                waiting.into_iter().unzip()
            }
            Err(_) => return,
        };
        if keys.is_empty() {
            continue;
        }
        let written = async {
            let client = inner.pool.get().await?;
            store(&client, &keys, &values).await
        }
        .await;
        if let Err(error) = written {
            tracing::warn!(%error, projections = keys.len(), "stored projections not updated (they are refolded)");
        }
        if let Ok(mut pending) = inner.projections.lock() {
            pending.writing.clear();
        }
        // What comes meanwhile goes with the next statement (one a turn's worth of
        // projections each otherwise, under load).
        drop(inner);
        tokio::time::sleep(std::time::Duration::from_millis(
            limits::POSTGRES_PROJECTIONS_EVERY_MS,
        ))
        .await;
    }
}

/// One statement: each key's value, its commit not waiting for a flush.
async fn store(
    client: &deadpool_postgres::Client,
    keys: &[String],
    values: &[Vec<u8>],
) -> Result<(), Error> {
    let statement = client
        .prepare_cached("SELECT turnstile.put_projections($1, $2)")
        .await?;
    client.execute(&statement, &[&keys, &values]).await?;
    Ok(())
}
