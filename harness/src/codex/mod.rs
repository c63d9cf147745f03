//! The Codex dialect: the real `codex` CLI's app-server (JSON-RPC over stdio), on the
//! CLI core.
//!
//! Each session has a `CODEX_HOME` the runtime owns, with an offline `config.toml`
//! (only the configured endpoint; plugins, analytics and telemetry off; the CLI's own
//! retries off, so the runtime owns them). A thread is started with
//! `historyMode: "legacy"`, so its rollout (`sessions/YYYY/MM/DD/rollout-<ts>-<thread>.jsonl`)
//! is self-contained: every line is journaled as it is written and written back before
//! a cold start, which is how a thread resumes after a restart or on another server.
//! `protocol.rs` speaks the app-server's turn; `outcome.rs` reads its end (errors
//! classified from `codexErrorInfo`, usage as the thread's total after the turn minus
//! before it). What the CLI does is in `shared/reference/codex-cli.md`.

mod approvals;
mod items;
mod outcome;
mod protocol;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cli::{CliHarness, CliSettings, Dialect, Launch, LineContext, Step, TurnStart};
use crate::{ErrorKind, HarnessError, HarnessInfo, TurnOutcome, TurnRequest};

/// The model when none is configured (agno's CodexAgent default).
pub const DEFAULT_MODEL: &str = "gpt-5.6-luna";

/// The typed options of a `codex` agent, as the configuration file spells them
/// (`spec/cli.md`; unknown keys are refused by name). `cwd` and `state_dir` come from
/// the agent, not from these keys.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CodexOptions {
    /// Path of the `codex` CLI (key `codex_bin`, default `codex` on `PATH`).
    #[serde(
        rename = "codex_bin",
        default = "default_bin",
        deserialize_with = "crate::paths::deserialize_bin"
    )]
    pub bin: PathBuf,
    /// Model.
    #[serde(default = "default_model")]
    pub model: String,
    /// Working directory of the CLI.
    #[serde(skip)]
    pub cwd: PathBuf,
    /// Where the runtime keeps a `CODEX_HOME` per session.
    #[serde(skip)]
    pub state_dir: PathBuf,
    /// **ext**: the Responses API endpoint (default: the CLI's own).
    #[serde(default)]
    pub base_url: Option<String>,
    /// `read-only`, `workspace-write` or `danger-full-access`.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
    /// `never`, `on-request`, `on-failure` or `untrusted`.
    #[serde(default = "default_approval_policy")]
    pub approval_policy: String,
    /// **ext**: extra keys for the `config.toml` the runtime writes.
    #[serde(default)]
    pub codex_config: BTreeMap<String, Value>,
    /// Environment added to the CLI's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// **ext**: warm processes kept at most (0: a process per turn).
    #[serde(default = "default_warm_processes")]
    pub warm_processes: usize,
}

fn default_bin() -> PathBuf {
    PathBuf::from("codex")
}

fn default_model() -> String {
    DEFAULT_MODEL.to_owned()
}

fn default_sandbox() -> String {
    "workspace-write".to_owned()
}

fn default_approval_policy() -> String {
    "never".to_owned()
}

fn default_warm_processes() -> usize {
    4
}

impl CodexOptions {
    /// Options with the defaults of `spec/cli.md`.
    pub fn new(
        bin: impl Into<PathBuf>,
        cwd: impl Into<PathBuf>,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        CodexOptions {
            bin: bin.into(),
            model: default_model(),
            cwd: cwd.into(),
            state_dir: state_dir.into(),
            base_url: None,
            sandbox: default_sandbox(),
            approval_policy: default_approval_policy(),
            codex_config: BTreeMap::new(),
            env: BTreeMap::new(),
            warm_processes: default_warm_processes(),
        }
    }
}

/// The Codex dialect, configured by its options.
#[derive(Debug, Clone)]
pub struct Codex {
    options: CodexOptions,
}

impl From<CodexOptions> for Codex {
    fn from(options: CodexOptions) -> Self {
        Codex { options }
    }
}

/// The Codex harness: the CLI core speaking Codex's dialect.
pub type CodexHarness = CliHarness<Codex>;

