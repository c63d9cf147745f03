//! The session's FIFO of turns and the worker slots: the head-of-line run is elected
//! first and only then takes a slot, so a turn waiting behind its session costs neither
//! an attempt nor a slot; the head's run task is started here.

use crate::history::{branch_history, render_prompt};
use crate::run::{RunIdentity, RunTask, WorkspaceRun};
use crate::session::end::RunFinishedMsg;
use crate::session::fold::RecordsAppended;
use crate::session::{InFlight, SessionActor};
use crate::{AgentSpec, reads};
use actix::prelude::*;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio_util::sync::CancellationToken;
use turnstile_harness::TurnRequest;
use turnstile_journal::{Event, EventIndex, RunEvent, RunId, Warning};
use turnstile_projections::RunView;

/// How soon a head whose acceptance is not folded yet is elected again.
const RETRY_ELECTION: std::time::Duration = std::time::Duration::from_millis(2);

impl SessionActor {
    /// The run the session is busy with: the one running, else the head of the queue.
    /// What a new turn would wait for. A run whose end is being journaled does not
    /// count: its client may already have read that end (from the journal) and sent the
    /// next turn, which queues and starts as soon as the end is applied.
    pub(super) fn busy_for_a_new_turn(&self) -> Option<&RunId> {
        self.in_flight
            .as_ref()
            .filter(|f| !f.ending)
            .map(|f| &f.run_id)
            .or_else(|| self.queue.front().map(|q| &q.run_id))
            .or_else(|| self.paused_for_a_new_turn())
    }

    pub(super) fn busy_with(&self) -> Option<&RunId> {
        self.in_flight
            .as_ref()
            .map(|f| &f.run_id)
            .or_else(|| self.queue.front().map(|q| &q.run_id))
            .or_else(|| self.held_paused())
    }

    /// The paused run, unless its end is being journaled (a cancel): a paused run
    /// holds its session until it is continued and ends.
    fn paused_for_a_new_turn(&self) -> Option<&RunId> {
        self.held_paused()
            .filter(|run_id| !self.ending.contains(*run_id))
    }

