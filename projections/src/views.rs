//! The views a client reads, as the fold leaves them: a run (status, content, tools,
//! checkpoints, attachments, fork point) and a session (its facts, transcript lengths,
//! metrics). Plain data; the fold that fills them is `session.rs`.

use crate::{DayCounts, SessionMetrics};
use serde::{Deserialize, Serialize};
use turnstile_journal::{
    ForkPoint, RunId, RunMetrics, RunOptions, Seq, SessionId, ToolCall, Warning,
};

/// Run status, with agno's wire names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RunStatus {
    /// Accepted, not started.
    Pending,
    /// Owns its session and is executing.
    Running,
    /// Ended with an answer.
    Completed,
    /// Ended in an error.
    Error,
    /// Cancelled.
    Cancelled,
    /// Waiting for a person's decision on its tool calls (`spec/approvals.md`); open.
    Paused,
}

impl RunStatus {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "PENDING",
            RunStatus::Running => "RUNNING",
            RunStatus::Completed => "COMPLETED",
            RunStatus::Error => "ERROR",
            RunStatus::Cancelled => "CANCELLED",
            RunStatus::Paused => "PAUSED",
        }
    }

    /// Whether the run has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Error | RunStatus::Cancelled
        )
    }
}

/// One tool call of a run, as agno's `ToolExecution` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolView {
    /// Id of the call.
    pub tool_call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Arguments (a JSON object).
    pub tool_args: serde_json::Value,
    /// Result text.
    pub result: Option<String>,
    /// Whether the tool failed.
    pub tool_call_error: bool,
    /// Spawning call, for subagents.
    pub parent_tool_call_id: Option<String>,
    /// The call waited (or waits) for a person's decision.
    #[serde(default)]
    pub requires_confirmation: bool,
    /// The decision, once made.
    #[serde(default)]
    pub confirmed: Option<bool>,
    /// The decision's note.
    #[serde(default)]
    pub confirmation_note: Option<String>,
}

/// A point a continuation can start from: the end of a tool result batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Boundary in the run's messages (`messages[..message_index]` are kept).
    pub message_index: u32,
    /// Lines of the run's harness transcript at that point.
    pub transcript_lines: u32,
    /// The tool call whose result ends the batch.
    pub tool_call_id: String,
    /// Microseconds since the epoch.
    pub created_at_us: i64,
}

/// A file attached to a run, as its input lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttachmentView {
    /// File name.
    pub name: String,
    /// Media type.
    pub media_type: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the content, hex.
    pub sha256: String,
}

/// A paused call and the decision on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecidedCall {
    /// The call, as the harness asked for it.
    pub tool: ToolCall,
    /// Whether it may run.
    pub confirmed: bool,
    /// The person's note.
    pub note: Option<String>,
}

/// A run as the journal tells it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunView {
    /// The run.
    pub run_id: RunId,
    /// Its session.
    pub session_id: SessionId,
    /// Agent.
    pub agent_id: String,
    /// Client's user id.
    pub user_id: Option<String>,
    /// Status.
    pub status: RunStatus,
    /// User's message.
    pub input: String,
    /// Run options as recorded.
    pub options: RunOptions,
    /// Content so far, or the final content.
    pub content: String,
    /// `str` or a schema title.
    pub content_type: String,
    /// Tool calls, in order of start.
    pub tools: Vec<ToolView>,
    /// Model.
    pub model: Option<String>,
    /// Model provider.
    pub model_provider: Option<String>,
    /// Metrics of a completed run.
    pub metrics: Option<RunMetrics>,
    /// Error class and message of a failed run.
    pub error: Option<(String, String)>,
    /// Whether the failure was of a retryable class (agno's `retryable`).
    pub retryable: bool,
    /// Attempts started.
    pub attempts: u32,
    /// Client-visible events recorded (= next event index).
    pub event_count: u64,
    /// Sequence of the run's first record in its session stream.
    pub queued_seq: Seq,
    /// The run queued before this one in the session (a branch's predecessor, unless
    /// the run is a continuation).
    pub previous_run: Option<RunId>,
    /// Submitted with `background=true`.
    pub background: bool,
    /// The last failed attempt: (attempt, error type, retryable).
    pub last_failure: Option<(u32, String, bool)>,
    /// Warnings shown to the client (retries, fallbacks, edited attachments).
    pub warnings: Vec<Warning>,
    /// The continuation point this run started from, if it is a continuation.
    pub fork: Option<ForkPoint>,
    /// The harness session the run's attempts used.
    pub harness_session_id: Option<String>,
    /// Lines of that transcript when the run's first attempt began.
    pub transcript_start: u32,
    /// Lines of that transcript when the run ended.
    pub transcript_end: u32,
    /// Tool-batch checkpoints, in order.
    pub checkpoints: Vec<Checkpoint>,
    /// Files attached to the run (their bytes stay in the journal).
    pub attachments: Vec<AttachmentView>,
    /// Microseconds since the epoch.
    pub created_at_us: i64,
    /// Microseconds since the epoch.
    pub updated_at_us: i64,
    /// While paused: the calls waiting for a decision, in the order asked.
    #[serde(default)]
    pub pending: Vec<ToolCall>,
    /// While paused: when it paused, microseconds since the epoch.
    #[serde(default)]
    pub paused_at_us: Option<i64>,
    /// Decisions not yet carried out: a call decided and not completed since.
    #[serde(default)]
    pub decisions: Vec<DecidedCall>,
    /// Decided and not started since: its next attempt applies the decisions.
    #[serde(default)]
    pub continued: bool,
    /// Attempts that spent nothing of the retry budget: ended by a pause, or by a
    /// usage limit waited out.
    #[serde(default)]
    pub unspent_attempts: u32,
    /// Waiting out a usage limit: when it resets, microseconds since the epoch.
    #[serde(default)]
    pub usage_wait_until_us: Option<i64>,
}

