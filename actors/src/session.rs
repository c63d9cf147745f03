//! The session actor: one per session, one turn at a time.
//!
//! It rebuilds its state by folding its journal stream when it starts, resolves runs
//! that a stopped process left open, refuses a second turn while one is in flight
//! (with the running run's id), journals the start of each run before anyone sees it,
//! and journals the end of a run and frees the session in one step.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use serde_json::json;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use turnstile_harness::TurnRequest;
use turnstile_journal::limits::{RUN_BROADCAST_EVENTS, SESSION_MAILBOX_MESSAGES};
use turnstile_journal::{Event, EventIndex, Expected, Journal, Recorded, RunId, Seq, SessionId};
use turnstile_projections::SessionState;

use crate::run::{Finished, RunIdentity, RunTask, WireEvent, broadcast_wire};
use crate::runtime::{AgentSpec, Refused, RuntimeError, StartRun};

/// What every actor of one runtime shares.
pub(crate) struct Shared {
    pub journal: Journal,
    pub agents: HashMap<String, AgentSpec>,
    /// Live channels of runs in flight, so streams can join without asking the actor.
    pub live_runs: Mutex<HashMap<RunId, broadcast::Sender<Arc<WireEvent>>>>,
    pub accepting: AtomicBool,
}

impl Shared {
    pub(crate) fn live_run(&self, run_id: &RunId) -> Option<broadcast::Receiver<Arc<WireEvent>>> {
        self.live_runs
            .lock()
            .ok()?
            .get(run_id)
            .map(broadcast::Sender::subscribe)
    }

    fn remove_live(&self, run_id: &RunId) -> Option<broadcast::Sender<Arc<WireEvent>>> {
        self.live_runs.lock().ok()?.remove(run_id)
    }
}

struct InFlight {
    run_id: RunId,
    cancel: CancellationToken,
}

pub(crate) struct SessionActor {
    session_id: SessionId,
    shared: Arc<Shared>,
    state: SessionState,
    in_flight: Option<InFlight>,
    /// Set when the journal could not be read: the actor refuses work rather than guess.
    broken: Option<String>,
}

/// A run accepted and started.
pub(crate) struct Started {
    pub run_id: RunId,
    pub live: broadcast::Receiver<Arc<WireEvent>>,
    pub from_seq: Seq,
}

#[derive(Message)]
#[rtype(result = "Result<Result<Started, Refused>, RuntimeError>")]
pub(crate) struct StartRunMsg(pub StartRun);

#[derive(Message)]
#[rtype(result = "bool")]
pub(crate) struct CancelRunMsg(pub RunId);

#[derive(Message)]
#[rtype(result = "()")]
struct RunFinishedMsg(Finished);

impl SessionActor {
    pub(crate) fn new(session_id: SessionId, shared: Arc<Shared>) -> Self {
        SessionActor {
            state: SessionState::new(session_id.clone()),
            session_id,
            shared,
            in_flight: None,
            broken: None,
        }
    }

    fn identity(&self, run_id: &RunId, agent: &AgentSpec) -> RunIdentity {
        RunIdentity {
            run_id: run_id.clone(),
            session_id: self.session_id.clone(),
            agent_id: agent.id.clone(),
            agent_name: agent.name.clone(),
        }
    }

    /// Terminal events for runs with no owner: this actor was just created, so no task
    /// of this process runs them. (Issue 3 adds retry of such runs.)
    fn orphan_endings(&self) -> Vec<Event> {
        let mut events = Vec::new();
        for run in self.state.open_runs() {
            let identity = RunIdentity {
                run_id: run.run_id.clone(),
                session_id: self.session_id.clone(),
                agent_id: run.agent_id.clone(),
                agent_name: self
                    .shared
                    .agents
                    .get(&run.agent_id)
                    .map(|agent| agent.name.clone())
                    .unwrap_or_else(|| run.agent_id.clone()),
            };
            let message = "The turnstile process stopped while this run was in flight.";
            events.push(identity.emitted(
                EventIndex(run.event_count),
                "RunError",
                json!({"content": message, "error_type": "process_stopped"}),
            ));
            events.push(Event::RunFailed {
                run_id: run.run_id.clone(),
                error_type: "process_stopped".into(),
                message: message.into(),
                retryable: false,
            });
        }
        events
    }

    fn apply(&mut self, records: &[Arc<Recorded>]) {
        for record in records {
            self.state.apply(record);
        }
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(SESSION_MAILBOX_MESSAGES);
        let mut state = SessionState::new(self.session_id.clone());
        for record in self.shared.journal.read_session(&self.session_id, Seq(0)) {
            match record {
                Ok(record) => state.apply(&record),
                Err(error) => {
                    tracing::error!(session_id = %self.session_id, %error, "session stream unreadable");
                    self.broken = Some(error.to_string());
                    return;
                }
            }
        }
        self.state = state;
        let endings = self.orphan_endings();
        if endings.is_empty() {
            return;
        }
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        // `wait` holds back every command until the orphans are resolved.
        ctx.wait(
            async move { journal.append(&session_id, Expected::Any, endings).await }
                .into_actor(self)
                .map(|result, actor, _| match result {
                    Ok(Ok(records)) => actor.apply(&records),
                    Ok(Err(conflict)) => actor.broken = Some(conflict.to_string()),
                    Err(error) => actor.broken = Some(error.to_string()),
                }),
        );
    }
}

