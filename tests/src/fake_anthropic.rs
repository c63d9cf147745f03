//! A fake Anthropic Messages API on loopback, for running the real `claude` CLI offline.
//!
//! The fake is scripted by the conversation it receives, so each test says what the
//! model does in the prompt it sends. Directives are lines of the current user message
//! that start with `@` (in a prompt seeded with history, only those after
//! `Current message:`):
//!
//! | directive | the model… |
//! |---|---|
//! | `@bash CMD` | calls `Bash` with `{"command": CMD}` |
//! | `@read PATH` | calls `Read` with `{"file_path": PATH}` |
//! | `@read-attached` | reads the first file the runtime's attachment note names |
//! | `@task PROMPT` | calls the subagent tool (`Task`/`Agent`) with PROMPT (which may hold directives for the subagent, separated by `;;`) |
//! | `@tool NAME JSON` | calls any tool |
//! | `@json JSON` | answers through the structured-output tool with JSON |
//! | `@reply TEXT` | answers TEXT (default `Done.`) |
//! | `@slow MS` | waits MS between the answer's words (and before the first) |
//! | `@think MS` | waits MS before each response (a model's time to think) |
//! | `@error STATUS [xN]` | answers HTTP STATUS (401, 400 context, 400, 429, 529, 500), the first N times only |
//! | `@error usage-limit xN SECONDS` | answers 429 with the headers of a subscription's usage limit resetting in SECONDS |
//! | `@usage IN OUT READ WRITE` | reports that usage |
//! | `- NAME ARGS (ID): approved: …` | (turnstile's message of a decision made after the paused CLI was gone) calls NAME with ARGS again, as a model that follows the decision would |
//!
//! Tool calls are made one per request, in order; after the last tool result the
//! model answers. A summarising request (the CLI's `/compact`) is answered with a
//! `<summary>`. Every request is recorded for assertions.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The model name the fake reports.
pub const FAKE_MODEL: &str = "claude-sonnet-4-6";

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Request path with query.
    pub path: String,
    /// Body as JSON (`Null` when it was not JSON).
    pub body: Value,
}

impl Recorded {
    /// All text of the request's messages (user and assistant, tool results too),
    /// one block a line: what the model "sees" of the conversation.
    pub fn conversation_text(&self) -> String {
        let mut out = String::new();
        for message in self.body["messages"].as_array().into_iter().flatten() {
            push_text(&message["content"], &mut out);
        }
        out
    }

    /// The last user message's own text (not tool results).
    pub fn prompt_text(&self) -> String {
        prompt_of(&self.body)
            .map(|(_, text)| text)
            .unwrap_or_default()
    }
}