impl RunView {
    /// Attempts that count against the retry budget.
    pub fn spent_attempts(&self) -> u32 {
        self.attempts.saturating_sub(self.unspent_attempts)
    }

    /// How many messages the run has, as agno lists them: the user's, a call and a
    /// result per tool, and the answer once the run has ended with one.
    pub fn message_count(&self) -> u32 {
        let tools: u32 = self
            .tools
            .iter()
            .map(|tool| 1 + u32::from(tool.result.is_some()))
            .sum();
        let answer = u32::from(self.status.is_terminal() && !self.content.is_empty());
        1 + tools + answer
    }
}

/// The session's own facts.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SessionView {
    /// Agent the session belongs to (empty before `SessionCreated`).
    pub agent_id: String,
    /// Client's user id.
    pub user_id: Option<String>,
    /// Microseconds since the epoch.
    pub created_at_us: i64,
    /// Microseconds since the epoch.
    pub updated_at_us: i64,
    /// Sequence of the `SessionCreated` that began this session (a session id used
    /// again after a delete begins a new one; earlier runs are not its own).
    pub created_seq: u64,
    /// Harness session the next turn resumes (the newest branch).
    pub harness_session_id: Option<String>,
    /// Lines of every harness session's transcript (a session has few harness
    /// sessions: a list is smaller than a map).
    pub transcript_lines: Vec<(String, u32)>,
    /// Compactions, oldest first: (harness session, summary, messages replaced).
    pub compactions: Vec<(String, String, u32)>,
    /// Metrics summed over the session's completed runs.
    pub metrics: SessionMetrics,
    /// Deleted: the session and its runs read as gone (the journal keeps them).
    pub deleted: bool,
    /// agno's session name: the first line of the first message, shortened.
    pub name: String,
    /// Runs queued in the session.
    pub run_count: u64,
    /// The newest run.
    pub last_run: Option<RunId>,
    /// Runs with attachments, oldest first, with the sequence they were queued at.
    pub attachment_runs: Vec<(RunId, u64)>,
    /// Per day of a run's creation (`YYYY-MM-DD`, UTC), what the session's runs add to
    /// the daily metrics.
    pub days: Vec<(String, DayCounts)>,
}

impl SessionView {
    /// Lines of the transcript the next turn resumes.
    pub fn transcript_len(&self) -> u32 {
        self.harness_session_id
            .as_deref()
            .map_or(0, |id| self.lines_of(id))
    }

    /// Lines of one harness session's transcript.
    pub fn lines_of(&self, harness_session_id: &str) -> u32 {
        self.transcript_lines
            .iter()
            .find(|(id, _)| id == harness_session_id)
            .map_or(0, |(_, lines)| *lines)
    }

    pub(crate) fn lines_mut(&mut self, harness_session_id: &str) -> &mut u32 {
        let position = match self
            .transcript_lines
            .iter()
            .position(|(id, _)| id == harness_session_id)
        {
            Some(position) => position,
            None => {
                push_exact(
                    &mut self.transcript_lines,
                    (harness_session_id.to_owned(), 0),
                );
                self.transcript_lines.len() - 1
            }
        };
        &mut self.transcript_lines[position].1
    }

    pub(crate) fn day_mut(&mut self, date: String) -> &mut DayCounts {
        let position = match self.days.iter().position(|(day, _)| *day == date) {
            Some(position) => position,
            None => {
                push_exact(&mut self.days, (date, DayCounts::default()));
                self.days.len() - 1
            }
        };
        &mut self.days[position].1
    }
}

/// Pushes onto a list that is mostly read: its capacity grows by one, not by doubling
/// (a session holds these lists for as long as it lives, and most stay short).
pub(crate) fn push_exact<T>(list: &mut Vec<T>, item: T) {
    list.reserve_exact(1);
    list.push(item);
}

/// The day (`YYYY-MM-DD`, UTC) of a time in microseconds since the epoch.
pub fn date_of_us(us: i64) -> String {
    let days = (us / 1_000_000).div_euclid(86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
