//! Wire shapes: agno's agent and `RunOutput` JSON, built from runtime views.
//!
//! The views come from the journal; this module only renders them, the way agno
//! 3.1.10's `RunSchema` / `AgentResponse` look, so agno's client parses them. Each
//! shape is a type whose derived schema is the one `/openapi.json` shows.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use turnstile_actors::AgentSpec;
use turnstile_projections::{AttachmentView, RunView, SessionMetrics, SessionState, ToolView};
use utoipa::ToSchema;

/// agno's agent object (`GET /agents`, `GET /agents/{agent_id}`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Agent {
    /// The agent's id, as configured.
    pub id: String,
    /// Its display name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// The model its harness runs.
    pub model: AgentModel,
    /// `sdk`: the harness family (`scripted`, or a CLI harness's own name).
    pub metadata: Sdk,
}

/// An agent's model.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AgentModel {
    /// The model's name.
    pub name: String,
    /// The same, agno's second field.
    pub model: String,
    /// Its provider.
    pub provider: String,
}

/// The harness family of an agent or session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Sdk {
    /// The harness family: `scripted`, or a CLI harness's own name.
    pub sdk: String,
}

/// agno's agent object.
pub fn agent(agent: &AgentSpec) -> Agent {
    let info = agent.harness.info();
    Agent {
        id: agent.id.clone(),
        name: agent.name.clone(),
        description: agent.description.clone(),
        model: AgentModel {
            name: info.model.clone(),
            model: info.model,
            provider: info.model_provider,
        },
        metadata: Sdk { sdk: info.sdk },
    }
}

fn seconds(us: i64) -> i64 {
    us / 1_000_000
}

/// One message of a run, as agno lists them.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Message {
    /// `user`, `assistant` or `tool`.
    pub role: Cow<'static, str>,
    /// The text (`null` for an assistant message that only calls a tool).
    pub content: Option<String>,
    /// An assistant message's tool call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// The call a tool message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A tool call inside an assistant message (the chat-completions shape, as agno keeps it).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MessageToolCall {
    /// The call's id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: Cow<'static, str>,
    /// The tool and its arguments.
    pub function: MessageFunction,
}

/// The function of a [`MessageToolCall`].
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MessageFunction {
    /// The tool's name.
    pub name: String,
    /// Its arguments as JSON text.
    pub arguments: String,
}

/// agno's messages for a run: the user's input, one assistant call and one tool
/// result per tool, then the final assistant answer.
fn messages(run: &RunView) -> Vec<Message> {
    let mut messages = vec![Message {
        role: Cow::Borrowed("user"),
        content: Some(run.input.clone()),
        tool_calls: None,
        tool_call_id: None,
    }];
    for tool in &run.tools {
        messages.push(Message {
            role: Cow::Borrowed("assistant"),
            content: None,
            tool_calls: Some(vec![MessageToolCall {
                id: tool.tool_call_id.clone(),
                kind: Cow::Borrowed("function"),
                function: MessageFunction {
                    name: tool.tool_name.clone(),
                    arguments: tool.tool_args.to_string(),
                },
            }]),
            tool_call_id: None,
        });
        if let Some(result) = &tool.result {
            messages.push(Message {
                role: Cow::Borrowed("tool"),
                content: Some(result.clone()),
                tool_calls: None,
                tool_call_id: Some(tool.tool_call_id.clone()),
            });
        }
    }
    if run.status.is_terminal() && !run.content.is_empty() {
        messages.push(Message {
            role: Cow::Borrowed("assistant"),
            content: Some(run.content.clone()),
            tool_calls: None,
            tool_call_id: None,
        });
    }
    messages
}

/// A tool call of a run (agno's `ToolExecution`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    /// The call's id.
    pub tool_call_id: String,
    /// The tool's name (`Bash`, `mcp__<server>__<tool>`, …).
    pub tool_name: String,
    /// Its arguments.
    #[schema(value_type = Object)]
    pub tool_args: Value,
    /// Its result, once it has one.
    pub result: Option<String>,
    /// Whether it failed.
    pub tool_call_error: bool,
    /// The call that delegated it (a subagent's tool calls name their `Task`).
    pub parent_tool_call_id: Option<String>,
    /// The call waited (or waits) for a person's decision (`approvals`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_confirmation: bool,
    /// The decision, once made (`null` while it waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<bool>,
    /// The decision's note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_note: Option<String>,
}

