//! Issue 32 (the first hour of a new user), on the real binary: the rough edges a
//! newcomer hit, each fixed with a check that failed before. Items: 2 (`output_schema`
//! `null`, in `http_structured.rs`), 3 (`GET /`), 4 (`--version` and `--help`), 5
//! (request log lines with fields), 6 (a config error in `[[agents]]` names its line and
//! key), 7 (a negative `last_event_index`), 8 (a message of only whitespace), 9 (the
//! message's bound is a documented key), 10 (`/big BYTES` as `docs/CONFIG.md` documents
//! it), 11 (a message the scripted harness cannot run is refused before anything is
//! recorded), 12 (what `runs cancel` says), 13 (the CLI's `401` names the key's
//! variable), 14 (a run resumed after a restart says it was retried), 15 (exhausted
//! retries say the last failure once), 18 (protocol refusals are JSON), 19 (the installed
//! binary carries no debug info). Elsewhere: 1 (Codex's `input_tokens`, `codex.rs`), 16
//! (the console, `console.rs`), 17 (silent connections make room, `http_slowloris.rs`),
//! the README's "Operating it" (`readme_examples.rs`), documented keys, flags and
//! directives exist (`operator.rs`).

use serde_json::Value;
use turnstile_tests::{Server, http_client, lossy, post_form, turnstile_env as cli, write_config};

#[tokio::test]
async fn the_root_redirects_to_the_console_without_a_key_32() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with_env(dir.path(), &[], &[("TURNSTILE_API_KEY", "k")]);
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let response = client.get(server.url("/")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 307);
    assert_eq!(response.headers()["location"], "/ui");
    let page = http_client().get(server.url("/")).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.text().await.unwrap().contains("<html"));
}

#[tokio::test]
async fn a_negative_index_and_a_blank_message_are_422_32() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    for message in ["   ", "\n\t \n"] {
        let response = post_form(
            &server,
            "/agents/scripted/runs",
            &[("message", message), ("stream", "false")],
        )
        .await;
        assert_eq!(response.status().as_u16(), 422, "{message:?}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["detail"].as_str().unwrap().contains("whitespace"),
            "{body}"
        );
    }
    let run: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "hello"), ("stream", "false")],
    )
    .await
    .json()
    .await
    .unwrap();
    let resume = format!(
        "/agents/scripted/runs/{}/resume",
        run["run_id"].as_str().unwrap()
    );
    let response = post_form(&server, &resume, &[("last_event_index", "-5")]).await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["detail"].as_str().unwrap().contains("0 or more"),
        "{body}"
    );
    let by_header = http_client()
        .post(server.url(&resume))
        .header("last-event-id", "-1")
        .send()
        .await
        .unwrap();
    assert_eq!(by_header.status().as_u16(), 422);
    let from_start = post_form(&server, &resume, &[]).await;
    assert_eq!(from_start.status().as_u16(), 200);
}

#[tokio::test]
async fn runs_cancel_says_what_happened_32() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.base.clone();
    let unknown = cli(&["runs", "cancel", "no-such-run", "--url", &url], &[]);
    assert_eq!(unknown.status.code(), Some(1), "{}", lossy(&unknown.stdout));
    assert!(
        lossy(&unknown.stderr).contains("run no-such-run not found"),
        "{}",
        lossy(&unknown.stderr)
    );
    let done: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "hello"), ("stream", "false")],
    )
    .await
    .json()
    .await
    .unwrap();
    let run_id = done["run_id"].as_str().unwrap();
    let finished = cli(&["runs", "cancel", run_id, "--url", &url], &[]);
    assert!(finished.status.success());
    assert!(
        lossy(&finished.stdout).contains(&format!(
            "run {run_id} had already ended (COMPLETED): nothing to cancel"
        )),
        "{}",
        lossy(&finished.stdout)
    );
}

#[tokio::test]
async fn the_clis_401_names_the_variable_it_reads_32() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with_env(dir.path(), &[], &[("TURNSTILE_API_KEY", "right")]);
    let url = server.base.clone();
    let unset = cli(&["sessions", "list", "--url", &url], &[]);
    assert_eq!(unset.status.code(), Some(1));
    let said = lossy(&unset.stderr);
    assert!(said.contains("TURNSTILE_API_KEY is not set"), "{said}");
    assert!(said.contains("export TURNSTILE_API_KEY="), "{said}");
    let wrong = cli(
        &["sessions", "list", "--url", &url],
        &[("TURNSTILE_API_KEY", "wrong")],
    );
    let said = lossy(&wrong.stderr);
    assert!(
        said.contains("the key in TURNSTILE_API_KEY is not the server's"),
        "{said}"
    );
}

