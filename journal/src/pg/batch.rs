//! One call of `turnstile.append_batch`: the appends of several sessions, sealed, as
//! the function's columns (one array per argument, an append's rows tagged with its
//! place), and the function's verdict on each. A batch of one append calls
//! `turnstile.append_one` with the same columns, or `turnstile.append_plain` with seven
//! arguments when its records change no index.

use crate::Error;
use crate::chain::{self, IndexChange};
use crate::codec::Hash;
use crate::event::Event;
use crate::ids::{Seq, SessionId};

/// One append of a batch, sealed: its records' bytes and what they change.
pub(super) struct Part<'a> {
    pub(super) session_id: &'a SessionId,
    /// The lease's fencing token; `None` takes a free lease.
    pub(super) epoch: Option<i64>,
    /// The sequence of its first record (the stream's head it was sealed on).
    pub(super) expected: Seq,
    /// The hash of its last record (the head's after it).
    pub(super) head_hash: &'a Hash,
    pub(super) records: Vec<Vec<u8>>,
    /// Events stored apart: (digest, bytes).
    pub(super) blobs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The session's creation time, when the records create it.
    pub(super) ts_us: i64,
}

/// The function's verdict on one append.
pub(super) struct Verdict {
    /// `ok`, `conflict`, `owned` or `fenced`.
    pub(super) status: String,
    /// The stream's next sequence: after the append, or the real one when refused.
    pub(super) next_seq: Seq,
    /// The real head's hash, for a conflict.
    pub(super) head_hash: Option<Hash>,
    /// The lease's fencing token (the one taken, for an append that took it).
    pub(super) epoch: i64,
    /// The lease's holder (another replica's id, for `owned`).
    pub(super) owner: Option<String>,
    /// The first record's global position, for `ok`.
    pub(super) first_pos: Option<u64>,
    /// It ended the session's last open run, and gave the lease back with it.
    pub(super) released: bool,
}

/// A batch: the function's arguments, column by column.
#[derive(Default)]
pub(super) struct Batch {
    parts: usize,
    sessions: Vec<String>,
    epochs: Vec<Option<i64>>,
    expected: Vec<i64>,
    head_hashes: Vec<Vec<u8>>,
    counts: Vec<i32>,
    deleted: Vec<bool>,
    record_of: Vec<i32>,
    record_offsets: Vec<i32>,
    records: Vec<Vec<u8>>,
    blob_of: Vec<i32>,
    blob_digests: Vec<Vec<u8>>,
    blobs: Vec<Vec<u8>>,
    created_of: Vec<i32>,
    created_agents: Vec<String>,
    created_users: Vec<Option<String>>,
    created_us: Vec<i64>,
    queued_of: Vec<i32>,
    queued_runs: Vec<String>,
    queued_agents: Vec<String>,
    queued_seqs: Vec<i64>,
    status_of: Vec<i32>,
    status_runs: Vec<String>,
    statuses: Vec<String>,
    terminal: Vec<bool>,
    key_of: Vec<i32>,
    keys: Vec<String>,
    key_runs: Vec<String>,
}

impl Batch {
    /// Adds an append, with each record's sequence and event (for the indexes).
    pub(super) fn push<'e>(
        &mut self,
        part: Part<'_>,
        changes: impl Iterator<Item = (Seq, &'e Event)>,
    ) {
        self.parts += 1;
        // The function's ordinality: 1-based.
        let of = self.parts as i32;
        self.sessions.push(part.session_id.as_str().to_owned());
        self.epochs.push(part.epoch);
        self.expected.push(part.expected.0 as i64);
        self.head_hashes.push(part.head_hash.to_vec());
        self.counts.push(part.records.len() as i32);
        for (offset, record) in part.records.into_iter().enumerate() {
            self.record_of.push(of);
            self.record_offsets.push(offset as i32);
            self.records.push(record);
        }
        for (digest, bytes) in part.blobs {
            self.blob_of.push(of);
            self.blob_digests.push(digest);
            self.blobs.push(bytes);
        }
        let mut deleted = false;
        let mut created = None;
        for (seq, event) in changes {
            for change in chain::index_changes(event) {
                match change {
                    IndexChange::RunQueued { run_id, agent_id } => {
                        self.queued_of.push(of);
                        self.queued_runs.push(run_id.as_str().to_owned());
                        self.queued_agents.push(agent_id.to_owned());
                        self.queued_seqs.push(seq.0 as i64);
                    }
                    IndexChange::SessionCreated { agent_id, user_id } => {
                        created = Some((agent_id.to_owned(), user_id.map(str::to_owned)));
                    }
                    IndexChange::SessionDeleted => deleted = true,
                    IndexChange::KeyBound { key, run_id } => {
                        self.key_of.push(of);
                        self.keys.push(key.to_owned());
                        self.key_runs.push(run_id.as_str().to_owned());
                    }
                    IndexChange::RunStatus {
                        run_id,
                        status,
                        terminal,
                    } => {
                        self.status_of.push(of);
                        self.status_runs.push(run_id.as_str().to_owned());
                        self.statuses.push(char::from(status).to_string());
                        self.terminal.push(terminal);
                    }
                }
            }
        }
        if let Some((agent, user)) = created {
            self.created_of.push(of);
            self.created_agents.push(agent);
            self.created_users.push(user);
            self.created_us.push(part.ts_us);
        }
        self.deleted.push(deleted);
    }

