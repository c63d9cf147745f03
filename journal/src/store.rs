//! The sled-backed store: keys, the group-commit thread, and reads.
//!
//! Layout, all in one sled tree so that one `apply_batch` is atomic across keys:
//! `L` + first position (u64 BE) holds a segment: every record of one group commit,
//! with the manifest that says whose they are, so a group commit writes one sled key
//! however many appenders it serves (sled's cost is per key: a key per record, scattered
//! over the sessions, ran at 0.65-0.75 of a sequential-key ceiling). `I` + session id +
//! `0x00` + first seq (u64 BE) holds a chunk of the session index: runs of the
//! session's records and their positions (up to [`limits::SESSION_INDEX_CHUNK_RUNS`]
//! a chunk). The committer writes the index for the
//! records of the last [`limits::SESSION_INDEX_FLUSH_MS`] in one go, with `W` (the
//! position below which the index is complete) in the same atomic batch; records past
//! `W` are found through an in-memory tail that opening rebuilds from the segments.
//! `R` + run id + `0x00` holds the run's session; `O`, `N`, `K` the open runs,
//! sessions and idempotency keys.
//!
//! One committer thread owns sequence assignment and hash links: it takes every
//! waiting append request, applies them as one atomic sled batch and flushes it; a
//! sync thread then `fdatasync`s sled's log file and answers them all (group commit).
//! Appenders encode their events before queueing, so the committer only adds record
//! headers. sled's `flush` alone is only `sync_file_range` on
//! Linux, which does not survive a power loss.
//! This module does not interpret events beyond finding their run id.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, mpsc, oneshot};

use crate::Error;
use crate::chain::{self, Head, IndexChange};
use crate::codec::{self, Hash, Run, Segment};
use crate::event::Event;
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::limits;

/// An event as committed: where it is and what it links to.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// Global position.
    pub pos: JournalPos,
    /// Its session.
    pub session_id: SessionId,
    /// Position in the session's stream.
    pub seq: Seq,
    /// Commit time, microseconds since the Unix epoch.
    pub ts_us: i64,
    /// Hash of the session's previous record.
    pub prev_hash: Hash,
    /// Hash of this record's bytes.
    pub hash: Hash,
    /// Encoded size in bytes.
    pub size_bytes: usize,
    /// The event.
    pub event: Event,
}

/// A session's record as a reader of its events needs it: where in the stream, when,
/// and what happened. Not the record's hash, which verification, export and appends
/// use and a stream of events does not: hashing every record was a fifth of the work
/// of reading a finished run's events back.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEvent {
    /// Position in the session's stream.
    pub seq: Seq,
    /// Commit time, microseconds since the Unix epoch.
    pub ts_us: i64,
    /// The event.
    pub event: Event,
}

/// Whether a read computes each record's hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hashing {
    /// It does: the reader gets [`Recorded`]s.
    Compute,
    /// It does not, for readers that drop it (a stream's [`SessionEvent`]s, a count of
    /// a stream's sequences): the `hash` of the records decoded this way (all zeros)
    /// never leaves this crate.
    Skip,
}

impl From<Recorded> for SessionEvent {
    fn from(record: Recorded) -> Self {
        SessionEvent {
            seq: record.seq,
            ts_us: record.ts_us,
            event: record.event,
        }
    }
}

impl Recorded {
    /// Decodes a record's bytes found at global position `pos`, its hash computed or
    /// not (see [`Hashing`]).
    pub(crate) fn decode(
        bytes: &[u8],
        pos: JournalPos,
        hashing: Hashing,
    ) -> Result<Recorded, codec::DecodeError> {
        let body = codec::decode(bytes)?;
        Ok(Recorded {
            pos,
            session_id: body.session_id,
            seq: body.seq,
            ts_us: body.ts_us,
            prev_hash: body.prev_hash,
            hash: match hashing {
                Hashing::Compute => codec::hash(bytes),
                Hashing::Skip => [0; 32],
            },
            size_bytes: bytes.len(),
            event: body.event,
        })
    }
}

/// What the appender expects the session's stream to look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// Append wherever the stream ends.
    Any,
    /// The stream's next sequence must be this one (optimistic concurrency).
    Next(Seq),
}

/// An append refused because the stream moved on: an expected outcome, not an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("session {session_id} expected next sequence {expected}, stream is at {actual}")]
pub struct Conflict {
    /// The session.
    pub session_id: SessionId,
    /// What the appender expected.
    pub expected: Seq,
    /// The stream's real next sequence.
    pub actual: Seq,
}

/// [`crate::Journal::append_in_order`] found the append queue full: an expected outcome of
/// overload, not a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the journal's append queue is full ({} requests waiting)",
    limits::APPEND_QUEUE_REQUESTS_MAX
)]
pub struct AppendQueueFull;

/// Options passed to sled explicitly, so a version bump cannot move them.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    /// sled page cache in bytes.
    pub cache_bytes: u64,
    /// Encoded bytes of one event at most; a larger one is refused (at most
    /// [`limits::EVENT_BYTES_CEILING`]).
    pub max_event_bytes: usize,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            cache_bytes: limits::SLED_CACHE_BYTES,
            max_event_bytes: limits::EVENT_BYTES_MAX_DEFAULT,
        }
    }
}

type AppendResult = Result<Result<Vec<Arc<Recorded>>, Conflict>, Error>;

/// What the committer is sent: appends, and calls to make on its thread.
enum Job {
    Append(Request),
    /// Called on the committer's thread once the batch it arrived with is applied.
    Call(fn()),
}

struct Request {
    session_id: SessionId,
    expected: Expected,
    events: Vec<codec::EncodedEvent>,
    reply: oneshot::Sender<AppendResult>,
}

impl Request {
    /// Encodes the events (in the appender's thread: the committer only adds headers)
    /// and pairs the request with the receiver of its answer.
    fn new(
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
        max_event_bytes: usize,
    ) -> Result<(Request, oneshot::Receiver<AppendResult>), Error> {
        let events = chain::encode(events, max_event_bytes)?;
        let (reply, answer) = oneshot::channel();
        Ok((
            Request {
                session_id: session_id.clone(),
                expected,
                events,
                reply,
            },
            answer,
        ))
    }

    /// Encoded bytes of its events.
    fn bytes(&self) -> usize {
        self.events.iter().map(|event| event.bytes.len()).sum()
    }
}

/// Upper bounds of the sync-latency histogram buckets, in microseconds.
pub const SYNC_BUCKETS_US: [u64; 8] = [100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000];

/// Counters of the journal's work since it was opened (for metrics).
#[derive(Debug, Default)]
pub struct JournalStats {
    appends: AtomicU64,
    syncs: AtomicU64,
    sync_us_total: AtomicU64,
    sync_buckets: [AtomicU64; SYNC_BUCKETS_US.len()],
    pub(crate) records_read: AtomicU64,
}

/// A reading of [`JournalStats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Append requests acknowledged.
    pub appends: u64,
    /// Records in the journal (its next position).
    pub records: u64,
    /// Group syncs (`fdatasync`) done.
    pub syncs: u64,
    /// Time spent in them, in microseconds.
    pub sync_us_total: u64,
    /// Syncs that took at most each of [`SYNC_BUCKETS_US`] (cumulative, like Prometheus).
    pub sync_buckets: Vec<u64>,
    /// Records read back (by session or in global order), for tests and metrics that
    /// check a read's cost does not grow with history.
    pub records_read: u64,
}

