//! The Claude Code dialect: the real `claude` CLI over stream-json, on the CLI core.
//!
//! A turn writes a user message to a `claude -p --input-format stream-json` process and
//! reads its stream-json answer: `stream_event` text deltas, `assistant` tool calls,
//! `user` tool results, then one `result` line with usage, cost and errors
//! ([`stream`], [`outcome`]).
//!
//! Durability: the CLI keeps its conversation in
//! `CONFIG/projects/<cwd key>/<session id>.jsonl`, where `CONFIG` is the per-session
//! directory the core owns (`CLAUDE_CONFIG_DIR`). Lines are identified by their
//! `uuid`; a fork (continuation) is the same file cut at a checkpoint, its `sessionId`
//! fields rewritten to the new id. The CLI's own API retries are off
//! (`CLAUDE_CODE_MAX_RETRIES=0`) so the runtime's retry policy decides. What every
//! CLI shares (pool, mirror, turn loop, cancel) is the core's ([`crate::cli`]).

mod outcome;
mod stream;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use outcome::classify;

use crate::cli::{CliHarness, CliSettings, Dialect, Launch, LineContext, Step, TurnStart};
use crate::{ErrorKind, HarnessError, HarnessInfo, TurnOutcome, TurnRequest};

/// The model when none is configured.
pub const DEFAULT_MODEL: &str = "claude-sonnet-4-6";

/// The typed options of a `claude-code` agent, as the configuration file spells them
/// (`spec/cli.md`; unknown keys are refused by name). `cwd` and `state_dir` come from
/// the agent, not from these keys.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClaudeCodeOptions {
    /// Path of the `claude` CLI (key `claude_bin`, default `claude` on `PATH`).
    #[serde(
        rename = "claude_bin",
        default = "default_bin",
        deserialize_with = "crate::paths::deserialize_bin"
    )]
    pub bin: PathBuf,
    /// Model (`--model`).
    #[serde(default = "default_model")]
    pub model: String,
    /// Working directory of the CLI.
    #[serde(skip)]
    pub cwd: PathBuf,
    /// Where the runtime keeps the CLI's config directories, one per session.
    #[serde(skip)]
    pub state_dir: PathBuf,
    /// `--permission-mode`.
    #[serde(default)]
    pub permission_mode: Option<String>,
    /// `--allowedTools`.
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    /// `--disallowedTools`.
    #[serde(default)]
    pub disallowed_tools: Vec<String>,
    /// `--max-turns`.
    #[serde(default)]
    pub max_turns: Option<u32>,
    /// `--max-budget-usd`.
    #[serde(default)]
    pub max_budget_usd: Option<f64>,
    /// `--system-prompt`.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// `--mcp-config` (a relative path is taken from where turnstile started).
    #[serde(default, deserialize_with = "crate::paths::deserialize_path")]
    pub mcp_config: Option<PathBuf>,
    /// Environment added to the CLI's (API base URL and key, for example).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// **ext**: warm processes kept at most (0: a process per turn).
    #[serde(default = "default_warm_processes")]
    pub warm_processes: usize,
}

fn default_bin() -> PathBuf {
    PathBuf::from("claude")
}

fn default_model() -> String {
    DEFAULT_MODEL.to_owned()
}

fn default_warm_processes() -> usize {
    4
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
            model: default_model(),
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
            warm_processes: default_warm_processes(),
        }
    }
}

/// The Claude Code dialect, configured by its options.
#[derive(Debug, Clone)]
pub struct ClaudeCode {
    options: ClaudeCodeOptions,
}

impl From<ClaudeCodeOptions> for ClaudeCode {
    fn from(options: ClaudeCodeOptions) -> Self {
        ClaudeCode { options }
    }
}

/// The Claude Code harness: the CLI core speaking Claude's dialect.
pub type ClaudeCodeHarness = CliHarness<ClaudeCode>;

