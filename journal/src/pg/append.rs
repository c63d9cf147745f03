//! Appends: one appender task per shard of sessions, one call of `turnstile.append` per
//! request (the stream's head and the lease's fencing token checked inside the database),
//! then the records positioned in transaction order.

use crate::chain::{self, Head, IndexChange};
use crate::codec::{self, Hash};
use crate::event::Event;
use crate::ids::{JournalPos, Seq, SessionId};
use crate::now_us;
use crate::pg::replicas::LeaseState;
use crate::pg::{Inner, Request};
use crate::types::AppendResult;
use crate::types::{Conflict, Expected};
use crate::{Error, limits};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What one append changes in the indexes, as the `append` function takes it.
#[derive(Default)]
pub(super) struct IndexArgs {
    pub(super) created: Option<(String, Option<String>)>,
    pub(super) queued_runs: Vec<String>,
    pub(super) queued_agents: Vec<String>,
    pub(super) queued_seqs: Vec<i64>,
    pub(super) status_runs: Vec<String>,
    pub(super) statuses: Vec<String>,
    pub(super) terminal: Vec<bool>,
    pub(super) keys: Vec<String>,
    pub(super) key_runs: Vec<String>,
    pub(super) deleted: bool,
}

impl IndexArgs {
    /// The index rules ([`chain::index_changes`]) as the function's arguments.
    pub(super) fn add(&mut self, seq: Seq, event: &Event) {
        for change in chain::index_changes(event) {
            match change {
                IndexChange::RunQueued { run_id, agent_id } => {
                    self.queued_runs.push(run_id.as_str().to_owned());
                    self.queued_agents.push(agent_id.to_owned());
                    self.queued_seqs.push(seq.0 as i64);
                }
                IndexChange::SessionCreated { agent_id, user_id } => {
                    self.created = Some((agent_id.to_owned(), user_id.map(str::to_owned)));
                }
                IndexChange::SessionDeleted => self.deleted = true,
                IndexChange::KeyBound { key, run_id } => {
                    self.keys.push(key.to_owned());
                    self.key_runs.push(run_id.as_str().to_owned());
                }
                IndexChange::RunStatus {
                    run_id,
                    status,
                    terminal,
                } => {
                    self.status_runs.push(run_id.as_str().to_owned());
                    self.statuses.push(char::from(status).to_string());
                    self.terminal.push(terminal);
                }
            }
        }
    }
}

/// Appends the requests of one shard, one after the other.
pub(super) async fn appender(inner: std::sync::Weak<Inner>, mut receiver: mpsc::Receiver<Request>) {
    while let Some(request) = receiver.recv().await {
        let Some(inner) = inner.upgrade() else {
            let _ = request.reply.send(Err(Error::Stopped));
            continue;
        };
        let Request {
            session_id,
            expected,
            events,
            reply,
        } = request;
        let started = Instant::now();
        let answer = append_one(&inner, &session_id, expected, events).await;
        if answer.as_ref().is_ok_and(|answer| answer.is_ok()) {
            inner
                .stats
                .record_sync(started.elapsed().as_micros() as u64, 1);
            inner.appended.notify_one();
            let _ = inner.touched.send(session_id.clone());
        }
        let _ = reply.send(answer);
    }
}

pub(super) async fn head_of(
    inner: &Inner,
    client: &deadpool_postgres::Client,
    session_id: &SessionId,
    cached: bool,
) -> Result<Head, Error> {
    if cached
        && let Some(head) = inner
            .heads
            .lock()
            .ok()
            .and_then(|heads| heads.get(session_id).copied())
    {
        return Ok(head);
    }
    let row = client
        .query_opt(
            "SELECT next_seq, head_hash FROM turnstile.streams WHERE session_id = $1",
            &[&session_id.as_str()],
        )
        .await?;
    let head = match row {
        None => Head::EMPTY,
        Some(row) => {
            let hash: Vec<u8> = row.get(1);
            Head {
                next_seq: Seq(row.get::<_, i64>(0) as u64),
                last_hash: hash
                    .try_into()
                    .map_err(|_| Error::Store("malformed stream head".into()))?,
            }
        }
    };
    remember(inner, session_id, head);
    Ok(head)
}

