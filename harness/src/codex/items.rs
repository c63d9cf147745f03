//! Codex's thread items as the run's tool calls: a command, an MCP call, a file
//! change, a web search or a dynamic tool, each named as agno's CodexAgent names it.

use serde_json::{Value, json};

use crate::ToolCall;

/// A call as it started: no result yet.
pub(super) fn started(tool: &ToolCall) -> ToolCall {
    ToolCall {
        result: None,
        tool_call_error: false,
        ..tool.clone()
    }
}

/// A tool item as agno's CodexAgent shows it: `shell`, `mcp__<server>__<tool>`,
/// `apply_patch`, `web_search`; a failed one (non-zero exit, declined, MCP error) with
/// `tool_call_error` and its output ending `[exit code N]`.
pub(super) fn tool_call(item: &Value, completed: bool) -> Option<ToolCall> {
    let id = item["id"].as_str()?.to_owned();
    let status = item["status"].as_str().unwrap_or_default();
    let failed = matches!(status, "failed" | "declined");
    let (name, args, result) = match item["type"].as_str()? {
        "commandExecution" => {
            let output = item["aggregatedOutput"].as_str().unwrap_or_default();
            let exit = item["exitCode"].as_i64();
            let result = match exit {
                Some(code) if code != 0 => format!("{output}\n[exit code {code}]"),
                _ if failed && output.is_empty() => format!("command {status}"),
                _ => output.to_owned(),
            };
            (
                "shell".to_owned(),
                json!({"command": item["command"], "cwd": item["cwd"]}),
                result,
            )
        }
        "mcpToolCall" => {
            let text: Vec<&str> = item["result"]["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|part| part["text"].as_str())
                .collect();
            let result = match item["error"]["message"].as_str() {
                Some(message) => format!("error: {message}"),
                None => text.join("\n"),
            };
            (
                format!(
                    "mcp__{}__{}",
                    item["server"].as_str().unwrap_or_default(),
                    item["tool"].as_str().unwrap_or_default()
                ),
                item["arguments"].clone(),
                result,
            )
        }
        "fileChange" => {
            let changes: Vec<Value> = item["changes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|change| json!({"path": change["path"], "kind": change["kind"]["type"]}))
                .collect();
            (
                "apply_patch".to_owned(),
                json!({"changes": changes}),
                status.to_owned(),
            )
        }
        "webSearch" => (
            "web_search".to_owned(),
            json!({"query": item["query"]}),
            String::new(),
        ),
        "dynamicToolCall" => (
            item["tool"].as_str().unwrap_or("tool").to_owned(),
            item["arguments"].clone(),
            String::new(),
        ),
        _ => return None,
    };
    Some(ToolCall {
        tool_call_id: id,
        tool_name: name,
        tool_args: if args.is_null() {
            "{}".to_owned()
        } else {
            args.to_string()
        },
        result: completed.then_some(result),
        tool_call_error: completed && failed,
        parent_tool_call_id: None,
    })
}
