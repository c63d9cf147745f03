//! Issue 13, defect 10: parity with agno 3.1.10 where the spec was silent: a failed
//! run's `metadata` says `error_type` and `retryable`, and a session's metrics sum its
//! runs' per-model entries in `details.model`.

use serde_json::Value;
use turnstile_tests::{Server, get_json, post_form_json, write_config};

async fn run(server: &Server, message: &str) -> Value {
    post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", message),
            ("session_id", "p"),
            ("stream", "false"),
        ],
    )
    .await
}

#[tokio::test]
async fn failed_runs_say_whether_they_are_retryable_and_sessions_sum_models_13() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", "retries = 1\ndelay_between_retries_s = 0");
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );

    let permanent = run(&server, "/fail permanent billing").await;
    assert_eq!(permanent["status"], "ERROR");
    assert_eq!(permanent["metadata"]["error_type"], "billing");
    assert_eq!(
        permanent["metadata"]["retryable"], false,
        "{}",
        permanent["metadata"]
    );
    let transient = run(&server, "/fail transient 5").await;
    assert_eq!(transient["metadata"]["error_type"], "transient");
    assert_eq!(
        transient["metadata"]["retryable"], true,
        "{}",
        transient["metadata"]
    );

    run(&server, "/usage 100 20 5 0.25\n/reply one").await;
    run(&server, "/usage 30 7 0 0.5\n/reply two").await;
    let session = get_json(&server, "/sessions/p").await;
    for name in ["session_metrics", "metrics"] {
        let models = session[name]["details"]["model"].as_array().unwrap();
        assert_eq!(models.len(), 1, "{}", session[name]);
        assert_eq!(models[0]["id"], "scripted");
        assert_eq!(models[0]["input_tokens"], 130, "{}", models[0]);
        assert_eq!(models[0]["output_tokens"], 27);
        assert_eq!(models[0]["total_tokens"], 157);
        assert_eq!(models[0]["cost"], 0.75);
        assert_eq!(session[name]["input_tokens"], 130);
    }
    server.terminate();
}