pub(super) fn remember(inner: &Inner, session_id: &SessionId, head: Head) {
    if let Ok(mut heads) = inner.heads.lock() {
        if heads.len() >= limits::SESSION_HEADS_CACHED_MAX {
            heads.clear();
        }
        heads.insert(session_id.clone(), head);
    }
}

/// One call of `turnstile.append`: an append's sealed records and what they change.
pub(super) struct AppendCall<'a> {
    pub(super) session_id: &'a SessionId,
    pub(super) owner: &'a str,
    /// The lease's fencing token; `None` takes a free lease.
    pub(super) epoch: Option<i64>,
    pub(super) expected: Seq,
    /// The hash of the last record.
    pub(super) head_hash: &'a Hash,
    pub(super) records: &'a [Vec<u8>],
    pub(super) digests: &'a [Vec<u8>],
    pub(super) blobs: &'a [Vec<u8>],
    /// The session's creation time, when the records create it.
    pub(super) ts_us: i64,
    pub(super) index: &'a IndexArgs,
}

/// Runs the append: its row is `(status, next_seq, head_hash, lease_epoch, owner)`.
pub(super) async fn call_append(
    client: &deadpool_postgres::Client,
    call: AppendCall<'_>,
) -> Result<tokio_postgres::Row, Error> {
    let statement = client
        .prepare_cached(
            "SELECT status, next_seq, head_hash, lease_epoch, owner FROM turnstile.append($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
        )
        .await?;
    let index = call.index;
    let (created_agent, created_user) = match &index.created {
        Some((agent, user)) => (Some(agent.as_str()), user.as_deref()),
        None => (None, None),
    };
    Ok(client
        .query_one(
            &statement,
            &[
                &call.session_id.as_str(),
                &call.owner,
                &call.epoch,
                &(call.expected.0 as i64),
                &call.head_hash.as_slice(),
                &call.records,
                &call.digests,
                &call.blobs,
                &created_agent,
                &created_user,
                &call.ts_us,
                &index.queued_runs,
                &index.queued_agents,
                &index.queued_seqs,
                &index.status_runs,
                &index.statuses,
                &index.terminal,
                &index.keys,
                &index.key_runs,
                &index.deleted,
            ],
        )
        .await?)
}

