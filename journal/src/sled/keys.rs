//! The keys and values of the sled tree: one byte names each kind of key, ids follow,
//! numbers are big-endian so that keys sort in their order.
//!
//! This module encodes and decodes; it decides nothing about when a key is written.

use crate::codec::{self, Hash, Run};
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::{Error, SessionEntry, limits};

pub(crate) const LOG: u8 = b'L';
pub(crate) const INDEX: u8 = b'I';
/// The session index is complete below the position this key holds (u64 BE).
pub(crate) const WATERMARK: &[u8] = b"W";
/// Layout 1 kept records under `S` + session + seq; this build does not read it.
pub(super) const LAYOUT_1_STREAM: u8 = b'S';
pub(super) const RUN: u8 = b'R';
pub(super) const OPEN: u8 = b'O';
pub(super) const IDEMPOTENCY: u8 = b'K';
pub(super) const SESSION: u8 = b'N';
/// `Q` + session + NUL + queued sequence (u64 BE) → run id: a session's runs in order.
pub(super) const SESSION_RUNS: u8 = b'Q';
/// `G` + agent + NUL + queued position (u64 BE) → status byte, session, NUL, run id: an
/// agent's runs in order, with their status.
pub(super) const AGENT_RUNS: u8 = b'G';
/// `A` + BLAKE3 digest: the encoding of an event stored apart from its record.
pub(crate) const APART: u8 = b'A';

/// The key of an event stored apart.
pub(crate) fn apart_key(digest: &Hash) -> Vec<u8> {
    let mut key = Vec::with_capacity(33);
    key.push(APART);
    key.extend_from_slice(digest);
    key
}
/// The sled tree of stored projections, apart from the journal's own.
pub(super) const PROJECTIONS: &str = "projections";

pub(crate) fn log_key(pos: JournalPos) -> [u8; 9] {
    let mut key = [LOG; 9];
    key[1..].copy_from_slice(&pos.0.to_be_bytes());
    key
}

pub(crate) fn index_prefix(session_id: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(session_id.as_str().len() + 10);
    key.push(INDEX);
    key.extend_from_slice(session_id.as_str().as_bytes());
    key.push(0);
    key
}

/// Past every index key of the session: ids hold no NUL, so `0x01` after the id sorts
/// after `0x00` and before any longer id.
pub(super) fn index_end(session_id: &SessionId) -> Vec<u8> {
    let mut key = index_prefix(session_id);
    *key.last_mut().expect("prefix ends in 0x00") = 1;
    key
}

pub(crate) fn index_key(session_id: &SessionId, first_seq: Seq) -> Vec<u8> {
    let mut key = index_prefix(session_id);
    key.extend_from_slice(&first_seq.0.to_be_bytes());
    key
}

/// Adds the runs of each session to its session index, and the watermark, to a batch:
/// appended to the session's last chunk while it holds fewer than
/// [`limits::SESSION_INDEX_CHUNK_RUNS`], else as a new chunk, so a session that appends
/// a little at a time does not collect a chunk per index write.
/// Nothing is added to the batch when reading a last chunk fails.
pub(crate) fn write_index<'a>(
    tree: &sled::Tree,
    batch: &mut sled::Batch,
    runs: impl IntoIterator<Item = (&'a SessionId, &'a [Run])>,
    watermark: JournalPos,
) -> Result<(), Error> {
    let mut writes: Vec<(sled::IVec, Vec<u8>)> = Vec::new();
    for (session_id, runs) in runs {
        let Some(first) = runs.first() else {
            continue;
        };
        let last_chunk = tree
            .range(index_prefix(session_id)..index_end(session_id))
            .next_back()
            .transpose()?;
        match last_chunk {
            Some((key, bytes))
                if bytes.len() / codec::RUN_BYTES < limits::SESSION_INDEX_CHUNK_RUNS =>
            {
                let mut merged = bytes.to_vec();
                merged.extend_from_slice(&codec::encode_runs(runs));
                writes.push((key, merged));
            }
            _ => writes.push((
                index_key(session_id, first.first_seq).into(),
                codec::encode_runs(runs),
            )),
        }
    }
    for (key, value) in writes {
        batch.insert(key, value);
    }
    batch.insert(WATERMARK, &watermark.0.to_be_bytes());
    Ok(())
}

/// The watermark of the session index (0 for a journal that never wrote one).
pub(crate) fn watermark(tree: &sled::Tree) -> Result<JournalPos, Error> {
    Ok(JournalPos(
        tree.get(WATERMARK)?
            .and_then(|bytes| be_u64(&bytes))
            .unwrap_or(0),
    ))
}

pub(super) fn open_key(run_id: &RunId) -> Vec<u8> {
    let mut key = run_key(run_id);
    key[0] = OPEN;
    key
}

pub(super) fn session_key(session_id: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(session_id.as_str().len() + 1);
    key.push(SESSION);
    key.extend_from_slice(session_id.as_str().as_bytes());
    key
}

