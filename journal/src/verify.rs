//! What verification reports, on every backend: a sound journal's counts, or the first
//! bad record with its position and the reason. The walks themselves are the backends'
//! (`sled/verify.rs`, `pg/audit.rs`) and the structural rules' (`structure.rs`).

use crate::ids::JournalPos;

/// What a sound journal holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VerifyReport {
    /// Session streams.
    pub streams: u64,
    /// Records.
    pub events: u64,
    /// Encoded bytes of all records.
    pub bytes: u64,
}

/// The first bad record found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad record at position {pos}: {reason}")]
pub struct Corruption {
    /// Global position of the record (or of the batch, for a bad manifest).
    pub pos: JournalPos,
    /// What is wrong.
    pub reason: String,
}
