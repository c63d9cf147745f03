//! The reads of the embedding API: sessions, runs, transcripts and an agent's runs, from
//! the session's live actor when it is in memory, else from the journal.

use crate::Runtime;
use crate::api::RuntimeError;
use crate::stream::RunEvents;
use turnstile_journal::{EventIndex, RunId, SessionEntry, SessionId};
use turnstile_projections::{RunStatus, RunView, SessionState};

impl Runtime {
    /// A session's facts and the runs it holds in memory (its open runs): its stored
    /// form plus the records after it. `None` when it does not exist.
    pub fn session(&self, session_id: &SessionId) -> Result<Option<SessionState>, RuntimeError> {
        let state = crate::reads::load_session(self.journal(), session_id)?;
        Ok(state.exists().then_some(state))
    }

    /// A session's facts with every one of its runs, oldest first (costs its runs).
    pub fn session_state(
        &self,
        session_id: &SessionId,
    ) -> Result<Option<SessionState>, RuntimeError> {
        let Some(mut state) = self.session(session_id)? else {
            return Ok(None);
        };
        state.runs = crate::reads::session_runs(self.journal(), &state)?;
        Ok(Some(state))
    }

    /// A session's runs, oldest first; `None` when the session does not exist.
    pub fn session_runs(
        &self,
        session_id: &SessionId,
    ) -> Result<Option<Vec<RunView>>, RuntimeError> {
        Ok(self.session_state(session_id)?.map(|state| state.runs))
    }

    /// The paused runs (`spec/approvals.md`), each with its pending calls, oldest pause
    /// first, of one agent or session when asked: read from the journal's open runs (a
    /// paused run is open), so every replica lists the same, after any restart.
    pub fn paused_runs(
        &self,
        agent_id: Option<&str>,
        session_id: Option<&SessionId>,
    ) -> Result<Vec<RunView>, RuntimeError> {
        let mut paused = Vec::new();
        for (run_id, session) in self.journal().open_runs()? {
            if session_id.is_some_and(|wanted| *wanted != session) {
                continue;
            }
            let Some(run) = self.run_view(&run_id)? else {
                continue;
            };
            if run.status == RunStatus::Paused && agent_id.is_none_or(|id| id == run.agent_id) {
                paused.push(run);
            }
        }
        paused.sort_by_key(|run| (run.paused_at_us, run.run_id.to_string()));
        Ok(paused)
    }

    /// A run's view: its stored form once it has ended, else its session's state.
    pub fn run_view(&self, run_id: &RunId) -> Result<Option<RunView>, RuntimeError> {
        crate::reads::run_view(self.journal(), run_id)
    }

    /// [`Runtime::run_view`] as far as the run's head (agent, session, status, event
    /// count): what a stream needs, without building an ended run's tool calls and
    /// content.
    pub fn run_head(
        &self,
        run_id: &RunId,
    ) -> Result<Option<turnstile_projections::RunHead>, RuntimeError> {
        crate::reads::run_head(self.journal(), run_id)
    }

    /// The lines of one harness session's transcript, as journaled (folds the session's
    /// records: for audits and tests, not for a turn).
    pub fn transcript(
        &self,
        session_id: &SessionId,
        harness_session_id: &str,
    ) -> Result<Vec<String>, RuntimeError> {
        crate::reads::transcript(self.journal(), session_id, harness_session_id)
    }

    /// Every session's listing facts and daily metrics.
    pub fn directory(&self) -> &crate::directory::Directory {
        &self.inner.shared.directory
    }

    /// One page of an agent's runs in the order they were queued (newest first when
    /// `newest_first`), those with `status` only when it is given, and how many there
    /// are. The page reads the runs it returns and the index entries it skips; the count
    /// is kept by the journal as runs change.
    pub fn agent_runs(
        &self,
        agent_id: &str,
        status: Option<RunStatus>,
        skip: usize,
        limit: usize,
        newest_first: bool,
    ) -> Result<(Vec<RunView>, usize), RuntimeError> {
        use turnstile_journal::IndexedStatus;
        let wanted = status.map(|status| match status {
            RunStatus::Pending => IndexedStatus::Pending,
            RunStatus::Running => IndexedStatus::Running,
            RunStatus::Completed => IndexedStatus::Completed,
            RunStatus::Error => IndexedStatus::Error,
            RunStatus::Cancelled => IndexedStatus::Cancelled,
            RunStatus::Paused => IndexedStatus::Paused,
        });
        let counts = self.journal().agent_run_counts(agent_id);
        let total = match wanted {
            Some(status) => counts[status as usize],
            None => counts.iter().sum(),
        } as usize;
        let mut matched = 0;
        let mut page = Vec::new();
        for run in self.journal().agent_runs(agent_id, newest_first) {
            let run = run?;
            if wanted.is_some_and(|wanted| wanted != run.status) {
                continue;
            }
            if matched >= skip {
                page.extend(self.run_view(&run.run_id)?);
            }
            matched += 1;
            if page.len() >= limit {
                break;
            }
        }
        Ok((page, total))
    }

    /// A run's events after `after` (all of them when `None`): live until its end for
    /// a run in flight, read from the journal for a finished one.
    pub fn run_events(
        &self,
        run_id: &RunId,
        after: Option<EventIndex>,
    ) -> Result<Option<RunEvents>, RuntimeError> {
        let Some(head) = self.run_head(run_id)? else {
            return Ok(None);
        };
        Ok(Some(self.run_events_of(&head, after)))
    }

    /// [`Runtime::run_events`] of a run whose head the caller has read already (a
    /// route that checked the run), so the head is not read twice.
    pub fn run_events_of(
        &self,
        head: &turnstile_projections::RunHead,
        after: Option<EventIndex>,
    ) -> RunEvents {
        // Subscribed before the journal is read: an event journaled meanwhile is in one
        // or the other, and the stream delivers each index once.
        let live = self.inner.shared.live_run(&head.run_id);
        let from = after.map(EventIndex::next).unwrap_or_default();
        RunEvents::new(
            self.journal().clone(),
            head.session_id.clone(),
            head.run_id.clone(),
            head.queued_seq,
            live,
            from,
        )
    }

    /// Every existing session, from the journal's session index (no stream is read).
    pub fn sessions(&self) -> Result<Vec<SessionEntry>, RuntimeError> {
        Ok(self.journal().sessions()?)
    }
}