impl JournalStats {
    /// A reading, with the journal's record count.
    pub(crate) fn snapshot(&self, records: u64) -> StatsSnapshot {
        StatsSnapshot {
            appends: self.appends.load(Ordering::Relaxed),
            records,
            syncs: self.syncs.load(Ordering::Relaxed),
            sync_us_total: self.sync_us_total.load(Ordering::Relaxed),
            sync_buckets: self
                .sync_buckets
                .iter()
                .map(|bucket| bucket.load(Ordering::Relaxed))
                .collect(),
            records_read: self.records_read.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn record_sync(&self, micros: u64, appends: u64) {
        self.appends.fetch_add(appends, Ordering::Relaxed);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.sync_us_total.fetch_add(micros, Ordering::Relaxed);
        for (bound, bucket) in SYNC_BUCKETS_US.iter().zip(&self.sync_buckets) {
            if micros <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

struct Inner {
    stats: Arc<JournalStats>,
    path: PathBuf,
    tree: sled::Tree,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    committer: Mutex<Option<JoinHandle<()>>>,
    live: broadcast::Sender<Arc<Recorded>>,
    next_pos: Arc<AtomicU64>,
    tail: Arc<RwLock<Tail>>,
    db: sled::Db,
    /// Runs per agent and status, as the run index holds them.
    agent_run_counts: AgentRunCounts,
    max_event_bytes: usize,
    /// Set when a write or a sync failed: the journal stopped (fail-stop).
    failed: Arc<std::sync::atomic::AtomicBool>,
}

/// The session index of the records past the watermark `W`: one run per append
/// request, by session. The committer adds to it before a batch is applied and empties
/// it once the batch that writes it to the index is applied; readers take it before
/// the index, so a run moving from one to the other is seen at least once.
#[derive(Default)]
pub(crate) struct Tail {
    runs: HashMap<SessionId, Vec<Run>>,
    len: usize,
}

/// The sled backend of the event journal: cheap to clone, one per data directory per
/// process.
#[derive(Clone)]
pub(crate) struct SledJournal {
    inner: Arc<Inner>,
}

pub(crate) const LOG: u8 = b'L';
pub(crate) const INDEX: u8 = b'I';
/// The session index is complete below the position this key holds (u64 BE).
pub(crate) const WATERMARK: &[u8] = b"W";
/// Layout 1 kept records under `S` + session + seq; this build does not read it.
const LAYOUT_1_STREAM: u8 = b'S';
const RUN: u8 = b'R';
const OPEN: u8 = b'O';
const IDEMPOTENCY: u8 = b'K';
const SESSION: u8 = b'N';
/// `Q` + session + NUL + queued sequence (u64 BE) → run id: a session's runs in order.
const SESSION_RUNS: u8 = b'Q';
/// `G` + agent + NUL + queued position (u64 BE) → status byte, session, NUL, run id: an
/// agent's runs in order, with their status.
const AGENT_RUNS: u8 = b'G';
/// `A` + BLAKE3 digest: the encoding of an event stored apart from its record.
pub(crate) const APART: u8 = b'A';

/// The key of an event stored apart.
pub(crate) fn apart_key(digest: &Hash) -> Vec<u8> {
    let mut key = Vec::with_capacity(33);
    key.push(APART);
    key.extend_from_slice(digest);
    key
}
/// The sled tree of stored projections, apart from the journal's own.
const PROJECTIONS: &str = "projections";

pub(crate) fn log_key(pos: JournalPos) -> [u8; 9] {
    let mut key = [LOG; 9];
    key[1..].copy_from_slice(&pos.0.to_be_bytes());
    key
}

pub(crate) fn index_prefix(session_id: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(session_id.as_str().len() + 10);
    key.push(INDEX);
    key.extend_from_slice(session_id.as_str().as_bytes());
    key.push(0);
    key
}

/// Past every index key of the session: ids hold no NUL, so `0x01` after the id sorts
/// after `0x00` and before any longer id.
fn index_end(session_id: &SessionId) -> Vec<u8> {
    let mut key = index_prefix(session_id);
    *key.last_mut().expect("prefix ends in 0x00") = 1;
    key
}

pub(crate) fn index_key(session_id: &SessionId, first_seq: Seq) -> Vec<u8> {
    let mut key = index_prefix(session_id);
    key.extend_from_slice(&first_seq.0.to_be_bytes());
    key
}

/// Adds the runs of each session to its session index, and the watermark, to a batch:
/// appended to the session's last chunk while it holds fewer than
/// [`limits::SESSION_INDEX_CHUNK_RUNS`], else as a new chunk, so a session that appends
/// a little at a time does not collect a chunk per index write.
/// Nothing is added to the batch when reading a last chunk fails.
pub(crate) fn write_index<'a>(
    tree: &sled::Tree,
    batch: &mut sled::Batch,
    runs: impl IntoIterator<Item = (&'a SessionId, &'a [Run])>,
    watermark: JournalPos,
) -> Result<(), Error> {
    let mut writes: Vec<(sled::IVec, Vec<u8>)> = Vec::new();
    for (session_id, runs) in runs {
        let Some(first) = runs.first() else {
            continue;
        };
        let last_chunk = tree
            .range(index_prefix(session_id)..index_end(session_id))
            .next_back()
            .transpose()?;
        match last_chunk {
            Some((key, bytes))
                if bytes.len() / codec::RUN_BYTES < limits::SESSION_INDEX_CHUNK_RUNS =>
            {
                let mut merged = bytes.to_vec();
                merged.extend_from_slice(&codec::encode_runs(runs));
                writes.push((key, merged));
            }
            _ => writes.push((
                index_key(session_id, first.first_seq).into(),
                codec::encode_runs(runs),
            )),
        }
    }
    for (key, value) in writes {
        batch.insert(key, value);
    }
    batch.insert(WATERMARK, &watermark.0.to_be_bytes());
    Ok(())
}

/// The watermark of the session index (0 for a journal that never wrote one).
pub(crate) fn watermark(tree: &sled::Tree) -> Result<JournalPos, Error> {
    Ok(JournalPos(
        tree.get(WATERMARK)?
            .and_then(|bytes| be_u64(&bytes))
            .unwrap_or(0),
    ))
}

fn open_key(run_id: &RunId) -> Vec<u8> {
    let mut key = run_key(run_id);
    key[0] = OPEN;
    key
}

fn session_key(session_id: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(session_id.as_str().len() + 1);
    key.push(SESSION);
    key.extend_from_slice(session_id.as_str().as_bytes());
    key
}

/// A session as the session index lists it (without reading its stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEntry {
    /// The session.
    pub session_id: SessionId,
    /// Its agent.
    pub agent_id: String,
    /// The client's user id.
    pub user_id: Option<String>,
    /// Creation time, microseconds since the epoch.
    pub created_at_us: i64,
}

fn session_value(agent_id: &str, user_id: Option<&str>, created_at_us: i64) -> Vec<u8> {
    // agent id, NUL, user id (or nothing), NUL, creation time (i64 BE): ids hold no NUL.
    let mut value = Vec::with_capacity(agent_id.len() + 24);
    value.extend_from_slice(agent_id.as_bytes());
    value.push(0);
    value.extend_from_slice(user_id.unwrap_or_default().as_bytes());
    value.push(0);
    value.extend_from_slice(&created_at_us.to_be_bytes());
    value
}

fn decode_session_entry(key: &[u8], value: &[u8]) -> Result<SessionEntry, Error> {
    let malformed = || Error::Store("malformed session index entry".into());
    let (text, time) = value.split_at(value.len().checked_sub(8).ok_or_else(malformed)?);
    let text = std::str::from_utf8(text).map_err(|_| malformed())?;
    let mut parts = text.split('\0');
    let agent_id = parts.next().ok_or_else(malformed)?.to_owned();
    let user_id = parts
        .next()
        .filter(|user| !user.is_empty())
        .map(str::to_owned);
    Ok(SessionEntry {
        session_id: stored_id(&key[1..])?,
        agent_id,
        user_id,
        created_at_us: i64::from_be_bytes(time.try_into().map_err(|_| malformed())?),
    })
}

fn idempotency_key(key: &str) -> Vec<u8> {
    let mut sled_key = Vec::with_capacity(key.len() + 1);
    sled_key.push(IDEMPOTENCY);
    sled_key.extend_from_slice(key.as_bytes());
    sled_key
}

fn run_key(run_id: &RunId) -> Vec<u8> {
    let mut key = Vec::with_capacity(run_id.as_str().len() + 2);
    key.push(RUN);
    key.extend_from_slice(run_id.as_str().as_bytes());
    key.push(0);
    key
}

pub(crate) fn be_u64(bytes: &[u8]) -> Option<u64> {
    let tail: [u8; 8] = bytes.get(bytes.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(u64::from_be_bytes(tail))
}

/// Opens sled, waiting briefly while the lock is held: sled releases its file lock
/// only when its background threads let go of the file, shortly after the last handle
/// of an earlier open in this process is dropped.
pub(crate) fn open_sled(dir: &Path, options: &JournalOptions) -> Result<sled::Db, Error> {
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(limits::LOCK_WAIT_MS);
    loop {
        let opened = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_bytes)
            .segment_size(limits::SLED_SEGMENT_BYTES)
            .flush_every_ms(Some(limits::SLED_FLUSH_EVERY_MS))
            .mode(sled::Mode::HighThroughput)
            .open();
        match opened {
            Ok(db) => return Ok(db),
            // sled wraps the lock's WouldBlock in an error of its own wording.
            Err(sled::Error::Io(io))
                if io.kind() == std::io::ErrorKind::WouldBlock
                    || io.to_string().contains("could not acquire lock") =>
            {
                if std::time::Instant::now() >= deadline {
                    return Err(Error::Locked {
                        path: dir.display().to_string(),
                    });
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(other) => return Err(other.into()),
        }
    }
}

/// Where a run is indexed: its session, agent and queued position and sequence.
#[derive(Debug, Clone)]
pub(crate) struct RunEntry {
    session_id: SessionId,
    agent_id: String,
    pos: u64,
    seq: u64,
}

/// What the batch being built changes that the tree does not show yet: the runs it
/// queues, the status it gives runs, and the changes to the agents' run counts.
#[derive(Debug, Default)]
pub(crate) struct StagedRuns {
    runs: HashMap<RunId, RunEntry>,
    statuses: HashMap<RunId, u8>,
    counts: Vec<(String, u8, i64)>,
}

impl StagedRuns {
    pub(crate) fn clear(&mut self) {
        self.runs.clear();
        self.statuses.clear();
        self.counts.clear();
    }
}

/// Runs per agent and status, in [`IndexedStatus`] order; kept as the run index changes.
pub(crate) type AgentRunCounts = Arc<Mutex<HashMap<String, [u64; 5]>>>;

fn status_slot(byte: u8) -> Option<usize> {
    IndexedStatus::from_byte(byte).map(|status| status as usize)
}

fn apply_counts(counts: &AgentRunCounts, changes: &[(String, u8, i64)]) {
    let Ok(mut counts) = counts.lock() else {
        return;
    };
    for (agent, status, change) in changes {
        if let Some(slot) = status_slot(*status) {
            let count = &mut counts.entry(agent.clone()).or_default()[slot];
            *count = count.saturating_add_signed(*change);
        }
    }
}

/// Counts every agent's runs by status from the run index (once, when the journal opens).
fn count_agent_runs(tree: &sled::Tree) -> Result<HashMap<String, [u64; 5]>, Error> {
    let mut counts: HashMap<String, [u64; 5]> = HashMap::new();
    for entry in tree.scan_prefix([AGENT_RUNS]) {
        let (key, value) = entry?;
        let agent = key
            .get(1..key.len().saturating_sub(9))
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .unwrap_or_default();
        if let Some(slot) = value.first().copied().and_then(status_slot) {
            match counts.get_mut(agent) {
                Some(count) => count[slot] += 1,
                None => {
                    let mut count = [0; 5];
                    count[slot] = 1;
                    counts.insert(agent.to_owned(), count);
                }
            }
        }
    }
    Ok(counts)
}

fn session_runs_prefix(session_id: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(session_id.as_str().len() + 10);
    key.push(SESSION_RUNS);
    key.extend_from_slice(session_id.as_str().as_bytes());
    key.push(0);
    key
}

fn session_runs_key(session_id: &SessionId, seq: u64) -> Vec<u8> {
    let mut key = session_runs_prefix(session_id);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn agent_runs_prefix(agent_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(agent_id.len() + 10);
    key.push(AGENT_RUNS);
    key.extend_from_slice(agent_id.as_bytes());
    key.push(0);
    key
}

fn agent_runs_key(agent_id: &str, pos: u64) -> Vec<u8> {
    let mut key = agent_runs_prefix(agent_id);
    key.extend_from_slice(&pos.to_be_bytes());
    key
}

fn agent_runs_value(status: u8, session_id: &SessionId, run_id: &RunId) -> Vec<u8> {
    let mut value = Vec::with_capacity(2 + session_id.as_str().len() + run_id.as_str().len());
    value.push(status);
    value.extend_from_slice(session_id.as_str().as_bytes());
    value.push(0);
    value.extend_from_slice(run_id.as_str().as_bytes());
    value
}

fn run_value(entry: &RunEntry) -> Vec<u8> {
    // session, NUL, agent, NUL, position (u64 BE), sequence (u64 BE): ids hold no NUL.
    let mut value = Vec::with_capacity(entry.session_id.as_str().len() + entry.agent_id.len() + 18);
    value.extend_from_slice(entry.session_id.as_str().as_bytes());
    value.push(0);
    value.extend_from_slice(entry.agent_id.as_bytes());
    value.push(0);
    value.extend_from_slice(&entry.pos.to_be_bytes());
    value.extend_from_slice(&entry.seq.to_be_bytes());
    value
}

fn decode_run_value(value: &[u8]) -> Result<RunEntry, Error> {
    let malformed = || Error::Store("malformed run index entry".into());
    let (text, numbers) = value.split_at(value.len().checked_sub(16).ok_or_else(malformed)?);
    let text = text.strip_suffix(&[0]).ok_or_else(malformed)?;
    let split = text.iter().position(|b| *b == 0).ok_or_else(malformed)?;
    Ok(RunEntry {
        session_id: stored_id(&text[..split])?,
        agent_id: std::str::from_utf8(&text[split + 1..])
            .map_err(|_| malformed())?
            .to_owned(),
        pos: be_u64(&numbers[..8]).ok_or_else(malformed)?,
        seq: be_u64(numbers).ok_or_else(malformed)?,
    })
}

/// A run's entry: staged in this batch, or in the tree.
fn run_entry(tree: &sled::Tree, staged: &StagedRuns, run_id: &RunId) -> Option<RunEntry> {
    if let Some(entry) = staged.runs.get(run_id) {
        return Some(entry.clone());
    }
    let bytes = tree.get(run_key(run_id)).ok()??;
    decode_run_value(&bytes).ok()
}

/// The staged status of a run this batch removed from its agent's index.
const GONE: u8 = 0;

/// A run's status byte in its agent's run index: as this batch left it, else the tree's.
fn indexed_status(
    tree: &sled::Tree,
    staged: &StagedRuns,
    run_id: &RunId,
    entry: &RunEntry,
) -> Option<u8> {
    if let Some(status) = staged.statuses.get(run_id) {
        return Some(*status).filter(|status| *status != GONE);
    }
    tree.get(agent_runs_key(&entry.agent_id, entry.pos))
        .ok()??
        .first()
        .copied()
}

/// A run status as the agent's run index stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexedStatus {
    /// Queued.
    Pending,
    /// Started.
    Running,
    /// Ended with an answer.
    Completed,
    /// Ended in an error.
    Error,
    /// Cancelled.
    Cancelled,
}

impl IndexedStatus {
    pub(crate) fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            b'P' => IndexedStatus::Pending,
            b'R' => IndexedStatus::Running,
            b'C' => IndexedStatus::Completed,
            b'E' => IndexedStatus::Error,
            b'X' => IndexedStatus::Cancelled,
            _ => return None,
        })
    }
}

/// One run of an agent, as its run index lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRun {
    /// Position of its `RunQueued`.
    pub pos: JournalPos,
    /// Its session.
    pub session_id: SessionId,
    /// The run.
    pub run_id: RunId,
    /// Its status as of the last durable record.
    pub status: IndexedStatus,
}

/// Secondary indexes of one event, in the same atomic batch as its record: the index
/// rules ([`chain::index_changes`]) as sled keys.
pub(crate) fn index_event(
    tree: &sled::Tree,
    batch: &mut sled::Batch,
    staged: &mut StagedRuns,
    recorded: (&SessionId, JournalPos, Seq, i64),
    event: &Event,
) {
    let (session_id, pos, seq, ts_us) = recorded;
    for change in chain::index_changes(event) {
        match change {
            IndexChange::RunQueued { run_id, agent_id } => {
                let entry = RunEntry {
                    session_id: session_id.clone(),
                    agent_id: agent_id.to_owned(),
                    pos: pos.0,
                    seq: seq.0,
                };
                batch.insert(run_key(run_id), run_value(&entry));
                batch.insert(open_key(run_id), session_id.as_str().as_bytes());
                batch.insert(
                    session_runs_key(session_id, seq.0),
                    run_id.as_str().as_bytes(),
                );
                batch.insert(
                    agent_runs_key(agent_id, pos.0),
                    agent_runs_value(b'P', session_id, run_id),
                );
                staged.counts.push((agent_id.to_owned(), b'P', 1));
                staged.statuses.insert(run_id.clone(), b'P');
                staged.runs.insert(run_id.clone(), entry);
            }
            IndexChange::SessionCreated { agent_id, user_id } => {
                batch.insert(
                    session_key(session_id),
                    session_value(agent_id, user_id, ts_us),
                );
            }
            IndexChange::SessionDeleted => {
                batch.remove(session_key(session_id));
                // The session's runs leave its agent's list and the session's own (a
                // session id used again begins with no runs).
                let mut runs: Vec<RunId> = tree
                    .scan_prefix(session_runs_prefix(session_id))
                    .filter_map(Result::ok)
                    .filter_map(|(_, value)| stored_id(&value).ok())
                    .collect();
                runs.extend(
                    staged
                        .runs
                        .iter()
                        .filter(|(_, entry)| &entry.session_id == session_id)
                        .map(|(run_id, _)| run_id.clone()),
                );
                for run_id in runs {
                    if let Some(entry) = run_entry(tree, staged, &run_id) {
                        if let Some(status) = indexed_status(tree, staged, &run_id, &entry) {
                            staged.counts.push((entry.agent_id.clone(), status, -1));
                        }
                        // Gone from the index, also for the rest of this batch.
                        staged.statuses.insert(run_id.clone(), GONE);
                        batch.remove(agent_runs_key(&entry.agent_id, entry.pos));
                        batch.remove(session_runs_key(session_id, entry.seq));
                    }
                }
            }
            IndexChange::KeyBound { key, run_id } => {
                batch.insert(idempotency_key(key), run_id.as_str().as_bytes());
            }
            IndexChange::RunStatus {
                run_id,
                status,
                terminal,
            } => {
                if terminal {
                    batch.remove(open_key(run_id));
                }
                // Only a run its agent's index lists (a deleted session's runs left it).
                if let Some(entry) = run_entry(tree, staged, run_id)
                    && let Some(before) = indexed_status(tree, staged, run_id, &entry)
                {
                    staged.counts.push((entry.agent_id.clone(), before, -1));
                    staged.counts.push((entry.agent_id.clone(), status, 1));
                    staged.statuses.insert(run_id.clone(), status);
                    batch.insert(
                        agent_runs_key(&entry.agent_id, entry.pos),
                        agent_runs_value(status, session_id, run_id),
                    );
                }
            }
        }
    }
}

/// An id stored in an index key or value.
fn stored_id<T: std::str::FromStr>(bytes: &[u8]) -> Result<T, Error> {
    let text = std::str::from_utf8(bytes).map_err(|e| Error::Store(e.to_string()))?;
    text.parse()
        .map_err(|_| Error::Store(format!("malformed id {text:?} in an index")))
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

impl SledJournal {
    /// Opens (or creates) the journal in `dir`. Fails with [`Error::Locked`] when
    /// another process holds it.
    pub fn open(dir: &Path, options: JournalOptions) -> Result<SledJournal, Error> {
        std::fs::create_dir_all(dir)?;
        let db = open_sled(dir, &options)?;
        let tree = db.open_tree("journal")?;
        // sled keeps its log in the `db` file: this is what fdatasync must reach.
        let db_file = File::open(dir.join("db"))?;
        // The directory entries of sled's files must survive a power loss too.
        File::open(dir)?.sync_all()?;
        if tree.scan_prefix([LAYOUT_1_STREAM]).next().is_some() {
            return Err(Error::Store(format!(
                "{} holds a journal in layout 1 (records under per-session keys), which this build does not read",
                dir.display()
            )));
        }
        let next_pos = match tree.scan_prefix([LOG]).next_back() {
            Some(entry) => {
                let (key, bytes) = entry?;
                let first_pos = be_u64(&key).unwrap_or(0);
                let segment = parse_segment(bytes, JournalPos(first_pos))?;
                first_pos + segment.len() as u64
            }
            None => 0,
        };
        let tail = Arc::new(RwLock::new(rebuild_tail(&tree)?));
        let next_pos = Arc::new(AtomicU64::new(next_pos));
        let (live, _) = broadcast::channel(limits::LIVE_BROADCAST_RECORDS);
        let (sender, receiver) = mpsc::channel(limits::APPEND_QUEUE_REQUESTS_MAX);
        let sync_failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sync_failed_flag = sync_failed.clone();
        let (sync_sender, sync_receiver) = std::sync::mpsc::sync_channel(1);
        let stats = Arc::new(JournalStats::default());
        let syncer = Syncer {
            stats: stats.clone(),
            db_file,
            blobs_dir: dir.join("blobs"),
            synced_blobs: HashSet::new(),
            durable_pos: next_pos.clone(),
            live: live.clone(),
            last_sync_us: 0,
        };
        let agent_run_counts: AgentRunCounts = Arc::new(Mutex::new(count_agent_runs(&tree)?));
        let committer = Committer {
            tree: tree.clone(),
            staged_runs: StagedRuns::default(),
            agent_run_counts: agent_run_counts.clone(),
            tail: tail.clone(),
            index_written: Instant::now(),
            heads: HashMap::new(),
            next_pos: next_pos.load(Ordering::SeqCst),
            stopped: false,
            syncer_db: db.clone(),
            syncer: sync_sender,
            sync_failed: sync_failed.clone(),
            dir: dir.to_path_buf(),
        };
        let sync_thread = std::thread::Builder::new()
            .name("journal-sync".into())
            .spawn(move || syncer.run(sync_receiver, sync_failed))?;
        let handle = std::thread::Builder::new()
            .name("journal-commit".into())
            .spawn(move || {
                committer.run(receiver);
                // The committer dropped its sender: the sync thread answers what is left, then ends.
                let _ = sync_thread.join();
            })?;
        Ok(SledJournal {
            inner: Arc::new(Inner {
                stats,
                path: dir.to_path_buf(),
                tree,
                sender: Mutex::new(Some(sender)),
                committer: Mutex::new(Some(handle)),
                live,
                next_pos,
                tail,
                db,
                max_event_bytes: options.max_event_bytes.min(limits::EVENT_BYTES_CEILING),
                agent_run_counts,
                failed: sync_failed_flag,
            }),
        })
    }

    /// Whether an append can be written now: `Err` (unavailable) after a failed write,
    /// or while the disk is full or read-only.
    pub fn writable(&self) -> Result<(), Error> {
        if self.inner.failed.load(Ordering::SeqCst) {
            return Err(Error::Stopped);
        }
        storage_gate(&self.inner.path, 0)
    }

    /// Counters since the journal was opened.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot(self.next_pos().0)
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn sender(&self) -> Result<mpsc::Sender<Job>, Error> {
        self.inner
            .sender
            .lock()
            .map_err(|_| Error::Stopped)?
            .clone()
            .ok_or(Error::Stopped)
    }

    /// Appends `events` to the session's stream, atomically, and returns once they are
    /// durable. The outer error is a fault; the inner one a sequence conflict.
    pub async fn append(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        let (request, answer) =
            Request::new(session_id, expected, events, self.inner.max_event_bytes)?;
        self.sender()?
            .send(Job::Append(request))
            .await
            .map_err(|_| Error::Stopped)?;
        answer.await.map_err(|_| Error::Stopped)?
    }

    /// [`SledJournal::append`], but the request is queued before this returns, so appends
    /// made one after the other (by one actor, say) are journaled in that order,
    /// whenever their futures are polled. With the append queue full
    /// ([`limits::APPEND_QUEUE_REQUESTS_MAX`] requests waiting) the append is refused
    /// rather than queued out of order.
    pub fn append_in_order(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> Result<
        Result<impl std::future::Future<Output = AppendResult> + Send + 'static, AppendQueueFull>,
        Error,
    > {
        let (request, answer) =
            Request::new(session_id, expected, events, self.inner.max_event_bytes)?;
        match self.sender()?.try_send(Job::Append(request)) {
            Ok(()) => Ok(Ok(async move { answer.await.map_err(|_| Error::Stopped)? })),
            Err(mpsc::error::TrySendError::Full(_)) => Ok(Err(AppendQueueFull)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Error::Stopped),
        }
    }

    /// [`SledJournal::append`] for threads outside an async runtime.
    pub fn append_blocking(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        let (request, answer) =
            Request::new(session_id, expected, events, self.inner.max_event_bytes)?;
        self.sender()?
            .blocking_send(Job::Append(request))
            .map_err(|_| Error::Stopped)?;
        answer.blocking_recv().map_err(|_| Error::Stopped)?
    }

    /// Encoded bytes of one event at most (`JournalOptions::max_event_bytes`).
    pub fn max_event_bytes(&self) -> usize {
        self.inner.max_event_bytes
    }

    /// The position the next durable record will get (= number of records).
    pub fn next_pos(&self) -> JournalPos {
        JournalPos(self.inner.next_pos.load(Ordering::SeqCst))
    }

    /// Reads one record by global position.
    pub fn get(&self, pos: JournalPos) -> Result<Option<Recorded>, Error> {
        if pos >= self.next_pos() {
            return Ok(None);
        }
        match segment_at(&self.inner.tree, pos)? {
            None => Ok(None),
            Some((first_pos, segment)) => {
                record_in(&self.inner.tree, &segment, first_pos, pos, Hashing::Compute).map(Some)
            }
        }
    }

    /// One session's stream from `from` on, in order, each record's hash computed or
    /// not.
    pub(crate) fn read_session(
        &self,
        session_id: &SessionId,
        from: Seq,
        hashing: Hashing,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + use<> {
        // Records applied but not yet synced are not shown: nobody sees an event
        // before it is durable.
        let durable = self.next_pos();
        let (runs, failed) =
            match session_runs(&self.inner.tree, &self.inner.tail, session_id, from) {
                Ok(runs) => (runs, None),
                Err(error) => (Vec::new(), Some(error)),
            };
        SessionReader {
            tree: self.inner.tree.clone(),
            stats: self.inner.stats.clone(),
            session_id: session_id.clone(),
            runs: runs.into_iter(),
            current: None,
            segment: None,
            next_seq: from,
            durable,
            failed,
            done: false,
            hashing,
        }
    }

    /// The whole journal from `from` on, in global order.
    pub fn read_from(
        &self,
        from: JournalPos,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + use<> {
        // Start at the segment that holds `from`, which may begin before it.
        let start = match self
            .inner
            .tree
            .range(log_key(JournalPos(0))..=log_key(from))
            .next_back()
        {
            Some(Ok((key, _))) => JournalPos(be_u64(&key).unwrap_or(0)),
            _ => from,
        };
        LogReader {
            tree: self.inner.tree.clone(),
            stats: self.inner.stats.clone(),
            segments: self
                .inner
                .tree
                .range(log_key(start)..=log_key(JournalPos(u64::MAX))),
            current: None,
            from,
            durable: self.next_pos(),
            failed: false,
        }
    }

    /// The next sequence of a session's stream (0 for a session with no events).
    pub fn session_next_seq(&self, session_id: &SessionId) -> Result<Seq, Error> {
        // Only durable records count: a run applied but not synced yet is skipped.
        let Some(last) = last_run(&self.inner.tree, &self.inner.tail, session_id)? else {
            return Ok(Seq(0));
        };
        if last.pos < self.next_pos() {
            return Ok(Seq(last.first_seq.0 + u64::from(last.count)));
        }
        // Racing an append in flight (rare): read the durable stream.
        Ok(self
            .read_session(session_id, Seq(0), Hashing::Skip)
            .last()
            .transpose()?
            .map(|record| record.seq.next())
            .unwrap_or_default())
    }

    /// The session a run belongs to, if the run was ever queued.
    pub fn session_of_run(&self, run_id: &RunId) -> Result<Option<SessionId>, Error> {
        self.inner
            .tree
            .get(run_key(run_id))?
            .map(|bytes| decode_run_value(&bytes).map(|entry| entry.session_id))
            .transpose()
    }

    /// A session's runs, oldest first, with the sequence each was queued at (none of a
    /// deleted session's; a session id used again lists only its new runs).
    pub fn session_runs(&self, session_id: &SessionId) -> Result<Vec<(Seq, RunId)>, Error> {
        self.inner
            .tree
            .scan_prefix(session_runs_prefix(session_id))
            .map(|entry| {
                let (key, value) = entry?;
                Ok((Seq(be_u64(&key).unwrap_or(0)), stored_id(&value)?))
            })
            .collect()
    }

    /// How many runs an agent has with each status, in [`IndexedStatus`] order (kept
    /// as runs change; counts runs applied and not yet durable too).
    pub fn agent_run_counts(&self, agent_id: &str) -> [u64; 5] {
        self.inner
            .agent_run_counts
            .lock()
            .ok()
            .and_then(|counts| counts.get(agent_id).copied())
            .unwrap_or_default()
    }

    /// An agent's runs in the order they were queued (newest first when `newest_first`),
    /// from the run index (no stream is read), with each run's status; none of a deleted
    /// session's.
    pub fn agent_runs(
        &self,
        agent_id: &str,
        newest_first: bool,
    ) -> impl Iterator<Item = Result<AgentRun, Error>> + use<> {
        let durable = self.next_pos();
        let scan = self.inner.tree.scan_prefix(agent_runs_prefix(agent_id));
        let entries: Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>> + Send> =
            if newest_first {
                Box::new(scan.rev())
            } else {
                Box::new(scan)
            };
        entries
            .map(|entry| {
                let (key, value) = entry?;
                let malformed = || Error::Store("malformed agent run index entry".into());
                let (status, ids) = value.split_first().ok_or_else(malformed)?;
                let split = ids.iter().position(|b| *b == 0).ok_or_else(malformed)?;
                Ok(AgentRun {
                    pos: JournalPos(be_u64(&key).ok_or_else(malformed)?),
                    session_id: stored_id(&ids[..split])?,
                    run_id: stored_id(&ids[split + 1..])?,
                    status: IndexedStatus::from_byte(*status).ok_or_else(malformed)?,
                })
            })
            // Applied but not yet synced: not shown.
            .filter(move |run| run.as_ref().map_or(true, |run| run.pos < durable))
    }

    /// Runs that have been queued and have not ended, with their sessions: what
    /// recovery must resolve after a restart.
    pub fn open_runs(&self) -> Result<Vec<(RunId, SessionId)>, Error> {
        self.inner
            .tree
            .scan_prefix([OPEN])
            .map(|entry| {
                let (key, value) = entry?;
                Ok((stored_id(&key[1..key.len() - 1])?, stored_id(&value)?))
            })
            .collect()
    }

    /// Every session that exists (created and not deleted), in id order.
    pub fn sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        self.inner
            .tree
            .scan_prefix([SESSION])
            .map(|entry| {
                let (key, value) = entry?;
                decode_session_entry(&key, &value)
            })
            .collect()
    }

    /// The run an idempotency key was bound to, if any.
    pub fn run_of_idempotency_key(&self, key: &str) -> Result<Option<RunId>, Error> {
        self.inner
            .tree
            .get(idempotency_key(key))?
            .map(|bytes| stored_id(&bytes))
            .transpose()
    }

    /// The live feed of durable records, for a [`crate::Subscription`].
    pub fn live(&self) -> broadcast::Receiver<Arc<Recorded>> {
        self.inner.live.subscribe()
    }

    pub(crate) fn tree(&self) -> &sled::Tree {
        &self.inner.tree
    }

    /// Stores a projection (derived data, rebuildable from the events: written without
    /// a sync; `journal rebuild` compares it with a fresh fold).
    pub fn put_projection(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        storage_gate(&self.inner.path, value.len() as u64)?;
        self.inner
            .db
            .open_tree(PROJECTIONS)?
            .insert(key.as_bytes(), value)?;
        Ok(())
    }

    /// A stored projection.
    pub fn get_projection(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self
            .inner
            .db
            .open_tree(PROJECTIONS)?
            .get(key.as_bytes())?
            .map(|value| value.to_vec()))
    }

    /// Every stored projection, in key order.
    pub fn projections(&self) -> Result<Vec<(String, Vec<u8>)>, Error> {
        self.inner
            .db
            .open_tree(PROJECTIONS)?
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                Ok((String::from_utf8_lossy(&key).into_owned(), value.to_vec()))
            })
            .collect()
    }

    /// Stops the committer after it answers every queued append, and flushes.
    pub fn close(&self) -> Result<(), Error> {
        self.inner.close()
    }

    /// Queues `call` to be made on the committer's thread, after the appends queued
    /// before it (nothing when the journal is closed or the queue is full).
    pub fn call_on_committer(&self, call: fn()) {
        if let Ok(sender) = self.sender() {
            let _ = sender.try_send(Job::Call(call));
        }
    }
}

impl Inner {
    fn close(&self) -> Result<(), Error> {
        if let Ok(mut sender) = self.sender.lock() {
            sender.take();
        }
        let handle = self.committer.lock().ok().and_then(|mut h| h.take());
        if let Some(handle) = handle {
            let _ = handle.join();
        }
        self.db.flush()?;
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(error) = self.close() {
            tracing::error!(%error, "journal close failed");
        }
    }
}

/// Parses the segment stored at `first_pos`, naming that position if it is bad.
pub(crate) fn parse_segment(
    bytes: sled::IVec,
    first_pos: JournalPos,
) -> Result<Segment<sled::IVec>, Error> {
    Segment::parse(bytes).map_err(|error| Error::Corrupt {
        pos: first_pos,
        reason: format!("segment: {error}"),
    })
}

/// The segment holding global position `pos`, with its first position.
fn segment_at(
    tree: &sled::Tree,
    pos: JournalPos,
) -> Result<Option<(JournalPos, Segment<sled::IVec>)>, Error> {
    let Some(entry) = tree
        .range(log_key(JournalPos(0))..=log_key(pos))
        .next_back()
    else {
        return Ok(None);
    };
    let (key, bytes) = entry?;
    let first_pos = JournalPos(be_u64(&key).unwrap_or(0));
    let segment = parse_segment(bytes, first_pos)?;
    if pos.0 - first_pos.0 >= segment.len() as u64 {
        return Ok(None);
    }
    Ok(Some((first_pos, segment)))
}

/// Decodes the record at `pos` of a segment that begins at `first_pos`.
fn record_in(
    tree: &sled::Tree,
    segment: &Segment<sled::IVec>,
    first_pos: JournalPos,
    pos: JournalPos,
    hashing: Hashing,
) -> Result<Recorded, Error> {
    let bytes = pos
        .0
        .checked_sub(first_pos.0)
        .and_then(|index| segment.record(index as usize))
        .ok_or_else(|| Error::Corrupt {
            pos,
            reason: format!("record missing from the segment at {first_pos}"),
        })?;
    decode_record(tree, bytes, pos, hashing)
}

/// The runs of a session's records that end past `from`, in sequence order: the
/// in-memory tail first, then the stored index from the chunk that holds `from` (a run
/// moved from one to the other meanwhile is seen twice, and deduplicated, rather than
/// not at all).
fn session_runs(
    tree: &sled::Tree,
    tail: &RwLock<Tail>,
    session_id: &SessionId,
    from: Seq,
) -> Result<Vec<Run>, Error> {
    let ends_past_from = |run: &Run| run.first_seq.0 + u64::from(run.count) > from.0;
    let (mut runs, tail_covers_from) = {
        let tail = tail.read().map_err(|_| Error::Stopped)?;
        let in_tail = tail
            .runs
            .get(session_id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        (
            in_tail
                .iter()
                .copied()
                .filter(ends_past_from)
                .collect::<Vec<Run>>(),
            in_tail.first().is_some_and(|run| run.first_seq <= from),
        )
    };
    // The tail holds a session's newest runs (it is emptied whole once the index has
    // them, and appends go on into it): when its first one starts at or before `from`,
    // every run the index holds ends before it, and the index need not be read. A
    // read from a session's end, the common one, then costs no index lookup.
    if tail_covers_from {
        return Ok(runs);
    }
    let prefix = index_prefix(session_id);
    let start = match tree
        .range(prefix.clone()..=index_key(session_id, from))
        .next_back()
    {
        Some(entry) => entry?.0.to_vec(),
        None => prefix.clone(),
    };
    for entry in tree.range(start..index_end(session_id)) {
        let (key, bytes) = entry?;
        let chunk = codec::decode_runs(&bytes).map_err(|error| {
            Error::Store(format!(
                "session index of {session_id} at sequence {}: {error}",
                be_u64(&key).unwrap_or(0)
            ))
        })?;
        runs.extend(chunk.into_iter().filter(ends_past_from));
    }
    runs.sort_unstable();
    runs.dedup();
    Ok(runs)
}

/// The last run of a session's records: in the tail if it has one, else at the end of
/// its last index chunk.
fn last_run(
    tree: &sled::Tree,
    tail: &RwLock<Tail>,
    session_id: &SessionId,
) -> Result<Option<Run>, Error> {
    let in_tail = tail
        .read()
        .map_err(|_| Error::Stopped)?
        .runs
        .get(session_id)
        .and_then(|runs| runs.last().copied());
    if in_tail.is_some() {
        return Ok(in_tail);
    }
    let Some(entry) = tree
        .range(index_prefix(session_id)..index_end(session_id))
        .next_back()
    else {
        return Ok(None);
    };
    let (_, bytes) = entry?;
    let runs = codec::decode_runs(&bytes)
        .map_err(|error| Error::Store(format!("session index of {session_id}: {error}")))?;
    Ok(runs.last().copied())
}

/// The session index of the records past the watermark, read from their segments.
fn rebuild_tail(tree: &sled::Tree) -> Result<Tail, Error> {
    let watermark = watermark(tree)?;
    let mut tail = Tail::default();
    for entry in tree.range(log_key(watermark)..=log_key(JournalPos(u64::MAX))) {
        let (key, bytes) = entry?;
        let mut pos = be_u64(&key).unwrap_or(0);
        let segment = parse_segment(bytes, JournalPos(pos))?;
        let entries = segment.entries().map_err(|error| Error::Corrupt {
            pos: JournalPos(pos),
            reason: format!("segment manifest: {error}"),
        })?;
        for entry in entries {
            tail.runs.entry(entry.session_id).or_default().push(Run {
                first_seq: entry.first_seq,
                count: entry.count,
                pos: JournalPos(pos),
            });
            tail.len += 1;
            pos += u64::from(entry.count);
        }
    }
    Ok(tail)
}

/// Whether the journal's disk can take `bytes` more: refused as unavailable when its
/// file system is read-only or would keep less than
/// [`limits::JOURNAL_DISK_RESERVE_BYTES`] free. One `statvfs` (~1 µs): checked before
/// every batch, so sled never meets a full or read-only disk, after which it would
/// refuse everything until a restart; once space is freed the next batch goes through.
pub(crate) fn storage_gate(dir: &Path, bytes: u64) -> Result<(), Error> {
    let stat = match rustix::fs::statvfs(dir) {
        Ok(stat) => stat,
        // The directory itself is gone or unreadable: sled's write will say why.
        Err(_) => return Ok(()),
    };
    if stat.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
        return Err(Error::Unavailable(
            "the journal's data directory is read-only".into(),
        ));
    }
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    let needed = bytes.saturating_add(limits::JOURNAL_DISK_RESERVE_BYTES);
    if free < needed {
        return Err(Error::Unavailable(format!(
            "no space left on the journal's disk ({} MiB free, {} MiB needed)",
            free / (1024 * 1024),
            needed.div_ceil(1024 * 1024)
        )));
    }
    Ok(())
}

/// Decodes the record stored at global position `pos`.
fn decode_record(
    tree: &sled::Tree,
    bytes: &[u8],
    pos: JournalPos,
    hashing: Hashing,
) -> Result<Recorded, Error> {
    let mut record = Recorded::decode(bytes, pos, hashing).map_err(|error| Error::Corrupt {
        pos,
        reason: error.to_string(),
    })?;
    if let Event::StoredApart { digest, .. } = &record.event {
        let corrupt = |reason: String| Error::Corrupt {
            pos: record.pos,
            reason,
        };
        let stored = tree
            .get(apart_key(digest))?
            .ok_or_else(|| corrupt("the event stored apart is missing".into()))?;
        let event = codec::decode_apart(digest, &stored).map_err(corrupt)?;
        record.size_bytes += stored.len();
        record.event = event;
    }
    Ok(record)
}

/// Reads one session's records run by run, each run from its segment.
struct SessionReader {
    tree: sled::Tree,
    stats: Arc<JournalStats>,
    session_id: SessionId,
    runs: std::vec::IntoIter<Run>,
    /// The run being read and how many of its records are done.
    current: Option<(Run, u32)>,
    /// The last segment read (consecutive runs often share one).
    segment: Option<(JournalPos, Segment<sled::IVec>)>,
    next_seq: Seq,
    /// Records at or past this position are not durable yet.
    durable: JournalPos,
    failed: Option<Error>,
    done: bool,
    hashing: Hashing,
}

impl SessionReader {
    fn read(&mut self, run: Run, offset: u32, seq: Seq) -> Result<Recorded, Error> {
        let pos = JournalPos(run.pos.0 + u64::from(offset));
        let cached = self.segment.as_ref().is_some_and(|(first, segment)| {
            first.0 <= pos.0 && pos.0 - first.0 < segment.len() as u64
        });
        if !cached {
            self.segment = segment_at(&self.tree, pos)?;
        }
        let Some((first_pos, segment)) = &self.segment else {
            return Err(Error::Corrupt {
                pos,
                reason: format!(
                    "no segment holds the record of session {} sequence {seq}",
                    self.session_id
                ),
            });
        };
        let record = record_in(&self.tree, segment, *first_pos, pos, self.hashing)?;
        if record.session_id != self.session_id || record.seq != seq {
            return Err(Error::Corrupt {
                pos,
                reason: format!(
                    "the session index names session {} sequence {seq} here, the record is session {} sequence {}",
                    self.session_id, record.session_id, record.seq
                ),
            });
        }
        Ok(record)
    }
}

impl Iterator for SessionReader {
    type Item = Result<Recorded, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(error) = self.failed.take() {
            self.done = true;
            return Some(Err(error));
        }
        while !self.done {
            let Some((run, offset)) = self.current else {
                self.current = Some((self.runs.next()?, 0));
                continue;
            };
            if offset >= run.count {
                self.current = None;
                continue;
            }
            self.current = Some((run, offset + 1));
            let seq = Seq(run.first_seq.0 + u64::from(offset));
            if seq < self.next_seq {
                continue;
            }
            if run.pos.0 + u64::from(offset) >= self.durable.0 {
                return None;
            }
            let record = self.read(run, offset, seq);
            self.stats.records_read.fetch_add(1, Ordering::Relaxed);
            self.done = record.is_err();
            self.next_seq = seq.next();
            return Some(record);
        }
        None
    }
}

