//! The session fold: the session's own facts, its harness transcripts, and a view of
//! each of its runs with the checkpoints a continuation can start from.
//!
//! Client-visible run events are stored as agno-shaped JSON; the fold reads from them
//! only what a run view needs (streamed content, tool calls, warnings).

use std::collections::HashMap;

use serde::Serialize;
use turnstile_journal::{Event, Recorded, RunId, Seq, SessionId};

/// Run status, with agno's wire names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, PartialEq)]
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
    /// Submitted with `background=true`.
    pub background: bool,
    /// The last failed attempt: (attempt, error type, retryable).
    pub last_failure: Option<(u32, String, bool)>,
    /// Warnings shown to the client (retries, fallbacks), as agno's warning objects.
    pub warnings: Vec<serde_json::Value>,
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
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionView {
    /// Agent the session belongs to (empty before `SessionCreated`).
    pub agent_id: String,
    /// Client's user id.
    pub user_id: Option<String>,
    /// Microseconds since the epoch.
    pub created_at_us: i64,
    /// Microseconds since the epoch.
    pub updated_at_us: i64,
    /// Harness session the next turn resumes (the newest branch).
    pub harness_session_id: Option<String>,
    /// Every harness session's transcript, oldest line first.
    pub transcripts: HashMap<String, Vec<String>>,
    /// Compactions, oldest first: (harness session, summary, messages replaced).
    pub compactions: Vec<(String, String, u32)>,
    /// Metrics summed over the session's completed runs.
    pub metrics: SessionMetrics,
    /// Deleted: the session and its runs read as gone (the journal keeps them).
    pub deleted: bool,
}

/// Token and cost totals of a session's completed runs (agno's `SessionMetrics`).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ModelDetails {
    /// One entry per model id and provider, in the order first seen.
    pub model: Vec<serde_json::Map<String, serde_json::Value>>,
}

impl ModelDetails {
    /// Adds one run's entry: numbers are summed, a cost only once some run had one.
    fn add(&mut self, entry: &serde_json::Map<String, serde_json::Value>) {
        let key = |e: &serde_json::Map<String, serde_json::Value>| {
            (e.get("id").cloned(), e.get("provider").cloned())
        };
        let Some(total) = self.model.iter_mut().find(|total| key(total) == key(entry)) else {
            self.model.push(entry.clone());
            return;
        };
        for (name, value) in entry {
            let sum = match (total.get(name), value) {
                (_, serde_json::Value::Null) => continue,
                (Some(before), added) if before.is_u64() && added.is_u64() => {
                    serde_json::json!(before.as_u64().unwrap_or(0) + added.as_u64().unwrap_or(0))
                }
                (Some(before), added) if added.is_number() => serde_json::json!(
                    before.as_f64().unwrap_or(0.0) + added.as_f64().unwrap_or(0.0)
                ),
                (None, added) if added.is_number() => added.clone(),
                _ => continue,
            };
            total.insert(name.clone(), sum);
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
            if let Some(entry) = entry.as_object() {
                self.details.add(entry);
            }
        }
        self.runs += 1;
    }
}

impl SessionView {
    /// The transcript the next turn resumes.
    pub fn transcript(&self) -> &[String] {
        self.harness_session_id
            .as_ref()
            .and_then(|id| self.transcripts.get(id))
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    fn transcript_len(&self, harness_session_id: &str) -> u32 {
        self.transcripts
            .get(harness_session_id)
            .map_or(0, |lines| lines.len() as u32)
    }
}

/// A session and its runs: the fold of one session stream.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    /// The session.
    pub session_id: SessionId,
    /// Its facts.
    pub session: SessionView,
    /// Its runs, oldest first.
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

    /// Whether the session exists: created, and not deleted since.
    pub fn exists(&self) -> bool {
        !self.session.agent_id.is_empty() && !self.session.deleted
    }

    /// A run by id.
    pub fn run(&self, run_id: &RunId) -> Option<&RunView> {
        self.runs.iter().rev().find(|run| &run.run_id == run_id)
    }

    fn run_mut(&mut self, run_id: &RunId) -> Option<&mut RunView> {
        self.runs.iter_mut().rev().find(|run| &run.run_id == run_id)
    }

    /// Runs that have not ended, oldest first.
    pub fn open_runs(&self) -> impl Iterator<Item = &RunView> {
        self.runs.iter().filter(|run| !run.status.is_terminal())
    }

