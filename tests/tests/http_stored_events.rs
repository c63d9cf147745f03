//! agno's stored events over HTTP: an agent with `store_events` lists a streamed
//! run's events less `events_to_skip` (by default `RunContent`); non-streamed runs and
//! other agents list none; the journal keeps every event either way.

use serde_json::Value;
use turnstile_tests::{Server, get_json, http_client as client, parse_sse};

const CONFIG: &str = r#"
[[agents]]
id = "keeper"
harness = "scripted"
store_events = true

[[agents]]
id = "everything"
harness = "scripted"
store_events = true
events_to_skip = []

[[agents]]
id = "plain"
harness = "scripted"
store_events = false

[[agents]]
id = "default"
harness = "scripted"
"#;

async fn streamed_run(server: &Server, agent: &str) -> Value {
    let body = client()
        .post(server.url(&format!("/agents/{agent}/runs")))
        .form(&[("message", "/tool Read {}\n/reply stored")])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let run_id = parse_sse(&body).last().unwrap().data["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    get_json(server, &format!("/agents/{agent}/runs/{run_id}")).await
}

fn kinds(run: &Value) -> Vec<String> {
    run["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn stored_events_follow_store_events_and_events_to_skip() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );

    let kept = streamed_run(&server, "keeper").await;
    assert_eq!(
        kinds(&kept),
        [
            "RunStarted",
            "ToolCallStarted",
            "ToolCallCompleted",
            "RunCompleted"
        ]
    );
    let everything = streamed_run(&server, "everything").await;
    assert!(kinds(&everything).contains(&"RunContent".to_owned()));
    let plain = streamed_run(&server, "plain").await;
    assert!(plain.get("events").is_none(), "{plain}");
    // Issue 13, defect 10: on by default, as AgentOS sets it for external agents.
    let default = streamed_run(&server, "default").await;
    assert_eq!(kinds(&default), kinds(&kept), "{default}");
    let quiet: Value = client()
        .post(server.url("/agents/keeper/runs"))
        .form(&[("message", "/tool Read {}"), ("stream", "false")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        quiet.get("events").is_none(),
        "non-streamed runs store no events: {quiet}"
    );
}