/// Reads records in global order, one segment at a time.
struct LogReader {
    tree: sled::Tree,
    stats: Arc<JournalStats>,
    segments: sled::Iter,
    /// The segment being read, its first position, and the next record's index in it.
    current: Option<(Segment<sled::IVec>, JournalPos, usize)>,
    from: JournalPos,
    /// Records at or past this position are not durable yet.
    durable: JournalPos,
    failed: bool,
}

impl Iterator for LogReader {
    type Item = Result<Recorded, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.failed {
            if let Some((segment, first_pos, index)) = &mut self.current {
                if *index < segment.len() {
                    let pos = JournalPos(first_pos.0 + *index as u64);
                    *index += 1;
                    if pos < self.from {
                        continue;
                    }
                    if pos >= self.durable {
                        return None;
                    }
                    let record = record_in(&self.tree, segment, *first_pos, pos, Hashing::Compute);
                    self.stats.records_read.fetch_add(1, Ordering::Relaxed);
                    self.failed = record.is_err();
                    return Some(record);
                }
                self.current = None;
            }
            let (key, bytes) = match self.segments.next()? {
                Ok(entry) => entry,
                Err(error) => {
                    self.failed = true;
                    return Some(Err(error.into()));
                }
            };
            let first_pos = JournalPos(be_u64(&key).unwrap_or(0));
            match parse_segment(bytes, first_pos) {
                Ok(segment) => self.current = Some((segment, first_pos, 0)),
                Err(error) => {
                    self.failed = true;
                    return Some(Err(error));
                }
            }
        }
        None
    }
}

