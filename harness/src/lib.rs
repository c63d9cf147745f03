//! The [`Harness`] trait, one turn of a coding agent, and its adapters.
//!
//! A harness runs one turn on its own session (the CLI's conversation), streams what
//! happens as [`HarnessEvent`]s, honours a cancellation signal, and ends in a
//! [`TurnOutcome`] or a classified [`HarnessError`]. Every transcript line it writes
//! is reported as an event so the runtime can journal it; before a turn the runtime
//! hands the transcript back, which is how a session resumes anywhere.
//!
//! The adapters: [`scripted`] (built in), and the real CLIs on one core ([`cli`]) with a
//! dialect each ([`claude`], [`codex`]); [`registry`] is the table that names them and
//! builds one from its configuration keys. Only this crate knows a CLI's dialect.
//!
//! This crate does not journal, schedule or retry: the actors do that.

pub mod claude;
pub mod cli;
pub mod codex;
pub mod paths;
pub mod registry;
pub mod scripted;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use turnstile_journal::{RunId, SessionId};

pub use claude::{ClaudeCodeHarness, ClaudeCodeOptions};
pub use registry::{HarnessConfig, HarnessContext};
pub use scripted::ScriptedHarness;

/// Who the harness is, for agent listings and `RunStarted`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarnessInfo {
    /// `scripted`, `claude-agent-sdk` or `codex` (agno's `metadata.sdk`).
    pub sdk: String,
    /// Model name recorded on runs.
    pub model: String,
    /// Provider of the model.
    pub model_provider: String,
}

/// Everything a harness needs for one turn.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    /// The run (the same for every attempt).
    pub run_id: RunId,
    /// The turnstile session.
    pub session_id: SessionId,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The user's message.
    pub message: String,
    /// The harness session to resume, if the session has one.
    pub harness_session_id: Option<String>,
    /// That harness session's transcript, as journaled: its length at once, its lines
    /// read only when the harness asks for them (a cold start).
    pub transcript: Transcript,
    /// A JSON Schema (JSON text) the final answer must satisfy, for harnesses that can
    /// ask their model for structured output.
    pub output_schema: Option<String>,
    /// The turn's working directory, as the runtime chose it (the agent's `cwd`, or the
    /// session's own directory under it with `workspace = "session"`); `None`: the
    /// harness's configured one.
    pub cwd: Option<std::path::PathBuf>,
    /// With workspace snapshots on: how a harness that can wait between its tool calls
    /// learns that the runtime recorded the workspace after each one (`None`: it need
    /// not wait).
    pub settled: Option<ToolsSettled>,
    /// Which tool calls wait for a person's decision (the agent's `approvals`): a
    /// harness pauses the turn before such a call runs ([`TurnOutcome::paused`]).
    pub approvals: Approvals,
    /// This run's turn paused before: the attempt goes on from where it paused (its
    /// transcript says where), it does not start the turn again.
    pub paused_before: bool,
    /// The decisions on the calls the turn paused on, not carried out yet: a confirmed
    /// call runs (once), a denied one is told to the model with the note.
    pub decisions: Vec<Decision>,
}

/// Tool-name patterns (`*` matches any run of characters) whose calls wait for a
/// person's decision (`spec/approvals.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Approvals {
    patterns: Vec<String>,
}

impl Approvals {
    /// The patterns, as configured.
    pub fn new(patterns: Vec<String>) -> Self {
        Approvals { patterns }
    }

    /// Whether no call waits.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether a call of `tool_name` waits for a decision.
    pub fn matches(&self, tool_name: &str) -> bool {
        self.patterns
            .iter()
            .any(|pattern| glob_matches(pattern.as_bytes(), tool_name.as_bytes()))
    }
}

/// `*` matches any run of characters; everything else itself.
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob_matches(rest, &text[skip..])),
        Some((byte, rest)) => text
            .split_first()
            .is_some_and(|(first, tail)| first == byte && glob_matches(rest, tail)),
    }
}

