//! The configuration file (TOML) and its defaults, as `spec/cli.md` defines them.
//!
//! Everything has a default, so no file at all serves one scripted agent from
//! `./turnstile-data` on `127.0.0.1:7777`. Unknown keys are an error that names the
//! key. This module only parses and checks; it starts nothing.

use std::path::{Path, PathBuf};

mod agents;
mod auth;
mod located;
use agents::default_agents;
pub use agents::{AgentConfig, WorkspaceMode};
pub use auth::{ALGORITHMS, AuthMode, AuthSection};
use located::located;

use serde::{Deserialize, Serialize};

/// The whole file.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[server]`.
    #[serde(default)]
    pub server: ServerConfig,
    /// `[journal]`: where the journal is (sled in the data directory by default).
    #[serde(default)]
    pub journal: JournalSection,
    /// `[telemetry]`: OpenTelemetry traces, off unless an endpoint is given.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// `[auth]`: the API key (default) or signed tokens with scopes.
    #[serde(default)]
    pub auth: AuthSection,
    /// `[[agents]]`; one scripted agent when absent.
    #[serde(default = "default_agents")]
    pub agents: Vec<AgentConfig>,
}

/// Which journal backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// sled, embedded, in the data directory: one process.
    #[default]
    Sled,
    /// PostgreSQL: one journal that several `turnstile serve` processes share.
    Postgres,
}

/// `[journal]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct JournalSection {
    /// `sled` (default) or `postgres`.
    pub backend: Backend,
    /// The PostgreSQL URL (`postgres://user@host:port/database`); when absent, the
    /// environment variable `url_env` names holds it (a password stays out of the file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The environment variable holding the URL when `url` is absent.
    pub url_env: String,
    /// PostgreSQL connections in the pool.
    pub pool_size: usize,
    /// This server's name among the replicas (default: host name and port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_id: Option<String>,
    /// Seconds after which a replica that has not renewed its heartbeat loses its
    /// sessions to the others.
    pub lease_s: f64,
}

impl Default for JournalSection {
    fn default() -> Self {
        JournalSection {
            backend: Backend::Sled,
            url: None,
            url_env: "TURNSTILE_DATABASE_URL".into(),
            pool_size: 8,
            replica_id: None,
            lease_s: 10.0,
        }
    }
}

/// `[telemetry]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The OTLP HTTP endpoint traces go to (`http://127.0.0.1:4318`, or a URL ending in
    /// the traces path); none: no traces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
}

/// `[server]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Listen address.
    pub addr: String,
    /// Data directory (the journal).
    pub data_dir: PathBuf,
    /// Environment variable holding the API key; auth is on when it is set.
    pub api_key_env: String,
    /// Worker slots for runs.
    pub max_concurrent_runs: usize,
    /// Queued runs at most; beyond it 429.
    pub max_queued_runs: usize,
    /// **ext**: seconds an idle session actor stays in memory before it passivates.
    pub session_idle_s: f64,
    /// **ext**: seconds between keepalive comments on an idle stream (at most 15).
    pub sse_keepalive_s: f64,
    /// **ext**: encoded bytes of one run event at most (a transcript line, a tool
    /// result, the answer); a run that produces a larger one ends `ERROR`.
    pub max_event_bytes: usize,
    /// **ext**: request bodies larger than this get 413, decided from `Content-Length`
    /// when present.
    pub max_request_bytes: usize,
    /// **ext**: the longest message (and continuation input) a run takes, in bytes;
    /// a longer one gets 422 (one within it but over `max_event_bytes` gets 413).
    pub max_message_bytes: usize,
    /// **ext**: seconds within which a request's headers must arrive.
    pub header_timeout_s: f64,
    /// **ext**: seconds within which a request's body must arrive (else 408).
    pub body_timeout_s: f64,
    /// **ext**: seconds after which an idle keep-alive connection is closed.
    pub idle_timeout_s: f64,
    /// **ext**: connections served at once; beyond it new ones wait (capped by the
    /// process's descriptor limit).
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: "127.0.0.1:7777".into(),
            data_dir: PathBuf::from("./turnstile-data"),
            api_key_env: "TURNSTILE_API_KEY".into(),
            max_concurrent_runs: 8,
            max_queued_runs: 10_000,
            session_idle_s: 60.0,
            sse_keepalive_s: 15.0,
            max_event_bytes: turnstile_journal::limits::EVENT_BYTES_MAX_DEFAULT,
            max_request_bytes: turnstile_journal::limits::REQUEST_BODY_BYTES_MAX,
            max_message_bytes: turnstile_journal::limits::MESSAGE_BYTES_MAX,
            header_timeout_s: 10.0,
            body_timeout_s: 60.0,
            idle_timeout_s: 120.0,
            max_connections: 4096,
        }
    }
}