struct Committer {
    tree: sled::Tree,
    /// Runs queued in the batch being built.
    staged_runs: StagedRuns,
    agent_run_counts: AgentRunCounts,
    tail: Arc<RwLock<Tail>>,
    /// When the session index was last written.
    index_written: Instant,
    heads: HashMap<SessionId, Head>,
    next_pos: u64,
    /// Set after a failed write or sync: nothing about the store can be assumed since.
    stopped: bool,
    syncer_db: sled::Db,
    syncer: std::sync::mpsc::SyncSender<SyncJob>,
    sync_failed: Arc<std::sync::atomic::AtomicBool>,
    /// The data directory, whose disk is checked before each batch.
    dir: std::path::PathBuf,
}

/// Where one appender's answer goes, and what it will be once the batch is durable.
type PendingAnswer = (
    oneshot::Sender<AppendResult>,
    Result<Vec<Arc<Recorded>>, Conflict>,
);

/// A batch applied to sled, waiting for the sync that makes it durable.
struct SyncJob {
    answers: Vec<PendingAnswer>,
    staged: Vec<Arc<Recorded>>,
    end_pos: u64,
}

impl Committer {
    fn run(mut self, mut receiver: mpsc::Receiver<Job>) {
        let mut requests = Vec::with_capacity(limits::GROUP_COMMIT_REQUESTS_MAX);
        let mut calls = Vec::new();
        let mut last_batch = 1;
        while let Some(first) = receiver.blocking_recv() {
            let first = match first {
                Job::Append(request) => request,
                Job::Call(call) => {
                    call();
                    continue;
                }
            };
            let mut bytes = first.bytes();
            requests.push(first);
            // Linger briefly for as many requests as the last batch had: appenders
            // answered together come back together, a little apart. Without this, a
            // steady load splits into small batches and pays a sync for each.
            let linger_until =
                Instant::now() + Duration::from_micros(limits::GROUP_COMMIT_LINGER_US);
            while requests.len() < limits::GROUP_COMMIT_REQUESTS_MAX
                && bytes < limits::GROUP_COMMIT_BYTES_MAX
            {
                match receiver.try_recv() {
                    Ok(Job::Append(request)) => {
                        bytes += request.bytes();
                        requests.push(request);
                    }
                    Ok(Job::Call(call)) => calls.push(call),
                    Err(mpsc::error::TryRecvError::Empty)
                        if requests.len() < last_batch && Instant::now() < linger_until =>
                    {
                        std::thread::yield_now();
                    }
                    Err(_) => break,
                }
            }
            last_batch = requests.len();
            self.commit(&mut requests);
            for call in calls.drain(..) {
                call();
            }
        }
        self.write_tail_to_index();
    }

