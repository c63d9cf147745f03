//! Reads of the PostgreSQL journal: a record by position, a session's records, the
//! journal in global order (pages of positioned records only), the indexes' lists, and
//! the record decoder that fetches an event stored apart.

use crate::Error;
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::limits;
use crate::pg::{PgJournal, stored_id};
use crate::types::{AgentRun, Hashing, IndexedStatus, Recorded, SessionEntry};
use std::sync::atomic::Ordering;

impl PgJournal {
    pub(crate) fn get(&self, pos: JournalPos) -> Result<Option<Recorded>, Error> {
        let stats = self.inner.stats.clone();
        self.with_client(move |client| async move {
            let row = client
                .query_opt(
                    &client
                        .prepare_cached("SELECT record FROM turnstile.events WHERE pos = $1")
                        .await?,
                    &[&(pos.0 as i64)],
                )
                .await?;
            match row {
                None => Ok(None),
                Some(row) => {
                    let bytes: Vec<u8> = row.get(0);
                    stats.records_read.fetch_add(1, Ordering::Relaxed);
                    decode(&client, &bytes, pos, Hashing::Compute)
                        .await
                        .map(Some)
                }
            }
        })
    }

    pub(crate) fn read_session(
        &self,
        session_id: &SessionId,
        from: Seq,
        hashing: Hashing,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + Send + use<> {
        let this = self.clone();
        let session = session_id.as_str().to_owned();
        Paged::new(from.0, move |cursor| {
            let pool = this.inner.pool.clone();
            let stats = this.inner.stats.clone();
            let session = session.clone();
            this.block(async move {
                let client = pool.get().await?;
                let rows = client
                    .query(
                        &client
                            .prepare_cached(
                                "SELECT seq, pos, record FROM turnstile.events \
                         WHERE session_id = $1 AND seq >= $2 AND pos IS NOT NULL \
                         ORDER BY seq LIMIT $3",
                            )
                            .await?,
                        &[&session, &(cursor as i64), &limits::POSTGRES_PAGE_RECORDS],
                    )
                    .await?;
                let mut page = Vec::with_capacity(rows.len());
                let mut next = cursor;
                for row in rows {
                    let seq: i64 = row.get(0);
                    let pos: i64 = row.get(1);
                    let bytes: Vec<u8> = row.get(2);
                    next = seq as u64 + 1;
                    page.push(decode(&client, &bytes, JournalPos(pos as u64), hashing).await);
                }
                stats
                    .records_read
                    .fetch_add(page.len() as u64, Ordering::Relaxed);
                let done = page.len() < limits::POSTGRES_PAGE_RECORDS as usize;
                Ok((page, next, done))
            })
        })
    }

    pub(crate) fn read_from(
        &self,
        from: JournalPos,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + Send + use<> {
        let this = self.clone();
        let durable = self.next_pos().0;
        Paged::new(from.0, move |cursor| {
            let pool = this.inner.pool.clone();
            let stats = this.inner.stats.clone();
            this.block(async move {
                let rows = {
                    let client = pool.get().await?;
                    client
                        .query(
                            &client
                                .prepare_cached(
                                    "SELECT pos, record FROM turnstile.events \
                             WHERE pos >= $1 AND pos < $2 ORDER BY pos LIMIT $3",
                                )
                                .await?,
                            &[
                                &(cursor as i64),
                                &(durable as i64),
                                &limits::POSTGRES_PAGE_RECORDS,
                            ],
                        )
                        .await?
                };
                let client = pool.get().await?;
                let mut page = Vec::with_capacity(rows.len());
                let mut next = cursor;
                for row in rows {
                    let pos: i64 = row.get(0);
                    let bytes: Vec<u8> = row.get(1);
                    next = pos as u64 + 1;
                    page.push(
                        decode(&client, &bytes, JournalPos(pos as u64), Hashing::Compute).await,
                    );
                }
                stats
                    .records_read
                    .fetch_add(page.len() as u64, Ordering::Relaxed);
                let done = page.len() < limits::POSTGRES_PAGE_RECORDS as usize;
                Ok((page, next, done))
            })
        })
    }

    pub(crate) fn session_next_seq(&self, session_id: &SessionId) -> Result<Seq, Error> {
        let session = session_id.as_str().to_owned();
        self.with_client(move |client| async move {
            let row = client
                .query_one(
                    &client
                        .prepare_cached(
                            "SELECT coalesce(max(seq) + 1, 0) FROM turnstile.events \
                     WHERE session_id = $1 AND pos IS NOT NULL",
                        )
                        .await?,
                    &[&session],
                )
                .await?;
            Ok(Seq(row.get::<_, i64>(0) as u64))
        })
    }

    /// The stream's head as committed (positioned or not).
    pub(crate) fn session_committed_seq(&self, session_id: &SessionId) -> Result<Seq, Error> {
        let session = session_id.as_str().to_owned();
        self.with_client(move |client| async move {
            let row = client
                .query_opt(
                    &client
                        .prepare_cached(
                            "SELECT next_seq FROM turnstile.streams WHERE session_id = $1",
                        )
                        .await?,
                    &[&session],
                )
                .await?;
            Ok(Seq(row.map_or(0, |row| row.get::<_, i64>(0)) as u64))
        })
    }

    pub(crate) fn session_of_run(&self, run_id: &RunId) -> Result<Option<SessionId>, Error> {
        let run = run_id.as_str().to_owned();
        self.with_client(move |client| async move {
            let row = client
                .query_opt(
                    &client
                        .prepare_cached("SELECT session_id FROM turnstile.runs WHERE run_id = $1")
                        .await?,
                    &[&run],
                )
                .await?;
            row.map(|row| stored_id(row.get(0))).transpose()
        })
    }

    pub(crate) fn session_runs(&self, session_id: &SessionId) -> Result<Vec<(Seq, RunId)>, Error> {
        let session = session_id.as_str().to_owned();
        self.with_client(move |client| async move {
            let rows = client
                .query(
                    &client
                        .prepare_cached(
                            "SELECT queued_seq, run_id FROM turnstile.runs \
                     WHERE session_id = $1 AND listed ORDER BY queued_seq",
                        )
                        .await?,
                    &[&session],
                )
                .await?;
            rows.into_iter()
                .map(|row| Ok((Seq(row.get::<_, i64>(0) as u64), stored_id(row.get(1))?)))
                .collect()
        })
    }

    pub(crate) fn agent_run_counts(&self, agent_id: &str) -> [u64; 6] {
        let agent = agent_id.to_owned();
        let counted = self.with_client(move |client| async move {
            let rows = client
                .query(
                    &client
                        .prepare_cached(
                            "SELECT status::text, count(*) FROM turnstile.runs \
                     WHERE agent_id = $1 AND listed GROUP BY status",
                        )
                        .await?,
                    &[&agent],
                )
                .await?;
            let mut counts = [0u64; 6];
            for row in rows {
                let status: String = row.get(0);
                let count: i64 = row.get(1);
                if let Some(status) = status.bytes().next().and_then(IndexedStatus::from_byte) {
                    counts[status as usize] = count as u64;
                }
            }
            Ok(counts)
        });
        match counted {
            Ok(counts) => counts,
            Err(error) => {
                tracing::error!(%error, "counting an agent's runs failed");
                [0; 6]
            }
        }
    }

    pub(crate) fn agent_runs(
        &self,
        agent_id: &str,
        newest_first: bool,
    ) -> impl Iterator<Item = Result<AgentRun, Error>> + Send + use<> {
        let this = self.clone();
        let agent = agent_id.to_owned();
        let durable = self.next_pos().0 as i64;
        let start = if newest_first { durable } else { -1 };
        Paged::new(start as u64, move |cursor| {
            let pool = this.inner.pool.clone();
            let agent = agent.clone();
            this.block(async move {
                let client = pool.get().await?;
                let cursor = cursor as i64;
                let rows = if newest_first {
                    client
                        .query(
                            &client.prepare_cached("SELECT queued_pos, session_id, run_id, status::text FROM turnstile.runs \
                             WHERE agent_id = $1 AND listed AND queued_pos IS NOT NULL AND queued_pos < $2 \
                             ORDER BY queued_pos DESC LIMIT $3").await?,
                            &[&agent, &cursor, &limits::POSTGRES_PAGE_RECORDS],
                        )
                        .await?
                } else {
                    client
                        .query(
                            &client.prepare_cached("SELECT queued_pos, session_id, run_id, status::text FROM turnstile.runs \
                             WHERE agent_id = $1 AND listed AND queued_pos IS NOT NULL AND queued_pos > $2 \
                             AND queued_pos < $3 ORDER BY queued_pos LIMIT $4").await?,
                            &[&agent, &cursor, &durable, &limits::POSTGRES_PAGE_RECORDS],
                        )
                        .await?
                };
                let done = rows.len() < limits::POSTGRES_PAGE_RECORDS as usize;
                let mut next = cursor;
                let mut page = Vec::with_capacity(rows.len());
                for row in rows {
                    let pos: i64 = row.get(0);
                    next = pos;
                    let status: String = row.get(3);
                    page.push(
                        status
                            .bytes()
                            .next()
                            .and_then(IndexedStatus::from_byte)
                            .ok_or_else(|| Error::Store("malformed run status".into()))
                            .and_then(|status| {
                                Ok(AgentRun {
                                    pos: JournalPos(pos as u64),
                                    session_id: stored_id(row.get(1))?,
                                    run_id: stored_id(row.get(2))?,
                                    status,
                                })
                            }),
                    );
                }
                Ok((page, next as u64, done))
            })
        })
    }

    pub(crate) fn open_runs(&self) -> Result<Vec<(RunId, SessionId)>, Error> {
        self.with_client(move |client| async move {
            let rows = client
                .query(
                    &client.prepare_cached("SELECT run_id, session_id FROM turnstile.runs WHERE open ORDER BY run_id").await?,
                    &[],
                )
                .await?;
            rows.into_iter()
                .map(|row| Ok((stored_id(row.get(0))?, stored_id(row.get(1))?)))
                .collect()
        })
    }

    pub(crate) fn sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        self.with_client(move |client| async move {
            let rows = client
                .query(
                    &client.prepare_cached("SELECT session_id, agent_id, user_id, created_at_us FROM turnstile.sessions \
                     ORDER BY session_id COLLATE \"C\"").await?,
                    &[],
                )
                .await?;
            rows.into_iter()
                .map(|row| {
                    Ok(SessionEntry {
                        session_id: stored_id(row.get(0))?,
                        agent_id: row.get(1),
                        user_id: row.get(2),
                        created_at_us: row.get(3),
                    })
                })
                .collect()
        })
    }

    pub(crate) fn run_of_idempotency_key(&self, key: &str) -> Result<Option<RunId>, Error> {
        let key = key.to_owned();
        self.with_client(move |client| async move {
            let row = client
                .query_opt(
                    &client
                        .prepare_cached(
                            "SELECT run_id FROM turnstile.idempotency_keys WHERE key = $1",
                        )
                        .await?,
                    &[&key],
                )
                .await?;
            row.map(|row| stored_id(row.get(0))).transpose()
        })
    }
}
/// Decodes a record found at `pos`, fetching an event stored apart.
pub(super) async fn decode(
    client: &deadpool_postgres::Client,
    bytes: &[u8],
    pos: JournalPos,
    hashing: Hashing,
) -> Result<Recorded, Error> {
    let record = Recorded::read(bytes, pos, hashing)?;
    let Some(digest) = record.apart_digest() else {
        return Ok(record);
    };
    let row = client
        .query_opt(
            &client
                .prepare_cached("SELECT bytes FROM turnstile.blobs WHERE digest = $1")
                .await?,
            &[&digest.as_slice()],
        )
        .await?;
    let stored: Option<Vec<u8>> = row.map(|row| row.get(0));
    record.with_apart(stored.as_deref())
}

/// An iterator over pages that a closure fetches: `(items, next cursor, last page)`.
pub(super) struct Paged<T, F> {
    pub(super) fetch: F,
    pub(super) cursor: u64,
    pub(super) page: std::vec::IntoIter<Result<T, Error>>,
    pub(super) done: bool,
}

impl<T, F> Paged<T, F>
where
    F: FnMut(u64) -> Result<(Vec<Result<T, Error>>, u64, bool), Error>,
{
    pub(super) fn new(cursor: u64, fetch: F) -> Self {
        Paged {
            fetch,
            cursor,
            page: Vec::new().into_iter(),
            done: false,
        }
    }
}

impl<T, F> Iterator for Paged<T, F>
where
    F: FnMut(u64) -> Result<(Vec<Result<T, Error>>, u64, bool), Error>,
{
    type Item = Result<T, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.page.next() {
                if item.is_err() {
                    self.done = true;
                    self.page = Vec::new().into_iter();
                }
                return Some(item);
            }
            if self.done {
                return None;
            }
            match (self.fetch)(self.cursor) {
                Ok((page, cursor, last)) => {
                    self.cursor = cursor;
                    self.done = last;
                    if page.is_empty() {
                        return None;
                    }
                    self.page = page.into_iter();
                }
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
    }
}