#[tokio::test]
async fn the_documented_big_directive_makes_large_replies_and_results_32() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let run: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/tool Read {}\n/big 300000"),
            ("stream", "false"),
        ],
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(run["status"], "COMPLETED", "{}", run["content"]);
    assert_eq!(run["content"].as_str().unwrap().len(), 300_000);
    assert_eq!(run["tools"][0]["result"].as_str().unwrap().len(), 300_000);
    let documented = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIG.md"),
    )
    .unwrap();
    assert!(documented.contains("`/big BYTES`"));
}

#[tokio::test]
async fn a_message_the_scripted_harness_cannot_run_is_422_and_records_nothing_32() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let response = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "please look at\n/etc/hosts"),
            ("session_id", "never"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("line 2") && detail.contains("/etc/hosts"),
        "{detail}"
    );
    let session = http_client()
        .get(server.url("/sessions/never"))
        .send()
        .await
        .unwrap();
    assert_eq!(session.status().as_u16(), 404, "nothing was recorded");
}

#[test]
fn version_and_help_speak_to_a_user_32() {
    let version = cli(&["--version"], &[]);
    let version = lossy(&version.stdout);
    assert!(version.starts_with("turnstile "), "{version}");
    assert!(!version.contains("0.0.0"), "{version}");
    let help = cli(&["--help"], &[]);
    let help = lossy(&help.stdout);
    let first = help.lines().next().unwrap_or_default();
    assert!(first.contains("durable sessions"), "{first}");
    assert!(!help.contains("axum"), "{help}");
    assert!(help.contains("turnstile serve"), "{help}");
}

#[tokio::test]
async fn json_request_logs_carry_fields_32() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--log-format", "json"]);
    let run: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "hello"),
            ("session_id", "logged"),
            ("stream", "false"),
        ],
    )
    .await
    .json()
    .await
    .unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let read = http_client()
        .get(server.url(&format!("/agents/scripted/runs/{run_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status().as_u16(), 200);
    let logs = server.terminate_logs();
    let lines: Vec<Value> = logs
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "turnstile::http")
        .collect();
    let read_line = lines
        .iter()
        .find(|line| line["fields"]["run_id"] == run_id.as_str())
        .unwrap_or_else(|| panic!("no request line names the run: {logs:#?}"));
    let fields = &read_line["fields"];
    assert_eq!(fields["method"], "GET", "{read_line}");
    assert_eq!(
        fields["path"],
        format!("/agents/scripted/runs/{run_id}"),
        "{read_line}"
    );
    assert_eq!(fields["status"], 200, "{read_line}");
    assert!(fields["latency_ms"].is_number(), "{read_line}");
}

#[tokio::test]
async fn the_message_bound_is_a_documented_config_key_32() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "max_message_bytes = 100", "");
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let long = "x".repeat(101);
    let response = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", long.as_str()), ("stream", "false")],
    )
    .await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("server.max_message_bytes"),
        "{body}"
    );
    let fits = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "x".repeat(100).as_str()), ("stream", "false")],
    )
    .await;
    assert_eq!(fits.status().as_u16(), 200);
    let documented = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIG.md"),
    )
    .unwrap();
    assert!(documented.contains("`max_message_bytes`"));
}

