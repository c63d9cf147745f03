//! Read models: a session's state and a run's view, read from their stored forms plus
//! the records after the sequence those are as of, never folded from a session's first
//! record (only a missing or stale stored form, after a stop that lost its write, makes
//! one fold from the start, and the result is stored again).
//!
//! The stored forms are written by the session actor at its turning points (a run
//! accepted or ended, a compaction, a deletion): `session/<id>` holds the session's
//! facts and its open runs' ids, `run/<id>` one run. `journal rebuild` checks both.

use turnstile_journal::{Journal, RunId, Seq, SessionId};
use turnstile_projections::{
    RunHead, RunView, SessionState, SessionView, StoredRun, StoredRunHead, StoredSession,
    Transcripts,
};

use crate::api::RuntimeError;

/// Where a session's stored form is kept: this and its id.
const SESSION_KEY_PREFIX: &str = "session/";

fn session_key(session_id: &SessionId) -> String {
    format!("{SESSION_KEY_PREFIX}{session_id}")
}

/// The facts of each of `sessions` whose stored form is current (as of its stream's head,
/// with no run open), in the order asked, read together (one round trip on PostgreSQL);
/// `None` for the others, which [`load_session`] reads.
pub(crate) fn current_facts(
    journal: &Journal,
    sessions: &[SessionId],
) -> Result<Vec<Option<SessionView>>, RuntimeError> {
    let found = journal.heads_and_projections(sessions, SESSION_KEY_PREFIX)?;
    Ok(sessions
        .iter()
        .zip(found)
        .map(|(session_id, (next_seq, bytes))| {
            let stored: StoredSession = serde_json::from_slice(&bytes?).ok()?;
            let current = stored.session_id == *session_id
                && stored.as_of_seq == next_seq.0
                && stored.open_runs.is_empty();
            current.then_some(stored.session)
        })
        .collect())
}

fn run_key(run_id: &RunId) -> String {
    format!("run/{run_id}")
}

/// The stored projection under `key`, if there is one that decodes as a `T`.
fn stored<T: serde::de::DeserializeOwned>(
    journal: &Journal,
    key: &str,
) -> Result<Option<T>, RuntimeError> {
    Ok(journal
        .get_projection(key)?
        .and_then(|bytes| serde_json::from_slice(&bytes).ok()))
}

/// A run's stored form, if it has one that decodes.
pub(crate) fn stored_run(
    journal: &Journal,
    run_id: &RunId,
) -> Result<Option<StoredRun>, RuntimeError> {
    stored(journal, &run_key(run_id))
}

/// An earlier run of a branch, from its stored form (every earlier run of a branch has
/// ended, so it has one; one stored by an older build, which no longer decodes, is
/// folded again and stored); a walk back stops at a run it cannot read.
pub(crate) fn branch_run(journal: &Journal, run_id: &RunId) -> Option<RunView> {
    match stored_run(journal, run_id).ok().flatten() {
        Some(stored) => Some(stored.run),
        None => run_view(journal, run_id).ok().flatten(),
    }
}

fn stored_session(
    journal: &Journal,
    session_id: &SessionId,
) -> Result<Option<StoredSession>, RuntimeError> {
    stored(journal, &session_key(session_id))
}

/// Stores a session's facts (only while none of its runs is in flight: the actor folds
/// a run's events when it ends, so its state is complete only then).
pub(crate) fn store_session(journal: &Journal, state: &SessionState) {
    put_session(journal, &state.stored());
}

/// Stores one run the state holds.
pub(crate) fn store_run(journal: &Journal, state: &SessionState, run: &RunView) {
    put_run(journal, &state.stored_run(run));
}

/// Stores a session's stored form.
pub(crate) fn put_session(journal: &Journal, stored: &StoredSession) {
    put(journal, &session_key(&stored.session_id), stored);
}

/// Stores a run's stored form.
pub(crate) fn put_run(journal: &Journal, stored: &StoredRun) {
    put(journal, &run_key(&stored.run.run_id), stored);
}

fn put(journal: &Journal, key: &str, value: &impl serde::Serialize) {
    let stored = serde_json::to_vec(value)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            journal
                .put_projection(key, &bytes)
                .map_err(|e| e.to_string())
        });
    if let Err(error) = stored {
        tracing::warn!(key, %error, "stored projection not updated");
    }
}

/// A session's state as of its last durable record: its stored form, its open runs'
/// stored forms and the records after (the empty state for a session with no records). The state
/// holds the open runs and the runs the records after it touched.
pub(crate) fn load_session(
    journal: &Journal,
    session_id: &SessionId,
) -> Result<SessionState, RuntimeError> {
    if let Some(stored) = stored_session(journal, session_id)? {
        let mut open = Vec::with_capacity(stored.open_runs.len());
        for run_id in &stored.open_runs {
            open.push(stored_run(journal, run_id)?);
        }
        if let Some(mut state) = SessionState::resume(stored, open) {
            for record in journal.read_session(session_id, Seq(state.next_seq)) {
                state.apply(&record?);
            }
            return Ok(state);
        }
        tracing::warn!(%session_id, "stored projection incomplete; folding the session from its first record");
    }
    fold_and_store(journal, session_id)
}

