//! Step replay and compaction over HTTP against the real binary (issue 4): the
//! checkpoints route, `/continue` in its three answer shapes, the 409 for a cancelled
//! run, and the compact route.

use std::time::Duration;

use serde_json::{Value, json};
use turnstile_tests::{
    Server, event_types, get_json, http_client as client, parse_sse, post_form_json,
};

async fn run(server: &Server, session: &str, message: &str) -> Value {
    let form = [
        ("message", message),
        ("session_id", session),
        ("stream", "false"),
    ];
    post_form_json(server, "/agents/scripted/runs", &form).await
}

#[tokio::test]
async fn checkpoints_list_each_tool_batch_then_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let source = run(
        &server,
        "s",
        "look\n/tool Read {}\n/tool Grep {}\n/reply done",
    )
    .await;
    let run_id = source["run_id"].as_str().unwrap();
    let body: Value = get_json(
        &server,
        &format!("/agents/scripted/runs/{run_id}/checkpoints?session_id=s"),
    )
    .await;
    assert_eq!(body["run_id"], run_id);
    let checkpoints = body["checkpoints"].as_array().unwrap();
    let summary: Vec<(Value, Value, Value, Value)> = checkpoints
        .iter()
        .map(|c| {
            (
                c["checkpoint_id"].clone(),
                c["message_index"].clone(),
                c["reason"].clone(),
                c["is_latest"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (json!("1"), json!(3), json!("checkpoint"), json!(false)),
            (json!("2"), json!(5), json!("checkpoint"), json!(false)),
            (json!("3"), json!(6), json!("end"), json!(true)),
        ]
    );
    assert_eq!(checkpoints[0]["message_preview"], "ok:Read");
    assert_eq!(checkpoints[2]["status"], "COMPLETED");
    for key in [
        "checkpoint_id",
        "run_id",
        "session_id",
        "message_index",
        "continue_from",
        "status",
        "reason",
        "created_at",
        "message_role",
        "message_preview",
        "is_latest",
    ] {
        assert!(checkpoints[0].get(key).is_some(), "missing {key}");
    }
    let wrong_session = client()
        .get(server.url(&format!(
            "/agents/scripted/runs/{run_id}/checkpoints?session_id=other"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_session.status(), 404);
}

#[tokio::test]
async fn continue_answers_like_runs_and_records_the_lineage() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    run(&server, "s", "first").await;
    let source = run(
        &server,
        "s",
        "second\n/tool Read {}\n/tool Grep {}\n/reply done",
    )
    .await;
    let run_id = source["run_id"].as_str().unwrap();
    let path = format!("/agents/scripted/runs/{run_id}/continue");
    let continued: Value = client()
        .post(server.url(&path))
        .form(&[
            ("continue_from", "3"),
            ("input", "third\n/history"),
            ("stream", "false"),
            ("session_id", "s"),
            ("fork", "true"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(continued["status"], "COMPLETED");
    assert_eq!(continued["content"], "first\nsecond\nthird");
    assert_eq!(continued["forked_from_run_id"], run_id);
    assert_eq!(continued["forked_from_message_index"], 3);
    assert_ne!(continued["run_id"], source["run_id"]);

    let streamed = client()
        .post(server.url(&path))
        .form(&[("continue_from", "end"), ("input", "more")])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let frames = parse_sse(&streamed);
    assert_eq!(event_types(&frames).first(), Some(&"RunStarted"));
    assert_eq!(frames.last().unwrap().event, "RunCompleted");

    let accepted = client()
        .post(server.url(&path))
        .form(&[
            ("continue_from", "last_user"),
            ("background", "true"),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);

    let unchanged: Value = get_json(&server, &format!("/agents/scripted/runs/{run_id}")).await;
    assert_eq!(unchanged["content"], "done");
    assert_eq!(unchanged["forked_from_run_id"], Value::Null);
}

#[tokio::test]
async fn a_cancelled_run_cannot_be_continued() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let accepted: Value = client()
        .post(server.url("/agents/scripted/runs"))
        .form(&[
            ("message", "/sleep 30000"),
            ("background", "true"),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = accepted["run_id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    client()
        .post(server.url(&format!("/agents/scripted/runs/{run_id}/cancel")))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let response = client()
        .post(server.url(&format!("/agents/scripted/runs/{run_id}/continue")))
        .form(&[("input", "go on"), ("stream", "false")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 409);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error_type"], "run_not_continuable");
    assert!(body["detail"].as_str().unwrap().contains("cancelled"));
    let bad = client()
        .post(server.url(&format!("/agents/scripted/runs/{run_id}/continue")))
        .form(&[("continue_from", "somewhere")])
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);
}

#[tokio::test]
async fn the_compact_route_compacts_declines_and_refuses_while_busy() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let compact = |session: &str| {
        client()
            .post(server.url(&format!("/agents/scripted/sessions/{session}/compact")))
            .send()
    };
    // An unknown session is 404, as for every other route (issue 13, defect 9).
    let unknown = compact("nobody").await.unwrap();
    assert_eq!(unknown.status(), 404);
    let empty: Value = unknown.json().await.unwrap();
    assert_eq!(
        empty,
        json!({"detail": "Session nobody not found", "error_type": "not_found"})
    );
    for message in ["one", "two", "three"] {
        run(&server, "s", message).await;
    }
    let compacted: Value = compact("s").await.unwrap().json().await.unwrap();
    assert_eq!(compacted["compacted"], true);
    assert_eq!(compacted["record"]["summary"], "[summary of 3 messages]");
    assert_eq!(
        run(&server, "s", "four\n/history").await["content"],
        "[summary of 3 messages]\nfour"
    );

    let slow = {
        let url = server.url("/agents/scripted/runs");
        tokio::spawn(async move {
            client()
                .post(url)
                .form(&[
                    ("message", "/sleep 800"),
                    ("session_id", "s"),
                    ("stream", "false"),
                ])
                .send()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let busy = compact("s").await.unwrap();
    assert_eq!(busy.status(), 409);
    assert_eq!(
        busy.json::<Value>().await.unwrap()["error_type"],
        "session_busy"
    );
    slow.await.unwrap().unwrap();
    let unknown_agent = client()
        .post(server.url("/agents/nobody/sessions/s/compact"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown_agent.status(), 404);
}
