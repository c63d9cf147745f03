//! The on-disk formats, behind one module so a later codec is a new version: event
//! records (here); segments, which hold one group commit's records with the manifest
//! that gives them their global order, and the session index's chunks (`segment.rs`).
//!
//! A record is `[version: u8][crc32 of the body: u32 LE][body]`, where the body is the
//! bincode 2 encoding (standard config: little endian, varints) of [`RecordBody`].
//! The record's hash (BLAKE3 of all its bytes) is what the session's next record links
//! to, so a flipped byte fails the checksum and a dropped, reordered or foreign record
//! breaks a sequence or a link. This module does not read or write the store.

use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::format3;
use crate::ids::{Seq, SessionId};
use crate::limits::{EVENT_BYTES_CEILING, INLINE_EVENT_BYTES_MAX, RECORD_BYTES_MAX};

mod segment;
pub use segment::{
    ManifestEntry, RUN_BYTES, Run, SEGMENT_VERSION, Segment, decode_runs, encode_runs,
    encode_segment,
};

/// The record format this build writes. Version 2: typed run events (issue 12).
/// Version 3: the global position is not in the body, so a record and its session's
/// chain hash the same on every backend and move between them unchanged (issue 16); the
/// store gives a record its position. Version 4: run options and metrics typed, and a
/// run's answer and metrics recorded once, on its `Completed` run event (issue 28;
/// `docs/decisions/0002-typed-run-metrics.md`). bincode 2 is unmaintained
/// (RUSTSEC-2025-0141); moving off it means another version.
pub const FORMAT_VERSION: u8 = 4;

/// The oldest record format this build reads: format-3 records keep their bytes (and so
/// their hashes) and are read through [`crate::format3`].
pub const OLDEST_FORMAT_READ: u8 = 3;

/// Bytes before the body: version and checksum.
pub const HEADER_BYTES: usize = 5;

/// A 32-byte BLAKE3 digest linking a record to its session's previous one.
pub type Hash = [u8; 32];

/// Everything a record says, before encoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordBody {
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

/// Decodes what `#[derive(Deserialize)]` would, byte for byte (the body is written with
/// serde), but reads `prev_hash` as one 32-byte copy: serde reads an array one element
/// at a time, and that was a tenth of the work of reading a run's events back.
impl<Context> bincode::Decode<Context> for RecordBody {
    fn decode<D: bincode::de::Decoder<Context = Context>>(
        decoder: &mut D,
    ) -> Result<Self, bincode::error::DecodeError> {
        use bincode::serde::Compat;
        let Compat(session_id) = Compat::<SessionId>::decode(decoder)?;
        let Compat(seq) = Compat::<Seq>::decode(decoder)?;
        let ts_us = i64::decode(decoder)?;
        let prev_hash = Hash::decode(decoder)?;
        let Compat(event) = Compat::<Event>::decode(decoder)?;
        Ok(RecordBody {
            session_id,
            seq,
            ts_us,
            prev_hash,
            event,
        })
    }
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<RECORD_BYTES_MAX>()
}

/// The same encoding for an event stored apart, whose bound is the configured
/// `max_event_bytes` (checked by the caller) under a hard ceiling.
pub(crate) fn event_config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<EVENT_BYTES_CEILING>()
}

/// Why bytes are not a record this build can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than a header.
    #[error("record is truncated ({0} bytes)")]
    Truncated(usize),
    /// Written by another format version.
    #[error(
        "unknown format version {0} (this build reads {OLDEST_FORMAT_READ} to {FORMAT_VERSION})"
    )]
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

/// The fields before the event, in `RecordBody` order: encoding them and appending
/// the event's own bytes gives exactly the bytes of the whole body.
#[derive(Serialize)]
struct HeaderRef<'a> {
    session_id: &'a SessionId,
    seq: Seq,
    ts_us: i64,
    prev_hash: &'a Hash,
}

/// An event encoded ahead of its record header, so that appenders do the costly part
/// of encoding in parallel and the single committer only adds the header.
#[derive(Debug, Clone)]
pub struct EncodedEvent {
    /// The event.
    pub event: Event,
    /// What goes into the record: the event's bincode encoding, or for an event stored
    /// apart the encoding of its [`Event::StoredApart`] reference.
    pub bytes: Vec<u8>,
    /// For an event stored apart: its digest and its whole encoding.
    pub apart: Option<(Hash, Vec<u8>)>,
}

