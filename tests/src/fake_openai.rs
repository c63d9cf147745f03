//! A fake OpenAI Responses API on loopback, for running the real `codex` CLI offline
//! (`POST /v1/responses`, streamed as SSE; what it must do is in
//! `shared/reference/codex-cli.md` §7).
//!
//! The fake is scripted by the prompt it receives: lines of the newest user message
//! that start with `@` (in a prompt seeded with history, only those after
//! `Current message:`):
//!
//! | directive | the model… |
//! |---|---|
//! | `@bash CMD` | runs CMD through `exec_command` (several lines: several calls, one per request) |
//! | `@search QUERY` | searches the web for QUERY (a `web_search_call` item, before the answer) |
//! | `@reply TEXT` | answers TEXT (default `Done.`) |
//! | `@two TEXT` | answers in two messages, `First part.` then TEXT |
//! | `@reasoning TEXT` | thinks TEXT (a reasoning summary) before answering |
//! | `@json JSON` | answers the JSON text (structured output) |
//! | `@slow MS` | waits MS between the answer's words (and before the first) |
//! | `@think MS` | waits MS before each response (a model's time to think) |
//! | `@error KIND [xN]` | fails: `401`, `429`, `500`, `503`, `400`, `context`, `quota`, `usage-limit` (a plan's usage limit, resetting in 2 s); the first N times only |
//! | `- shell ARGS (ID): approved: …` | (turnstile's message of a decision made after the paused CLI was gone) runs ARGS' command again, as a model that follows the decision would |
//! | `@history` | answers every user message it was sent, one per line (`user: …`), and every tool output (`tool: …`) |
//!
//! A compaction request is answered with `FAKE-SUMMARY: …`. Usage is deterministic:
//! input tokens `1000 + 10 × input items`, half of them cached, 7 output tokens.

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

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Request path.
    pub path: String,
    /// Headers, lower-case names.
    pub headers: HashMap<String, String>,
    /// Body as JSON (`Null` when it was not JSON).
    pub body: Value,
}

impl Recorded {
    /// The text of every user message, in order (environment and image wrappers left out).
    pub fn user_texts(&self) -> Vec<String> {
        messages(&self.body, "user")
    }

    /// The text of every assistant message, in order.
    pub fn assistant_texts(&self) -> Vec<String> {
        messages(&self.body, "assistant")
    }

    /// Every tool output, in order.
    pub fn tool_outputs(&self) -> Vec<String> {
        input(&self.body)
            .iter()
            .filter(|item| item["type"] == "function_call_output")
            .map(|item| output_text(&item["output"]))
            .collect()
    }

    /// The prompt: the newest user message's text.
    pub fn prompt_text(&self) -> String {
        self.user_texts().pop().unwrap_or_default()
    }

    /// The usage the fake answered this request with: (input, cached, output).
    pub fn usage(&self) -> (u64, u64, u64) {
        usage_of(&self.body)
    }

    /// Images the request carries.
    pub fn images(&self) -> usize {
        input(&self.body)
            .iter()
            .filter_map(|item| item["content"].as_array())
            .flatten()
            .filter(|part| part["type"] == "input_image")
            .count()
    }
}

fn input(body: &Value) -> Vec<Value> {
    body["input"].as_array().cloned().unwrap_or_default()
}

