//! The secondary indexes of the sled backend, written in the same atomic batch as the
//! records they index: a run's session and position, the open runs, each session's and
//! each agent's runs with their status, sessions, idempotency keys, and the per-agent
//! counts kept in memory.
//!
//! It follows the index rules of `chain::index_changes`; it does not decide them.

use crate::chain::{self, IndexChange};
use crate::event::Event;
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::sled::keys::RunEntry;
use crate::sled::keys::{
    AGENT_RUNS, agent_runs_key, agent_runs_value, decode_run_value, idempotency_key, open_key,
    run_key, run_value, session_key, session_runs_key, session_runs_prefix, session_value,
    stored_id,
};
use crate::{Error, IndexedStatus};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What the batch being built changes that the tree does not show yet: the runs it
/// queues, the status it gives runs, and the changes to the agents' run counts.
#[derive(Debug, Default)]
pub(crate) struct StagedRuns {
    pub(super) runs: HashMap<RunId, RunEntry>,
    pub(super) statuses: HashMap<RunId, u8>,
    pub(super) counts: Vec<(String, u8, i64)>,
}

impl StagedRuns {
    pub(crate) fn clear(&mut self) {
        self.runs.clear();
        self.statuses.clear();
        self.counts.clear();
    }
}

/// Runs per agent and status, in [`IndexedStatus`] order; kept as the run index changes.
pub(crate) type AgentRunCounts = Arc<Mutex<HashMap<String, [u64; 6]>>>;

pub(super) fn status_slot(byte: u8) -> Option<usize> {
    IndexedStatus::from_byte(byte).map(|status| status as usize)
}

pub(super) fn apply_counts(counts: &AgentRunCounts, changes: &[(String, u8, i64)]) {
    let Ok(mut counts) = counts.lock() else {
        return;
    };
    for (agent, status, change) in changes {
        if let Some(slot) = status_slot(*status) {
            let count = &mut counts.entry(agent.clone()).or_default()[slot];
            *count = count.saturating_add_signed(*change);
        }
    }
}

/// Counts every agent's runs by status from the run index (once, when the journal opens).
pub(super) fn count_agent_runs(tree: &sled::Tree) -> Result<HashMap<String, [u64; 6]>, Error> {
    let mut counts: HashMap<String, [u64; 6]> = HashMap::new();
    for entry in tree.scan_prefix([AGENT_RUNS]) {
        let (key, value) = entry?;
        let agent = key
            .get(1..key.len().saturating_sub(9))
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .unwrap_or_default();
        if let Some(slot) = value.first().copied().and_then(status_slot) {
            match counts.get_mut(agent) {
                Some(count) => count[slot] += 1,
                None => {
                    let mut count = [0; 6];
                    count[slot] = 1;
                    counts.insert(agent.to_owned(), count);
                }
            }
        }
    }
    Ok(counts)
}

/// A run's entry: staged in this batch, or in the tree.
pub(super) fn run_entry(
    tree: &sled::Tree,
    staged: &StagedRuns,
    run_id: &RunId,
) -> Option<RunEntry> {
    if let Some(entry) = staged.runs.get(run_id) {
        return Some(entry.clone());
    }
    let bytes = tree.get(run_key(run_id)).ok()??;
    decode_run_value(&bytes).ok()
}

/// The staged status of a run this batch removed from its agent's index.
pub(super) const GONE: u8 = 0;

/// A run's status byte in its agent's run index: as this batch left it, else the tree's.
pub(super) fn indexed_status(
    tree: &sled::Tree,
    staged: &StagedRuns,
    run_id: &RunId,
    entry: &RunEntry,
) -> Option<u8> {
    if let Some(status) = staged.statuses.get(run_id) {
        return Some(*status).filter(|status| *status != GONE);
    }
    tree.get(agent_runs_key(&entry.agent_id, entry.pos))
        .ok()??
        .first()
        .copied()
}
/// Secondary indexes of one event, in the same atomic batch as its record: the index
/// rules ([`chain::index_changes`]) as sled keys.
pub(crate) fn index_event(
    tree: &sled::Tree,
    batch: &mut sled::Batch,
    staged: &mut StagedRuns,
    recorded: (&SessionId, JournalPos, Seq, i64),
    event: &Event,
) {
    let (session_id, pos, seq, ts_us) = recorded;
    for change in chain::index_changes(event) {
        match change {
            IndexChange::RunQueued { run_id, agent_id } => {
                let entry = RunEntry {
                    session_id: session_id.clone(),
                    agent_id: agent_id.to_owned(),
                    pos: pos.0,
                    seq: seq.0,
                };
                batch.insert(run_key(run_id), run_value(&entry));
                batch.insert(open_key(run_id), session_id.as_str().as_bytes());
                batch.insert(
                    session_runs_key(session_id, seq.0),
                    run_id.as_str().as_bytes(),
                );
                batch.insert(
                    agent_runs_key(agent_id, pos.0),
                    agent_runs_value(b'P', session_id, run_id),
                );
                staged.counts.push((agent_id.to_owned(), b'P', 1));
                staged.statuses.insert(run_id.clone(), b'P');
                staged.runs.insert(run_id.clone(), entry);
            }
            IndexChange::SessionCreated { agent_id, user_id } => {
                batch.insert(
                    session_key(session_id),
                    session_value(agent_id, user_id, ts_us),
                );
            }
            IndexChange::SessionDeleted => unindex_session(tree, batch, staged, session_id),
            IndexChange::KeyBound { key, run_id } => {
                batch.insert(idempotency_key(key), run_id.as_str().as_bytes());
            }
            IndexChange::RunStatus {
                run_id,
                status,
                terminal,
            } => {
                if terminal {
                    batch.remove(open_key(run_id));
                }
                // Only a run its agent's index lists (a deleted session's runs left it).
                if let Some(entry) = run_entry(tree, staged, run_id)
                    && let Some(before) = indexed_status(tree, staged, run_id, &entry)
                {
                    staged.counts.push((entry.agent_id.clone(), before, -1));
                    staged.counts.push((entry.agent_id.clone(), status, 1));
                    staged.statuses.insert(run_id.clone(), status);
                    batch.insert(
                        agent_runs_key(&entry.agent_id, entry.pos),
                        agent_runs_value(status, session_id, run_id),
                    );
                }
            }
        }
    }
}

/// A session deleted: it leaves the session index, and its runs leave its agent's list
/// and the session's own (a session id used again begins with no runs).
fn unindex_session(
    tree: &sled::Tree,
    batch: &mut sled::Batch,
    staged: &mut StagedRuns,
    session_id: &SessionId,
) {
    batch.remove(session_key(session_id));
    // The session's runs leave its agent's list and the session's own (a
    // session id used again begins with no runs).
    let mut runs: Vec<RunId> = tree
        .scan_prefix(session_runs_prefix(session_id))
        .filter_map(Result::ok)
        .filter_map(|(_, value)| stored_id(&value).ok())
        .collect();
    runs.extend(
        staged
            .runs
            .iter()
            .filter(|(_, entry)| &entry.session_id == session_id)
            .map(|(run_id, _)| run_id.clone()),
    );
    for run_id in runs {
        if let Some(entry) = run_entry(tree, staged, &run_id) {
            if let Some(status) = indexed_status(tree, staged, &run_id, &entry) {
                staged.counts.push((entry.agent_id.clone(), status, -1));
            }
            // Gone from the index, also for the rest of this batch.
            staged.statuses.insert(run_id.clone(), GONE);
            batch.remove(agent_runs_key(&entry.agent_id, entry.pos));
            batch.remove(session_runs_key(session_id, entry.seq));
        }
    }
}
