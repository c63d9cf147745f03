//! Commands that start or stop a turn: a turn accepted by journaling `RunQueued` (with
//! the multitask policy and idempotency keys), a run cancelled queued or running.

use crate::session::{Accepted, CancelRunMsg, Queued, SessionActor, StartRunMsg};
use actix::prelude::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use turnstile_journal::{Event, EventIndex, Expected, Recorded, RunId, RunOptions};

use crate::api::{AgentSpec, Multitask, Refused, RuntimeError, StartRun};
use crate::run::cancelled_events;

impl Handler<StartRunMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<Accepted, Refused>, RuntimeError>>;

    fn handle(
        &mut self,
        StartRunMsg(command): StartRunMsg,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        self.last_active = Instant::now();
        let agent = match self.admit(&command, ctx) {
            Ok(Ok(agent)) => agent,
            Ok(Err(refused)) => return Box::pin(fut::ready(Ok(Err(refused)))),
            Err(error) => return Box::pin(fut::ready(Err(error))),
        };
        let run_id = RunId::new_v7();
        let events = self.turn_events(&command, &agent, &run_id);
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
                refused => {
                    // Nothing of the request was recorded: the session is as before.
                    self.creating = false;
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    let answer = match refused {
                        Ok(Err(_full)) => Ok(Err(Refused::QueueFull {
                            limit: turnstile_journal::limits::APPEND_QUEUE_REQUESTS_MAX,
                        })),
                        Err(error) => self.append_refused(error, ctx),
                        Ok(Ok(_)) => unreachable!("handled above"),
                    };
                    return Box::pin(fut::ready(answer));
                }
            };
        // Queued before the append returns, so that a concurrent start sees the session busy.
        self.queue.push_back(Queued {
            run_id: run_id.clone(),
            durable: false,
            resume: false,
        });
        let live = self.shared.ensure_live(&run_id).watch();
        Box::pin(append.into_actor(self).map(move |result, actor, ctx| {
            actor.creating = false;
            let accepted = actor.queued_durably(result, &run_id, ctx)?;
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
                from_index: EventIndex(0),
            }))
        }))
    }
}

impl SessionActor {
    /// Whether a turn may be accepted now, checked before anything is journaled: the
    /// session is not elsewhere, broken, compacting or busy (for `reject`), the agent
    /// is known and the session's, and the queue has room (a place in it is taken).
    fn admit(
        &mut self,
        command: &StartRun,
        ctx: &mut Context<Self>,
    ) -> Result<Result<AgentSpec, Refused>, RuntimeError> {
        if let Some(owner) = self.remote.clone() {
            return Err(self.elsewhere(&owner, ctx));
        }
        if let Some(error) = self.broken_error() {
            return Err(error);
        }
        self.ensure_fresh(ctx)?;
        // Before any refusal that would tell another user's session exists.
        if command.isolated && !self.owned_by(command.user_id.as_deref()) {
            return Ok(Err(Refused::UnknownSession {
                session_id: self.session_id.clone(),
            }));
        }
        if self.deleting {
            return Ok(Err(Refused::Deleting {
                session_id: self.session_id.clone(),
            }));
        }
        if self.compacting && command.multitask == Multitask::Reject {
            return Ok(Err(Refused::Compacting {
                session_id: self.session_id.clone(),
            }));
        }
        if command.multitask == Multitask::Reject
            && let Some(run_id) = self.busy_for_a_new_turn()
        {
            return Ok(Err(Refused::Busy {
                session_id: self.session_id.clone(),
                run_id: run_id.clone(),
            }));
        }
        let Some(agent) = self.shared.agents.get(&command.agent_id).cloned() else {
            return Ok(Err(Refused::UnknownAgent {
                agent_id: command.agent_id.clone(),
            }));
        };
        if self.state.exists() && self.state.session.agent_id != agent.id {
            return Ok(Err(Refused::AgentMismatch {
                session_id: self.session_id.clone(),
                agent_id: self.state.session.agent_id.clone(),
            }));
        }
        let queued = self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if queued >= self.shared.max_queued_runs {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Ok(Err(Refused::QueueFull {
                limit: self.shared.max_queued_runs,
            }));
        }
        Ok(Ok(agent))
    }

    /// Whether a turn of `user` may go into this session under per-user isolation: the
    /// session is new, or its creation (durable, or on its way to the journal) names
    /// that user.
    fn owned_by(&self, user: Option<&str>) -> bool {
        if self.state.exists() {
            self.state.session.user_id.as_deref() == user
        } else if self.creating {
            self.creator.as_deref() == user
        } else {
            true
        }
    }

