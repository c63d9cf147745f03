//! Issue 13, defect 0: the README's Claude Code configuration, as written (relative
//! `data_dir`, `cwd` and `claude_bin`, the server started from the directory that holds
//! them), keeps the conversation through a restart, passivation and an imported copy.
//! Before the fix the CLI got `CLAUDE_CONFIG_DIR=./turnstile-data/…` while running in
//! `./workspace`, so the transcript turnstile restored was not the one the CLI read.

use std::path::Path;

use serde_json::Value;
use turnstile_tests::claude::claude_bin;
use turnstile_tests::fake_anthropic::FakeAnthropic;
use turnstile_tests::{Server, post_form_json, turnstile_in_ok, wait_until_passivated};

async fn run(server: &Server, message: &str) -> Value {
    let form = [
        ("message", message),
        ("session_id", "demo"),
        ("stream", "false"),
    ];
    post_form_json(server, "/agents/claude/runs", &form).await
}

fn seen_by_model(fake: &FakeAnthropic, marker: &str) -> String {
    fake.last_request_with(marker).conversation_text()
}

/// The README's `[[agents]]` table with the CLI under `./node_modules` of `dir`.
fn readme_config(dir: &Path, bin: &Path, fake: &FakeAnthropic) {
    let package = dir.join("node_modules/@anthropic-ai");
    std::fs::create_dir_all(&package).unwrap();
    std::os::unix::fs::symlink(bin.parent().unwrap(), package.join("claude-code-linux-x64"))
        .unwrap();
    let text = format!(
        r#"[server]
session_idle_s = 1

[[agents]]
id = "claude"
harness = "claude-code"
claude_bin = "./node_modules/@anthropic-ai/claude-code-linux-x64/{name}"
cwd = "./workspace"
allowed_tools = ["Read", "Bash(echo:*)"]
retries = 2
warm_processes = 4
env = {{ ANTHROPIC_API_KEY = "sk-test", ANTHROPIC_BASE_URL = "{url}" }}
"#,
        name = bin.file_name().unwrap().to_string_lossy(),
        url = fake.base_url,
    );
    std::fs::write(dir.join("turnstile.toml"), text).unwrap();
}

#[tokio::test]
async fn relative_paths_of_the_readme_config_keep_the_claude_session_13() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    readme_config(dir, &bin, &fake);
    let args = ["--config", "turnstile.toml"];

    let server = Server::start_in(dir, &args);
    let first = run(
        &server,
        "The secret is KIWI-42.\n@bash echo tool-said-MANGO\n@reply noted",
    )
    .await;
    assert_eq!(first["status"], "COMPLETED", "{first}");
    server.terminate();
    // The CLI's files are the runtime's, under the data directory, not in the workspace.
    assert!(dir.join("turnstile-data/harness/claude").is_dir());
    assert!(!dir.join("workspace/turnstile-data").exists());

    // A restart: no warm process, so the transcript is restored from the journal.
    let server = Server::start_in(dir, &args);
    let second = run(&server, "after restart\n@reply second answer").await;
    assert_eq!(second["status"], "COMPLETED", "{second}");
    assert!(
        !second["metadata"]["warnings"]
            .to_string()
            .contains("session_fallback"),
        "the restarted server resumed through the fallback: {second}"
    );
    let seen = seen_by_model(&fake, "after restart");
    for earlier in ["KIWI-42", "tool-said-MANGO", "noted"] {
        assert!(
            seen.contains(earlier),
            "the model did not see {earlier:?}: {seen}"
        );
    }

    // Passivation.
    wait_until_passivated(&server, 1).await;
    let third = run(&server, "after passivation\n@reply third answer").await;
    assert_eq!(third["status"], "COMPLETED", "{third}");
    assert!(seen_by_model(&fake, "after passivation").contains("second answer"));
    server.terminate();

    // An imported copy, with the README's relative paths, in a second directory.
    turnstile_in_ok(
        dir,
        &[
            "journal",
            "export",
            "--config",
            "turnstile.toml",
            "--out",
            "journal.jsonl",
        ],
    );
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(dir.join("turnstile.toml"), other.join("turnstile.toml")).unwrap();
    std::os::unix::fs::symlink(dir.join("node_modules"), other.join("node_modules")).unwrap();
    turnstile_in_ok(
        &other,
        &[
            "journal",
            "import",
            "--in",
            "../journal.jsonl",
            "--data-dir",
            "./turnstile-data",
        ],
    );
    let server = Server::start_in(&other, &args);
    let fourth = run(&server, "on the other server\n@reply fourth answer").await;
    assert_eq!(fourth["status"], "COMPLETED", "{fourth}");
    assert!(
        !fourth["metadata"]["warnings"]
            .to_string()
            .contains("session_fallback"),
        "the imported copy resumed through the fallback: {fourth}"
    );
    let seen = seen_by_model(&fake, "on the other server");
    for earlier in [
        "KIWI-42",
        "tool-said-MANGO",
        "second answer",
        "third answer",
    ] {
        assert!(
            seen.contains(earlier),
            "the model did not see {earlier:?}: {seen}"
        );
    }
    server.terminate();
}
