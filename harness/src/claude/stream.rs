//! Claude's stream-json output, one line at a time, as the core's steps.
//!
//! Text comes as `stream_event` deltas (top level only; an `assistant` message that
//! was not streamed gives its text whole), tool calls as `assistant` `tool_use`
//! blocks, results as `user` `tool_result` blocks; a line with a `uuid` is mirrored
//! from the transcript before what it shows, so a tool result's line is journaled
//! before its completion. `compact_boundary` starts a compaction, whose summary is the
//! next user text.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::cli::{LineContext, Step};
use crate::{Decision, HarnessEvent, ToolCall};

/// The structured-output tool the CLI adds for `--json-schema`: plumbing, not a tool
/// call the client made the agent do.
const STRUCTURED_OUTPUT_TOOL: &str = "StructuredOutput";

/// What one turn's stdout said, besides its steps.
#[derive(Debug, Default)]
pub struct ClaudeTurn {
    tools: HashMap<String, ToolCall>,
    streamed_messages: HashSet<String>,
    compacting: bool,
    compact_summary: Option<String>,
    pre_compact_messages: u32,
    /// The `error` slug of the last `assistant` message that had one.
    pub(super) assistant_error: Option<String>,
    /// A `rate_limit_event` said the account's limit is reached until then (Unix
    /// seconds).
    pub(super) usage_reset: Option<i64>,
}

/// The steps one stdout line stands for.
pub(super) fn on_line(
    line: &str,
    turn: &mut ClaudeTurn,
    permissions: &mut Permissions,
    context: LineContext<'_>,
) -> Vec<Step> {
    let Ok(message) = serde_json::from_str::<Value>(line) else {
        return Vec::new();
    };
    let top_level = message["parent_tool_use_id"].is_null();
    let mut steps = Vec::new();
    match message["type"].as_str() {
        Some("stream_event") => {
            let event = &message["event"];
            if top_level
                && event["type"] == "content_block_delta"
                && event["delta"]["type"] == "text_delta"
                && let Some(text) = event["delta"]["text"].as_str()
            {
                steps.push(Step::Received);
                if let Some(id) = message["api_message_id"].as_str() {
                    turn.streamed_messages.insert(id.to_owned());
                }
                steps.push(Step::Emit(HarnessEvent::ContentDelta {
                    text: text.to_owned(),
                }));
            }
        }
        Some("assistant") => assistant(&message, top_level, turn, &mut steps),
        Some("rate_limit_event") => {
            let info = &message["rate_limit_info"];
            if info["status"] == "rejected" {
                turn.usage_reset = info["resetsAt"].as_i64();
            }
        }
        Some("control_request") if message["request"]["subtype"] == "can_use_tool" => {
            permission(&message, turn, permissions, context, &mut steps);
        }
        Some("user") => user(&message, turn, &mut steps),
        Some("system") if message["subtype"] == "compact_boundary" && !turn.compacting => {
            // Counted once, when it happens: every line so far precedes the boundary.
            turn.compacting = true;
            let earlier = context.transcript.lines().unwrap_or_default();
            turn.pre_compact_messages =
                conversation_messages(earlier.iter().chain(context.mirrored));
        }
        Some("result") => {
            steps.push(Step::Mirror(None));
            if turn.compacting {
                steps.push(Step::Emit(HarnessEvent::Compacted {
                    summary: turn.compact_summary.clone().unwrap_or_default(),
                    replaced_messages: turn.pre_compact_messages,
                }));
            }
            steps.push(Step::End(message));
        }
        _ => {}
    }
    steps
}

/// What a process remembers of its permission requests (`--permission-prompt-tool
/// stdio`): those waiting for a person's decision, and calls confirmed after the
/// process that asked was gone, to run without asking again.
#[derive(Debug, Default)]
pub struct Permissions {
    waiting: Vec<Waiting>,
    confirmed: Vec<(String, Value)>,
}

/// A `can_use_tool` request not answered yet.
#[derive(Debug)]
struct Waiting {
    request_id: String,
    tool_use_id: String,
    input: Value,
}

/// The answer to a `can_use_tool` request.
fn answer(request_id: &str, response: Value) -> String {
    serde_json::json!({
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": response},
    })
    .to_string()
}

/// A `can_use_tool` request: a call confirmed earlier runs; one that waits for a person
/// pauses the turn; any other is refused as the CLI would refuse it without a user to
/// ask (its `allowed_tools` and `permission_mode` did not allow it).
fn permission(
    message: &Value,
    turn: &mut ClaudeTurn,
    permissions: &mut Permissions,
    context: LineContext<'_>,
    steps: &mut Vec<Step>,
) {
    let request = &message["request"];
    let request_id = message["request_id"].as_str().unwrap_or_default();
    let name = request["tool_name"].as_str().unwrap_or_default();
    let input = request["input"].clone();
    let confirmed = permissions
        .confirmed
        .iter()
        .position(|(tool, args)| tool == name && *args == input);
    if let Some(at) = confirmed {
        permissions.confirmed.remove(at);
        let allow = serde_json::json!({"behavior": "allow", "updatedInput": input});
        steps.push(Step::Send(answer(request_id, allow)));
        return;
    }
    if !context.approvals.matches(name) {
        let deny = serde_json::json!({
            "behavior": "deny",
            "message": format!("Permission to use {name} has not been granted (allowed_tools, permission_mode)."),
        });
        steps.push(Step::Send(answer(request_id, deny)));
        return;
    }
    let tool_use_id = request["tool_use_id"].as_str().unwrap_or_default();
    let call = turn
        .tools
        .get(tool_use_id)
        .cloned()
        .unwrap_or_else(|| ToolCall {
            tool_call_id: tool_use_id.to_owned(),
            tool_name: name.to_owned(),
            tool_args: input.to_string(),
            ..ToolCall::default()
        });
    permissions.waiting.push(Waiting {
        request_id: request_id.to_owned(),
        tool_use_id: tool_use_id.to_owned(),
        input,
    });
    steps.push(Step::Mirror(None));
    steps.push(Step::Pause(vec![call]));
}

