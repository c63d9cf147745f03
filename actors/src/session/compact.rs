//! Compaction: the session's history summarised by its harness and journaled as a new
//! starting point, refused while a run is open.

use crate::session::{CompactMsg, SessionActor};
use actix::prelude::*;
use serde_json::json;
use std::time::Instant;
use turnstile_harness::{CompactRequest, Compaction};
use turnstile_journal::{Event, Expected};

use crate::api::{CompactOutcome, Refused, RuntimeError};
use crate::reads;

impl Handler<CompactMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<CompactOutcome, Refused>, RuntimeError>>;

    fn handle(&mut self, _: CompactMsg, ctx: &mut Self::Context) -> Self::Result {
        self.last_active = Instant::now();
        let ready = |outcome| -> Self::Result { Box::pin(fut::ready(outcome)) };
        if let Some(owner) = self.remote.clone() {
            return ready(Err(self.elsewhere(&owner, ctx)));
        }
        if let Some(error) = self.broken_error() {
            return ready(Err(error));
        }
        if let Err(error) = self.ensure_fresh(ctx) {
            return ready(Err(error));
        }
        if let Some(run_id) = self.busy_with() {
            return ready(Ok(Err(Refused::Busy {
                session_id: self.session_id.clone(),
                run_id: run_id.clone(),
            })));
        }
        if self.compacting {
            return ready(Ok(Err(Refused::Compacting {
                session_id: self.session_id.clone(),
            })));
        }
        let no_history = |message: String| CompactOutcome {
            compacted: false,
            status: "no_history",
            message,
            record: None,
        };
        let Some(harness_session_id) = self.state.session.harness_session_id.clone() else {
            return ready(Ok(Ok(no_history(format!(
                "Session {} has no history to compact.",
                self.session_id
            )))));
        };
        let Some(agent) = self
            .shared
            .agents
            .get(&self.state.session.agent_id)
            .cloned()
        else {
            return ready(Ok(Ok(no_history(format!(
                "Session {} belongs to no configured agent.",
                self.session_id
            )))));
        };
        let transcript =
            match reads::transcript(&self.shared.journal, &self.session_id, &harness_session_id) {
                Ok(lines) => lines,
                Err(error) => return ready(Err(error)),
            };
        let request = CompactRequest {
            session_id: self.session_id.clone(),
            harness_session_id: harness_session_id.clone(),
            transcript,
        };
        self.compacting = true;
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        Box::pin(
            async move {
                let outcome = agent.harness.compact(request).await;
                let (lines, summary, replaced_messages) = match outcome {
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
                    .await?
                    .map_err(|c| RuntimeError::Internal(c.to_string()))?;
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
