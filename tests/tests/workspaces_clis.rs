//! Workspaces per session with the real CLIs (issue 29, the first part): with
//! `workspace = "session"` the real Claude Code and Codex CLIs, against the fake model
//! servers, run each session's shell commands in `<cwd>/<session_id>/`: a file one
//! session writes is not in another's directory, and a session's next turn, in a fresh
//! CLI process, finds it again.

use std::path::Path;

use serde_json::Value;
use turnstile_tests::claude::{claude_bin, claude_config};
use turnstile_tests::codex::{codex_bin, codex_config};
use turnstile_tests::fake_anthropic::FakeAnthropic;
use turnstile_tests::fake_openai::FakeOpenAi;
use turnstile_tests::{Server, post_form_json};

async fn run(server: &Server, agent: &str, session: &str, message: &str) -> Value {
    let form = [
        ("message", message),
        ("session_id", session),
        ("stream", "false"),
    ];
    post_form_json(server, &format!("/agents/{agent}/runs"), &form).await
}

/// Every tool result of a run, joined.
fn tool_output(run: &Value) -> String {
    run["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|tool| tool["result"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Two sessions of `agent` on `server`, whose cwd is `workspace`.
async fn sessions_keep_their_own_files(server: &Server, agent: &str, workspace: &Path) {
    let first = run(
        server,
        agent,
        "alpha",
        "write it\n@bash pwd; echo from-alpha > note.txt\n@reply written",
    )
    .await;
    assert_eq!(first["status"], "COMPLETED", "{first}");
    let alpha = workspace.join("alpha").canonicalize().unwrap();
    assert!(
        tool_output(&first).contains(alpha.to_str().unwrap()),
        "the command ran in {alpha:?}: {first}"
    );
    assert_eq!(
        std::fs::read_to_string(alpha.join("note.txt")).unwrap(),
        "from-alpha\n"
    );
    assert!(!workspace.join("note.txt").exists());

    let other = run(
        server,
        agent,
        "beta",
        "look\n@bash ls -a; cat note.txt || echo no-note-here\n@reply looked",
    )
    .await;
    assert_eq!(other["status"], "COMPLETED", "{other}");
    assert!(
        tool_output(&other).contains("no-note-here"),
        "beta saw alpha's file: {other}"
    );

    let again = run(
        server,
        agent,
        "alpha",
        "read it\n@bash cat note.txt\n@reply read",
    )
    .await;
    assert!(
        tool_output(&again).contains("from-alpha"),
        "alpha's next turn lost its file: {again}"
    );
}

#[tokio::test]
async fn claude_code_runs_each_session_in_its_own_directory_29() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    // No warm processes: alpha's second turn starts the CLI again, in its directory.
    let config = claude_config(
        dir.path(),
        &bin,
        &fake,
        "",
        "warm_processes = 0\nworkspace = \"session\"",
    );
    // Shell commands that write files, allowed (Claude Code asks before one otherwise).
    let text = std::fs::read_to_string(&config).unwrap();
    let allowed = text
        .lines()
        .find(|line| line.starts_with("allowed_tools"))
        .unwrap()
        .to_owned();
    std::fs::write(
        &config,
        text.replace(&allowed, "allowed_tools = [\"Bash\", \"Read\"]"),
    )
    .unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    sessions_keep_their_own_files(&server, "claude", &dir.path().join("workspace")).await;
    server.terminate();
}

#[tokio::test]
async fn codex_runs_each_session_in_its_own_directory_29() {
    let Some(bin) = codex_bin() else { return };
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let config = codex_config(
        dir.path(),
        &bin,
        &fake,
        "",
        "warm_processes = 0\nworkspace = \"session\"",
    );
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    sessions_keep_their_own_files(&server, "codex", &dir.path().join("workspace")).await;
    server.terminate();
}
