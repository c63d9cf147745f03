//! Commands that start or stop a turn: a turn accepted by journaling `RunQueued` (with
//! the multitask policy and idempotency keys), a run cancelled queued or running.

use crate::session::{Accepted, CancelRunMsg, Queued, SessionActor, StartRunMsg};
use actix::prelude::*;
use std::sync::atomic::Ordering;
use std::time::Instant;
use turnstile_journal::{Event, EventIndex, Expected, RunId};

use crate::api::{Multitask, Refused, RuntimeError};
use crate::run::cancelled_events;

impl Handler<StartRunMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<Accepted, Refused>, RuntimeError>>;

    fn handle(
        &mut self,
        StartRunMsg(command): StartRunMsg,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        let refuse = |refused| -> Self::Result { Box::pin(fut::ready(Ok(Err(refused)))) };
        self.last_active = Instant::now();
        if let Some(owner) = self.remote.clone() {
            return Box::pin(fut::ready(Err(self.elsewhere(&owner, ctx))));
        }
        if let Some(error) = self.broken_error() {
            return Box::pin(fut::ready(Err(error)));
        }
        if let Err(error) = self.ensure_fresh(ctx) {
            return Box::pin(fut::ready(Err(error)));
        }
        if self.compacting && command.multitask == Multitask::Reject {
            return refuse(Refused::Compacting {
                session_id: self.session_id.clone(),
            });
        }
        if command.multitask == Multitask::Reject
            && let Some(run_id) = self.busy_for_a_new_turn()
        {
            return refuse(Refused::Busy {
                session_id: self.session_id.clone(),
                run_id: run_id.clone(),
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
        let queued = self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if queued >= self.shared.max_queued_runs {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return refuse(Refused::QueueFull {
                limit: self.shared.max_queued_runs,
            });
        }
        let run_id = RunId::new_v7();
        let mut events = Vec::with_capacity(3);
        // Concurrent first turns: only the first journals the session's creation.
        if !self.state.exists() && !self.creating {
            self.creating = true;
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
            options: match &command.fork {
                Some(fork) => {
                    let mut options = command.options.clone();
                    options["fork"] = serde_json::to_value(fork).unwrap_or_default();
                    options.to_string()
                }
                None => command.options.to_string(),
            },
        });
        if let Some(key) = &command.idempotency_key {
            events.push(Event::IdempotencyKeyBound {
                key: key.clone(),
                run_id: run_id.clone(),
            });
        }
        // The bytes go into the journal with the run: any later turn or machine can stage them.
        for attachment in &command.attachments {
            events.push(Event::AttachmentAdded {
                run_id: run_id.clone(),
                name: attachment.name.clone(),
                media_type: attachment.media_type.clone(),
                sha256: crate::uploads::sha256_hex(&attachment.bytes),
                content: attachment.bytes.clone(),
            });
        }
        // The append is queued to the journal here, in the handler, so the journal's
        // order of `RunQueued` is the order of this queue (issue 13: queued from a
        // future polled later, 1,000 concurrent starts ran out of journal order).
        let append =
            match self
                .shared
                .journal
                .append_in_order(&self.session_id, Expected::Any, events)
            {
                Ok(Ok(append)) => append,
                Ok(Err(_full)) => {
                    self.creating = false;
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    return refuse(Refused::QueueFull {
                        limit: turnstile_journal::limits::APPEND_QUEUE_REQUESTS_MAX,
                    });
                }
                Err(error) => {
                    // Nothing of the request was recorded: the session is as before.
                    self.creating = false;
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    if let turnstile_journal::Error::TooLarge { kind, bytes, limit } = error {
                        let field = match kind {
                            "AttachmentAdded" => "files",
                            "IdempotencyKeyBound" => "idempotency_key",
                            _ => "message",
                        };
                        return refuse(Refused::EventTooLarge {
                            field,
                            kind,
                            bytes,
                            limit,
                        });
                    }
                    self.stale = true;
                    self.heal_later(ctx);
                    return Box::pin(fut::ready(Err(RuntimeError::from(error))));
                }
            };
        // Queued before the append returns, so that a concurrent start sees the session busy.
        self.queue.push_back(Queued {
            run_id: run_id.clone(),
            durable: false,
            resume: false,
        });
        let live = self.shared.ensure_live(&run_id).subscribe();
        Box::pin(append.into_actor(self).map(move |result, actor, ctx| {
            actor.creating = false;
            let accepted = match result {
                Ok(Ok(records)) => records,
                failure => {
                    actor.stale = true;
                    actor.heal_later(ctx);
                    actor.queue.retain(|queued| queued.run_id != run_id);
                    actor.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    actor.shared.remove_live(&run_id);
                    return Err(match failure {
                        Err(error) => {
                            actor.check_fenced(&error, ctx);
                            RuntimeError::from(error)
                        }
                        Ok(Err(conflict)) => RuntimeError::Internal(conflict.to_string()),
                        Ok(Ok(_)) => unreachable!("handled above"),
                    });
                }
            };
            actor.apply(&accepted);
            if let Some(queued) = actor
                .queue
                .iter_mut()
                .find(|queued| queued.run_id == run_id)
            {
                queued.durable = true;
            }
            let from_seq = accepted
                .iter()
                .find(|record| matches!(record.event, Event::RunQueued { .. }))
                .map(|record| record.seq)
                .unwrap_or_default();
            actor.pump(ctx);
            Ok(Ok(Accepted {
                run_id,
                live,
                from_seq,
            }))
        }))
    }
}

impl Handler<CancelRunMsg> for SessionActor {
    type Result = Result<bool, RuntimeError>;

    fn handle(
        &mut self,
        CancelRunMsg(run_id): CancelRunMsg,
        ctx: &mut Self::Context,
    ) -> Result<bool, RuntimeError> {
        self.last_active = Instant::now();
        if let Some(owner) = self.remote.clone() {
            return Err(self.elsewhere(&owner, ctx));
        }
        if let Some(error) = self.broken_error() {
            return Err(error);
        }
        self.ensure_fresh(ctx)?;
        if let Some(in_flight) = self.in_flight.as_ref().filter(|f| f.run_id == run_id) {
            in_flight.cancel.cancel();
            return Ok(true);
        }
        let Some(position) = self
            .queue
            .iter()
            .position(|queued| queued.run_id == run_id && queued.durable)
        else {
            return Ok(false);
        };
        // A queued run ends here and never reaches its harness.
        self.queue.remove(position);
        self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        let Some(run) = self.state.run(&run_id).cloned() else {
            return Ok(false);
        };
        let identity = self.identity(&run_id);
        let terminal = cancelled_events(&identity, EventIndex(run.event_count));
        self.end_run(run_id, terminal, None, ctx);
        Ok(true)
    }
}
