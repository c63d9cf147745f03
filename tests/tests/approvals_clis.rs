//! Approvals with the real CLIs (issue 30, spec `approvals.md`): a shell command that
//! writes a file pauses its run before the file exists; confirmed, the command runs
//! once; denied, the file never exists and the model's next request carries the
//! denial; also when the server was restarted while the run was paused (the paused CLI
//! is gone, the harness session is resumed from the journal and told the decision).
//! The real Claude Code and Codex CLIs against the fake model servers.

use std::path::Path;

use serde_json::{Value, json};
use turnstile_tests::claude::claude_bin;
use turnstile_tests::codex::codex_bin;
use turnstile_tests::fake_anthropic::FakeAnthropic;
use turnstile_tests::fake_openai::FakeOpenAi;
use turnstile_tests::{Server, http_client, post_form_json};

/// A configuration with one agent whose shell commands wait for a person.
fn claude_approvals_config(dir: &Path, bin: &Path, fake: &FakeAnthropic) {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        dir.join("turnstile.toml"),
        format!(
            r#"[server]
data_dir = "./data"

[[agents]]
id = "coder"
harness = "claude-code"
claude_bin = "{bin}"
cwd = "./workspace"
allowed_tools = ["Read"]
approvals = ["Bash"]
env = {{ ANTHROPIC_BASE_URL = "{url}", ANTHROPIC_API_KEY = "test-key", HOME = "{home}" }}
"#,
            bin = bin.display(),
            home = home.display(),
            url = fake.base_url,
        ),
    )
    .unwrap();
}

fn start(dir: &Path) -> Server {
    Server::start_in(dir, &["--config", "turnstile.toml"])
}

async fn turn(server: &Server, session: &str, message: &str) -> Value {
    let form = [
        ("message", message),
        ("session_id", session),
        ("stream", "false"),
    ];
    post_form_json(server, "/agents/coder/runs", &form).await
}