    /// The events that accept a turn: the session's creation (only the first of
    /// concurrent first turns journals it), `RunQueued`, its idempotency key, and its
    /// attachments' bytes (journaled with the run: any later turn or machine can stage
    /// them).
    fn turn_events(&mut self, command: &StartRun, agent: &AgentSpec, run_id: &RunId) -> Vec<Event> {
        let mut events = Vec::with_capacity(3);
        if !self.state.exists() && !self.creating {
            self.creating = true;
            self.creator = command.user_id.clone();
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
            options: RunOptions {
                fork: command.fork.clone(),
                ..command.options.clone()
            },
        });
        if let Some(key) = &command.idempotency_key {
            events.push(Event::IdempotencyKeyBound {
                key: key.clone(),
                run_id: run_id.clone(),
            });
        }
        for attachment in &command.attachments {
            events.push(Event::AttachmentAdded {
                run_id: run_id.clone(),
                name: attachment.name.clone(),
                media_type: attachment.media_type.clone(),
                sha256: crate::uploads::sha256_hex(&attachment.bytes),
                content: attachment.bytes.clone(),
            });
        }
        events
    }

    /// The answer to a turn whose append the journal refused before writing anything:
    /// an event over the journal's bound is the client's to fix (named by its field);
    /// anything else means the journal may have moved on, so the actor reads it again.
    fn append_refused(
        &mut self,
        error: turnstile_journal::Error,
        ctx: &mut Context<Self>,
    ) -> Result<Result<Accepted, Refused>, RuntimeError> {
        if let turnstile_journal::Error::TooLarge { kind, bytes, limit } = error {
            let field = match kind {
                "AttachmentAdded" => "files",
                "IdempotencyKeyBound" => "idempotency_key",
                _ => "message",
            };
            return Ok(Err(Refused::EventTooLarge {
                field,
                kind,
                bytes,
                limit,
            }));
        }
        self.stale = true;
        self.heal_later(ctx);
        Err(RuntimeError::from(error))
    }

    /// Folds a turn's accepted records and marks it durable in the queue; a failed
    /// append takes the turn out of the queue again and leaves the actor to read the
    /// journal afresh.
    fn queued_durably(
        &mut self,
        result: turnstile_journal::AppendResult,
        run_id: &RunId,
        ctx: &mut Context<Self>,
    ) -> Result<Vec<Arc<Recorded>>, RuntimeError> {
        let accepted = match result {
            Ok(Ok(records)) => records,
            failure => {
                self.stale = true;
                self.heal_later(ctx);
                self.queue.retain(|queued| &queued.run_id != run_id);
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                self.shared.remove_live(run_id);
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
        self.apply(&accepted);
        if let Some(queued) = self
            .queue
            .iter_mut()
            .find(|queued| &queued.run_id == run_id)
        {
            queued.durable = true;
        }
        Ok(accepted)
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
        if self.ending.contains(&run_id) {
            // Its end is on its way to the journal: a second cancel does nothing.
            return Ok(false);
        }
        let unsure = self.pause_unfolded(&run_id)
            || (!self.unfolded.is_empty()
                && self.paused_run().is_some_and(|run| run.run_id == run_id));
        if self.deciding.as_ref() == Some(&run_id) || unsure {
            // Its decision is on its way to the journal: cancelled once it is queued.
            ctx.notify_later(CancelRunMsg(run_id), std::time::Duration::from_millis(2));
            return Ok(true);
        }
        if let Some(run) = self.paused_run().filter(|run| run.run_id == run_id) {
            // A paused run has no task: it ends here, at once.
            let index = EventIndex(run.event_count);
            let terminal = cancelled_events(&self.identity(&run_id), index);
            self.end_run(run_id, terminal, None, ctx);
            return Ok(true);
        }
        let Some(position) = self
            .queue
            .iter()
            .position(|queued| queued.run_id == run_id && queued.durable)
        else {
            return Ok(false);
        };
        let index = match self.state.run(&run_id) {
            Some(run) => EventIndex(run.event_count),
            // Accepted but not folded yet (a record before it is still on its way
            // here): a run that never started has no event yet. Dropped from the queue
            // without an end, it was left open with no one to run it (the fault search).
            None if !self.queue[position].resume => EventIndex(0),
            None => return Ok(false),
        };
        // A queued run ends here and never reaches its harness.
        self.queue.remove(position);
        self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        let identity = self.identity(&run_id);
        let terminal = cancelled_events(&identity, index);
        self.end_run(run_id, terminal, None, ctx);
        Ok(true)
    }
}
