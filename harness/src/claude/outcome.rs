//! How a Claude turn ended, from its `result` line: the answer with its usage, or a
//! classified error.
//!
//! Errors are classified from `is_error`, `api_error_status`, `api_error_type`,
//! `terminal_reason` and `subtype` (with the assistant's error slug), never from
//! `subtype` alone.

use serde_json::{Value, json};

use super::stream::ClaudeTurn;
use crate::{ErrorKind, HarnessError, ModelUsage, TurnOutcome, Usage};

/// The turn's outcome from the `result` line.
pub(super) fn outcome(
    result: &Value,
    turn: &ClaudeTurn,
    stderr: &str,
) -> Result<TurnOutcome, HarnessError> {
    let subtype = result["subtype"].as_str().unwrap_or_default();
    let is_error = result["is_error"].as_bool().unwrap_or(false);
    if !is_error && subtype == "success" {
        let content = if result["structured_output"].is_null() {
            result["result"].as_str().unwrap_or_default().to_owned()
        } else {
            result["structured_output"].to_string()
        };
        return Ok(TurnOutcome {
            content,
            usage: usage(result),
            paused: Vec::new(),
        });
    }
    let mut message = result["result"].as_str().unwrap_or_default().to_owned();
    if let Some(errors) = result["errors"].as_array()
        && !errors.is_empty()
    {
        let errors: Vec<String> = errors
            .iter()
            .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned))
            .collect();
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&errors.join("; "));
    }
    if message.is_empty() {
        message = format!("claude ended with {subtype}: {stderr}");
    }
    if let Some(reset) = turn.usage_reset {
        // The subscription's limit, with its reset (the CLI's `rate_limit_event`).
        return Err(HarnessError::UsageLimit {
            message,
            resets_at_us: reset.saturating_mul(1_000_000),
        });
    }
    Err(HarnessError::Failed {
        kind: classify(result, turn.assistant_error.as_deref(), &message),
        message,
    })
}

/// The class of a failed turn, from the result line and the assistant's error slug.
pub fn classify(result: &Value, assistant_error: Option<&str>, message: &str) -> ErrorKind {
    let subtype = result["subtype"].as_str().unwrap_or_default();
    let status = result["api_error_status"].as_u64();
    let kind = result["api_error_type"].as_str().unwrap_or_default();
    let terminal = result["terminal_reason"].as_str().unwrap_or_default();
    let lower = message.to_lowercase();
    if lower.contains("no conversation found") {
        return ErrorKind::SessionNotFound;
    }
    match subtype {
        "error_max_turns" => return ErrorKind::MaxTurns,
        "error_max_budget_usd" => return ErrorKind::MaxBudget,
        "error_max_structured_output_retries" => return ErrorKind::InvalidRequest,
        _ => {}
    }
    if terminal == "prompt_too_long"
        || lower.contains("prompt is too long")
        || lower.contains("context window")
        || lower.contains("context length")
    {
        return ErrorKind::ContextWindow;
    }
    match (status, kind, assistant_error) {
        (Some(401 | 403), _, _) | (_, "authentication_error" | "permission_error", _) => {
            ErrorKind::Authentication
        }
        (_, _, Some("authentication_failed")) => ErrorKind::Authentication,
        (Some(402), _, _) | (_, "billing_error", _) | (_, _, Some("billing_error")) => {
            ErrorKind::Billing
        }
        (Some(400 | 404 | 413 | 422), _, _)
        | (_, "invalid_request_error" | "not_found_error" | "request_too_large", _)
        | (_, _, Some("invalid_request")) => ErrorKind::InvalidRequest,
        _ => ErrorKind::Transient,
    }
}

fn usage(result: &Value) -> Usage {
    let u = &result["usage"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let models = result["modelUsage"]
        .as_object()
        .map(|models| {
            models
                .iter()
                .map(|(id, m)| ModelUsage {
                    id: id.clone(),
                    provider: "anthropic".into(),
                    input_tokens: n(&m["inputTokens"]),
                    output_tokens: n(&m["outputTokens"]),
                    cache_read_tokens: n(&m["cacheReadInputTokens"]),
                    cache_write_tokens: n(&m["cacheCreationInputTokens"]),
                    cost_usd: m["costUSD"].as_f64(),
                })
                .collect()
        })
        .unwrap_or_default();
    let mut additional = serde_json::Map::new();
    if let Some(turns) = result["num_turns"].as_u64() {
        additional.insert("num_turns".into(), json!(turns));
    }
    if let Some(ms) = result["duration_api_ms"].as_f64() {
        additional.insert("api_duration".into(), json!(ms / 1000.0));
    }
    Usage {
        input_tokens: n(&u["input_tokens"]),
        output_tokens: n(&u["output_tokens"]),
        cache_read_tokens: n(&u["cache_read_input_tokens"]),
        cache_write_tokens: n(&u["cache_creation_input_tokens"]),
        reasoning_tokens: 0,
        cost_usd: result["total_cost_usd"].as_f64(),
        models,
        additional,
    }
}
