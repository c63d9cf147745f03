//! Runs that survive, over HTTP against the real binary (issue 3): background runs
//! (202 and indexed streams), re-attaching with `/resume` and `Last-Event-ID`,
//! cancellation, the queue limit, idempotency keys, keepalives, and a queued run that
//! survives a crash of the server.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstile_tests::{
    Frame, Server, event_types, get_json, http_client as client, parse_sse, post_form, write_config,
};

async fn get_run(server: &Server, run_id: &str) -> Value {
    get_json(server, &format!("/agents/scripted/runs/{run_id}")).await
}

async fn wait_for_end(server: &Server, run_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let run = get_run(server, run_id).await;
        if ["COMPLETED", "ERROR", "CANCELLED"].contains(&run["status"].as_str().unwrap_or_default())
        {
            return run;
        }
        assert!(Instant::now() < deadline, "run {run_id} did not end: {run}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn background(server: &Server, session: &str, message: &str) -> String {
    let response = post_form(
        server,
        "/agents/scripted/runs",
        &[
            ("message", message),
            ("session_id", session),
            ("background", "true"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "PENDING");
    assert_eq!(body["session_id"], session);
    body["run_id"].as_str().unwrap().to_owned()
}

async fn resume(
    server: &Server,
    run_id: &str,
    form: &[(&str, &str)],
    last_event_id: Option<&str>,
) -> Vec<Frame> {
    let mut request = client()
        .post(server.url(&format!("/agents/scripted/runs/{run_id}/resume")))
        .form(form);
    if let Some(id) = last_event_id {
        request = request.header("Last-Event-ID", id);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    parse_sse(&response.text().await.unwrap())
}

fn indexes(frames: &[Frame]) -> Vec<u64> {
    frames
        .iter()
        .filter_map(|f| f.data["event_index"].as_u64())
        .collect()
}

#[tokio::test]
async fn a_background_run_answers_202_then_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let run_id = background(&server, "bg", "/tool Read {}\n/reply later").await;
    let run = wait_for_end(&server, &run_id).await;
    assert_eq!(run["status"], "COMPLETED");
    assert_eq!(run["content"], "later");
    // A second background turn on the same session queues behind, never 409.
    let first = background(&server, "bg", "/sleep 300").await;
    let second = background(&server, "bg", "after the first").await;
    assert_eq!(wait_for_end(&server, &second).await["status"], "COMPLETED");
    assert_eq!(get_run(&server, &first).await["status"], "COMPLETED");
}

#[tokio::test]
async fn a_background_stream_indexes_every_frame() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let body = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/tool Read {}\n/reply indexed"),
            ("background", "true"),
        ],
    )
    .await
    .text()
    .await
    .unwrap();
    let frames = parse_sse(&body);
    assert_eq!(frames.last().unwrap().event, "RunCompleted");
    let run_id = frames[0].data["run_id"].as_str().unwrap().to_owned();
    assert_eq!(
        indexes(&frames),
        (0..frames.len() as u64).collect::<Vec<_>>()
    );
    for frame in &frames {
        assert_eq!(
            frame.id.as_deref(),
            Some(frame.data["event_index"].to_string().as_str())
        );
        assert_eq!(frame.data["run_id"], run_id.as_str());
    }
}

#[tokio::test]
async fn resume_replays_a_finished_run_from_any_index_with_its_real_status() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let run: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/tool Read {}\n/tool Grep {}\n/reply replayed"),
            ("stream", "false"),
        ],
    )
    .await
    .json()
    .await
    .unwrap();
    let run_id = run["run_id"].as_str().unwrap();
    let all = resume(&server, run_id, &[], None).await;
    assert_eq!(all[0].event, "replay");
    assert_eq!(all[0].data["status"], "COMPLETED");
    let total = all[0].data["total_events"].as_u64().unwrap();
    assert_eq!(indexes(&all[1..]), (0..total).collect::<Vec<_>>());
    let tail = resume(
        &server,
        run_id,
        &[
            ("last_event_index", "2"),
            ("session_id", run["session_id"].as_str().unwrap()),
        ],
        None,
    )
    .await;
    assert_eq!(indexes(&tail[1..]), (3..total).collect::<Vec<_>>());
    assert_eq!(tail.last().unwrap().event, "RunCompleted");
    assert_eq!(tail.last().unwrap().data["content"], "replayed");
    let by_header = resume(&server, run_id, &[], Some("4")).await;
    assert_eq!(indexes(&by_header[1..]), (5..total).collect::<Vec<_>>());
    // An errored run reports its real status.
    let failed: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "/fail permanent billing"), ("stream", "false")],
    )
    .await
    .json()
    .await
    .unwrap();
    let frames = resume(&server, failed["run_id"].as_str().unwrap(), &[], None).await;
    assert_eq!(
        (
            frames[0].data["status"].as_str(),
            frames.last().unwrap().event.as_str()
        ),
        (Some("ERROR"), "RunError")
    );
    // After a restart too.
    server.terminate();
    let server = Server::start(dir.path());
    let again = resume(&server, run_id, &[("last_event_index", "2")], None).await;
    assert_eq!(event_types(&again), event_types(&tail));
}

#[tokio::test]
async fn resume_of_a_live_run_catches_up_then_follows_it_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let run_id = background(
        &server,
        "live",
        "/tool Read {}\n/sleep 700\n/tool Write {}\n/reply end",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let frames = resume(&server, &run_id, &[("last_event_index", "0")], None).await;
    assert_eq!(frames[0].event, "catch_up");
    assert_eq!(frames[1].event, "subscribed");
    let events = &frames[2..];
    let total = events.len() as u64;
    assert_eq!(
        indexes(events),
        (1..=total).collect::<Vec<_>>(),
        "each missing event once, in order"
    );
    assert_eq!(events.last().unwrap().event, "RunCompleted");
    assert!(event_types(events).contains(&"ToolCallStarted"));
}