impl Codex {
    /// The `CODEX_HOME/config.toml` of a hermetic home: the configured endpoint as the
    /// only provider, the CLI's own retries off, and no plugin sync, analytics or
    /// telemetry (each of which reaches beyond the endpoint).
    pub fn config_toml(&self) -> String {
        let options = &self.options;
        let mut config = toml::Table::new();
        let mut set = |path: &str, value: toml::Value| merge(&mut config, path, value);
        set("model", options.model.clone().into());
        set("approval_policy", options.approval_policy.clone().into());
        set("sandbox_mode", options.sandbox.clone().into());
        if let Some(url) = &options.base_url {
            set("model_provider", "turnstile".into());
            set("model_providers.turnstile.name", "turnstile".into());
            set("model_providers.turnstile.base_url", url.clone().into());
            set("model_providers.turnstile.wire_api", "responses".into());
            set("model_providers.turnstile.env_key", "OPENAI_API_KEY".into());
            set("model_providers.turnstile.request_max_retries", 0.into());
            set("model_providers.turnstile.stream_max_retries", 0.into());
        }
        set("features.plugins", false.into());
        set("features.unbounded_connection_retries", false.into());
        set("analytics.enabled", false.into());
        for key in ["exporter", "metrics_exporter", "trace_exporter"] {
            set(&format!("otel.{key}"), "none".into());
        }
        // The user's keys last: a dotted key names a nested one, a table merges.
        for (key, value) in &options.codex_config {
            if let Some(value) = toml_value(value) {
                set(key, value);
            }
        }
        toml::to_string(&config).unwrap_or_default()
    }
}

/// `value` at the dotted `path` of `table`, tables merged key by key.
fn merge(table: &mut toml::Table, path: &str, value: toml::Value) {
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    match rest {
        Some(rest) => {
            let entry = table
                .entry(head.to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(inner) = entry {
                merge(inner, rest, value);
            }
        }
        None => match (table.get_mut(head), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(added)) => {
                for (key, value) in added {
                    merge(existing, &key, value);
                }
            }
            (_, value) => {
                table.insert(head.to_owned(), value);
            }
        },
    }
}

/// A JSON value as TOML (`null` has no TOML form and is left out).
fn toml_value(value: &Value) -> Option<toml::Value> {
    Some(match value {
        Value::Null => return None,
        Value::Bool(flag) => toml::Value::Boolean(*flag),
        Value::Number(number) => match number.as_i64() {
            Some(integer) => toml::Value::Integer(integer),
            None => toml::Value::Float(number.as_f64()?),
        },
        Value::String(text) => toml::Value::String(text.clone()),
        Value::Array(items) => toml::Value::Array(items.iter().filter_map(toml_value).collect()),
        Value::Object(entries) => toml::Value::Table(
            entries
                .iter()
                .filter_map(|(key, value)| Some((key.clone(), toml_value(value)?)))
                .collect(),
        ),
    })
}

/// The rollout of `thread` under `sessions` (`**/rollout-*-<thread>.jsonl`), if any.
fn rollout_of(sessions: &Path, thread: &str) -> Option<PathBuf> {
    let suffix = format!("-{thread}.jsonl");
    let mut pending = vec![sessions.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                pending.push(path);
            } else if name.starts_with("rollout-") && name.ends_with(&suffix) {
                return Some(path);
            }
        }
    }
    None
}

/// The rollout less its failed turns (`task_started` to a `task_complete` that
/// carries an error): a legacy thread's equivalent of `thread/revert`, so a retried
/// prompt reaches the model once. Interrupted and unfinished turns stay.
fn rollout_without_failed_turns(lines: &[String]) -> impl Iterator<Item = &String> {
    let mut keep = vec![true; lines.len()];
    let mut turn_start = None;
    for (at, line) in lines.iter().enumerate() {
        if !line.contains("\"event_msg\"") {
            continue;
        }
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        match value["payload"]["type"].as_str() {
            Some("task_started") => turn_start = Some(at),
            Some("task_complete") => {
                if let Some(start) = turn_start.take()
                    && value["payload"]["error"].is_object()
                {
                    keep[start..=at].iter_mut().for_each(|kept| *kept = false);
                }
            }
            Some("turn_aborted") => turn_start = None,
            _ => {}
        }
    }
    lines
        .iter()
        .zip(keep)
        .filter_map(|(line, kept)| kept.then_some(line))
}

impl Dialect for Codex {
    type Turn = protocol::CodexTurn;

    type Process = protocol::CodexProcess;

    const ASSIGNS_SESSION_IDS: bool = true;

    const CLI: &'static str = "codex";

