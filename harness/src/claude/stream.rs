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
use crate::{HarnessEvent, ToolCall};

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
}

/// The steps one stdout line stands for.
pub(super) fn on_line(line: &str, turn: &mut ClaudeTurn, context: LineContext<'_>) -> Vec<Step> {
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
