//! The session fold: the session's own facts, the length of each harness transcript,
//! and a view of each of its runs with the checkpoints a continuation can start from.
//!
//! The fold is incremental: a state holds the session's facts and the runs it has
//! folded and not yet retired (the open ones, at least), and applies each new record
//! once. Its stored forms ([`StoredSession`], [`StoredRun`]) are complete, so a state
//! is resumed from them plus the records after the sequence they are as of, never from
//! the session's first record. Transcript lines are not part of the state (they grow
//! with the conversation): [`Transcripts`] folds them when a harness needs them.
//!
//! Client-visible run events are typed ([`RunEvent`]); the fold reads from them what a
//! run view needs (streamed content, tool calls, warnings). No HTTP shape is known here.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use turnstile_journal::{Event, Recorded, RunEvent, RunId, Seq, SessionId, Warning};

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

/// Where a continuation run starts: which run, which message, which transcript prefix.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
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
    /// Run options as recorded (JSON text).
    pub options: String,
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
    /// Metrics JSON text of a completed run.
    pub metrics: Option<String>,
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
}

impl RunView {
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

/// What one session's runs of one day add to agno's daily metrics.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DayCounts {
    /// Runs created that day.
    pub runs: u64,
    /// Their user ids.
    pub users: Vec<String>,
    /// Token totals of the completed ones, in [`TOKEN_KEYS`] order.
    pub tokens: [f64; 7],
    /// Completed runs per (model, provider).
    pub models: Vec<(String, String, u64)>,
}

/// Token and cost totals of a session's completed runs (agno's `SessionMetrics`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SessionMetrics {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input plus output tokens.
    pub total_tokens: u64,
    /// Tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Tokens written to the prompt cache.
    pub cache_write_tokens: u64,
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
    /// Cost in US dollars, when any run reported one.
    pub cost: Option<f64>,
    /// Completed runs counted.
    pub runs: u64,
    /// Per model, the runs' `details.model` entries summed (agno's
    /// `accumulate_from_run`): `{"model": [{id, provider, input_tokens, …}]}`.
    pub details: ModelDetails,
}

/// The per-model totals of a session's runs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelDetails {
    /// One entry per model id and provider, in the order first seen.
    pub model: Vec<ModelTotals>,
}

/// One model's totals over a session's runs (an entry of agno's `details.model`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelTotals {
    /// Model id.
    pub id: String,
    /// Model provider.
    pub provider: String,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input plus output tokens.
    pub total_tokens: u64,
    /// Tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Tokens written to the prompt cache.
    pub cache_write_tokens: u64,
    /// Cost in US dollars, once some run reported one.
    pub cost: Option<f64>,
}

impl ModelDetails {
    /// Adds one run's entry: numbers are summed, a cost only once some run had one.
    fn add(&mut self, entry: &serde_json::Value) {
        let text = |key: &str| entry[key].as_str().unwrap_or_default();
        let (id, provider) = (text("id"), text("provider"));
        let position = match self
            .model
            .iter()
            .position(|total| total.id == id && total.provider == provider)
        {
            Some(position) => position,
            None => {
                let totals = ModelTotals {
                    id: id.to_owned(),
                    provider: provider.to_owned(),
                    ..ModelTotals::default()
                };
                push_exact(&mut self.model, totals);
                self.model.len() - 1
            }
        };
        let total = &mut self.model[position];
        let tokens = |key: &str| entry[key].as_u64().unwrap_or(0);
        total.input_tokens += tokens("input_tokens");
        total.output_tokens += tokens("output_tokens");
        total.total_tokens += tokens("total_tokens");
        total.cache_read_tokens += tokens("cache_read_tokens");
        total.cache_write_tokens += tokens("cache_write_tokens");
        if let Some(cost) = entry["cost"].as_f64() {
            total.cost = Some(total.cost.unwrap_or(0.0) + cost);
        }
    }
}

impl SessionMetrics {
    fn add(&mut self, metrics: &str) {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(metrics) else {
            return;
        };
        let tokens = |key: &str| value[key].as_u64().unwrap_or(0);
        self.input_tokens += tokens("input_tokens");
        self.output_tokens += tokens("output_tokens");
        self.total_tokens += tokens("total_tokens");
        self.cache_read_tokens += tokens("cache_read_tokens");
        self.cache_write_tokens += tokens("cache_write_tokens");
        self.reasoning_tokens += tokens("reasoning_tokens");
        if let Some(cost) = value["cost"].as_f64() {
            self.cost = Some(self.cost.unwrap_or(0.0) + cost);
        }
        for entry in value["details"]["model"].as_array().into_iter().flatten() {
            if entry.is_object() {
                self.details.add(entry);
            }
        }
        self.runs += 1;
    }
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

