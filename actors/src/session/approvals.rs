//! A paused run (`spec/approvals.md`): it holds its session but no worker slot and no
//! run task; its decisions are journaled here (`RunEvent::Continued`, at the run's next
//! event index) and the same run queues again, first, to go on from its pause. An
//! undecided call is denied when the agent's `approval_timeout_s` has passed since the
//! pause, on whichever actor holds the session then (the pause's time is journaled).

use crate::api::{DecideRun, Refused, RuntimeError};
use crate::session::{Accepted, Queued, SessionActor};
use actix::prelude::*;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use turnstile_journal::{EventIndex, Expected, RunEvent, RunId, ToolDecision, now_us};
use turnstile_projections::{RunStatus, RunView};

/// The note of a call denied because nobody decided in time.
pub(crate) const TIMED_OUT: &str = "timed out";

/// Decides a paused run's calls.
#[derive(Message)]
#[rtype(result = "Result<Result<Accepted, Refused>, RuntimeError>")]
pub(crate) struct DecideMsg(pub DecideRun);

impl SessionActor {
    /// The session's paused run, if it has one (it holds the session).
    pub(super) fn paused_run(&self) -> Option<&RunView> {
        self.state
            .open_runs()
            .find(|run| run.status == RunStatus::Paused)
    }

    /// The run paused in this session: the state's, or one this actor paused whose pause
    /// the state has not folded yet.
    pub(super) fn held_paused(&self) -> Option<&RunId> {
        if let Some(run) = self.paused_run() {
            return Some(&run.run_id);
        }
        let (run_id, index) = self.holding.as_ref()?;
        let folded = self
            .state
            .run(run_id)
            .is_none_or(|run| run.event_count > index.0);
        (!folded).then_some(run_id)
    }

    /// A run paused here whose pause the state has not folded yet.
    pub(super) fn pause_unfolded(&self, run_id: &RunId) -> bool {
        self.paused_run().is_none() && self.held_paused() == Some(run_id)
    }

    /// Arms the timeout of the session's paused run, if it has one and its agent
    /// bounds the wait.
    pub(super) fn arm_approval_timeout(&mut self, ctx: &mut Context<Self>) {
        let Some(run) = self.paused_run() else {
            return;
        };
        let paused_at_us = run.paused_at_us.unwrap_or(run.updated_at_us);
        let run_id = run.run_id.clone();
        self.arm_timeout_of(run_id, paused_at_us, ctx);
    }

    /// Arms the timeout of `run_id`, paused at `paused_at_us` (its pause's record time),
    /// when the session's agent bounds the wait; it fires only if the run is still
    /// paused since then.
    pub(super) fn arm_timeout_of(
        &mut self,
        run_id: RunId,
        paused_at_us: i64,
        ctx: &mut Context<Self>,
    ) {
        let Some(timeout) = self
            .shared
            .agents
            .get(&self.state.session.agent_id)
            .and_then(|agent| agent.approval.timeout)
        else {
            return;
        };
        let deadline_us = paused_at_us.saturating_add(timeout.as_micros() as i64);
        let wait = Duration::from_micros(deadline_us.saturating_sub(now_us()).max(0) as u64);
        ctx.run_later(wait, move |actor, ctx| {
            actor.time_out(&run_id, paused_at_us, ctx);
        });
    }

    /// Denies every call of a run still paused since `paused_at_us` (note `timed out`).
    fn time_out(&mut self, run_id: &RunId, paused_at_us: i64, ctx: &mut Context<Self>) {
        let still = self
            .paused_run()
            .filter(|run| &run.run_id == run_id && run.paused_at_us == Some(paused_at_us));
        let Some(run) = still else {
            return;
        };
        let decisions = run
            .pending
            .iter()
            .map(|call| ToolDecision {
                tool_call_id: call.tool_call_id.clone(),
                confirmed: false,
                note: Some(TIMED_OUT.to_owned()),
            })
            .collect();
        tracing::info!(%run_id, session_id = %self.session_id, "approval timed out: the pending calls are denied");
        let command = DecideRun {
            run_id: run_id.clone(),
            decisions,
            decided_by: Some("turnstile".to_owned()),
        };
        ctx.address().do_send(DecideMsg(command));
    }

    /// What is wrong with `decisions` for `run` (`None`: each pending call decided
    /// once, and nothing else).
    fn check_decisions(run: &RunView, decisions: &[ToolDecision]) -> Option<String> {
        let mut seen = HashSet::new();
        for decision in decisions {
            if !run
                .pending
                .iter()
                .any(|call| call.tool_call_id == decision.tool_call_id)
            {
                return Some(format!(
                    "tool_call_id {:?} is not a pending call of run {}",
                    decision.tool_call_id, run.run_id
                ));
            }
            if !seen.insert(decision.tool_call_id.as_str()) {
                return Some(format!(
                    "tool_call_id {:?} is decided twice",
                    decision.tool_call_id
                ));
            }
        }
        run.pending
            .iter()
            .find(|call| !seen.contains(call.tool_call_id.as_str()))
            .map(|call| {
                format!(
                    "the pending call {} ({}) is left undecided: every pending call needs confirmed true or false",
                    call.tool_call_id, call.tool_name
                )
            })
    }
}

