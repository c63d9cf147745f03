//! The commands of the embedding API: start, cancel, continue, compact and delete,
//! each a round trip to the session's actor in a task of its own.

use crate::api::{
    CompactOutcome, ContinueFrom, ContinueRun, DecideRun, Multitask, Refused, RuntimeError,
    StartRun,
};
use crate::runtime::cluster::ELSEWHERE_WAIT;
use crate::runtime::replica::{ReplicaCommand, ReplicaReply, refusal_of};
use crate::{RunHandle, Runtime};
use actix::prelude::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use turnstile_journal::{EventIndex, RunId, SessionId};
use turnstile_projections::{ForkPoint, RunStatus, RunView};

use crate::registry::GetSession;
use crate::session::{
    Accepted, CancelRunMsg, CompactMsg, DecideMsg, DeleteSessionMsg, SessionActor, StartRunMsg,
};
use crate::stream::RunEvents;

/// Where a command for a session was carried out ([`Runtime::on_owner`]).
enum Carried<T> {
    /// By this replica's actor.
    Here(T),
    /// By the replica that owns the session, which replied.
    There(ReplicaReply),
    /// The owner never replied in time (this one).
    Silent(String),
}

impl Runtime {
    /// The handle on a run its session's actor accepted, its events from index 0.
    fn accepted_handle(&self, session_id: SessionId, accepted: Accepted) -> RunHandle {
        let mut events = RunEvents::new(
            self.journal().clone(),
            session_id.clone(),
            accepted.run_id.clone(),
            accepted.from_seq,
            Some(accepted.live.events),
            accepted.from_index,
        );
        if accepted.from_index == EventIndex(0) {
            // A new run: every one of its events is sent after this subscription.
            events.subscribed_before_its_events();
        }
        RunHandle {
            events,
            run_id: accepted.run_id,
            session_id,
            reused: false,
            ended: Some(accepted.live.ended),
            runtime: self.clone(),
        }
    }

