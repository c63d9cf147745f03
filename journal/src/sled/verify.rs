//! Whole-journal verification: checksums, format versions, contiguity, hash links,
//! and the session index against the segments.
//!
//! It walks the segments in global order, checks every record they hold, and stops at
//! the first bad one, naming its global position and the reason: a record flipped,
//! removed, moved, or spliced in from another session; a broken hash link; a segment
//! whose header or manifest is damaged; a session index that names records the
//! segments do not hold where it says. It repairs nothing.

use super::SledJournal;
use super::keys::{self, INDEX, LOG};
use crate::Error;
use crate::codec::{self, Hash, Run};
use crate::ids::{JournalPos, Seq, SessionId};
use crate::verify::{Corruption, VerifyReport};
use std::collections::HashMap;

impl SledJournal {
    /// Checks every record; `progress` is called with the number of records checked so
    /// far, every few thousand records. The outer error is an I/O fault. Appends made
    /// while it runs are checked as far as the walk reaches them; the session index is
    /// compared below the watermark it read first.
    pub fn verify(
        &self,
        mut progress: impl FnMut(u64),
    ) -> Result<Result<VerifyReport, Corruption>, Error> {
        let tree = self.tree();
        let watermark = keys::watermark(tree)?;
        let mut heads: HashMap<SessionId, Head> = HashMap::new();
        let mut report = VerifyReport::default();
        let mut pos = JournalPos(0);
        let bad = |pos: JournalPos, reason: String| Ok(Err(Corruption { pos, reason }));
        for entry in tree.scan_prefix([LOG]) {
            let (key, bytes) = entry?;
            let segment_pos = JournalPos(keys::be_u64(&key).unwrap_or(u64::MAX));
            if segment_pos != pos {
                return bad(
                    pos,
                    format!("records missing: the next segment begins at position {segment_pos}"),
                );
            }
            let segment = match codec::Segment::parse(bytes) {
                Ok(segment) => segment,
                Err(error) => return bad(pos, format!("segment header or manifest: {error}")),
            };
            let entries = match segment.entries() {
                Ok(entries) => entries,
                Err(error) => return bad(pos, format!("segment manifest: {error}")),
            };
            let mut index = 0;
            for entry in entries {
                let name = &entry.session_id;
                let head = heads.entry(name.clone()).or_default();
                if pos < watermark {
                    head.indexed.add(&Run {
                        first_seq: entry.first_seq,
                        count: entry.count,
                        pos,
                    });
                }
                for offset in 0..u64::from(entry.count) {
                    let seq = Seq(entry.first_seq.0 + offset);
                    let bytes = segment
                        .record(index)
                        .expect("the manifest counts the records");
                    index += 1;
                    let codec::Decoded { body, format3 } = match codec::decode_any(bytes) {
                        Ok(decoded) => decoded,
                        Err(error) => return bad(pos, error.to_string()),
                    };
                    if let crate::Event::StoredApart { digest, .. } = &body.event {
                        let stored = match tree.get(keys::apart_key(digest))? {
                            Some(stored) => stored,
                            None => return bad(pos, "the event stored apart is missing".into()),
                        };
                        if let Err(reason) = codec::check_apart(digest, &stored, &format3) {
                            return bad(pos, reason);
                        }
                        report.bytes += stored.len() as u64;
                    }
                    if &body.session_id != name || body.seq != seq {
                        // A record of the same session elsewhere in its stream was moved
                        // (or one before it removed); one of another session was spliced in.
                        let how = if &body.session_id == name {
                            "moved"
                        } else {
                            "spliced"
                        };
                        return bad(
                            pos,
                            format!(
                                "record stored as session {name} sequence {seq} says session {} sequence {} ({how})",
                                body.session_id, body.seq
                            ),
                        );
                    }
                    if seq != head.next_seq {
                        return bad(
                            pos,
                            format!(
                                "session {name} sequence {seq} where {} was expected",
                                head.next_seq
                            ),
                        );
                    }
                    if body.prev_hash != head.last_hash {
                        return bad(
                            pos,
                            format!(
                                "session {name} sequence {seq}: hash link does not match the previous record"
                            ),
                        );
                    }
                    head.next_seq = seq.next();
                    head.last_hash = codec::hash(bytes);
                    report.events += 1;
                    report.bytes += bytes.len() as u64;
                    pos = pos.next();
                    if report.events % 4096 == 0 {
                        progress(report.events);
                    }
                }
            }
        }
        if watermark > pos {
            return bad(
                pos,
                format!(
                    "records missing: the session index names records up to position {watermark}, the journal ends here"
                ),
            );
        }
        // The session index must name exactly the runs the segments hold below the
        // watermark: compare a digest of each session's runs from both sides.
        let mut stored: HashMap<SessionId, RunDigest> = HashMap::new();
        for entry in tree.scan_prefix([INDEX]) {
            let (key, bytes) = entry?;
            let Some(session_id) = key
                .get(1..key.len().saturating_sub(9))
                .and_then(|id| std::str::from_utf8(id).ok())
                .and_then(|id| SessionId::parse(id).ok())
            else {
                return bad(pos, "a session index key is malformed".into());
            };
            let runs = match codec::decode_runs(&bytes) {
                Ok(runs) => runs,
                Err(error) => return bad(pos, format!("session index of {session_id}: {error}")),
            };
            // Runs past the watermark read at the start were indexed meanwhile (by a
            // committer appending during the walk): they are not compared.
            for run in runs.iter().filter(|run| run.pos < watermark) {
                stored.entry(session_id.clone()).or_default().add(run);
            }
        }
        for (session_id, head) in &heads {
            let found = stored.remove(session_id).unwrap_or_default();
            if found != head.indexed {
                let at = self.first_misindexed(session_id, watermark)?;
                return bad(
                    at,
                    format!("the session index of {session_id} does not match its records"),
                );
            }
        }
        if let Some(session_id) = stored.keys().next() {
            return bad(
                JournalPos(0),
                format!("the session index names session {session_id}, which has no records"),
            );
        }
        progress(report.events);
        report.streams = heads.len() as u64;
        Ok(Ok(report))
    }

