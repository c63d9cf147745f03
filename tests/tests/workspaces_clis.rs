//! Workspaces per session with the real CLIs (issue 29): with `workspace = "session"`
//! the real Claude Code and Codex CLIs, against the fake model servers, run each
//! session's shell commands in `<cwd>/<session_id>/`: a file one session writes is not
//! in another's directory, and a session's next turn, in a fresh CLI process, finds it
//! again. Snapshots carry the files with the journal: exported and imported on a new
//! machine (a fresh data directory, an empty cwd), the next turn's `cat` shows the model
//! the file; a continuation from the checkpoint before a second command that changed
//! the file sees the first content.

use std::path::Path;

use serde_json::Value;
use turnstile_tests::claude::{claude_bin, claude_config};
use turnstile_tests::codex::{codex_bin, codex_config};
use turnstile_tests::fake_anthropic::FakeAnthropic;
use turnstile_tests::fake_openai::FakeOpenAi;
use turnstile_tests::{Server, post_form_json, turnstile_ok};

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
    let config = claude_snapshot_config(dir.path(), &bin, &fake);
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

/// Claude Code's config in `dir` with `workspace = "session"` and no warm processes,
/// its shell commands allowed (it asks before one that writes a file otherwise).
fn claude_snapshot_config(dir: &Path, bin: &Path, fake: &FakeAnthropic) -> std::path::PathBuf {
    let config = claude_config(
        dir,
        bin,
        fake,
        "",
        "warm_processes = 0\nworkspace = \"session\"",
    );
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
    config
}

/// Turn 1 writes a file twice on the first machine; its journal is exported and
/// imported on a second one with an empty cwd, where turn 2 reads the file; then a
/// continuation of turn 1 from between its two commands reads the first content.
/// `seen(marker)` is what the model was sent in the request whose prompt holds `marker`.
/// The model thinks 300 ms before each step, as models do: a CLI cannot be paused, so
/// the snapshot after a tool call is taken while the model composes its next step.
async fn files_travel_with_the_journal(
    agent: &str,
    make_config: impl Fn(&Path) -> std::path::PathBuf,
    seen: impl Fn(&str) -> String,
) {
    let old = tempfile::tempdir().unwrap();
    let config = make_config(old.path());
    let server = Server::start_with(
        &old.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    // The contents are computed by the shell, so no command's text holds them.
    let first = run(
        &server,
        agent,
        "travel",
        "write twice\n@think 300\n@bash echo $((5*5))-first > f.txt\n@bash echo $((6*7))-second > f.txt\n@reply written",
    )
    .await;
    assert_eq!(first["status"], "COMPLETED", "{first}");
    server.terminate();
    let export = old.path().join("journal.jsonl");
    let data = old.path().join("data");
    turnstile_ok(&[
        "journal",
        "export",
        "--data-dir",
        data.to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
    ]);

    let new = tempfile::tempdir().unwrap();
    let config = make_config(new.path());
    let data = new.path().join("data");
    turnstile_ok(&[
        "journal",
        "import",
        "--in",
        export.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(!new.path().join("workspace/travel").exists());
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);
    let read = run(
        &server,
        agent,
        "travel",
        "read it\n@bash cat f.txt\n@reply read",
    )
    .await;
    assert!(tool_output(&read).contains("42-second"), "{read}");
    assert!(
        seen("read it").contains("42-second"),
        "the model was not shown the file"
    );

    // From the checkpoint after the first command: the file as it was then.
    let path = format!(
        "/agents/{agent}/runs/{}/continue",
        first["run_id"].as_str().unwrap()
    );
    let form = [
        ("session_id", "travel"),
        ("stream", "false"),
        ("continue_from", "3"),
        ("input", "again\n@bash cat f.txt\n@reply again"),
    ];
    let again = post_form_json(&server, &path, &form).await;
    assert_eq!(again["status"], "COMPLETED", "{again}");
    let output = tool_output(&again);
    assert!(
        output.contains("25-first") && !output.contains("42-second"),
        "{again}"
    );
    server.terminate();
    let verified = turnstile_ok(&["journal", "verify", "--data-dir", data.to_str().unwrap()]);
    assert!(!verified.is_empty());
}

#[tokio::test]
async fn claude_code_files_travel_with_the_journal_29() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    files_travel_with_the_journal(
        "claude",
        |dir| claude_snapshot_config(dir, &bin, &fake),
        |marker| fake.last_request_with(marker).conversation_text(),
    )
    .await;
}

#[tokio::test]
async fn codex_files_travel_with_the_journal_29() {
    let Some(bin) = codex_bin() else { return };
    let fake = FakeOpenAi::start();
    files_travel_with_the_journal(
        "codex",
        |dir| {
            codex_config(
                dir,
                &bin,
                &fake,
                "",
                "warm_processes = 0\nworkspace = \"session\"",
            )
        },
        |marker| fake.last_request_with(marker).tool_outputs().join("\n"),
    )
    .await;
}