/// Re-attached to a live run that is quiet for a while, a client gets the events that
/// happened already at once, not when the run next emits one (issue 18 found this:
/// the console's live page showed a run's first tool call only at its end).
#[tokio::test]
async fn resume_of_a_quiet_live_run_delivers_what_happened_at_once() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let run_id = background(&server, "quiet", "/tool Read {}\n/sleep 3000\n/reply end").await;
    let started = std::time::Instant::now();
    loop {
        let run = get_json(&server, &format!("/agents/scripted/runs/{run_id}")).await;
        if run["tools"]
            .as_array()
            .is_some_and(|tools| !tools.is_empty())
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{run}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let response = client()
        .post(server.url(&format!("/agents/scripted/runs/{run_id}/resume")))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let read = tokio::time::timeout(Duration::from_secs(1), async {
        while !text.contains("event: ToolCallCompleted") {
            let chunk = body.next().await.expect("the stream ended").unwrap();
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the tool call that happened was held back: {text}"
    );
    let run = get_json(&server, &format!("/agents/scripted/runs/{run_id}")).await;
    assert_eq!(run["status"], "RUNNING", "the run was still sleeping");
}

#[tokio::test]
async fn resume_of_unknown_runs_is_404() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let response = client()
        .post(server.url("/agents/scripted/runs/nope/resume"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let response = client()
        .post(server.url("/agents/scripted/runs/x/resume"))
        .form(&[("last_event_index", "two")])
        .send()
        .await
        .unwrap();
    assert!(response.status() == 404 || response.status() == 422);
}

#[tokio::test]
async fn cancel_answers_200_and_ends_queued_and_running_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let unknown = client()
        .post(server.url("/agents/scripted/runs/no-such-run/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 200);
    assert_eq!(unknown.json::<Value>().await.unwrap(), json!({}));
    let running = background(&server, "c", "/tool Read {}\n/sleep 30000").await;
    let queued = background(&server, "c", "/reply never").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for run_id in [&queued, &running, &queued] {
        let response = client()
            .post(server.url(&format!("/agents/scripted/runs/{run_id}/cancel")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    let queued_run = wait_for_end(&server, &queued).await;
    assert_eq!(queued_run["status"], "CANCELLED");
    assert_eq!(queued_run["tools"].as_array().unwrap().len(), 0);
    let running_run = wait_for_end(&server, &running).await;
    assert_eq!(running_run["status"], "CANCELLED");
    assert_eq!(running_run["content"], "Run cancelled");
    assert_eq!(
        running_run["tools"].as_array().unwrap().len(),
        1,
        "tool calls made so far are kept"
    );
    let frames = resume(&server, &running, &[], None).await;
    assert_eq!(frames.last().unwrap().event, "RunCancelled");
}

#[tokio::test]
async fn a_full_queue_answers_429() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "max_concurrent_runs = 1\nmax_queued_runs = 1",
        "",
    );
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let _running = background(&server, "a", "/sleep 500").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _queued = background(&server, "b", "waits").await;
    let response = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "too many"),
            ("session_id", "c"),
            ("background", "true"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(response.status(), 429);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_type"], "queue_full");
}

#[tokio::test]
async fn an_idempotency_key_returns_the_first_run_also_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let submit = |server: &Server, message: &'static str| {
        client()
            .post(server.url("/agents/scripted/runs"))
            .header("Idempotency-Key", "order-42")
            .form(&[
                ("message", message),
                ("background", "true"),
                ("stream", "false"),
            ])
            .send()
    };
    let first: Value = submit(&server, "once").await.unwrap().json().await.unwrap();
    let second: Value = submit(&server, "twice")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(first["run_id"], second["run_id"]);
    let run_id = first["run_id"].as_str().unwrap().to_owned();
    wait_for_end(&server, &run_id).await;
    server.terminate();
    let server = Server::start(dir.path());
    let third: Value = submit(&server, "thrice")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(third["run_id"], run_id.as_str());
    assert_eq!(third["status"], "COMPLETED");
    assert_eq!(get_run(&server, &run_id).await["content"], "echo: once");
}

#[tokio::test]
async fn idle_streams_send_keepalive_comments() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "sse_keepalive_s = 0.2", "");
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let body = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "/sleep 900\n/reply awake")],
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(body.contains(": keepalive"), "{body}");
    assert_eq!(parse_sse(&body).last().unwrap().event, "RunCompleted");
}

#[tokio::test]
async fn a_queued_run_survives_a_crash_and_a_running_one_is_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "max_concurrent_runs = 1", "");
    let data = dir.path().join("data");
    let args = ["--config", config.to_str().unwrap()];
    let server = Server::start_with(&data, &args);
    let running = background(&server, "first", "/sleep 5000").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let queued = background(&server, "second", "/reply I waited").await;
    assert_eq!(get_run(&server, &queued).await["status"], "PENDING");
    server.kill();

    let server = Server::start_with(&data, &args);
    let queued_run = wait_for_end(&server, &queued).await;
    assert_eq!(
        (
            queued_run["status"].as_str(),
            queued_run["content"].as_str()
        ),
        (Some("COMPLETED"), Some("I waited"))
    );
    let running_run = wait_for_end(&server, &running).await;
    assert_eq!(running_run["status"], "ERROR");
    assert_eq!(running_run["metadata"]["error_type"], "process_stopped");
    // Its session is free again.
    let next: Value = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "hello"),
            ("session_id", "first"),
            ("stream", "false"),
        ],
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(next["status"], "COMPLETED");
}
