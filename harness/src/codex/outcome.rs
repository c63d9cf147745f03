//! How a Codex turn ended: its answer and usage, or its error classified from the
//! typed `codexErrorInfo` (and the HTTP status inside it).

use serde_json::Value;

use super::Codex;
use super::protocol::{CodexTurn, Tokens};
use crate::{ErrorKind, HarnessError, ModelUsage, TurnOutcome, Usage};

/// The turn's usage: the thread's total after it minus before it (a fresh thread
/// starts at zero), every model request of the turn included; one model entry, no cost.
fn usage(codex: &Codex, turn: &CodexTurn) -> Usage {
    let after = turn.after.clone().unwrap_or_default();
    let spent = match &turn.after {
        Some(_) => after.minus(&turn.before.clone().unwrap_or_default()),
        None => Tokens::default(),
    };
    // OpenAI counts cached tokens inside the input, and so does agno's CodexAgent:
    // `input_tokens` is the whole input, `cache_read_tokens` the cached part of it.
    let input = spent.input;
    let model = turn
        .model
        .clone()
        .unwrap_or_else(|| codex.options.model.clone());
    Usage {
        input_tokens: input,
        output_tokens: spent.output,
        cache_read_tokens: spent.cached,
        cache_write_tokens: spent.cache_write,
        reasoning_tokens: spent.reasoning,
        cost_usd: None,
        models: vec![ModelUsage {
            id: model,
            provider: "openai".into(),
            input_tokens: input,
            output_tokens: spent.output,
            cache_read_tokens: spent.cached,
            cache_write_tokens: spent.cache_write,
            cost_usd: None,
        }],
        additional: serde_json::Map::new(),
    }
}

/// The answer: the message marked `final_answer`, else the last one.
fn answer(turn: &CodexTurn) -> String {
    turn.messages
        .iter()
        .rev()
        .find(|(_, _, phase)| phase.as_deref() == Some("final_answer"))
        .or_else(|| turn.messages.last())
        .map(|(_, text, _)| text.clone())
        .unwrap_or_default()
}

/// The outcome of `end` (the `turn/completed` parameters, or our refused request).
pub(crate) fn outcome(
    codex: &Codex,
    end: &Value,
    turn: &CodexTurn,
) -> Result<TurnOutcome, HarnessError> {
    if let Some((request, message)) = &turn.refused {
        return Err(refused(request, message));
    }
    let status = end["turn"]["status"].as_str().unwrap_or_default();
    match status {
        "completed" => Ok(TurnOutcome {
            content: answer(turn),
            usage: usage(codex, turn),
            paused: Vec::new(),
        }),
        "interrupted" => Err(HarnessError::Cancelled),
        _ => {
            let error = if end["turn"]["error"].is_object() {
                &end["turn"]["error"]
            } else {
                turn.error.as_ref().unwrap_or(&Value::Null)
            };
            let message = error["message"]
                .as_str()
                .filter(|message| !message.is_empty())
                .unwrap_or("the codex turn failed")
                .to_owned();
            if error["codexErrorInfo"] == "usageLimitExceeded"
                && let Some(reset) = turn.usage_reset
            {
                // The plan's window is used up until its reset (`account/rateLimits/updated`).
                return Err(HarnessError::UsageLimit {
                    message,
                    resets_at_us: reset.saturating_mul(1_000_000),
                });
            }
            Err(HarnessError::Failed {
                kind: classify(&error["codexErrorInfo"], &message),
                message,
            })
        }
    }
}

/// A request the app-server refused: a thread it cannot resume is gone (the runtime
/// falls back to a fresh one seeded with the history); anything else fails the attempt.
fn refused(request: &str, message: &str) -> HarnessError {
    let kind = if request == "thread"
        && (message.contains("no rollout found") || message.contains("invalid session id"))
    {
        ErrorKind::SessionNotFound
    } else if request == "turn" && !message.contains("overloaded") {
        // `turn/start` refused its parameters (an output schema it cannot use…).
        ErrorKind::InvalidRequest
    } else {
        // Any other refusal (another process writing the thread, an overloaded
        // server, a resume that failed otherwise) fails the attempt and keeps the
        // thread: the run's retries decide.
        ErrorKind::Transient
    };
    HarnessError::Failed {
        kind,
        message: format!("codex refused {request}: {message}"),
    }
}

