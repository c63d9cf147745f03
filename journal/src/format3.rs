//! Record format 3, frozen: the events as `89e76eb`'s build wrote them, read so that old
//! journals still open, and written again only by an import of an old export (which must
//! reproduce the recorded bytes to match their hashes).
//!
//! Format 3 kept free-form JSON in text: run options, and a run's metrics in agno's
//! shape, twice (on `RunEventEmitted(Completed)` and on `RunCompleted`). [`upgrade`]
//! turns such an event into the current one; this module is the only place in
//! `journal/` that reads agno's metric keys, because they are this old format's layout.
//! Nothing here may change: it is what the old bytes mean.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{self, ForkPoint, ModelMetrics, RunMetrics, RunOptions, ToolCall, Warning};
use crate::ids::{EventIndex, RunId};

/// An event of format 3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// The session's first event.
    SessionCreated {
        /// Agent the session belongs to.
        agent_id: String,
        /// The client's user id, if it sent one.
        user_id: Option<String>,
    },
    /// A run was accepted: from here on it must reach a terminal event.
    RunQueued {
        /// The run.
        run_id: RunId,
        /// Agent that runs it.
        agent_id: String,
        /// The client's user id.
        user_id: Option<String>,
        /// The user's message.
        input: String,
        /// Run options as JSON text (stream, background, multitask strategy, ...).
        options: String,
    },
    /// The run left the queue and owns its session.
    RunStarted {
        /// The run.
        run_id: RunId,
        /// Model identity recorded on the run.
        model: String,
        /// Provider of that model.
        model_provider: String,
    },
    /// One attempt of the run began on a harness session.
    AttemptStarted {
        /// The run.
        run_id: RunId,
        /// 1 for the first attempt.
        attempt: u32,
        /// The harness's own session id that this attempt resumes or creates.
        harness_session_id: String,
    },
    /// A harness wrote one line of its transcript.
    TranscriptLineAppended {
        /// The run whose turn wrote it.
        run_id: RunId,
        /// The harness's session id.
        harness_session_id: String,
        /// The line itself (JSON text for the CLIs).
        line: String,
    },
    /// A client-visible fact of a run, as its streams show it (typed: the gateway
    /// renders it in the HTTP API's shape, projections fold it).
    RunEventEmitted {
        /// The run.
        run_id: RunId,
        /// Contiguous from 0 per run.
        event_index: EventIndex,
        /// What happened.
        event: RunEvent,
    },
    /// The run ended with an answer.
    RunCompleted {
        /// The run.
        run_id: RunId,
        /// Final content (text, or JSON text for structured output).
        content: String,
        /// `str` or the output schema's title.
        content_type: String,
        /// Metrics as JSON text.
        metrics: String,
    },
    /// The run ended in an error.
    RunFailed {
        /// The run.
        run_id: RunId,
        /// Error class slug.
        error_type: String,
        /// Human message.
        message: String,
        /// Whether another attempt could have succeeded.
        retryable: bool,
    },
    /// The run was cancelled.
    RunCancelled {
        /// The run.
        run_id: RunId,
        /// Why (`Run cancelled` for a client's cancel).
        reason: String,
    },
    /// One attempt failed; the run retries or ends. Recorded so that recovery after a
    /// restart knows whether another attempt is allowed.
    AttemptFailed {
        /// The run.
        run_id: RunId,
        /// The attempt that failed (1 for the first).
        attempt: u32,
        /// Error class slug.
        error_type: String,
        /// Human message.
        message: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
    /// A client's `Idempotency-Key` now names this run: a repeated submission with the
    /// same key returns it.
    IdempotencyKeyBound {
        /// The key as the client sent it (scoped by the gateway).
        key: String,
        /// The run.
        run_id: RunId,
    },
    /// A continuation forked a harness session: the new one starts with the first
    /// `transcript_lines` lines of the old one, so the harness remembers only up to there.
    HarnessSessionForked {
        /// The continuation run.
        run_id: RunId,
        /// The run it continues from.
        from_run_id: RunId,
        /// The message boundary it continues from.
        message_index: u32,
        /// The harness session forked.
        from_harness_session_id: String,
        /// The new harness session.
        harness_session_id: String,
        /// Lines of the old transcript the new one keeps.
        transcript_lines: u32,
    },
    /// A harness session was compacted: a summary now stands for earlier messages.
    TranscriptCompacted {
        /// The run that compacted (`None` for the compact route).
        run_id: Option<RunId>,
        /// The harness session.
        harness_session_id: String,
        /// The summary.
        summary: String,
        /// How many messages the summary replaces.
        replaced_messages: u32,
        /// Transcript lines that record the compaction, appended to the harness
        /// session's transcript (empty when the harness wrote them during a turn).
        lines: Vec<String>,
    },
    /// The session was deleted: it and its runs read as gone; the journal keeps them.
    SessionDeleted {
        /// Why, for the audit trail.
        reason: String,
    },
    /// A file attached to a run, kept whole so any later turn or machine can stage it.
    AttachmentAdded {
        /// The run.
        run_id: RunId,
        /// File name (one plain path component).
        name: String,
        /// Media type.
        media_type: String,
        /// SHA-256 of the content, hex.
        sha256: String,
        /// The bytes.
        content: Vec<u8>,
    },
    /// An event too large for a record ([`crate::limits::INLINE_EVENT_BYTES_MAX`]),
    /// stored apart: the record holds the BLAKE3 digest and length of the event's
    /// encoding, which lives under a key of its own written in the same atomic batch.
    /// Readers never see this variant: they see the event it stands for.
    StoredApart {
        /// BLAKE3 of the event's encoding.
        digest: [u8; 32],
        /// Length of that encoding.
        bytes: u64,
    },
}

