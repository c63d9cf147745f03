//! Whole-journal verification: checksums, format versions, contiguity, hash links.
//!
//! It walks the batch manifests in global order, reads every record they name, and
//! stops at the first bad one, naming its global position and the reason: a record
//! flipped, removed, moved, or spliced in from another session; a broken hash link; a
//! record no manifest names. It repairs nothing.

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
    /// Global position of the record (or of the batch, for a bad manifest).
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
        let tree = self.tree();
        let mut heads: HashMap<SessionId, (Seq, Hash)> = HashMap::new();
        let mut report = VerifyReport::default();
        let mut pos = JournalPos(0);
        let bad = |pos: JournalPos, reason: String| Ok(Err(Corruption { pos, reason }));
        for entry in tree.scan_prefix([LOG]) {
            let (key, manifest) = entry?;
            let batch_pos = JournalPos(store::be_u64(&key).unwrap_or(u64::MAX));
            if batch_pos != pos {
                return bad(
                    pos,
                    format!("records missing: the next batch begins at position {batch_pos}"),
                );
            }
            let entries = match codec::decode_manifest(&manifest) {
                Ok(entries) => entries,
                Err(error) => return bad(pos, format!("batch manifest: {error}")),
            };
            for entry in entries {
                for offset in 0..u64::from(entry.count) {
                    let seq = Seq(entry.first_seq.0 + offset);
                    let name = &entry.session_id;
                    let Some(bytes) = tree.get(store::record_key(name, seq))? else {
                        return bad(
                            pos,
                            format!("record missing: session {name} sequence {seq}"),
                        );
                    };
                    let body = match codec::decode(&bytes) {
                        Ok(body) => body,
                        Err(error) => return bad(pos, error.to_string()),
                    };
                    if body.pos != pos {
                        return bad(
                            pos,
                            format!(
                                "record stored for this position says position {} (moved)",
                                body.pos
                            ),
                        );
                    }
                    if &body.session_id != name || body.seq != seq {
                        return bad(
                            pos,
                            format!(
                                "record stored as session {name} sequence {seq} says session {} sequence {} (spliced)",
                                body.session_id, body.seq
                            ),
                        );
                    }
                    let (next_seq, last_hash) =
                        heads.get(name).copied().unwrap_or((Seq(0), [0; 32]));
                    if seq != next_seq {
                        return bad(
                            pos,
                            format!("session {name} sequence {seq} where {next_seq} was expected"),
                        );
                    }
                    if body.prev_hash != last_hash {
                        return bad(
                            pos,
                            format!(
                                "session {name} sequence {seq}: hash link does not match the previous record"
                            ),
                        );
                    }
                    heads.insert(name.clone(), (seq.next(), codec::hash(&bytes)));
                    report.events += 1;
                    report.bytes += bytes.len() as u64;
                    pos = pos.next();
                    if report.events % 4096 == 0 {
                        progress(report.events);
                    }
                }
            }
        }
        // Every stored record must be named by a manifest: count them, and find the
        // first stray one if the counts differ.
        let stored = tree.scan_prefix([STREAM]).keys().count() as u64;
        if stored != report.events {
            for entry in tree.scan_prefix([STREAM]) {
                let (key, bytes) = entry?;
                let body = codec::decode(&bytes).ok();
                let seq = Seq(store::be_u64(&key).unwrap_or(u64::MAX));
                let covered = body.as_ref().is_some_and(|body| {
                    heads
                        .get(&body.session_id)
                        .is_some_and(|(next, _)| seq < *next)
                });
                if !covered {
                    let at = body.map(|body| body.pos).unwrap_or(pos);
                    return bad(
                        at,
                        format!("record sequence {seq} is stored but no batch manifest names it"),
                    );
                }
            }
            return bad(
                pos,
                format!(
                    "{stored} records stored but the manifests name {}",
                    report.events
                ),
            );
        }
        progress(report.events);
        report.streams = heads.len() as u64;
        Ok(Ok(report))
    }
}