    /// On close: writes the in-memory tail to the session index, so that a cleanly
    /// closed journal has its index complete up to its end (and opens without
    /// reading segments back). After a crash, opening rebuilds the tail instead.
    fn write_tail_to_index(&mut self) {
        if self.stopped {
            return;
        }
        let Ok(mut tail) = self.tail.write() else {
            return;
        };
        if tail.len == 0 {
            return;
        }
        let mut batch = sled::Batch::default();
        let written = write_index(
            &self.tree,
            &mut batch,
            tail.runs.iter().map(|(id, runs)| (id, runs.as_slice())),
            JournalPos(self.next_pos),
        )
        .and_then(|()| Ok(self.tree.apply_batch(batch)?));
        match written {
            Ok(()) => *tail = Tail::default(),
            Err(error) => tracing::warn!(%error, "could not write the session index on close"),
        }
    }

    fn head(&mut self, session_id: &SessionId) -> Result<Head, Error> {
        if let Some(head) = self.heads.get(session_id) {
            return Ok(*head);
        }
        let head = match last_run(&self.tree, &self.tail, session_id)? {
            None => Head::EMPTY,
            Some(run) => {
                let last = JournalPos(run.pos.0 + u64::from(run.count) - 1);
                let (first_pos, segment) =
                    segment_at(&self.tree, last)?.ok_or_else(|| Error::Corrupt {
                        pos: last,
                        reason: format!("the last record of session {session_id} is missing"),
                    })?;
                let bytes = segment
                    .record((last.0 - first_pos.0) as usize)
                    .expect("segment_at found it");
                Head {
                    next_seq: Seq(run.first_seq.0 + u64::from(run.count)),
                    last_hash: codec::hash(bytes),
                }
            }
        };
        if self.heads.len() >= limits::SESSION_HEADS_CACHED_MAX {
            self.heads.clear();
        }
        self.heads.insert(session_id.clone(), head);
        Ok(head)
    }

