//! The Claude Code harness: the real `claude` CLI, one turn at a time, durable anywhere.
//!
//! A turn writes a user message to a `claude -p --input-format stream-json` process and
//! reads its stream-json answer: `stream_event` text deltas, `assistant` tool calls,
//! `user` tool results, then one `result` line with usage, cost and errors.
//!
//! Durability: the CLI keeps its conversation in
//! `CONFIG/projects/<cwd key>/<session id>.jsonl`. Every line it writes there is
//! mirrored as a [`HarnessEvent::TranscriptLine`] (lines with a `uuid` at most once), in
//! order with the run's events: a tool result's line is mirrored before the tool's
//! completion is reported, so a checkpoint's transcript prefix ends at that result.
//! Before a cold start the file is written back from the journal's lines into a config
//! directory the runtime owns (`state_dir/<session>/`), so a turn resumes the same
//! Claude session after a restart, after passivation, or on another machine. A fork
//! (continuation) is the same file cut at a checkpoint, its `sessionId` fields rewritten
//! to the new id. The CLI's own files are disposable.
//!
//! Speed: a warm process per active session serves its consecutive turns while the
//! journal's transcript is the one the process holds; a bounded pool evicts the least
//! recently used; a warm process that dies before answering is replaced and the turn
//! runs on a cold one.
//!
//! Control: cancel kills the CLI's process group; a failed or cancelled turn never
//! returns its process to the pool; [`Harness::shutdown`] kills the pool. Errors are
//! classified from the `result` line (`is_error`, `api_error_status`,
//! `api_error_type`, `terminal_reason`, `subtype`), never from `subtype` alone. The
//! CLI's own API retries are off (`CLAUDE_CODE_MAX_RETRIES=0`) so the runtime's retry
//! policy decides.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio_util::sync::CancellationToken;
use turnstile_journal::SessionId;

use crate::process::{TranscriptTail, kill_tree};
use crate::{
    CompactRequest, Compaction, ErrorKind, EventSink, Harness, HarnessError, HarnessEvent,
    HarnessInfo, ModelUsage, ToolCall, TurnOutcome, TurnRequest, Usage,
};

/// The model when none is configured.
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-6";

/// How long a tool result's transcript line may lag behind its stdout line.
const TRANSCRIPT_LAG: Duration = Duration::from_secs(2);

/// The structured-output tool the CLI adds for `--json-schema`: plumbing, not a tool
/// call the client made the agent do.
const STRUCTURED_OUTPUT_TOOL: &str = "StructuredOutput";

/// The typed options of a `claude-code` agent (`spec/cli.md`).
#[derive(Debug, Clone)]
pub struct ClaudeCodeOptions {
    /// Path of the `claude` CLI.
    pub bin: PathBuf,
    /// Model (`--model`).
    pub model: String,
    /// Working directory of the CLI.
    pub cwd: PathBuf,
    /// Where the runtime keeps the CLI's config directories, one per session.
    pub state_dir: PathBuf,
    /// `--permission-mode`.
    pub permission_mode: Option<String>,
    /// `--allowedTools`.
    pub allowed_tools: Vec<String>,
    /// `--disallowedTools`.
    pub disallowed_tools: Vec<String>,
    /// `--max-turns`.
    pub max_turns: Option<u32>,
    /// `--max-budget-usd`.
    pub max_budget_usd: Option<f64>,
    /// `--system-prompt`.
    pub system_prompt: Option<String>,
    /// `--mcp-config`.
    pub mcp_config: Option<PathBuf>,
    /// Environment added to the CLI's (API base URL and key, for example).
    pub env: BTreeMap<String, String>,
    /// Warm processes kept at most (0: a process per turn).
    pub warm_processes: usize,
}

impl ClaudeCodeOptions {
    /// Options with the defaults: the default model, no tool rules, 4 warm processes.
    pub fn new(
        bin: impl Into<PathBuf>,
        cwd: impl Into<PathBuf>,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        ClaudeCodeOptions {
            bin: bin.into(),
            model: DEFAULT_MODEL.to_owned(),
            cwd: cwd.into(),
            state_dir: state_dir.into(),
            permission_mode: None,
            allowed_tools: Vec::new(),
            disallowed_tools: Vec::new(),
            max_turns: None,
            max_budget_usd: None,
            system_prompt: None,
            mcp_config: None,
            env: BTreeMap::new(),
            warm_processes: 4,
        }
    }
}