    /// A turn for a session another replica owns: refused as busy there, handed to the
    /// owner to enqueue, or asked again (`None`) while the owner gives the session back;
    /// past `deadline` the owner is silent.
    async fn start_elsewhere(
        &self,
        command: &StartRun,
        session_id: &SessionId,
        owner: String,
        busy: Option<RunId>,
        deadline: Instant,
    ) -> Result<Option<Result<RunHandle, Refused>>, RuntimeError> {
        match (command.multitask, busy) {
            // The same refusal as on the owner: one turn at a time.
            (Multitask::Reject, Some(run_id)) => {
                return Ok(Some(Err(Refused::Busy {
                    session_id: session_id.clone(),
                    run_id,
                })));
            }
            (Multitask::Enqueue, _) => {
                if let Some(forwarded) = self.forward_start(session_id, &owner, command).await? {
                    return Ok(Some(forwarded));
                }
            }
            // Idle on its owner, which is giving it back: ask again.
            (Multitask::Reject, None) => {}
        }
        if Instant::now() >= deadline {
            return Err(RuntimeError::OwnerSilent {
                session_id: session_id.clone(),
                owner,
                detail: ", which does not take the turn",
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(None)
    }

    /// Accepts a run: returns once `RunQueued` is in the journal. The run starts when
    /// its session is free and a worker slot is; with [`Multitask::Reject`](crate::Multitask::Reject) a busy
    /// session refuses at once with the id of the run it is busy with.
    pub async fn start_run(
        &self,
        command: StartRun,
    ) -> Result<Result<RunHandle, Refused>, RuntimeError> {
        if !self.inner.shared.accepting.load(Ordering::SeqCst) {
            return Ok(Err(Refused::ShuttingDown));
        }
        if self.agent(&command.agent_id).is_none() {
            return Ok(Err(Refused::UnknownAgent {
                agent_id: command.agent_id,
            }));
        }
        if let Err(refused) = check_attachments(&command) {
            return Ok(Err(refused));
        }
        if let (Some(agent), Some(session_id)) =
            (self.agent(&command.agent_id), &command.session_id)
            && let Some(reason) = agent.unsafe_session_id(session_id)
        {
            return Ok(Err(Refused::InvalidInput { reason }));
        }
        let runtime = self.clone();
        tokio::spawn(async move {
            let _serialized = match &command.idempotency_key {
                Some(key) => {
                    let guard = runtime.inner.idempotent.lock().await;
                    if let Some(run_id) = runtime.journal().run_of_idempotency_key(key)?
                        && let Some(mut handle) = runtime.handle_of(&run_id)?
                    {
                        handle.reused = true;
                        return Ok(Ok(handle));
                    }
                    Some(guard)
                }
                None => None,
            };
            let session_id = command.session_id.clone().unwrap_or_else(SessionId::new_v7);
            let mut command = command;
            command.session_id = Some(session_id.clone());
            let deadline = Instant::now() + ELSEWHERE_WAIT;
            let accepted = loop {
                let session = runtime
                    .inner
                    .registry
                    .send(GetSession(session_id.clone()))
                    .await?;
                let answer = match session.send(StartRunMsg(command.clone())).await {
                    Ok(answer) => answer,
                    // The actor stopped (it gave its lease back) between lookup and send.
                    Err(MailboxError::Closed)
                        if Instant::now() < deadline
                            && runtime.inner.shared.accepting.load(Ordering::SeqCst) =>
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    Err(error) => return Err(error.into()),
                };
                match answer {
                    Ok(Ok(accepted)) => break accepted,
                    Ok(Err(refused)) => return Ok(Err(refused)),
                    Err(RuntimeError::Elsewhere { owner, busy, .. }) => {
                        if let Some(answer) = runtime
                            .start_elsewhere(&command, &session_id, owner, busy, deadline)
                            .await?
                        {
                            return Ok(answer);
                        }
                    }
                    Err(error) => return Err(error),
                }
            };
            Ok(Ok(runtime.accepted_handle(session_id, accepted)))
        })
        .await
        .map_err(RuntimeError::from)?
    }

    /// A handle on an existing run, its events from index 0.
    pub(super) fn handle_of(&self, run_id: &RunId) -> Result<Option<RunHandle>, RuntimeError> {
        let Some(events) = self.run_events(run_id, None)? else {
            return Ok(None);
        };
        let Some(view) = self.run_view(run_id)? else {
            return Ok(None);
        };
        Ok(Some(RunHandle {
            run_id: view.run_id,
            session_id: view.session_id,
            reused: false,
            events,
            ended: None,
            runtime: self.clone(),
        }))
    }

    /// Asks the run's session to cancel it; `true` when a run in flight was signalled.
    /// On a shared journal a session another replica owns is asked through it.
    pub async fn cancel_run(&self, run_id: &RunId) -> Result<bool, RuntimeError> {
        let Some(session_id) = self.journal().session_of_run(run_id)? else {
            return Ok(false);
        };
        // A paused run has no task to stop: its end is journaled at once, and the
        // answer waits for it, so that a read after the cancel sees it ended.
        let paused = self
            .run_head(run_id)?
            .is_some_and(|head| head.status == RunStatus::Paused);
        let cancelled = self.ask_to_cancel(run_id, &session_id).await?;
        if cancelled && paused {
            let deadline = Instant::now() + ELSEWHERE_WAIT;
            while Instant::now() < deadline
                && self
                    .run_head(run_id)?
                    .is_some_and(|head| !head.status.is_terminal())
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        Ok(cancelled)
    }

    /// [`Runtime::cancel_run`]'s request to the session's actor (or its owner).
    async fn ask_to_cancel(
        &self,
        run_id: &RunId,
        session_id: &SessionId,
    ) -> Result<bool, RuntimeError> {
        let here = || CancelRunMsg(run_id.clone());
        let there = || ReplicaCommand::Cancel(run_id.clone());
        Ok(match self.on_owner(session_id, here, there).await? {
            Carried::Here(cancelled) | Carried::There(ReplicaReply::Cancelled { cancelled }) => {
                cancelled
            }
            Carried::There(_) | Carried::Silent(_) => false,
        })
    }

    /// Sends `message()` to the session's actor; when another replica owns the session,
    /// hands `forward()` to that owner, and asks again while the owner does not answer
    /// (it may have died: the session is free then, or soon), until the wait's end.
    async fn on_owner<M, T>(
        &self,
        session_id: &SessionId,
        message: impl Fn() -> M,
        forward: impl Fn() -> ReplicaCommand,
    ) -> Result<Carried<T>, RuntimeError>
    where
        M: Message<Result = Result<T, RuntimeError>> + Send + 'static,
        T: Send + 'static,
        SessionActor: Handler<M>,
    {
        let deadline = Instant::now() + ELSEWHERE_WAIT;
        loop {
            let owner = match self.ask_session(session_id.clone(), message()).await {
                Ok(Ok(done)) => return Ok(Carried::Here(done)),
                Ok(Err(RuntimeError::Elsewhere { owner, .. })) => owner,
                Ok(Err(error)) => return Err(error),
                // The actor stopped (it gave its lease back) between lookup and send.
                Err(RuntimeError::Stopped)
                    if Instant::now() < deadline
                        && self.inner.shared.accepting.load(Ordering::SeqCst) =>
                {
                    continue;
                }
                Err(error) => return Err(error),
            };
            if let Some(reply) = self.ask_replica(session_id, &owner, forward()).await? {
                return Ok(Carried::There(reply));
            }
            if Instant::now() >= deadline {
                return Ok(Carried::Silent(owner));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Sends `message` to the session's actor from a detached task, so that a caller
    /// who gives up (a dropped HTTP request) never cancels it half-way.
    pub(super) async fn ask_session<M>(
        &self,
        session_id: SessionId,
        message: M,
    ) -> Result<M::Result, RuntimeError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        SessionActor: Handler<M>,
    {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let session = inner.registry.send(GetSession(session_id)).await?;
            Ok(session.send(message).await?)
        })
        .await
        .map_err(RuntimeError::from)?
    }

    /// Continues a finished run from one of its checkpoints as a new run with fork
    /// lineage; the finished run is never rewritten. The new run's harness session is a
    /// fork that remembers only what happened up to the continuation point.
    pub async fn continue_run(
        &self,
        command: ContinueRun,
    ) -> Result<Result<RunHandle, Refused>, RuntimeError> {
        let Some(source) = self.run_view(&command.run_id)? else {
            return Ok(Err(Refused::UnknownRun {
                run_id: command.run_id,
            }));
        };
        let refuse = |reason: &str| {
            Ok(Err(Refused::NotContinuable {
                run_id: source.run_id.clone(),
                reason: reason.to_owned(),
            }))
        };
        match source.status {
            RunStatus::Cancelled => return refuse("the run is cancelled"),
            RunStatus::Pending | RunStatus::Running => return refuse("the run has not finished"),
            RunStatus::Paused => {
                return refuse(
                    "the run is paused: continue it with tools, deciding each pending call",
                );
            }
            RunStatus::Completed | RunStatus::Error => {}
        }
        let Some(harness_session_id) = source.harness_session_id.clone() else {
            return refuse("the run never reached its harness");
        };
        let (index, transcript_lines, message) = match continue_point(&source, &command) {
            Ok(point) => point,
            Err(reason) => return refuse(&reason),
        };
        let fork = ForkPoint {
            from_run_id: source.run_id.clone(),
            message_index: index,
            harness_session_id,
            transcript_lines,
        };
        self.start_run(StartRun {
            agent_id: source.agent_id.clone(),
            session_id: Some(source.session_id.clone()),
            user_id: command.user_id.or(source.user_id.clone()),
            message,
            options: command.options,
            multitask: command.multitask,
            idempotency_key: None,
            fork: Some(fork),
            attachments: Vec::new(),
            isolated: false,
        })
        .await
    }

    /// Decides a paused run's tool calls (`spec/approvals.md`): once the decision is
    /// journaled the same run goes on, its events from its `RunContinued`. On a shared
    /// journal a session another replica owns is decided through it.
    pub async fn decide_run(
        &self,
        command: DecideRun,
    ) -> Result<Result<RunHandle, Refused>, RuntimeError> {
        let Some(session_id) = self.journal().session_of_run(&command.run_id)? else {
            return Ok(Err(Refused::UnknownRun {
                run_id: command.run_id,
            }));
        };
        let here = || DecideMsg(command.clone());
        let there = || ReplicaCommand::Decide(Box::new(command.clone()));
        match self.on_owner(&session_id, here, there).await? {
            Carried::Here(Ok(accepted)) => Ok(Ok(self.accepted_handle(session_id, accepted))),
            Carried::Here(Err(refused)) => Ok(Err(refused)),
            Carried::There(ReplicaReply::Continued {
                run_id,
                from_seq,
                from_index,
            }) => {
                let events = RunEvents::new(
                    self.journal().clone(),
                    session_id.clone(),
                    run_id.clone(),
                    turnstile_journal::Seq(from_seq),
                    None,
                    EventIndex(from_index),
                );
                Ok(Ok(RunHandle {
                    events,
                    run_id,
                    session_id,
                    reused: false,
                    ended: None,
                    runtime: self.clone(),
                }))
            }
            Carried::There(ReplicaReply::Refused { refused }) => {
                Ok(Err(refusal_of(&refused, &session_id)))
            }
            Carried::There(other) => Err(RuntimeError::ReplicaReply(other.to_wire())),
            Carried::Silent(owner) => Err(RuntimeError::OwnerSilent {
                session_id,
                owner,
                detail: ", which does not take the decision",
            }),
        }
    }

    /// Compacts the session's harness session; refused while a run is in flight.
    pub async fn compact_session(
        &self,
        agent_id: &str,
        session_id: &SessionId,
    ) -> Result<Result<CompactOutcome, Refused>, RuntimeError> {
        let Some(state) = self.session(session_id)? else {
            return Ok(Err(Refused::UnknownSession {
                session_id: session_id.clone(),
            }));
        };
        if state.session.agent_id != agent_id {
            return Ok(Err(Refused::AgentMismatch {
                session_id: session_id.clone(),
                agent_id: state.session.agent_id,
            }));
        }
        self.ask_owner(session_id, || CompactMsg).await
    }

    /// Deletes a session: a tombstone event; afterwards the session and its runs read
    /// as gone while the journal keeps them. `false` when there is no such session;
    /// refused while the session has a run in flight or queued.
    pub async fn delete_session(
        &self,
        session_id: &SessionId,
    ) -> Result<Result<bool, Refused>, RuntimeError> {
        if self.session(session_id)?.is_none() {
            return Ok(Ok(false));
        }
        self.ask_owner(session_id, || DeleteSessionMsg).await
    }
}

/// Where a continuation of `source` starts: the message index, the transcript lines
/// kept, and the new turn's message; `Err` says why it cannot.
fn continue_point(source: &RunView, command: &ContinueRun) -> Result<(u32, u32, String), String> {
    let message_count = source.message_count();
    let index = match command.continue_from {
        ContinueFrom::End => message_count,
        ContinueFrom::LastUser => 1,
        ContinueFrom::MessageIndex(index) if index <= message_count => index,
        ContinueFrom::MessageIndex(index) => {
            return Err(format!(
                "message index {index} is past the run's {message_count} messages"
            ));
        }
    };
    Ok(if index == 0 {
        let Some(input) = command.input.clone() else {
            return Err("continuing from message 0 needs an input".to_owned());
        };
        (0, source.transcript_start, input)
    } else if index == 1 && command.input.is_none() {
        // Replay: the turn again, from before its user message.
        (1, source.transcript_start, source.input.clone())
    } else {
        let prompt = command
            .input
            .clone()
            .unwrap_or_else(|| "Continue from where you left off.".to_owned());
        match source
            .checkpoints
            .iter()
            .find(|checkpoint| checkpoint.message_index >= index)
        {
            Some(checkpoint)
                if checkpoint.message_index < message_count || index < message_count =>
            {
                (
                    checkpoint.message_index,
                    checkpoint.transcript_lines,
                    prompt,
                )
            }
            _ => (message_count, source.transcript_end, prompt),
        }
    })
}

/// Attachments' names: plain file names, none twice.
fn check_attachments(command: &StartRun) -> Result<(), Refused> {
    let mut names = std::collections::HashSet::new();
    for attachment in &command.attachments {
        if let Err(error) = crate::uploads::check_name(&attachment.name) {
            return Err(Refused::InvalidInput {
                reason: error.to_string(),
            });
        }
        if !names.insert(attachment.name.as_str()) {
            return Err(Refused::InvalidInput {
                reason: format!("two attachments are named {:?}", attachment.name),
            });
        }
    }
    Ok(())
}