/// The CLI's project key for a working directory: every character that is not a
/// letter or digit becomes `-`.
pub fn project_key(cwd: &Path) -> String {
    cwd.to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
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

impl Dialect for ClaudeCode {
    type Turn = stream::ClaudeTurn;

    type Process = stream::Permissions;

    const CLI: &'static str = "claude";

    fn info(&self) -> HarnessInfo {
        HarnessInfo {
            sdk: "claude-agent-sdk".into(),
            model: self.options.model.clone(),
            model_provider: "anthropic".into(),
        }
    }

    fn settings(&self) -> CliSettings<'_> {
        CliSettings {
            bin: &self.options.bin,
            cwd: &self.options.cwd,
            state_dir: &self.options.state_dir,
            env: &self.options.env,
            warm_processes: self.options.warm_processes,
        }
    }

    fn transcript_path(
        &self,
        config_dir: &Path,
        cwd: &Path,
        harness_session_id: &str,
        _transcript: &[String],
    ) -> PathBuf {
        config_dir
            .join("projects")
            .join(project_key(cwd))
            .join(format!("{harness_session_id}.jsonl"))
    }

    fn line_identity(&self, line: &str) -> Option<String> {
        // Cheap check first: most bookkeeping lines have no uuid.
        if !line.contains("\"uuid\"") {
            return None;
        }
        serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v["uuid"].as_str().map(str::to_owned))
    }

    fn restore_line(&self, line: &str, harness_session_id: &str) -> String {
        rewrite_session_id(line, harness_session_id)
    }

    fn command(&self, launch: &Launch<'_>) -> Result<tokio::process::Command, HarnessError> {
        let options = &self.options;
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
        if launch.resume {
            command.args(["--resume", launch.harness_session_id]);
        } else {
            command.args(["--session-id", launch.harness_session_id]);
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
        if let Some(schema) = launch.output_schema {
            command.args(["--json-schema", schema]);
        }
        if launch.approvals {
            // The CLI asks turnstile (`can_use_tool` on its control channel) before a
            // call it would ask a user about: approvals pause the run there.
            command.args(["--permission-prompt-tool", "stdio"]);
        }
        command
            .env("CLAUDE_CONFIG_DIR", launch.config_dir)
            .env("CLAUDE_CODE_MAX_RETRIES", "0")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1");
        Ok(command)
    }

    fn turn_input(
        &self,
        request: &TurnRequest,
        _start: TurnStart<'_>,
        process: &mut stream::Permissions,
        turn: &mut Self::Turn,
    ) -> String {
        if let Some(answers) = stream::decide(process, &request.decisions, turn) {
            // The process waited for these decisions, mid-turn: its answers go on with it.
            return answers;
        }
        let message = if request.paused_before {
            // The paused process is gone (a restart, another replica): the model is told,
            // and a confirmed call it asks for again runs without a second pause.
            stream::remember_confirmed(process, &request.decisions);
            if request.decisions.is_empty() {
                "Continue where you left off.".to_owned()
            } else {
                crate::Decision::message(&request.decisions)
            }
        } else {
            request.message.clone()
        };
        json!({"type": "user", "message": {"role": "user", "content": message}}).to_string()
    }

    fn on_line(
        &self,
        line: &str,
        turn: &mut Self::Turn,
        process: &mut stream::Permissions,
        context: LineContext<'_>,
    ) -> Vec<Step> {
        stream::on_line(line, turn, process, context)
    }

    fn outcome(
        &self,
        end: &Value,
        turn: &Self::Turn,
        stderr: &str,
    ) -> Result<TurnOutcome, HarnessError> {
        outcome::outcome(end, turn, stderr)
    }

    fn classify_exit(&self, message: &str) -> ErrorKind {
        if message.contains("No conversation found") {
            ErrorKind::SessionNotFound
        } else {
            ErrorKind::Transient
        }
    }

    fn compact_message(&self) -> String {
        "/compact".into()
    }
}