impl From<&ToolView> for ToolCall {
    fn from(tool: &ToolView) -> ToolCall {
        ToolCall {
            tool_call_id: tool.tool_call_id.clone(),
            tool_name: tool.tool_name.clone(),
            tool_args: tool.tool_args.clone(),
            result: tool.result.clone(),
            tool_call_error: tool.tool_call_error,
            parent_tool_call_id: tool.parent_tool_call_id.clone(),
            requires_confirmation: tool.requires_confirmation,
            confirmed: tool.confirmed,
            confirmation_note: tool.confirmation_note.clone(),
        }
    }
}

/// A run's metadata.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunMetadata {
    /// The harness family of the run's agent.
    pub sdk: String,
    /// Warnings, such as a retry between attempts
    /// (`{"type":"retry","attempt","attempts","delay",…}`).
    #[schema(value_type = Vec<Object>)]
    pub warnings: Vec<Value>,
    /// Attempts made, when more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// A failed run's error class (`timeout`, `rate_limited`, `authentication`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// A failed run: whether a retry could succeed (false for the permanent classes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

/// A run's input.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunInput {
    /// The message.
    pub input_content: String,
    /// The attachments' manifest (name, media type, size, sha256), when it has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub files: Option<Vec<AttachmentView>>,
}

/// agno's `RunOutput`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunOutput {
    /// The run.
    pub run_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Its agent's name.
    pub agent_name: String,
    /// Its session.
    pub session_id: String,
    /// Its user.
    pub user_id: Option<String>,
    /// `PENDING`, `RUNNING`, `PAUSED`, `COMPLETED`, `ERROR` or `CANCELLED`.
    pub status: Cow<'static, str>,
    /// The answer: text, or the parsed object when the run had an `output_schema`.
    pub content: Value,
    /// `str`, or the output schema's `title`.
    pub content_type: String,
    /// The run's tool calls, in order.
    pub tools: Vec<ToolCall>,
    /// agno's messages.
    pub messages: Vec<Message>,
    /// Token usage, duration and per-model details (agno's `Metrics`), once known.
    #[schema(value_type = Option<Object>)]
    pub metrics: Value,
    /// The run's metadata.
    pub metadata: RunMetadata,
    /// The model.
    pub model: Option<String>,
    /// Its provider.
    pub model_provider: Option<String>,
    /// The input.
    pub input: RunInput,
    /// The run this one continues, when it is a continuation.
    pub forked_from_run_id: Option<String>,
    /// The message of that run it continues after.
    pub forked_from_message_index: Option<u32>,
    /// Seconds since the epoch.
    pub created_at: i64,
    /// Seconds since the epoch.
    pub updated_at: i64,
    /// While the run is `PAUSED`: one requirement per call waiting for a decision
    /// (agno's `RunRequirement`: `id`, `created_at`, `tool_execution`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub requirements: Option<Vec<Value>>,
    /// The stored events of a streamed run whose agent keeps them, less the skipped
    /// types (by default `RunContent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub events: Option<Vec<Value>>,
}