fn output_text(output: &Value) -> String {
    match output {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn is_wrapper(text: &str) -> bool {
    let text = text.trim_start();
    text.starts_with("<environment_context>")
        || text.starts_with("<image")
        || text.starts_with("</image>")
        || text.starts_with("<turn_aborted>")
        || text.starts_with("<skills_instructions>")
        || text.starts_with("<user_instructions>")
        || text.starts_with("# AGENTS.md")
}

fn messages(body: &Value, role: &str) -> Vec<String> {
    input(body)
        .iter()
        .filter(|item| item["type"] == "message" && item["role"] == role)
        .filter_map(|item| {
            let text: Vec<&str> = item["content"]
                .as_array()?
                .iter()
                .filter_map(|part| part["text"].as_str())
                .filter(|text| !is_wrapper(text))
                .collect();
            (!text.is_empty()).then(|| text.join("\n"))
        })
        .collect()
}

fn usage_of(body: &Value) -> (u64, u64, u64) {
    let input_tokens = 1000 + 10 * input(body).len() as u64;
    (input_tokens, input_tokens / 2, 7)
}

#[derive(Default)]
struct State {
    requests: Vec<Recorded>,
    /// How many times each `@error` prompt has failed.
    failures: HashMap<String, u32>,
}

/// A running fake; it stops when dropped.
pub struct FakeOpenAi {
    /// `http://127.0.0.1:PORT/v1`, the provider's `base_url`.
    pub base_url: String,
    state: Arc<Mutex<State>>,
    _stop: crate::loopback::Stop,
}

impl FakeOpenAi {
    /// Starts the fake on a loopback port of its own, on a thread of its own.
    pub fn start() -> FakeOpenAi {
        let state = Arc::new(Mutex::new(State::default()));
        let served = state.clone();
        let (addr, stop) = crate::loopback::serve("fake-openai", move |request| {
            handle(served.clone(), request)
        });
        FakeOpenAi {
            base_url: format!("http://{addr}/v1"),
            state,
            _stop: stop,
        }
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The newest request whose prompt holds `marker`.
    pub fn last_request_with(&self, marker: &str) -> Recorded {
        self.requests()
            .into_iter()
            .rev()
            .find(|r| r.prompt_text().contains(marker))
            .unwrap_or_else(|| panic!("the fake model got no prompt with {marker:?}"))
    }

    /// The requests whose prompt holds `marker`.
    pub fn requests_with(&self, marker: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.prompt_text().contains(marker))
            .collect()
    }
}

use crate::loopback::Body;

fn full(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("response")
}

/// What the model does in answer to one request.
enum Answer {
    /// Fail with an HTTP status and an OpenAI error body.
    Status(StatusCode, Value),
    /// A stream that ends in `response.failed` with this error.
    Failed(Value),
    /// A stream of output items.
    Items {
        items: Vec<Item>,
        delay: Duration,
        /// Before the whole response.
        think: Duration,
    },
}

enum Item {
    Search(String),
    Reasoning(String),
    Message(String),
    Call { call_id: String, command: String },
}

async fn handle(
    state: Arc<Mutex<State>>,
    request: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let path = request.uri().path().to_owned();
    let headers = request
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let bytes = request
        .into_body()
        .collect()
        .await
        .map(|body| body.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let recorded = Recorded {
        path: path.clone(),
        headers,
        body: body.clone(),
    };
    state.lock().unwrap().requests.push(recorded.clone());
    if path != "/v1/responses" {
        return full(
            StatusCode::NOT_FOUND,
            json!({"error": {"message": format!("no route {path}"), "type": "invalid_request_error"}}),
        );
    }
    let answer = plan(&state, &recorded);
    let items = match answer {
        Answer::Status(status, body) => {
            let mut response = full(status, body.clone());
            if let Some(reset) = body["error"]["resets_at"].as_u64() {
                // As the ChatGPT backend says a plan's window is used up.
                let headers = response.headers_mut();
                for (name, value) in [
                    ("x-codex-primary-used-percent", "100".to_owned()),
                    ("x-codex-primary-window-minutes", "300".to_owned()),
                    ("x-codex-primary-reset-at", reset.to_string()),
                ] {
                    headers.insert(name, value.parse().expect("header"));
                }
            }
            return response;
        }
        other => other,
    };
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    tokio::spawn(stream(items, usage_of(&body), tx));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("response")
}

fn plan(state: &Mutex<State>, request: &Recorded) -> Answer {
    let prompt = request.prompt_text();
    if prompt.contains("CONTEXT CHECKPOINT COMPACTION") {
        let earlier = request.user_texts().len().saturating_sub(1);
        return Answer::Items {
            items: vec![Item::Message(format!(
                "FAKE-SUMMARY: {earlier} earlier messages."
            ))],
            delay: Duration::ZERO,
            think: Duration::ZERO,
        };
    }
    let acting = prompt
        .rfind("Current message:\n")
        .map_or(prompt.as_str(), |at| {
            &prompt[at + "Current message:\n".len()..]
        })
        .to_owned();
    let mut commands = Vec::new();
    let mut reply = "Done.".to_owned();
    let mut first_part = None;
    let mut reasoning = None;
    let mut search = None;
    let mut delay = Duration::ZERO;
    let mut think = Duration::ZERO;
    for line in acting.lines() {
        if let Some(command) = approved_command(line) {
            commands.push(command);
            continue;
        }
        let Some(directive) = line.trim().strip_prefix('@') else {
            continue;
        };
        let (name, rest) = directive.split_once(' ').unwrap_or((directive, ""));
        let rest = rest.trim();
        match name {
            "bash" => commands.push(rest.to_owned()),
            "reply" | "json" => reply = rest.to_owned(),
            "two" => {
                first_part = Some("First part.".to_owned());
                reply = rest.to_owned();
            }
            "reasoning" => reasoning = Some(rest.to_owned()),
            "search" => search = Some(rest.to_owned()),
            "slow" => delay = Duration::from_millis(rest.parse().unwrap_or(100)),
            "think" => think = Duration::from_millis(rest.parse().unwrap_or(100)),
            "history" => {
                let mut lines: Vec<String> = request
                    .user_texts()
                    .iter()
                    .map(|text| format!("user: {}", text.lines().next().unwrap_or_default()))
                    .collect();
                lines.extend(
                    request
                        .tool_outputs()
                        .iter()
                        .map(|text| format!("tool: {}", text.replace('\n', " | "))),
                );
                reply = lines.join("\n");
            }
            "error" => {
                let mut parts = rest.split_whitespace();
                let kind = parts.next().unwrap_or("500").to_owned();
                let times = parts
                    .find_map(|p| p.strip_prefix('x'))
                    .and_then(|n| n.parse::<u32>().ok());
                let mut state = state.lock().unwrap();
                let failed = state.failures.entry(acting.clone()).or_insert(0);
                if times.is_none_or(|times| *failed < times) {
                    *failed += 1;
                    return error(&kind);
                }
            }
            _ => {}
        }
    }
    let done = request.body["input"]
        .as_array()
        .map(|items| {
            let from = items
                .iter()
                .rposition(|item| item["type"] == "message" && item["role"] == "user")
                .unwrap_or(0);
            items[from..]
                .iter()
                .filter(|item| item["type"] == "function_call_output")
                .count()
        })
        .unwrap_or(0);
    let mut items = Vec::new();
    if let Some(command) = commands.get(done) {
        if done == 0
            && let Some(text) = reasoning
        {
            items.push(Item::Reasoning(text));
        }
        items.push(Item::Call {
            call_id: format!("call_{}_{done}", short_hash(&acting)),
            command: command.clone(),
        });
    } else {
        if commands.is_empty()
            && let Some(text) = reasoning
        {
            items.push(Item::Reasoning(text));
        }
        if let Some(query) = search {
            items.push(Item::Search(query));
        }
        if let Some(first) = first_part {
            items.push(Item::Message(first));
        }
        items.push(Item::Message(reply));
    }
    Answer::Items {
        items,
        delay,
        think,
    }
}

fn error(kind: &str) -> Answer {
    let body = |message: &str, kind: &str, code: Value| json!({"error": {"message": message, "type": kind, "code": code, "param": null}});
    match kind {
        "401" => Answer::Status(
            StatusCode::UNAUTHORIZED,
            body(
                "Incorrect API key provided: fake.",
                "invalid_request_error",
                json!("invalid_api_key"),
            ),
        ),
        "429" => Answer::Status(
            StatusCode::TOO_MANY_REQUESTS,
            body(
                "Rate limit reached. Please try again in 1s.",
                "requests",
                json!("rate_limit_exceeded"),
            ),
        ),
        "503" => Answer::Status(
            StatusCode::SERVICE_UNAVAILABLE,
            body("overloaded", "server_error", Value::Null),
        ),
        "400" => Answer::Status(
            StatusCode::BAD_REQUEST,
            body("bad request", "invalid_request_error", Value::Null),
        ),
        "context" => Answer::Failed(json!({
            "code": "context_length_exceeded",
            "message": "Your input exceeds the context window of this model.",
        })),
        // A ChatGPT plan's usage limit, resetting in two seconds.
        "usage-limit" => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs());
            Answer::Status(
                StatusCode::TOO_MANY_REQUESTS,
                json!({"error": {"type": "usage_limit_reached", "message": "The usage limit has been reached",
                                 "plan_type": "plus", "resets_at": now + 2, "resets_in_seconds": 2}}),
            )
        }
        "quota" => Answer::Failed(json!({
            "code": "insufficient_quota",
            "message": "You exceeded your current quota.",
        })),
        _ => Answer::Status(
            StatusCode::INTERNAL_SERVER_ERROR,
            body("internal error", "server_error", Value::Null),
        ),
    }
}

fn short_hash(text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", hash as u32)
}

fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

async fn stream(
    answer: Answer,
    (input_tokens, cached, output_tokens): (u64, u64, u64),
    tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
) {
    let send = |data: Value| {
        let tx = tx.clone();
        let event = data["type"].as_str().unwrap_or_default().to_owned();
        let frame = format!("event: {event}\ndata: {data}\n\n");
        async move { tx.send(Ok(Frame::data(Bytes::from(frame)))).await.is_ok() }
    };
    if let Answer::Items { think, .. } = &answer {
        tokio::time::sleep(*think).await;
    }
    let response_id = format!("resp_fake_{}", next_id());
    if !send(json!({"type": "response.created", "response": {"id": response_id}})).await {
        return;
    }
    let (items, delay) = match answer {
        Answer::Failed(error) => {
            send(
                json!({"type": "response.failed", "response": {"id": response_id, "error": error}}),
            )
            .await;
            return;
        }
        Answer::Items { items, delay, .. } => (items, delay),
        Answer::Status(..) => return,
    };
    for (index, item) in items.into_iter().enumerate() {
        match item {
            Item::Search(query) => {
                send(
                    json!({"type": "response.output_item.done", "output_index": index,
                    "item": {"type": "web_search_call", "id": format!("ws_fake_{}", next_id()),
                             "status": "completed", "action": {"type": "search", "query": query}}}),
                )
                .await;
            }
            Item::Reasoning(text) => {
                let id = format!("rs_fake_{}", next_id());
                send(
                    json!({"type": "response.output_item.added", "output_index": index,
                    "item": {"type": "reasoning", "id": id, "summary": []}}),
                )
                .await;
                send(json!({"type": "response.reasoning_summary_part.added", "item_id": id,
                    "output_index": index, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}))
                .await;
                send(
                    json!({"type": "response.reasoning_summary_text.delta", "item_id": id,
                    "output_index": index, "summary_index": 0, "delta": text}),
                )
                .await;
                send(
                    json!({"type": "response.reasoning_summary_text.done", "item_id": id,
                    "output_index": index, "summary_index": 0, "text": text}),
                )
                .await;
                send(
                    json!({"type": "response.output_item.done", "output_index": index,
                    "item": {"type": "reasoning", "id": id,
                             "summary": [{"type": "summary_text", "text": text}]}}),
                )
                .await;
            }
            Item::Message(text) => {
                let id = format!("msg_fake_{}", next_id());
                send(json!({"type": "response.output_item.added", "output_index": index,
                    "item": {"type": "message", "id": id, "role": "assistant", "status": "in_progress", "content": []}}))
                .await;
                send(json!({"type": "response.content_part.added", "item_id": id, "output_index": index,
                    "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}))
                .await;
                for word in text.split_inclusive(' ') {
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    if !send(json!({"type": "response.output_text.delta", "item_id": id,
                        "output_index": index, "content_index": 0, "delta": word}))
                    .await
                    {
                        return;
                    }
                }
                send(json!({"type": "response.output_text.done", "item_id": id, "output_index": index,
                    "content_index": 0, "text": text}))
                .await;
                send(json!({"type": "response.content_part.done", "item_id": id, "output_index": index,
                    "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}}))
                .await;
                send(json!({"type": "response.output_item.done", "output_index": index,
                    "item": {"type": "message", "id": id, "role": "assistant", "status": "completed",
                             "content": [{"type": "output_text", "text": text, "annotations": []}]}}))
                .await;
            }
            Item::Call { call_id, command } => {
                let arguments = json!({"cmd": command, "yield_time_ms": 10000}).to_string();
                send(
                    json!({"type": "response.output_item.done", "output_index": index,
                    "item": {"type": "function_call", "id": format!("fc_fake_{}", next_id()),
                             "call_id": call_id, "name": "exec_command", "arguments": arguments}}),
                )
                .await;
            }
        }
    }
    send(
        json!({"type": "response.completed", "response": {"id": response_id, "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        }}}),
    )
    .await;
}

/// The command of a call turnstile's decision message says was approved (`- shell ARGS
/// (ID): approved: …`), whose ARGS' `command` is the command line (or its argv).
fn approved_command(line: &str) -> Option<String> {
    let rest = line.strip_prefix("- shell ")?;
    let (call, verdict) = rest.rsplit_once("): ")?;
    if !verdict.starts_with("approved") {
        return None;
    }
    let (args, _id) = call.rsplit_once(" (")?;
    let args: Value = serde_json::from_str(args).ok()?;
    match &args["command"] {
        // The command as the CLI ran it, in a login shell: the model's was inside.
        Value::String(command) => Some(
            command
                .strip_prefix("/bin/bash -lc ")
                .map(|inner| inner.trim_matches('\'').to_owned())
                .unwrap_or_else(|| command.clone()),
        ),
        Value::Array(argv) => Some(
            argv.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    }
}
