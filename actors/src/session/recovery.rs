//! Recovery when an actor starts: what a stopped process left open is resolved from the
//! journal (queued runs queue again; a running run gets a new attempt or ends `ERROR`).

use crate::session::{Queued, SessionActor};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use turnstile_journal::{Event, EventIndex, RunId};

use turnstile_projections::{RunStatus, RunView};

use crate::run::failed_events;

impl SessionActor {
    /// Resolves runs a stopped process left open; returns the events that end the ones
    /// that cannot go on.
    pub(super) fn recover(&mut self) -> Vec<Event> {
        let mut endings = Vec::new();
        let worked_on: HashSet<RunId> = self
            .queue
            .iter()
            .map(|queued| queued.run_id.clone())
            .chain(self.in_flight.iter().map(|f| f.run_id.clone()))
            .chain(self.ending.iter().cloned())
            .collect();
        let queued_before = self.queue.len();
        let open: Vec<_> = self
            .state
            .open_runs()
            .filter(|run| !worked_on.contains(&run.run_id))
            .cloned()
            .collect();
        for run in open {
            endings.extend(self.recover_run(&run));
        }
        // The journal's order: a run resumed first (it was the session's running turn),
        // then by acceptance (a run recovered while others wait goes back before them).
        if self.queue.len() > queued_before {
            let state = &self.state;
            self.queue.make_contiguous().sort_by_key(|queued| {
                let seq = state
                    .run(&queued.run_id)
                    .filter(|_| queued.durable)
                    .map_or(u64::MAX, |run| run.queued_seq.0);
                (!queued.resume, seq)
            });
        }
        for queued in &self.queue {
            self.shared.ensure_live(&queued.run_id);
        }
        self.shared
            .queued
            .fetch_add(self.queue.len() - queued_before, Ordering::SeqCst);
        endings
    }

    /// Recovers one open run that nobody works on: a pending run queues again; a
    /// running run resumes first with a new attempt when it has attempts left and its
    /// last failure was not permanent, else it ends `ERROR`. Its ending events, if any.
    fn recover_run(&mut self, run: &RunView) -> Vec<Event> {
        let identity = self.identity(&run.run_id);
        let index = EventIndex(run.event_count);
        let Some(agent) = self.shared.agents.get(&run.agent_id) else {
            let message = format!("Agent {} is no longer configured.", run.agent_id);
            return failed_events(&identity, index, "agent_not_configured", &message, false);
        };
        match run.status {
            RunStatus::Pending => {
                tracing::info!(run_id = %run.run_id, session_id = %self.session_id, "run recovered: queued again");
                self.queue.push_back(Queued {
                    run_id: run.run_id.clone(),
                    durable: true,
                    resume: false,
                });
                Vec::new()
            }
            RunStatus::Running => match &run.last_failure {
                // A permanent failure was recorded before the stop: never retried.
                Some((attempt, error_type, false)) if *attempt == run.attempts => {
                    let message = format!("Attempt {attempt} failed permanently ({error_type}).");
                    failed_events(&identity, index, error_type, &message, false)
                }
                _ if run.spent_attempts() < agent.retry.max_attempts() => {
                    // It was the session's running turn: it goes first.
                    tracing::info!(
                        run_id = %run.run_id,
                        session_id = %self.session_id,
                        attempt = run.attempts + 1,
                        "run recovered: in flight at the stop, it resumes with a new attempt"
                    );
                    self.queue.push_front(Queued {
                        run_id: run.run_id.clone(),
                        durable: true,
                        resume: true,
                    });
                    Vec::new()
                }
                _ => {
                    let message = "The turnstile process stopped while this run was in flight, and it has no attempts left.";
                    failed_events(&identity, index, "process_stopped", message, false)
                }
            },
            _ => Vec::new(),
        }
    }
}
