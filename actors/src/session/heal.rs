//! Crash-only freshness: an actor whose append failed, or whose journal moved on without
//! it, reads its state again from the journal before it answers, and heals on a timer
//! while nobody asks; runs the journal left open are resolved from what is durable.

use crate::session::SessionActor;
use actix::prelude::*;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;
use turnstile_journal::limits::HEAL_EVERY_MS;
use turnstile_journal::{Expected, RunId};

use crate::api::RuntimeError;
use crate::reads;
use crate::run::broadcast_wire;

pub(super) const HEAL_EVERY: Duration = Duration::from_millis(HEAL_EVERY_MS);

impl SessionActor {
    /// Crash-only: after an append failed, the state is dropped and read again from the
    /// journal (stored form and the records after), and the runs open there that no one
    /// here works on are resolved as at start-up. The running run (if any) goes on; its
    /// task's batches are folded as they come, those the read already holds skipped.
    pub(super) fn ensure_fresh(&mut self, ctx: &mut Context<Self>) -> Result<(), RuntimeError> {
        let retaken = self.retake_lease(ctx)?;
        if !(self.stale || retaken) || self.fenced || self.remote.is_some() {
            return Ok(());
        }
        let state = reads::load_session(&self.shared.journal, &self.session_id)?;
        if self.stale {
            tracing::warn!(session_id = %self.session_id, next_seq = state.next_seq, "session state read again from the journal after an append failed");
        }
        self.state = state;
        self.stale = false;
        // The workspace's fold too is read again, at the next turn.
        self.workspace = None;
        let next_seq = self.state.next_seq;
        self.unfolded.retain(|seq, _| *seq >= next_seq);
        // Queued runs whose acceptance the journal does not hold are gone (their
        // request was answered with the error).
        let open: HashSet<RunId> = self
            .state
            .open_runs()
            .map(|run| run.run_id.clone())
            .collect();
        let before = self.queue.len();
        self.queue
            .retain(|queued| !queued.durable || open.contains(&queued.run_id));
        self.shared
            .queued
            .fetch_sub(before - self.queue.len(), Ordering::SeqCst);
        self.resolve_open_runs(ctx);
        Ok(())
    }

    /// On a shared journal, the append that ended the session's last run gave its lease
    /// back while this actor lived on: it takes the lease again before it acts (`true`:
    /// the session is to be read again, another replica may have written meanwhile), or
    /// answers for the replica that took it from now on (`Elsewhere`).
    fn retake_lease(&mut self, ctx: &mut Context<Self>) -> Result<bool, RuntimeError> {
        if !self.shared.cluster
            || !self.leased
            || self.fenced
            || !self.shared.journal.lease_given_back(&self.session_id)
        {
            return Ok(false);
        }
        match self.shared.journal.lease(&self.session_id)? {
            turnstile_journal::Lease::Held => Ok(true),
            turnstile_journal::Lease::OwnedBy(owner) => {
                self.shared.journal.release(&self.session_id);
                self.leased = false;
                self.remote = Some(owner.clone());
                Err(self.elsewhere(&owner, ctx))
            }
        }
    }

    /// The journal could not be reached at the start: unavailable (a `503` for the
    /// commands meanwhile, then a fresh actor) or broken.
    pub(super) fn set_broken(&mut self, error: &turnstile_journal::Error, ctx: &mut Context<Self>) {
        match error.unavailable() {
            Some(detail) => {
                self.unavailable = Some(detail);
                ctx.run_later(Duration::from_millis(50), |_, ctx| ctx.stop());
            }
            None => {
                self.broken = Some(error.to_string());
                if self.shared.cluster {
                    ctx.run_later(Duration::from_millis(50), |_, ctx| ctx.stop());
                }
            }
        }
    }

    /// What a command gets from an actor that could not start.
    pub(super) fn broken_error(&self) -> Option<RuntimeError> {
        if let Some(detail) = &self.unavailable {
            return Some(RuntimeError::Journal(
                turnstile_journal::Error::Unavailable(detail.clone()),
            ));
        }
        self.broken
            .as_ref()
            .map(|reason| RuntimeError::Internal(reason.clone()))
    }

    /// After an append failed: the state is read again as soon as the journal answers
    /// (every second until it does), and what the failure interrupted is resolved, also
    /// when no command comes to ask (a run whose end could not be journaled would
    /// otherwise stay open with no one working on it).
    pub(super) fn heal(&mut self, ctx: &mut Context<Self>) {
        self.healing = false;
        if !self.stale || self.fenced || self.broken.is_some() || self.unavailable.is_some() {
            return;
        }
        if self.in_flight.is_some() || self.electing || self.compacting {
            // Their end heals (or comes back here).
            self.heal_later(ctx);
            return;
        }
        match self.ensure_fresh(ctx) {
            Ok(()) => self.pump(ctx),
            Err(error) => {
                tracing::debug!(session_id = %self.session_id, %error, "journal still unavailable");
                self.heal_later(ctx);
            }
        }
    }

    /// [`SessionActor::heal`] in [`HEAL_EVERY`], unless it is already due.
    pub(super) fn heal_later(&mut self, ctx: &mut Context<Self>) {
        if !self.healing {
            self.healing = true;
            ctx.run_later(HEAL_EVERY, |actor, ctx| actor.heal(ctx));
        }
    }

    /// Resolves the runs open in the state that no one here works on (start-up
    /// recovery, and after a state read again): their endings are journaled before any
    /// other command is handled.
    /// Returns whether endings are being journaled (the actor pumps once they are).
    pub(super) fn resolve_open_runs(&mut self, ctx: &mut Context<Self>) -> bool {
        // A paused run stays paused; its timeout counts from its pause's record.
        self.arm_approval_timeout(ctx);
        let endings = self.recover();
        if endings.is_empty() {
            return false;
        }
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        // `wait` holds back every command until recovery is journaled.
        ctx.wait(
            async move { journal.append(&session_id, Expected::Any, endings).await }
                .into_actor(self)
                .map(|result, actor, ctx| match result {
                    Ok(Ok(records)) => {
                        for record in &records {
                            if let Some(run_id) =
                                record.event.run_id().filter(|_| record.event.is_terminal())
                                && let Some(live) = actor.shared.remove_live(run_id)
                            {
                                broadcast_wire(&live.events, std::slice::from_ref(record));
                            }
                        }
                        actor.apply(&records);
                        actor.pump(ctx);
                    }
                    Ok(Err(conflict)) => {
                        tracing::error!(session_id = %actor.session_id, %conflict, "recovery not journaled");
                        actor.stale = true;
                        actor.heal_later(ctx);
                    }
                    Err(error) => {
                        tracing::error!(session_id = %actor.session_id, %error, "recovery not journaled");
                        actor.stale = true;
                        actor.check_fenced(&error, ctx);
                        actor.heal_later(ctx);
                    }
                }),
        );
        true
    }
}