/// A person's decision on one paused call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The call, as the harness asked for it.
    pub tool: ToolCall,
    /// Whether it may run.
    pub confirmed: bool,
    /// The person's note.
    pub note: Option<String>,
}

impl Decision {
    /// What the model is told of a denial (the tool's result).
    pub fn denial(&self) -> String {
        match &self.note {
            Some(note) if !note.trim().is_empty() => {
                format!("A person denied this tool call: {note}")
            }
            _ => "A person denied this tool call.".to_owned(),
        }
    }

    /// The decision said as a message, for a harness that can only tell its model (a
    /// CLI resumed after its process was gone).
    pub fn message(decisions: &[Decision]) -> String {
        let mut text =
            String::from("[turnstile] A person decided on the tool calls you asked for:\n");
        for decision in decisions {
            let verdict = if decision.confirmed {
                "approved: run it now, exactly as proposed".to_owned()
            } else {
                decision.denial()
            };
            text.push_str(&format!(
                "- {} {} ({}): {verdict}\n",
                decision.tool.tool_name, decision.tool.tool_args, decision.tool.tool_call_id
            ));
        }
        text
    }
}

/// The count of this attempt's completed tool calls after which the runtime has
/// recorded the session's workspace (`spec/workspaces.md`): a harness that waits for it
/// before its next call makes each checkpoint's snapshot exactly that call's files.
#[derive(Debug, Clone)]
pub struct ToolsSettled(tokio::sync::watch::Receiver<u64>);

impl ToolsSettled {
    /// The runtime's end, which counts, and the harness's.
    pub fn channel() -> (tokio::sync::watch::Sender<u64>, ToolsSettled) {
        let (sender, receiver) = tokio::sync::watch::channel(0);
        (sender, ToolsSettled(receiver))
    }

    /// Waits until `count` calls are recorded (or the runtime's end is gone).
    pub async fn wait(&self, count: u64) {
        let mut receiver = self.0.clone();
        let _ = receiver.wait_for(|recorded| *recorded >= count).await;
    }
}

/// Reads a transcript's lines when a harness first needs them.
pub type TranscriptLoader = dyn Fn() -> Result<Vec<String>, String> + Send + Sync;

/// A harness session's transcript, oldest line first: its length is known without
/// reading it; its lines are read once, when a harness first asks (a warm CLI process
/// or a plain turn of the scripted harness never does), then shared.
#[derive(Clone, Default)]
pub struct Transcript {
    /// Lines of the loaded part.
    base_len: usize,
    base: std::sync::Arc<TranscriptBase>,
    /// Lines added since (this turn's, in order).
    added: Vec<String>,
}

#[derive(Default)]
struct TranscriptBase {
    loader: Option<Box<TranscriptLoader>>,
    lines: std::sync::OnceLock<Result<Vec<String>, String>>,
}

impl std::fmt::Debug for Transcript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transcript")
            .field("lines", &self.len())
            .finish()
    }
}

impl Transcript {
    /// A transcript whose lines are at hand.
    pub fn from_lines(lines: Vec<String>) -> Self {
        let base = TranscriptBase::default();
        let base_len = lines.len();
        let _ = base.lines.set(Ok(lines));
        Transcript {
            base_len,
            base: std::sync::Arc::new(base),
            added: Vec::new(),
        }
    }

    /// A transcript of `len` lines that `loader` reads when first asked; the loader
    /// must return exactly those lines.
    pub fn lazy(
        len: usize,
        loader: impl Fn() -> Result<Vec<String>, String> + Send + Sync + 'static,
    ) -> Self {
        Transcript {
            base_len: len,
            base: std::sync::Arc::new(TranscriptBase {
                loader: Some(Box::new(loader)),
                lines: std::sync::OnceLock::new(),
            }),
            added: Vec::new(),
        }
    }

    /// Lines, without reading them.
    pub fn len(&self) -> usize {
        self.base_len + self.added.len()
    }

    /// Whether it has no line.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds a line at the end.
    pub fn push(&mut self, line: String) {
        self.added.push(line);
    }