/// Decides every pending call of `run` and waits for what follows.
async fn decide(server: &Server, run: &Value, confirmed: bool, note: &str) -> Value {
    let tools: Vec<Value> = run["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|tool| tool["requires_confirmation"] == true && tool["confirmed"].is_null())
        .map(|tool| {
            json!({"tool_call_id": tool["tool_call_id"], "confirmed": confirmed, "confirmation_note": note})
        })
        .collect();
    assert!(!tools.is_empty(), "nothing pending: {run}");
    let response = http_client()
        .post(server.url(&format!(
            "/agents/coder/runs/{}/continue",
            run["run_id"].as_str().unwrap()
        )))
        .form(&[
            ("tools", Value::Array(tools).to_string().as_str()),
            ("session_id", run["session_id"].as_str().unwrap()),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

async fn get_run(server: &Server, run: &Value) -> Value {
    let path = format!("/agents/coder/runs/{}", run["run_id"].as_str().unwrap());
    http_client()
        .get(server.url(&path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The paused run, its file not there yet, its pending call the shell command.
fn assert_paused_before(run: &Value, file: &Path) {
    assert_eq!(run["status"], "PAUSED", "{run}");
    assert!(!file.exists(), "{file:?} exists before the decision");
    let call = &run["requirements"][0]["tool_execution"];
    assert!(
        matches!(call["tool_name"].as_str(), Some("Bash" | "shell")),
        "{run}"
    );
}

/// The scenario both CLIs go through; `last_request` is the text of the model's newest
/// request.
async fn pause_confirm_deny_restart(dir: &Path, last_request: impl Fn() -> String) {
    let workspace = dir.join("workspace");
    let server = start(dir);

    // Confirmed while the CLI waits (its process kept): the command runs once.
    let run = turn(&server, "s1", "@bash echo ran >> yes.txt\n@reply wrote it").await;
    assert_paused_before(&run, &workspace.join("yes.txt"));
    let done = decide(&server, &run, true, "").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["run_id"], run["run_id"]);
    assert_eq!(
        std::fs::read_to_string(workspace.join("yes.txt")).unwrap(),
        "ran\n"
    );
    assert!(
        done["content"].as_str().unwrap().contains("wrote it"),
        "{done}"
    );

    // Denied: it never runs, and the model's next request carries the note.
    let run = turn(
        &server,
        "s2",
        "@bash echo ran >> no.txt\n@reply not written",
    )
    .await;
    assert_paused_before(&run, &workspace.join("no.txt"));
    let done = decide(&server, &run, false, "not on a Friday").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert!(!workspace.join("no.txt").exists());
    let last = last_request();
    assert!(last.contains("not on a Friday"), "{last}");

    // Killed while paused: the CLI that asked is gone; confirmed, the command runs
    // once, in the resumed session.
    let run = turn(&server, "s3", "@bash echo ran >> later.txt\n@reply later").await;
    assert_paused_before(&run, &workspace.join("later.txt"));
    server.kill();
    let server = start(dir);
    let still = get_run(&server, &run).await;
    assert_eq!(still["status"], "PAUSED", "{still}");
    let done = decide(&server, &still, true, "").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("later.txt")).unwrap(),
        "ran\n"
    );

    // Restarted while paused, then denied: never runs, the model is told.
    let run = turn(&server, "s4", "@bash echo ran >> never.txt\n@reply never").await;
    assert_paused_before(&run, &workspace.join("never.txt"));
    server.terminate();
    let server = start(dir);
    let still = get_run(&server, &run).await;
    let done = decide(&server, &still, false, "use the staging box").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert!(!workspace.join("never.txt").exists());
    let last = last_request();
    assert!(last.contains("use the staging box"), "{last}");
    server.terminate();
}

#[tokio::test]
async fn claude_code_pauses_before_a_shell_command_and_runs_it_once_confirmed_30() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    claude_approvals_config(dir.path(), &bin, &fake);
    pause_confirm_deny_restart(dir.path(), || {
        fake.message_requests().last().unwrap().conversation_text()
    })
    .await;
}

#[tokio::test]
async fn codex_pauses_before_a_shell_command_and_runs_it_once_confirmed_30() {
    let Some(bin) = codex_bin() else { return };
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
    std::fs::write(
        dir.path().join("turnstile.toml"),
        format!(
            r#"[server]
data_dir = "./data"

[[agents]]
id = "coder"
harness = "codex"
codex_bin = "{bin}"
model = "gpt-test"
base_url = "{url}"
sandbox = "danger-full-access"
cwd = "./workspace"
approvals = ["shell"]
env = {{ OPENAI_API_KEY = "test-key", HOME = "{home}" }}
"#,
            bin = bin.display(),
            home = home.display(),
            url = fake.base_url,
        ),
    )
    .unwrap();
    pause_confirm_deny_restart(dir.path(), || {
        let last = fake.requests().last().cloned().unwrap();
        format!(
            "{}\n{}",
            last.user_texts().join("\n"),
            last.tool_outputs().join("\n")
        )
    })
    .await;
}

/// A usage limit the CLI reports with its reset time is waited out, and the run goes
/// on with the same id: `agent` is the agent's harness keys.
async fn usage_limit_waited_out(dir: &Path, agent: &str, message: &str) {
    std::fs::create_dir_all(dir.join("workspace")).unwrap();
    std::fs::write(
        dir.join("turnstile.toml"),
        format!("[server]\ndata_dir = \"./data\"\n\n[[agents]]\nid = \"coder\"\ncwd = \"./workspace\"\nwait_on_usage_limit = true\nmax_usage_wait_s = 60\n{agent}"),
    )
    .unwrap();
    let server = start(dir);
    let started = std::time::Instant::now();
    let run = turn(&server, "s1", message).await;
    assert_eq!(run["status"], "COMPLETED", "{run}");
    assert!(
        run["content"].as_str().unwrap().contains("after the limit"),
        "{run}"
    );
    let warning = &run["metadata"]["warnings"][0];
    assert_eq!(warning["type"], "usage_limit", "{run}");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(1),
        "no wait"
    );
    server.terminate();
}

/// Claude Code's `rate_limit_event` (a subscription's usage limit, `resetsAt`).
#[tokio::test]
async fn claude_codes_usage_limit_is_waited_out_30() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let agent = format!(
        "harness = \"claude-code\"\nclaude_bin = \"{}\"\nenv = {{ ANTHROPIC_BASE_URL = \"{}\", CLAUDE_CODE_OAUTH_TOKEN = \"sk-ant-oat01-fake\", HOME = \"{}\" }}\n",
        bin.display(),
        fake.base_url,
        home.display()
    );
    usage_limit_waited_out(
        dir.path(),
        &agent,
        "@error usage-limit x1 2\n@reply after the limit",
    )
    .await;
}

/// Codex's `usageLimitExceeded` with the window's reset (`account/rateLimits/updated`).
#[tokio::test]
async fn codexs_usage_limit_is_waited_out_30() {
    let Some(bin) = codex_bin() else { return };
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let agent = format!(
        "harness = \"codex\"\ncodex_bin = \"{}\"\nmodel = \"gpt-test\"\nbase_url = \"{}\"\nenv = {{ OPENAI_API_KEY = \"test-key\", HOME = \"{}\" }}\n",
        bin.display(),
        fake.base_url,
        home.display()
    );
    usage_limit_waited_out(
        dir.path(),
        &agent,
        "@error usage-limit x1\n@reply after the limit",
    )
    .await;
}
