//! Issue 17, for an operator on day one, on the real binary: logs a person can read (one
//! line per request, the run lifecycle, a start-up banner, no colour codes in a pipe,
//! JSON on request), a configuration one can see (`--print-config`, accepted back by
//! `--config`, secrets masked), `--help` naming defaults and the environment, a CLI
//! binary checked at start naming its key, and `addr` with a host name.

use std::time::Duration;

use serde_json::Value;
use turnstile_tests::{
    Server, http_client, lossy, post_form, turnstile, turnstile_in_ok, wait_until,
};

fn has(logs: &[String], needle: &str) -> bool {
    logs.iter().any(|line| line.contains(needle))
}

#[tokio::test]
async fn logs_name_each_request_the_run_lifecycle_and_the_start_17() {
    let dir = tempfile::tempdir().unwrap();
    // The default level: no RUST_LOG override beyond the helper's `info`.
    let server = Server::start(dir.path());
    let done = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "hello"),
            ("stream", "false"),
            ("session_id", "s1"),
        ],
    )
    .await;
    assert_eq!(done.status(), 200);
    let run: Value = done.json().await.unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let missing = http_client()
        .get(server.url("/agents/scripted/runs/no-such-run"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let logs = server.terminate_logs();
    let port = logs
        .iter()
        .find_map(|line| line.split("listening on http://127.0.0.1:").nth(1))
        .expect("banner with the address");
    assert!(!port.is_empty());
    assert!(has(&logs, "(data dir "), "{logs:#?}");
    assert!(has(&logs, "agent scripted: harness scripted"), "{logs:#?}");
    assert!(has(&logs, "POST /agents/scripted/runs 200"), "{logs:#?}");
    assert!(
        has(&logs, "GET /agents/scripted/runs/no-such-run 404"),
        "{logs:#?}"
    );
    for step in ["run accepted", "run started", "run completed"] {
        assert!(
            logs.iter()
                .any(|line| line.contains(step) && line.contains(&run_id)),
            "{step} of {run_id} missing: {logs:#?}"
        );
    }
    assert!(has(&logs, "turnstile stopped"), "{logs:#?}");
    // A pipe is not a terminal: no colour codes.
    assert!(
        !logs.iter().any(|line| line.contains('\u{1b}')),
        "{logs:#?}"
    );
}

#[tokio::test]
async fn failed_retried_recovered_and_abandoned_runs_are_logged_17() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(
        &config,
        "[[agents]]\nid = \"scripted\"\nharness = \"scripted\"\nretries = 1\ndelay_between_retries_s = 0.0\n",
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    let server = Server::start_with(dir.path(), &["--config", &config]);
    // Every attempt fails: one retry, then the run fails with its class.
    let failed = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/fail transient 5"),
            ("stream", "false"),
            ("session_id", "f"),
        ],
    )
    .await;
    let failed: Value = failed.json().await.unwrap();
    assert_eq!(failed["status"], "ERROR", "{failed}");
    // A long run in flight at a SIGKILL: recovery resumes it at the next start.
    let long = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/sleep 60000"),
            ("background", "true"),
            ("stream", "false"),
            ("session_id", "l"),
        ],
    )
    .await;
    let long: Value = long.json().await.unwrap();
    let long_id = long["run_id"].as_str().unwrap().to_owned();
    wait_until("the long run runs", Duration::from_secs(10), || {
        has(&server.logs(), &format!("run started run_id={long_id}"))
    });
    let logs = server.logs();
    assert!(
        logs.iter()
            .any(|line| line.contains("attempt failed") && line.contains("retryable=")),
        "{logs:#?}"
    );
    assert!(
        logs.iter()
            .any(|line| line.contains("run failed") && line.contains("error_type=")),
        "{logs:#?}"
    );
    server.kill();
    let server = Server::start_with(dir.path(), &["--config", &config]);
    wait_until("recovery logged", Duration::from_secs(10), || {
        let logs = server.logs();
        // Not "recovery: ", which the module path `session::recovery:` of the
        // recovered run's line also holds.
        has(&logs, "run recovered") && has(&logs, "left open by the last stop")
    });
    let logs = server.logs();
    assert!(
        has(&logs, "recovery: 1 run left open by the last stop"),
        "{logs:#?}"
    );
    assert!(
        logs.iter()
            .any(|line| line.contains("run recovered") && line.contains(&long_id)),
        "{logs:#?}"
    );
    // Stopped while the run is still in flight: the drain gives up and says so.
    let logs = server.terminate_logs();
    assert!(has(&logs, "runs still open at shutdown"), "{logs:#?}");
}