    /// Elects the head of the queue when the session is free, then waits for a slot.
    pub(super) fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.is_some()
            || self.electing
            || self.compacting
            || self.broken.is_some()
            || self.unavailable.is_some()
        {
            return;
        }
        // Nothing to start (a run's end often leaves nothing queued): a lease given back
        // with that end stays given back; the command that brings work takes it again.
        if !self.stale && !self.queue.front().is_some_and(|head| head.durable) {
            return;
        }
        if let Err(error) = self.ensure_fresh(ctx) {
            // The journal cannot be read now: the next command (or recovery) tries again.
            tracing::warn!(session_id = %self.session_id, %error, "session state not read again");
            return;
        }
        if !self.queue.front().is_some_and(|head| head.durable) {
            return;
        }
        if let Some(held) = self.held_paused()
            && self.queue.front().is_none_or(|head| &head.run_id != held)
        {
            // The paused run holds the session: the turns behind it wait for its end (its
            // own continuation, decided, goes first; see `take_head`).
            return;
        }
        self.electing = true;
        let slots = self.shared.slots.clone();
        ctx.spawn(
            async move { slots.acquire_owned().await }
                .into_actor(self)
                .map(|permit, actor, ctx| {
                    actor.electing = false;
                    if let Ok(permit) = permit {
                        actor.start_head(permit, ctx);
                    }
                }),
        );
    }

    /// The head to start with its run, when it may start now: the head may have been
    /// cancelled while it waited for the slot, and the one now at the front may not be
    /// durable yet (its acceptance elects it once it is).
    fn take_head(&mut self, ctx: &mut Context<Self>) -> Option<(super::Queued, RunView)> {
        if !self.queue.front().is_some_and(|head| head.durable) {
            return None;
        }
        let head = self.queue.pop_front()?;
        self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        self.last_active = Instant::now();
        let Some(run) = self.state.run(&head.run_id).cloned() else {
            if !self.unfolded.is_empty() {
                // Its acceptance is durable but not folded yet (a record before it is
                // still on its way here): it keeps its place and is elected again soon
                // (the slot is given back when the election returns). Dropped, it was left open in the journal with
                // no one to run it, and a deletion could pass it (found by the fault search).
                self.queue.push_front(head);
                self.shared.queued.fetch_add(1, Ordering::SeqCst);
                ctx.run_later(RETRY_ELECTION, |actor, ctx| actor.pump(ctx));
                return None;
            }
            tracing::error!(run_id = %head.run_id, "queued run missing from the session state");
            self.pump(ctx);
            return None;
        };
        if run.status == turnstile_projections::RunStatus::Paused {
            // A continued run whose decision is durable but not folded yet: it keeps its
            // place and is elected again soon (started now, it would not carry it out).
            self.queue.push_front(head);
            self.shared.queued.fetch_add(1, Ordering::SeqCst);
            ctx.run_later(RETRY_ELECTION, |actor, ctx| actor.pump(ctx));
            return None;
        }
        Some((head, run))
    }

    pub(super) fn start_head(
        &mut self,
        slot: tokio::sync::OwnedSemaphorePermit,
        ctx: &mut Context<Self>,
    ) {
        let Some((head, run)) = self.take_head(ctx) else {
            return;
        };
        let identity = self.identity(&run.run_id);
        let Some(agent) = self.shared.agents.get(&run.agent_id).cloned() else {
            return self.pump(ctx);
        };
        let cancel = CancellationToken::new();
        let (staged, staging, changed_files) = self.stage_attachments(&run, &agent);
        self.in_flight = Some(InFlight {
            run_id: run.run_id.clone(),
            ending: false,
            cancel: cancel.clone(),
            staged,
        });
        let live = self.shared.ensure_live(&run.run_id).events;
        let (mut events, next_index) =
            self.start_events(&run, head.resume, &identity, &agent, changed_files);
        let (harness_session_id, transcript) =
            self.harness_session_for(&run, head.resume, &mut events);
        let output_schema = output_schema_of(&run);
        let workdir = workdir_of(&agent, &self.session_id);
        let task = RunTask {
            identity,
            journal: self.shared.journal.clone(),
            harness: agent.harness.clone(),
            request: TurnRequest {
                run_id: run.run_id.clone(),
                session_id: self.session_id.clone(),
                attempt: run.attempts + 1,
                message: match &staging {
                    Ok(note) => format!("{}{note}", run.input),
                    Err(_) => run.input.clone(),
                },
                harness_session_id,
                transcript,
                output_schema: output_schema.as_ref().map(|schema| schema.to_string()),
                cwd: Some(workdir.clone()),
                settled: None,
                approvals: agent.approval.tools.clone(),
                paused_before: run.tools.iter().any(|tool| tool.requires_confirmation),
                decisions: decisions_of(&run),
            },
            unspent_attempts: run.unspent_attempts,
            usage_wait: agent.approval.usage_wait(),
            usage_wait_until_us: run.usage_wait_until_us,
            policy: agent.retry,
            cancel,
            live: live.clone(),
            next_index,
            slot,
            fallback_prompt: self.fallback_prompt(&run),
            model: model_of(&agent),
            output_schema: output_schema.clone(),
            staging_error: staging.err(),
            // The start goes into the journal with the turn's first events: one sync
            // fewer per turn. A stop before it leaves the run queued, as it was.
            start_events: events,
            appended: {
                let address = ctx.address();
                Box::new(move |records| address.do_send(RecordsAppended(records)))
            },
            journal_failed: false,
            fenced: false,
            workspace: self.workspace_run(&agent, &run, head.resume, &workdir),
        };
        let address = ctx.address();
        actix::spawn(async move {
            let finished = task.drive().await;
            // `do_send` ignores the mailbox bound: the end of a run is never dropped.
            address.do_send(RunFinishedMsg(finished));
        });
    }

    /// The session's workspace lent to a turn, with snapshots on.
    fn workspace_run(
        &mut self,
        agent: &AgentSpec,
        run: &RunView,
        resume: bool,
        workdir: &std::path::Path,
    ) -> Option<WorkspaceRun> {
        let bounds = agent.snapshots.clone()?;
        Some(WorkspaceRun {
            tracker: self.workspace.take(),
            root: workdir.to_path_buf(),
            bounds,
            // A continuation's rewind is journaled with its start: not again on a resume.
            rewind: run.fork.clone().filter(|_| !resume),
            warned: Default::default(),
            broken: false,
        })
    }

    /// The events a turn starts with, journaled with its first harness events: its
    /// start (not again for a resumed run, which gets a retry warning instead) and a
    /// warning that kept attachments changed.
    fn start_events(
        &self,
        run: &RunView,
        resume: bool,
        identity: &RunIdentity,
        agent: &AgentSpec,
        changed_files: Vec<String>,
    ) -> (Vec<Event>, EventIndex) {
        let mut next_index = EventIndex(run.event_count);
        let mut events = Vec::new();
        if !resume {
            let info = agent.harness.info();
            events.push(Event::RunStarted {
                run_id: run.run_id.clone(),
                model: info.model.clone(),
                model_provider: info.model_provider.clone(),
            });
            events.push(identity.emitted(
                next_index,
                RunEvent::Started {
                    model: info.model.clone(),
                    model_provider: info.model_provider.clone(),
                },
            ));
            next_index = next_index.next();
        }
        // A run in flight when its process stopped resumes with a new attempt: a retry,
        // said as any other between its attempts (#32). A run continued after its pause
        // or a usage limit's wait goes on without one (its `RunContinued` or warning said so).
        let waited = run.continued || run.usage_wait_until_us.is_some();
        if resume && run.attempts >= 1 && !waited {
            let attempt = run.attempts;
            let attempts = agent.retry.max_attempts();
            events.push(identity.emitted(
                next_index,
                RunEvent::Warning {
                    warning: Warning::Retry {
                        attempt,
                        attempts,
                        delay_s: 0.0,
                        error_type: "process_stopped".into(),
                        message: format!(
                            "The turnstile process stopped during attempt {attempt}; attempt {} of {attempts} resumes the harness session.",
                            attempt + 1
                        ),
                    },
                },
            ));
            next_index = next_index.next();
        }
        if !changed_files.is_empty() {
            events.push(identity.emitted(
                next_index,
                RunEvent::Warning {
                    warning: Warning::AttachmentsChanged {
                        files: changed_files,
                    },
                },
            ));
            next_index = next_index.next();
        }
        (events, next_index)
    }

    /// The harness session a turn runs on, and its transcript. A continuation runs on
    /// a fork of the source's harness session that keeps the transcript up to the
    /// continuation point (the fork is journaled with the turn's start); every other
    /// run resumes the newest branch. The lines are read from the journal only if the
    /// harness asks.
    fn harness_session_for(
        &self,
        run: &RunView,
        resume: bool,
        events: &mut Vec<Event>,
    ) -> (Option<String>, turnstile_harness::Transcript) {
        let (harness_session_id, source, kept) = match (&run.fork, resume) {
            (Some(fork), false) => {
                let forked_id = uuid::Uuid::now_v7().to_string();
                let kept = self
                    .state
                    .session
                    .lines_of(&fork.harness_session_id)
                    .min(fork.transcript_lines);
                events.push(Event::HarnessSessionForked {
                    run_id: run.run_id.clone(),
                    from_run_id: fork.from_run_id.clone(),
                    message_index: fork.message_index,
                    from_harness_session_id: fork.harness_session_id.clone(),
                    harness_session_id: forked_id.clone(),
                    transcript_lines: kept,
                });
                (Some(forked_id), Some(fork.harness_session_id.clone()), kept)
            }
            _ => {
                let current = self.state.session.harness_session_id.clone();
                (
                    current.clone(),
                    current,
                    self.state.session.transcript_len(),
                )
            }
        };
        let transcript = match source {
            Some(source) if kept > 0 => {
                let journal = self.shared.journal.clone();
                let session_id = self.session_id.clone();
                turnstile_harness::Transcript::lazy(kept as usize, move || {
                    let mut lines = reads::transcript(&journal, &session_id, &source)
                        .map_err(|error| error.to_string())?;
                    // Lines journaled since the turn began are this turn's own.
                    lines.truncate(kept as usize);
                    Ok(lines)
                })
            }
            _ => turnstile_harness::Transcript::default(),
        };
        (harness_session_id, transcript)
    }

    /// The prompt that replays the branch's history, rendered only if the harness
    /// session cannot be resumed (a continuation has its fork instead).
    fn fallback_prompt(&self, run: &RunView) -> Option<crate::run::FallbackPrompt> {
        match run.fork {
            Some(_) => None,
            None => {
                let journal = self.shared.journal.clone();
                let current = run.clone();
                Some(Box::new(move || {
                    let load = |run_id: &RunId| reads::branch_run(&journal, run_id);
                    render_prompt(&branch_history(load, &current), &current.input)
                }))
            }
        }
    }
}