/// Encodes an event for [`encode_parts`]; one over [`INLINE_EVENT_BYTES_MAX`] is
/// stored apart, and one over `max_event_bytes` is refused with a message that says so.
pub fn encode_event(event: Event, max_event_bytes: usize) -> Result<EncodedEvent, EncodeError> {
    let bytes = bincode::serde::encode_to_vec(&event, event_config())
        .map_err(|e| EncodeError::Codec(e.to_string()))?;
    if bytes.len() > max_event_bytes {
        return Err(EncodeError::TooLarge {
            kind: event.kind(),
            bytes: bytes.len(),
            limit: max_event_bytes,
        });
    }
    let (bytes, apart) =
        inline_or_apart(bytes, |digest, bytes| Event::StoredApart { digest, bytes })
            .map_err(EncodeError::Codec)?;
    Ok(EncodedEvent {
        event,
        bytes,
        apart,
    })
}

/// What goes into a record for an event encoded as `bytes`: the bytes themselves, or
/// for one over [`INLINE_EVENT_BYTES_MAX`] the encoding of its `reference` (the format's
/// `StoredApart`, from the digest and length) with the digest and bytes to store apart.
pub(crate) fn inline_or_apart<T: Serialize>(
    bytes: Vec<u8>,
    reference: impl FnOnce(Hash, u64) -> T,
) -> Result<(Vec<u8>, Option<(Hash, Vec<u8>)>), String> {
    if bytes.len() <= INLINE_EVENT_BYTES_MAX {
        return Ok((bytes, None));
    }
    let digest = hash(&bytes);
    let reference = bincode::serde::encode_to_vec(reference(digest, bytes.len() as u64), config())
        .map_err(|e| e.to_string())?;
    Ok((reference, Some((digest, bytes))))
}

/// Why an event could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// Its encoding is larger than the journal takes.
    #[error("an event of {bytes} bytes ({kind}) exceeds max_event_bytes ({limit})")]
    TooLarge {
        /// The event's variant.
        kind: &'static str,
        /// Its encoded size.
        bytes: usize,
        /// `max_event_bytes`.
        limit: usize,
    },
    /// The encoder refused it.
    #[error("{0}")]
    Codec(String),
}

impl From<EncodeError> for String {
    fn from(error: EncodeError) -> String {
        error.to_string()
    }
}

/// Decodes the encoding of an event stored apart, checking it against its digest.
pub fn decode_apart(digest: &Hash, bytes: &[u8]) -> Result<Event, String> {
    decode_apart_as(digest, bytes)
}

/// Whether an event stored apart decodes, as the event of its record's format (format 3
/// when the record decoded with its format-3 event).
pub(crate) fn check_apart(
    digest: &Hash,
    bytes: &[u8],
    format3: &Option<format3::Event>,
) -> Result<(), String> {
    match format3 {
        Some(_) => decode_apart_as::<format3::Event>(digest, bytes).map(drop),
        None => decode_apart(digest, bytes).map(drop),
    }
}

/// [`decode_apart`] as the event type of a record's format (`format3::Event` for one of
/// format 3).
pub(crate) fn decode_apart_as<T: serde::de::DeserializeOwned>(
    digest: &Hash,
    bytes: &[u8],
) -> Result<T, String> {
    if &hash(bytes) != digest {
        return Err("the event stored apart does not match its digest".into());
    }
    let (event, used) = bincode::serde::decode_from_slice(bytes, event_config())
        .map_err(|e| format!("the event stored apart does not decode: {e}"))?;
    if used != bytes.len() {
        return Err(format!(
            "the event stored apart has {} trailing bytes",
            bytes.len() - used
        ));
    }
    Ok(event)
}

/// Encodes a record from its header fields and an encoded event.
pub fn encode_parts(
    session_id: &SessionId,
    seq: Seq,
    ts_us: i64,
    prev_hash: &Hash,
    event_bytes: &[u8],
) -> Result<Vec<u8>, String> {
    encode_parts_as(
        FORMAT_VERSION,
        session_id,
        seq,
        ts_us,
        prev_hash,
        event_bytes,
    )
}