#[tokio::test]
async fn a_run_resumed_after_a_restart_says_it_was_retried_32() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", "retries = 2\ndelay_between_retries_s = 0.0");
    let config = config.to_str().unwrap().to_owned();
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", &config]);
    let accepted: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/tool Read {}\n/sleep 60000"),
            ("background", "true"),
            ("stream", "false"),
            ("session_id", "resumed"),
        ],
    )
    .await
    .json()
    .await
    .unwrap();
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let path = format!("/agents/scripted/runs/{run_id}");
    // Polls the run until `done` says so.
    async fn until(server: &Server, path: &str, what: &str, done: impl Fn(&Value) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let run: Value = turnstile_tests::get_json(server, path).await;
            if done(&run) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: {run}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    until(&server, &path, "attempt 1 called its tool", |run| {
        run["tools"][0]["result"] == "ok:Read"
    })
    .await;
    server.kill();
    let server = Server::start_with(&data, &["--config", &config]);
    until(&server, &path, "attempt 2 runs", |run| {
        run["metadata"]["attempts"] == 2
    })
    .await;
    let run: Value = turnstile_tests::get_json(&server, &path).await;
    let warnings = run["metadata"]["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|warning| warning["type"] == "retry"
            && warning["attempt"] == 1
            && warning["attempts"] == 3
            && warning["error_type"] == "process_stopped"),
        "{run}"
    );
    let cancel = http_client()
        .post(server.url(&format!("{path}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status().as_u16(), 200);
}

#[test]
fn a_config_error_in_an_agent_names_its_line_and_key_32() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[[agents]]\nid = \"a\"\nharness = \"scripted\"\n\n[[agents]]\nid = \"b\"\nharness = \"scripted\"\nretires = 2\n",
            "line 8, key `retires`",
        ),
        (
            "[[agents]]\nid = \"a\"\nharness = \"gpt\"\n",
            "line 3, key `harness`",
        ),
    ];
    for (text, said) in cases {
        let config = dir.path().join("turnstile.toml");
        std::fs::write(&config, text).unwrap();
        let out = cli(
            &[
                "serve",
                "--config",
                config.to_str().unwrap(),
                "--print-config",
            ],
            &[],
        );
        assert!(!out.status.success());
        let stderr = lossy(&out.stderr);
        assert!(stderr.contains(said), "{stderr}");
        assert!(!stderr.contains("line 1, column 1"), "{stderr}");
    }
}

#[tokio::test]
async fn exhausted_retries_say_the_last_failure_once_with_the_attempt_count_32() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", "retries = 2\ndelay_between_retries_s = 0.0");
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let run: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "/fail transient 3"), ("stream", "false")],
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(run["status"], "ERROR", "{run}");
    assert_eq!(
        run["content"], "scripted transient failure (attempt 3 of 3 failing) (attempt 3 of 3)",
        "{run}"
    );
}

/// Item 19: the installed binary carries no debug info (128 MB with line tables, ~21 MB
/// without), while benches and the `profiling` profile keep the line tables `perf`
/// reads. Building a release binary here would cost minutes; the profiles decide it.
#[test]
fn the_installed_binary_carries_no_debug_info_but_profiling_builds_do_32() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(manifest).unwrap().parse().unwrap();
    let profile = |name: &str| manifest["profile"][name].as_table().unwrap().clone();
    let release = profile("release");
    assert_eq!(release["debug"].as_bool(), Some(false), "{release:?}");
    assert_eq!(release["strip"].as_str(), Some("debuginfo"), "{release:?}");
    for name in ["bench", "profiling"] {
        let profile = profile(name);
        assert_eq!(
            profile["debug"].as_str(),
            Some("line-tables-only"),
            "{name}"
        );
        assert_eq!(profile["strip"].as_str(), Some("none"), "{name}");
    }
    assert_eq!(profile("profiling")["inherits"].as_str(), Some("release"));
}

/// Item 18: requests hyper cannot parse are answered with JSON and a `detail`, as every
/// other error, and the server goes on serving.
#[test]
fn protocol_refusals_are_json_with_a_detail_32() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let addr = server.base.trim_start_matches("http://").to_owned();
    let ask = |request: &[u8]| {
        let mut stream = std::net::TcpStream::connect(&addr).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        // The server may answer and close before all of a huge request is sent.
        let _ = stream.write_all(request);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let long_url = format!(
        "GET /health?{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(100_000)
    );
    let many_headers = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..2000)
            .map(|n| format!("X-H{n}: v\r\n"))
            .collect::<String>()
    );
    let cases: [(&[u8], &str); 4] = [
        (long_url.as_bytes(), "414"),
        (many_headers.as_bytes(), "431"),
        (b"HELLO THERE\r\n\r\n", "400"),
        (
            b"POST /agents/scripted/runs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello",
            "400",
        ),
    ];
    for (request, status) in cases {
        let answer = ask(request);
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "{status}: {head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{head}"
        );
        let body: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{answer}"));
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{body}"
        );
    }
    let health = ask(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(health.starts_with("HTTP/1.1 200 "), "{health}");
}