/// agno's `RunOutput` for a run.
pub fn run_output(run: &RunView, agent_name: &str, sdk: String) -> RunOutput {
    let metrics = run
        .metrics
        .as_ref()
        .map_or(Value::Null, crate::wire::metrics::metrics_json);
    let metadata = RunMetadata {
        sdk,
        warnings: run
            .warnings
            .iter()
            .map(crate::wire::events::warning_json)
            .collect(),
        attempts: (run.attempts > 1).then_some(run.attempts),
        error_type: run.error.as_ref().map(|(error_type, _)| error_type.clone()),
        retryable: run.error.as_ref().map(|_| run.retryable),
    };
    RunOutput {
        run_id: run.run_id.to_string(),
        agent_id: run.agent_id.clone(),
        agent_name: agent_name.to_owned(),
        session_id: run.session_id.to_string(),
        user_id: run.user_id.clone(),
        status: Cow::Borrowed(run.status.as_str()),
        content: crate::wire::events::content_json(&run.content, &run.content_type),
        content_type: run.content_type.clone(),
        tools: run.tools.iter().map(ToolCall::from).collect(),
        messages: messages(run),
        metrics,
        metadata,
        model: run.model.clone(),
        model_provider: run.model_provider.clone(),
        input: RunInput {
            input_content: run.input.clone(),
            files: (!run.attachments.is_empty()).then(|| run.attachments.clone()),
        },
        forked_from_run_id: run.fork.as_ref().map(|fork| fork.from_run_id.to_string()),
        forked_from_message_index: run.fork.as_ref().map(|fork| fork.message_index),
        created_at: seconds(run.created_at_us),
        updated_at: seconds(run.updated_at_us),
        requirements: (run.status == turnstile_projections::RunStatus::Paused).then(|| {
            let paused_at = run.paused_at_us.unwrap_or(run.updated_at_us);
            run.pending
                .iter()
                .map(|tool| crate::wire::events::requirement_json(tool, paused_at))
                .collect()
        }),
        events: None,
    }
}

/// `202` for a background run: it is in the durable queue.
#[derive(Debug, Serialize, ToSchema)]
pub struct Accepted {
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// `PENDING`, or the run's status when an `Idempotency-Key` named an earlier one.
    pub status: &'static str,
}

fn preview(text: &str) -> String {
    text.chars().take(120).collect()
}

/// One change of `GET …/runs/{run_id}/files` (ext, `spec/workspaces.md`).
#[derive(Debug, Serialize, ToSchema)]
pub struct FileChanged {
    /// Relative to the session's workspace.
    pub path: String,
    /// `added`, `modified` or `removed`.
    pub change: String,
    /// Bytes (a symlink: its target's text); none when removed.
    pub size: Option<u64>,
    /// SHA-256 of the content, lowercase hex; none when removed.
    pub digest: Option<String>,
    /// The tool call after which it was recorded; none at the end of the turn, or for a
    /// continuation's rewind.
    pub tool_call_id: Option<String>,
    /// When it was recorded: `tool_call`, `turn_end`, `turn_start` (what was there before
    /// the session's first turn) or `rewound` (a continuation's checkpoint).
    pub point: String,
}

/// `GET …/checkpoints`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Checkpoints {
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// One entry per tool-result batch, then `end`.
    pub checkpoints: Vec<CheckpointEntry>,
}

/// A point a continuation can start from.
#[derive(Debug, Serialize, ToSchema)]
pub struct CheckpointEntry {
    /// `1`, `2`, … in order.
    pub checkpoint_id: String,
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// Messages kept before the point.
    pub message_index: u32,
    /// What to send as `continue_from`: the message index, or `end`.
    pub continue_from: ContinuePoint,
    /// `RUNNING` for a batch inside the run; the run's status for `end`.
    pub status: &'static str,
    /// `checkpoint` or `end`.
    pub reason: &'static str,
    /// Seconds since the epoch.
    pub created_at: i64,
    /// The tool call whose result ends the batch.
    pub message_id: Option<String>,
    /// `tool`, `assistant` or `user`: the role of the message at the point.
    pub message_role: &'static str,
    /// Its first 120 characters.
    pub message_preview: String,
    /// Whether this is the last entry.
    pub is_latest: bool,
}

/// A checkpoint's `continue_from`: a message index, or `"end"`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ContinuePoint {
    /// After this many messages.
    MessageIndex(u32),
    /// `end`: after the whole run.
    End(&'static str),
}

