//! The real `turnstile` binary on loopback with a real data directory: the routes of
//! the walking skeleton, the busy answers, streamed event order, disconnects,
//! restarts and graceful shutdown (issue 2).

use std::time::Duration;

use serde_json::{Value, json};
use turnstile_tests::{Server, event_types, get_json, http_client as client, parse_sse, post_form};

async fn run_json(server: &Server, session: &str, message: &str) -> Value {
    let response = post_form(
        server,
        "/agents/scripted/runs",
        &[
            ("message", message),
            ("session_id", session),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

#[tokio::test]
async fn health_agents_and_unknown_ids() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let health: Value = get_json(&server, "/health").await;
    assert_eq!(health, json!({"status": "ok"}));
    let agents: Value = get_json(&server, "/agents").await;
    assert_eq!(agents[0]["id"], "scripted");
    assert_eq!(agents[0]["metadata"]["sdk"], "scripted");
    let agent: Value = get_json(&server, "/agents/scripted").await;
    assert_eq!(agent["model"]["provider"], "turnstile");
    for path in [
        "/agents/nobody",
        "/agents/scripted/runs/no-such-run",
        "/agents/scripted/runs/..%2Fetc",
    ] {
        let response = client().get(server.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 404, "{path}");
        let body: Value = response.json().await.unwrap();
        assert!(body["detail"].as_str().is_some(), "{path}: {body}");
    }
    let response = post_form(&server, "/agents/nobody/runs", &[("message", "hi")]).await;
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn a_streamed_run_sends_its_events_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let body = post_form(
        &server,
        "/agents/scripted/runs",
        &[(
            "message",
            "look\n/tool Read {\"path\":\"a\"}\n/reply seen it",
        )],
    )
    .await
    .text()
    .await
    .unwrap();
    let frames = parse_sse(&body);
    assert_eq!(
        event_types(&frames),
        [
            "RunStarted",
            "ToolCallStarted",
            "ToolCallCompleted",
            "RunContent",
            "RunContent",
            "RunContent",
            "RunCompleted"
        ]
    );
    let ids: Vec<String> = frames.iter().map(|f| f.id.clone().unwrap()).collect();
    assert_eq!(ids, ["0", "1", "2", "3", "4", "5", "6"]);
    for frame in &frames {
        assert_eq!(frame.data["event"], frame.event.as_str());
        assert!(
            frame.data.get("event_index").is_none(),
            "inline streams carry no event_index"
        );
    }
    let completed = &frames.last().unwrap().data;
    assert_eq!(completed["content"], "seen it");
    assert_eq!(frames[2].data["tool"]["result"], "ok:Read");
    // The run reads back the same from the journal.
    let run_id = completed["run_id"].as_str().unwrap();
    let run: Value = get_json(&server, &format!("/agents/scripted/runs/{run_id}")).await;
    assert_eq!(run["status"], "COMPLETED");
    assert_eq!(run["tools"][0]["tool_name"], "Read");
}

#[tokio::test]
async fn json_multipart_and_form_bodies_are_all_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let by_json: Value = client()
        .post(server.url("/agents/scripted/runs"))
        .json(&json!({"message": "one", "stream": false}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(by_json["content"], "echo: one");
    let form = reqwest::multipart::Form::new()
        .text("message", "two")
        .text("stream", "false");
    let by_multipart: Value = client()
        .post(server.url("/agents/scripted/runs"))
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(by_multipart["content"], "echo: two");
    let by_form = run_json(&server, "s-form", "three").await;
    assert_eq!(by_form["content"], "echo: three");
    assert_eq!(by_form["messages"][0]["role"], "user");
    for (form, status) in [
        (vec![("stream", "false")], 422),
        (vec![("message", "x"), ("stream", "maybe")], 422),
        (vec![("message", "x"), ("session_id", "../../etc")], 422),
        (
            vec![("message", "x"), ("audio", "[{\"url\":\"a.mp3\"}]")],
            400,
        ),
        (vec![("message", "x"), ("images", "[not json")], 422),
    ] {
        let response = post_form(&server, "/agents/scripted/runs", &form).await;
        assert_eq!(response.status(), status, "{form:?}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{body}"
        );
    }
}

#[tokio::test]
async fn a_busy_session_answers_409_or_one_run_error_frame() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let slow = {
        let url = server.url("/agents/scripted/runs");
        tokio::spawn(async move {
            client()
                .post(url)
                .form(&[
                    ("message", "/sleep 1500\n/reply slow"),
                    ("session_id", "busy"),
                    ("stream", "false"),
                ])
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let response = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "hi"),
            ("session_id", "busy"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(response.status(), 409);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_type"], "session_busy");
    let running = body["run_id"].as_str().unwrap().to_owned();
    assert!(body["detail"].as_str().unwrap().contains(&running));
    assert!(body["detail"].as_str().unwrap().contains("already has run"));

    let streamed = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "hi"), ("session_id", "busy")],
    )
    .await;
    assert_eq!(streamed.status(), 200);
    let frames = parse_sse(&streamed.text().await.unwrap());
    assert_eq!(event_types(&frames), ["RunError"]);
    assert_eq!(frames[0].data["error_type"], "session_busy");
    assert!(
        frames[0].data["content"]
            .as_str()
            .unwrap()
            .contains(&running)
    );

    let finished = slow.await.unwrap();
    assert_eq!(finished["run_id"], running.as_str());
    assert_eq!(finished["content"], "slow");
    // Free again.
    assert_eq!(
        run_json(&server, "busy", "next").await["status"],
        "COMPLETED"
    );
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_neither_cancels_nor_loses_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut response = post_form(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/tool Read {}\n/sleep 500\n/reply survived"),
            ("session_id", "gone"),
        ],
    )
    .await;
    let first = response.chunk().await.unwrap().unwrap();
    let first = String::from_utf8_lossy(&first).to_string();
    let run_id = parse_sse(&first)[0].data["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    drop(response);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let run: Value = get_json(
        &server,
        &format!("/agents/scripted/runs/{run_id}?session_id=gone"),
    )
    .await;
    assert_eq!(run["status"], "COMPLETED");
    assert_eq!(run["content"], "survived");
    assert_eq!(run["tools"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn runs_read_back_from_the_journal_after_a_restart_and_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let before = run_json(
        &server,
        "durable",
        "/tool Write {\"path\":\"x\"}\n/reply written",
    )
    .await;
    let run_path = format!(
        "/agents/scripted/runs/{}",
        before["run_id"].as_str().unwrap()
    );
    server.terminate();

    let server = Server::start(dir.path());
    let after: Value = get_json(&server, &run_path).await;
    for field in [
        "run_id",
        "session_id",
        "status",
        "content",
        "tools",
        "input",
        "created_at",
    ] {
        assert_eq!(after[field], before[field], "{field}");
    }
    let second = run_json(&server, "durable", "/history").await;
    assert_eq!(second["content"], "(directives)\n(directives)");
    server.kill();

    // After SIGKILL the acknowledged runs are still there.
    let server = Server::start(dir.path());
    let crashed: Value = get_json(
        &server,
        &format!(
            "/agents/scripted/runs/{}",
            second["run_id"].as_str().unwrap()
        ),
    )
    .await;
    assert_eq!(crashed["status"], "COMPLETED");
    assert_eq!(crashed["content"], second["content"]);
}

#[tokio::test]
async fn shutdown_ends_open_streams_and_exits_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut response = post_form(
        &server,
        "/agents/scripted/runs",
        &[("message", "/sleep 60000"), ("session_id", "long")],
    )
    .await;
    let _first = response.chunk().await.unwrap().unwrap();
    let reader = tokio::spawn(async move { while let Ok(Some(_)) = response.chunk().await {} });
    let took = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
    tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the stream ended")
        .unwrap();
}
