//! Driving one run: a harness turn whose every event is journaled, then broadcast.
//!
//! The run task turns harness events into journal events, appends whatever has
//! arrived in one group (so a fast harness costs one sync per batch, not per token),
//! and only then shows the client-visible ones to streams. The terminal events are
//! handed back to the session actor, which journals them and frees the session in the
//! same step, so a client that sees a run end can start the next turn at once.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use turnstile_harness::{Harness, HarnessError, HarnessEvent, ToolCall, TurnOutcome, TurnRequest};
use turnstile_journal::limits::HARNESS_EVENTS_BUFFERED;
use turnstile_journal::{Event, EventIndex, Expected, Journal, Recorded, RunId, SessionId};

/// A client-visible run event: agno's event JSON and its index in the run.
#[derive(Debug, Clone, PartialEq)]
pub struct WireEvent {
    /// The run.
    pub run_id: RunId,
    /// Contiguous from 0 per run.
    pub event_index: EventIndex,
    /// `RunStarted`, `RunContent`, ..., `RunCompleted`.
    pub event_type: String,
    /// The JSON object, as an inline stream sends it (no `event_index`).
    pub data: String,
}

impl WireEvent {
    /// Whether this event ends the run's stream.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.event_type.as_str(),
            "RunCompleted" | "RunError" | "RunCancelled"
        )
    }

    /// The wire event a journal record carries, if it carries one.
    pub fn from_record(record: &Recorded) -> Option<WireEvent> {
        match &record.event {
            Event::RunEventEmitted {
                run_id,
                event_index,
                event_type,
                data,
            } => Some(WireEvent {
                run_id: run_id.clone(),
                event_index: *event_index,
                event_type: event_type.clone(),
                data: data.clone(),
            }),
            _ => None,
        }
    }
}