/// [`encode_parts`] in a given format (an import of an old export writes its records
/// in their own format, so that they keep their hashes).
pub(crate) fn encode_parts_as(
    version: u8,
    session_id: &SessionId,
    seq: Seq,
    ts_us: i64,
    prev_hash: &Hash,
    event_bytes: &[u8],
) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + 80 + event_bytes.len());
    bytes.extend_from_slice(&[version, 0, 0, 0, 0]);
    let header = HeaderRef {
        session_id,
        seq,
        ts_us,
        prev_hash,
    };
    bincode::serde::encode_into_std_write(&header, &mut bytes, config())
        .map_err(|e| e.to_string())?;
    bytes.extend_from_slice(event_bytes);
    if bytes.len() > RECORD_BYTES_MAX {
        return Err(format!(
            "record of {} bytes exceeds the limit of {RECORD_BYTES_MAX}",
            bytes.len()
        ));
    }
    seal(&mut bytes);
    Ok(bytes)
}

/// Encodes a record. Fails only when the record exceeds [`RECORD_BYTES_MAX`].
pub fn encode(body: &RecordBody) -> Result<Vec<u8>, String> {
    let event = bincode::serde::encode_to_vec(&body.event, config()).map_err(|e| e.to_string())?;
    encode_parts(
        &body.session_id,
        body.seq,
        body.ts_us,
        &body.prev_hash,
        &event,
    )
}

/// Checks the version byte and the checksum; returns the body's bytes.
fn checked_body(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    if bytes.len() < HEADER_BYTES {
        return Err(DecodeError::Truncated(bytes.len()));
    }
    if !(OLDEST_FORMAT_READ..=FORMAT_VERSION).contains(&bytes[0]) {
        return Err(DecodeError::Version(bytes[0]));
    }
    let stored = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let computed = crc32fast::hash(&bytes[HEADER_BYTES..]);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    Ok(&bytes[HEADER_BYTES..])
}

/// Stamps the checksum of the body into a header laid out by `encode*`.
fn seal(bytes: &mut [u8]) {
    let crc = crc32fast::hash(&bytes[HEADER_BYTES..]);
    bytes[1..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes and checks a record (of any format this build reads, as the current event).
pub fn decode(bytes: &[u8]) -> Result<RecordBody, DecodeError> {
    decode_any(bytes).map(|decoded| decoded.body)
}

/// A decoded record, and for a format-3 record its event as that format wrote it (an
/// export shows it so, and an import of that export writes the same bytes again).
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The record, its event the current one.
    pub body: RecordBody,
    /// The format-3 event, for a format-3 record.
    pub format3: Option<format3::Event>,
}

/// Decodes and checks a record of any format this build reads.
pub(crate) fn decode_any(bytes: &[u8]) -> Result<Decoded, DecodeError> {
    let body_bytes = checked_body(bytes)?;
    let trailing = |used: usize| {
        (used != body_bytes.len())
            .then(|| DecodeError::Body(format!("{} trailing bytes", body_bytes.len() - used)))
    };
    if bytes[0] == FORMAT_VERSION {
        let (body, used) = bincode::decode_from_slice::<RecordBody, _>(body_bytes, config())
            .map_err(|e| DecodeError::Body(e.to_string()))?;
        if let Some(error) = trailing(used) {
            return Err(error);
        }
        return Ok(Decoded {
            body,
            format3: None,
        });
    }
    let (old, used) =
        bincode::serde::decode_from_slice::<format3::RecordBody, _>(body_bytes, config())
            .map_err(|e| DecodeError::Body(e.to_string()))?;
    if let Some(error) = trailing(used) {
        return Err(error);
    }
    Ok(Decoded {
        body: RecordBody {
            session_id: old.session_id,
            seq: old.seq,
            ts_us: old.ts_us,
            prev_hash: old.prev_hash,
            event: format3::upgrade(old.event.clone()),
        },
        format3: Some(old.event),
    })
}

/// The hash a session's next record links to.
pub fn hash(bytes: &[u8]) -> Hash {
    *blake3::hash(bytes).as_bytes()
}

/// The journal's compact binary form of any serde value, for state kept in memory in
/// many copies (the sessions directory): smaller than JSON and one allocation. Not a
/// record format: nothing encoded with it is written to the journal.
pub fn encode_compact<T: serde::Serialize + ?Sized>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).unwrap_or_default()
}

/// Decodes [`encode_compact`]'s bytes; `None` when they are not a `T`.
pub fn decode_compact<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .ok()
        .map(|(value, _)| value)
}
