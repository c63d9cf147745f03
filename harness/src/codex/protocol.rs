//! One turn of the app-server's JSON-RPC: the handshake and the thread on a new
//! process, `turn/start`, the notifications that become events, the server's
//! requests answered, and `turn/interrupt` when the run is cancelled.
//!
//! Requests carry string ids that say what they are (`init:1`, `thread:2`, `turn:3`),
//! so an answer is matched without a table. One turn per thread at a time is the
//! runtime's rule: the app-server would merge a second `turn/start` into the running
//! turn, so it never receives one.

use std::collections::HashSet;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::Codex;
use super::items::{started, tool_call};
use crate::cli::{LineContext, Step, TurnStart};
use crate::{HarnessEvent, TurnRequest};

/// The message a compaction is asked with; the dialect sends `thread/compact/start`
/// instead of a turn for it.
pub(crate) const COMPACT_MESSAGE: &str = "\u{1}turnstile:compact";

/// What the dialect remembers of one app-server process.
#[derive(Debug, Default)]
pub struct CodexProcess {
    /// The thread it serves, once started or resumed.
    thread_id: Option<String>,
    /// The thread's token totals as last reported.
    thread_total: Option<Tokens>,
    /// The last request id used.
    next_id: u64,
    /// Its approval requests (`approvals.rs`).
    pub(crate) approvals: super::approvals::Approvals,
}

/// A thread's token totals (`thread/tokenUsage/updated`'s `total`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Input tokens, cached ones included (as OpenAI counts them).
    pub input: u64,
    /// Cached input tokens.
    pub cached: u64,
    /// Input tokens written to the cache.
    pub cache_write: u64,
    /// Output tokens.
    pub output: u64,
    /// Reasoning output tokens.
    pub reasoning: u64,
}

impl Tokens {
    /// From the app-server's camelCase totals.
    pub fn from_codex(total: &Value) -> Tokens {
        let field = |name: &str| total[name].as_u64().unwrap_or(0);
        Tokens {
            input: field("inputTokens"),
            cached: field("cachedInputTokens"),
            cache_write: field("cacheWriteInputTokens"),
            output: field("outputTokens"),
            reasoning: field("reasoningOutputTokens"),
        }
    }

    pub(crate) fn minus(&self, before: &Tokens) -> Tokens {
        Tokens {
            input: self.input.saturating_sub(before.input),
            cached: self.cached.saturating_sub(before.cached),
            cache_write: self.cache_write.saturating_sub(before.cache_write),
            output: self.output.saturating_sub(before.output),
            reasoning: self.reasoning.saturating_sub(before.reasoning),
        }
    }
}

/// What the dialect remembers while it reads one turn.
#[derive(Debug, Default)]
pub struct CodexTurn {
    /// Whether the thread is resumed (else started) on this process.
    resume: bool,
    /// The thread.
    pub(crate) thread_id: Option<String>,
    /// The turn, once `turn/start` answered.
    pub(crate) turn_id: Option<String>,
    /// The `turn/start` parameters but the thread.
    start: Value,
    /// The turn's working directory, when the runtime chose one.
    cwd: Option<std::path::PathBuf>,
    /// A compaction instead of a turn.
    pub(crate) compacting: bool,
    /// The thread's totals before the turn, and the last totals of this turn.
    pub(crate) before: Option<Tokens>,
    pub(crate) after: Option<Tokens>,
    /// Agent messages in order: (item id, text, phase).
    pub(crate) messages: Vec<(String, String, Option<String>)>,
    /// Messages whose text came as deltas.
    streamed: HashSet<String>,
    /// Whether any text was shown (the next message starts with a blank line).
    shown_text: bool,
    /// Tool calls started and not completed, by item id.
    open_tools: HashSet<String>,
    /// The last error that will not be retried by the CLI (`error` notification).
    pub(crate) error: Option<Value>,
    /// A request of ours the app-server refused: (method, message).
    pub(crate) refused: Option<(String, String)>,
    /// A compaction happened in the turn.
    pub(crate) compacted: bool,
    /// The model the thread runs.
    pub(crate) model: Option<String>,
    /// Some calls wait for a person's decision (the agent's `approvals`).
    pub(crate) approvals: bool,
    /// A used-up rate-limit window resets then (Unix seconds).
    pub(crate) usage_reset: Option<i64>,
}

