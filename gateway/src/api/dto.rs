//! Wire shapes: agno's agent and `RunOutput` JSON, built from runtime views.
//!
//! The views come from the journal; this module only renders them, the way agno
//! 3.1.10's `RunSchema` / `AgentResponse` look, so agno's client parses them.

use serde_json::{Value, json};
use turnstile_actors::AgentSpec;
use turnstile_projections::RunView;

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
    let mut metadata = json!({"warnings": run.warnings});
    if run.attempts > 1 {
        metadata["attempts"] = json!(run.attempts);
    }
    if let Some((error_type, _)) = &run.error {
        metadata["error_type"] = json!(error_type);
    }
    json!({
        "run_id": run.run_id,
        "agent_id": run.agent_id,
        "agent_name": agent_name,
        "session_id": run.session_id,
        "user_id": run.user_id,
        "status": run.status.as_str(),
        "content": run.content,
        "content_type": run.content_type,
        "tools": run.tools,
        "messages": messages(run),
        "metrics": metrics,
        "metadata": metadata,
        "model": run.model,
        "model_provider": run.model_provider,
        "input": {"input_content": run.input},
        "forked_from_run_id": null,
        "forked_from_message_index": null,
        "created_at": seconds(run.created_at_us),
        "updated_at": seconds(run.updated_at_us),
    })
}