pub(super) async fn append_one(
    inner: &Inner,
    session_id: &SessionId,
    expected: Expected,
    events: Vec<codec::EncodedEvent>,
) -> AppendResult {
    let client = inner.pool.get().await?;
    let mut cached = true;
    loop {
        let epoch = match inner
            .leases
            .lock()
            .ok()
            .and_then(|leases| leases.get(session_id).copied())
        {
            Some(LeaseState::Held { epoch, .. }) => Some(epoch),
            Some(LeaseState::Lost) => {
                return Err(Error::Fenced {
                    session_id: session_id.to_string(),
                });
            }
            None => None,
        };
        let me = inner
            .replica_id
            .lock()
            .map(|id| id.clone())
            .unwrap_or_default();
        let head = head_of(inner, &client, session_id, cached).await?;
        if let Expected::Next(expected) = expected
            && expected != head.next_seq
        {
            if cached {
                // The cache may be behind another process's appends: ask the database.
                cached = false;
                continue;
            }
            return Ok(Err(Conflict {
                session_id: session_id.clone(),
                expected,
                actual: head.next_seq,
            }));
        }
        let ts_us = now_us();
        let (sealed, at) = chain::seal(session_id, head, ts_us, &events)?;
        let mut records = Vec::with_capacity(events.len());
        let mut recorded = Vec::with_capacity(events.len());
        let mut digests: Vec<Vec<u8>> = Vec::new();
        let mut blobs: Vec<Vec<u8>> = Vec::new();
        let mut index = IndexArgs::default();
        for (sealed, event) in sealed.into_iter().zip(&events) {
            let mut size_bytes = sealed.bytes.len();
            if let Some((digest, apart)) = &event.apart {
                size_bytes += apart.len();
                digests.push(digest.to_vec());
                blobs.push(apart.clone());
            }
            index.add(sealed.seq, &event.event);
            recorded.push(sealed.recorded(
                JournalPos(0),
                session_id,
                ts_us,
                size_bytes,
                event.event.clone(),
            ));
            records.push(sealed.bytes);
        }
        let row = call_append(
            &client,
            AppendCall {
                session_id,
                owner: &me,
                epoch,
                expected: head.next_seq,
                head_hash: &at.last_hash,
                records: &records,
                digests: &digests,
                blobs: &blobs,
                ts_us,
                index: &index,
            },
        )
        .await?;
        let status: String = row.get(0);
        let actual = Seq(row.get::<_, i64>(1) as u64);
        match status.as_str() {
            "owned" => {
                return Err(Error::Owned {
                    session_id: session_id.to_string(),
                    owner: row.get::<_, Option<String>>(4).unwrap_or_default(),
                });
            }
            "fenced" => {
                if let Ok(mut leases) = inner.leases.lock() {
                    leases.insert(session_id.clone(), LeaseState::Lost);
                }
                return Err(Error::Fenced {
                    session_id: session_id.to_string(),
                });
            }
            _ => {
                let epoch: i64 = row.get(3);
                if let Ok(mut leases) = inner.leases.lock() {
                    match leases.get_mut(session_id) {
                        Some(LeaseState::Held { epoch: held, .. }) => *held = epoch,
                        // Taken by the append itself (a caller that never asked for it).
                        _ => {
                            leases
                                .insert(session_id.clone(), LeaseState::Held { epoch, holders: 0 });
                        }
                    }
                }
            }
        }
        if status == "conflict" {
            let hash: Vec<u8> = row.get(2);
            let last_hash: Hash = hash
                .try_into()
                .map_err(|_| Error::Store("malformed stream head".into()))?;
            remember(
                inner,
                session_id,
                Head {
                    next_seq: actual,
                    last_hash,
                },
            );
            match expected {
                Expected::Next(expected) if expected != actual => {
                    return Ok(Err(Conflict {
                        session_id: session_id.clone(),
                        expected,
                        actual,
                    }));
                }
                // The cache was behind: try again on the real head.
                _ => {
                    cached = true;
                    continue;
                }
            }
        }
        remember(inner, session_id, at);
        if recorded.is_empty() {
            return Ok(Ok(Vec::new()));
        }
        // Durable now; visible once positioned.
        let last_seq = recorded.last().map(|record| record.seq.0).unwrap_or(0) as i64;
        let last_pos = position(&client, session_id, last_seq).await?;
        let first_pos = last_pos + 1 - recorded.len() as u64;
        inner.next_pos.fetch_max(last_pos + 1, Ordering::SeqCst);
        return Ok(Ok(recorded
            .into_iter()
            .enumerate()
            .map(|(offset, mut record)| {
                record.pos = JournalPos(first_pos + offset as u64);
                Arc::new(record)
            })
            .collect()));
    }
}

/// Waits until the record `(session, seq)` has a global position, positioning what has
/// finished meanwhile; an older transaction still running holds it back.
pub(super) async fn position(
    client: &deadpool_postgres::Client,
    session_id: &SessionId,
    seq: i64,
) -> Result<u64, Error> {
    let statement = client
        .prepare_cached("SELECT turnstile.position_records($1, $2, $3)")
        .await?;
    // Short waits: what holds a record back is another append's transaction, which
    // lasts a statement (a long one is an operator's, and waits a little longer).
    let mut tries = 0u32;
    loop {
        let row = client
            .query_one(
                &statement,
                &[
                    &session_id.as_str(),
                    &seq,
                    &limits::POSTGRES_POSITION_BATCH_RECORDS,
                ],
            )
            .await?;
        if let Some(pos) = row.get::<_, Option<i64>>(0) {
            return Ok(pos as u64);
        }
        tries += 1;
        if tries > 3 {
            tokio::time::sleep(Duration::from_millis(if tries > 100 { 10 } else { 1 })).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}