/// `path` against the current directory (where turnstile started), without touching
/// the disk; an absolute path is returned as it is.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    // `reason`, not `source`: the error chain would print the OS error twice.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: std::io::Error,
    },
    /// The file is not valid TOML for this schema (names the key).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// toml's message, which names the key and line.
        message: String,
    },
    /// A value is not acceptable.
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Reads a file, or the defaults when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let Some(path) = path else {
            return Ok(Config::default_config());
        };
        let text = std::fs::read_to_string(path).map_err(|reason| ConfigError::Read {
            path: path.display().to_string(),
            reason,
        })?;
        let mut config: Config = toml::from_str(&text).map_err(|error| ConfigError::Parse {
            path: path.display().to_string(),
            message: located(&text, &error),
        })?;
        config.check()?;
        config.resolve_paths();
        Ok(config)
    }

    /// The configuration with no file.
    pub fn default_config() -> Config {
        let mut config = Config {
            server: ServerConfig::default(),
            journal: JournalSection::default(),
            telemetry: TelemetryConfig::default(),
            auth: AuthSection::default(),
            agents: default_agents(),
        };
        config.resolve_paths();
        config
    }

    /// The journal to open: the sled one in the data directory, or the PostgreSQL one
    /// of `[journal] backend = "postgres"`; `port` is the server's (for the default
    /// replica name: host name and port).
    pub fn journal_config(
        &self,
        port: Option<u16>,
    ) -> Result<turnstile_journal::JournalConfig, ConfigError> {
        if self.journal.backend != Backend::Postgres {
            return Ok(turnstile_journal::JournalConfig::Sled(
                self.server.data_dir.clone(),
            ));
        }
        let url = match &self.journal.url {
            Some(url) => url.clone(),
            None => std::env::var(&self.journal.url_env).map_err(|_| {
                ConfigError::Invalid(format!(
                    "journal.backend = \"postgres\" needs journal.url or the environment variable {} (journal.url_env)",
                    self.journal.url_env
                ))
            })?,
        };
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_owned())
            .unwrap_or_else(|_| "localhost".into());
        let replica_name = self
            .journal
            .replica_id
            .clone()
            .unwrap_or_else(|| match port {
                Some(port) => format!("{host}:{port}"),
                // A command, not a server: a name of its own, which no server retires.
                None => format!("{host}:cli-{}", std::process::id()),
            });
        Ok(turnstile_journal::JournalConfig::Postgres(
            turnstile_journal::PostgresOptions {
                url,
                pool_size: self.journal.pool_size,
                replica_name,
                lease: std::time::Duration::from_secs_f64(self.journal.lease_s),
            },
        ))
    }

    /// Sets the data directory (`--data-dir`), resolved as the file's paths are.
    pub fn set_data_dir(&mut self, data_dir: &Path) {
        self.server.data_dir = absolute(data_dir);
    }

    /// Resolves every relative path once, against where turnstile started: a CLI runs
    /// in its agent's `cwd`, so a relative path handed to it would name another place
    /// (issue 13: the CLI's config directory ended up inside the workspace). The
    /// harnesses resolve their own paths (CLI binaries, MCP configurations) as they read them.
    fn resolve_paths(&mut self) {
        self.server.data_dir = absolute(&self.server.data_dir);
        for agent in &mut self.agents {
            if let Some(cwd) = &agent.cwd {
                agent.cwd = Some(absolute(cwd));
            }
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.auth.check().map_err(ConfigError::Invalid)?;
        if !(self.journal.lease_s.is_finite() && self.journal.lease_s >= 0.5) {
            return Err(ConfigError::Invalid(
                "journal.lease_s must be at least 0.5 seconds".into(),
            ));
        }
        if self.journal.pool_size == 0 {
            return Err(ConfigError::Invalid(
                "journal.pool_size must be at least 1".into(),
            ));
        }
        if self.agents.is_empty() {
            return Err(ConfigError::Invalid(
                "at least one [[agents]] entry is needed".into(),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for agent in &self.agents {
            if turnstile_journal::SessionId::parse(&agent.id).is_err() {
                return Err(ConfigError::Invalid(format!(
                    "agent id {:?} may only hold letters, digits and . _ : -",
                    agent.id
                )));
            }
            if !seen.insert(agent.id.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "agent id {:?} appears twice",
                    agent.id
                )));
            }
        }
        if !(self.server.session_idle_s.is_finite() && self.server.session_idle_s > 0.0) {
            return Err(ConfigError::Invalid(
                "server.session_idle_s must be a positive number of seconds".into(),
            ));
        }
        if !(self.server.sse_keepalive_s > 0.0 && self.server.sse_keepalive_s <= 15.0) {
            return Err(ConfigError::Invalid(
                "server.sse_keepalive_s must be more than 0 and at most 15 seconds".into(),
            ));
        }
        for agent in &self.agents {
            if !(agent.delay_between_retries_s.is_finite() && agent.delay_between_retries_s >= 0.0)
            {
                return Err(ConfigError::Invalid(format!(
                    "agent {:?}: delay_between_retries_s must be zero or more seconds",
                    agent.id
                )));
            }
        }
        self.check_server_limits()
    }

    /// The server's bounds and deadlines: each within its range.
    fn check_server_limits(&self) -> Result<(), ConfigError> {
        let ceiling = turnstile_journal::limits::EVENT_BYTES_CEILING;
        if !(65_536..=ceiling).contains(&self.server.max_event_bytes) {
            return Err(ConfigError::Invalid(format!(
                "server.max_event_bytes must be from 65536 to {ceiling} bytes"
            )));
        }
        for (key, value) in [
            ("header_timeout_s", self.server.header_timeout_s),
            ("body_timeout_s", self.server.body_timeout_s),
            ("idle_timeout_s", self.server.idle_timeout_s),
        ] {
            if !(value.is_finite() && value > 0.0 && value <= 86_400.0) {
                return Err(ConfigError::Invalid(format!(
                    "server.{key} must be a positive number of seconds (at most 86400)"
                )));
            }
        }
        if self.server.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "server.max_connections must be at least 1".into(),
            ));
        }
        if self.server.max_message_bytes == 0 {
            return Err(ConfigError::Invalid(
                "server.max_message_bytes must be at least 1 byte".into(),
            ));
        }
        if self.server.max_request_bytes < 1024 {
            return Err(ConfigError::Invalid(
                "server.max_request_bytes must be at least 1024 bytes".into(),
            ));
        }
        if self.server.max_concurrent_runs == 0 {
            return Err(ConfigError::Invalid(
                "server.max_concurrent_runs must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Whether an environment variable's name says its value is a secret.
fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "AUTH",
        "CREDENTIAL",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// What a masked secret prints as.
pub const MASKED: &str = "<masked>";

impl Config {
    /// The effective configuration as TOML, defaults filled in and secrets (values of
    /// an agent's `env` whose names say they are keys, tokens, passwords...) masked:
    /// `--config` accepts it back.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        let mut effective = self.clone();
        effective.auth = self.auth.masked();
        for agent in &mut effective.agents {
            agent.name.get_or_insert_with(|| agent.id.clone());
            agent
                .events_to_skip
                .get_or_insert_with(|| vec!["RunContent".to_owned()]);
            agent
                .cwd
                .get_or_insert_with(|| self.server.data_dir.join("workspace"));
        }
        let mut value = toml::Value::try_from(&effective).map_err(|error| {
            ConfigError::Invalid(format!("cannot print the configuration: {error}"))
        })?;
        if let Some(agents) = value.get_mut("agents").and_then(|a| a.as_array_mut()) {
            for agent in agents {
                if let Some(env) = agent.get_mut("env").and_then(|e| e.as_table_mut()) {
                    for (name, value) in env.iter_mut() {
                        if is_secret(name) {
                            *value = toml::Value::String(MASKED.into());
                        }
                    }
                }
            }
        }
        if let Some(url) = value
            .get_mut("journal")
            .and_then(|journal| journal.get_mut("url"))
            && let Some(text) = url.as_str()
        {
            *url = toml::Value::String(masked_password(text));
        }
        // `[server]` first, then the agents, as a person writes the file.
        let mut text = String::new();
        for key in ["server", "auth", "journal", "telemetry", "agents"] {
            let mut part = toml::Table::new();
            if let Some(section) = value.as_table_mut().and_then(|table| table.remove(key)) {
                part.insert(key.to_owned(), section);
            }
            let part = toml::to_string(&part).map_err(|error| {
                ConfigError::Invalid(format!("cannot print the configuration: {error}"))
            })?;
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&part);
        }
        Ok(text)
    }
}

/// A connection URL with its password (if any) masked: `postgres://user:***@host/db`.
fn masked_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((credentials, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match credentials.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:{MASKED}@{host}"),
        None => url.to_owned(),
    }
}