/// A run event of format 3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RunEvent {
    /// The run left the queue and started on its harness.
    Started {
        /// Model identity recorded on the run.
        model: String,
        /// Provider of that model.
        model_provider: String,
    },
    /// A piece of the answer's text.
    ContentDelta {
        /// The text.
        text: String,
    },
    /// A tool call began.
    ToolCallStarted {
        /// The call.
        tool: ToolCall,
    },
    /// A tool call ended with its result.
    ToolCallCompleted {
        /// The call, with its result.
        tool: ToolCall,
    },
    /// Something the client should know that does not end the run.
    Warning {
        /// What.
        warning: Warning,
    },
    /// The run ended with an answer.
    Completed {
        /// The answer (JSON text for structured output).
        content: String,
        /// `str` or the output schema's title.
        content_type: String,
        /// Metrics as JSON text (tokens, cost, timings, per model).
        metrics: String,
    },
    /// The run ended in an error.
    Failed {
        /// Error class slug.
        error_type: String,
        /// Human message.
        message: String,
    },
    /// The run was cancelled.
    Cancelled {
        /// Why.
        reason: String,
    },
    /// A piece of the model's reasoning (a summary the harness shows; not the answer).
    /// Last, so the variants before it keep their encoding.
    ReasoningDelta {
        /// The text.
        text: String,
    },
}

/// A format-3 record's body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RecordBody {
    pub session_id: crate::ids::SessionId,
    pub seq: crate::ids::Seq,
    pub ts_us: i64,
    pub prev_hash: [u8; 32],
    pub event: Event,
}

/// The current event a format-3 event means. Only three variants changed in format 4
/// (`RunQueued`'s options, `RunCompleted`, the `Completed` run event's metrics); every
/// other variant is encoded alike in both, so its bytes are read again as the current
/// event.
pub fn upgrade(event: Event) -> event::Event {
    match event {
        Event::RunQueued {
            run_id,
            agent_id,
            user_id,
            input,
            options,
        } => event::Event::RunQueued {
            run_id,
            agent_id,
            user_id,
            input,
            options: options_of(&options),
        },
        // The answer and metrics are on the run's `Completed` run event too.
        Event::RunCompleted { run_id, .. } => event::Event::RunCompleted { run_id },
        Event::RunEventEmitted {
            run_id,
            event_index,
            event:
                RunEvent::Completed {
                    content,
                    content_type,
                    metrics,
                },
        } => event::Event::RunEventEmitted {
            run_id,
            event_index,
            event: event::RunEvent::Completed {
                content,
                content_type,
                metrics: metrics_of(&metrics),
            },
        },
        unchanged => {
            let config = bincode::config::standard();
            bincode::serde::encode_to_vec(&unchanged, config)
                .ok()
                .and_then(|bytes| bincode::serde::decode_from_slice(&bytes, config).ok())
                .map(|(event, _)| event)
                .expect("a format-3 variant that format 4 kept encodes alike")
        }
    }
}

/// Format 3's options text: `{"stream", "background", "output_schema", "fork"}`.
fn options_of(text: &str) -> RunOptions {
    let value: Value = serde_json::from_str(text).unwrap_or_default();
    RunOptions {
        stream: value["stream"].as_bool().unwrap_or(false),
        background: value["background"].as_bool().unwrap_or(false),
        output_schema: Some(&value["output_schema"])
            .filter(|schema| !schema.is_null())
            .map(Value::to_string),
        fork: serde_json::from_value::<ForkPoint>(value["fork"].clone()).ok(),
    }
}

/// Format 3's metrics text, in agno's `RunMetrics` shape (what it stored).
fn metrics_of(text: &str) -> RunMetrics {
    let value: Value = serde_json::from_str(text).unwrap_or_default();
    let tokens = |value: &Value, key: &str| value[key].as_u64().unwrap_or(0);
    let models = value["details"]["model"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| entry.is_object())
        .map(|entry| ModelMetrics {
            id: entry["id"].as_str().unwrap_or_default().to_owned(),
            provider: entry["provider"].as_str().unwrap_or_default().to_owned(),
            input_tokens: tokens(entry, "input_tokens"),
            output_tokens: tokens(entry, "output_tokens"),
            cache_read_tokens: tokens(entry, "cache_read_tokens"),
            cache_write_tokens: tokens(entry, "cache_write_tokens"),
            cost_usd: entry["cost"].as_f64(),
        })
        .collect();
    RunMetrics {
        input_tokens: tokens(&value, "input_tokens"),
        output_tokens: tokens(&value, "output_tokens"),
        cache_read_tokens: tokens(&value, "cache_read_tokens"),
        cache_write_tokens: tokens(&value, "cache_write_tokens"),
        reasoning_tokens: tokens(&value, "reasoning_tokens"),
        cost_usd: value["cost"].as_f64(),
        duration_s: value["duration"].as_f64().unwrap_or(0.0),
        first_token_s: value["time_to_first_token"].as_f64(),
        models,
        additional: value
            .get("additional_metrics")
            .filter(|extra| extra.as_object().is_some_and(|map| !map.is_empty()))
            .map(Value::to_string)
            .unwrap_or_default(),
    }
}
