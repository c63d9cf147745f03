//! The on-disk formats, behind one module so a later codec is a new version: event
//! records; segments, which hold one group commit's records with the manifest that
//! gives them their global order; and the session index's chunks.
//!
//! A record is `[version: u8][crc32 of the body: u32 LE][body]`, where the body is the
//! bincode 2 encoding (standard config: little endian, varints) of [`RecordBody`].
//! The record's hash (BLAKE3 of all its bytes) is what the session's next record links
//! to, so a flipped byte fails the checksum and a dropped, reordered or foreign record
//! breaks a sequence or a link. This module does not read or write the store.

use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::ids::{JournalPos, Seq, SessionId};
use crate::limits::{EVENT_BYTES_CEILING, INLINE_EVENT_BYTES_MAX, RECORD_BYTES_MAX};

/// The record format this build writes and the only one it reads. Version 2: typed run
/// events (issue 12). Version 3: the global position is not in the body, so a record
/// and its session's chain hash the same on every backend and move between them
/// unchanged (issue 16); the store gives a record its position. bincode 2 is
/// unmaintained (RUSTSEC-2025-0141); moving off it means version 4.
pub const FORMAT_VERSION: u8 = 3;

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
fn event_config() -> impl bincode::config::Config {
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
    if bytes.len() <= INLINE_EVENT_BYTES_MAX {
        return Ok(EncodedEvent {
            event,
            bytes,
            apart: None,
        });
    }
    let digest = hash(&bytes);
    let reference = Event::StoredApart {
        digest,
        bytes: bytes.len() as u64,
    };
    let record_bytes = bincode::serde::encode_to_vec(&reference, config())
        .map_err(|e| EncodeError::Codec(e.to_string()))?;
    Ok(EncodedEvent {
        event,
        bytes: record_bytes,
        apart: Some((digest, bytes)),
    })
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
    let mut bytes = Vec::with_capacity(HEADER_BYTES + 80 + event_bytes.len());
    bytes.extend_from_slice(&[FORMAT_VERSION, 0, 0, 0, 0]);
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
    if bytes[0] != FORMAT_VERSION {
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

/// Decodes and checks a record.
pub fn decode(bytes: &[u8]) -> Result<RecordBody, DecodeError> {
    let body_bytes = checked_body(bytes)?;
    let (body, used) = bincode::decode_from_slice::<RecordBody, _>(body_bytes, config())
        .map_err(|e| DecodeError::Body(e.to_string()))?;
    if used != body_bytes.len() {
        return Err(DecodeError::Body(format!(
            "{} trailing bytes",
            body_bytes.len() - used
        )));
    }
    Ok(body)
}

/// The hash a session's next record links to.
pub fn hash(bytes: &[u8]) -> Hash {
    *blake3::hash(bytes).as_bytes()
}

/// One append request's records inside a group commit: `count` records of one session
/// from `first_seq`, at consecutive global positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    /// The session.
    pub session_id: SessionId,
    /// Sequence of its first record.
    pub first_seq: Seq,
    /// How many records.
    pub count: u32,
}

/// The segment format this build writes and the only one it reads. A segment holds one
/// group commit's records; layout 1 (records under per-session keys, a manifest per
/// batch) is not read.
pub const SEGMENT_VERSION: u8 = 2;

/// Bytes before a segment's header: version, checksum of the header, header length.
const SEGMENT_PREFIX_BYTES: usize = 9;

fn push_entry(bytes: &mut Vec<u8>, entry: &ManifestEntry) {
    let id = entry.session_id.as_str().as_bytes();
    // Ids are at most ID_BYTES_MAX (128) bytes, checked when they are parsed.
    bytes.push(id.len() as u8);
    bytes.extend_from_slice(id);
    bytes.extend_from_slice(&entry.first_seq.0.to_be_bytes());
    bytes.extend_from_slice(&entry.count.to_be_bytes());
}

/// Encodes a segment: one group commit's records and the manifest that places them.
///
/// `[SEGMENT_VERSION][crc32 LE of the header][header length u32 BE][header][records]`,
/// where the header is `[record count u32 BE]`, one `[record length u32 BE]` per record,
/// then per manifest entry `[id length u8][id bytes][first_seq u64 BE][count u32 BE]`,
/// and the records follow back to back. Each record keeps its own version byte and
/// checksum, so reading one record checks only the header and that record.
pub fn encode_segment(entries: &[ManifestEntry], records: &[Vec<u8>]) -> Vec<u8> {
    let mut header = Vec::with_capacity(4 + 4 * records.len() + 24 * entries.len());
    header.extend_from_slice(&(records.len() as u32).to_be_bytes());
    for record in records {
        // A record is at most RECORD_BYTES_MAX (4 MiB), checked when it is encoded.
        header.extend_from_slice(&(record.len() as u32).to_be_bytes());
    }
    for entry in entries {
        push_entry(&mut header, entry);
    }
    let body: usize = records.iter().map(Vec::len).sum();
    let mut bytes = Vec::with_capacity(SEGMENT_PREFIX_BYTES + header.len() + body);
    bytes.push(SEGMENT_VERSION);
    bytes.extend_from_slice(&crc32fast::hash(&header).to_le_bytes());
    bytes.extend_from_slice(&(header.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&header);
    for record in records {
        bytes.extend_from_slice(record);
    }
    bytes
}

/// A parsed segment over its bytes: where each record is, and its manifest.
#[derive(Debug, Clone)]
pub struct Segment<B> {
    bytes: B,
    /// Start and end of each record in `bytes`.
    spans: Vec<(usize, usize)>,
    /// Where the manifest entries are in `bytes`.
    entries: (usize, usize),
}

fn segment_error(reason: &str) -> DecodeError {
    DecodeError::Body(format!("segment {reason}"))
}

fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

impl<B: AsRef<[u8]>> Segment<B> {
    /// Checks the version, the header's checksum and the framing (records do not
    /// overrun, the manifest counts as many records as there are).
    pub fn parse(bytes: B) -> Result<Segment<B>, DecodeError> {
        let raw = bytes.as_ref();
        if raw.len() < SEGMENT_PREFIX_BYTES {
            return Err(DecodeError::Truncated(raw.len()));
        }
        if raw[0] != SEGMENT_VERSION {
            return Err(DecodeError::Version(raw[0]));
        }
        let stored = u32::from_le_bytes([raw[1], raw[2], raw[3], raw[4]]);
        let header_len = be_u32(raw, 5).expect("prefix checked") as usize;
        let header_end = SEGMENT_PREFIX_BYTES
            .checked_add(header_len)
            .filter(|end| *end <= raw.len())
            .ok_or_else(|| segment_error("header overruns the segment"))?;
        let header = &raw[SEGMENT_PREFIX_BYTES..header_end];
        let computed = crc32fast::hash(header);
        if stored != computed {
            return Err(DecodeError::Checksum { stored, computed });
        }
        let count = be_u32(header, 0).ok_or_else(|| segment_error("header is truncated"))? as usize;
        let lengths_end = count
            .checked_mul(4)
            .and_then(|n| n.checked_add(4))
            .filter(|end| *end <= header.len())
            .ok_or_else(|| segment_error("record lengths are truncated"))?;
        let mut spans = Vec::with_capacity(count);
        let mut at = header_end;
        for index in 0..count {
            let length = be_u32(header, 4 + 4 * index).expect("lengths checked") as usize;
            let end = at
                .checked_add(length)
                .filter(|end| *end <= raw.len())
                .ok_or_else(|| segment_error("record overruns the segment"))?;
            spans.push((at, end));
            at = end;
        }
        if at != raw.len() {
            return Err(segment_error(&format!(
                "has {} trailing bytes",
                raw.len() - at
            )));
        }
        let entries = (SEGMENT_PREFIX_BYTES + lengths_end, header_end);
        let mut named = 0u64;
        walk_entries(&raw[entries.0..entries.1], |_, _, count| {
            named += u64::from(count);
            Ok(())
        })?;
        if named != count as u64 {
            return Err(segment_error(&format!(
                "manifest names {named} records but the segment holds {count}"
            )));
        }
        Ok(Segment {
            bytes,
            spans,
            entries,
        })
    }

    /// Records in the segment.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The bytes of the segment's `index`th record.
    pub fn record(&self, index: usize) -> Option<&[u8]> {
        let (start, end) = *self.spans.get(index)?;
        Some(&self.bytes.as_ref()[start..end])
    }

    /// The manifest: which sessions' records, in order.
    pub fn entries(&self) -> Result<Vec<ManifestEntry>, DecodeError> {
        let mut entries = Vec::new();
        walk_entries(
            &self.bytes.as_ref()[self.entries.0..self.entries.1],
            |id, first_seq, count| {
                let session_id =
                    SessionId::parse(id).map_err(|e| DecodeError::Body(e.to_string()))?;
                entries.push(ManifestEntry {
                    session_id,
                    first_seq: Seq(first_seq),
                    count,
                });
                Ok(())
            },
        )?;
        Ok(entries)
    }
}

fn walk_entries(
    mut rest: &[u8],
    mut each: impl FnMut(&str, u64, u32) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    while let Some((&length, tail)) = rest.split_first() {
        let length = usize::from(length);
        if tail.len() < length + 12 {
            return Err(DecodeError::Body("manifest entry is truncated".into()));
        }
        let id =
            std::str::from_utf8(&tail[..length]).map_err(|e| DecodeError::Body(e.to_string()))?;
        let first_seq = u64::from_be_bytes(tail[length..length + 8].try_into().expect("8 bytes"));
        let count = u32::from_be_bytes(tail[length + 8..length + 12].try_into().expect("4 bytes"));
        each(id, first_seq, count)?;
        rest = &tail[length + 12..];
    }
    Ok(())
}

/// Where a run of one session's records is: `count` records from `first_seq`, at
/// consecutive global positions from `pos` (one manifest entry of one segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Run {
    /// Sequence of the first record.
    pub first_seq: Seq,
    /// How many records.
    pub count: u32,
    /// Global position of the first record.
    pub pos: JournalPos,
}

/// Bytes of one encoded [`Run`].
pub const RUN_BYTES: usize = 20;

/// Encodes a session index chunk: per run `[first_seq u64 BE][count u32 BE][pos u64 BE]`.
/// The index is derived from the segments (`verify` checks it against them).
pub fn encode_runs(runs: &[Run]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(RUN_BYTES * runs.len());
    for run in runs {
        bytes.extend_from_slice(&run.first_seq.0.to_be_bytes());
        bytes.extend_from_slice(&run.count.to_be_bytes());
        bytes.extend_from_slice(&run.pos.0.to_be_bytes());
    }
    bytes
}

/// Decodes a session index chunk.
pub fn decode_runs(bytes: &[u8]) -> Result<Vec<Run>, DecodeError> {
    if !bytes.len().is_multiple_of(RUN_BYTES) {
        return Err(DecodeError::Body(format!(
            "session index chunk of {} bytes is not whole runs",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(RUN_BYTES)
        .map(|run| Run {
            first_seq: Seq(u64::from_be_bytes(run[..8].try_into().expect("8 bytes"))),
            count: u32::from_be_bytes(run[8..12].try_into().expect("4 bytes")),
            pos: JournalPos(u64::from_be_bytes(run[12..].try_into().expect("8 bytes"))),
        })
        .collect())
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
