//! Compaction: the session's history summarised by its harness and journaled as a new
//! starting point, refused while a run is open.

use crate::api::{CompactOutcome, Refused, RuntimeError};
use crate::session::{CompactMsg, SessionActor};
use crate::{AgentSpec, reads};
use actix::prelude::*;
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;
use turnstile_harness::{CompactRequest, Compaction};
use turnstile_journal::{Event, Expected, Journal, Recorded, SessionId};

/// What a compaction needs, or the answer that ends it before it starts.
enum Prepared {
    /// Compact with this agent's harness.
    Compact(AgentSpec, CompactRequest),
    /// Answered at once (refused, nothing to compact, or a failure).
    Answer(Result<Result<CompactOutcome, Refused>, RuntimeError>),
}

impl Handler<CompactMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<CompactOutcome, Refused>, RuntimeError>>;

    fn handle(&mut self, _: CompactMsg, ctx: &mut Self::Context) -> Self::Result {
        self.last_active = Instant::now();
        let (agent, request) = match self.prepare_compaction(ctx) {
            Prepared::Compact(agent, request) => (agent, request),
            Prepared::Answer(answer) => return Box::pin(fut::ready(answer)),
        };
        self.compacting = true;
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        Box::pin(
            compact_and_journal(journal, session_id, agent, request)
                .into_actor(self)
                .map(|result, actor, ctx| {
                    actor.compacting = false;
                    if result.is_err() {
                        actor.stale = true;
                        actor.heal_later(ctx);
                    }
                    let result = result.map(|(outcome, records)| {
                        actor.apply(&records);
                        outcome
                    });
                    actor.pump(ctx);
                    result.map(Ok)
                }),
        )
    }
}

impl SessionActor {
    /// A compaction's request, once the session may be compacted: it is here, fresh,
    /// idle and not compacting already, and it has a harness session and an agent.
    fn prepare_compaction(&mut self, ctx: &mut Context<Self>) -> Prepared {
        if let Some(owner) = self.remote.clone() {
            return Prepared::Answer(Err(self.elsewhere(&owner, ctx)));
        }
        if let Some(error) = self.broken_error() {
            return Prepared::Answer(Err(error));
        }
        if let Err(error) = self.ensure_fresh(ctx) {
            return Prepared::Answer(Err(error));
        }
        if let Some(run_id) = self.busy_with() {
            return Prepared::Answer(Ok(Err(Refused::Busy {
                session_id: self.session_id.clone(),
                run_id: run_id.clone(),
            })));
        }
        if self.deleting {
            return Prepared::Answer(Ok(Err(Refused::Deleting {
                session_id: self.session_id.clone(),
            })));
        }
        if self.compacting {
            return Prepared::Answer(Ok(Err(Refused::Compacting {
                session_id: self.session_id.clone(),
            })));
        }
        let no_history = |message: String| {
            Prepared::Answer(Ok(Ok(CompactOutcome {
                compacted: false,
                status: "no_history",
                message,
                record: None,
            })))
        };
        let Some(harness_session_id) = self.state.session.harness_session_id.clone() else {
            return no_history(format!(
                "Session {} has no history to compact.",
                self.session_id
            ));
        };
        let Some(agent) = self
            .shared
            .agents
            .get(&self.state.session.agent_id)
            .cloned()
        else {
            return no_history(format!(
                "Session {} belongs to no configured agent.",
                self.session_id
            ));
        };
        let transcript =
            match reads::transcript(&self.shared.journal, &self.session_id, &harness_session_id) {
                Ok(lines) => lines,
                Err(error) => return Prepared::Answer(Err(error)),
            };
        let cwd = Some(agent.workdir(&self.session_id));
        Prepared::Compact(
            agent,
            CompactRequest {
                session_id: self.session_id.clone(),
                harness_session_id,
                transcript,
                cwd,
            },
        )
    }
}

/// Has the harness compact the session, and journals the compaction as the session's
/// new starting point.
async fn compact_and_journal(
    journal: Journal,
    session_id: SessionId,
    agent: AgentSpec,
    request: CompactRequest,
) -> Result<(CompactOutcome, Vec<Arc<Recorded>>), RuntimeError> {
    let harness_session_id = request.harness_session_id.clone();
    let (lines, summary, replaced_messages) = match agent.harness.compact(request).await {
        Ok(Compaction::Compacted {
            lines,
            summary,
            replaced_messages,
        }) => (lines, summary, replaced_messages),
        Ok(Compaction::NothingToCompact { reason }) => {
            return Ok((
                CompactOutcome {
                    compacted: false,
                    status: "nothing_to_compact",
                    message: reason,
                    record: None,
                },
                Vec::new(),
            ));
        }
        Err(error) => {
            return Err(RuntimeError::Internal(format!(
                "compaction failed: {error}"
            )));
        }
    };
    let event = Event::TranscriptCompacted {
        run_id: None,
        harness_session_id: harness_session_id.clone(),
        summary: summary.clone(),
        replaced_messages,
        lines,
    };
    let records = journal
        .append(&session_id, Expected::Any, vec![event])
        .await??;
    let outcome = CompactOutcome {
        compacted: true,
        status: "compacted",
        message: format!("Compacted {replaced_messages} messages into a summary."),
        record: Some(json!({
            "harness_session_id": harness_session_id,
            "summary": summary,
            "replaced_messages": replaced_messages,
        })),
    };
    Ok((outcome, records))
}
