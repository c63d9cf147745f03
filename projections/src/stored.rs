//! The stored forms of a session's fold: complete enough that a state resumes from them
//! plus the records after them, never from the session's first record; and a run's head,
//! the little a listing needs.

use crate::{RunStatus, RunView, SessionView};
use serde::{Deserialize, Serialize};
use turnstile_journal::{RunId, Seq, SessionId};

/// The stored form of a session: its facts and its open runs' ids, as of a sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredSession {
    /// The session.
    pub session_id: SessionId,
    /// The sequence after the last record folded in.
    pub as_of_seq: u64,
    /// Its facts.
    pub session: SessionView,
    /// Runs not ended, oldest first (their own stored forms hold them).
    pub open_runs: Vec<RunId>,
}

/// The stored form of one run, as of a sequence of its session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRun {
    /// The run's session.
    pub session_id: SessionId,
    /// The sequence after the last record folded in.
    pub as_of_seq: u64,
    /// The run.
    pub run: RunView,
}

/// What a run's stream needs to know of it (which agent and session it is of, where it
/// is, how many events it has), read from its stored form without the rest: a run's
/// tool calls and content are skipped, not built.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RunHead {
    /// The run.
    pub run_id: RunId,
    /// Its session.
    pub session_id: SessionId,
    /// Agent.
    pub agent_id: String,
    /// Status.
    pub status: RunStatus,
    /// Client-visible events recorded (= next event index).
    pub event_count: u64,
    /// Sequence of the run's first record in its session stream.
    pub queued_seq: Seq,
}

impl RunHead {
    /// The head of a whole run.
    pub fn of(run: &RunView) -> RunHead {
        RunHead {
            run_id: run.run_id.clone(),
            session_id: run.session_id.clone(),
            agent_id: run.agent_id.clone(),
            status: run.status,
            event_count: run.event_count,
            queued_seq: run.queued_seq,
        }
    }
}

/// [`StoredRun`] read as far as its run's [`RunHead`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StoredRunHead {
    /// The run's head.
    pub run: RunHead,
}
