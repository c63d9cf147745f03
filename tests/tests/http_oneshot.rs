//! The HTTP contract's error cases through the gateway's router in process
//! (`Router::oneshot`: no socket, no binary, milliseconds a case), beside the run of the
//! same table against the real binary in `http_contract.rs`: every hostile request gets
//! its status and a JSON `detail`, and the journal is unchanged.

use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use turnstile_actors::{Runtime, RuntimeConfig};
use turnstile_gateway::api::sse::SseOptions;
use turnstile_gateway::api::{AppState, router};
use turnstile_gateway::config::Config;

/// One request through a fresh copy of the router: its status and its body's text.
async fn send(
    state: &AppState,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: String,
    header: Option<(&str, &str)>,
) -> (u16, String) {
    let mut request = hyper::Request::builder().method(method).uri(path);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    let response = router(state.clone())
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hostile_table_through_the_router_28() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default_config();
    config.set_data_dir(dir.path());
    let runtime = Runtime::open(RuntimeConfig::new(
        dir.path().to_path_buf(),
        config.agent_specs().unwrap(),
    ))
    .unwrap();
    let state = AppState {
        runtime: runtime.clone(),
        shutdown: Default::default(),
        sse: SseOptions {
            shutdown: Default::default(),
            keepalive: std::time::Duration::from_secs(15),
        },
        auth: std::sync::Arc::new(turnstile_gateway::auth::Auth::Open),
        stored_events: std::sync::Arc::new(config.stored_events()),
        max_request_bytes: config.server.max_request_bytes,
        max_message_bytes: config.server.max_message_bytes,
        body_timeout: std::time::Duration::from_secs(30),
    };
    // Some state to protect.
    let (status, seeded) = send(
        &state,
        "POST",
        "/agents/scripted/runs",
        Some("application/x-www-form-urlencoded"),
        "message=%2Ftool+Read+%7B%7D%0A%2Freply+seed&session_id=seed&stream=false".into(),
        None,
    )
    .await;
    assert_eq!(status, 200, "{seeded}");
    let seeded: Value = serde_json::from_str(&seeded).unwrap();
    let run = seeded["run_id"].as_str().unwrap().to_owned();
    let records = runtime.journal().next_pos();

    let cases = turnstile_tests::hostile_cases(&run);
    assert!(cases.len() >= 50, "{} cases", cases.len());
    for case in &cases {
        let header = case
            .header
            .as_ref()
            .map(|(name, value)| (name.as_str(), value.as_str()));
        let (status, text) = send(
            &state,
            &case.method,
            &case.path,
            case.content_type.as_deref(),
            case.body.clone(),
            header,
        )
        .await;
        let what = format!("{} {}", case.method, case.path);
        assert_eq!(status, case.status, "{what}: {text}");
        let detail: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: not JSON: {text}"));
        assert!(
            detail["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{what}: {text}"
        );
        assert!(
            !text.contains("/tmp/") && !text.contains("panicked"),
            "{what} leaks: {text}"
        );
    }
    assert_eq!(
        runtime.journal().next_pos(),
        records,
        "a hostile request was journaled"
    );
    runtime.shutdown().await.unwrap();
}