    /// The first position where a session's stored index and its records disagree
    /// (only looked for once a digest differs).
    fn first_misindexed(
        &self,
        session_id: &SessionId,
        watermark: JournalPos,
    ) -> Result<JournalPos, Error> {
        let tree = self.tree();
        let mut stored = Vec::new();
        for entry in tree.scan_prefix(keys::index_prefix(session_id)) {
            let (_, bytes) = entry?;
            stored.extend(codec::decode_runs(&bytes).unwrap_or_default());
        }
        let mut actual = Vec::new();
        for entry in tree.range(keys::log_key(JournalPos(0))..keys::log_key(watermark)) {
            let (key, bytes) = entry?;
            let mut pos = keys::be_u64(&key).unwrap_or(0);
            let entries = codec::Segment::parse(bytes)
                .and_then(|segment| segment.entries())
                .unwrap_or_default();
            for entry in entries {
                if &entry.session_id == session_id {
                    actual.push(Run {
                        first_seq: entry.first_seq,
                        count: entry.count,
                        pos: JournalPos(pos),
                    });
                }
                pos += u64::from(entry.count);
            }
        }
        let differs = stored
            .iter()
            .zip(&actual)
            .find(|(stored, actual)| stored != actual);
        Ok(match differs {
            Some((stored, actual)) => stored.pos.min(actual.pos),
            None => stored
                .get(actual.len())
                .or(actual.get(stored.len()))
                .map_or(JournalPos(0), |run| run.pos),
        })
    }
}

/// What the walk knows of one session.
#[derive(Default)]
struct Head {
    next_seq: Seq,
    last_hash: Hash,
    /// The runs below the watermark, as the segments say.
    indexed: RunDigest,
}

/// An order-sensitive digest of a session's runs (FNV-1a over their fields), so that
/// the index is checked without holding it in memory. Not a security measure: the
/// hash links are; the index is derived data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RunDigest {
    hash: u64,
    runs: u64,
}

impl Default for RunDigest {
    fn default() -> Self {
        RunDigest {
            hash: 0xcbf2_9ce4_8422_2325,
            runs: 0,
        }
    }
}

impl RunDigest {
    fn add(&mut self, run: &Run) {
        let fields = [run.first_seq.0, u64::from(run.count), run.pos.0];
        for byte in fields.iter().flat_map(|field| field.to_be_bytes()) {
            self.hash = (self.hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.runs += 1;
    }
}
