//! Reads of the sled backend: a record by position, a session's records run by run
//! through the session index and its in-memory tail, the journal in global order, and
//! the tail rebuilt from the segments when the journal opens.
//!
//! Reads never block the committer; they do not write.

use crate::codec::{self, Run, Segment};
use crate::ids::{JournalPos, Seq, SessionId};
use crate::sled::Tail;
use crate::sled::keys::{
    apart_key, be_u64, index_end, index_key, index_prefix, log_key, watermark,
};
use crate::types::{Hashing, JournalStats};
use crate::{Error, Recorded};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

/// Parses the segment stored at `first_pos`, naming that position if it is bad.
pub(crate) fn parse_segment(
    bytes: sled::IVec,
    first_pos: JournalPos,
) -> Result<Segment<sled::IVec>, Error> {
    Segment::parse(bytes).map_err(|error| Error::Corrupt {
        pos: first_pos,
        reason: format!("segment: {error}"),
    })
}

/// The segment holding global position `pos`, with its first position.
pub(super) fn segment_at(
    tree: &sled::Tree,
    pos: JournalPos,
) -> Result<Option<(JournalPos, Segment<sled::IVec>)>, Error> {
    let Some(entry) = tree
        .range(log_key(JournalPos(0))..=log_key(pos))
        .next_back()
    else {
        return Ok(None);
    };
    let (key, bytes) = entry?;
    let first_pos = JournalPos(be_u64(&key).unwrap_or(0));
    let segment = parse_segment(bytes, first_pos)?;
    if pos.0 - first_pos.0 >= segment.len() as u64 {
        return Ok(None);
    }
    Ok(Some((first_pos, segment)))
}

/// Decodes the record at `pos` of a segment that begins at `first_pos`.
pub(super) fn record_in(
    tree: &sled::Tree,
    segment: &Segment<sled::IVec>,
    first_pos: JournalPos,
    pos: JournalPos,
    hashing: Hashing,
) -> Result<Recorded, Error> {
    let bytes = pos
        .0
        .checked_sub(first_pos.0)
        .and_then(|index| segment.record(index as usize))
        .ok_or_else(|| Error::Corrupt {
            pos,
            reason: format!("record missing from the segment at {first_pos}"),
        })?;
    decode_record(tree, bytes, pos, hashing)
}

