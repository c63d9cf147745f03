//! Helpers for the tests that run the real `codex` CLI against the fake Responses API.
//!
//! `.ci/run` installs the CLI and sets `TURNSTILE_CODEX_BIN`; without it the tests look
//! where `.ci/run` puts it. A test that needs the CLI fails, never skips, when `CI` is
//! set and the CLI is missing.

use std::path::{Path, PathBuf};

use crate::fake_openai::FakeOpenAi;

/// Where `.ci/run` installs the native binary, under the repository.
pub const INSTALLED: &str =
    "target/clis/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex";

/// The `codex` binary, or `None` (with a note) outside CI when it is not installed.
pub fn codex_bin() -> Option<PathBuf> {
    crate::installed_cli("codex", "TURNSTILE_CODEX_BIN", INSTALLED)
}

/// A configuration with one `codex` agent talking to `fake`; `server` and `agent` add
/// lines to `[server]` and to the agent.
pub fn codex_config(
    dir: &Path,
    bin: &Path,
    fake: &FakeOpenAi,
    server: &str,
    agent: &str,
) -> PathBuf {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    // The CLI runs commands in login shells: an empty home keeps the machine's own
    // profile (and whatever it runs) out of the tests.
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let path = dir.join("turnstile.toml");
    let text = format!(
        r#"[server]
max_concurrent_runs = 4
{server}

[[agents]]
id = "codex"
name = "Codex"
harness = "codex"
codex_bin = "{bin}"
model = "gpt-test"
base_url = "{url}"
sandbox = "danger-full-access"
cwd = "{workspace}"
env = {{ OPENAI_API_KEY = "test-key", HOME = "{home}" }}
{agent}
"#,
        bin = bin.display(),
        workspace = workspace.display(),
        home = home.display(),
        url = fake.base_url,
    );
    std::fs::write(&path, text).expect("write the configuration");
    path
}