pub(super) fn session_value(agent_id: &str, user_id: Option<&str>, created_at_us: i64) -> Vec<u8> {
    // agent id, NUL, user id (or nothing), NUL, creation time (i64 BE): ids hold no NUL.
    let mut value = Vec::with_capacity(agent_id.len() + 24);
    value.extend_from_slice(agent_id.as_bytes());
    value.push(0);
    value.extend_from_slice(user_id.unwrap_or_default().as_bytes());
    value.push(0);
    value.extend_from_slice(&created_at_us.to_be_bytes());
    value
}

pub(super) fn decode_session_entry(key: &[u8], value: &[u8]) -> Result<SessionEntry, Error> {
    let malformed = || Error::Store("malformed session index entry".into());
    let (text, time) = value.split_at(value.len().checked_sub(8).ok_or_else(malformed)?);
    let text = std::str::from_utf8(text).map_err(|_| malformed())?;
    let mut parts = text.split('\0');
    let agent_id = parts.next().ok_or_else(malformed)?.to_owned();
    let user_id = parts
        .next()
        .filter(|user| !user.is_empty())
        .map(str::to_owned);
    Ok(SessionEntry {
        session_id: stored_id(&key[1..])?,
        agent_id,
        user_id,
        created_at_us: i64::from_be_bytes(time.try_into().map_err(|_| malformed())?),
    })
}

pub(super) fn idempotency_key(key: &str) -> Vec<u8> {
    let mut sled_key = Vec::with_capacity(key.len() + 1);
    sled_key.push(IDEMPOTENCY);
    sled_key.extend_from_slice(key.as_bytes());
    sled_key
}

pub(super) fn run_key(run_id: &RunId) -> Vec<u8> {
    let mut key = Vec::with_capacity(run_id.as_str().len() + 2);
    key.push(RUN);
    key.extend_from_slice(run_id.as_str().as_bytes());
    key.push(0);
    key
}

pub(crate) fn be_u64(bytes: &[u8]) -> Option<u64> {
    let tail: [u8; 8] = bytes.get(bytes.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(u64::from_be_bytes(tail))
}
pub(super) fn session_runs_prefix(session_id: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(session_id.as_str().len() + 10);
    key.push(SESSION_RUNS);
    key.extend_from_slice(session_id.as_str().as_bytes());
    key.push(0);
    key
}

pub(super) fn session_runs_key(session_id: &SessionId, seq: u64) -> Vec<u8> {
    let mut key = session_runs_prefix(session_id);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

pub(super) fn agent_runs_prefix(agent_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(agent_id.len() + 10);
    key.push(AGENT_RUNS);
    key.extend_from_slice(agent_id.as_bytes());
    key.push(0);
    key
}

pub(super) fn agent_runs_key(agent_id: &str, pos: u64) -> Vec<u8> {
    let mut key = agent_runs_prefix(agent_id);
    key.extend_from_slice(&pos.to_be_bytes());
    key
}

pub(super) fn agent_runs_value(status: u8, session_id: &SessionId, run_id: &RunId) -> Vec<u8> {
    let mut value = Vec::with_capacity(2 + session_id.as_str().len() + run_id.as_str().len());
    value.push(status);
    value.extend_from_slice(session_id.as_str().as_bytes());
    value.push(0);
    value.extend_from_slice(run_id.as_str().as_bytes());
    value
}

/// Where a run is indexed: its session, agent and queued position and sequence.
#[derive(Debug, Clone)]
pub(crate) struct RunEntry {
    pub(super) session_id: SessionId,
    pub(super) agent_id: String,
    pub(super) pos: u64,
    pub(super) seq: u64,
}

pub(super) fn run_value(entry: &RunEntry) -> Vec<u8> {
    // session, NUL, agent, NUL, position (u64 BE), sequence (u64 BE): ids hold no NUL.
    let mut value = Vec::with_capacity(entry.session_id.as_str().len() + entry.agent_id.len() + 18);
    value.extend_from_slice(entry.session_id.as_str().as_bytes());
    value.push(0);
    value.extend_from_slice(entry.agent_id.as_bytes());
    value.push(0);
    value.extend_from_slice(&entry.pos.to_be_bytes());
    value.extend_from_slice(&entry.seq.to_be_bytes());
    value
}

pub(super) fn decode_run_value(value: &[u8]) -> Result<RunEntry, Error> {
    let malformed = || Error::Store("malformed run index entry".into());
    let (text, numbers) = value.split_at(value.len().checked_sub(16).ok_or_else(malformed)?);
    let text = text.strip_suffix(&[0]).ok_or_else(malformed)?;
    let split = text.iter().position(|b| *b == 0).ok_or_else(malformed)?;
    Ok(RunEntry {
        session_id: stored_id(&text[..split])?,
        agent_id: std::str::from_utf8(&text[split + 1..])
            .map_err(|_| malformed())?
            .to_owned(),
        pos: be_u64(&numbers[..8]).ok_or_else(malformed)?,
        seq: be_u64(numbers).ok_or_else(malformed)?,
    })
}

/// An id stored in an index key or value.
pub(super) fn stored_id<T: std::str::FromStr>(bytes: &[u8]) -> Result<T, Error> {
    let text = std::str::from_utf8(bytes).map_err(|e| Error::Store(e.to_string()))?;
    text.parse()
        .map_err(|_| Error::Store(format!("malformed id {text:?} in an index")))
}