#[tokio::test]
async fn json_logs_are_one_object_a_line_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--log-format", "json"]);
    let done = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "hello"), ("stream", "false")],
    )
    .await;
    assert_eq!(done.status(), 200);
    let logs = server.terminate_logs();
    assert!(logs.len() >= 5, "{logs:#?}");
    for line in &logs {
        let object: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            object["level"].is_string() && object["fields"].is_object(),
            "{line}"
        );
    }
    assert!(has(&logs, "POST /agents/scripted/runs 200"), "{logs:#?}");
}

#[test]
fn log_level_is_checked_and_quiets_the_server_17() {
    let bad = turnstile(&["serve", "--log-level", "=[", "--addr", "127.0.0.1:0"]);
    assert_eq!(bad.status.code(), Some(2), "{}", lossy(&bad.stderr));
    assert!(
        lossy(&bad.stderr).contains("--log-level"),
        "{}",
        lossy(&bad.stderr)
    );
}

#[test]
fn print_config_fills_in_defaults_masks_secrets_and_is_accepted_back_17() {
    let dir = tempfile::tempdir().unwrap();
    // No file: the defaults.
    let defaults = turnstile_in_ok(dir.path(), &["serve", "--print-config"]);
    assert!(defaults.starts_with("[server]\n"), "{defaults}");
    for line in [
        "addr = \"127.0.0.1:7777\"",
        "api_key_env = \"TURNSTILE_API_KEY\"",
        "max_concurrent_runs = 8",
        "session_idle_s = 60.0",
        "harness = \"scripted\"",
        "id = \"scripted\"",
    ] {
        assert!(defaults.contains(line), "{line} missing from {defaults}");
    }
    let data_dir = dir.path().join("turnstile-data");
    assert!(
        defaults.contains(&format!("data_dir = \"{}\"", data_dir.display())),
        "{defaults}"
    );
    // Printing starts nothing and writes nothing.
    assert!(!data_dir.exists());

    // A file with a secret in an agent's environment, and overrides on the command line.
    std::fs::write(
        dir.path().join("t.toml"),
        "[server]\nmax_queued_runs = 7\n\n[[agents]]\nid = \"c\"\nharness = \"claude-code\"\nclaude_bin = \"./bin/claude\"\nenv = { ANTHROPIC_API_KEY = \"sk-very-secret\", ANTHROPIC_BASE_URL = \"http://127.0.0.1:9\" }\n",
    )
    .unwrap();
    let printed = turnstile_in_ok(
        dir.path(),
        &[
            "serve",
            "--config",
            "t.toml",
            "--addr",
            "localhost:7001",
            "--print-config",
        ],
    );
    assert!(!printed.contains("sk-very-secret"), "{printed}");
    assert!(
        printed.contains("ANTHROPIC_API_KEY = \"<masked>\""),
        "{printed}"
    );
    assert!(
        printed.contains("ANTHROPIC_BASE_URL = \"http://127.0.0.1:9\""),
        "{printed}"
    );
    assert!(printed.contains("addr = \"localhost:7001\""), "{printed}");
    assert!(printed.contains("max_queued_runs = 7"), "{printed}");
    assert!(
        printed.contains("model = \"claude-sonnet-4-6\""),
        "{printed}"
    );
    assert!(
        printed.contains(&format!(
            "claude_bin = \"{}\"",
            dir.path().join("bin/claude").display()
        )),
        "{printed}"
    );
    // `--config` accepts it back, and it prints the same.
    std::fs::write(dir.path().join("printed.toml"), &printed).unwrap();
    let again = turnstile_in_ok(
        dir.path(),
        &["serve", "--config", "printed.toml", "--print-config"],
    );
    assert_eq!(again, printed);
}