    fn info(&self) -> HarnessInfo {
        HarnessInfo {
            sdk: "codex".into(),
            model: self.options.model.clone(),
            model_provider: "openai".into(),
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
        _cwd: &Path,
        harness_session_id: &str,
        transcript: &[String],
    ) -> PathBuf {
        // The CLI's own file, when this home has one: the CLI names it when the first
        // turn starts, which may be a second after the first line's time, and a file
        // restored under another name would stand beside it unseen.
        let sessions = config_dir.join("sessions");
        if let Some(existing) = rollout_of(&sessions, harness_session_id) {
            return existing;
        }
        // `2026-12-01T09:49:20.123Z` in the first line names the directory and file.
        let stamp = transcript
            .first()
            .and_then(|line| serde_json::from_str::<Value>(line).ok())
            .and_then(|line| line["timestamp"].as_str().map(str::to_owned))
            .filter(|stamp| stamp.len() >= 19 && stamp.is_char_boundary(19));
        match stamp {
            Some(stamp) => sessions
                .join(&stamp[0..4])
                .join(&stamp[5..7])
                .join(&stamp[8..10])
                .join(format!(
                    "rollout-{}-{harness_session_id}.jsonl",
                    stamp[..19].replace(':', "-")
                )),
            None => sessions.join(format!("rollout-{harness_session_id}.jsonl")),
        }
    }

    fn restore(&self, transcript: &[String], harness_session_id: &str) -> String {
        rollout_without_failed_turns(transcript)
            .map(|line| self.restore_line(line, harness_session_id) + "\n")
            .collect()
    }

    fn line_identity(&self, line: &str) -> Option<String> {
        // Rollout lines are only ever appended, so a line is known by its position;
        // a tool's output is named by its call and a turn's end by the turn, for the
        // core to wait for them: a checkpoint is cut after the output, and a turn's
        // end (a failed turn's, left out before its retry) is journaled before the
        // turn is over.
        if !line.contains("_call_output\"")
            && !line.contains("\"task_complete\"")
            && !line.contains("\"turn_aborted\"")
        {
            return None;
        }
        let value: Value = serde_json::from_str(line).ok()?;
        let payload = &value["payload"];
        match payload["type"].as_str() {
            Some("function_call_output" | "custom_tool_call_output") => {
                payload["call_id"].as_str().map(|id| format!("output:{id}"))
            }
            Some("task_complete" | "turn_aborted") if value["type"] == "event_msg" => {
                payload["turn_id"].as_str().map(|id| format!("end:{id}"))
            }
            _ => None,
        }
    }

    fn restore_line(&self, line: &str, harness_session_id: &str) -> String {
        if !line.contains("\"session_meta\"") || line.contains(harness_session_id) {
            return line.to_owned();
        }
        match serde_json::from_str::<Value>(line) {
            Ok(mut value) if value["type"] == "session_meta" => {
                for key in ["id", "session_id"] {
                    if value["payload"].get(key).is_some() {
                        value["payload"][key] = Value::String(harness_session_id.to_owned());
                    }
                }
                value.to_string()
            }
            _ => line.to_owned(),
        }
    }

    fn command(&self, launch: &Launch<'_>) -> Result<tokio::process::Command, HarnessError> {
        std::fs::create_dir_all(launch.config_dir).map_err(|error| HarnessError::Failed {
            kind: ErrorKind::Transient,
            message: format!("creating CODEX_HOME: {error}"),
        })?;
        std::fs::write(launch.config_dir.join("config.toml"), self.config_toml()).map_err(
            |error| HarnessError::Failed {
                kind: ErrorKind::Transient,
                message: format!("writing CODEX_HOME/config.toml: {error}"),
            },
        )?;
        // A home whose rollout was replaced by a shorter or different one (a failed
        // turn left out for its retry) must not keep the CLI's sqlite projections of
        // the old file: they hold byte offsets into it. (Rebuilding them costs a cold
        // start ~55 ms, so only then.)
        if launch.transcript_replaced
            && let Ok(entries) = std::fs::read_dir(launch.config_dir)
        {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if name.to_string_lossy().contains(".sqlite") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let mut command = tokio::process::Command::new(&self.options.bin);
        command
            .arg("app-server")
            .env("CODEX_HOME", launch.config_dir)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG");
        Ok(command)
    }

    fn turn_input(
        &self,
        request: &TurnRequest,
        start: TurnStart<'_>,
        process: &mut protocol::CodexProcess,
        turn: &mut protocol::CodexTurn,
    ) -> String {
        protocol::turn_input(self, request, start, process, turn)
    }

    fn on_line(
        &self,
        line: &str,
        turn: &mut protocol::CodexTurn,
        process: &mut protocol::CodexProcess,
        context: LineContext<'_>,
    ) -> Vec<Step> {
        protocol::on_line(self, line, turn, process, context)
    }

    fn interrupt(&self, turn: &protocol::CodexTurn) -> Option<String> {
        protocol::interrupt(turn)
    }

    fn outcome(
        &self,
        end: &Value,
        turn: &protocol::CodexTurn,
        _stderr: &str,
    ) -> Result<TurnOutcome, HarnessError> {
        outcome::outcome(self, end, turn)
    }

    fn classify_exit(&self, message: &str) -> ErrorKind {
        if message.contains("no rollout found") || message.contains("invalid session id") {
            ErrorKind::SessionNotFound
        } else {
            ErrorKind::Transient
        }
    }

    fn compact_message(&self) -> String {
        protocol::COMPACT_MESSAGE.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn codex() -> Codex {
        codex_in(Path::new("/w"), Path::new("/s"))
    }

    fn codex_in(cwd: &Path, state_dir: &Path) -> Codex {
        let mut options = CodexOptions::new("codex", cwd, state_dir);
        options.base_url = Some("http://127.0.0.1:8112/v1".into());
        options
            .codex_config
            .insert("model_reasoning_effort".into(), json!("low"));
        options
            .codex_config
            .insert("features".into(), json!({"web_search_request": true}));
        options.codex_config.insert(
            "model_providers.turnstile.stream_idle_timeout_ms".into(),
            json!(20000),
        );
        Codex::from(options)
    }

    #[test]
    fn the_home_config_names_only_the_configured_endpoint() {
        let text = codex().config_toml();
        assert!(
            text.contains("base_url = \"http://127.0.0.1:8112/v1\""),
            "{text}"
        );
        assert!(text.contains("model_reasoning_effort = \"low\""), "{text}");
        for off in [
            "plugins = false",
            "enabled = false",
            "metrics_exporter = \"none\"",
        ] {
            assert!(text.contains(off), "{off} missing from {text}");
        }
        assert!(text.contains("model = \"gpt-5.6-luna\""), "{text}");
        // The user's tables merge into the runtime's, and the file is TOML.
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(parsed["features"]["plugins"].as_bool(), Some(false));
        assert_eq!(
            parsed["features"]["web_search_request"].as_bool(),
            Some(true)
        );
        let provider = &parsed["model_providers"]["turnstile"];
        assert_eq!(provider["stream_idle_timeout_ms"].as_integer(), Some(20000));
        assert_eq!(provider["request_max_retries"].as_integer(), Some(0));
    }

    #[test]
    fn a_rollout_is_named_after_its_first_line() {
        let first = r#"{"timestamp":"2026-12-01T09:49:20.123Z","type":"session_meta","payload":{"id":"old","session_id":"old"}}"#;
        let path =
            codex().transcript_path(Path::new("/h"), Path::new("/w"), "new", &[first.into()]);
        assert_eq!(
            path,
            Path::new("/h/sessions/2026/12/01/rollout-2026-12-01T09-49-20-new.jsonl")
        );
        let restored: Value = serde_json::from_str(&codex().restore_line(first, "new")).unwrap();
        assert_eq!(restored["payload"]["id"], "new");
        assert_eq!(restored["payload"]["session_id"], "new");
    }
}

/// `localImage` inputs for the images the runtime staged for the turn: the note it
/// adds to the message names them (`- NAME (image/…, N bytes)` under `(in DIR):`).
pub(super) fn images(message: &str) -> Vec<Value> {
    let Some((_, after)) = message.split_once("(in ") else {
        return Vec::new();
    };
    let Some((dir, list)) = after.split_once("):") else {
        return Vec::new();
    };
    list.lines()
        .filter_map(|line| line.trim().strip_prefix("- "))
        .filter_map(|entry| {
            let (name, kind) = entry.split_once(" (")?;
            kind.starts_with("image/")
                .then(|| serde_json::json!({"type": "localImage", "path": format!("{dir}/{name}")}))
        })
        .collect()
}