    fn lines_mut(&mut self, harness_session_id: &str) -> &mut u32 {
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

    fn day_mut(&mut self, date: String) -> &mut DayCounts {
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
fn push_exact<T>(list: &mut Vec<T>, item: T) {
    list.reserve_exact(1);
    list.push(item);
}

/// The token keys of agno's daily `token_metrics`, in the order of [`DayCounts::tokens`].
pub const TOKEN_KEYS: [&str; 7] = [
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cost",
];

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

/// The stored form of a session: its facts and its open runs' ids, as of a sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredSession {
    /// The session.
    pub session_id: SessionId,
    /// The sequence after the last record folded in.
    pub as_of_seq: u64,
    /// Its facts.
    pub session: SessionView,
    /// Runs not ended, oldest first (their own stored forms hold them).
    pub open_runs: Vec<RunId>,
}

/// The stored form of one run, as of a sequence of its session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRun {
    /// The run's session.
    pub session_id: SessionId,
    /// The sequence after the last record folded in.
    pub as_of_seq: u64,
    /// The run.
    pub run: RunView,
}

/// What a run's stream needs to know of it (which agent and session it is of, where it
/// is, how many events it has), read from its stored form without the rest: a run's
/// tool calls and content are skipped, not built.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RunHead {
    /// The run.
    pub run_id: RunId,
    /// Its session.
    pub session_id: SessionId,
    /// Agent.
    pub agent_id: String,
    /// Status.
    pub status: RunStatus,
    /// Client-visible events recorded (= next event index).
    pub event_count: u64,
    /// Sequence of the run's first record in its session stream.
    pub queued_seq: Seq,
}

impl RunHead {
    /// The head of a whole run.
    pub fn of(run: &RunView) -> RunHead {
        RunHead {
            run_id: run.run_id.clone(),
            session_id: run.session_id.clone(),
            agent_id: run.agent_id.clone(),
            status: run.status,
            event_count: run.event_count,
            queued_seq: run.queued_seq,
        }
    }
}

/// [`StoredRun`] read as far as its run's [`RunHead`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StoredRunHead {
    /// The run's head.
    pub run: RunHead,
}

/// A session and the runs it holds: the fold of one session stream.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    /// The session.
    pub session_id: SessionId,
    /// Its facts.
    pub session: SessionView,
    /// The runs this state holds, oldest first: every open run, and the ended runs
    /// folded since it was resumed and not retired ([`SessionState::retire`]).
    pub runs: Vec<RunView>,
    /// The sequence after the last record folded in.
    pub next_seq: u64,
}

impl SessionState {
    /// The empty state of a session with no events.
    pub fn new(session_id: SessionId) -> Self {
        SessionState {
            session_id,
            session: SessionView::default(),
            runs: Vec::new(),
            next_seq: 0,
        }
    }

