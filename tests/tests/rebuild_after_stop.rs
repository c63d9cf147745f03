//! Issue 12, item 6: `journal rebuild` after a stop with one run in flight and one
//! queued on a session reported `harness_session_id: stored null, rebuilt "scripted-…"`
//! and exited 1. The stored projections agree with the journal after any stop, graceful
//! (SIGTERM, as Ctrl-C) or not (SIGKILL).

use std::time::{Duration, Instant};

use turnstile_tests::{Server, get_json, lossy, post_form_json, turnstile};

async fn in_flight_and_queued(server: &Server) {
    let running = post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", "/tool Read {}\n/sleep 30000\n/reply late"),
            ("session_id", "s"),
            ("background", "true"),
            ("stream", "false"),
        ],
    )
    .await;
    let run_id = running["run_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    while get_json(
        server,
        &format!("/agents/scripted/runs/{run_id}?session_id=s"),
    )
    .await["status"]
        != "RUNNING"
    {
        assert!(Instant::now() < deadline, "the run never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let its first events (the attempt's harness session) reach the journal.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued = post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", "/reply queued"),
            ("session_id", "s"),
            ("background", "true"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(queued["status"], "PENDING", "{queued}");
}

fn rebuild_agrees(data: &std::path::Path) {
    let out = turnstile(&["journal", "rebuild", "--data-dir", data.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "rebuild found a difference: {}{}",
        lossy(&out.stdout),
        lossy(&out.stderr)
    );
}

#[tokio::test]
async fn rebuild_agrees_after_a_graceful_stop_with_a_run_in_flight_and_one_queued_12() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    in_flight_and_queued(&server).await;
    server.terminate();
    rebuild_agrees(&data);
}

#[tokio::test]
async fn rebuild_agrees_after_a_sigkill_with_a_run_in_flight_and_one_queued_12() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    in_flight_and_queued(&server).await;
    server.kill();
    rebuild_agrees(&data);
}
