//! Metrics over HTTP against the real binary: a run's own metrics with
//! `details.model`, agno's daily aggregates, and the Prometheus counters.

use serde_json::Value;
use turnstile_tests::{
    Server, get_json, get_text, http_client as client, post_form_json, prometheus_sample,
};

async fn run(server: &Server, session: &str, user: &str, message: &str) -> Value {
    let form = [
        ("message", message),
        ("session_id", session),
        ("user_id", user),
        ("stream", "false"),
    ];
    post_form_json(server, "/agents/scripted/runs", &form).await
}

#[tokio::test]
async fn runs_days_and_runtime_counters() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let first = run(&server, "s1", "u1", "one\n/usage 100 20 10 0.5").await;
    run(&server, "s1", "u1", "two\n/usage 50 5 0 0.25").await;
    run(&server, "s2", "u2", "three\n/usage 10 1 0 0").await;
    let failed = run(&server, "s3", "u2", "/fail permanent billing").await;
    assert_eq!(failed["status"], "ERROR");

    let metrics = &first["metrics"];
    assert_eq!(
        (
            metrics["input_tokens"].as_u64(),
            metrics["output_tokens"].as_u64(),
            metrics["total_tokens"].as_u64()
        ),
        (Some(100), Some(20), Some(120))
    );
    assert_eq!(metrics["cache_read_tokens"], 10);
    assert_eq!(metrics["cost"], 0.5);
    assert!(metrics["duration"].as_f64().unwrap() >= 0.0);
    assert!(metrics["time_to_first_token"].as_f64().is_some());
    assert_eq!(metrics["details"]["model"][0]["id"], "scripted");
    assert_eq!(metrics["details"]["model"][0]["provider"], "turnstile");

    let daily: Value = get_json(&server, "/metrics").await;
    let days = daily["metrics"].as_array().unwrap();
    assert_eq!(days.len(), 1, "{daily}");
    let today = &days[0];
    assert_eq!(today["agent_runs_count"], 4);
    assert_eq!(today["agent_sessions_count"], 3);
    assert_eq!(today["users_count"], 2);
    assert_eq!(today["token_metrics"]["total_tokens"], 186);
    assert_eq!(today["token_metrics"]["cost"], 0.75);
    assert_eq!(today["model_metrics"][0]["model_id"], "scripted");
    assert_eq!(today["model_metrics"][0]["count"], 3);
    let none: Value = get_json(&server, "/metrics?starting_date=2999-01-01").await;
    assert_eq!(none["metrics"].as_array().unwrap().len(), 0);
    assert_eq!(
        client()
            .get(server.url("/metrics?starting_date=yesterday"))
            .send()
            .await
            .unwrap()
            .status(),
        422
    );

    let response = client()
        .get(server.url("/metrics/prometheus"))
        .send()
        .await
        .unwrap();
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = response.text().await.unwrap();
    for expected in [
        "turnstile_runs_ended_total{status=\"COMPLETED\"} 3",
        "turnstile_runs_ended_total{status=\"ERROR\"} 1",
        "turnstile_runs_started_total 4",
        "turnstile_runs_queued 0",
        "turnstile_sessions_active 3",
        "turnstile_sessions_passivated 0",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    let count = |name: &str| prometheus_sample(&text, name).unwrap_or(0.0);
    assert!(count("turnstile_journal_records ") > 10.0);
    assert!(count("turnstile_journal_sync_seconds_count ") >= 8.0);
    assert!(count("turnstile_journal_appends_total ") >= 8.0);

    // A quick turn is two durable appends, so at most two syncs: the run accepted, then
    // its start, its events and its end together.
    let appends_before = count("turnstile_journal_appends_total ");
    let quick = run(&server, "s1", "u1", "four\n/tool Read {\"path\":\"x\"}").await;
    assert_eq!(quick["status"], "COMPLETED", "{quick}");
    let text = get_text(&server, "/metrics/prometheus").await;
    let appends_after = prometheus_sample(&text, "turnstile_journal_appends_total ").unwrap();
    assert_eq!(appends_after - appends_before, 2.0);
}