/// The class of a failed turn: authentication, billing and quota, bad requests, the
/// context window, policy and Codex's usage and budget limits are permanent; the rest
/// (rate limits, overload, server errors, dropped streams) may pass.
pub(crate) fn classify(info: &Value, message: &str) -> ErrorKind {
    let (variant, status) = match info {
        Value::String(variant) => (variant.as_str(), None),
        Value::Object(object) => match object.iter().next() {
            Some((variant, detail)) => (variant.as_str(), detail["httpStatusCode"].as_u64()),
            None => ("other", None),
        },
        _ => ("other", None),
    };
    match status {
        Some(401 | 403) => return ErrorKind::Authentication,
        Some(402) => return ErrorKind::Billing,
        Some(400 | 404 | 413 | 422) => return ErrorKind::InvalidRequest,
        _ => {}
    }
    match variant {
        "unauthorized" => ErrorKind::Authentication,
        "usageLimitExceeded" => ErrorKind::Billing,
        "sessionBudgetExceeded" => ErrorKind::MaxBudget,
        "contextWindowExceeded" => ErrorKind::ContextWindow,
        "badRequest" | "modelNotFound" => ErrorKind::InvalidRequest,
        "cyberPolicy"
        | "misalignmentPolicyViolation"
        | "inferenceHookDenied"
        | "tooManyDenials" => ErrorKind::Policy,
        _ if message.contains("Quota exceeded") => ErrorKind::Billing,
        // A 400 without a code arrives as `other` with the provider's JSON body.
        _ if message.starts_with("{\"error\"") && message.contains("invalid_request_error") => {
            ErrorKind::InvalidRequest
        }
        _ => ErrorKind::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codex::protocol::Tokens;
    use serde_json::json;

    #[test]
    fn errors_are_classed_from_the_typed_info_and_its_status() {
        for (info, kind) in [
            (
                json!({"httpConnectionFailed": {"httpStatusCode": 401}}),
                ErrorKind::Authentication,
            ),
            (
                json!({"responseTooManyFailedAttempts": {"httpStatusCode": 429}}),
                ErrorKind::Transient,
            ),
            (json!("internalServerError"), ErrorKind::Transient),
            (json!("serverOverloaded"), ErrorKind::Transient),
            (json!("contextWindowExceeded"), ErrorKind::ContextWindow),
            (json!("usageLimitExceeded"), ErrorKind::Billing),
            (json!("sessionBudgetExceeded"), ErrorKind::MaxBudget),
            (
                json!({"httpConnectionFailed": {"httpStatusCode": 400}}),
                ErrorKind::InvalidRequest,
            ),
            (json!("cyberPolicy"), ErrorKind::Policy),
            (
                json!({"httpConnectionFailed": {"httpStatusCode": null}}),
                ErrorKind::Transient,
            ),
            (json!("other"), ErrorKind::Transient),
        ] {
            assert_eq!(classify(&info, "x"), kind, "{info}");
        }
    }

    #[test]
    fn usage_is_the_thread_total_after_minus_before() {
        let before = Tokens {
            input: 1000,
            cached: 500,
            cache_write: 0,
            output: 7,
            reasoning: 0,
        };
        let after = Tokens {
            input: 3040,
            cached: 1520,
            cache_write: 0,
            output: 21,
            reasoning: 2,
        };
        let spent = after.minus(&before);
        assert_eq!(
            spent,
            Tokens {
                input: 2040,
                cached: 1020,
                cache_write: 0,
                output: 14,
                reasoning: 2
            }
        );
    }
}
