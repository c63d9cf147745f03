//! The journal's vocabulary, the same on every backend: a record as committed, what an
//! append expects and how it is refused, what the indexes list, and the journal's counters.
//!
//! Nothing here touches storage; the backends (`sled/`, `pg/`) produce and take these.

use crate::Error;
use crate::codec::{self, Hash};
use crate::event::Event;
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::limits;
use std::sync::atomic::{AtomicU64, Ordering};

/// Now, in microseconds since the epoch: how a record tells its time (`ts_us`), and
/// what times compared with it are taken with.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as i64)
}

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
    /// For a record of format 3, its event as that format wrote it: what an export
    /// shows, so that importing the export writes the same bytes.
    pub format3: Option<Box<crate::format3::Event>>,
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
        let codec::Decoded { body, format3 } = codec::decode_any(bytes)?;
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
            format3: format3.map(Box::new),
        })
    }

    /// Decodes a record's bytes as a backend found them at `pos`, naming the position
    /// when they are corrupt. An event stored apart is still `StoredApart`: the backend
    /// fetches its bytes ([`Recorded::apart_digest`]) and puts it back
    /// ([`Recorded::with_apart`]); this is the one decoder of every backend.
    pub(crate) fn read(bytes: &[u8], pos: JournalPos, hashing: Hashing) -> Result<Recorded, Error> {
        Recorded::decode(bytes, pos, hashing).map_err(|error| Error::Corrupt {
            pos,
            reason: error.to_string(),
        })
    }

    /// The digest of the event stored apart that this record stands for, if it does.
    pub(crate) fn apart_digest(&self) -> Option<Hash> {
        match &self.event {
            Event::StoredApart { digest, .. } => Some(*digest),
            _ => None,
        }
    }

    /// The record with its event stored apart put back, from the bytes stored under its
    /// digest (`None`: they are missing, the record is corrupt).
    pub(crate) fn with_apart(mut self, stored: Option<&[u8]>) -> Result<Recorded, Error> {
        let Some(digest) = self.apart_digest() else {
            return Ok(self);
        };
        let pos = self.pos;
        let corrupt = |reason: String| Error::Corrupt { pos, reason };
        let stored = stored.ok_or_else(|| corrupt("the event stored apart is missing".into()))?;
        if self.format3.is_some() {
            let old: crate::format3::Event =
                codec::decode_apart_as(&digest, stored).map_err(corrupt)?;
            self.event = crate::format3::upgrade(old.clone());
            self.format3 = Some(Box::new(old));
        } else {
            self.event = codec::decode_apart(&digest, stored).map_err(corrupt)?;
        }
        self.size_bytes += stored.len();
        Ok(self)
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
    /// Waiting for a person's decision (open).
    Paused,
}

impl IndexedStatus {
    pub(crate) fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            b'P' => IndexedStatus::Pending,
            b'R' => IndexedStatus::Running,
            b'C' => IndexedStatus::Completed,
            b'E' => IndexedStatus::Error,
            b'X' => IndexedStatus::Cancelled,
            b'Z' => IndexedStatus::Paused,
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

/// Whether this replica may write a session: it holds the session's lease, or another
/// live replica does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// Ours: our appends carry its fencing token.
    Held,
    /// Another live replica's (its id).
    OwnedBy(String),
}

/// A command another replica left for this one.
#[derive(Debug, Clone)]
pub struct Command {
    /// Its id, to answer it.
    pub id: i64,
    /// The session it is for.
    pub session_id: SessionId,
    /// `enqueue` or `cancel`.
    pub kind: String,
    /// What the sender wrote (JSON).
    pub body: String,
}

/// What an append answers: the records as committed, or a sequence conflict (the inner
/// error); the outer error is a fault.
pub type AppendResult = Result<Result<Vec<std::sync::Arc<Recorded>>, Conflict>, Error>;

/// An append queued in order, to be awaited.
pub type QueuedAppend =
    std::pin::Pin<Box<dyn std::future::Future<Output = AppendResult> + Send + 'static>>;

/// A read of records, in order.
pub type Records = Box<dyn Iterator<Item = Result<Recorded, Error>> + Send>;

/// A read of a session's events, in order.
pub type SessionEvents = Box<dyn Iterator<Item = Result<SessionEvent, Error>> + Send>;
