//! `[[agents]]`: the keys every agent has (its harness's own keys are the harness
//! crate's table), their defaults, and the runtime's agents built from them.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use turnstile_actors::workspace::{Bounds, DEFAULT_IGNORE, Ignore};
use turnstile_actors::{AgentSpec, RetryPolicy};
use turnstile_harness::{HarnessConfig, HarnessContext};

use super::{Config, ConfigError};

/// Where an agent's sessions work (`spec/workspaces.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceMode {
    /// Every session in the agent's `cwd`.
    #[default]
    Shared,
    /// Each session in its own directory, `<cwd>/<session_id>/`.
    Session,
}

/// One `[[agents]]` entry: the keys every agent has; the `harness` key and the
/// harness's own keys are read by the harness crate's table.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct AgentConfig {
    /// Agent id, used in routes.
    pub id: String,
    /// Display name (defaults to the id).
    pub name: Option<String>,
    /// Description.
    #[serde(default)]
    pub description: String,
    /// Working directory of the harness.
    pub cwd: Option<PathBuf>,
    /// Retries after a failed attempt (agno default 0).
    #[serde(default)]
    pub retries: u32,
    /// Delay between retries in seconds (agno default 1).
    #[serde(default = "one")]
    pub delay_between_retries_s: f64,
    /// Double the delay after each attempt.
    #[serde(default)]
    pub exponential_backoff: bool,
    /// Keep staged uploads after the run.
    #[serde(default)]
    pub keep_uploads: bool,
    /// **ext**: `shared` (every session in `cwd`) or `session` (each in `<cwd>/<id>/`).
    #[serde(default)]
    pub workspace: WorkspaceMode,
    /// **ext**: with `workspace = "session"`, snapshot each session's workspace into the
    /// journal and restore it from there (default on; off leaves only the isolation).
    pub snapshot_workspace: Option<bool>,
    /// **ext**: bytes of all files of one snapshot at most.
    #[serde(default = "max_bytes")]
    pub workspace_max_bytes: u64,
    /// **ext**: bytes of one file at most.
    #[serde(default = "max_file_bytes")]
    pub workspace_max_file_bytes: u64,
    /// **ext**: paths of one snapshot at most.
    #[serde(default = "max_files")]
    pub workspace_max_files: usize,
    /// **ext**: paths neither captured nor removed (gitignore-like patterns).
    pub workspace_ignore: Option<Vec<String>>,
    /// **ext**: tool-name patterns (`*` any run of characters) whose calls wait for a
    /// person's decision (`spec/approvals.md`).
    #[serde(default)]
    pub approvals: Vec<String>,
    /// **ext**: seconds an undecided call waits before it is denied (`timed out`); 0
    /// waits for ever.
    #[serde(default = "approval_timeout_s")]
    pub approval_timeout_s: u64,
    /// **ext**: wait out a usage limit until it resets instead of failing the run.
    #[serde(default)]
    pub wait_on_usage_limit: bool,
    /// **ext**: the longest such wait, in seconds.
    #[serde(default = "max_usage_wait_s")]
    pub max_usage_wait_s: u64,
    /// List a streamed run's events on the run (agno's `store_events`, which AgentOS
    /// turns on for external agents: default on; the journal keeps every event
    /// regardless).
    #[serde(default = "yes")]
    pub store_events: bool,
    /// Event types such a list leaves out (agno's `events_to_skip`; default `RunContent`).
    pub events_to_skip: Option<Vec<String>>,
    /// The harness (`harness = "…"`) with its own options; unknown keys are refused
    /// there, by name.
    #[serde(flatten)]
    pub harness: HarnessConfig,
}

fn yes() -> bool {
    true
}

fn one() -> f64 {
    1.0
}

/// Where attachments are staged in a workspace (`uploads.rs`): never captured or removed.
const UPLOADS: &str = ".turnstile/uploads/";

fn max_bytes() -> u64 {
    1 << 30
}

fn max_file_bytes() -> u64 {
    64 << 20
}

fn max_files() -> usize {
    100_000
}

fn approval_timeout_s() -> u64 {
    86_400
}

fn max_usage_wait_s() -> u64 {
    21_600
}