#[test]
fn help_shows_defaults_and_the_environment_17() {
    let help = lossy(&turnstile(&["serve", "--help"]).stdout);
    for needle in [
        "default 127.0.0.1:7777",
        "default ./turnstile-data",
        "TURNSTILE_API_KEY",
        "RUST_LOG",
        "--print-config",
        "--log-format",
        "[default: text]",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
}

#[test]
fn a_cli_that_cannot_run_is_refused_at_start_naming_its_key_17() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.toml"),
        "[[agents]]\nid = \"claude\"\nharness = \"claude-code\"\nclaude_bin = \"./node_modules/.bin/claude\"\n",
    )
    .unwrap();
    let out = turnstile_tests::turnstile_in(
        dir.path(),
        &["serve", "--config", "t.toml", "--addr", "127.0.0.1:0"],
    );
    let stderr = lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("agent \"claude\": claude_bin"), "{stderr}");
    assert!(stderr.contains("node_modules/.bin/claude"), "{stderr}");
    assert!(stderr.contains("cannot be run"), "{stderr}");
    // Refused before anything was opened.
    assert!(!dir.path().join("turnstile-data").exists());

    // A binary that runs but fails `--version` is refused too, with what it said.
    let fake = dir.path().join("broken-cli");
    std::fs::write(&fake, "#!/bin/sh\necho 'no licence' >&2\nexit 3\n").unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&fake)
        .status()
        .unwrap();
    std::fs::write(
        dir.path().join("t.toml"),
        "[[agents]]\nid = \"claude\"\nharness = \"claude-code\"\nclaude_bin = \"./broken-cli\"\n",
    )
    .unwrap();
    let out = turnstile_tests::turnstile_in(
        dir.path(),
        &["serve", "--config", "t.toml", "--addr", "127.0.0.1:0"],
    );
    let stderr = lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("failed `--version`") && stderr.contains("no licence"),
        "{stderr}"
    );
}

#[tokio::test]
async fn addr_takes_a_host_name_17() {
    let dir = tempfile::tempdir().unwrap();
    // A free port: bind one and let it go.
    let port = turnstile_tests::free_port();
    let addr = format!("localhost:{port}");
    let server = Server::start_with(dir.path(), &["--addr", &addr]);
    assert_eq!(server.base, format!("http://127.0.0.1:{port}"));
    let health = http_client()
        .get(format!("http://127.0.0.1:{port}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    server.terminate();
    let bad = turnstile(&["serve", "--addr", "no-such-host.invalid:7777"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        lossy(&bad.stderr).contains("server.addr"),
        "{}",
        lossy(&bad.stderr)
    );
}

/// `--print-config` for a file that sets every optional key.
fn printed_with_every_key() -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("all.toml"),
        r#"[telemetry]
otlp_endpoint = "http://127.0.0.1:4318"

[auth]
mode = "jwt"
jwks_file = "jwks.json"

[journal]
backend = "postgres"
url = "postgres://turnstile:secret@127.0.0.1:9/turnstile"
replica_id = "replica-a"

[[agents]]
id = "scripted"
harness = "scripted"
workspace = "session"
snapshot_workspace = true
workspace_ignore = ["target/"]
approvals = ["Bash", "mcp__github__*"]
approval_timeout_s = 600
wait_on_usage_limit = true
max_usage_wait_s = 3600

[[agents]]
id = "claude"
harness = "claude-code"
permission_mode = "default"
max_turns = 3
max_budget_usd = 1.0
system_prompt = "be brief"
mcp_config = "./mcp.json"
env = { A = "b" }

[[agents]]
id = "codex"
harness = "codex"
base_url = "http://127.0.0.1:9/v1"
codex_config = { model_reasoning_effort = "low" }
env = { A = "b" }
"#,
    )
    .unwrap();
    turnstile_in_ok(
        dir.path(),
        &["serve", "--config", "all.toml", "--print-config"],
    )
}

/// Every key of every table of the configuration, as `--print-config` prints it for a
/// file that sets every optional key, is documented in `docs/CONFIG.md`.
#[test]
fn every_configuration_key_is_documented_17() {
    let printed = printed_with_every_key();
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIG.md"),
    )
    .unwrap();
    let mut missing = Vec::new();
    let mut keys = 0;
    for line in printed.lines() {
        let Some((key, _)) = line.split_once(" = ") else {
            continue;
        };
        let key = key.trim();
        // Keys inside an `env` or `codex_config` table are the user's own.
        if key.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            || key == "model_reasoning_effort"
        {
            continue;
        }
        keys += 1;
        if !doc.contains(&format!("`{key}`")) {
            missing.push(key.to_owned());
        }
    }
    assert!(
        printed.contains("postgres://turnstile:<masked>@127.0.0.1:9/turnstile")
            && !printed.contains("secret"),
        "the database password is masked: {printed}"
    );
    for table in ["[server]", "[journal]", "[[agents]]", "env", "codex_config"] {
        if !doc.contains(table) {
            missing.push(table.to_owned());
        }
    }
    assert!(keys > 30, "{printed}");
    assert!(missing.is_empty(), "not in docs/CONFIG.md: {missing:?}");
}

