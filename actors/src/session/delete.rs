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
                    actor.workspace = None;
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

/// Removes a deleted session's workspace directory: moved aside at once (a rename, so
/// that a session started again under the same id gets an empty directory), then
/// removed on a thread of its own, so that a large workspace never holds the actor's
/// thread. `remove_dir_all` never follows a symlink. A failure is logged, not
/// answered: the deletion is durable.
fn remove_workspace(workdir: &std::path::Path) {
    let Some(cwd) = workdir.parent() else {
        return;
    };
    let aside = cwd.join(".turnstile").join("deleted").join(format!(
        "{}.{}",
        workdir.file_name().unwrap_or_default().to_string_lossy(),
        uuid::Uuid::now_v7()
    ));
    let moved = aside
        .parent()
        .map(std::fs::create_dir_all)
        .transpose()
        .and_then(|_| std::fs::rename(workdir, &aside));
    let doomed = match moved {
        Ok(()) => aside,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return,
        // Not movable aside (a read-only parent…): removed where it is.
        Err(_) => workdir.to_path_buf(),
    };
    std::thread::spawn(move || {
        if let Err(error) = std::fs::remove_dir_all(&doomed)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(workdir = %doomed.display(), %error, "a deleted session's workspace was not removed");
        }
    });
}
