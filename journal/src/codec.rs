//! The on-disk record format, behind one module so a later codec is a new version.
//!
//! A record is `[version: u8][crc32 of the body: u32 LE][body]`, where the body is the
//! bincode 2 encoding (standard config: little endian, varints) of [`RecordBody`].
//! The record's hash (BLAKE3 of all its bytes) is what the session's next record links
//! to, so a flipped byte fails the checksum and a dropped, reordered or foreign record
//! breaks a sequence or a link. This module does not read or write the store.

use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::ids::{JournalPos, Seq, SessionId};
use crate::limits::RECORD_BYTES_MAX;

/// The record format this build writes and the only one it reads. bincode 2 is
/// unmaintained (RUSTSEC-2025-0141); moving off it means version 2.
pub const FORMAT_VERSION: u8 = 1;

/// Bytes before the body: version and checksum.
pub const HEADER_BYTES: usize = 5;

/// A 32-byte BLAKE3 digest linking a record to its session's previous one.
pub type Hash = [u8; 32];

/// Everything a record says, before encoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordBody {
    /// Global position across the journal.
    pub pos: JournalPos,
    /// The session stream the record belongs to.
    pub session_id: SessionId,
    /// Position in that stream.
    pub seq: Seq,
    /// Commit time, microseconds since the Unix epoch.
    pub ts_us: i64,
    /// Hash of the session's previous record (zeros for seq 0).
    pub prev_hash: Hash,
    /// The event.
    pub event: Event,
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<RECORD_BYTES_MAX>()
}

/// Why bytes are not a record this build can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than a header.
    #[error("record is truncated ({0} bytes)")]
    Truncated(usize),
    /// Written by another format version.
    #[error("unknown format version {0} (this build reads {FORMAT_VERSION})")]
    Version(u8),
    /// The checksum does not match the body.
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum {
        /// The checksum in the header.
        stored: u32,
        /// The checksum of the bytes as found.
        computed: u32,
    },
    /// The checksum matched but the body does not decode.
    #[error("body does not decode: {0}")]
    Body(String),
}

/// Encodes a record. Fails only when the record exceeds [`RECORD_BYTES_MAX`].
pub fn encode(body: &RecordBody) -> Result<Vec<u8>, String> {
    let mut bytes = vec![FORMAT_VERSION, 0, 0, 0, 0];
    bincode::serde::encode_into_std_write(body, &mut bytes, config()).map_err(|e| e.to_string())?;
    let crc = crc32fast::hash(&bytes[HEADER_BYTES..]);
    bytes[1..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    Ok(bytes)
}

/// Decodes and checks a record.
pub fn decode(bytes: &[u8]) -> Result<RecordBody, DecodeError> {
    if bytes.len() < HEADER_BYTES {
        return Err(DecodeError::Truncated(bytes.len()));
    }
    if bytes[0] != FORMAT_VERSION {
        return Err(DecodeError::Version(bytes[0]));
    }
    let stored = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let computed = crc32fast::hash(&bytes[HEADER_BYTES..]);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    let (body, used) = bincode::serde::decode_from_slice(&bytes[HEADER_BYTES..], config())
        .map_err(|e| DecodeError::Body(e.to_string()))?;
    if used != bytes.len() - HEADER_BYTES {
        return Err(DecodeError::Body(format!(
            "{} trailing bytes",
            bytes.len() - HEADER_BYTES - used
        )));
    }
    Ok(body)
}

/// The hash a session's next record links to.
pub fn hash(bytes: &[u8]) -> Hash {
    *blake3::hash(bytes).as_bytes()
}