impl Handler<StartRunMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<Started, Refused>, RuntimeError>>;

    fn handle(
        &mut self,
        StartRunMsg(command): StartRunMsg,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        let refuse = |refused| -> Self::Result { Box::pin(fut::ready(Ok(Err(refused)))) };
        if let Some(reason) = &self.broken {
            return Box::pin(fut::ready(Err(RuntimeError::Internal(reason.clone()))));
        }
        if let Some(in_flight) = &self.in_flight {
            return refuse(Refused::Busy {
                session_id: self.session_id.clone(),
                run_id: in_flight.run_id.clone(),
            });
        }
        let Some(agent) = self.shared.agents.get(&command.agent_id).cloned() else {
            return refuse(Refused::UnknownAgent {
                agent_id: command.agent_id,
            });
        };
        if self.state.exists() && self.state.session.agent_id != agent.id {
            return refuse(Refused::AgentMismatch {
                session_id: self.session_id.clone(),
                agent_id: self.state.session.agent_id.clone(),
            });
        }
        let run_id = RunId::new_v7();
        let identity = self.identity(&run_id, &agent);
        let info = agent.harness.info();
        let mut events = Vec::with_capacity(4);
        if !self.state.exists() {
            events.push(Event::SessionCreated {
                agent_id: agent.id.clone(),
                user_id: command.user_id.clone(),
            });
        }
        events.push(Event::RunQueued {
            run_id: run_id.clone(),
            agent_id: agent.id.clone(),
            user_id: command.user_id.clone(),
            input: command.message.clone(),
            options: command.options.to_string(),
        });
        events.push(Event::RunStarted {
            run_id: run_id.clone(),
            model: info.model.clone(),
            model_provider: info.model_provider.clone(),
        });
        events.push(identity.emitted(
            EventIndex(0),
            "RunStarted",
            json!({"model": info.model, "model_provider": info.model_provider}),
        ));
        let cancel = CancellationToken::new();
        self.in_flight = Some(InFlight {
            run_id: run_id.clone(),
            cancel: cancel.clone(),
        });
        let (live, live_receiver) = broadcast::channel(RUN_BROADCAST_EVENTS);
        if let Ok(mut live_runs) = self.shared.live_runs.lock() {
            live_runs.insert(run_id.clone(), live.clone());
        }
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        let address = ctx.address();
        Box::pin(
            async move { journal.append(&session_id, Expected::Any, events).await }
                .into_actor(self)
                .map(move |result, actor, _| {
                    let records = match result {
                        Ok(Ok(records)) => records,
                        failure => {
                            actor.in_flight = None;
                            actor.shared.remove_live(&run_id);
                            return Err(match failure {
                                Err(error) => RuntimeError::from(error),
                                Ok(Err(conflict)) => RuntimeError::Internal(conflict.to_string()),
                                Ok(Ok(_)) => unreachable!("handled above"),
                            });
                        }
                    };
                    actor.apply(&records);
                    broadcast_wire(&live, &records);
                    let from_seq = records
                        .iter()
                        .find(|record| matches!(record.event, Event::RunQueued { .. }))
                        .map(|record| record.seq)
                        .unwrap_or_default();
                    let task = RunTask {
                        identity,
                        journal: actor.shared.journal.clone(),
                        harness: agent.harness.clone(),
                        request: TurnRequest {
                            run_id: run_id.clone(),
                            session_id: actor.session_id.clone(),
                            attempt: 1,
                            message: command.message,
                            harness_session_id: actor.state.session.harness_session_id.clone(),
                            transcript: actor.state.session.transcript.clone(),
                        },
                        cancel,
                        live,
                        next_index: EventIndex(1),
                    };
                    actix::spawn(async move {
                        let finished = task.drive().await;
                        // `do_send` ignores the mailbox bound: the end of a run is never dropped.
                        address.do_send(RunFinishedMsg(finished));
                    });
                    Ok(Ok(Started {
                        run_id,
                        live: live_receiver,
                        from_seq,
                    }))
                }),
        )
    }
}

impl Handler<RunFinishedMsg> for SessionActor {
    type Result = ();

    fn handle(&mut self, RunFinishedMsg(finished): RunFinishedMsg, ctx: &mut Self::Context) {
        self.apply(&finished.records);
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        let run_id = finished.run_id;
        ctx.spawn(
            async move {
                journal
                    .append(&session_id, Expected::Any, finished.terminal)
                    .await
            }
            .into_actor(self)
            .map(move |result, actor, _| {
                // Free the session before the client can see the end of the run.
                actor.in_flight = None;
                let live = actor.shared.remove_live(&run_id);
                match result {
                    Ok(Ok(records)) => {
                        actor.apply(&records);
                        if let Some(live) = live {
                            broadcast_wire(&live, &records);
                        }
                    }
                    Ok(Err(conflict)) => {
                        tracing::error!(%run_id, %conflict, "terminal event refused");
                    }
                    Err(error) => {
                        // The run stays open in the journal; recovery ends it.
                        tracing::error!(%run_id, %error, "terminal event not journaled");
                    }
                }
            }),
        );
    }
}

impl Handler<CancelRunMsg> for SessionActor {
    type Result = bool;

    fn handle(&mut self, CancelRunMsg(run_id): CancelRunMsg, _: &mut Self::Context) -> bool {
        match &self.in_flight {
            Some(in_flight) if in_flight.run_id == run_id => {
                in_flight.cancel.cancel();
                true
            }
            _ => false,
        }
    }
}
