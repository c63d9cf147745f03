//! Segments (one group commit's records with the manifest that gives them their global
//! order) and the session index's chunks, as the sled backend stores them.

use super::DecodeError;
use crate::ids::{JournalPos, Seq, SessionId};

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