/// A JSON-RPC request line whose id says what it is (`turn:7`).
fn rpc(process: &mut CodexProcess, kind: &str, method: &str, params: Value) -> String {
    process.next_id += 1;
    json!({"id": format!("{kind}:{}", process.next_id), "method": method, "params": params})
        .to_string()
}

/// The first line of the turn: the handshake on a new process, else `turn/start`.
pub(crate) fn turn_input(
    codex: &Codex,
    request: &TurnRequest,
    start: TurnStart<'_>,
    process: &mut CodexProcess,
    turn: &mut CodexTurn,
) -> String {
    turn.compacting = request.message == COMPACT_MESSAGE;
    turn.cwd = request.cwd.clone();
    turn.model = Some(codex.options.model.clone());
    turn.approvals = !request.approvals.is_empty();
    let thread_id = process.thread_id.clone().unwrap_or_default();
    let mut approvals = std::mem::take(&mut process.approvals);
    let answered = super::approvals::answers(&mut approvals, &request.decisions, |turn, text| {
        let input = json!([{"type": "text", "text": text, "text_elements": []}]);
        let params = json!({"threadId": thread_id, "expectedTurnId": turn, "input": input});
        rpc(process, "steer", "turn/steer", params)
    });
    process.approvals = approvals;
    if let Some((answers, turn_id)) = answered {
        // The process waited for these decisions, mid-turn: its answers go on with it.
        turn.thread_id = process.thread_id.clone();
        turn.turn_id = turn_id;
        turn.before = process.thread_total.clone();
        return answers;
    }
    let message = if request.paused_before {
        // The process that asked is gone: the resumed thread is told the decision.
        super::approvals::remember_confirmed(&mut process.approvals, &request.decisions);
        if request.decisions.is_empty() {
            "Continue where you left off.".to_owned()
        } else {
            crate::Decision::message(&request.decisions)
        }
    } else {
        request.message.clone()
    };
    let mut input = vec![json!({"type": "text", "text": message, "text_elements": []})];
    input.extend(super::images(&message));
    turn.start = json!({"input": input});
    if let Some(schema) = request
        .output_schema
        .as_deref()
        .and_then(|schema| serde_json::from_str::<Value>(schema).ok())
    {
        turn.start["outputSchema"] = schema;
    }
    if start.first || process.thread_id.is_none() {
        turn.resume = start.resume;
        if start.resume {
            turn.thread_id = Some(start.harness_session_id.to_owned());
        }
        return rpc(
            process,
            "init",
            "initialize",
            json!({
                "clientInfo": {"name": "turnstile", "title": null, "version": env!("CARGO_PKG_VERSION")},
                "capabilities": {"experimentalApi": true},
            }),
        );
    }
    turn.thread_id = process.thread_id.clone();
    turn.before = process.thread_total.clone();
    start_turn(process, turn)
}

fn start_turn(process: &mut CodexProcess, turn: &mut CodexTurn) -> String {
    let thread_id = turn.thread_id.clone().unwrap_or_default();
    if turn.compacting {
        return rpc(
            process,
            "compact",
            "thread/compact/start",
            json!({"threadId": thread_id}),
        );
    }
    let mut params = turn.start.clone();
    params["threadId"] = Value::String(thread_id);
    rpc(process, "turn", "turn/start", params)
}