/// Folds a session from its first record, and stores what it found so the next read
/// starts from there (the repair after a stop that lost a stored form's write).
fn fold_and_store(journal: &Journal, session_id: &SessionId) -> Result<SessionState, RuntimeError> {
    let mut state = SessionState::new(session_id.clone());
    for record in journal.read_session(session_id, Seq(0)) {
        state.apply(&record?);
    }
    if state.next_seq == 0 {
        return Ok(state);
    }
    for run in &state.runs {
        store_run(journal, &state, run);
    }
    // A run in flight leaves the session's stored form to the actor, at its end:
    // `SessionState::resume` takes every open run as pending.
    if state
        .open_runs()
        .all(|run| run.status == turnstile_projections::RunStatus::Pending)
    {
        store_session(journal, &state);
    }
    Ok(state)
}

/// A run's view: its stored form when it has ended, else from its session's state.
/// `None` for an unknown run, or one of a deleted session.
pub(crate) fn run_view(journal: &Journal, run_id: &RunId) -> Result<Option<RunView>, RuntimeError> {
    // An ended run's stored form is final: its session (named in it) need only confirm
    // that it still exists and owns the run, without the run index's lookup. The newest
    // run of a long session then costs a few keys however big the journal has grown.
    if let Some(stored) = stored_run(journal, run_id)?
        && stored.run.status.is_terminal()
    {
        let state = load_session(journal, &stored.session_id)?;
        return Ok((state.exists() && state.owns(&stored.run)).then_some(stored.run));
    }
    let Some(state) = state_of_run(journal, run_id)? else {
        return Ok(None);
    };
    if let Some(run) = state.run(run_id) {
        return Ok(Some(run.clone()));
    }
    ended_run(journal, &state, run_id)
}

/// The state of the session a run is of, if the run is known and its session exists.
fn state_of_run(journal: &Journal, run_id: &RunId) -> Result<Option<SessionState>, RuntimeError> {
    let Some(session_id) = journal.session_of_run(run_id)? else {
        return Ok(None);
    };
    let state = load_session(journal, &session_id)?;
    Ok(state.exists().then_some(state))
}

/// [`run_view`] as far as the run's head: an ended run's is read from its stored form
/// without building its tool calls and content (a finished run of 5,000 tool calls
/// costs what its head costs, not a parse of the whole run).
pub(crate) fn run_head(journal: &Journal, run_id: &RunId) -> Result<Option<RunHead>, RuntimeError> {
    // As in `run_view`: an ended run's stored head, confirmed by its session's.
    if let Some(stored) = stored::<StoredRunHead>(journal, &run_key(run_id))?
        && stored.run.status.is_terminal()
    {
        let state = load_session(journal, &stored.run.session_id)?;
        return Ok((state.exists() && state.owns_head(&stored.run)).then_some(stored.run));
    }
    let Some(state) = state_of_run(journal, run_id)? else {
        return Ok(None);
    };
    if let Some(run) = state.run(run_id) {
        return Ok(Some(RunHead::of(run)));
    }
    // Missing or stale: the whole read repairs it.
    Ok(ended_run(journal, &state, run_id)?.map(|run| RunHead::of(&run)))
}

/// A run the state does not hold (it ended before the state's stored form).
pub(crate) fn ended_run(
    journal: &Journal,
    state: &SessionState,
    run_id: &RunId,
) -> Result<Option<RunView>, RuntimeError> {
    match stored_run(journal, run_id)? {
        Some(stored) if stored.run.status.is_terminal() => {
            Ok(Some(stored.run).filter(|run| state.owns(run)))
        }
        // A stored form missing, or older than the run's end (a stop lost the write):
        // the session folds from its start once and stores it again.
        _ => Ok(fold_and_store(journal, &state.session_id)?
            .run(run_id)
            .cloned()
            .filter(|run| state.owns(run))),
    }
}

/// Every run of a session as it is now, oldest first.
pub(crate) fn session_runs(
    journal: &Journal,
    state: &SessionState,
) -> Result<Vec<RunView>, RuntimeError> {
    let mut runs = Vec::new();
    for (_, run_id) in journal.session_runs(&state.session_id)? {
        let run = match state.run(&run_id) {
            Some(run) => Some(run.clone()),
            None => ended_run(journal, state, &run_id)?,
        };
        runs.extend(run);
    }
    Ok(runs)
}

/// The lines of a harness session's transcript (a fold of the session's records: only a
/// cold start, a compaction or an audit needs them).
pub(crate) fn transcript(
    journal: &Journal,
    session_id: &SessionId,
    harness_session_id: &str,
) -> Result<Vec<String>, RuntimeError> {
    let mut transcripts = Transcripts::default();
    for record in journal.read_session(session_id, Seq(0)) {
        transcripts.apply(&record?);
    }
    Ok(transcripts.take(harness_session_id))
}