/// Who a run's events are about, for the fields every agno event carries.
#[derive(Debug, Clone)]
pub(crate) struct RunIdentity {
    pub run_id: RunId,
    pub session_id: SessionId,
    pub agent_id: String,
    pub agent_name: String,
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl RunIdentity {
    /// agno's event object: the common fields, then the type's own.
    pub(crate) fn wire(&self, event_type: &str, fields: Value) -> String {
        let mut object = json!({
            "created_at": now_s(),
            "event": event_type,
            "agent_id": self.agent_id,
            "agent_name": self.agent_name,
            "run_id": self.run_id,
            "session_id": self.session_id,
        });
        if let (Some(target), Value::Object(extra)) = (object.as_object_mut(), fields) {
            target.extend(extra);
        }
        object.to_string()
    }

    pub(crate) fn emitted(&self, index: EventIndex, event_type: &str, fields: Value) -> Event {
        Event::RunEventEmitted {
            run_id: self.run_id.clone(),
            event_index: index,
            event_type: event_type.to_owned(),
            data: self.wire(event_type, fields),
        }
    }
}

fn tool_json(tool: &ToolCall) -> Value {
    json!({
        "tool_call_id": tool.tool_call_id,
        "tool_name": tool.tool_name,
        "tool_args": serde_json::from_str::<Value>(&tool.tool_args).unwrap_or(Value::Null),
        "result": tool.result,
        "tool_call_error": tool.tool_call_error,
        "parent_tool_call_id": tool.parent_tool_call_id,
    })
}

/// What the run task hands back to its session actor.
pub(crate) struct Finished {
    pub run_id: RunId,
    /// Everything the task appended.
    pub records: Vec<Arc<Recorded>>,
    /// The terminal events, for the actor to append.
    pub terminal: Vec<Event>,
}

pub(crate) struct RunTask {
    pub identity: RunIdentity,
    pub journal: Journal,
    pub harness: Arc<dyn Harness>,
    pub request: TurnRequest,
    pub cancel: CancellationToken,
    pub live: broadcast::Sender<Arc<WireEvent>>,
    pub next_index: EventIndex,
}

impl RunTask {
    /// Runs the turn to its end; never panics on a harness or journal failure: both
    /// become the run's error.
    pub(crate) async fn drive(mut self) -> Finished {
        let started = Instant::now();
        let (sender, mut receiver) = mpsc::channel(HARNESS_EVENTS_BUFFERED);
        let mut turn = self
            .harness
            .run_turn(self.request.clone(), sender, self.cancel.clone());
        let mut records = Vec::new();
        let mut harness_session_id = self.request.harness_session_id.clone().unwrap_or_default();
        let mut first_token: Option<f64> = None;
        let mut result: Option<Result<TurnOutcome, HarnessError>> = None;
        let mut journal_error: Option<String> = None;
        loop {
            let first = tokio::select! {
                biased;
                event = receiver.recv() => event,
                outcome = &mut turn, if result.is_none() => { result = Some(outcome); continue; }
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            while let Ok(event) = receiver.try_recv() {
                batch.push(event);
            }
            if journal_error.is_some() {
                continue;
            }
            let mut events = Vec::with_capacity(batch.len());
            for event in batch {
                if first_token.is_none() && matches!(event, HarnessEvent::ContentDelta { .. }) {
                    first_token = Some(started.elapsed().as_secs_f64());
                }
                events.push(self.journal_event(event, &mut harness_session_id));
            }
            match self.append(events).await {
                Ok(appended) => records.extend(appended),
                Err(error) => {
                    // The turn cannot be recorded, so it must not go on unrecorded.
                    tracing::error!(run_id = %self.identity.run_id, %error, "journal append failed");
                    journal_error = Some(error);
                    self.cancel.cancel();
                }
            }
        }
        let result = match result {
            Some(result) => result,
            None => turn.await,
        };
        let duration = started.elapsed().as_secs_f64();
        let terminal = match (journal_error, result) {
            (Some(error), _) => self.failed("journal_error", &error, false),
            (None, Ok(outcome)) => {
                let usage = &outcome.usage;
                let metrics = json!({
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "total_tokens": usage.input_tokens + usage.output_tokens,
                    "cache_read_tokens": usage.cache_read_tokens,
                    "cache_write_tokens": usage.cache_write_tokens,
                    "reasoning_tokens": usage.reasoning_tokens,
                    "cost": usage.cost_usd,
                    "duration": duration,
                    "time_to_first_token": first_token,
                });
                let index = self.take_index();
                vec![
                    self.identity.emitted(
                        index,
                        "RunCompleted",
                        json!({"content": outcome.content, "content_type": "str", "metrics": metrics}),
                    ),
                    Event::RunCompleted {
                        run_id: self.identity.run_id.clone(),
                        content: outcome.content,
                        content_type: "str".into(),
                        metrics: metrics.to_string(),
                    },
                ]
            }
            (None, Err(HarnessError::Cancelled)) => {
                let index = self.take_index();
                vec![
                    self.identity.emitted(
                        index,
                        "RunCancelled",
                        json!({"reason": "Run cancelled", "content": "Run cancelled"}),
                    ),
                    Event::RunCancelled {
                        run_id: self.identity.run_id.clone(),
                        reason: "Run cancelled".into(),
                    },
                ]
            }
            (None, Err(HarnessError::Failed { kind, message })) => {
                self.failed(kind.slug(), &message, kind.is_retryable())
            }
        };
        Finished {
            run_id: self.identity.run_id.clone(),
            records,
            terminal,
        }
    }

    fn failed(&mut self, error_type: &str, message: &str, retryable: bool) -> Vec<Event> {
        let index = self.take_index();
        vec![
            self.identity.emitted(
                index,
                "RunError",
                json!({"content": message, "error_type": error_type}),
            ),
            Event::RunFailed {
                run_id: self.identity.run_id.clone(),
                error_type: error_type.to_owned(),
                message: message.to_owned(),
                retryable,
            },
        ]
    }

    fn take_index(&mut self) -> EventIndex {
        let index = self.next_index;
        self.next_index = index.next();
        index
    }

    fn journal_event(&mut self, event: HarnessEvent, harness_session_id: &mut String) -> Event {
        let run_id = self.identity.run_id.clone();
        match event {
            HarnessEvent::SessionStarted {
                harness_session_id: id,
            } => {
                *harness_session_id = id.clone();
                Event::AttemptStarted {
                    run_id,
                    attempt: self.request.attempt,
                    harness_session_id: id,
                }
            }
            HarnessEvent::TranscriptLine { line } => Event::TranscriptLineAppended {
                run_id,
                harness_session_id: harness_session_id.clone(),
                line,
            },
            HarnessEvent::ContentDelta { text } => {
                let index = self.take_index();
                self.identity.emitted(
                    index,
                    "RunContent",
                    json!({"content": text, "content_type": "str"}),
                )
            }
            HarnessEvent::ToolCallStarted { tool } => {
                let index = self.take_index();
                self.identity
                    .emitted(index, "ToolCallStarted", json!({"tool": tool_json(&tool)}))
            }
            HarnessEvent::ToolCallCompleted { tool } => {
                let index = self.take_index();
                self.identity.emitted(
                    index,
                    "ToolCallCompleted",
                    json!({"tool": tool_json(&tool)}),
                )
            }
        }
    }

    async fn append(&self, events: Vec<Event>) -> Result<Vec<Arc<Recorded>>, String> {
        let records = self
            .journal
            .append(&self.identity.session_id, Expected::Any, events)
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        broadcast_wire(&self.live, &records);
        Ok(records)
    }
}

/// Shows durable records' wire events to the run's live streams.
pub(crate) fn broadcast_wire(live: &broadcast::Sender<Arc<WireEvent>>, records: &[Arc<Recorded>]) {
    for record in records {
        if let Some(wire) = WireEvent::from_record(record) {
            // No receiver is fine: streams that come later read the journal.
            let _ = live.send(Arc::new(wire));
        }
    }
}
