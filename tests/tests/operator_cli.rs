//! Issue 17, item 1, on the real binary: `turnstile sessions` and `turnstile runs`
//! against a running server (tables by default, the server's JSON with `--json`), the
//! address from `--url` or the configuration, the API key from the configured variable,
//! `runs tail` following a live run by index, `runs cancel` and `runs continue`.

use std::time::Duration;

use serde_json::Value;
use turnstile_tests::{Server, free_port, lossy, post_form, turnstile_env as cli, wait_until};

fn ok(args: &[&str]) -> String {
    let out = cli(args, &[]);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        lossy(&out.stdout),
        lossy(&out.stderr)
    );
    lossy(&out.stdout)
}

async fn run(server: &Server, session: &str, message: &str) -> Value {
    post_form(
        server,
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
    .unwrap()
}

#[tokio::test]
async fn sessions_and_runs_are_listed_and_shown_as_tables_or_json_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let first = run(
        &server,
        "alpha",
        "/tool Read {\"path\":\"a\"}\n/reply first answer",
    )
    .await;
    let second = run(&server, "beta", "second question").await;
    let url = server.base.clone();

    let table = ok(&["sessions", "list", "--url", &url]);
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    for column in ["SESSION", "AGENT", "USER", "TOKENS", "UPDATED", "NAME"] {
        assert!(header.contains(column), "{table}");
    }
    assert!(table.contains("alpha") && table.contains("beta"), "{table}");
    assert!(table.contains("page 1 of 1 (2 sessions)"), "{table}");
    let json: Value =
        serde_json::from_str(&ok(&["sessions", "list", "--url", &url, "--json"])).unwrap();
    assert_eq!(json["meta"]["total_count"], 2);
    let paged = ok(&[
        "sessions", "list", "--url", &url, "--limit", "1", "--page", "2",
    ]);
    assert!(paged.contains("page 2 of 2 (2 sessions)"), "{paged}");

    let shown = ok(&["sessions", "show", "alpha", "--url", &url]);
    assert!(shown.contains("session   alpha"), "{shown}");
    assert!(shown.contains("agent     scripted"), "{shown}");
    assert!(shown.contains(first["run_id"].as_str().unwrap()), "{shown}");
    assert!(shown.contains("COMPLETED"), "{shown}");

    // The server's only agent is the default; newest first.
    let runs = ok(&["runs", "list", "--url", &url]);
    let second_at = runs.find(second["run_id"].as_str().unwrap()).unwrap();
    let first_at = runs.find(first["run_id"].as_str().unwrap()).unwrap();
    assert!(second_at < first_at, "{runs}");
    assert!(runs.contains("(2 runs of scripted)"), "{runs}");
    let of_alpha = ok(&[
        "runs",
        "list",
        "--url",
        &url,
        "--session",
        "alpha",
        "--json",
    ]);
    let of_alpha: Value = serde_json::from_str(&of_alpha).unwrap();
    assert_eq!(of_alpha["meta"]["total_count"], 1);

    let first_id = first["run_id"].as_str().unwrap();
    let one = ok(&["runs", "show", first_id, "--url", &url]);
    assert!(one.contains("status    COMPLETED"), "{one}");
    assert!(one.contains("tools     1"), "{one}");
    assert!(one.contains("content   first answer"), "{one}");
    let one: Value =
        serde_json::from_str(&ok(&["runs", "show", first_id, "--url", &url, "--json"])).unwrap();
    assert_eq!(one["run_id"], first["run_id"]);

    // Refusals say what the server said and exit 1; no server at all exits 2.
    let missing = cli(&["runs", "show", "no-such-run", "--url", &url], &[]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        lossy(&missing.stderr).contains("(HTTP 404)"),
        "{}",
        lossy(&missing.stderr)
    );
    let unknown = cli(&["sessions", "show", "gamma", "--url", &url], &[]);
    assert_eq!(unknown.status.code(), Some(1));
    let nobody = cli(&["runs", "list", "--url", "http://127.0.0.1:9"], &[]);
    assert_eq!(nobody.status.code(), Some(2));
    assert!(
        lossy(&nobody.stderr).contains("cannot reach the server"),
        "{}",
        lossy(&nobody.stderr)
    );
}

