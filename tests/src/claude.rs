//! Helpers for the tests that run the real `claude` CLI against the fake Messages API.
//!
//! `.ci/run` installs the CLI and sets `TURNSTILE_CLAUDE_BIN`; without it the tests look
//! where `.ci/run` puts it. A test that needs the CLI fails, never skips, when `CI` is
//! set and the CLI is missing.

use std::path::{Path, PathBuf};

use crate::fake_anthropic::FakeAnthropic;

/// The `claude` binary, or `None` (with a note) outside CI when it is not installed.
pub fn claude_bin() -> Option<PathBuf> {
    crate::installed_cli(
        "claude",
        "TURNSTILE_CLAUDE_BIN",
        "target/clis/node_modules/@anthropic-ai/claude-code-linux-x64/claude",
    )
}

/// A configuration with one `claude` agent talking to `fake`; `server` and `agent`
/// add lines to `[server]` and to the agent.
pub fn claude_config(
    dir: &Path,
    bin: &Path,
    fake: &FakeAnthropic,
    server: &str,
    agent: &str,
) -> PathBuf {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    // The CLI's shell commands start the account's shell with its profile: an empty
    // home keeps the machine's own profile (and what it runs, or leaves behind when a
    // test kills it mid-way, such as a stale pyenv lock) out of the tests.
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let path = dir.join("turnstile.toml");
    let text = format!(
        r#"[server]
max_concurrent_runs = 4
{server}

[[agents]]
id = "claude"
name = "Claude Code"
harness = "claude-code"
claude_bin = "{bin}"
cwd = "{workspace}"
allowed_tools = ["Bash(echo:*)", "Bash(sleep:*)", "Read", "Task", "Agent"]
env = {{ ANTHROPIC_BASE_URL = "{url}", ANTHROPIC_API_KEY = "test-key", HOME = "{home}" }}
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

/// Live (not zombie) processes for which `matches(pid)` holds.
fn processes(matches: impl Fn(u32) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // A zombie has exited already.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| !stat.contains(") Z "))
        })
        .filter(|pid| matches(*pid))
        .collect()
}

/// Processes whose `CLAUDE_CONFIG_DIR` lies under `data_dir`: the CLIs a server started.
pub fn cli_pids(data_dir: &Path) -> Vec<u32> {
    let needle = format!("CLAUDE_CONFIG_DIR={}", data_dir.display());
    processes(|pid| {
        std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
            environ
                .split(|b| *b == 0)
                .any(|var| var.starts_with(needle.as_bytes()))
        })
    })
}

/// Processes whose command line holds `needle` (arguments joined by spaces).
pub fn processes_running(needle: &str) -> usize {
    processes(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .contains(needle)
        })
    })
    .len()
}