    /// Folds a whole stream.
    pub fn fold<'a>(
        session_id: SessionId,
        records: impl IntoIterator<Item = &'a Recorded>,
    ) -> Self {
        let mut state = SessionState::new(session_id);
        for record in records {
            state.apply(record);
        }
        state
    }

    /// Resumes a state from its stored form and its open runs' stored forms; `None`
    /// when an open run's stored form is missing or is not the pending run it was
    /// (a stop lost a write): the caller then folds from the first record.
    pub fn resume(stored: StoredSession, open_runs: Vec<Option<StoredRun>>) -> Option<Self> {
        let mut runs = Vec::with_capacity(open_runs.len());
        for (run_id, found) in stored.open_runs.iter().zip(open_runs) {
            let found = found?;
            // A stored run is written when it is accepted and when it ends; in between
            // its events are folded from the session's records, which start here after
            // a pending run (a pending run has no events past its acceptance).
            if &found.run.run_id != run_id || found.run.status != RunStatus::Pending {
                return None;
            }
            runs.push(found.run);
        }
        if runs.len() != stored.open_runs.len() {
            return None;
        }
        Some(SessionState {
            session_id: stored.session_id,
            session: stored.session,
            runs,
            next_seq: stored.as_of_seq,
        })
    }

    /// The stored form of the state.
    pub fn stored(&self) -> StoredSession {
        StoredSession {
            session_id: self.session_id.clone(),
            as_of_seq: self.next_seq,
            session: self.session.clone(),
            open_runs: self.open_runs().map(|run| run.run_id.clone()).collect(),
        }
    }

    /// The stored form of one run it holds.
    pub fn stored_run(&self, run: &RunView) -> StoredRun {
        StoredRun {
            session_id: self.session_id.clone(),
            as_of_seq: self.next_seq,
            run: run.clone(),
        }
    }

    /// Forgets the ended runs (their stored forms keep them); returns how many.
    pub fn retire(&mut self) -> usize {
        let before = self.runs.len();
        self.runs.retain(|run| !run.status.is_terminal());
        // An idle session holds no run: its list should not keep room for several
        // (a run is ~0.7 KiB, and an idle actor would keep four runs' room).
        self.runs.shrink_to_fit();
        before - self.runs.len()
    }

    /// Whether a run belongs to this session as it is now (not to an earlier session
    /// of the same id, deleted since).
    pub fn owns(&self, run: &RunView) -> bool {
        self.owns_head(&RunHead::of(run))
    }

    /// [`SessionState::owns`] for a run's head.
    pub fn owns_head(&self, run: &RunHead) -> bool {
        run.session_id == self.session_id && run.queued_seq.0 >= self.session.created_seq
    }

    /// Whether the session exists: created, and not deleted since.
    pub fn exists(&self) -> bool {
        !self.session.agent_id.is_empty() && !self.session.deleted
    }

    /// A run by id.
    pub fn run(&self, run_id: &RunId) -> Option<&RunView> {
        self.runs.iter().rev().find(|run| &run.run_id == run_id)
    }

    /// Runs that have not ended, oldest first.
    pub fn open_runs(&self) -> impl Iterator<Item = &RunView> {
        self.runs.iter().filter(|run| !run.status.is_terminal())
    }

    /// Applies one record: the next of the stream. A record the state already holds
    /// (its sequence is below [`SessionState::next_seq`]) changes nothing, so a state
    /// read from a stored form and the records after it, or given a record twice, is
    /// still the fold of the stream (issue 27: a `RunQueued` applied twice made a run
    /// start twice after a SIGKILL).
    pub fn apply(&mut self, record: &Recorded) {
        if record.seq.0 < self.next_seq {
            return;
        }
        self.next_seq = record.seq.0 + 1;
        let ts = record.ts_us;
        self.session.updated_at_us = ts;
        match &record.event {
            Event::SessionCreated { agent_id, user_id } => {
                // A session id used again after a delete starts a new session.
                if self.session.deleted {
                    *self = SessionState {
                        next_seq: self.next_seq,
                        ..SessionState::new(self.session_id.clone())
                    };
                }
                // A second `SessionCreated` of the same session (concurrent first turns
                // of older builds) changes nothing.
                if self.session.agent_id.is_empty() {
                    self.session.agent_id = agent_id.clone();
                    self.session.user_id = user_id.clone();
                    self.session.created_at_us = ts;
                    self.session.created_seq = record.seq.0;
                }
            }
            Event::RunQueued {
                run_id,
                agent_id,
                user_id,
                input,
                options,
            } => {
                let options_json: serde_json::Value =
                    serde_json::from_str(options).unwrap_or_default();
                if self.session.run_count == 0 {
                    self.session.name = input
                        .lines()
                        .find(|line| !line.trim().is_empty())
                        .map(|line| line.chars().take(50).collect())
                        .unwrap_or_default();
                }
                self.session.run_count += 1;
                let previous_run = self.session.last_run.replace(run_id.clone());
                let day = self.session.day_mut(date_of_us(ts));
                day.runs += 1;
                if let Some(user) = user_id
                    && !day.users.contains(user)
                {
                    push_exact(&mut day.users, user.clone());
                }
                self.runs.push(RunView {
                    run_id: run_id.clone(),
                    session_id: self.session_id.clone(),
                    agent_id: agent_id.clone(),
                    user_id: user_id.clone(),
                    status: RunStatus::Pending,
                    input: input.clone(),
                    options: options.clone(),
                    content: String::new(),
                    content_type: "str".into(),
                    tools: Vec::new(),
                    model: None,
                    model_provider: None,
                    metrics: None,
                    error: None,
                    retryable: false,
                    attempts: 0,
                    event_count: 0,
                    queued_seq: record.seq,
                    previous_run,
                    background: options_json["background"].as_bool().unwrap_or(false),
                    last_failure: None,
                    warnings: Vec::new(),
                    fork: serde_json::from_value(options_json["fork"].clone()).ok(),
                    harness_session_id: None,
                    transcript_start: 0,
                    transcript_end: 0,
                    checkpoints: Vec::new(),
                    attachments: Vec::new(),
                    created_at_us: ts,
                    updated_at_us: ts,
                });
            }
            Event::TranscriptLineAppended {
                harness_session_id, ..
            } => {
                self.session.harness_session_id = Some(harness_session_id.clone());
                *self.session.lines_mut(harness_session_id) += 1;
            }
            Event::AttemptStarted {
                harness_session_id, ..
            } => {
                self.session.harness_session_id = Some(harness_session_id.clone());
                self.session.lines_mut(harness_session_id);
            }
            Event::HarnessSessionForked {
                from_harness_session_id,
                harness_session_id,
                transcript_lines,
                ..
            } => {
                let kept = self
                    .session
                    .lines_of(from_harness_session_id)
                    .min(*transcript_lines);
                *self.session.lines_mut(harness_session_id) = kept;
                self.session.harness_session_id = Some(harness_session_id.clone());
            }
            Event::SessionDeleted { .. } => self.session.deleted = true,
            Event::TranscriptCompacted {
                harness_session_id,
                summary,
                replaced_messages,
                lines,
                ..
            } => {
                *self.session.lines_mut(harness_session_id) += lines.len() as u32;
                self.session.harness_session_id = Some(harness_session_id.clone());
                push_exact(
                    &mut self.session.compactions,
                    (
                        harness_session_id.clone(),
                        summary.clone(),
                        *replaced_messages,
                    ),
                );
            }
            _ => {}
        }
        let current_lines = self.session.transcript_len();
        let Some(run_id) = record.event.run_id() else {
            return;
        };
        let session = &mut self.session;
        let Some(run) = self.runs.iter_mut().rev().find(|run| &run.run_id == run_id) else {
            return;
        };
        run.updated_at_us = ts;
        match &record.event {
            Event::RunStarted {
                model,
                model_provider,
                ..
            } => {
                run.status = RunStatus::Running;
                run.model = Some(model.clone());
                run.model_provider = Some(model_provider.clone());
            }
            Event::AttemptStarted {
                attempt,
                harness_session_id,
                ..
            } => {
                run.attempts = *attempt;
                if run.harness_session_id.is_none() {
                    run.harness_session_id = Some(harness_session_id.clone());
                    run.transcript_start = current_lines;
                }
            }
            Event::RunEventEmitted {
                event_index, event, ..
            } => {
                run.event_count = event_index.0 + 1;
                apply_run_event(run, event, current_lines, ts);
            }
            Event::RunCompleted {
                content,
                content_type,
                metrics,
                ..
            } => {
                run.status = RunStatus::Completed;
                run.content = content.clone();
                run.content_type = content_type.clone();
                run.metrics = Some(metrics.clone());
                run.transcript_end = current_lines;
                session.metrics.add(metrics);
                let day = session.day_mut(date_of_us(run.created_at_us));
                day.add_completed(
                    metrics,
                    run.model.as_deref().unwrap_or_default(),
                    run.model_provider.as_deref().unwrap_or_default(),
                );
            }
            Event::RunFailed {
                error_type,
                message,
                retryable,
                ..
            } => {
                run.status = RunStatus::Error;
                run.content = message.clone();
                run.error = Some((error_type.clone(), message.clone()));
                run.retryable = *retryable;
                run.transcript_end = current_lines;
            }
            Event::RunCancelled { reason, .. } => {
                run.status = RunStatus::Cancelled;
                run.content = reason.clone();
                run.transcript_end = current_lines;
            }
            Event::AttachmentAdded {
                run_id,
                name,
                media_type,
                sha256,
                content,
            } => {
                if run.attachments.is_empty() {
                    let entry = (run_id.clone(), run.queued_seq.0);
                    push_exact(&mut session.attachment_runs, entry);
                }
                run.attachments.push(AttachmentView {
                    name: name.clone(),
                    media_type: media_type.clone(),
                    size: content.len() as u64,
                    sha256: sha256.clone(),
                });
            }
            Event::AttemptFailed {
                attempt,
                error_type,
                retryable,
                ..
            } => {
                run.last_failure = Some((*attempt, error_type.clone(), *retryable));
            }
            _ => {}
        }
    }
}