#[tokio::test]
async fn the_address_and_the_key_come_from_the_configuration_17() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("t.toml");
    std::fs::write(
        &config,
        format!("[server]\naddr = \"127.0.0.1:{port}\"\napi_key_env = \"MY_KEY\"\n"),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let addr = format!("127.0.0.1:{port}");
    let server = Server::start_with_env(
        dir.path(),
        &["--config", config, "--addr", &addr],
        &[("MY_KEY", "s3cret")],
    );
    let done = turnstile_tests::http_client()
        .post(server.url("/agents/scripted/runs"))
        .bearer_auth("s3cret")
        .form(&[("message", "hi"), ("stream", "false"), ("session_id", "k")])
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    // No --url: the configured address. No key: refused, saying so.
    let refused = cli(&["sessions", "list", "--config", config], &[]);
    assert_eq!(refused.status.code(), Some(1), "{}", lossy(&refused.stderr));
    assert!(
        lossy(&refused.stderr).contains("(HTTP 401)"),
        "{}",
        lossy(&refused.stderr)
    );
    let listed = cli(
        &["sessions", "list", "--config", config],
        &[("MY_KEY", "s3cret")],
    );
    assert!(listed.status.success(), "{}", lossy(&listed.stderr));
    assert!(
        lossy(&listed.stdout).contains("page 1 of 1 (1 sessions)"),
        "{}",
        lossy(&listed.stdout)
    );
}

#[tokio::test]
async fn tail_follows_a_live_run_to_its_end_and_cancel_and_continue_work_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.base.clone();
    let live: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/tool Read {}\n/sleep 1500\n/reply all done"),
            ("background", "true"),
            ("stream", "false"),
            ("session_id", "live"),
        ],
    )
    .await
    .json()
    .await
    .unwrap();
    let live_id = live["run_id"].as_str().unwrap().to_owned();
    // Started while the run sleeps; it returns once the run has ended.
    let started = std::time::Instant::now();
    let tail = ok(&["runs", "tail", &live_id, "--url", &url]);
    assert!(started.elapsed() >= Duration::from_millis(500), "{tail}");
    let kinds: Vec<&str> = tail
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect();
    assert_eq!(kinds.first(), Some(&"catch_up"), "{tail}");
    assert!(kinds.contains(&"ToolCallCompleted"), "{tail}");
    assert_eq!(kinds.last(), Some(&"RunCompleted"), "{tail}");
    // Each event once, by index.
    let indexes: Vec<u64> = tail
        .lines()
        .filter_map(|line| line.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(
        indexes,
        (0..indexes.len() as u64).collect::<Vec<_>>(),
        "{tail}"
    );
    // After an index, a finished run replays the rest only.
    let rest = ok(&[
        "runs", "tail", &live_id, "--url", &url, "--after", "2", "--json",
    ]);
    let events: Vec<Value> = rest
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(
        events
            .iter()
            .all(|e| e["event_index"].as_u64().is_none_or(|i| i > 2)),
        "{rest}"
    );
    assert_eq!(events.last().unwrap()["event"], "RunCompleted", "{rest}");

    // Continue from the checkpoint after the tool's result: a new run, forked there.
    let continued = ok(&[
        "runs", "continue", &live_id, "--from", "3", "--input", "again", "--url", &url,
    ]);
    assert!(continued.contains("status    COMPLETED"), "{continued}");
    assert!(
        continued.contains(&format!("forked    from {live_id} at message 3")),
        "{continued}"
    );

    // Cancel a long run: it ends CANCELLED.
    let long: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/sleep 60000"),
            ("background", "true"),
            ("stream", "false"),
            ("session_id", "long"),
        ],
    )
    .await
    .json()
    .await
    .unwrap();
    let long_id = long["run_id"].as_str().unwrap().to_owned();
    let cancelled = ok(&["runs", "cancel", &long_id, "--url", &url]);
    assert!(
        cancelled.contains(&format!("run {long_id} cancelled"))
            || cancelled.contains(&format!("cancel of {long_id} recorded; the run is")),
        "{cancelled}"
    );
    wait_until("the run is cancelled", Duration::from_secs(10), || {
        ok(&["runs", "show", &long_id, "--url", &url]).contains("status    CANCELLED")
    });
}
