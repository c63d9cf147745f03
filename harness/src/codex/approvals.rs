//! Codex's approval requests as turnstile's approvals (`spec/approvals.md`): the
//! app-server asks before a command (`item/commandExecution/requestApproval`) or a file
//! change (`item/fileChange/requestApproval`); a call that matches the agent's
//! `approvals` pauses the turn, the request left unanswered while the process waits
//! (kept warm), and the continuation answers it (`accept`, or `decline` with the note
//! steered into the turn, `turn/steer`, so the model reads why). When the process is
//! gone (a restart), the resumed thread is told the decision, and a confirmed call the
//! model asks for again is accepted without a second pause. And when a used-up
//! rate-limit window resets, for a usage limit waited out (`wait_on_usage_limit`).

use serde_json::{Value, json};

use crate::cli::{LineContext, Step};
use crate::{Decision, ToolCall};

/// What a process remembers of approval requests.
#[derive(Debug, Default)]
pub(crate) struct Approvals {
    /// Requests waiting for a person's decision.
    waiting: Vec<Waiting>,
    /// Calls confirmed after the process that asked was gone: (tool, command).
    confirmed: Vec<(String, Value)>,
}

/// An approval request not answered yet.
#[derive(Debug)]
struct Waiting {
    /// The request's JSON-RPC id.
    id: Value,
    /// The item it is about (the tool call's id).
    item_id: String,
    /// The turn it came in.
    turn_id: Option<String>,
}

/// The approval policy a thread runs with: with `approvals`, Codex must ask (`never`
/// becomes `untrusted`: every command but the trusted read-only ones is asked about).
pub(crate) fn policy(configured: &str, approvals: bool) -> &str {
    if approvals && configured == "never" {
        "untrusted"
    } else {
        configured
    }
}

/// Whether `method` asks to run a command or change files (the approvals turnstile
/// answers; any other request is refused as before).
pub(crate) fn is_approval(method: &str) -> bool {
    matches!(
        method,
        "item/commandExecution/requestApproval"
            | "item/fileChange/requestApproval"
            | "execCommandApproval"
            | "applyPatchApproval"
    )
}

/// The call an approval request is about, as the run's events name it.
fn call_of(method: &str, params: &Value) -> ToolCall {
    let (name, args) = if method.contains("fileChange") || method == "applyPatchApproval" {
        ("apply_patch", json!({"reason": params["reason"]}))
    } else {
        (
            "shell",
            json!({"command": params["command"], "cwd": params["cwd"]}),
        )
    };
    ToolCall {
        tool_call_id: params["itemId"]
            .as_str()
            .or(params["callId"].as_str())
            .unwrap_or_default()
            .to_owned(),
        tool_name: name.to_owned(),
        tool_args: args.to_string(),
        ..ToolCall::default()
    }
}

fn decision(id: &Value, decision: &str) -> String {
    json!({"id": id, "result": {"decision": decision}}).to_string()
}

/// The steps of an approval request (made in turn `turn_id`): a confirmed call runs; a
/// call that waits for a person pauses the turn; any other is accepted when turnstile
/// chose the policy (the agent's own is `never`), else declined as before (nobody to
/// ask).
pub(crate) fn request(
    method: &str,
    id: &Value,
    params: &Value,
    configured_policy: &str,
    turn_id: Option<String>,
    approvals: &mut Approvals,
    context: LineContext<'_>,
) -> Vec<Step> {
    let call = call_of(method, params);
    let command = params["command"].clone();
    let confirmed = approvals
        .confirmed
        .iter()
        .position(|(tool, args)| *tool == call.tool_name && *args == command);
    if let Some(at) = confirmed {
        approvals.confirmed.remove(at);
        return vec![Step::Send(decision(id, "accept"))];
    }
    if !context.approvals.matches(&call.tool_name) {
        let answer = if configured_policy == "never" {
            "accept"
        } else {
            "decline"
        };
        return vec![Step::Send(decision(id, answer))];
    }
    approvals.waiting.push(Waiting {
        id: id.clone(),
        item_id: call.tool_call_id.clone(),
        turn_id,
    });
    vec![Step::Mirror(None), Step::Pause(vec![call])]
}

/// The answers to the requests a paused process waits on, and the turn they are of; a
/// denial's note is steered into the turn first (`steer(turn_id, text)` makes the
/// request), so the model's next request carries it. `None` when it waits on none (a
/// new process).
pub(crate) fn answers(
    approvals: &mut Approvals,
    decisions: &[Decision],
    mut steer: impl FnMut(&str, &str) -> String,
) -> Option<(String, Option<String>)> {
    if approvals.waiting.is_empty() || decisions.is_empty() {
        return None;
    }
    let mut lines = Vec::new();
    let mut turn_id = None;
    for waiting in std::mem::take(&mut approvals.waiting) {
        turn_id = waiting.turn_id.clone().or(turn_id);
        let decided = decisions
            .iter()
            .find(|decision| decision.tool.tool_call_id == waiting.item_id);
        match decided {
            Some(decided) if decided.confirmed => lines.push(decision(&waiting.id, "accept")),
            _ => {
                let denial = decided.map_or_else(
                    || "A person denied this tool call.".to_owned(),
                    Decision::denial,
                );
                if let Some(turn) = &waiting.turn_id {
                    lines.push(steer(turn, &denial));
                }
                lines.push(decision(&waiting.id, "decline"));
            }
        }
    }
    Some((lines.join("\n"), turn_id))
}

/// Confirmed calls a new process may accept when the model asks for them again.
pub(crate) fn remember_confirmed(approvals: &mut Approvals, decisions: &[Decision]) {
    approvals.confirmed = decisions
        .iter()
        .filter(|decision| decision.confirmed)
        .map(|decision| {
            let args: Value = serde_json::from_str(&decision.tool.tool_args).unwrap_or(Value::Null);
            (decision.tool.tool_name.clone(), args["command"].clone())
        })
        .collect();
}

/// When an exhausted rate-limit window resets (Unix seconds), from
/// `account/rateLimits/updated`: the latest reset of a window used to 100 %.
pub(crate) fn usage_reset(params: &Value) -> Option<i64> {
    let limits = &params["rateLimits"];
    ["primary", "secondary"]
        .iter()
        .map(|window| &limits[*window])
        .filter(|window| {
            window["usedPercent"]
                .as_f64()
                .is_some_and(|used| used >= 100.0)
        })
        .filter_map(|window| window["resetsAt"].as_i64())
        .max()
}