/// A decision admitted: the event that journals it, at the run's next index.
struct Admitted {
    run_id: RunId,
    index: EventIndex,
    continued: turnstile_journal::Event,
}

impl SessionActor {
    /// Whether `command` may be journaled now: the session is here, the run is paused
    /// and not being decided or cancelled, and each pending call is decided once.
    fn admit_decision(
        &mut self,
        command: DecideRun,
        ctx: &mut Context<Self>,
    ) -> Result<Result<Admitted, Refused>, RuntimeError> {
        if let Some(owner) = self.remote.clone() {
            return Err(self.elsewhere(&owner, ctx));
        }
        if let Some(error) = self.broken_error() {
            return Err(error);
        }
        self.ensure_fresh(ctx)?;
        let run_id = command.run_id.clone();
        let Some(run) = self.state.run(&run_id).filter(|run| self.state.owns(run)) else {
            // Not held: an ended run (its stored form says how), or none.
            return Ok(Err(
                match crate::reads::run_view(&self.shared.journal, &run_id) {
                    Ok(Some(run)) => Refused::NotPaused {
                        run_id,
                        status: run.status.as_str().to_owned(),
                    },
                    _ => Refused::UnknownRun { run_id },
                },
            ));
        };
        let ending = self.ending.contains(&run_id);
        if run.status != RunStatus::Paused || self.deciding.is_some() || ending {
            let status = match run.status {
                // Its cancellation is on its way to the journal.
                RunStatus::Paused if ending => "CANCELLED",
                // A decision on its way to the journal: the run is going on.
                RunStatus::Paused => "RUNNING",
                other => other.as_str(),
            };
            return Ok(Err(Refused::NotPaused {
                run_id,
                status: status.to_owned(),
            }));
        }
        if let Some(reason) = Self::check_decisions(run, &command.decisions) {
            return Ok(Err(Refused::InvalidDecision { reason }));
        }
        let index = EventIndex(run.event_count);
        let continued = self.identity(&run_id).emitted(
            index,
            RunEvent::Continued {
                decisions: command.decisions,
                decided_by: command.decided_by,
            },
        );
        Ok(Ok(Admitted {
            run_id,
            index,
            continued,
        }))
    }

    /// The decision is durable (or not): the run queues first to go on from its pause,
    /// or the actor reads the journal again (crash-only; the run stays paused unless
    /// the decision was taken).
    fn decided(
        &mut self,
        result: turnstile_journal::AppendResult,
        admitted: Admitted,
        live: crate::session::shared::Watch,
        ctx: &mut Context<Self>,
    ) -> Result<Result<Accepted, Refused>, RuntimeError> {
        self.deciding = None;
        let run_id = admitted.run_id;
        let records = match result {
            Ok(Ok(records)) => records,
            failure => {
                self.shared.remove_live(&run_id);
                self.stale = true;
                self.heal_later(ctx);
                return Err(match failure {
                    Err(error) => {
                        self.check_fenced(&error, ctx);
                        RuntimeError::from(error)
                    }
                    Ok(Err(conflict)) => RuntimeError::Conflict(conflict),
                    Ok(Ok(_)) => unreachable!("handled above"),
                });
            }
        };
        self.apply(&records);
        let from_seq = records.first().map(|record| record.seq).unwrap_or_default();
        // The run goes on first: it holds the session.
        self.queue.push_front(Queued {
            run_id: run_id.clone(),
            durable: true,
            resume: true,
        });
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        self.pump(ctx);
        Ok(Ok(Accepted {
            run_id,
            live,
            from_seq,
            from_index: admitted.index,
        }))
    }
}

impl Handler<DecideMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<Accepted, Refused>, RuntimeError>>;

    fn handle(&mut self, DecideMsg(command): DecideMsg, ctx: &mut Self::Context) -> Self::Result {
        self.last_active = Instant::now();
        if self.pause_unfolded(&command.run_id) || !self.unfolded.is_empty() {
            // Decided only against the whole fold of what is durable: its pause may not be
            // folded yet (a client may have seen it), or its end (a cancel) may be durable
            // behind a record still on its way here (the fault search found a decision
            // journaled after the run's end).
            return Box::pin(
                async { tokio::time::sleep(std::time::Duration::from_millis(2)).await }
                    .into_actor(self)
                    .then(move |(), actor, ctx| {
                        <Self as Handler<DecideMsg>>::handle(actor, DecideMsg(command), ctx)
                    }),
            );
        }
        let admitted = match self.admit_decision(command, ctx) {
            Ok(Ok(admitted)) => admitted,
            Ok(Err(refused)) => return Box::pin(fut::ready(Ok(Err(refused)))),
            Err(error) => return Box::pin(fut::ready(Err(error))),
        };
        self.deciding = Some(admitted.run_id.clone());
        let live = self.shared.ensure_live(&admitted.run_id).watch();
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        let continued = admitted.continued.clone();
        Box::pin(
            async move {
                journal
                    .append(&session_id, Expected::Any, vec![continued])
                    .await
            }
            .into_actor(self)
            .map(move |result, actor, ctx| actor.decided(result, admitted, live, ctx)),
        )
    }
}