    /// Adds lines at the end.
    pub fn extend(&mut self, lines: impl IntoIterator<Item = String>) {
        self.added.extend(lines);
    }

    /// Empties it (a fresh harness session).
    pub fn clear(&mut self) {
        *self = Transcript::default();
    }

    /// The lines, read from the journal the first time.
    pub fn lines(&self) -> Result<Vec<String>, HarnessError> {
        let base = self.base.lines.get_or_init(|| match &self.base.loader {
            Some(loader) => loader(),
            None => Ok(Vec::new()),
        });
        let base = base.as_ref().map_err(|message| HarnessError::Failed {
            kind: ErrorKind::Transient,
            message: format!("the transcript could not be read: {message}"),
        })?;
        if base.len() != self.base_len {
            return Err(HarnessError::Failed {
                kind: ErrorKind::Transient,
                message: format!(
                    "the transcript read has {} lines where {} were journaled",
                    base.len(),
                    self.base_len
                ),
            });
        }
        let mut lines = Vec::with_capacity(self.len());
        lines.extend(base.iter().cloned());
        lines.extend(self.added.iter().cloned());
        Ok(lines)
    }
}

/// One tool call (the journal's type: a harness reports it as the journal records it).
pub use turnstile_journal::ToolCall;

/// What a harness reports while a turn runs.
#[derive(Debug, Clone, PartialEq)]
pub enum HarnessEvent {
    /// The harness session this turn runs on (new or resumed).
    SessionStarted {
        /// Its id.
        harness_session_id: String,
    },
    /// A line the harness wrote to its transcript.
    TranscriptLine {
        /// The line.
        line: String,
    },
    /// A piece of the answer text.
    ContentDelta {
        /// The text.
        text: String,
    },
    /// A piece of the model's reasoning, shown beside the answer (not part of it).
    ReasoningDelta {
        /// The text.
        text: String,
    },
    /// A tool call began.
    ToolCallStarted {
        /// The call (without result).
        tool: ToolCall,
    },
    /// A tool call ended.
    ToolCallCompleted {
        /// The call with its result.
        tool: ToolCall,
    },
    /// The harness compacted its session during the turn (its transcript lines say how).
    Compacted {
        /// The summary that stands for the replaced messages.
        summary: String,
        /// How many messages it replaces.
        replaced_messages: u32,
    },
}

/// Token and cost usage of one turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
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
    /// Usage per model, when the harness reports it (one `details.model` entry each).
    #[serde(default)]
    pub models: Vec<ModelUsage>,
    /// Harness-specific numbers (`num_turns`, `api_duration`): agno's `additional_metrics`.
    #[serde(default)]
    pub additional: serde_json::Map<String, serde_json::Value>,
}

/// One model's share of a turn's usage: what the journal records per model.
pub type ModelUsage = turnstile_journal::ModelMetrics;

/// How a turn ended well.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// Final answer (JSON text for structured output).
    pub content: String,
    /// Usage reported by the harness.
    pub usage: Usage,
    /// The turn paused before these calls ran, waiting for a person's decision
    /// ([`TurnRequest::approvals`]); empty for a turn that ended with an answer.
    pub paused: Vec<ToolCall>,
}

impl TurnOutcome {
    /// A turn that paused before `calls` ran.
    pub fn paused(calls: Vec<ToolCall>) -> Self {
        TurnOutcome {
            content: String::new(),
            usage: Usage::default(),
            paused: calls,
        }
    }
}

/// Classes of failure; the permanent ones are never retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// Overload, rate limit, server error, a crashed process: worth another attempt.
    Transient,
    /// Bad or missing credentials.
    Authentication,
    /// Out of credit.
    Billing,
    /// The request itself is wrong.
    InvalidRequest,
    /// The conversation no longer fits the model.
    ContextWindow,
    /// Refused by a usage policy.
    Policy,
    /// The agent hit its turn limit.
    MaxTurns,
    /// The agent hit its budget.
    MaxBudget,
    /// The harness session to resume does not exist (any more): the runtime falls back
    /// to a fresh session seeded with the history.
    SessionNotFound,
}

