//! Wire shapes: agno's agent and `RunOutput` JSON, built from runtime views.
//!
//! The views come from the journal; this module only renders them, the way agno
//! 3.1.10's `RunSchema` / `AgentResponse` look, so agno's client parses them.

use serde_json::{Value, json};
use turnstile_actors::AgentSpec;
use turnstile_projections::{RunView, SessionState};

/// agno's agent object.
pub fn agent(agent: &AgentSpec) -> Value {
    let info = agent.harness.info();
    json!({
        "id": agent.id,
        "name": agent.name,
        "description": agent.description,
        "model": {"name": info.model, "model": info.model, "provider": info.model_provider},
        "metadata": {"sdk": info.sdk},
    })
}

fn seconds(us: i64) -> i64 {
    us / 1_000_000
}

/// agno's messages for a run: the user's input, one assistant call and one tool
/// result per tool, then the final assistant answer.
fn messages(run: &RunView) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": run.input})];
    for tool in &run.tools {
        messages.push(json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": tool.tool_call_id,
                "type": "function",
                "function": {"name": tool.tool_name, "arguments": tool.tool_args.to_string()},
            }],
        }));
        if let Some(result) = &tool.result {
            messages.push(
                json!({"role": "tool", "tool_call_id": tool.tool_call_id, "content": result}),
            );
        }
    }
    if run.status.is_terminal() && !run.content.is_empty() {
        messages.push(json!({"role": "assistant", "content": run.content}));
    }
    messages
}

/// agno's `RunOutput` for a run.
pub fn run_output(run: &RunView, agent_name: &str) -> Value {
    let metrics = run
        .metrics
        .as_deref()
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .unwrap_or(Value::Null);
    let warnings: Vec<Value> = run
        .warnings
        .iter()
        .map(crate::api::events::warning_json)
        .collect();
    let mut metadata = json!({"warnings": warnings});
    if run.attempts > 1 {
        metadata["attempts"] = json!(run.attempts);
    }
    if let Some((error_type, _)) = &run.error {
        metadata["error_type"] = json!(error_type);
        metadata["retryable"] = json!(run.retryable);
    }
    json!({
        "run_id": run.run_id,
        "agent_id": run.agent_id,
        "agent_name": agent_name,
        "session_id": run.session_id,
        "user_id": run.user_id,
        "status": run.status.as_str(),
        // Structured output is the parsed object; text is text.
        "content": crate::api::events::content_json(&run.content, &run.content_type),
        "content_type": run.content_type,
        "tools": run.tools,
        "messages": messages(run),
        "metrics": metrics,
        "metadata": metadata,
        "model": run.model,
        "model_provider": run.model_provider,
        "input": if run.attachments.is_empty() {
            json!({"input_content": run.input})
        } else {
            json!({"input_content": run.input, "files": run.attachments})
        },
        "forked_from_run_id": run.fork.as_ref().map(|fork| fork.from_run_id.to_string()),
        "forked_from_message_index": run.fork.as_ref().map(|fork| fork.message_index),
        "created_at": seconds(run.created_at_us),
        "updated_at": seconds(run.updated_at_us),
    })
}

fn preview(text: &str) -> String {
    text.chars().take(120).collect()
}

/// agno's checkpoint list for a run: one entry per tool-result batch, then `end`.
pub fn checkpoints(run: &RunView) -> Value {
    let mut entries: Vec<Value> = run
        .checkpoints
        .iter()
        .map(|checkpoint| {
            let result = run
                .tools
                .iter()
                .find(|tool| tool.tool_call_id == checkpoint.tool_call_id)
                .and_then(|tool| tool.result.clone())
                .unwrap_or_default();
            json!({
                "run_id": run.run_id,
                "session_id": run.session_id,
                "message_index": checkpoint.message_index,
                "continue_from": checkpoint.message_index,
                "status": "RUNNING",
                "reason": "checkpoint",
                "created_at": seconds(checkpoint.created_at_us),
                "message_id": checkpoint.tool_call_id,
                "message_role": "tool",
                "message_preview": preview(&result),
            })
        })
        .collect();
    entries.push(json!({
        "run_id": run.run_id,
        "session_id": run.session_id,
        "message_index": run.message_count(),
        "continue_from": "end",
        "status": run.status.as_str(),
        "reason": "end",
        "created_at": seconds(run.updated_at_us),
        "message_id": null,
        "message_role": if run.status.is_terminal() && !run.content.is_empty() { "assistant" } else { "user" },
        "message_preview": preview(&run.content),
    }));
    let last = entries.len() - 1;
    for (ordinal, entry) in entries.iter_mut().enumerate() {
        entry["checkpoint_id"] = json!((ordinal + 1).to_string());
        entry["is_latest"] = json!(ordinal == last);
    }
    json!({"run_id": run.run_id, "session_id": run.session_id, "checkpoints": entries})
}

/// agno's session name: the first line of the session's first message, shortened.
pub fn session_name(session: &SessionState) -> String {
    session.session.name.clone()
}

/// One item of `GET /sessions` (agno's `SessionSchema`).
pub fn session_summary(session: &SessionState, sdk: &str) -> Value {
    let view = &session.session;
    json!({
        "session_id": session.session_id,
        "session_name": session_name(session),
        "session_state": null,
        "session_type": "agent",
        "agent_id": view.agent_id,
        "user_id": view.user_id,
        "metrics": view.metrics,
        "total_tokens": view.metrics.total_tokens,
        "metadata": {"sdk": sdk},
        "created_at": seconds(view.created_at_us),
        "updated_at": seconds(view.updated_at_us),
    })
}

/// `GET /sessions/{id}` (agno's `AgentSessionDetailSchema`, plus the harness session).
pub fn session_detail(session: &SessionState, sdk: &str, agent_name: &str) -> Value {
    let view = &session.session;
    json!({
        "session_id": session.session_id,
        "agent_session_id": session.session_id,
        "session_name": session_name(session),
        "session_summary": null,
        "session_state": null,
        "agent_id": view.agent_id,
        "user_id": view.user_id,
        "agent_data": {"agent_id": view.agent_id, "agent_name": agent_name, "sdk": sdk},
        "total_tokens": view.metrics.total_tokens,
        "metrics": view.metrics,
        "session_metrics": view.metrics,
        "metadata": {"sdk": sdk, "harness_session_id": view.harness_session_id, "runs": view.run_count},
        "created_at": seconds(view.created_at_us),
        "updated_at": seconds(view.updated_at_us),
    })
}
