//! OpenTelemetry traces (issue 18): an OTLP receiver on loopback decodes what the real
//! binary sends with `[telemetry] otlp_endpoint`: one trace per run, a span per
//! attempt and per tool call, a delegated call's span under the delegating call's, the
//! run's ids, model, usage, status and error class as attributes; and with the
//! endpoint down, turns are unaffected.

use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_tests::otlp::Receiver;
use turnstile_tests::{Server, free_port, post_form_json};

fn attribute(span: &Value, key: &str) -> Value {
    let found = span["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|attribute| attribute["key"] == key);
    let Some(value) = found.map(|attribute| &attribute["value"]) else {
        return Value::Null;
    };
    for kind in ["stringValue", "intValue", "boolValue", "doubleValue"] {
        if let Some(value) = value.get(kind) {
            return value.clone();
        }
    }
    Value::Null
}

fn config(dir: &std::path::Path, endpoint: &str) -> std::path::PathBuf {
    let path = dir.join("turnstile.toml");
    std::fs::write(
        &path,
        format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\n\n[[agents]]\nid = \"scripted\"\nharness = \"scripted\"\nretries = 1\ndelay_between_retries_s = 0\n"
        ),
    )
    .unwrap();
    path
}

async fn run(server: &Server, session: &str, message: &str) -> Value {
    post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", message),
            ("session_id", session),
            ("stream", "false"),
        ],
    )
    .await
}

#[tokio::test]
async fn every_run_is_one_trace_with_attempt_and_tool_spans_in_their_lineage_18() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &format!("http://{}", receiver.addr));
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let nested = run(
        &server,
        "traced",
        "/tool Task {\"prompt\": \"look\"}\n/subagent #1 Read {\"file_path\": \"a\"}\n/reply done",
    )
    .await;
    let retried = run(&server, "traced", "/fail transient 1\n/reply recovered").await;
    let failed = run(&server, "traced", "/fail permanent authentication").await;
    assert_eq!(nested["status"], "COMPLETED");
    assert_eq!(retried["metadata"]["attempts"], 2, "{retried}");
    assert_eq!(failed["status"], "ERROR");
    let ids: Vec<String> = [&nested, &retried, &failed]
        .iter()
        .map(|run| run["run_id"].as_str().unwrap().to_owned())
        .collect();
    let started = Instant::now();
    let spans = loop {
        let spans = receiver.spans();
        let roots = spans.iter().filter(|span| span["name"] == "run").count();
        if roots >= 3 {
            break spans;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "only {roots} run spans: {spans:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let of_run = |run_id: &str| -> Vec<&Value> {
        spans
            .iter()
            .filter(|span| attribute(span, "turnstile.run_id") == run_id)
            .collect()
    };
    let mut traces = std::collections::HashSet::new();
    for run_id in &ids {
        let mine = of_run(run_id);
        let trace = mine[0]["traceId"].as_str().unwrap().to_owned();
        assert!(
            mine.iter().all(|span| span["traceId"] == trace.as_str()),
            "one trace per run"
        );
        assert!(traces.insert(trace), "each run its own trace");
        let roots: Vec<&&Value> = mine.iter().filter(|span| span["name"] == "run").collect();
        assert_eq!(roots.len(), 1, "{mine:?}");
        let root = roots[0];
        assert!(
            root["parentSpanId"].as_str().is_none_or(str::is_empty),
            "{root}"
        );
        assert_eq!(attribute(root, "turnstile.session_id"), "traced");
        assert_eq!(attribute(root, "gen_ai.request.model"), "scripted");
        assert_eq!(attribute(root, "turnstile.agent_id"), "scripted");
        let service = root["resource"]["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|attribute| attribute["key"] == "service.name")
            .unwrap();
        assert_eq!(service["value"]["stringValue"], "turnstile");
    }
    // The nested run: run > attempt 1 > tool Task > tool Read.
    let nested_spans = of_run(&ids[0]);
    let find = |name: &str| {
        *nested_spans
            .iter()
            .find(|span| span["name"] == name)
            .unwrap_or_else(|| panic!("no {name} span"))
    };
    let (root, attempt, task, read) = (
        find("run"),
        find("attempt 1"),
        find("tool Task"),
        find("tool Read"),
    );
    assert_eq!(attempt["parentSpanId"], root["spanId"]);
    assert_eq!(task["parentSpanId"], attempt["spanId"]);
    assert_eq!(
        read["parentSpanId"], task["spanId"],
        "the delegated call under the delegating one"
    );
    assert_eq!(attribute(root, "turnstile.status"), "COMPLETED");
    assert!(
        !attribute(root, "gen_ai.usage.output_tokens").is_null(),
        "{root}"
    );
    assert_eq!(attribute(task, "gen_ai.tool.name"), "Task");
    // The retried run: two attempts, the first failed with its class.
    let retried_spans = of_run(&ids[1]);
    let attempts: Vec<&&Value> = retried_spans
        .iter()
        .filter(|span| span["name"].as_str().unwrap().starts_with("attempt"))
        .collect();
    assert_eq!(attempts.len(), 2, "{retried_spans:?}");
    assert!(
        attempts
            .iter()
            .any(|span| attribute(span, "error.type") == "transient")
    );
    // The failed run: its status and error class.
    let failed_root = *of_run(&ids[2])
        .iter()
        .find(|span| span["name"] == "run")
        .unwrap();
    assert_eq!(attribute(failed_root, "turnstile.status"), "ERROR");
    assert_eq!(attribute(failed_root, "error.type"), "authentication");
    server.terminate();
}

#[tokio::test]
async fn with_the_endpoint_down_turns_are_unaffected_18() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens there.
    let config = config(dir.path(), &format!("http://127.0.0.1:{}", free_port()));
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let started = Instant::now();
    for turn in 0..30 {
        let answer = run(
            &server,
            "down",
            &format!("/tool Read {{}}\n/reply turn {turn}"),
        )
        .await;
        assert_eq!(answer["status"], "COMPLETED", "{answer}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "30 turns took {:?}",
        started.elapsed()
    );
    let stopping = Instant::now();
    server.terminate();
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "the stop waited {:?}",
        stopping.elapsed()
    );
}