/// The answers to the requests a paused process waits on, when the continuation
/// decides them (`None` when it waits on none: a new process).
pub(super) fn decide(
    permissions: &mut Permissions,
    decisions: &[Decision],
    turn: &mut ClaudeTurn,
) -> Option<String> {
    if permissions.waiting.is_empty() || decisions.is_empty() {
        return None;
    }
    let mut lines = Vec::new();
    for waiting in permissions.waiting.drain(..) {
        let decision = decisions
            .iter()
            .find(|decision| decision.tool.tool_call_id == waiting.tool_use_id);
        let response = match decision {
            Some(decision) if decision.confirmed => {
                serde_json::json!({"behavior": "allow", "updatedInput": waiting.input})
            }
            Some(decision) => serde_json::json!({"behavior": "deny", "message": decision.denial()}),
            None => serde_json::json!({"behavior": "deny", "message": "No decision was made."}),
        };
        lines.push(answer(&waiting.request_id, response));
    }
    // Their results complete calls this turn did not see start.
    for decision in decisions {
        turn.tools
            .insert(decision.tool.tool_call_id.clone(), decision.tool.clone());
    }
    Some(lines.join("\n"))
}

/// Confirmed calls a new process may run when the model asks for them again.
pub(super) fn remember_confirmed(permissions: &mut Permissions, decisions: &[Decision]) {
    permissions.confirmed = decisions
        .iter()
        .filter(|decision| decision.confirmed)
        .map(|decision| {
            let input = serde_json::from_str(&decision.tool.tool_args).unwrap_or(Value::Null);
            (decision.tool.tool_name.clone(), input)
        })
        .collect();
}

fn assistant(message: &Value, top_level: bool, turn: &mut ClaudeTurn, steps: &mut Vec<Step>) {
    steps.push(Step::Received);
    if let Some(error) = message["error"].as_str() {
        turn.assistant_error = Some(error.to_owned());
    }
    if let Some(uuid) = message["uuid"].as_str() {
        steps.push(Step::Mirror(Some(uuid.to_owned())));
    }
    let streamed = message["message"]["id"]
        .as_str()
        .is_some_and(|id| turn.streamed_messages.contains(id));
    for block in message["message"]["content"]
        .as_array()
        .into_iter()
        .flatten()
    {
        match block["type"].as_str() {
            Some("text") if top_level && !streamed => {
                if let Some(text) = block["text"].as_str()
                    && message["message"]["model"] != "<synthetic>"
                {
                    steps.push(Step::Emit(HarnessEvent::ContentDelta {
                        text: text.to_owned(),
                    }));
                }
            }
            Some("tool_use") => {
                let name = block["name"].as_str().unwrap_or_default().to_owned();
                let id = block["id"].as_str().unwrap_or_default().to_owned();
                let tool = ToolCall {
                    tool_call_id: id.clone(),
                    tool_name: name.clone(),
                    tool_args: block["input"].to_string(),
                    result: None,
                    tool_call_error: false,
                    parent_tool_call_id: message["parent_tool_use_id"].as_str().map(str::to_owned),
                };
                turn.tools.insert(id, tool.clone());
                if name != STRUCTURED_OUTPUT_TOOL {
                    steps.push(Step::Emit(HarnessEvent::ToolCallStarted { tool }));
                }
            }
            _ => {}
        }
    }
}

fn user(message: &Value, turn: &mut ClaudeTurn, steps: &mut Vec<Step>) {
    steps.push(Step::Received);
    if let Some(uuid) = message["uuid"].as_str() {
        steps.push(Step::Mirror(Some(uuid.to_owned())));
    }
    let content = &message["message"]["content"];
    if turn.compacting
        && turn.compact_summary.is_none()
        && let Some(text) = content.as_str()
    {
        turn.compact_summary = Some(text.to_owned());
    }
    for block in content.as_array().into_iter().flatten() {
        if block["type"] != "tool_result" {
            continue;
        }
        let id = block["tool_use_id"].as_str().unwrap_or_default();
        let Some(mut tool) = turn.tools.remove(id) else {
            continue;
        };
        tool.result = Some(result_text(&block["content"]));
        tool.tool_call_error = block["is_error"].as_bool().unwrap_or(false);
        if tool.tool_name != STRUCTURED_OUTPUT_TOOL {
            steps.push(Step::Emit(HarnessEvent::ToolCallCompleted { tool }));
        }
    }
}

fn result_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The conversation messages (main-chain user and assistant lines) among transcript
/// lines: what a compaction replaces.
fn conversation_messages<'a>(lines: impl Iterator<Item = &'a String>) -> u32 {
    lines
        .filter(|line| {
            line.contains("\"type\":\"user\"") || line.contains("\"type\":\"assistant\"")
        })
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|value| matches!(value["type"].as_str(), Some("user" | "assistant")))
        .filter(|value| value["isSidechain"] != Value::Bool(true))
        .count() as u32
}
