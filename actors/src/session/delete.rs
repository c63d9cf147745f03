//! Deletion: the session's end journaled, its runs cancelled, its actor stopped, and
//! its own workspace directory (`workspace = "session"`) removed; the journal keeps the
//! audit trail.

use crate::session::{DeleteSessionMsg, SessionActor};
use actix::prelude::*;
use std::time::Instant;
use turnstile_journal::{Event, Expected};

use crate::api::{Refused, RuntimeError};

impl Handler<DeleteSessionMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<bool, Refused>, RuntimeError>>;

    fn handle(&mut self, _: DeleteSessionMsg, ctx: &mut Self::Context) -> Self::Result {
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
        if !self.state.exists() || self.deleting {
            return Box::pin(fut::ready(Ok(Ok(false))));
        }
        if let Some(run_id) = self.busy_with() {
            let refused = Refused::Busy {
                session_id: self.session_id.clone(),
                run_id: run_id.clone(),
            };
            return Box::pin(fut::ready(Ok(Err(refused))));
        }
        self.deleting = true;
        let workdir = self
            .shared
            .agents
            .get(&self.state.session.agent_id)
            .filter(|agent| agent.workspace == crate::api::Workspace::Session)
            .map(|agent| agent.workdir(&self.session_id));
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        let event = Event::SessionDeleted {
            reason: "deleted through the API".into(),
        };
        Box::pin(
            async move {
                journal
                    .append(&session_id, Expected::Any, vec![event])
                    .await
            }
            .into_actor(self)
            .map(|result, actor, ctx| {
                actor.deleting = false;
                let answer = actor.answer_deletion(result, ctx);
                if let (Ok(Ok(true)), Some(workdir)) = (&answer, workdir) {
                    remove_workspace(&workdir);
                }
                answer
            }),
        )
    }
}

impl SessionActor {
    /// Folds a deletion's records, or reads the journal again after a failed append.
    fn answer_deletion(
        &mut self,
        result: turnstile_journal::AppendResult,
        ctx: &mut Context<Self>,
    ) -> Result<Result<bool, Refused>, RuntimeError> {
        match result {
            Ok(Ok(records)) => {
                self.apply(&records);
                Ok(Ok(true))
            }
            Ok(Err(conflict)) => {
                self.stale = true;
                self.heal_later(ctx);
                Err(RuntimeError::Conflict(conflict))
            }
            Err(error) => {
                self.stale = true;
                self.heal_later(ctx);
                Err(error.into())
            }
        }
    }
}

/// Removes a deleted session's workspace directory. `remove_dir_all` never follows a
/// symlink (one in place of the directory is removed as a link); a failure is logged,
/// not answered: the deletion is durable.
fn remove_workspace(workdir: &std::path::Path) {
    match std::fs::remove_dir_all(workdir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(workdir = %workdir.display(), %error, "a deleted session's workspace was not removed");
        }
    }
}
