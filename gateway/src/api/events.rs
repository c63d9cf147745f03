//! agno's run events: the journal's typed run events rendered in agno 3.1.10's shape
//! (`RunStarted`, `RunContent`, `ToolCallStarted`, `ToolCallCompleted`, `CustomEvent`,
//! `RunCompleted`, `RunError`, `RunCancelled`). Only the gateway knows this JSON.

use serde_json::{Value, json};
use turnstile_actors::WireEvent;
use turnstile_journal::{RunEvent, ToolCall, Warning};

/// Who a run's events are about: the fields every agno event carries.
#[derive(Debug, Clone)]
pub struct Who {
    /// The agent.
    pub agent_id: String,
    /// Its name.
    pub agent_name: String,
    /// The session.
    pub session_id: String,
}

/// agno's `ToolExecution`.
pub fn tool_json(tool: &ToolCall) -> Value {
    json!({
        "tool_call_id": tool.tool_call_id,
        "tool_name": tool.tool_name,
        "tool_args": serde_json::from_str::<Value>(&tool.tool_args).unwrap_or(Value::Null),
        "result": tool.result,
        "tool_call_error": tool.tool_call_error,
        "parent_tool_call_id": tool.parent_tool_call_id,
    })
}

/// A warning as agno's `CustomEvent` and `metadata.warnings` show it.
pub fn warning_json(warning: &Warning) -> Value {
    match warning {
        Warning::Retry {
            attempt,
            attempts,
            delay_s,
            error_type,
            message,
        } => json!({
            "type": "retry",
            "attempt": attempt,
            "attempts": attempts,
            "delay": delay_s,
            "error_type": error_type,
            "message": message,
        }),
        Warning::SessionFallback { error } => json!({
            "type": "session_fallback",
            "message": "The harness session could not be resumed; the turn ran on a fresh session seeded with the conversation history.",
            "error": error,
        }),
        Warning::AttachmentsChanged { files } => json!({
            "type": "attachments_changed",
            "message": "Kept attachments were changed in the workspace since they were attached; the workspace's versions were left as they are.",
            "files": files,
        }),
    }
}

/// Structured output is the parsed object; text is text.
pub fn content_json(content: &str, content_type: &str) -> Value {
    match content_type {
        "str" => Value::String(content.to_owned()),
        _ => serde_json::from_str(content).unwrap_or_else(|_| Value::String(content.to_owned())),
    }
}

/// agno's name of an event.
pub fn event_type(event: &RunEvent) -> &'static str {
    match event {
        RunEvent::Started { .. } => "RunStarted",
        RunEvent::ContentDelta { .. } | RunEvent::ReasoningDelta { .. } => "RunContent",
        RunEvent::ToolCallStarted { .. } => "ToolCallStarted",
        RunEvent::ToolCallCompleted { .. } => "ToolCallCompleted",
        RunEvent::Warning { .. } => "CustomEvent",
        RunEvent::Completed { .. } => "RunCompleted",
        RunEvent::Failed { .. } => "RunError",
        RunEvent::Cancelled { .. } => "RunCancelled",
    }
}

/// agno's event object: the common fields, then the type's own.
pub fn render(event: &WireEvent, who: &Who) -> (&'static str, Value) {
    let name = event_type(&event.event);
    let own = match &event.event {
        RunEvent::Started {
            model,
            model_provider,
        } => json!({"model": model, "model_provider": model_provider}),
        RunEvent::ContentDelta { text } => json!({"content": text, "content_type": "str"}),
        // As agno shows reasoning: a `RunContent` with empty content.
        RunEvent::ReasoningDelta { text } => {
            json!({"content": "", "reasoning_content": text, "content_type": "str"})
        }
        RunEvent::ToolCallStarted { tool } | RunEvent::ToolCallCompleted { tool } => {
            json!({"tool": tool_json(tool)})
        }
        RunEvent::Warning { warning } => json!({"warning": warning_json(warning)}),
        RunEvent::Completed {
            content,
            content_type,
            metrics,
        } => json!({
            "content": content_json(content, content_type),
            "content_type": content_type,
            "metrics": serde_json::from_str::<Value>(metrics).unwrap_or(Value::Null),
        }),
        RunEvent::Failed {
            error_type,
            message,
        } => json!({"content": message, "error_type": error_type}),
        RunEvent::Cancelled { reason } => json!({"reason": reason, "content": reason}),
    };
    let mut object = json!({
        "created_at": event.ts_us.div_euclid(1_000_000),
        "event": name,
        "agent_id": who.agent_id,
        "agent_name": who.agent_name,
        "run_id": event.run_id,
        "session_id": who.session_id,
    });
    if let (Some(target), Value::Object(extra)) = (object.as_object_mut(), own) {
        target.extend(extra);
    }
    (name, object)
}