fn apply_run_event(run: &mut RunView, event: &RunEvent, transcript_lines: u32, ts: i64) {
    match event {
        RunEvent::ContentDelta { text } => run.content.push_str(text),
        // Reasoning is shown as it streams and kept in the journal, not in the answer.
        RunEvent::ReasoningDelta { .. } => {}
        RunEvent::ToolCallStarted { tool } | RunEvent::ToolCallCompleted { tool } => {
            let view = ToolView {
                tool_call_id: tool.tool_call_id.clone(),
                tool_name: tool.tool_name.clone(),
                tool_args: serde_json::from_str(&tool.tool_args).unwrap_or(serde_json::Value::Null),
                result: tool.result.clone(),
                tool_call_error: tool.tool_call_error,
                parent_tool_call_id: tool.parent_tool_call_id.clone(),
            };
            let id = &tool.tool_call_id;
            let position = match run.tools.iter().position(|known| &known.tool_call_id == id) {
                Some(position) => {
                    run.tools[position] = view;
                    position
                }
                None => {
                    run.tools.push(view);
                    run.tools.len() - 1
                }
            };
            // Messages are: the user's, then per tool a call and a result, then the
            // answer; so the boundary after tool k's result is 3 + 2k. Subagent calls are
            // not checkpoints: a fork keeps whole top-level batches only.
            if matches!(event, RunEvent::ToolCallCompleted { .. })
                && tool.parent_tool_call_id.is_none()
            {
                run.checkpoints.push(Checkpoint {
                    message_index: 3 + 2 * position as u32,
                    transcript_lines,
                    tool_call_id: id.clone(),
                    created_at_us: ts,
                });
            }
        }
        RunEvent::Warning { warning } => run.warnings.push(warning.clone()),
        RunEvent::Started { .. }
        | RunEvent::Completed { .. }
        | RunEvent::Failed { .. }
        | RunEvent::Cancelled { .. } => {}
    }
}