/// See the module documentation.
#[derive(Clone)]
pub struct ClaudeCodeHarness {
    options: Arc<ClaudeCodeOptions>,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for ClaudeCodeHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaudeCodeHarness")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl ClaudeCodeHarness {
    /// A harness with these options; it starts no process until a turn needs one.
    pub fn new(options: ClaudeCodeOptions) -> Self {
        let capacity = options.warm_processes;
        ClaudeCodeHarness {
            options: Arc::new(options),
            pool: Arc::new(Pool {
                capacity,
                warm: Mutex::new(Vec::new()),
            }),
        }
    }
}

impl Harness for ClaudeCodeHarness {
    fn info(&self) -> HarnessInfo {
        HarnessInfo {
            sdk: "claude-agent-sdk".into(),
            model: self.options.model.clone(),
            model_provider: "anthropic".into(),
        }
    }

    fn run_turn(
        &self,
        request: TurnRequest,
        events: EventSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<TurnOutcome, HarnessError>> {
        let this = self.clone();
        Box::pin(async move { this.turn(request, events, cancel).await })
    }

    fn compact(
        &self,
        request: CompactRequest,
    ) -> BoxFuture<'static, Result<Compaction, HarnessError>> {
        let this = self.clone();
        Box::pin(async move { this.compact_session(request).await })
    }

    fn shutdown(&self) {
        let warm = std::mem::take(&mut *self.pool.warm.lock().unwrap_or_else(|e| e.into_inner()));
        for mut entry in warm {
            entry.process.kill();
        }
    }
}

/// Idle warm processes, least recently used first out.
struct Pool {
    capacity: usize,
    warm: Mutex<Vec<Warm>>,
}

/// A process between turns, and what the journal must hold for it to be reused.
struct Warm {
    session_id: SessionId,
    harness_session_id: String,
    journaled_lines: usize,
    schema: Option<String>,
    process: CliProcess,
    last_used: Instant,
}

impl Pool {
    /// The session's warm process if it holds exactly the journal's conversation;
    /// a stale one is killed.
    fn take(
        &self,
        session_id: &SessionId,
        harness_session_id: Option<&str>,
        journaled_lines: usize,
        schema: Option<&str>,
    ) -> Option<CliProcess> {
        let mut warm = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        let at = warm.iter().position(|w| &w.session_id == session_id)?;
        let mut entry = warm.swap_remove(at);
        drop(warm);
        if Some(entry.harness_session_id.as_str()) == harness_session_id
            && entry.journaled_lines == journaled_lines
            && entry.schema.as_deref() == schema
            && entry.process.alive()
        {
            Some(entry.process)
        } else {
            entry.process.kill();
            None
        }
    }

    fn put(&self, entry: Warm) {
        let mut evicted = Vec::new();
        {
            let mut warm = self.warm.lock().unwrap_or_else(|e| e.into_inner());
            warm.push(entry);
            while warm.len() > self.capacity {
                let oldest = warm
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, w)| w.last_used)
                    .map(|(at, _)| at)
                    .unwrap_or(0);
                evicted.push(warm.swap_remove(oldest));
            }
        }
        for mut entry in evicted {
            entry.process.kill();
        }
    }
}

/// One running `claude` process and the transcript file it writes.
struct CliProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    transcript: TranscriptTail,
    /// `uuid`s of the lines already journaled.
    seen: HashSet<String>,
    harness_session_id: String,
}

