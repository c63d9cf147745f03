//! The harness table: every harness's name, its typed options as the configuration
//! file spells them, and how it is built.
//!
//! Each harness deserializes its own keys (unknown ones are refused by name), so the
//! gateway only reads the keys every agent has and hands the rest here. Adding a
//! harness adds a variant to [`HarnessConfig`] and touches no gateway code.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::claude::{ClaudeCodeHarness, ClaudeCodeOptions};
use crate::codex::CodexOptions;
use crate::{Harness, ScriptedHarness};

/// An agent's harness and its options, selected by the `harness` key.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "harness")]
pub enum HarnessConfig {
    /// The built-in scripted harness (no options).
    #[serde(rename = "scripted")]
    Scripted(ScriptedConfig),
    /// The real Claude Code CLI.
    #[serde(rename = "claude-code")]
    ClaudeCode(ClaudeCodeOptions),
    /// The real Codex CLI.
    #[serde(rename = "codex")]
    Codex(CodexOptions),
}

/// The scripted harness takes no options of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScriptedConfig {}

impl<'de> Deserialize<'de> for ScriptedConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NoKeys;
        impl<'de> serde::de::Visitor<'de> for NoKeys {
            type Value = ScriptedConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("no keys")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                match map.next_key::<String>()? {
                    None => Ok(ScriptedConfig {}),
                    Some(key) => Err(serde::de::Error::custom(format!(
                        "unknown field `{key}`: the scripted harness takes no keys of its own"
                    ))),
                }
            }
        }
        deserializer.deserialize_map(NoKeys)
    }
}

/// Where a harness of one agent works and keeps its state.
#[derive(Debug, Clone, Copy)]
pub struct HarnessContext<'a> {
    /// The agent's working directory.
    pub cwd: &'a Path,
    /// A directory of the agent's own for the harness's state
    /// (`<data_dir>/harness/<agent>`).
    pub state_dir: &'a Path,
}

/// Why a harness cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The harness exists in the table but not yet in this build.
    #[error("the {0} harness is not available in this build yet")]
    NotBuilt(&'static str),
}

impl HarnessConfig {
    /// The harness's name, as the `harness` key spells it.
    pub fn name(&self) -> &'static str {
        match self {
            HarnessConfig::Scripted(_) => "scripted",
            HarnessConfig::ClaudeCode(_) => "claude-code",
            HarnessConfig::Codex(_) => "codex",
        }
    }

    /// The CLI this harness runs, with the configuration key that names it (`None` for
    /// a harness that runs no CLI).
    pub fn cli_bin(&self) -> Option<(&'static str, &Path)> {
        match self {
            HarnessConfig::Scripted(_) => None,
            HarnessConfig::ClaudeCode(options) => Some(("claude_bin", &options.bin)),
            HarnessConfig::Codex(options) => Some(("codex_bin", &options.bin)),
        }
    }

    /// Builds the harness; it starts nothing until a turn needs it.
    pub fn build(&self, context: HarnessContext<'_>) -> Result<Arc<dyn Harness>, BuildError> {
        match self {
            HarnessConfig::Scripted(ScriptedConfig {}) => Ok(Arc::new(ScriptedHarness)),
            HarnessConfig::ClaudeCode(options) => {
                let mut options = options.clone();
                options.cwd = context.cwd.to_path_buf();
                options.state_dir = context.state_dir.to_path_buf();
                Ok(Arc::new(ClaudeCodeHarness::new(options)))
            }
            HarnessConfig::Codex(options) => {
                let mut options = options.clone();
                options.cwd = context.cwd.to_path_buf();
                options.state_dir = context.state_dir.to_path_buf();
                Ok(Arc::new(crate::codex::CodexHarness::new(options)))
            }
        }
    }
}

impl Default for HarnessConfig {
    fn default() -> Self {
        HarnessConfig::Scripted(ScriptedConfig {})
    }
}