    /// Some append's records change an index or store an event apart (or delete the
    /// session): a batch of one such append is not [`APPEND_PLAIN`]'s.
    fn indexed(&self) -> bool {
        self.deleted.contains(&true)
            || !self.blobs.is_empty()
            || !self.created_of.is_empty()
            || !self.queued_of.is_empty()
            || !self.status_of.is_empty()
            || !self.key_of.is_empty()
    }
}

const APPEND_BATCH: &str = "SELECT status, next_seq, head_hash, lease_epoch, owner, first_pos, \
     released FROM turnstile.append_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
     $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28)";
const APPEND_ONE: &str = "SELECT status, next_seq, head_hash, lease_epoch, owner, first_pos, \
     released FROM turnstile.append_one($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
     $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28)";
/// A batch of one append that changes no index (schema version 5).
const APPEND_PLAIN: &str = "SELECT status, next_seq, head_hash, lease_epoch, owner, first_pos, \
     released FROM turnstile.append_plain($1, $2, $3, $4, $5, $6, $7)";

/// Runs one batch (at most one append of a session) in one transaction; the verdicts
/// come in the order the appends were pushed.
pub(super) async fn call_batch(
    client: &deadpool_postgres::Client,
    owner: &str,
    batch: &Batch,
) -> Result<Vec<Verdict>, Error> {
    let rows = if batch.parts == 1 && !batch.indexed() {
        call_plain(client, owner, batch).await?
    } else {
        call_columns(client, owner, batch).await?
    };
    if rows.len() != batch.parts {
        return Err(Error::Store(format!(
            "PostgreSQL answered {} verdicts for a batch of {} appends",
            rows.len(),
            batch.parts
        )));
    }
    rows.into_iter().map(verdict).collect()
}

/// A batch of one append that changes no index: the function's seven arguments.
async fn call_plain(
    client: &deadpool_postgres::Client,
    owner: &str,
    batch: &Batch,
) -> Result<Vec<tokio_postgres::Row>, Error> {
    let statement = client.prepare_cached(APPEND_PLAIN).await?;
    let c = batch;
    Ok(client
        .query(
            &statement,
            &[
                &owner,
                &c.sessions[0],
                &c.epochs[0],
                &c.expected[0],
                &c.head_hashes[0],
                &c.record_offsets,
                &c.records,
            ],
        )
        .await?)
}

/// Any batch, column by column; a batch of one takes the function's lean form (same
/// arguments, same answer).
async fn call_columns(
    client: &deadpool_postgres::Client,
    owner: &str,
    batch: &Batch,
) -> Result<Vec<tokio_postgres::Row>, Error> {
    let statement = client
        .prepare_cached(if batch.parts == 1 {
            APPEND_ONE
        } else {
            APPEND_BATCH
        })
        .await?;
    let c = batch;
    Ok(client
        .query(
            &statement,
            &[
                &owner,
                &c.sessions,
                &c.epochs,
                &c.expected,
                &c.head_hashes,
                &c.counts,
                &c.deleted,
                &c.record_of,
                &c.record_offsets,
                &c.records,
                &c.blob_of,
                &c.blob_digests,
                &c.blobs,
                &c.created_of,
                &c.created_agents,
                &c.created_users,
                &c.created_us,
                &c.queued_of,
                &c.queued_runs,
                &c.queued_agents,
                &c.queued_seqs,
                &c.status_of,
                &c.status_runs,
                &c.statuses,
                &c.terminal,
                &c.key_of,
                &c.keys,
                &c.key_runs,
            ],
        )
        .await?)
}

/// One row of the function's answer.
fn verdict(row: tokio_postgres::Row) -> Result<Verdict, Error> {
    let head_hash = match row.get::<_, Option<Vec<u8>>>(2) {
        Some(hash) => Some(
            hash.try_into()
                .map_err(|_| Error::Store("malformed stream head".into()))?,
        ),
        None => None,
    };
    Ok(Verdict {
        status: row.get(0),
        next_seq: Seq(row.get::<_, i64>(1) as u64),
        head_hash,
        epoch: row.get(3),
        owner: row.get(4),
        first_pos: row.get::<_, Option<i64>>(5).map(|pos| pos as u64),
        released: row.get::<_, Option<bool>>(6).unwrap_or(false),
    })
}
