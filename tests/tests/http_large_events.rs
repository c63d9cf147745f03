//! Issue 13, defect 1 (a ghost run from a large output), over HTTP on the real binary:
//! five 1 MB messages on one session, then `/history` (a 5 MB answer). The answer is
//! journaled whole and shown whole; past `max_event_bytes` the run ends `ERROR`, and no
//! run is ever left open (cancel, `/resume` and a restart all see its end).

use std::path::Path;

use serde_json::Value;
use turnstile_tests::{
    Server, event_types, get_json, http_client, parse_sse, post_form_json, turnstile_ok,
    write_config,
};

fn megabyte_message(n: usize) -> String {
    format!("message {n} {}", "m".repeat(1_000_000))
}

async fn five_messages_then_history(server: &Server) -> Value {
    for n in 0..5 {
        let message = megabyte_message(n);
        let form = [
            ("message", message.as_str()),
            ("session_id", "big"),
            ("stream", "false"),
        ];
        let answer = post_form_json(server, "/agents/scripted/runs", &form).await;
        assert_eq!(
            answer["status"],
            "COMPLETED",
            "turn {n}: {}",
            &answer.to_string()[..300.min(answer.to_string().len())]
        );
    }
    let form = [
        ("message", "/history"),
        ("session_id", "big"),
        ("stream", "false"),
    ];
    post_form_json(server, "/agents/scripted/runs", &form).await
}

async fn resume_frames(server: &Server, run_id: &str) -> Vec<String> {
    let body = http_client()
        .post(server.url(&format!("/agents/scripted/runs/{run_id}/resume")))
        .form(&[("session_id", "big")])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    event_types(&parse_sse(&body))
        .into_iter()
        .map(str::to_owned)
        .collect()
}

fn verify(data: &Path) {
    let report = turnstile_ok(&["journal", "verify", "--data-dir", data.to_str().unwrap()]);
    assert!(report.contains("events"), "{report}");
}

#[tokio::test]
async fn a_five_megabyte_answer_is_journaled_whole_and_shown_whole_13() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let history = five_messages_then_history(&server).await;
    assert_eq!(history["status"], "COMPLETED");
    let content = history["content"].as_str().unwrap();
    assert!(content.len() > 5_000_000, "{} bytes", content.len());
    assert!(content.contains("message 4 mmm"));
    let run_id = history["run_id"].as_str().unwrap().to_owned();
    let frames = resume_frames(&server, &run_id).await;
    assert_eq!(
        frames.last().map(String::as_str),
        Some("RunCompleted"),
        "{frames:?}"
    );
    // After a restart the run reads the same: nothing was left to recovery.
    server.terminate();
    verify(&data);
    let server = Server::start(&data);
    let again = get_json(
        &server,
        &format!("/agents/scripted/runs/{run_id}?session_id=big"),
    )
    .await;
    assert_eq!(again["status"], "COMPLETED");
    assert_eq!(again["content"].as_str().map(str::len), Some(content.len()));
    server.terminate();
}

#[tokio::test]
async fn an_answer_over_max_event_bytes_ends_the_run_error_never_open_13() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(dir.path(), "max_event_bytes = 3000000", "");
    let config = config.to_str().unwrap();
    let server = Server::start_with(&data, &["--config", config]);
    let history = five_messages_then_history(&server).await;
    assert_eq!(
        history["status"],
        "ERROR",
        "{}",
        &history.to_string()[..500.min(history.to_string().len())]
    );
    assert_eq!(
        history["metadata"]["error_type"], "event_too_large",
        "{}",
        history["metadata"]
    );
    let content = history["content"].as_str().unwrap();
    assert!(
        content.contains("exceeds max_event_bytes (3000000)"),
        "{content}"
    );
    let run_id = history["run_id"].as_str().unwrap().to_owned();
    let frames = resume_frames(&server, &run_id).await;
    assert_eq!(
        frames.last().map(String::as_str),
        Some("RunError"),
        "{frames:?}"
    );
    // The session takes its next turn: nothing is stuck.
    let form = [
        ("message", "/reply after"),
        ("session_id", "big"),
        ("stream", "false"),
    ];
    let next = post_form_json(&server, "/agents/scripted/runs", &form).await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
    server.terminate();
    verify(&data);
    // A restart does not run it again.
    let server = Server::start_with(&data, &["--config", config]);
    let again = get_json(
        &server,
        &format!("/agents/scripted/runs/{run_id}?session_id=big"),
    )
    .await;
    assert_eq!(again["status"], "ERROR");
    let runs = get_json(&server, "/sessions/big/runs").await;
    let attempts: Vec<&Value> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|run| &run["status"])
        .collect();
    assert_eq!(attempts.len(), 7, "{attempts:?}");
    server.terminate();
}
