//! Approvals that wait durably (issue 30, spec `approvals.md`): a tool call that matches
//! the agent's `approvals` pauses its run before it runs; `continue` with `tools`
//! confirms or denies it, and the same run goes on (same `run_id`, event indices
//! continued), its confirmed calls run once, its denied ones never. The real binary
//! with the scripted harness, started as a user starts it (relative paths from its
//! configuration), restarted and killed while paused.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use turnstile_tests::{Server, event_types, http_client, parse_sse, turnstile_in};

fn config(dir: &Path, extra: &str) {
    std::fs::write(
        dir.join("turnstile.toml"),
        format!(
            "[server]\ndata_dir = \"./data\"\n\n[[agents]]\nid = \"coder\"\nharness = \"scripted\"\ncwd = \"./work\"\napprovals = [\"Bash\", \"Wri*\"]\n{extra}"
        ),
    )
    .unwrap();
}

fn start(dir: &Path) -> Server {
    Server::start_in(dir, &["--config", "turnstile.toml"])
}

async fn post(server: &Server, path: &str, form: &[(&str, &str)]) -> (u16, Value) {
    let response = http_client()
        .post(server.url(path))
        .form(form)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn turn(server: &Server, session: &str, message: &str) -> Value {
    let (status, run) = post(
        server,
        "/agents/coder/runs",
        &[
            ("message", message),
            ("session_id", session),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{run}");
    run
}

async fn get(server: &Server, path: &str) -> Value {
    let response = http_client().get(server.url(path)).send().await.unwrap();
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.unwrap()
}

/// The run's tools sent back with each pending call decided (`confirmed`, `note`).
fn decided(run: &Value, decide: &[(bool, Option<&str>)]) -> String {
    let mut tools = run["tools"].as_array().unwrap().clone();
    let mut decisions = decide.iter();
    for tool in &mut tools {
        if tool["requires_confirmation"] == true && tool["confirmed"].is_null() {
            let (confirmed, note) = decisions.next().expect("a decision per pending call");
            tool["confirmed"] = json!(confirmed);
            if let Some(note) = note {
                tool["confirmation_note"] = json!(note);
            }
        }
    }
    Value::Array(tools).to_string()
}

async fn decide(server: &Server, run: &Value, tools: &str, stream: bool) -> (u16, Value) {
    let path = format!(
        "/agents/coder/runs/{}/continue",
        run["run_id"].as_str().unwrap()
    );
    let stream = if stream { "true" } else { "false" };
    post(
        server,
        &path,
        &[
            ("tools", tools),
            ("session_id", run["session_id"].as_str().unwrap()),
            ("stream", stream),
        ],
    )
    .await
}

fn verify(dir: &Path) {
    let out = turnstile_in(dir, &["journal", "verify", "--config", "turnstile.toml"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_confirmed_call_runs_once_and_a_denied_one_never_30() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    let run = turn(
        &server,
        "s1",
        "/write a.txt first\n/tool Read {}\n/write b.txt second\nfiles written",
    )
    .await;
    // The first call waits: nothing ran, the file does not exist.
    assert_eq!(run["status"], "PAUSED", "{run}");
    assert!(!dir.path().join("work/a.txt").exists());
    let pending = &run["requirements"][0]["tool_execution"];
    assert_eq!(pending["tool_name"], "Write", "{run}");
    assert_eq!(pending["requires_confirmation"], true);
    assert_eq!(run["tools"][0]["requires_confirmation"], true, "{run}");

    // Confirmed: it runs, the turn goes on to the next matching call and pauses again.
    let (status, again) = decide(&server, &run, &decided(&run, &[(true, None)]), false).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["run_id"], run["run_id"]);
    assert_eq!(again["status"], "PAUSED", "{again}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("work/a.txt")).unwrap(),
        "first"
    );
    assert_eq!(again["tools"][1]["tool_name"], "Read", "{again}");
    assert_eq!(again["tools"][1]["result"], "ok:Read", "{again}");

    // Denied, with a note: it never runs, and the model is told.
    let (status, done) = decide(
        &server,
        &again,
        &decided(&again, &[(false, Some("not b"))]),
        false,
    )
    .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["content"], "echo: files written");
    assert!(!dir.path().join("work/b.txt").exists());
    let tools = done["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 3, "{done}");
    assert_eq!(tools[0]["confirmed"], true);
    assert_eq!(tools[2]["confirmed"], false);
    assert_eq!(tools[2]["confirmation_note"], "not b");
    assert_eq!(tools[2]["tool_call_error"], true);
    assert!(
        tools[2]["result"].as_str().unwrap().contains("not b"),
        "{done}"
    );

    // One run, its events contiguous from 0, the pauses and continues among them.
    let path = format!(
        "/agents/coder/runs/{}/resume",
        run["run_id"].as_str().unwrap()
    );
    let body = http_client()
        .post(server.url(&path))
        .form(&[("session_id", "s1")])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let frames = parse_sse(&body);
    let types = event_types(&frames);
    assert_eq!(
        types.iter().filter(|kind| **kind == "RunPaused").count(),
        2,
        "{types:?}"
    );
    assert_eq!(
        types.iter().filter(|kind| **kind == "RunContinued").count(),
        2,
        "{types:?}"
    );
    assert_eq!(types.last(), Some(&"RunCompleted"), "{types:?}");
    let indices: Vec<u64> = frames
        .iter()
        .filter_map(|frame| frame.id.as_deref()?.parse().ok())
        .collect();
    assert_eq!(indices, (0..indices.len() as u64).collect::<Vec<_>>());
    let runs = get(&server, "/sessions/s1/runs").await;
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    server.terminate();
    verify(dir.path());
    let _ = Duration::ZERO;
}