/// agno's checkpoint list for a run: one entry per tool-result batch, then `end`.
pub fn checkpoints(run: &RunView) -> Checkpoints {
    let mut entries: Vec<CheckpointEntry> = run
        .checkpoints
        .iter()
        .map(|checkpoint| {
            let result = run
                .tools
                .iter()
                .find(|tool| tool.tool_call_id == checkpoint.tool_call_id)
                .and_then(|tool| tool.result.clone())
                .unwrap_or_default();
            CheckpointEntry {
                checkpoint_id: String::new(),
                run_id: run.run_id.to_string(),
                session_id: run.session_id.to_string(),
                message_index: checkpoint.message_index,
                continue_from: ContinuePoint::MessageIndex(checkpoint.message_index),
                status: "RUNNING",
                reason: "checkpoint",
                created_at: seconds(checkpoint.created_at_us),
                message_id: Some(checkpoint.tool_call_id.clone()),
                message_role: "tool",
                message_preview: preview(&result),
                is_latest: false,
            }
        })
        .collect();
    entries.push(CheckpointEntry {
        checkpoint_id: String::new(),
        run_id: run.run_id.to_string(),
        session_id: run.session_id.to_string(),
        message_index: run.message_count(),
        continue_from: ContinuePoint::End("end"),
        status: run.status.as_str(),
        reason: "end",
        created_at: seconds(run.updated_at_us),
        message_id: None,
        message_role: if run.status.is_terminal() && !run.content.is_empty() {
            "assistant"
        } else {
            "user"
        },
        message_preview: preview(&run.content),
        is_latest: false,
    });
    let last = entries.len() - 1;
    for (ordinal, entry) in entries.iter_mut().enumerate() {
        entry.checkpoint_id = (ordinal + 1).to_string();
        entry.is_latest = ordinal == last;
    }
    Checkpoints {
        run_id: run.run_id.to_string(),
        session_id: run.session_id.to_string(),
        checkpoints: entries,
    }
}

/// agno's session name: the first line of the session's first message, shortened.
pub fn session_name(session: &SessionState) -> String {
    session.session.name.clone()
}

/// One item of `GET /sessions` (agno's `SessionSchema`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionSummary {
    /// The session.
    pub session_id: String,
    /// The first line of its first message, shortened.
    pub session_name: String,
    /// Always `null` (agno's field).
    #[schema(value_type = Option<Object>)]
    pub session_state: Option<Value>,
    /// Always `agent`.
    pub session_type: Cow<'static, str>,
    /// Its agent.
    pub agent_id: String,
    /// Its user.
    pub user_id: Option<String>,
    /// Token and cost totals of its completed runs (agno's `SessionMetrics`).
    #[schema(value_type = Object)]
    pub metrics: SessionMetrics,
    /// `metrics.total_tokens`.
    pub total_tokens: u64,
    /// The harness family.
    pub metadata: Sdk,
    /// Seconds since the epoch.
    pub created_at: i64,
    /// Seconds since the epoch.
    pub updated_at: i64,
}

/// One item of `GET /sessions` (agno's `SessionSchema`).
pub fn session_summary(session: &SessionState, sdk: &str) -> SessionSummary {
    let view = &session.session;
    SessionSummary {
        session_id: session.session_id.to_string(),
        session_name: session_name(session),
        session_state: None,
        session_type: Cow::Borrowed("agent"),
        agent_id: view.agent_id.clone(),
        user_id: view.user_id.clone(),
        metrics: view.metrics.clone(),
        total_tokens: view.metrics.total_tokens,
        metadata: Sdk {
            sdk: sdk.to_owned(),
        },
        created_at: seconds(view.created_at_us),
        updated_at: seconds(view.updated_at_us),
    }
}

/// `GET /sessions/{session_id}` (agno's `AgentSessionDetailSchema`, plus the harness
/// session).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionDetail {
    /// The session.
    pub session_id: String,
    /// The same (agno's field).
    pub agent_session_id: String,
    /// The first line of its first message, shortened.
    pub session_name: String,
    /// Always `null` (agno's field).
    #[schema(value_type = Option<String>)]
    pub session_summary: Option<String>,
    /// Always `null` (agno's field).
    #[schema(value_type = Option<Object>)]
    pub session_state: Option<Value>,
    /// Its agent.
    pub agent_id: String,
    /// Its user.
    pub user_id: Option<String>,
    /// The agent's id, name and harness family.
    pub agent_data: AgentData,
    /// `metrics.total_tokens`.
    pub total_tokens: u64,
    /// Token and cost totals of its completed runs, per-model entries summed in
    /// `details.model` (agno 3.1.10's name).
    #[schema(value_type = Object)]
    pub metrics: SessionMetrics,
    /// The same, agno's older name.
    #[schema(value_type = Object)]
    pub session_metrics: SessionMetrics,
    /// The harness family, the harness's own session id and the number of runs.
    pub metadata: SessionMetadata,
    /// Seconds since the epoch.
    pub created_at: i64,
    /// Seconds since the epoch.
    pub updated_at: i64,
}