impl CliProcess {
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the CLI, its process group and every process it started (its tools run
    /// commands in groups of their own), collected before any dies so none is
    /// orphaned out of reach.
    fn kill(&mut self) {
        kill_tree(&mut self.child);
    }

    fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for CliProcess {
    fn drop(&mut self) {
        if self.alive() {
            self.kill();
        }
    }
}

fn line_uuid(line: &str) -> Option<String> {
    // Cheap check first: most bookkeeping lines have no uuid.
    if !line.contains("\"uuid\"") {
        return None;
    }
    serde_json::from_str::<Value>(line)
        .ok()
        .and_then(|v| v["uuid"].as_str().map(str::to_owned))
}

/// The CLI's project key for a working directory: every character that is not a
/// letter or digit becomes `-`.
pub fn project_key(cwd: &Path) -> String {
    cwd.to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// What one turn's stdout said, besides its events.
#[derive(Default)]
struct TurnState {
    tools: HashMap<String, ToolCall>,
    streamed_messages: HashSet<String>,
    /// The lines mirrored in this turn, in order.
    mirrored: Vec<String>,
    compacting: bool,
    compact_summary: Option<String>,
    pre_compact_messages: u32,
    assistant_error: Option<String>,
    received: bool,
}

enum TurnEnd {
    /// The `result` line.
    Result(Value),
    /// stdout closed without one.
    Died(String),
}

impl ClaudeCodeHarness {
    fn config_dir(&self, session_id: &SessionId) -> PathBuf {
        self.options.state_dir.join(session_id.as_str())
    }

    /// Starts a process for the request's harness session, writing its transcript
    /// back from the journal first.
    fn spawn(
        &self,
        request: &TurnRequest,
        schema: Option<&str>,
    ) -> Result<CliProcess, HarnessError> {
        let options = &self.options;
        let io_error = |what: &str, error: std::io::Error| HarnessError::Failed {
            kind: ErrorKind::Transient,
            message: format!("{what}: {error}"),
        };
        std::fs::create_dir_all(&options.cwd).map_err(|e| io_error("creating the cwd", e))?;
        let cwd = options
            .cwd
            .canonicalize()
            .map_err(|e| io_error("resolving the cwd", e))?;
        let config = self.config_dir(&request.session_id);
        let project = config.join("projects").join(project_key(&cwd));
        std::fs::create_dir_all(&project).map_err(|e| io_error("creating the config dir", e))?;
        let mut command = tokio::process::Command::new(&options.bin);
        command.args([
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--model",
            &options.model,
        ]);
        let (harness_session_id, text) = match &request.harness_session_id {
            Some(id) if !request.transcript.is_empty() => {
                command.args(["--resume", id]);
                let mut text = String::new();
                for line in &request.transcript {
                    text.push_str(&rewrite_session_id(line, id));
                    text.push('\n');
                }
                (id.clone(), text)
            }
            // A fresh session, or a fork that keeps nothing (continuing from message 0).
            fresh => {
                let id = fresh
                    .clone()
                    .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
                command.args(["--session-id", &id]);
                (id, String::new())
            }
        };
        let path = project.join(format!("{harness_session_id}.jsonl"));
        if text.is_empty() {
            // The CLI refuses a session id whose file exists.
            let _ = std::fs::remove_file(&path);
        } else {
            std::fs::write(&path, &text).map_err(|e| io_error("writing the transcript", e))?;
        }
        if let Some(mode) = &options.permission_mode {
            command.args(["--permission-mode", mode]);
        }
        if !options.allowed_tools.is_empty() {
            command.arg("--allowedTools").args(&options.allowed_tools);
        }
        if !options.disallowed_tools.is_empty() {
            command
                .arg("--disallowedTools")
                .args(&options.disallowed_tools);
        }
        if let Some(turns) = options.max_turns {
            command.args(["--max-turns", &turns.to_string()]);
        }
        if let Some(budget) = options.max_budget_usd {
            command.args(["--max-budget-usd", &budget.to_string()]);
        }
        if let Some(prompt) = &options.system_prompt {
            command.args(["--system-prompt", prompt]);
        }
        if let Some(mcp) = &options.mcp_config {
            command.arg("--mcp-config").arg(mcp);
        }
        if let Some(schema) = schema {
            command.args(["--json-schema", schema]);
        }
        command
            .current_dir(&cwd)
            .env("CLAUDE_CONFIG_DIR", &config)
            .env("CLAUDE_CODE_MAX_RETRIES", "0")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .envs(&options.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|error| HarnessError::Failed {
            kind: ErrorKind::InvalidRequest,
            message: format!("cannot start {}: {error}", options.bin.display()),
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(HarnessError::Failed {
                kind: ErrorKind::Transient,
                message: "the CLI's pipes are missing".into(),
            });
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let sink = tail.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut tail = sink.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == 20 {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        Ok(CliProcess {
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
            stderr: tail,
            transcript: TranscriptTail::new(path, text.len() as u64),
            seen: request
                .transcript
                .iter()
                .filter_map(|l| line_uuid(l))
                .collect(),
            harness_session_id,
        })
    }

    async fn turn(
        self,
        mut request: TurnRequest,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Result<TurnOutcome, HarnessError> {
        let schema = request.output_schema.clone();
        let mut process = self.pool.take(
            &request.session_id,
            request.harness_session_id.as_deref(),
            request.transcript.len(),
            schema.as_deref(),
        );
        let mut announced = false;
        loop {
            let warm = process.is_some();
            let mut cli = match process.take() {
                Some(cli) => cli,
                None => self.spawn(&request, schema.as_deref())?,
            };
            if !announced {
                announced = true;
                let started = HarnessEvent::SessionStarted {
                    harness_session_id: cli.harness_session_id.clone(),
                };
                if send(&events, started).await.is_err() {
                    cli.kill();
                    return Err(HarnessError::Cancelled);
                }
            }
            let mut state = TurnState::default();
            let end = drive(&mut cli, &request, &events, &cancel, &mut state).await;
            let end = match end {
                Err(error) => {
                    cli.kill();
                    return Err(error);
                }
                Ok(end) => end,
            };
            match end {
                TurnEnd::Died(_) if warm && !state.received => {
                    // A warm process that died between turns: the turn runs on a cold one,
                    // from the transcript as journaled now.
                    tracing::warn!(session_id = %request.session_id, "warm claude process died; starting a new one");
                    cli.kill();
                    request.transcript.append(&mut state.mirrored);
                    continue;
                }
                TurnEnd::Died(message) => {
                    cli.kill();
                    return Err(HarnessError::Failed {
                        kind: if message.contains("No conversation found") {
                            ErrorKind::SessionNotFound
                        } else {
                            ErrorKind::Transient
                        },
                        message,
                    });
                }
                TurnEnd::Result(result) => {
                    let outcome = outcome(&result, &state, &cli);
                    if outcome.is_ok() {
                        self.pool.put(Warm {
                            session_id: request.session_id.clone(),
                            harness_session_id: cli.harness_session_id.clone(),
                            journaled_lines: request.transcript.len() + state.mirrored.len(),
                            schema,
                            process: cli,
                            last_used: Instant::now(),
                        });
                    } else {
                        cli.kill();
                    }
                    return outcome;
                }
            }
        }
    }

    async fn compact_session(self, request: CompactRequest) -> Result<Compaction, HarnessError> {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        let turn = TurnRequest {
            run_id: turnstile_journal::RunId::new_v7(),
            session_id: request.session_id.clone(),
            attempt: 1,
            message: "/compact".into(),
            harness_session_id: Some(request.harness_session_id.clone()),
            transcript: request.transcript.clone(),
            output_schema: None,
        };
        let collect = tokio::spawn(async move {
            let mut lines = Vec::new();
            let mut compacted = None;
            while let Some(event) = rx.recv().await {
                match event {
                    HarnessEvent::TranscriptLine { line } => lines.push(line),
                    HarnessEvent::Compacted {
                        summary,
                        replaced_messages,
                    } => compacted = Some((summary, replaced_messages)),
                    _ => {}
                }
            }
            (lines, compacted)
        });
        let outcome = self.turn(turn, tx, CancellationToken::new()).await;
        let (lines, compacted) = collect.await.unwrap_or_default();
        let outcome = outcome?;
        Ok(match compacted {
            Some((summary, replaced_messages)) => Compaction::Compacted {
                lines,
                summary,
                replaced_messages,
            },
            None => Compaction::NothingToCompact {
                reason: if outcome.content.is_empty() {
                    "Not enough messages to compact".into()
                } else {
                    outcome.content
                },
            },
        })
    }
}

/// Sets a transcript line's `sessionId` to `id` (a fork keeps another session's lines).
fn rewrite_session_id(line: &str, id: &str) -> String {
    if !line.contains("\"sessionId\"") || line.contains(id) {
        return line.to_owned();
    }
    match serde_json::from_str::<Value>(line) {
        Ok(mut value) if value.get("sessionId").is_some() => {
            value["sessionId"] = Value::String(id.to_owned());
            value.to_string()
        }
        _ => line.to_owned(),
    }
}

async fn send(events: &EventSink, event: HarnessEvent) -> Result<(), HarnessError> {
    events
        .send(event)
        .await
        .map_err(|_| HarnessError::Cancelled)
}

/// Mirrors transcript lines: those already read, then the file's new ones; with
/// `until`, stops after the line with that uuid (waiting for it a little).
async fn mirror(
    cli: &mut CliProcess,
    events: &EventSink,
    state: &mut TurnState,
    until: Option<&str>,
) -> Result<(), HarnessError> {
    let deadline = Instant::now() + TRANSCRIPT_LAG;
    loop {
        cli.transcript.read_more();
        while let Some(line) = cli.transcript.ahead.pop_front() {
            let uuid = line_uuid(&line);
            let reached = until.is_some() && uuid.as_deref() == until;
            if let Some(uuid) = uuid
                && !cli.seen.insert(uuid)
            {
                if reached {
                    return Ok(());
                }
                continue;
            }
            state.mirrored.push(line.clone());
            send(events, HarnessEvent::TranscriptLine { line }).await?;
            if reached {
                return Ok(());
            }
        }
        match until {
            None => return Ok(()),
            Some(uuid) if cli.seen.contains(uuid) => return Ok(()),
            Some(_) if Instant::now() >= deadline => return Ok(()),
            Some(_) => tokio::time::sleep(Duration::from_millis(3)).await,
        }
    }
}

/// The conversation messages (main-chain user and assistant lines) among transcript
/// lines: what a compaction replaces.
fn conversation_messages<'a>(lines: impl Iterator<Item = &'a String>) -> u32 {
    lines
        .filter(|line| {
            line.contains("\"type\":\"user\"") || line.contains("\"type\":\"assistant\"")
        })
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|value| matches!(value["type"].as_str(), Some("user" | "assistant")))
        .filter(|value| value["isSidechain"] != Value::Bool(true))
        .count() as u32
}

async fn drive(
    cli: &mut CliProcess,
    request: &TurnRequest,
    events: &EventSink,
    cancel: &CancellationToken,
    state: &mut TurnState,
) -> Result<TurnEnd, HarnessError> {
    // Lines the process wrote after the last turn's answer.
    mirror(cli, events, state, None).await?;
    let input = json!({"type": "user", "message": {"role": "user", "content": request.message}});
    let written = async {
        cli.stdin.write_all(format!("{input}\n").as_bytes()).await?;
        cli.stdin.flush().await
    }
    .await;
    if let Err(error) = written {
        return Ok(TurnEnd::Died(format!("cannot write to the CLI: {error}")));
    }
    loop {
        let line = tokio::select! {
            line = cli.stdout.next_line() => line,
            _ = cancel.cancelled() => {
                cli.kill();
                return Err(HarnessError::Cancelled);
            }
        };
        let line = match line {
            Ok(Some(line)) => line,
            Ok(None) | Err(_) => {
                // Let the stderr reader catch up with the last words.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = mirror(cli, events, state, None).await;
                let stderr = cli.stderr_tail();
                return Ok(TurnEnd::Died(if stderr.is_empty() {
                    "the claude CLI exited without a result".into()
                } else {
                    format!("the claude CLI exited without a result: {stderr}")
                }));
            }
        };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let top_level = message["parent_tool_use_id"].is_null();
        match message["type"].as_str() {
            Some("stream_event") => {
                let event = &message["event"];
                if top_level
                    && event["type"] == "content_block_delta"
                    && event["delta"]["type"] == "text_delta"
                    && let Some(text) = event["delta"]["text"].as_str()
                {
                    state.received = true;
                    if let Some(id) = message["api_message_id"].as_str() {
                        state.streamed_messages.insert(id.to_owned());
                    }
                    send(
                        events,
                        HarnessEvent::ContentDelta {
                            text: text.to_owned(),
                        },
                    )
                    .await?;
                }
            }
            Some("assistant") => {
                state.received = true;
                if let Some(error) = message["error"].as_str() {
                    state.assistant_error = Some(error.to_owned());
                }
                if let Some(uuid) = message["uuid"].as_str() {
                    mirror(cli, events, state, Some(uuid)).await?;
                }
                let streamed = message["message"]["id"]
                    .as_str()
                    .is_some_and(|id| state.streamed_messages.contains(id));
                for block in message["message"]["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    match block["type"].as_str() {
                        Some("text") if top_level && !streamed => {
                            if let Some(text) = block["text"].as_str()
                                && message["message"]["model"] != "<synthetic>"
                            {
                                send(
                                    events,
                                    HarnessEvent::ContentDelta {
                                        text: text.to_owned(),
                                    },
                                )
                                .await?;
                            }
                        }
                        Some("tool_use") => {
                            let name = block["name"].as_str().unwrap_or_default().to_owned();
                            let id = block["id"].as_str().unwrap_or_default().to_owned();
                            let tool = ToolCall {
                                tool_call_id: id.clone(),
                                tool_name: name.clone(),
                                tool_args: block["input"].to_string(),
                                result: None,
                                tool_call_error: false,
                                parent_tool_call_id: message["parent_tool_use_id"]
                                    .as_str()
                                    .map(str::to_owned),
                            };
                            state.tools.insert(id, tool.clone());
                            if name != STRUCTURED_OUTPUT_TOOL {
                                send(events, HarnessEvent::ToolCallStarted { tool }).await?;
                            }
                        }
                        _ => {}
                    }
                }
            }
            Some("user") => {
                state.received = true;
                if let Some(uuid) = message["uuid"].as_str() {
                    mirror(cli, events, state, Some(uuid)).await?;
                }
                let content = &message["message"]["content"];
                if state.compacting
                    && state.compact_summary.is_none()
                    && let Some(text) = content.as_str()
                {
                    state.compact_summary = Some(text.to_owned());
                }
                for block in content.as_array().into_iter().flatten() {
                    if block["type"] != "tool_result" {
                        continue;
                    }
                    let id = block["tool_use_id"].as_str().unwrap_or_default();
                    let Some(mut tool) = state.tools.remove(id) else {
                        continue;
                    };
                    tool.result = Some(result_text(&block["content"]));
                    tool.tool_call_error = block["is_error"].as_bool().unwrap_or(false);
                    if tool.tool_name != STRUCTURED_OUTPUT_TOOL {
                        send(events, HarnessEvent::ToolCallCompleted { tool }).await?;
                    }
                }
            }
            Some("system") if message["subtype"] == "compact_boundary" && !state.compacting => {
                // Counted once, when it happens: every line so far precedes the boundary.
                state.compacting = true;
                state.pre_compact_messages =
                    conversation_messages(request.transcript.iter().chain(&state.mirrored));
            }
            Some("result") => {
                mirror(cli, events, state, None).await?;
                if state.compacting {
                    let summary = state.compact_summary.clone().unwrap_or_default();
                    send(
                        events,
                        HarnessEvent::Compacted {
                            summary,
                            replaced_messages: state.pre_compact_messages,
                        },
                    )
                    .await?;
                }
                return Ok(TurnEnd::Result(message));
            }
            _ => {}
        }
    }
}

fn result_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The turn's outcome from the `result` line.
fn outcome(
    result: &Value,
    state: &TurnState,
    cli: &CliProcess,
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
        message = format!("claude ended with {subtype}: {}", cli.stderr_tail());
    }
    Err(HarnessError::Failed {
        kind: classify(result, state.assistant_error.as_deref(), &message),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_from_status_type_and_reason() {
        let r = |v: Value| classify(&v, None, "x");
        assert_eq!(
            r(json!({"api_error_status": 401, "subtype": "success"})),
            ErrorKind::Authentication
        );
        assert_eq!(r(json!({"api_error_status": 402})), ErrorKind::Billing);
        assert_eq!(
            r(json!({"api_error_status": 400, "terminal_reason": "prompt_too_long"})),
            ErrorKind::ContextWindow
        );
        assert_eq!(
            r(json!({"api_error_status": 400})),
            ErrorKind::InvalidRequest
        );
        assert_eq!(r(json!({"api_error_status": 429})), ErrorKind::Transient);
        assert_eq!(
            r(json!({"api_error_status": 529, "api_error_type": "overloaded_error"})),
            ErrorKind::Transient
        );
        assert_eq!(r(json!({"api_error_status": 500})), ErrorKind::Transient);
        assert_eq!(
            r(json!({"subtype": "error_max_turns"})),
            ErrorKind::MaxTurns
        );
        assert_eq!(
            r(json!({"subtype": "error_max_budget_usd"})),
            ErrorKind::MaxBudget
        );
        assert_eq!(
            classify(
                &json!({"subtype": "error_during_execution"}),
                None,
                "No conversation found with session ID: x"
            ),
            ErrorKind::SessionNotFound
        );
    }

    #[test]
    fn project_keys_replace_every_non_alphanumeric() {
        assert_eq!(project_key(Path::new("/tmp/a.b/c_d")), "-tmp-a-b-c-d");
    }

    #[test]
    fn forks_rewrite_the_session_id() {
        let line = r#"{"sessionId":"old","uuid":"u1"}"#;
        let rewritten: Value = serde_json::from_str(&rewrite_session_id(line, "new")).unwrap();
        assert_eq!(rewritten["sessionId"], "new");
        assert_eq!(rewritten["uuid"], "u1");
    }
}