fn push_text(content: &Value, out: &mut String) {
    match content {
        Value::String(text) => {
            out.push_str(text);
            out.push('\n');
        }
        Value::Array(blocks) => {
            for block in blocks {
                match block["type"].as_str() {
                    Some("text") => push_text(&block["text"], out),
                    Some("tool_result") => push_text(&block["content"], out),
                    Some("tool_use") => {
                        out.push_str(&block["input"].to_string());
                        out.push('\n');
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

#[derive(Default)]
struct State {
    requests: Vec<Recorded>,
    /// How many times each `@error` prompt has failed.
    failures: HashMap<String, u32>,
}

/// A running fake; it stops when dropped.
pub struct FakeAnthropic {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    state: Arc<Mutex<State>>,
    _stop: crate::loopback::Stop,
}

impl FakeAnthropic {
    /// Starts the fake on a loopback port of its own, on a thread of its own.
    pub fn start() -> FakeAnthropic {
        let state = Arc::new(Mutex::new(State::default()));
        let served = state.clone();
        let (addr, stop) = crate::loopback::serve("fake-anthropic", move |request| {
            handle(served.clone(), request)
        });
        FakeAnthropic {
            base_url: format!("http://{addr}"),
            state,
            _stop: stop,
        }
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Requests to `/v1/messages` that carry a conversation, oldest first.
    pub fn message_requests(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.starts_with("/v1/messages") && !r.path.contains("count_tokens"))
            .filter(|r| r.body["messages"].is_array())
            .collect()
    }

    /// The newest conversation request whose prompt holds `marker`.
    pub fn last_request_with(&self, marker: &str) -> Recorded {
        self.message_requests()
            .into_iter()
            .rev()
            .find(|r| r.prompt_text().contains(marker))
            .unwrap_or_else(|| panic!("the fake model got no prompt with {marker:?}"))
    }

    /// Forgets what was recorded.
    pub fn clear(&self) {
        self.state.lock().unwrap().requests.clear();
    }
}

use crate::loopback::Body;

fn full(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("request-id", "req_fake")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("response")
}

async fn handle(
    state: Arc<Mutex<State>>,
    request: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let path = request
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let bytes = request
        .into_body()
        .collect()
        .await
        .map(|body| body.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    state.lock().unwrap().requests.push(Recorded {
        path: path.clone(),
        body: body.clone(),
    });
    if path.starts_with("/v1/messages/count_tokens") {
        return full(StatusCode::OK, json!({"input_tokens": 100}));
    }
    if !path.starts_with("/v1/messages") {
        return full(
            StatusCode::NOT_FOUND,
            json!({"type": "error", "error": {"type": "not_found_error", "message": "not found"}}),
        );
    }
    let turn = plan(&state, &body);
    if let Some((status, kind, message)) = turn.error {
        let mut response = full(
            status,
            json!({"type": "error", "error": {"type": kind, "message": message}}),
        );
        if let Some(reset) = turn.usage_reset {
            // As the Messages API says a subscription's usage limit is reached.
            let headers = response.headers_mut();
            for (name, value) in [
                ("anthropic-ratelimit-unified-status", "rejected".to_owned()),
                ("anthropic-ratelimit-unified-reset", reset.to_string()),
                (
                    "anthropic-ratelimit-unified-representative-claim",
                    "five_hour".to_owned(),
                ),
            ] {
                headers.insert(name, value.parse().expect("header"));
            }
        }
        return response;
    }
    let model = body["model"].as_str().unwrap_or(FAKE_MODEL).to_owned();
    if body["stream"].as_bool() != Some(true) {
        let content: Vec<Value> = turn
            .blocks
            .iter()
            .map(|block| match block {
                Block::Text(text) => json!({"type": "text", "text": text}),
                Block::ToolUse { id, name, input } => {
                    json!({"type": "tool_use", "id": id, "name": name, "input": input})
                }
            })
            .collect();
        return full(
            StatusCode::OK,
            json!({
                "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                "content": content, "stop_reason": turn.stop_reason(), "stop_sequence": null,
                "usage": turn.usage_json(),
            }),
        );
    }
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    tokio::spawn(stream_turn(turn, model, tx));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("request-id", "req_fake")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("response")
}

enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

struct Turn {
    blocks: Vec<Block>,
    error: Option<(StatusCode, &'static str, String)>,
    /// With a 429: the account's usage limit, resetting at this Unix time (seconds).
    usage_reset: Option<u64>,
    delay: Duration,
    /// Before the whole response.
    think: Duration,
    usage: (u64, u64, u64, u64),
}

impl Turn {
    fn stop_reason(&self) -> &'static str {
        if self
            .blocks
            .iter()
            .any(|b| matches!(b, Block::ToolUse { .. }))
        {
            "tool_use"
        } else {
            "end_turn"
        }
    }

    fn usage_json(&self) -> Value {
        let (input, output, read, write) = self.usage;
        json!({"input_tokens": input, "output_tokens": output,
               "cache_read_input_tokens": read, "cache_creation_input_tokens": write})
    }
}

/// Where the prompt is: the newest user text block that is not a system reminder
/// (the CLI merges consecutive user messages, so a prompt can share its message with
/// earlier tool results or an earlier copy of itself), as (message, block, text).
fn prompt_at(body: &Value) -> Option<(usize, usize, String)> {
    let messages = body["messages"].as_array()?;
    messages.iter().enumerate().rev().find_map(|(at, message)| {
        if message["role"] != "user" {
            return None;
        }
        match &message["content"] {
            Value::String(text) if !text.trim().is_empty() => Some((at, 0, text.clone())),
            Value::Array(blocks) => blocks.iter().enumerate().rev().find_map(|(block_at, b)| {
                let text = b["text"].as_str().filter(|_| b["type"] == "text")?;
                (!text.trim().is_empty() && !text.trim_start().starts_with("<system-reminder>"))
                    .then(|| (at, block_at, text.to_owned()))
            }),
            _ => None,
        }
    })
}

/// The last user message that carries text of its own (the prompt), and its text.
fn prompt_of(body: &Value) -> Option<(usize, String)> {
    prompt_at(body).map(|(at, _, text)| (at, text))
}

/// Tool results sent after the prompt: how many of the script's calls are done.
fn results_since(body: &Value) -> usize {
    let Some((message_at, block_at, _)) = prompt_at(body) else {
        return 0;
    };
    let Some(messages) = body["messages"].as_array() else {
        return 0;
    };
    let is_result = |b: &&Value| b["type"] == "tool_result";
    let in_prompt_message = messages[message_at]["content"]
        .as_array()
        .map_or(0, |blocks| {
            blocks[block_at..].iter().filter(is_result).count()
        });
    let later: usize = messages[message_at + 1..]
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_array())
        .map(|blocks| blocks.iter().filter(is_result).count())
        .sum();
    in_prompt_message + later
}

/// A call turnstile's decision message says was approved (`- NAME ARGS (ID): approved:
/// run it now…`): a model that follows the decision asks for it again, as proposed.
fn approved_call(line: &str) -> Option<(String, Value)> {
    let rest = line.strip_prefix("- ")?;
    let (call, verdict) = rest.rsplit_once("): ")?;
    if !verdict.starts_with("approved") {
        return None;
    }
    let (call, _id) = call.rsplit_once(" (")?;
    let (name, args) = call.split_once(' ')?;
    Some((name.to_owned(), serde_json::from_str(args).ok()?))
}

fn tool_named(body: &Value, candidates: &[&str], fallback: &str) -> String {
    let names: Vec<&str> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    candidates
        .iter()
        .find(|c| names.contains(c))
        .map_or(fallback, |c| c)
        .to_owned()
}

fn plan(state: &Mutex<State>, body: &Value) -> Turn {
    let mut turn = Turn {
        blocks: Vec::new(),
        error: None,
        usage_reset: None,
        delay: Duration::ZERO,
        think: Duration::ZERO,
        usage: (12, 7, 0, 0),
    };
    let Some((_, prompt)) = prompt_of(body) else {
        turn.blocks.push(Block::Text("Done.".into()));
        return turn;
    };
    if prompt.contains("summary of the conversation")
        || prompt.contains("Your task is to create a detailed summary")
    {
        turn.blocks.push(Block::Text(
            "<analysis>fake</analysis>\n<summary>FAKE SUMMARY of the earlier conversation.</summary>".into(),
        ));
        return turn;
    }
    let acting = prompt
        .rfind("Current message:\n")
        .map_or(prompt.as_str(), |at| {
            &prompt[at + "Current message:\n".len()..]
        });
    let mut steps: Vec<(String, Value)> = Vec::new();
    let mut reply = "Done.".to_owned();
    let mut json_answer = None;
    for line in acting.lines() {
        if let Some(call) = approved_call(line) {
            steps.push(call);
            continue;
        }
        let Some(directive) = line.trim().strip_prefix('@') else {
            continue;
        };
        let (name, rest) = directive.split_once(' ').unwrap_or((directive, ""));
        let rest = rest.trim();
        match name {
            "bash" => steps.push((
                "Bash".into(),
                json!({"command": rest, "description": "run it"}),
            )),
            "read" => steps.push(("Read".into(), json!({"file_path": rest}))),
            "read-attached" => {
                // The runtime's note: "Attached files (in DIR):\n- NAME (TYPE, N bytes)".
                let path = prompt.split_once("(in ").and_then(|(_, after)| {
                    let (dir, list) = after.split_once("):")?;
                    let name = list.trim_start().strip_prefix("- ")?.split(" (").next()?;
                    Some(format!("{dir}/{name}"))
                });
                steps.push((
                    "Read".into(),
                    json!({"file_path": path.unwrap_or_default()}),
                ));
            }
            "task" => {
                let tool = tool_named(body, &["Task", "Agent"], "Task");
                steps.push((
                    tool,
                    json!({"description": "subtask", "prompt": rest.replace(";;", "\n"), "subagent_type": "general-purpose", "run_in_background": false}),
                ));
            }
            "tool" => {
                let (tool, args) = rest.split_once(' ').unwrap_or((rest, "{}"));
                steps.push((
                    tool.to_owned(),
                    serde_json::from_str(args).unwrap_or(json!({})),
                ));
            }
            "json" => json_answer = Some(serde_json::from_str(rest).unwrap_or(json!({}))),
            "reply" => reply = rest.to_owned(),
            "slow" => turn.delay = Duration::from_millis(rest.parse().unwrap_or(100)),
            "think" => turn.think = Duration::from_millis(rest.parse().unwrap_or(100)),
            "usage" => {
                let n: Vec<u64> = rest
                    .split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect();
                turn.usage = (
                    n.first().copied().unwrap_or(0),
                    n.get(1).copied().unwrap_or(0),
                    n.get(2).copied().unwrap_or(0),
                    n.get(3).copied().unwrap_or(0),
                );
            }
            "error" => {
                let mut parts = rest.split_whitespace();
                let status = parts.next().unwrap_or("500");
                let times = parts
                    .find_map(|p| p.strip_prefix('x'))
                    .and_then(|n| n.parse::<u32>().ok());
                let mut state = state.lock().unwrap();
                let failed = state.failures.entry(acting.to_owned()).or_insert(0);
                if times.is_none_or(|times| *failed < times) {
                    *failed += 1;
                    turn.error = Some(match status {
                        "401" => (
                            StatusCode::UNAUTHORIZED,
                            "authentication_error",
                            "invalid x-api-key".into(),
                        ),
                        "400-context" | "context" => (
                            StatusCode::BAD_REQUEST,
                            "invalid_request_error",
                            "prompt is too long: 210000 tokens > 200000 maximum".into(),
                        ),
                        "400" => (
                            StatusCode::BAD_REQUEST,
                            "invalid_request_error",
                            "messages: bad request".into(),
                        ),
                        "429" => (
                            StatusCode::TOO_MANY_REQUESTS,
                            "rate_limit_error",
                            "rate limited".into(),
                        ),
                        "usage-limit" => {
                            let seconds: u64 =
                                parts.next().and_then(|s| s.parse().ok()).unwrap_or(1);
                            let now = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .map_or(0, |since| since.as_secs());
                            turn.usage_reset = Some(now + seconds);
                            (
                                StatusCode::TOO_MANY_REQUESTS,
                                "rate_limit_error",
                                "usage limit reached".into(),
                            )
                        }
                        "529" => (
                            StatusCode::from_u16(529).expect("529"),
                            "overloaded_error",
                            "Overloaded".into(),
                        ),
                        _ => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "api_error",
                            "Internal server error".into(),
                        ),
                    });
                    return turn;
                }
            }
            _ => {}
        }
    }
    let done = results_since(body);
    if let Some((name, input)) = steps.get(done) {
        turn.blocks.push(Block::ToolUse {
            id: format!("toolu_fake_{}_{done}", short_hash(acting)),
            name: name.clone(),
            input: input.clone(),
        });
    } else if let Some(answer) = json_answer.filter(|_| done == steps.len()) {
        let name = tool_named(body, &["StructuredOutput"], "StructuredOutput");
        turn.blocks.push(Block::ToolUse {
            id: format!("toolu_fake_{}_json", short_hash(acting)),
            name,
            input: answer,
        });
    } else {
        turn.blocks.push(Block::Text(reply));
    }
    turn
}

fn short_hash(text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", hash as u32)
}

async fn stream_turn(
    turn: Turn,
    model: String,
    tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
) {
    let send = |event: &str, data: Value| {
        let tx = tx.clone();
        let frame = format!("event: {event}\ndata: {data}\n\n");
        async move { tx.send(Ok(Frame::data(Bytes::from(frame)))).await.is_ok() }
    };
    let (input, output, read, write) = turn.usage;
    tokio::time::sleep(turn.think).await;
    if !send(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_fake_{}", uuid_like()), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": 1,
                      "cache_read_input_tokens": read, "cache_creation_input_tokens": write}}}),
    )
    .await
    {
        return;
    }
    for (index, block) in turn.blocks.iter().enumerate() {
        match block {
            Block::Text(text) => {
                send(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
                )
                .await;
                let words: Vec<&str> = text.split_inclusive(' ').collect();
                for word in words {
                    if !turn.delay.is_zero() {
                        tokio::time::sleep(turn.delay).await;
                    }
                    if !send(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": word}}),
                    )
                    .await
                    {
                        return;
                    }
                }
            }
            Block::ToolUse { id, name, input } => {
                send(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index,
                           "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                )
                .await;
                send(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
                )
                .await;
            }
        }
        send(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
        .await;
    }
    send(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": turn.stop_reason(), "stop_sequence": null},
               "usage": {"output_tokens": output}}),
    )
    .await;
    send("message_stop", json!({"type": "message_stop"})).await;
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:016x}", NEXT.fetch_add(1, Ordering::Relaxed))
}