/// Issue 17, item 8: messages that say what to do.
#[tokio::test]
async fn messages_say_what_to_do_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = http_client();
    // An unknown agent lists the configured ones.
    let unknown = client
        .post(server.url("/agents/claude/runs"))
        .form(&[("message", "hi")])
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let body: Value = unknown.json().await.unwrap();
    assert_eq!(
        body["detail"],
        "Agent claude not found: the configured agents are scripted"
    );
    // JSON sent as a form (curl -d '{…}') says which content types are accepted.
    let json_as_form = client
        .post(server.url("/agents/scripted/runs"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(r#"{"message": "hi", "stream": false}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(json_as_form.status(), 400);
    let body: Value = json_as_form.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("Content-Type: application/json"),
        "{detail}"
    );
    assert!(detail.contains("multipart/form-data"), "{detail}");
    // A bad status names the valid ones.
    let status = client
        .get(server.url("/agents/scripted/runs?status=done"))
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 422);
    let body: Value = status.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("pending, running, paused, completed, error, cancelled"),
        "{body}"
    );

    // The port in use: refused, and no data directory is left behind.
    let port = server.base.rsplit(':').next().unwrap().to_owned();
    let other = tempfile::tempdir().unwrap();
    let data_dir = other.path().join("data");
    let busy = turnstile(&[
        "serve",
        "--addr",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        data_dir.to_str().unwrap(),
    ]);
    assert_eq!(busy.status.code(), Some(2));
    assert!(
        lossy(&busy.stderr).contains("cannot listen on"),
        "{}",
        lossy(&busy.stderr)
    );
    assert!(
        !data_dir.exists(),
        "a refused start left {}",
        data_dir.display()
    );
    server.terminate();

    // A missing configuration file: the OS error once.
    let missing = turnstile(&["serve", "--config", "/nonexistent/turnstile.toml"]);
    let stderr = lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2));
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );

    // Import into a directory that holds a journal: no "line 0".
    let export = other.path().join("e.jsonl");
    turnstile_tests::turnstile_ok(&[
        "journal",
        "export",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
    ]);
    let again = turnstile(&[
        "journal",
        "import",
        "--in",
        export.to_str().unwrap(),
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    let stdout = lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(1));
    assert!(!stdout.contains("line 0"), "{stdout}");
    assert!(stdout.contains("holds a journal already"), "{stdout}");
}

/// `journal timeline --run` takes a unique prefix of one of the session's runs, and
/// refuses, listing them, an id that is not one (it printed an empty account).
#[tokio::test]
async fn timeline_run_takes_a_unique_prefix_and_refuses_another_sessions_run_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut ids = Vec::new();
    for (session, message) in [
        ("a", "/reply one"),
        ("a", "/reply two"),
        ("b", "/reply three"),
    ] {
        let run: Value = post_form(
            &server,
            "/agents/scripted/runs",
            &[
                ("message", message),
                ("stream", "false"),
                ("session_id", session),
            ],
        )
        .await
        .json()
        .await
        .unwrap();
        ids.push(run["run_id"].as_str().unwrap().to_owned());
    }
    server.terminate();
    let data_dir = dir.path().to_str().unwrap();
    let timeline = |run: &str| {
        turnstile(&[
            "journal",
            "timeline",
            "--session",
            "a",
            "--run",
            run,
            "--data-dir",
            data_dir,
        ])
    };
    // The whole id, and the shortest prefix that only it has.
    let whole = timeline(&ids[1]);
    assert!(whole.status.success(), "{}", lossy(&whole.stderr));
    let prefix_len = (1..=ids[1].len())
        .find(|&n| !ids[0].starts_with(&ids[1][..n]))
        .unwrap();
    let short = timeline(&ids[1][..prefix_len]);
    assert!(short.status.success(), "{}", lossy(&short.stderr));
    assert_eq!(lossy(&short.stdout), lossy(&whole.stdout));
    assert!(
        lossy(&whole.stdout).contains("two"),
        "{}",
        lossy(&whole.stdout)
    );
    // Another session's run: refused, listing this session's runs.
    let other = timeline(&ids[2]);
    assert_eq!(other.status.code(), Some(2));
    let stderr = lossy(&other.stderr);
    assert!(stderr.contains("no run of session a"), "{stderr}");
    assert!(
        stderr.contains(&ids[0]) && stderr.contains(&ids[1]),
        "{stderr}"
    );
    // A prefix both runs of `a` share (UUIDv7s of one millisecond share many digits).
    let common = (0..ids[0].len())
        .take_while(|&n| ids[0].as_bytes()[n] == ids[1].as_bytes()[n])
        .count();
    if common > 0 {
        let both = timeline(&ids[0][..common]);
        assert_eq!(both.status.code(), Some(2));
        assert!(
            lossy(&both.stderr).contains("2 runs of session a start with it"),
            "{}",
            lossy(&both.stderr)
        );
    }
}