pub(super) fn default_agents() -> Vec<AgentConfig> {
    vec![AgentConfig {
        id: "scripted".into(),
        name: Some("Scripted".into()),
        description: "turnstile's built-in scripted harness".into(),
        cwd: None,
        retries: 0,
        delay_between_retries_s: 1.0,
        exponential_backoff: false,
        keep_uploads: false,
        workspace: WorkspaceMode::Shared,
        snapshot_workspace: None,
        workspace_max_bytes: max_bytes(),
        workspace_max_file_bytes: max_file_bytes(),
        workspace_max_files: max_files(),
        workspace_ignore: None,
        approvals: Vec::new(),
        approval_timeout_s: approval_timeout_s(),
        wait_on_usage_limit: false,
        max_usage_wait_s: max_usage_wait_s(),
        store_events: true,
        events_to_skip: None,
        harness: HarnessConfig::default(),
    }]
}

impl AgentConfig {
    /// The bounds of its workspace's snapshots, when they are on.
    fn snapshots(&self) -> Result<Option<Bounds>, ConfigError> {
        let invalid = |why: String| ConfigError::Invalid(format!("agent {:?}: {why}", self.id));
        let on = match (self.workspace, self.snapshot_workspace) {
            (WorkspaceMode::Session, on) => on.unwrap_or(true),
            (WorkspaceMode::Shared, Some(true)) => {
                return Err(invalid(
                    "snapshot_workspace = true needs workspace = \"session\" (a shared cwd is no session's own)".into(),
                ));
            }
            (WorkspaceMode::Shared, _) => false,
        };
        if !on {
            return Ok(None);
        }
        // Where attachments are staged is the runtime's own, whatever the list says.
        let ignore = match &self.workspace_ignore {
            Some(patterns) => {
                let mut patterns = patterns.clone();
                patterns.push(UPLOADS.to_owned());
                Ignore::new(&patterns)
            }
            None => Ignore::new(&DEFAULT_IGNORE),
        }
        .map_err(invalid)?;
        Ok(Some(Bounds {
            max_bytes: self.workspace_max_bytes,
            max_file_bytes: self.workspace_max_file_bytes,
            max_files: self.workspace_max_files,
            ignore,
        }))
    }
}

impl Config {
    /// Builds the runtime's agents from the configuration.
    pub fn agent_specs(&self) -> Result<Vec<AgentSpec>, ConfigError> {
        self.agents
            .iter()
            .map(|agent| {
                // Without a configured cwd an agent works inside the data directory.
                let cwd = agent
                    .cwd
                    .clone()
                    .unwrap_or_else(|| self.server.data_dir.join("workspace"));
                let state_dir = self.server.data_dir.join("harness").join(&agent.id);
                let harness = agent
                    .harness
                    .build(HarnessContext {
                        cwd: &cwd,
                        state_dir: &state_dir,
                    })
                    .map_err(|error| {
                        ConfigError::Invalid(format!("agent {:?}: {error}", agent.id))
                    })?;
                Ok(AgentSpec {
                    id: agent.id.clone(),
                    name: agent.name.clone().unwrap_or_else(|| agent.id.clone()),
                    description: agent.description.clone(),
                    harness,
                    retry: RetryPolicy {
                        retries: agent.retries,
                        delay_between_retries_s: agent.delay_between_retries_s,
                        exponential_backoff: agent.exponential_backoff,
                    },
                    cwd,
                    keep_uploads: agent.keep_uploads,
                    workspace: match agent.workspace {
                        WorkspaceMode::Shared => turnstile_actors::Workspace::Shared,
                        WorkspaceMode::Session => turnstile_actors::Workspace::Session,
                    },
                    snapshots: agent.snapshots()?,
                    approval: turnstile_actors::ApprovalPolicy {
                        tools: turnstile_harness::Approvals::new(agent.approvals.clone()),
                        timeout: (agent.approval_timeout_s > 0)
                            .then(|| std::time::Duration::from_secs(agent.approval_timeout_s)),
                        wait_on_usage_limit: agent.wait_on_usage_limit,
                        max_usage_wait: std::time::Duration::from_secs(agent.max_usage_wait_s),
                    },
                })
            })
            .collect()
    }

    /// The agents that store events, with the event types they skip.
    pub fn stored_events(&self) -> std::collections::HashMap<String, Vec<String>> {
        self.agents
            .iter()
            .filter(|agent| agent.store_events)
            .map(|agent| {
                (
                    agent.id.clone(),
                    agent
                        .events_to_skip
                        .clone()
                        .unwrap_or_else(|| vec!["RunContent".to_owned()]),
                )
            })
            .collect()
    }
}
