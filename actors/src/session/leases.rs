//! Leases on a shared journal: a session owned by another live replica is refused here
//! with its owner named; an actor whose lease lapsed or was refused is fenced and stops.

use crate::api::RuntimeError;
use crate::session::SessionActor;
use actix::prelude::*;
use std::sync::atomic::Ordering;
use turnstile_journal::RunId;
use turnstile_projections::RunStatus;

/// This replica lost every lease it held before its heartbeat's lapse number `.0`:
/// stop the session's turn and write nothing more, if this actor's lease is that old
/// (the notice comes a moment after the lapse, and an actor that took the session over
/// since holds a lease of the new registration: fencing it would leave the session
/// held by a live replica and worked on by no one).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Fence(pub u64);

impl Handler<Fence> for SessionActor {
    type Result = ();

    fn handle(&mut self, Fence(lapse): Fence, ctx: &mut Self::Context) {
        if self.leased && !self.fenced && lapse >= self.leased_before {
            self.fence(ctx);
        }
    }
}

impl SessionActor {
    /// What a remote session is busy with, as the journal shows it: its running run,
    /// else its oldest queued one.
    pub(super) fn remote_busy(&self) -> Option<RunId> {
        let open: Vec<_> = self.state.open_runs().collect();
        open.iter()
            .find(|run| run.status == RunStatus::Running)
            .or_else(|| open.iter().min_by_key(|run| run.queued_seq))
            .map(|run| run.run_id.clone())
    }

    /// The answer of an actor whose session another replica holds. Such an actor is
    /// idle from the start, so it stops at its next idle check and the next command
    /// asks the journal again (stopping here would drop a reply still to be sent).
    pub(super) fn elsewhere(&self, owner: &str, _: &mut Context<Self>) -> RuntimeError {
        RuntimeError::Elsewhere {
            session_id: self.session_id.clone(),
            owner: owner.to_owned(),
            busy: self.remote_busy(),
        }
    }

    /// After a journal failure: a lost lease stops the actor (its turn's CLI with it)
    /// and nothing more is written here; the session's new owner resolves its runs.
    pub(super) fn check_fenced(
        &mut self,
        error: &turnstile_journal::Error,
        ctx: &mut Context<Self>,
    ) {
        if matches!(error, turnstile_journal::Error::Fenced { .. }) && !self.fenced {
            tracing::error!(session_id = %self.session_id, "lease lost: this replica stops working on the session");
            self.fence(ctx);
        }
    }

    pub(super) fn fence(&mut self, ctx: &mut Context<Self>) {
        self.fenced = true;
        self.broken = Some(format!(
            "this replica lost the lease of session {}",
            self.session_id
        ));
        if let Some(in_flight) = &self.in_flight {
            in_flight.cancel.cancel();
        }
        // Their live channels close: a stream attached here follows the journal from
        // then on, to the end the session's next owner gives the run.
        let runs = self
            .in_flight
            .iter()
            .map(|f| f.run_id.clone())
            .chain(self.queue.iter().map(|q| q.run_id.clone()));
        for run_id in runs.collect::<Vec<_>>() {
            self.shared.remove_live(&run_id);
        }
        self.shared
            .queued
            .fetch_sub(self.queue.len(), Ordering::SeqCst);
        self.queue.clear();
        ctx.stop();
    }
}