impl DayCounts {
    fn add_completed(&mut self, metrics: &str, model: &str, provider: &str) {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(metrics) else {
            return;
        };
        for (total, key) in self.tokens.iter_mut().zip(TOKEN_KEYS) {
            *total += value[key].as_f64().unwrap_or(0.0);
        }
        match self
            .models
            .iter_mut()
            .find(|(m, p, _)| m == model && p == provider)
        {
            Some((_, _, count)) => *count += 1,
            None => push_exact(&mut self.models, (model.to_owned(), provider.to_owned(), 1)),
        }
    }
}

/// Every harness session's transcript lines, oldest first, folded from a session stream
/// (a fork starts with a prefix of the session it forks; a compaction appends). Only a
/// harness that starts cold needs them, so they are not part of [`SessionState`].
#[derive(Debug, Clone, Default)]
pub struct Transcripts {
    lines: HashMap<String, Vec<String>>,
}

impl Transcripts {
    /// Applies one record.
    pub fn apply(&mut self, record: &Recorded) {
        match &record.event {
            Event::TranscriptLineAppended {
                harness_session_id,
                line,
                ..
            } => self
                .lines
                .entry(harness_session_id.clone())
                .or_default()
                .push(line.clone()),
            Event::HarnessSessionForked {
                from_harness_session_id,
                harness_session_id,
                transcript_lines,
                ..
            } => {
                let kept: Vec<String> = self
                    .lines
                    .get(from_harness_session_id)
                    .map(|lines| {
                        lines
                            .iter()
                            .take(*transcript_lines as usize)
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                self.lines.insert(harness_session_id.clone(), kept);
            }
            Event::TranscriptCompacted {
                harness_session_id,
                lines,
                ..
            } => self
                .lines
                .entry(harness_session_id.clone())
                .or_default()
                .extend(lines.iter().cloned()),
            // A session id used again after a delete begins with no transcript.
            Event::SessionDeleted { .. } => self.lines.clear(),
            _ => {}
        }
    }

    /// One harness session's lines.
    pub fn of(&self, harness_session_id: &str) -> &[String] {
        self.lines
            .get(harness_session_id)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Takes one harness session's lines.
    pub fn take(mut self, harness_session_id: &str) -> Vec<String> {
        self.lines.remove(harness_session_id).unwrap_or_default()
    }
}