fn thread_params(codex: &Codex, turn: &CodexTurn) -> Value {
    let options = &codex.options;
    let cwd = turn.cwd.as_ref().unwrap_or(&options.cwd);
    let cwd = std::fs::canonicalize(cwd).unwrap_or_else(|_| cwd.clone());
    let mut params = json!({
        "cwd": cwd,
        "model": options.model,
        "sandbox": options.sandbox,
        "approvalPolicy": super::approvals::policy(&options.approval_policy, turn.approvals),
    });
    match &turn.thread_id {
        Some(thread_id) if turn.resume => params["threadId"] = json!(thread_id),
        _ => params["historyMode"] = json!("legacy"),
    }
    params
}

/// The `turn/interrupt` of a cancelled run, once the turn has an id.
pub(crate) fn interrupt(turn: &CodexTurn) -> Option<String> {
    let (thread_id, turn_id) = (turn.thread_id.as_ref()?, turn.turn_id.as_ref()?);
    Some(
        json!({"id": "interrupt:0", "method": "turn/interrupt",
               "params": {"threadId": thread_id, "turnId": turn_id}})
        .to_string(),
    )
}

/// The steps of one line the app-server wrote.
pub(crate) fn on_line(
    codex: &Codex,
    line: &str,
    turn: &mut CodexTurn,
    process: &mut CodexProcess,
    context: LineContext<'_>,
) -> Vec<Step> {
    let Ok(message) = serde_json::from_str::<Value>(line) else {
        return Vec::new();
    };
    let method = message["method"].as_str();
    match (method, message.get("id")) {
        (None, Some(id)) => answer(codex, id, &message, turn, process),
        (Some(method), Some(id)) if super::approvals::is_approval(method) => {
            super::approvals::request(
                method,
                id,
                &message["params"],
                &codex.options.approval_policy,
                turn.turn_id.clone(),
                &mut process.approvals,
                context,
            )
        }
        (Some(method), Some(id)) => vec![Step::Send(server_request(method, id))],
        (Some("turn/completed"), None) if turn.compacted => {
            // The compaction's record is the rollout's `compacted` line, mirrored when
            // its item completed.
            let mut steps = vec![Step::Mirror(None)];
            if let Some(event) = compaction(context) {
                steps.push(Step::Emit(event));
            }
            steps.extend(notification(
                "turn/completed",
                &message["params"],
                turn,
                process,
            ));
            steps
        }
        (Some(method), None) => notification(method, &message["params"], turn, process),
        (None, None) => Vec::new(),
    }
}