    /// Stages and applies one group; the syncer makes it durable and answers.
    fn commit(&mut self, requests: &mut Vec<Request>) {
        if self.stopped {
            for request in requests.drain(..) {
                let _ = request.reply.send(Err(Error::Stopped));
            }
            return;
        }
        let bytes: usize = requests.iter().map(Request::bytes).sum();
        if let Err(error) = storage_gate(&self.dir, bytes as u64) {
            // Nothing written: the journal goes on once the disk can take it.
            let detail = error.to_string();
            for request in requests.drain(..) {
                let _ = request.reply.send(Err(Error::Unavailable(
                    error.unavailable().unwrap_or_else(|| detail.clone()),
                )));
            }
            return;
        }
        let ts_us = now_us();
        let mut batch = sled::Batch::default();
        self.staged_runs.clear();
        let mut answers = Vec::with_capacity(requests.len());
        let start_pos = self.next_pos;
        let mut staged = Vec::new();
        let mut manifest = Vec::new();
        let mut records = Vec::new();
        for request in requests.drain(..) {
            let Request {
                session_id,
                expected,
                events,
                reply,
            } = request;
            match self.stage(
                &session_id,
                expected,
                events,
                ts_us,
                &mut batch,
                (&mut manifest, &mut records),
            ) {
                Ok(Ok(recorded)) => {
                    staged.extend(recorded.iter().cloned());
                    answers.push((reply, Ok(recorded)));
                }
                Ok(Err(conflict)) => answers.push((reply, Err(conflict))),
                Err(error) => {
                    let _ = reply.send(Err(error));
                }
            }
        }
        let mut index_written = false;
        if self.next_pos != start_pos {
            batch.insert(
                &log_key(JournalPos(start_pos)),
                codec::encode_segment(&manifest, &records),
            );
            drop(records);
            index_written = self.add_runs(&manifest, start_pos, &mut batch);
            if let Err(error) = self.tree.apply_batch(batch) {
                // Fail-stop: after a failed write nothing about the store can be assumed.
                tracing::error!(%error, "journal write failed; refusing further appends");
                self.stopped = true;
                self.sync_failed.store(true, Ordering::SeqCst);
                for (reply, _) in answers {
                    let _ = reply.send(Err(Error::Io(std::io::Error::other(error.to_string()))));
                }
                return;
            }
            apply_counts(&self.agent_run_counts, &self.staged_runs.counts);
        }
        if index_written && let Ok(mut tail) = self.tail.write() {
            *tail = Tail::default();
            self.index_written = Instant::now();
        }
        // sled's flush stays on this thread (it contends with apply); the fdatasync
        // that makes it durable runs on the sync thread while the next batch applies.
        if self.next_pos != start_pos
            && let Err(error) = self.syncer_db.flush()
        {
            tracing::error!(%error, "journal flush failed; refusing further appends");
            self.stopped = true;
            self.sync_failed.store(true, Ordering::SeqCst);
            for (reply, _) in answers {
                let _ = reply.send(Err(Error::Io(std::io::Error::other(error.to_string()))));
            }
            return;
        }
        let job = SyncJob {
            answers,
            staged,
            end_pos: self.next_pos,
        };
        if let Err(std::sync::mpsc::SendError(job)) = self.syncer.send(job) {
            for (reply, _) in job.answers {
                let _ = reply.send(Err(Error::Stopped));
            }
        }
        if self.sync_failed.load(Ordering::SeqCst) {
            self.stopped = true;
        }
    }

