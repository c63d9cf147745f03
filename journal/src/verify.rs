//! Whole-journal verification: checksums, format versions, contiguity, hash links.
//!
//! It reads the store in global order and stops at the first bad record, naming its
//! position and the reason. It checks the indexes against the log too, so a record
//! removed, moved or spliced in from another session is found. It repairs nothing.

use std::collections::HashMap;

use crate::Error;
use crate::codec::{self, Hash};
use crate::ids::{JournalPos, Seq, SessionId};
use crate::store::{self, Journal, LOG, STREAM};

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
    /// Global position (the key's position for a record that does not decode).
    pub pos: JournalPos,
    /// What is wrong.
    pub reason: String,
}

impl Journal {
    /// Checks every record; `progress` is called with the number of records checked so
    /// far, every few thousand records. The outer error is an I/O fault.
    pub fn verify(
        &self,
        mut progress: impl FnMut(u64),
    ) -> Result<Result<VerifyReport, Corruption>, Error> {
        let mut heads: HashMap<SessionId, (Seq, Hash)> = HashMap::new();
        let mut report = VerifyReport::default();
        let mut expected_pos = JournalPos(0);
        let bad = |pos: JournalPos, reason: String| Ok(Err(Corruption { pos, reason }));
        for entry in self.tree().scan_prefix([LOG]) {
            let (key, bytes) = entry?;
            let key_pos = JournalPos(store::be_u64(&key).unwrap_or(u64::MAX));
            if key_pos != expected_pos {
                return bad(
                    expected_pos,
                    format!("record missing: next record found is at position {key_pos}"),
                );
            }
            let body = match codec::decode(&bytes) {
                Ok(body) => body,
                Err(error) => return bad(key_pos, error.to_string()),
            };
            if body.pos != key_pos {
                return bad(
                    key_pos,
                    format!(
                        "record says position {} but is stored at {key_pos} (moved)",
                        body.pos
                    ),
                );
            }
            let (next_seq, last_hash) = heads
                .get(&body.session_id)
                .copied()
                .unwrap_or((Seq(0), [0; 32]));
            if body.seq != next_seq {
                return bad(
                    key_pos,
                    format!(
                        "session {} sequence {} where {next_seq} was expected",
                        body.session_id, body.seq
                    ),
                );
            }
            if body.prev_hash != last_hash {
                return bad(
                    key_pos,
                    format!(
                        "session {} sequence {}: hash link does not match the previous record",
                        body.session_id, body.seq
                    ),
                );
            }
            match self
                .tree()
                .get(store::stream_key(&body.session_id, body.seq))?
            {
                Some(indexed) if store::be_u64(&indexed) == Some(key_pos.0) => {}
                _ => {
                    return bad(
                        key_pos,
                        format!(
                            "session {} sequence {} is not indexed at this position",
                            body.session_id, body.seq
                        ),
                    );
                }
            }
            heads.insert(body.session_id, (body.seq.next(), codec::hash(&bytes)));
            report.events += 1;
            report.bytes += bytes.len() as u64;
            expected_pos = expected_pos.next();
            if report.events % 4096 == 0 {
                progress(report.events);
            }
        }
        // Every indexed record must exist: a record removed from the end of a stream
        // leaves its index entry behind.
        let mut indexed = 0u64;
        for entry in self.tree().scan_prefix([STREAM]) {
            let (_, value) = entry?;
            indexed += 1;
            let pos = JournalPos(store::be_u64(&value).unwrap_or(u64::MAX));
            if pos >= expected_pos {
                return bad(
                    pos,
                    "record missing: indexed by its session but not in the log".into(),
                );
            }
        }
        if indexed != report.events {
            return bad(
                expected_pos,
                format!("{indexed} index entries for {} records", report.events),
            );
        }
        progress(report.events);
        report.streams = heads.len() as u64;
        Ok(Ok(report))
    }
}