/// The compaction a turn made: the summary the model wrote, and how many messages
/// of the thread it replaced.
fn compaction(context: LineContext<'_>) -> Option<HarnessEvent> {
    let parsed = |line: &String| serde_json::from_str::<Value>(line).ok();
    let at = context
        .mirrored
        .iter()
        .rposition(|line| line.contains("\"compacted\""))?;
    let record = parsed(&context.mirrored[at])?;
    let summary = record["payload"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let is_message = |value: &Value| {
        value["type"] == "response_item"
            && value["payload"]["type"] == "message"
            && matches!(
                value["payload"]["role"].as_str(),
                Some("user" | "assistant")
            )
    };
    let earlier = context.transcript.lines().unwrap_or_default();
    let replaced = earlier
        .iter()
        .chain(&context.mirrored[..at])
        .filter_map(parsed)
        .filter(is_message)
        .count();
    Some(HarnessEvent::Compacted {
        summary,
        replaced_messages: u32::try_from(replaced).unwrap_or(u32::MAX),
    })
}

/// What the app-server asks of us besides commands and file changes (`approvals.rs`):
/// another approval (permissions…) is declined, as nobody is there to ask; anything
/// else is refused.
fn server_request(method: &str, id: &Value) -> String {
    if method.ends_with("requestApproval") || method.ends_with("Approval") {
        return json!({"id": id, "result": {"decision": "decline"}}).to_string();
    }
    json!({"id": id, "error": {"code": -32601, "message": format!("turnstile does not answer {method}")}})
        .to_string()
}

/// The answer to one of our requests.
fn answer(
    codex: &Codex,
    id: &Value,
    message: &Value,
    turn: &mut CodexTurn,
    process: &mut CodexProcess,
) -> Vec<Step> {
    let kind = id
        .as_str()
        .and_then(|id| id.split(':').next())
        .unwrap_or_default();
    if let Some(error) = message.get("error") {
        let text = error["message"].as_str().unwrap_or("refused").to_owned();
        if kind == "interrupt" || kind == "steer" {
            // A turn that cannot be steered or stopped any more ends on its own.
            return Vec::new();
        }
        turn.refused = Some((kind.to_owned(), text));
        return vec![Step::End(json!({"refused": kind}))];
    }
    let result = &message["result"];
    match kind {
        "init" => {
            let method = if turn.resume && turn.thread_id.is_some() {
                "thread/resume"
            } else {
                "thread/start"
            };
            vec![
                Step::Send(json!({"method": "initialized"}).to_string()),
                Step::Send(rpc(process, "thread", method, thread_params(codex, turn))),
            ]
        }
        "thread" => {
            let thread = &result["thread"];
            let Some(thread_id) = thread["id"].as_str().map(str::to_owned) else {
                turn.refused = Some(("thread".into(), "the thread has no id".into()));
                return vec![Step::End(json!({"refused": "thread"}))];
            };
            if let Some(model) = result["model"].as_str() {
                turn.model = Some(model.to_owned());
            }
            process.thread_id = Some(thread_id.clone());
            turn.thread_id = Some(thread_id.clone());
            if turn.before.is_none() {
                turn.before = process.thread_total.clone();
            }
            let mut steps = vec![Step::Received];
            if !turn.resume {
                steps.push(Step::Session {
                    harness_session_id: thread_id,
                    transcript: thread["path"]
                        .as_str()
                        .map(PathBuf::from)
                        .unwrap_or_default(),
                });
            }
            steps.push(Step::Send(start_turn(process, turn)));
            steps
        }
        "turn" => {
            turn.turn_id = result["turn"]["id"].as_str().map(str::to_owned);
            vec![Step::Received]
        }
        _ => Vec::new(),
    }
}

fn notification(
    method: &str,
    params: &Value,
    turn: &mut CodexTurn,
    process: &mut CodexProcess,
) -> Vec<Step> {
    let ours =
        params["turnId"].as_str().is_some() && params["turnId"].as_str() == turn.turn_id.as_deref();
    match method {
        "turn/started" => {
            if turn.turn_id.is_none() {
                turn.turn_id = params["turn"]["id"].as_str().map(str::to_owned);
            }
            vec![Step::Received]
        }
        "thread/tokenUsage/updated" => {
            let total = Tokens::from_codex(&params["tokenUsage"]["total"]);
            if ours {
                turn.after = Some(total.clone());
            } else if turn.before.is_none() {
                // A cold resume restates the thread's total before the turn.
                turn.before = Some(total.clone());
            }
            process.thread_total = Some(total);
            Vec::new()
        }
        "account/rateLimits/updated" => {
            if let Some(reset) = super::approvals::usage_reset(params) {
                turn.usage_reset = Some(reset);
            }
            Vec::new()
        }
        "item/agentMessage/delta" => message_delta(params, turn),
        "item/reasoning/summaryTextDelta" | "item/reasoning/textDelta" => {
            let delta = params["delta"].as_str().unwrap_or_default();
            if delta.is_empty() {
                return vec![Step::Received];
            }
            vec![
                Step::Received,
                Step::Emit(HarnessEvent::ReasoningDelta {
                    text: delta.to_owned(),
                }),
            ]
        }
        "item/started" => match tool_call(&params["item"], false) {
            Some(tool) => {
                turn.open_tools.insert(tool.tool_call_id.clone());
                vec![
                    Step::Received,
                    Step::Mirror(None),
                    Step::Emit(HarnessEvent::ToolCallStarted { tool }),
                ]
            }
            None => vec![Step::Received],
        },
        "item/completed" => item_completed(&params["item"], turn),
        "error" => {
            if params["willRetry"].as_bool() != Some(true) {
                turn.error = Some(params["error"].clone());
            }
            Vec::new()
        }
        "turn/completed" => {
            let turn_id = params["turn"]["id"].as_str();
            if turn.turn_id.is_some() && turn_id != turn.turn_id.as_deref() {
                return Vec::new();
            }
            // The rollout's end of the turn may land just after this notification.
            let end = turn_id.map(|id| format!("end:{id}"));
            vec![Step::Mirror(end), Step::End(params.clone())]
        }
        _ => Vec::new(),
    }
}

/// A delta of an agent message: shown as it comes, a new message set apart from the
/// last one shown.
fn message_delta(params: &Value, turn: &mut CodexTurn) -> Vec<Step> {
    let item = params["itemId"].as_str().unwrap_or_default().to_owned();
    let delta = params["delta"].as_str().unwrap_or_default();
    let mut steps = vec![Step::Received];
    if turn.streamed.insert(item.clone()) {
        if turn.shown_text {
            steps.push(Step::Emit(HarnessEvent::ContentDelta {
                text: "\n\n".into(),
            }));
        }
        turn.messages.push((item.clone(), String::new(), None));
    }
    if let Some((_, text, _)) = turn.messages.iter_mut().find(|(id, ..)| *id == item) {
        text.push_str(delta);
    }
    if !delta.is_empty() {
        turn.shown_text = true;
        steps.push(Step::Emit(HarnessEvent::ContentDelta {
            text: delta.to_owned(),
        }));
    }
    steps
}

fn item_completed(item: &Value, turn: &mut CodexTurn) -> Vec<Step> {
    let id = item["id"].as_str().unwrap_or_default().to_owned();
    match item["type"].as_str() {
        Some("agentMessage") => {
            let text = item["text"].as_str().unwrap_or_default().to_owned();
            let phase = item["phase"].as_str().map(str::to_owned);
            let mut steps = vec![Step::Received];
            if turn.streamed.contains(&id) {
                if let Some(entry) = turn.messages.iter_mut().find(|(known, ..)| *known == id) {
                    entry.1 = text;
                    entry.2 = phase;
                }
            } else {
                if turn.shown_text && !text.is_empty() {
                    steps.push(Step::Emit(HarnessEvent::ContentDelta {
                        text: "\n\n".into(),
                    }));
                }
                if !text.is_empty() {
                    turn.shown_text = true;
                    steps.push(Step::Emit(HarnessEvent::ContentDelta {
                        text: text.clone(),
                    }));
                }
                turn.messages.push((id, text, phase));
            }
            steps.push(Step::Mirror(None));
            steps
        }
        Some("contextCompaction") => {
            turn.compacted = true;
            vec![Step::Received, Step::Mirror(None)]
        }
        _ => match tool_call(item, true) {
            Some(tool) => {
                // The output line first: a checkpoint at this tool is cut after it.
                // (A web search is shown only: the model server ran it, nothing here.)
                let output = (tool.tool_name != "web_search")
                    .then(|| format!("output:{}", tool.tool_call_id));
                let mut steps = vec![Step::Received, Step::Mirror(output)];
                // An item the app-server completes without starting is shown whole.
                if !turn.open_tools.remove(&tool.tool_call_id) {
                    steps.push(Step::Emit(HarnessEvent::ToolCallStarted {
                        tool: started(&tool),
                    }));
                }
                steps.push(Step::Emit(HarnessEvent::ToolCallCompleted { tool }));
                steps
            }
            None => vec![Step::Received, Step::Mirror(None)],
        },
    }
}
