//! The actor's state as a fold of the journal: records are applied strictly in the
//! stream's order (one that arrives early waits for those before it), and the stored
//! form is written only for a whole prefix with every open run pending.

use crate::session::SessionActor;
use actix::prelude::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use turnstile_journal::{Event, Recorded, RunId};

use turnstile_projections::{RunStatus, RunView, SessionView, StoredRun, StoredSession};

use crate::reads;
use crate::run::RunIdentity;

/// A batch the session's running task journaled (durable).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct RecordsAppended(pub(super) Vec<Arc<Recorded>>);

impl Handler<RecordsAppended> for SessionActor {
    type Result = ();

    fn handle(&mut self, RecordsAppended(records): RecordsAppended, _: &mut Self::Context) {
        self.fold(&records);
    }
}

impl SessionActor {
    pub(super) fn identity(&self, run_id: &RunId) -> RunIdentity {
        RunIdentity {
            run_id: run_id.clone(),
            session_id: self.session_id.clone(),
        }
    }

    /// Applies records this actor appended (they are logged here: see
    /// [`crate::lifecycle::log_actor_step`]).
    pub(super) fn apply(&mut self, records: &[Arc<Recorded>]) {
        self.apply_keeping(records, None);
    }

    /// [`SessionActor::apply`], returning the view of the run `keep` names when these
    /// records end it (the view its stored form gets).
    pub(super) fn apply_keeping(
        &mut self,
        records: &[Arc<Recorded>],
        keep: Option<&RunId>,
    ) -> Option<RunView> {
        for record in records {
            crate::lifecycle::log_actor_step(&self.session_id, &record.event);
        }
        self.fold_keeping(records, keep)
    }

    /// Applies records, logging nothing (a run task's, logged as it appended them).
    /// Records are folded in the stream's order: one that arrives before a record it
    /// follows waits for it, and one the state already holds is skipped.
    pub(super) fn fold(&mut self, arrived: &[Arc<Recorded>]) {
        self.fold_keeping(arrived, None);
    }

    /// [`SessionActor::fold`], returning the view of the run `keep` names when the
    /// records end it.
    fn fold_keeping(&mut self, arrived: &[Arc<Recorded>], keep: Option<&RunId>) -> Option<RunView> {
        for record in arrived {
            if record.session_id == self.session_id && record.seq.0 >= self.state.next_seq {
                self.unfolded.insert(record.seq.0, record.clone());
            }
        }
        let mut records = Vec::new();
        while let Some(record) = self.unfolded.remove(&self.state.next_seq) {
            self.state.apply(&record);
            records.push(record);
        }
        let records = &records[..];
        self.count_runs(records);
        // Stored forms follow the session at its turning points (a run accepted or
        // ended, a compaction, a deletion): the session's key and each run's own key,
        // so a write costs the same in a long session as in a short one.
        let mut turning_point = false;
        let mut runs = Vec::new();
        for record in records {
            let run = match &record.event {
                Event::RunQueued { run_id, .. } => Some(run_id),
                event if event.is_terminal() => event.run_id(),
                Event::TranscriptCompacted { .. } | Event::SessionDeleted { .. } => None,
                _ => continue,
            };
            turning_point = true;
            if let Some(run) = run.and_then(|run_id| self.state.run(run_id)) {
                runs.push(self.state.stored_run(run));
            }
        }
        let kept = keep
            .and_then(|run_id| runs.iter().find(|stored| &stored.run.run_id == run_id))
            .filter(|stored| stored.run.status.is_terminal())
            .map(|stored| stored.run.clone());
        if !turning_point {
            return kept;
        }
        // While a run is in flight its task journals events this state has not folded
        // yet (they are applied when it ends): a session form stored now would be "as
        // of" a sequence whose fold includes them, and `journal rebuild` would call it a
        // difference (issue 12: a stop with one run in flight and one queued). The run's
        // end stores it again, complete; ended runs leave memory then, their stored
        // forms keep them.
        // Stored only when the state is a whole prefix of the stream and no run is past
        // its acceptance: `SessionState::resume` takes open runs as pending, with their
        // events in the records after the stored form.
        let idle = self.in_flight.is_none()
            && self.unfolded.is_empty()
            && self
                .state
                .open_runs()
                .all(|run| run.status == RunStatus::Pending);
        // The facts are copied once: inside the stored form when it is written, alone
        // for the directory otherwise.
        let stored = idle.then(|| self.state.stored());
        let view = stored.is_none().then(|| self.state.session.clone());
        self.store(runs, stored, view);
        if idle {
            self.state.retire();
            if self.queue.is_empty() {
                // An idle actor keeps no room for a queue it does not have.
                self.queue.shrink_to_fit();
            }
        }
        kept
    }

    /// Counts the runs started and ended, for the runtime's metrics.
    fn count_runs(&self, records: &[Arc<Recorded>]) {
        for record in records {
            let counter = match record.event {
                Event::RunStarted { .. } => Some(&self.shared.counters.started),
                Event::RunCompleted { .. } => Some(&self.shared.counters.completed),
                Event::RunFailed { .. } => Some(&self.shared.counters.failed),
                Event::RunCancelled { .. } => Some(&self.shared.counters.cancelled),
                _ => None,
            };
            if let Some(counter) = counter {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Writes the runs' stored forms, the session's (when there is one) and its facts
    /// in the directory. They outlive this actor: they are written on the keeper's
    /// thread (see `keeper`), and the actor waits for them.
    fn store(
        &self,
        runs: Vec<StoredRun>,
        stored: Option<StoredSession>,
        view: Option<SessionView>,
    ) {
        let shared = self.shared.clone();
        let session_id = self.session_id.clone();
        self.shared.keeper.run(move || {
            for run in &runs {
                reads::put_run(&shared.journal, run);
            }
            if let Some(facts) = stored
                .as_ref()
                .map(|stored| &stored.session)
                .or(view.as_ref())
            {
                shared.directory.update(&session_id, facts);
            }
            if let Some(stored) = &stored {
                reads::put_session(&shared.journal, stored);
            }
        });
    }
}
