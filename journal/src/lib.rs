//! turnstile's event journal: the system of record and the audit trail.
//!
//! Every session is one append-only stream of typed [`Event`]s with a contiguous
//! sequence from 0; all streams interleave into one journal with a global position.
//! Each record carries a format-version byte, a checksum and a hash link to the
//! previous record of its session, so tampering and loss are detectable ([`verify`]).
//! Appends are durable before they return, on either backend: `sled/` (embedded: one
//! committer thread syncs for every waiting appender) or `pg/` (PostgreSQL, shared by
//! replicas under leases), as a [`JournalConfig`] names it.
//!
//! This crate deliberately knows nothing about actors, HTTP or harnesses: it stores
//! and returns events, and it is the only crate that names `sled`, `bincode` or a
//! PostgreSQL driver.

mod chain;
pub mod codec;
mod config;
pub mod event;
#[cfg(feature = "faults")]
pub mod faults;
pub mod files;
pub mod format3;
pub mod ids;
mod journal;
pub mod limits;
mod pg;
pub mod portable;
mod sled;
pub mod structure;
mod subscription;
mod types;
pub mod verify;

pub use codec::{FORMAT_VERSION, Hash, RecordBody};
pub use config::JournalConfig;
pub use event::{
    Event, ForkPoint, ModelMetrics, RunEvent, RunMetrics, RunOptions, ToolCall, ToolDecision,
    Warning,
};
pub use files::{ChangeKind, FileChange, FileEntry, FileKind, SnapshotPoint};
pub use ids::{EventIndex, IdError, JournalPos, RunId, Seq, SessionId};
pub use journal::{HeadAndProjection, Journal};
pub use pg::PostgresOptions;
pub use pg::baseline::insert_round_trips as postgres_insert_round_trips;
pub use subscription::Subscription;
pub use types::{
    AgentRun, AppendQueueFull, AppendResult, Command, Conflict, Expected, IndexedStatus,
    JournalOptions, Lease, QueuedAppend, Recorded, Records, SYNC_BUCKETS_US, SessionEntry,
    SessionEvent, SessionEvents, StatsSnapshot, now_us,
};
pub use verify::{Corruption, VerifyReport};

/// The failure classes of the journal. Expected outcomes (a sequence conflict, a
/// corrupt record found by `verify`) are values, not errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operating system refused a read, write or sync.
    #[error("journal I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// sled reported a failure of its own.
    #[error("journal store failed: {0}")]
    Store(String),
    /// Another process (or another handle in this one) holds the data directory.
    #[error(
        "the data directory {path} is held by another process (is a turnstile server running on it?)"
    )]
    Locked {
        /// The directory that could not be locked.
        path: String,
    },
    /// A record could not be decoded while reading; `verify` names the reason.
    #[error("journal record at position {pos} is corrupt: {reason}")]
    Corrupt {
        /// Global position of the record.
        pos: JournalPos,
        /// What is wrong with it.
        reason: String,
    },
    /// An event cannot be encoded.
    #[error("event cannot be journaled: {0}")]
    Encode(String),
    /// An event is larger than the journal takes (`max_event_bytes`): nothing of its
    /// append was written.
    #[error(
        "event cannot be journaled: an event of {bytes} bytes ({kind}) exceeds max_event_bytes ({limit})"
    )]
    TooLarge {
        /// The event's variant.
        kind: &'static str,
        /// Its encoded size.
        bytes: usize,
        /// `max_event_bytes`.
        limit: usize,
    },
    /// This replica no longer holds the session's lease (it changed hands after this
    /// replica's heartbeat lapsed, or the heartbeat itself lapsed): nothing was written,
    /// and the replica must stop working on the session.
    #[error("this replica lost the lease of session {session_id}; nothing was written")]
    Fenced {
        /// The session.
        session_id: String,
    },
    /// Another live replica holds the session's lease.
    #[error("session {session_id} is owned by replica {owner}")]
    Owned {
        /// The session.
        session_id: String,
        /// The owner.
        owner: String,
    },
    /// A command that reads a journal found none where it was told to look.
    #[error("{location} holds no journal")]
    Missing {
        /// Where it looked.
        location: String,
    },
    /// An earlier durable write failed; the journal stops accepting appends (fail-stop).
    #[error("the journal stopped accepting appends after a failed write")]
    Stopped,
    /// The journal cannot write now (its database does not answer, its disk is full or
    /// read-only); nothing of the append was written. It may answer again later.
    #[error("the journal cannot write now: {0}")]
    Unavailable(String),
}

impl Error {
    /// What a client is told when the journal cannot write now, or `None` for a failure
    /// that is not about the journal's availability (a bad event, a lost lease, a bug).
    pub fn unavailable(&self) -> Option<String> {
        match self {
            Error::Unavailable(detail) => Some(detail.clone()),
            Error::Io(error) => Some(match error.raw_os_error() {
                Some(28) => "no space left on the journal's disk".to_owned(),
                Some(30) => "the journal's data directory is read-only".to_owned(),
                Some(13) | Some(1) => "the journal's data directory is not writable".to_owned(),
                _ => format!("the journal's disk failed: {error}"),
            }),
            Error::Stopped => Some(
                "the journal stopped accepting appends after a failed write (see the server's log)"
                    .to_owned(),
            ),
            _ => None,
        }
    }
}

impl From<::sled::Error> for Error {
    fn from(error: ::sled::Error) -> Self {
        match error {
            ::sled::Error::Io(io) => Error::Io(io),
            other => Error::Store(other.to_string()),
        }
    }
}
