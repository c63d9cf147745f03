//! The typed events of the whole mission, as the journal stores them.
//!
//! Run options and metrics are typed (format 4); what is free-form by nature (a
//! transcript line, tool arguments, an output schema, a harness's extra numbers)
//! travels as JSON `String`: bincode cannot decode `serde_json::Value`, internally tagged
//! or flattened enums, so every variant here is plain and externally tagged. Nothing
//! here knows agno's wire shapes: the gateway renders them.
//!
//! Compatibility rule: a new variant goes at the end (bincode encodes the variant
//! index); changing or reordering an existing variant is a new format version, and the
//! old one's types are frozen (`format3.rs`) to read old records.

use serde::{Deserialize, Serialize};

use crate::files::{FileChange, SnapshotPoint};
use crate::ids::{EventIndex, RunId};

/// One fact about a session, in past tense.
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
        /// How the run was asked for.
        options: RunOptions,
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
        /// The run (its answer and metrics are on its `RunEvent::Completed`, appended
        /// with this record).
        run_id: RunId,
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
    /// A piece of a workspace file's content, kept once per digest in its session
    /// (`spec/workspaces.md`): a file is stored as pieces of one `blob`, in order, the last
    /// naming the SHA-256 of them all. A snapshot that names a digest comes after it.
    WorkspaceContent {
        /// The run whose snapshot read the file.
        run_id: RunId,
        /// Which content these pieces are of (unique in the session).
        blob: String,
        /// Where this piece starts in the content.
        offset: u64,
        /// The bytes.
        bytes: Vec<u8>,
        /// On the last piece: the content's SHA-256, lowercase hex.
        digest: Option<String>,
    },
    /// What changed in the session's workspace since its last snapshot, as one set of
    /// changes; the workspace of a session is the fold of these, in order.
    WorkspaceChanged {
        /// The run it happened in.
        run_id: RunId,
        /// When the snapshot was taken.
        point: SnapshotPoint,
        /// The changes, by path.
        changes: Vec<FileChange>,
    },
}

/// A client-visible fact of a run, in order of its event index.
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
        /// Tokens, cost, timings, per model.
        metrics: RunMetrics,
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
    /// The run waits for a person's decision on these calls (`spec/approvals.md`): none
    /// of them has run. Not an end: the run stays open, holding its session, and its
    /// streams stop here until it is continued.
    Paused {
        /// The calls waiting, as the harness asked for them.
        tools: Vec<ToolCall>,
    },
    /// Every paused call was decided: the run goes on (its decision, durable).
    Continued {
        /// One per call the run paused on.
        decisions: Vec<ToolDecision>,
        /// Who decided (the caller's user, when known; `turnstile` for a timeout).
        decided_by: Option<String>,
    },
}

/// A person's decision on a paused tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDecision {
    /// The call.
    pub tool_call_id: String,
    /// Whether it may run.
    pub confirmed: bool,
    /// What the person said (told to the model when the call is denied).
    pub note: Option<String>,
}

impl RunEvent {
    /// Whether the event ends its run.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            RunEvent::Completed { .. } | RunEvent::Failed { .. } | RunEvent::Cancelled { .. }
        )
    }

    /// Whether a stream of the run stops after it, as it does at a terminal event
    /// (a pause: nothing follows until the run is continued).
    pub fn stops_stream(&self) -> bool {
        self.is_terminal() || matches!(self, RunEvent::Paused { .. })
    }

    /// The variant's name, for timelines and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            RunEvent::Started { .. } => "Started",
            RunEvent::ContentDelta { .. } => "ContentDelta",
            RunEvent::ReasoningDelta { .. } => "ReasoningDelta",
            RunEvent::ToolCallStarted { .. } => "ToolCallStarted",
            RunEvent::ToolCallCompleted { .. } => "ToolCallCompleted",
            RunEvent::Warning { .. } => "Warning",
            RunEvent::Completed { .. } => "Completed",
            RunEvent::Failed { .. } => "Failed",
            RunEvent::Cancelled { .. } => "Cancelled",
            RunEvent::Paused { .. } => "Paused",
            RunEvent::Continued { .. } => "Continued",
        }
    }
}

/// How a run was asked for, recorded with it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RunOptions {
    /// The client streams the run's events.
    pub stream: bool,
    /// The run was sent to the background.
    pub background: bool,
    /// The JSON Schema the answer must validate against, as JSON text.
    pub output_schema: Option<String>,
    /// Where a continuation forks the run it continues.
    pub fork: Option<ForkPoint>,
}

/// Where a continuation forked its source run's harness session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkPoint {
    /// The run continued from.
    pub from_run_id: RunId,
    /// The message boundary.
    pub message_index: u32,
    /// The harness session forked.
    pub harness_session_id: String,
    /// Lines of its transcript the fork keeps.
    pub transcript_lines: u32,
}