/// The decisions a run's next attempt carries out (its calls decided after a pause).
fn decisions_of(run: &RunView) -> Vec<turnstile_harness::Decision> {
    run.decisions
        .iter()
        .map(|decided| turnstile_harness::Decision {
            tool: decided.tool.clone(),
            confirmed: decided.confirmed,
            note: decided.note.clone(),
        })
        .collect()
}

/// The run's output schema, from its options, when it is an object.
fn output_schema_of(run: &RunView) -> Option<serde_json::Value> {
    run.options
        .output_schema
        .as_deref()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        .filter(|schema| schema.is_object())
}

/// The agent's model and its provider, as its harness names them.
fn model_of(agent: &AgentSpec) -> (String, String) {
    let info = agent.harness.info();
    (info.model, info.model_provider)
}

/// The directory a session's turn runs in; with `workspace = "session"` it is made
/// on the session's first turn (a harness that cannot work there says so itself).
fn workdir_of(
    agent: &crate::api::AgentSpec,
    session_id: &turnstile_journal::SessionId,
) -> std::path::PathBuf {
    let workdir = agent.workdir(session_id);
    if agent.workspace == crate::api::Workspace::Session
        && let Err(error) = std::fs::create_dir_all(&workdir)
    {
        tracing::warn!(workdir = %workdir.display(), %error, "the session's workspace cannot be made");
    }
    workdir
}