    /// Adds the runs of a segment's manifest to the in-memory tail of the session index
    /// and, when the tail is due ([`limits::SESSION_INDEX_FLUSH_MS`]) or full, adds the
    /// whole tail to the batch as index chunks with the new watermark. Returns whether
    /// it did: the tail is emptied once the batch is applied.
    fn add_runs(
        &mut self,
        manifest: &[codec::ManifestEntry],
        start_pos: u64,
        batch: &mut sled::Batch,
    ) -> bool {
        let Ok(mut tail) = self.tail.write() else {
            return false;
        };
        let mut pos = start_pos;
        for entry in manifest {
            tail.runs
                .entry(entry.session_id.clone())
                .or_default()
                .push(Run {
                    first_seq: entry.first_seq,
                    count: entry.count,
                    pos: JournalPos(pos),
                });
            tail.len += 1;
            pos += u64::from(entry.count);
        }
        let due = tail.len >= limits::SESSION_INDEX_TAIL_RUNS_MAX
            || self.index_written.elapsed()
                >= Duration::from_millis(limits::SESSION_INDEX_FLUSH_MS);
        if !due {
            return false;
        }
        match write_index(
            &self.tree,
            batch,
            tail.runs.iter().map(|(id, runs)| (id, runs.as_slice())),
            JournalPos(pos),
        ) {
            Ok(()) => true,
            Err(error) => {
                // The tail stays and is written with a later batch.
                tracing::warn!(%error, "session index not written with this batch");
                false
            }
        }
    }