/// A session's agent.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AgentData {
    /// Its id.
    pub agent_id: String,
    /// Its name.
    pub agent_name: String,
    /// Its harness family.
    pub sdk: String,
}

/// A session's metadata.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionMetadata {
    /// The harness family.
    pub sdk: String,
    /// The harness's own session (the CLI's session or thread id), once it has one.
    pub harness_session_id: Option<String>,
    /// Runs in the session.
    pub runs: u64,
}

/// `GET /sessions/{id}` (agno's `AgentSessionDetailSchema`, plus the harness session).
pub fn session_detail(session: &SessionState, sdk: &str, agent_name: &str) -> SessionDetail {
    let view = &session.session;
    SessionDetail {
        session_id: session.session_id.to_string(),
        agent_session_id: session.session_id.to_string(),
        session_name: session_name(session),
        session_summary: None,
        session_state: None,
        agent_id: view.agent_id.clone(),
        user_id: view.user_id.clone(),
        agent_data: AgentData {
            agent_id: view.agent_id.clone(),
            agent_name: agent_name.to_owned(),
            sdk: sdk.to_owned(),
        },
        total_tokens: view.metrics.total_tokens,
        metrics: view.metrics.clone(),
        session_metrics: view.metrics.clone(),
        metadata: SessionMetadata {
            sdk: sdk.to_owned(),
            harness_session_id: view.harness_session_id.clone(),
            runs: view.run_count,
        },
        created_at: seconds(view.created_at_us),
        updated_at: seconds(view.updated_at_us),
    }
}

/// A page of a list.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PageMeta {
    /// This page, from 1.
    pub page: usize,
    /// Items per page.
    pub limit: usize,
    /// Pages in all.
    pub total_pages: usize,
    /// Items in all.
    pub total_count: usize,
}

/// `GET /sessions`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionPage {
    /// The sessions of this page.
    pub data: Vec<SessionSummary>,
    /// Where the page is.
    pub meta: PageMeta,
}

/// `GET /agents/{agent_id}/runs`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RunPage {
    /// The runs of this page, newest first.
    pub data: Vec<RunOutput>,
    /// Where the page is.
    pub meta: PageMeta,
}

/// `POST …/compact`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Compacted {
    /// `compacted`, or why nothing was done.
    pub status: &'static str,
    /// A sentence for a person.
    pub message: String,
    /// Whether the harness session was compacted.
    pub compacted: bool,
    /// The harness's compaction record, when it wrote one.
    #[schema(value_type = Option<Object>)]
    pub record: Option<Value>,
}

/// `GET /health`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: &'static str,
}

/// `POST …/cancel`: always `{}` (agno's answer; the intent is recorded).
#[derive(Debug, Serialize, ToSchema)]
pub struct Empty {}

/// One tool call waiting for a person's decision (`GET /approvals`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PendingApproval {
    /// The run's agent.
    pub agent_id: String,
    /// The run's session.
    pub session_id: String,
    /// The paused run.
    pub run_id: String,
    /// The call.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// Its arguments.
    #[schema(value_type = Object)]
    pub tool_args: Value,
    /// When the run paused, seconds since the epoch.
    pub paused_at: i64,
}

/// `GET /approvals`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApprovalPage {
    /// The calls of this page, oldest pause first.
    pub data: Vec<PendingApproval>,
    /// Where the page is.
    pub meta: PageMeta,
}

/// A paused run's pending call, as `GET /approvals` lists it.
pub fn pending_approval(
    run: &RunView,
    call: &turnstile_journal::ToolCall,
    paused_at_us: i64,
) -> PendingApproval {
    PendingApproval {
        agent_id: run.agent_id.clone(),
        session_id: run.session_id.to_string(),
        run_id: run.run_id.to_string(),
        tool_call_id: call.tool_call_id.clone(),
        tool_name: call.tool_name.clone(),
        tool_args: serde_json::from_str(&call.tool_args).unwrap_or(Value::Null),
        paused_at: seconds(paused_at_us),
    }
}
