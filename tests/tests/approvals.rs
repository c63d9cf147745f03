//! Approvals that wait durably (issue 30, spec `approvals.md`): a tool call that matches
//! the agent's `approvals` pauses its run before it runs; `continue` with `tools`
//! confirms or denies it, and the same run goes on (same `run_id`, event indices
//! continued), its confirmed calls run once, its denied ones never. The real binary
//! with the scripted harness, started as a user starts it (relative paths from its
//! configuration), restarted and killed while paused.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use turnstile_tests::{Server, event_types, http_client, parse_sse, turnstile_in, verify_journal};

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

/// The run at `path` once `done` holds of it (asked again for up to 5 s), or as it is
/// then.
async fn until(server: &Server, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let run = get(server, path).await;
        if done(&run) || std::time::Instant::now() >= deadline {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts a background run (`202`): its run id and session.
async fn background(server: &Server, session: &str, message: &str) -> Value {
    let (status, accepted) = post(
        server,
        "/agents/coder/runs",
        &[
            ("message", message),
            ("session_id", session),
            ("stream", "false"),
            ("background", "true"),
        ],
    )
    .await;
    assert_eq!(status, 202, "{accepted}");
    accepted
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
    verify_journal(dir.path());
}

/// The number of client-visible events the run has journaled (`/resume`'s replay).
async fn event_count(server: &Server, run: &Value) -> usize {
    let path = format!(
        "/agents/coder/runs/{}/resume",
        run["run_id"].as_str().unwrap()
    );
    let body = http_client()
        .post(server.url(&path))
        .form(&[("session_id", run["session_id"].as_str().unwrap())])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    parse_sse(&body)
        .iter()
        .filter(|frame| frame.id.is_some())
        .count()
}

#[tokio::test]
async fn refused_decisions_record_nothing_and_the_session_stays_busy_30() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    let run = turn(
        &server,
        "s1",
        "/tool Bash {\"command\":\"make\"}\n/tool Bash {\"command\":\"make install\"}\nbuilt",
    )
    .await;
    assert_eq!(run["status"], "PAUSED", "{run}");
    let run_id = run["run_id"].as_str().unwrap();
    let events = event_count(&server, &run).await;

    // Another turn: the session is busy with the paused run.
    let (status, busy) = post(
        &server,
        "/agents/coder/runs",
        &[("message", "hi"), ("session_id", "s1"), ("stream", "false")],
    )
    .await;
    assert_eq!(status, 409, "{busy}");
    assert_eq!(busy["error_type"], "session_busy", "{busy}");
    assert!(busy["detail"].as_str().unwrap().contains(run_id), "{busy}");

    // Every refusal names what is wrong, and records nothing.
    let call = run["tools"][0]["tool_call_id"].as_str().unwrap().to_owned();
    let cases: Vec<(String, u16, &str)> = vec![
        ("not json".into(), 422, "not JSON"),
        ("{\"a\": 1}".into(), 422, "array"),
        ("[{\"confirmed\": true}]".into(), 422, "tool_call_id"),
        (
            json!([{"tool_call_id": call, "confirmed": "yes"}]).to_string(),
            422,
            "true or false",
        ),
        (
            json!([{"tool_call_id": "call_other", "confirmed": true}]).to_string(),
            422,
            "call_other",
        ),
        (
            json!([{"tool_call_id": call, "confirmed": null}]).to_string(),
            422,
            "undecided",
        ),
        (
            json!([{"tool_call_id": call, "confirmed": true}, {"tool_call_id": call, "confirmed": false}]).to_string(),
            422,
            "twice",
        ),
    ];
    for (tools, expected, says) in cases {
        let (status, answer) = decide(&server, &run, &tools, false).await;
        assert_eq!(status, expected, "{tools}: {answer}");
        assert!(
            answer["detail"].as_str().unwrap_or_default().contains(says),
            "{tools}: {answer}"
        );
    }
    // With continue_from, tools are refused; without tools, a paused run is not continued.
    let path = format!("/agents/coder/runs/{run_id}/continue");
    let tools = decided(&run, &[(true, None)]);
    let (status, answer) = post(
        &server,
        &path,
        &[
            ("tools", tools.as_str()),
            ("continue_from", "end"),
            ("session_id", "s1"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(status, 422, "{answer}");
    let (status, answer) = post(&server, &path, &[("session_id", "s1"), ("stream", "false")]).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(event_count(&server, &run).await, events);
    let still = get(&server, &format!("/agents/coder/runs/{run_id}")).await;
    assert_eq!(still["status"], "PAUSED", "{still}");

    // Decided: the second call pauses the same run again; cancelled, it ends at once.
    let (status, again) = decide(&server, &run, &tools, false).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["status"], "PAUSED", "{again}");
    let cancel = http_client()
        .post(server.url(&format!("/agents/coder/runs/{run_id}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 200);
    let ended = get(&server, &format!("/agents/coder/runs/{run_id}")).await;
    assert_eq!(ended["status"], "CANCELLED", "{ended}");
    // A run that is not paused takes no decision.
    let (status, answer) = decide(&server, &again, &decided(&again, &[(true, None)]), false).await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error_type"], "run_not_paused", "{answer}");
    // The session is free again.
    let next = turn(&server, "s1", "hello").await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
    server.terminate();
    verify_journal(dir.path());
}

#[tokio::test]
async fn streams_stop_at_the_pause_and_go_on_from_the_decision_30() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    let body = http_client()
        .post(server.url("/agents/coder/runs"))
        .form(&[
            (
                "message",
                "/tool Read {}\n/tool Bash {\"command\":\"ls\"}\nlisted",
            ),
            ("session_id", "s1"),
            ("stream", "true"),
        ])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let frames = parse_sse(&body);
    let paused = frames.last().unwrap();
    assert_eq!(paused.event, "RunPaused", "{body}");
    assert_eq!(paused.data["tools"][0]["tool_name"], "Bash");
    assert_eq!(paused.data["tools"][0]["requires_confirmation"], true);
    let requirement = &paused.data["requirements"][0];
    assert_eq!(
        requirement["id"], paused.data["tools"][0]["tool_call_id"],
        "{requirement}"
    );
    assert_eq!(requirement["tool_execution"]["tool_name"], "Bash");
    let run_id = paused.data["run_id"].as_str().unwrap().to_owned();
    let run = get(&server, &format!("/agents/coder/runs/{run_id}")).await;
    assert_eq!(run["status"], "PAUSED");
    assert_eq!(run["requirements"], paused.data["requirements"], "{run}");
    let session_runs = get(&server, "/sessions/s1/runs").await;
    assert_eq!(session_runs[0]["status"], "PAUSED", "{session_runs}");
    let paused_runs = get(&server, "/agents/coder/runs?status=paused").await;
    assert_eq!(paused_runs["meta"]["total_count"], 1, "{paused_runs}");

    // The pending call across sessions.
    let approvals = get(&server, "/approvals").await;
    assert_eq!(approvals["meta"]["total_count"], 1, "{approvals}");
    assert_eq!(approvals["data"][0]["run_id"], run_id.as_str());
    assert_eq!(approvals["data"][0]["tool_name"], "Bash");
    assert_eq!(approvals["data"][0]["tool_args"]["command"], "ls");
    let other = get(&server, "/approvals?session_id=s2").await;
    assert_eq!(other["meta"]["total_count"], 0, "{other}");

    // The continue's stream starts with RunContinued, its indices going on.
    let response = http_client()
        .post(server.url(&format!("/agents/coder/runs/{run_id}/continue")))
        .form(&[
            ("tools", decided(&run, &[(true, None)]).as_str()),
            ("session_id", "s1"),
            ("stream", "true"),
            ("background", "true"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let frames = parse_sse(&response.text().await.unwrap());
    let kinds = event_types(&frames);
    assert_eq!(kinds.first(), Some(&"RunContinued"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"RunCompleted"), "{kinds:?}");
    let first_index = frames[0].data["event_index"].as_u64().unwrap();
    assert_eq!(
        first_index,
        paused
            .id
            .as_deref()
            .map_or_else(|| frames_before(&body), |id| id.parse::<u64>().unwrap() + 1),
        "{kinds:?}"
    );
    let approvals = get(&server, "/approvals").await;
    assert_eq!(approvals["meta"]["total_count"], 0, "{approvals}");
    server.terminate();
    verify_journal(dir.path());
}

/// The events of an inline stream (no ids): the next index is their count.
fn frames_before(body: &str) -> u64 {
    parse_sse(body).len() as u64
}

#[tokio::test]
async fn a_decision_after_a_sigkill_goes_on_and_nothing_before_the_pause_runs_again_30() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    let accepted = background(&server, "s1", "/tool Read {}\n/ls\n/tool Grep {}\nlisted").await;
    let path = format!(
        "/agents/coder/runs/{}",
        accepted["run_id"].as_str().unwrap()
    );
    let run = until(&server, &path, |run| run["status"] == "PAUSED").await;
    assert_eq!(run["status"], "PAUSED", "{run}");
    server.kill();

    // Killed while paused: after the restart the run is still paused, and no attempt
    // was spent on it.
    let server = start(dir.path());
    let still = get(&server, &path).await;
    assert_eq!(still["status"], "PAUSED", "{still}");
    assert_eq!(still["requirements"], run["requirements"]);
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::write(dir.path().join("work/marker.txt"), "made after the pause").unwrap();
    let (status, done) = decide(&server, &still, &decided(&still, &[(true, None)]), false).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let names: Vec<&str> = done["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["tool_name"].as_str().unwrap())
        .collect();
    // Read ran before the pause, once; ls ran after it, and saw the marker.
    assert_eq!(names, ["Read", "Bash", "Grep"], "{done}");
    assert!(
        done["tools"][1]["result"]
            .as_str()
            .unwrap()
            .contains("marker.txt"),
        "{done}"
    );
    assert_eq!(done["metadata"]["warnings"], json!([]), "{done}");
    server.terminate();
    verify_journal(dir.path());
}

#[tokio::test]
async fn an_undecided_call_times_out_denied_even_across_a_restart_30() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "approval_timeout_s = 1\n");
    let server = start(dir.path());
    let run = turn(&server, "s1", "/ls\nlisted").await;
    assert_eq!(run["status"], "PAUSED", "{run}");
    let path = format!("/agents/coder/runs/{}", run["run_id"].as_str().unwrap());
    let done = until(&server, &path, |done| done["status"] == "COMPLETED").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["tools"][0]["confirmed"], false, "{done}");
    assert_eq!(done["tools"][0]["confirmation_note"], "timed out", "{done}");

    // Stopped while paused: the timeout is the journal's, and fires after the restart.
    let second = turn(&server, "s2", "/ls\nlisted").await;
    assert_eq!(second["status"], "PAUSED", "{second}");
    server.terminate();
    std::thread::sleep(Duration::from_millis(1_200));
    let server = start(dir.path());
    let path = format!("/agents/coder/runs/{}", second["run_id"].as_str().unwrap());
    let done = until(&server, &path, |done| done["status"] == "COMPLETED").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["tools"][0]["confirmation_note"], "timed out", "{done}");
    server.terminate();
    verify_journal(dir.path());
}

#[tokio::test]
async fn operators_approve_and_deny_from_the_command_line_30() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    let run = turn(&server, "s1", "/ls\n/write x.txt no\nlisted").await;
    assert_eq!(run["status"], "PAUSED", "{run}");
    let run_id = run["run_id"].as_str().unwrap();
    let url = server.url("");
    let shown = turnstile_in(dir.path(), &["runs", "show", run_id, "--url", &url]);
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(
        shown.contains("PAUSED") && shown.contains("waiting"),
        "{shown}"
    );
    let out = turnstile_in(dir.path(), &["runs", "approve", run_id, "--url", &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("approved"));
    let path = format!("/agents/coder/runs/{run_id}");
    let again = until(&server, &path, |again| {
        again["status"] == "PAUSED" && again["tools"].as_array().unwrap().len() == 2
    })
    .await;
    assert_eq!(again["status"], "PAUSED", "{again}");
    let call = again["tools"][1]["tool_call_id"].as_str().unwrap();
    let wrong = turnstile_in(
        dir.path(),
        &["runs", "deny", run_id, "--call", "nope", "--url", &url],
    );
    assert!(!wrong.status.success());
    let out = turnstile_in(
        dir.path(),
        &[
            "runs",
            "deny",
            run_id,
            "--call",
            call,
            "--note",
            "no writes",
            "--url",
            &url,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = until(&server, &path, |done| done["status"] == "COMPLETED").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["tools"][1]["confirmation_note"], "no writes");
    assert!(!dir.path().join("work/x.txt").exists());
    server.terminate();
    let timeline = turnstile_in(
        dir.path(),
        &[
            "journal",
            "timeline",
            "--config",
            "turnstile.toml",
            "--session",
            "s1",
        ],
    );
    let timeline = String::from_utf8_lossy(&timeline.stdout).to_string();
    assert!(
        timeline.contains("paused: waiting for a decision on"),
        "{timeline}"
    );
    assert!(timeline.contains("denied (\"no writes\")"), "{timeline}");
}

#[tokio::test]
async fn a_decision_sent_to_the_other_replica_reaches_the_owner_or_its_successor_30() {
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let replica = |name: &str| {
        let home = dir.path().join(name);
        std::fs::create_dir_all(&home).unwrap();
        config(
            &home,
            &format!("\n[journal]\nbackend = \"postgres\"\nurl = \"{url}\"\nlease_s = 2\n"),
        );
        start(&home)
    };
    let (a, b) = (replica("a"), replica("b"));
    let session = format!("pg-{}", std::process::id());

    // Paused on A, which keeps the session; decided on B: handed to A, the run goes on.
    let run = turn(&a, &session, "/tool Bash {\"command\":\"make\"}\nbuilt").await;
    assert_eq!(run["status"], "PAUSED", "{run}");
    let on_b = get(
        &b,
        &format!("/agents/coder/runs/{}", run["run_id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(on_b["status"], "PAUSED", "{on_b}");
    let listed = get(&b, &format!("/approvals?session_id={session}")).await;
    assert_eq!(listed["meta"]["total_count"], 1, "{listed}");
    let (status, done) = decide(&b, &run, &decided(&run, &[(true, None)]), false).await;
    assert_eq!(
        status,
        200,
        "{done} {:?}",
        b.logs().iter().rev().take(8).collect::<Vec<_>>()
    );
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["tools"][0]["result"], "ok:Bash", "{done}");

    // Paused on A, A killed: B takes the session over once A's lease lapses, the run
    // still paused (nothing ran again), and the decision is applied there.
    let second = format!("{session}-2");
    let run = turn(
        &a,
        &second,
        "/tool Read {}\n/tool Bash {\"command\":\"make\"}\nbuilt",
    )
    .await;
    assert_eq!(run["status"], "PAUSED", "{run}");
    a.kill();
    let (status, done) = decide(&b, &run, &decided(&run, &[(false, Some("no"))]), false).await;
    assert_eq!(
        status,
        200,
        "{done} {:?}",
        b.logs().iter().rev().take(6).collect::<Vec<_>>()
    );
    assert_eq!(done["status"], "COMPLETED", "{done}");
    let names: Vec<&str> = done["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["tool_name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Read", "Bash"], "{done}");
    assert_eq!(done["tools"][1]["confirmed"], false, "{done}");
    b.terminate();
}

#[tokio::test]
async fn a_usage_limit_is_waited_out_across_a_restart_spending_no_attempt_30() {
    let dir = tempfile::tempdir().unwrap();
    config(
        dir.path(),
        "wait_on_usage_limit = true\nmax_usage_wait_s = 60\n",
    );
    let server = start(dir.path());
    // Waited out in one process: the run goes on with the same id, no attempt spent
    // (the agent has no retries: a spent attempt would have ended it).
    let started = std::time::Instant::now();
    let run = turn(
        &server,
        "s1",
        "/tool Read {}\n/fail usage_limit 1\nafter the limit",
    )
    .await;
    assert!(started.elapsed() >= Duration::from_millis(900), "no wait");
    assert_eq!(run["status"], "COMPLETED", "{run}");
    assert_eq!(run["content"], "echo: after the limit");
    let warning = &run["metadata"]["warnings"][0];
    assert_eq!(warning["type"], "usage_limit", "{run}");
    assert!(
        warning["resets_at"].as_str().unwrap().ends_with("+00:00"),
        "{warning}"
    );

    // Stopped during the wait: the journaled timer holds after the restart, and a
    // stream attached then sees the run go on.
    let accepted = background(&server, "s2", "/fail usage_limit 2\nlater").await;
    let path = format!(
        "/agents/coder/runs/{}",
        accepted["run_id"].as_str().unwrap()
    );
    let waiting = until(&server, &path, |waiting| {
        waiting["metadata"]["warnings"]
            .as_array()
            .is_some_and(|w| !w.is_empty())
    })
    .await;
    assert_eq!(waiting["status"], "RUNNING", "{waiting}");
    server.kill();
    let server = start(dir.path());
    let done = until(&server, &path, |done| done["status"] == "COMPLETED").await;
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["content"], "echo: later");

    // A cancel ends a wait at once.
    let accepted = background(&server, "s4", "/fail usage_limit 30\nnever").await;
    let run_id = accepted["run_id"].as_str().unwrap();
    let path = format!("/agents/coder/runs/{run_id}");
    until(&server, &path, |waiting| {
        waiting["metadata"]["warnings"]
            .as_array()
            .is_some_and(|w| !w.is_empty())
    })
    .await;
    let cancelled_at = std::time::Instant::now();
    let (status, _) = post(&server, &format!("{path}/cancel"), &[]).await;
    assert_eq!(status, 200);
    let ended = until(&server, &path, |ended| ended["status"] == "CANCELLED").await;
    assert_eq!(ended["status"], "CANCELLED", "{ended}");
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));

    // Without wait_on_usage_limit the limit is a permanent error.
    server.terminate();
    std::fs::remove_file(dir.path().join("turnstile.toml")).unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    let failed = turn(&server, "s3", "/fail usage_limit 1\nnever").await;
    assert_eq!(failed["status"], "ERROR", "{failed}");
    assert_eq!(failed["metadata"]["error_type"], "usage_limit", "{failed}");
    server.terminate();
    verify_journal(dir.path());
}

#[tokio::test]
async fn a_paused_run_holds_no_worker_slot_30() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("turnstile.toml"),
        "[server]\ndata_dir = \"./data\"\nmax_concurrent_runs = 1\n\n[[agents]]\nid = \"coder\"\nharness = \"scripted\"\ncwd = \"./work\"\napprovals = [\"Bash\"]\n",
    )
    .unwrap();
    let server = start(dir.path());
    // Two runs paused on the only slot's worth of capacity, then other sessions' turns run.
    for session in ["p1", "p2"] {
        let paused = turn(&server, session, "/ls\nlisted").await;
        assert_eq!(paused["status"], "PAUSED", "{paused}");
    }
    for session in ["free1", "free2"] {
        let free = turn(&server, session, "/tool Read {}\nread").await;
        assert_eq!(free["status"], "COMPLETED", "{free}");
    }
    server.terminate();
}