    /// Assigns positions, sequences and hash links to one request's events and adds
    /// them to the segment. Events arrive encoded; only the header is encoded here.
    fn stage(
        &mut self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<codec::EncodedEvent>,
        ts_us: i64,
        batch: &mut sled::Batch,
        (manifest, records): (&mut Vec<codec::ManifestEntry>, &mut Vec<Vec<u8>>),
    ) -> Result<Result<Vec<Arc<Recorded>>, Conflict>, Error> {
        let head = self.head(session_id)?;
        if let Expected::Next(expected) = expected
            && expected != head.next_seq
        {
            return Ok(Err(Conflict {
                session_id: session_id.clone(),
                expected,
                actual: head.next_seq,
            }));
        }
        // Every record is sealed first, so that one too large refuses the whole request.
        let (sealed, head) = chain::seal(session_id, head, ts_us, &events)?;
        if let Some(first) = sealed.first() {
            manifest.push(codec::ManifestEntry {
                session_id: session_id.clone(),
                first_seq: first.seq,
                count: sealed.len() as u32,
            });
        }
        let mut pos = self.next_pos;
        let mut recorded = Vec::with_capacity(sealed.len());
        for (sealed, event) in sealed.into_iter().zip(events) {
            index_event(
                &self.tree,
                batch,
                &mut self.staged_runs,
                (session_id, JournalPos(pos), sealed.seq, ts_us),
                &event.event,
            );
            let mut size_bytes = sealed.bytes.len();
            if let Some((digest, apart)) = event.apart {
                size_bytes += apart.len();
                batch.insert(apart_key(&digest), apart);
            }
            records.push(sealed.bytes);
            recorded.push(Arc::new(Recorded {
                pos: JournalPos(pos),
                session_id: session_id.clone(),
                seq: sealed.seq,
                ts_us,
                prev_hash: sealed.prev_hash,
                hash: sealed.hash,
                size_bytes,
                event: event.event,
            }));
            pos += 1;
        }
        self.next_pos = pos;
        self.heads.insert(session_id.clone(), head);
        Ok(Ok(recorded))
    }
}

/// Makes flushed batches durable with one `fdatasync`, then answers their appenders
/// in order. It runs on its own thread so the disk's sync of one batch overlaps the
/// committer's work on the next; sled's flush stays on the committer (moving it here
/// too was measured slower: sled's flush and apply contend).
struct Syncer {
    stats: Arc<JournalStats>,
    db_file: File,
    blobs_dir: PathBuf,
    synced_blobs: HashSet<std::ffi::OsString>,
    durable_pos: Arc<AtomicU64>,
    live: broadcast::Sender<Arc<Recorded>>,
    last_sync_us: u64,
}

impl Syncer {
    fn run(
        mut self,
        receiver: std::sync::mpsc::Receiver<SyncJob>,
        failed: Arc<std::sync::atomic::AtomicBool>,
    ) {
        while let Ok(first) = receiver.recv() {
            let mut jobs = vec![first];
            jobs.extend(receiver.try_iter());
            let synced = if failed.load(Ordering::SeqCst) {
                Err(Error::Stopped)
            } else {
                self.sync()
            };
            if let Err(error) = synced {
                tracing::error!(%error, "journal sync failed; refusing further appends");
                failed.store(true, Ordering::SeqCst);
                for job in jobs {
                    for (reply, _) in job.answers {
                        let _ =
                            reply.send(Err(Error::Io(std::io::Error::other(error.to_string()))));
                    }
                }
                continue;
            }
            let appends = jobs.iter().map(|job| job.answers.len() as u64).sum();
            self.stats.record_sync(self.last_sync_us, appends);
            for job in jobs {
                self.durable_pos.store(job.end_pos, Ordering::SeqCst);
                for record in job.staged {
                    // No receiver is fine: the journal is the source, the channel a hint.
                    let _ = self.live.send(record);
                }
                for (reply, answer) in job.answers {
                    let _ = reply.send(Ok(answer));
                }
            }
        }
    }

    /// A real `fdatasync` after sled's flush (`sync_file_range` on Linux, done by the committer).
    fn sync(&mut self) -> Result<(), Error> {
        let started = std::time::Instant::now();
        self.db_file.sync_data()?;
        self.sync_new_blobs()?;
        self.last_sync_us = started.elapsed().as_micros() as u64;
        Ok(())
    }

    /// sled writes pages over ~128 KiB (large records, big nodes) to files under
    /// `blobs/` and never syncs them; a record that lives there must be synced too.
    fn sync_new_blobs(&mut self) -> Result<(), Error> {
        let entries = match std::fs::read_dir(&self.blobs_dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        let mut present = HashSet::new();
        let mut synced_any = false;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if !self.synced_blobs.contains(&name) {
                match File::open(entry.path()) {
                    Ok(file) => file.sync_data()?,
                    // sled collects blobs concurrently; a vanished one needs no sync.
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(error) => return Err(error.into()),
                }
                synced_any = true;
            }
            present.insert(name);
        }
        if synced_any {
            File::open(&self.blobs_dir)?.sync_all()?;
        }
        self.synced_blobs = present;
        Ok(())
    }
}