    /// Applies one record.
    pub fn apply(&mut self, record: &Recorded) {
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
                self.session.agent_id = agent_id.clone();
                self.session.user_id = user_id.clone();
                self.session.created_at_us = ts;
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
                harness_session_id,
                line,
                ..
            } => {
                self.session.harness_session_id = Some(harness_session_id.clone());
                self.session
                    .transcripts
                    .entry(harness_session_id.clone())
                    .or_default()
                    .push(line.clone());
            }
            Event::AttemptStarted {
                harness_session_id, ..
            } => {
                self.session.harness_session_id = Some(harness_session_id.clone());
                self.session
                    .transcripts
                    .entry(harness_session_id.clone())
                    .or_default();
            }
            Event::HarnessSessionForked {
                from_harness_session_id,
                harness_session_id,
                transcript_lines,
                ..
            } => {
                let kept: Vec<String> = self
                    .session
                    .transcripts
                    .get(from_harness_session_id)
                    .map(|lines| {
                        lines
                            .iter()
                            .take(*transcript_lines as usize)
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                self.session
                    .transcripts
                    .insert(harness_session_id.clone(), kept);
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
                self.session
                    .transcripts
                    .entry(harness_session_id.clone())
                    .or_default()
                    .extend(lines.iter().cloned());
                self.session.harness_session_id = Some(harness_session_id.clone());
                self.session.compactions.push((
                    harness_session_id.clone(),
                    summary.clone(),
                    *replaced_messages,
                ));
            }
            _ => {}
        }
        let current_lines = self
            .session
            .harness_session_id
            .as_deref()
            .map_or(0, |id| self.session.transcript_len(id));
        let Some(run_id) = record.event.run_id() else {
            return;
        };
        let Some(run) = self.run_mut(run_id) else {
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
                event_index,
                event_type,
                data,
                ..
            } => {
                run.event_count = event_index.0 + 1;
                apply_wire_event(run, event_type, data, current_lines, ts);
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
                self.session.metrics.add(metrics);
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
                name,
                media_type,
                sha256,
                content,
                ..
            } => {
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

fn apply_wire_event(
    run: &mut RunView,
    event_type: &str,
    data: &str,
    transcript_lines: u32,
    ts: i64,
) {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(data) else {
        return;
    };
    match event_type {
        "RunContent" => {
            if let Some(text) = value["content"].as_str() {
                run.content.push_str(text);
            }
        }
        "ToolCallStarted" | "ToolCallCompleted" => {
            let tool = &value["tool"];
            let Some(id) = tool["tool_call_id"].as_str() else {
                return;
            };
            let view = ToolView {
                tool_call_id: id.to_owned(),
                tool_name: tool["tool_name"].as_str().unwrap_or_default().to_owned(),
                tool_args: tool["tool_args"].clone(),
                result: tool["result"].as_str().map(str::to_owned),
                tool_call_error: tool["tool_call_error"].as_bool().unwrap_or(false),
                parent_tool_call_id: tool["parent_tool_call_id"].as_str().map(str::to_owned),
            };
            let position = match run.tools.iter().position(|known| known.tool_call_id == id) {
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
            if event_type == "ToolCallCompleted" && tool["parent_tool_call_id"].is_null() {
                run.checkpoints.push(Checkpoint {
                    message_index: 3 + 2 * position as u32,
                    transcript_lines,
                    tool_call_id: id.to_owned(),
                    created_at_us: ts,
                });
            }
        }
        "CustomEvent" if !value["warning"].is_null() => {
            run.warnings.push(value["warning"].clone());
        }
        _ => {}
    }
}

impl SessionState {
    /// The stored form of the session's own facts (without its runs, which are stored
    /// one key each): what `journal rebuild` compares, with the sequence it is as of.
    pub fn session_summary(&self) -> serde_json::Value {
        serde_json::json!({
            "session_id": self.session_id,
            "as_of_seq": self.next_seq,
            "agent_id": self.session.agent_id,
            "user_id": self.session.user_id,
            "deleted": self.session.deleted,
            "metrics": self.session.metrics,
            "harness_session_id": self.session.harness_session_id,
            "compactions": self.session.compactions.len(),
            "runs": self.runs.len(),
        })
    }

    /// The stored form of one run: status, content, tools, attempts, events, metrics,
    /// checkpoints, lineage, attachments, and the sequence it is as of.
    pub fn run_summary(&self, run: &RunView) -> serde_json::Value {
        serde_json::json!({
            "session_id": self.session_id,
            "as_of_seq": self.next_seq,
            "run_id": run.run_id,
            "status": run.status.as_str(),
            "content": run.content,
            "content_type": run.content_type,
            "tools": run.tools.iter().map(|tool| &tool.tool_call_id).collect::<Vec<_>>(),
            "attempts": run.attempts,
            "events": run.event_count,
            "metrics": run.metrics,
            "checkpoints": run.checkpoints.iter().map(|c| (c.message_index, c.transcript_lines)).collect::<Vec<_>>(),
            "forked_from": run.fork.as_ref().map(|fork| (fork.from_run_id.to_string(), fork.message_index)),
            "attachments": run.attachments.len(),
        })
    }
}