/// The runs of a session's records that end past `from`, in sequence order: the
/// in-memory tail first, then the stored index from the chunk that holds `from` (a run
/// moved from one to the other meanwhile is seen twice, and deduplicated, rather than
/// not at all).
pub(super) fn session_runs(
    tree: &sled::Tree,
    tail: &RwLock<Tail>,
    session_id: &SessionId,
    from: Seq,
) -> Result<Vec<Run>, Error> {
    let ends_past_from = |run: &Run| run.first_seq.0 + u64::from(run.count) > from.0;
    let (mut runs, tail_covers_from) = {
        let tail = tail.read().map_err(|_| Error::Stopped)?;
        let in_tail = tail
            .runs
            .get(session_id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        (
            in_tail
                .iter()
                .copied()
                .filter(ends_past_from)
                .collect::<Vec<Run>>(),
            in_tail.first().is_some_and(|run| run.first_seq <= from),
        )
    };
    // The tail holds a session's newest runs (it is emptied whole once the index has
    // them, and appends go on into it): when its first one starts at or before `from`,
    // every run the index holds ends before it, and the index need not be read. A
    // read from a session's end, the common one, then costs no index lookup.
    if tail_covers_from {
        return Ok(runs);
    }
    let prefix = index_prefix(session_id);
    let start = match tree
        .range(prefix.clone()..=index_key(session_id, from))
        .next_back()
    {
        Some(entry) => entry?.0.to_vec(),
        None => prefix.clone(),
    };
    for entry in tree.range(start..index_end(session_id)) {
        let (key, bytes) = entry?;
        let chunk = codec::decode_runs(&bytes).map_err(|error| {
            Error::Store(format!(
                "session index of {session_id} at sequence {}: {error}",
                be_u64(&key).unwrap_or(0)
            ))
        })?;
        runs.extend(chunk.into_iter().filter(ends_past_from));
    }
    runs.sort_unstable();
    runs.dedup();
    Ok(runs)
}

/// The last run of a session's records: in the tail if it has one, else at the end of
/// its last index chunk.
pub(super) fn last_run(
    tree: &sled::Tree,
    tail: &RwLock<Tail>,
    session_id: &SessionId,
) -> Result<Option<Run>, Error> {
    let in_tail = tail
        .read()
        .map_err(|_| Error::Stopped)?
        .runs
        .get(session_id)
        .and_then(|runs| runs.last().copied());
    if in_tail.is_some() {
        return Ok(in_tail);
    }
    let Some(entry) = tree
        .range(index_prefix(session_id)..index_end(session_id))
        .next_back()
    else {
        return Ok(None);
    };
    let (_, bytes) = entry?;
    let runs = codec::decode_runs(&bytes)
        .map_err(|error| Error::Store(format!("session index of {session_id}: {error}")))?;
    Ok(runs.last().copied())
}

/// The session index of the records past the watermark, read from their segments.
pub(super) fn rebuild_tail(tree: &sled::Tree) -> Result<Tail, Error> {
    let watermark = watermark(tree)?;
    let mut tail = Tail::default();
    for entry in tree.range(log_key(watermark)..=log_key(JournalPos(u64::MAX))) {
        let (key, bytes) = entry?;
        let mut pos = be_u64(&key).unwrap_or(0);
        let segment = parse_segment(bytes, JournalPos(pos))?;
        let entries = segment.entries().map_err(|error| Error::Corrupt {
            pos: JournalPos(pos),
            reason: format!("segment manifest: {error}"),
        })?;
        for entry in entries {
            tail.runs.entry(entry.session_id).or_default().push(Run {
                first_seq: entry.first_seq,
                count: entry.count,
                pos: JournalPos(pos),
            });
            tail.len += 1;
            pos += u64::from(entry.count);
        }
    }
    Ok(tail)
}

/// Decodes the record stored at global position `pos`.
pub(super) fn decode_record(
    tree: &sled::Tree,
    bytes: &[u8],
    pos: JournalPos,
    hashing: Hashing,
) -> Result<Recorded, Error> {
    let record = Recorded::read(bytes, pos, hashing)?;
    let Some(digest) = record.apart_digest() else {
        return Ok(record);
    };
    let stored = tree.get(apart_key(&digest))?;
    record.with_apart(stored.as_deref())
}

/// Reads one session's records run by run, each run from its segment.
pub(super) struct SessionReader {
    pub(super) tree: sled::Tree,
    pub(super) stats: Arc<JournalStats>,
    pub(super) session_id: SessionId,
    pub(super) runs: std::vec::IntoIter<Run>,
    /// The run being read and how many of its records are done.
    pub(super) current: Option<(Run, u32)>,
    /// The last segment read (consecutive runs often share one).
    pub(super) segment: Option<(JournalPos, Segment<sled::IVec>)>,
    pub(super) next_seq: Seq,
    /// Records at or past this position are not durable yet.
    pub(super) durable: JournalPos,
    pub(super) failed: Option<Error>,
    pub(super) done: bool,
    pub(super) hashing: Hashing,
}

impl SessionReader {
    pub(super) fn read(&mut self, run: Run, offset: u32, seq: Seq) -> Result<Recorded, Error> {
        let pos = JournalPos(run.pos.0 + u64::from(offset));
        let cached = self.segment.as_ref().is_some_and(|(first, segment)| {
            first.0 <= pos.0 && pos.0 - first.0 < segment.len() as u64
        });
        if !cached {
            self.segment = segment_at(&self.tree, pos)?;
        }
        let Some((first_pos, segment)) = &self.segment else {
            return Err(Error::Corrupt {
                pos,
                reason: format!(
                    "no segment holds the record of session {} sequence {seq}",
                    self.session_id
                ),
            });
        };
        let record = record_in(&self.tree, segment, *first_pos, pos, self.hashing)?;
        if record.session_id != self.session_id || record.seq != seq {
            return Err(Error::Corrupt {
                pos,
                reason: format!(
                    "the session index names session {} sequence {seq} here, the record is session {} sequence {}",
                    self.session_id, record.session_id, record.seq
                ),
            });
        }
        Ok(record)
    }
}

impl Iterator for SessionReader {
    type Item = Result<Recorded, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(error) = self.failed.take() {
            self.done = true;
            return Some(Err(error));
        }
        while !self.done {
            let Some((run, offset)) = self.current else {
                self.current = Some((self.runs.next()?, 0));
                continue;
            };
            if offset >= run.count {
                self.current = None;
                continue;
            }
            self.current = Some((run, offset + 1));
            let seq = Seq(run.first_seq.0 + u64::from(offset));
            if seq < self.next_seq {
                continue;
            }
            if run.pos.0 + u64::from(offset) >= self.durable.0 {
                return None;
            }
            let record = self.read(run, offset, seq);
            self.stats.records_read.fetch_add(1, Ordering::Relaxed);
            self.done = record.is_err();
            self.next_seq = seq.next();
            return Some(record);
        }
        None
    }
}

/// Reads records in global order, one segment at a time.
pub(super) struct LogReader {
    pub(super) tree: sled::Tree,
    pub(super) stats: Arc<JournalStats>,
    pub(super) segments: sled::Iter,
    /// The segment being read, its first position, and the next record's index in it.
    pub(super) current: Option<(Segment<sled::IVec>, JournalPos, usize)>,
    pub(super) from: JournalPos,
    /// Records at or past this position are not durable yet.
    pub(super) durable: JournalPos,
    pub(super) failed: bool,
}

impl Iterator for LogReader {
    type Item = Result<Recorded, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.failed {
            if let Some((segment, first_pos, index)) = &mut self.current {
                if *index < segment.len() {
                    let pos = JournalPos(first_pos.0 + *index as u64);
                    *index += 1;
                    if pos < self.from {
                        continue;
                    }
                    if pos >= self.durable {
                        return None;
                    }
                    let record = record_in(&self.tree, segment, *first_pos, pos, Hashing::Compute);
                    self.stats.records_read.fetch_add(1, Ordering::Relaxed);
                    self.failed = record.is_err();
                    return Some(record);
                }
                self.current = None;
            }
            let (key, bytes) = match self.segments.next()? {
                Ok(entry) => entry,
                Err(error) => {
                    self.failed = true;
                    return Some(Err(error.into()));
                }
            };
            let first_pos = JournalPos(be_u64(&key).unwrap_or(0));
            match parse_segment(bytes, first_pos) {
                Ok(segment) => self.current = Some((segment, first_pos, 0)),
                Err(error) => {
                    self.failed = true;
                    return Some(Err(error));
                }
            }
        }
        None
    }
}