impl ErrorKind {
    /// Whether another attempt may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::Transient)
    }

    /// The wire slug (`error_type`).
    pub fn slug(self) -> &'static str {
        match self {
            ErrorKind::Transient => "transient",
            ErrorKind::Authentication => "authentication",
            ErrorKind::Billing => "billing",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::ContextWindow => "context_window",
            ErrorKind::Policy => "policy",
            ErrorKind::MaxTurns => "max_turns",
            ErrorKind::MaxBudget => "max_budget",
            ErrorKind::SessionNotFound => "session_not_found",
        }
    }

    /// Parses a slug (the scripted harness's `/fail permanent KIND`).
    pub fn from_slug(slug: &str) -> Option<ErrorKind> {
        [
            ErrorKind::Transient,
            ErrorKind::Authentication,
            ErrorKind::Billing,
            ErrorKind::InvalidRequest,
            ErrorKind::ContextWindow,
            ErrorKind::Policy,
            ErrorKind::MaxTurns,
            ErrorKind::MaxBudget,
            ErrorKind::SessionNotFound,
        ]
        .into_iter()
        .find(|kind| kind.slug() == slug)
    }
}

/// How a turn ended badly.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HarnessError {
    /// The cancellation signal fired; the turn stopped.
    #[error("Run cancelled")]
    Cancelled,
    /// The account's usage limit is reached until `resets_at_us` (microseconds since the
    /// epoch): the runtime waits it out (`wait_on_usage_limit`) or fails the run.
    #[error("{message}")]
    UsageLimit {
        /// What the harness said.
        message: String,
        /// When the limit resets.
        resets_at_us: i64,
    },
    /// The turn failed.
    #[error("{message}")]
    Failed {
        /// Its class.
        kind: ErrorKind,
        /// What happened, for humans.
        message: String,
    },
}

/// Sends harness events; a closed receiver means nobody journals them any more, which
/// only happens when the run task is gone, so the turn stops as if cancelled.
pub type EventSink = mpsc::Sender<HarnessEvent>;

/// What compacting a harness session needs.
#[derive(Debug, Clone)]
pub struct CompactRequest {
    /// The turnstile session.
    pub session_id: SessionId,
    /// The harness session to compact.
    pub harness_session_id: String,
    /// Its transcript, oldest first.
    pub transcript: Vec<String>,
    /// The session's working directory, as for its turns ([`TurnRequest::cwd`]).
    pub cwd: Option<std::path::PathBuf>,
}

/// How a compaction ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Compaction {
    /// The session was compacted: `lines` go at the end of its transcript.
    Compacted {
        /// Transcript lines that record the compaction (boundary and summary).
        lines: Vec<String>,
        /// The summary.
        summary: String,
        /// How many messages it replaces.
        replaced_messages: u32,
    },
    /// Nothing worth compacting.
    NothingToCompact {
        /// Why, for humans.
        reason: String,
    },
}

/// One coding agent behind a uniform turn interface.
pub trait Harness: Send + Sync + 'static {
    /// Identity for listings and `RunStarted`.
    fn info(&self) -> HarnessInfo;

    /// Runs one turn. The future owns what it needs (`'static`), streams events into
    /// `events`, and returns promptly with [`HarnessError::Cancelled`] once `cancel` fires.
    fn run_turn(
        &self,
        request: TurnRequest,
        events: EventSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<TurnOutcome, HarnessError>>;

    /// Compacts a harness session outside a turn (the compact route).
    fn compact(
        &self,
        request: CompactRequest,
    ) -> BoxFuture<'static, Result<Compaction, HarnessError>>;

    /// Stops whatever the harness keeps running between turns (warm CLI processes);
    /// the runtime calls it when it shuts down.
    fn shutdown(&self) {}

    /// Whether this harness can run a turn with this message at all, checked when the
    /// request arrives so that nothing is recorded for one that cannot (the scripted
    /// harness's directives); `Err` says why, naming the line.
    fn check_message(&self, _message: &str) -> Result<(), String> {
        Ok(())
    }
}