/// What a completed run used: tokens, cost and timings, in all and per model.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunMetrics {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Tokens written to the prompt cache.
    pub cache_write_tokens: u64,
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
    /// Cost in US dollars, when the harness knows it.
    pub cost_usd: Option<f64>,
    /// Seconds from the attempt's start to its answer.
    pub duration_s: f64,
    /// Seconds from the attempt's start to its first piece of content, if any came.
    pub first_token_s: Option<f64>,
    /// Per model (at least one: the run's own model when the harness names none).
    pub models: Vec<ModelMetrics>,
    /// The harness's own extra numbers, as the JSON text of an object (empty: none).
    pub additional: String,
}

/// One model's share of a run's usage.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelMetrics {
    /// Model id.
    pub id: String,
    /// Provider.
    pub provider: String,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Tokens written to the prompt cache.
    pub cache_write_tokens: u64,
    /// Cost in US dollars, when known.
    pub cost_usd: Option<f64>,
}

impl RunMetrics {
    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

impl ModelMetrics {
    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// One tool call of a run.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolCall {
    /// The harness's id of the call.
    pub tool_call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Arguments as JSON text.
    pub tool_args: String,
    /// Result text, once completed.
    pub result: Option<String>,
    /// Whether the tool reported an error.
    pub tool_call_error: bool,
    /// The call that spawned this one (subagents).
    pub parent_tool_call_id: Option<String>,
}

/// A warning shown on a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Warning {
    /// An attempt failed and the run retries after a delay.
    Retry {
        /// The attempt that failed (1 for the first).
        attempt: u32,
        /// Attempts allowed.
        attempts: u32,
        /// Seconds before the next attempt.
        delay_s: f64,
        /// Error class slug.
        error_type: String,
        /// Human message.
        message: String,
    },
    /// The harness session could not be resumed; the turn ran on a fresh one seeded
    /// with the conversation's history.
    SessionFallback {
        /// The harness's error.
        error: String,
    },
    /// Kept attachments were edited in the workspace since they were attached; the
    /// workspace's versions were left as they are.
    AttachmentsChanged {
        /// The files, relative to the agent's cwd.
        files: Vec<String>,
    },
    /// A snapshot of the workspace left files out (`workspace_max_*`); the run goes on.
    WorkspaceOverLimit {
        /// Each path left out, with the bound it is over.
        left_out: Vec<(String, String)>,
    },
    /// The account's usage limit was reached: the run waits until it resets, then tries
    /// again with the same run id, spending no attempt (`wait_on_usage_limit`). The
    /// warning is the wait's journaled timer.
    UsageLimit {
        /// When the limit resets (and the run tries again), microseconds since the epoch.
        resets_at_us: i64,
        /// The attempt that hit the limit.
        attempt: u32,
        /// What the harness said.
        message: String,
    },
}

impl Event {
    /// The run this event belongs to, if any.
    pub fn run_id(&self) -> Option<&RunId> {
        match self {
            Event::SessionCreated { .. } | Event::SessionDeleted { .. } => None,
            Event::RunQueued { run_id, .. }
            | Event::RunStarted { run_id, .. }
            | Event::AttemptStarted { run_id, .. }
            | Event::TranscriptLineAppended { run_id, .. }
            | Event::RunEventEmitted { run_id, .. }
            | Event::RunCompleted { run_id, .. }
            | Event::RunFailed { run_id, .. }
            | Event::RunCancelled { run_id, .. }
            | Event::AttemptFailed { run_id, .. }
            | Event::IdempotencyKeyBound { run_id, .. }
            | Event::HarnessSessionForked { run_id, .. }
            | Event::AttachmentAdded { run_id, .. }
            | Event::WorkspaceContent { run_id, .. }
            | Event::WorkspaceChanged { run_id, .. } => Some(run_id),
            Event::TranscriptCompacted { run_id, .. } => run_id.as_ref(),
            Event::StoredApart { .. } => None,
        }
    }

    /// The variant's name, for summaries and timelines.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::SessionCreated { .. } => "SessionCreated",
            Event::RunQueued { .. } => "RunQueued",
            Event::RunStarted { .. } => "RunStarted",
            Event::AttemptStarted { .. } => "AttemptStarted",
            Event::TranscriptLineAppended { .. } => "TranscriptLineAppended",
            Event::RunEventEmitted { .. } => "RunEventEmitted",
            Event::RunCompleted { .. } => "RunCompleted",
            Event::RunFailed { .. } => "RunFailed",
            Event::RunCancelled { .. } => "RunCancelled",
            Event::AttemptFailed { .. } => "AttemptFailed",
            Event::IdempotencyKeyBound { .. } => "IdempotencyKeyBound",
            Event::HarnessSessionForked { .. } => "HarnessSessionForked",
            Event::TranscriptCompacted { .. } => "TranscriptCompacted",
            Event::SessionDeleted { .. } => "SessionDeleted",
            Event::AttachmentAdded { .. } => "AttachmentAdded",
            Event::StoredApart { .. } => "StoredApart",
            Event::WorkspaceContent { .. } => "WorkspaceContent",
            Event::WorkspaceChanged { .. } => "WorkspaceChanged",
        }
    }

    /// Whether the event ends its run.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Event::RunCompleted { .. } | Event::RunFailed { .. } | Event::RunCancelled { .. }
        )
    }
}