/// Long audit work shows a bar with the total and the time left on a terminal (a
/// pseudo-terminal from util-linux's `script`), and nothing extra when piped.
#[tokio::test]
async fn audit_progress_is_a_bar_with_a_total_on_a_terminal_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    for n in 0..3 {
        let done = post_form(
            &server,
            "/agents/scripted/runs",
            &[
                ("message", "hi"),
                ("stream", "false"),
                ("session_id", &format!("p{n}")),
            ],
        )
        .await;
        assert_eq!(done.status(), 200);
    }
    server.terminate();
    let data_dir = dir.path().to_str().unwrap();
    let command = format!(
        "{} journal verify --data-dir {data_dir}",
        turnstile_tests::turnstile_bin().display()
    );
    let on_terminal = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("util-linux's script");
    let shown = lossy(&on_terminal.stdout);
    assert!(on_terminal.status.success(), "{shown}");
    let events = shown
        .split("journal ok: 3 streams, ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{shown}"))
        .to_owned();
    assert!(shown.contains(&format!("/{events} records")), "{shown}");
    assert!(shown.contains(" left"), "{shown}");
    // A whole number of records a second, not `539,676.1783/s`.
    let rate = shown
        .split(" records, ")
        .nth(1)
        .unwrap()
        .split("/s")
        .next()
        .unwrap();
    assert!(rate.chars().all(|c| c.is_ascii_digit()), "{shown}");
    let piped = turnstile(&["journal", "verify", "--data-dir", data_dir]);
    assert_eq!(
        lossy(&piped.stdout).lines().count(),
        1,
        "{}",
        lossy(&piped.stdout)
    );
}

/// Issue 32: the other way round, every key, flag and scripted directive that
/// `docs/CONFIG.md` documents exists: a key is printed by `--print-config` (for a file
/// that sets every optional key), a flag is in `serve --help`, and a directive is one the
/// scripted harness lists when it refuses an unknown one, and every one it lists is
/// documented.
#[tokio::test]
async fn every_documented_key_flag_and_directive_exists_32() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIG.md"),
    )
    .unwrap();
    // A table row's first cell, when it is one backticked name.
    let first_cells: Vec<&str> = doc
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(name, _)| name))
        .collect();
    let printed = printed_with_every_key();
    let printed_keys: Vec<&str> = printed
        .lines()
        .filter_map(|line| line.split_once(" = ").map(|(key, _)| key.trim()))
        .collect();
    let help = lossy(&turnstile(&["serve", "--help"]).stdout);
    let mut missing = Vec::new();
    let (mut keys, mut flags, mut documented_directives) = (0, 0, Vec::new());
    for cell in &first_cells {
        if let Some(flag) = cell.strip_prefix("--") {
            flags += 1;
            let flag = flag.split(' ').next().unwrap();
            if !help.contains(&format!("--{flag}")) {
                missing.push(format!("flag --{flag}"));
            }
        } else if let Some(directive) = cell.strip_prefix('/') {
            documented_directives.push(directive.split(' ').next().unwrap().to_owned());
        } else if cell.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            keys += 1;
            // A table-valued key (`env`, `codex_config`) prints as its own table.
            if !printed_keys.contains(cell) && !printed.contains(&format!(".{cell}]")) {
                missing.push(format!("key {cell}"));
            }
        }
    }
    assert!(keys > 40 && flags >= 6, "{first_cells:?}");
    assert!(
        missing.is_empty(),
        "documented but not there: {missing:?}\n{printed}\n{help}"
    );

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let refused = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "/nosuch"), ("stream", "false")],
    )
    .await;
    assert_eq!(refused.status().as_u16(), 422);
    let detail = refused.json::<Value>().await.unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    let known: Vec<String> = detail
        .split_once("knows ")
        .unwrap_or_else(|| panic!("{detail}"))
        .1
        .trim_end_matches(')')
        .split(", ")
        .map(|name| name.trim_start_matches('/').to_owned())
        .collect();
    documented_directives.sort();
    documented_directives.dedup();
    let mut known_sorted = known.clone();
    known_sorted.sort();
    assert_eq!(
        documented_directives, known_sorted,
        "docs/CONFIG.md's directives against the harness's ({detail})"
    );
}
