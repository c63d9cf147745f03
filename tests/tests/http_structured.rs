//! Structured output over HTTP against the real binary: `output_schema` checked on
//! entry, the parsed object as content with the schema's title as content type, and a
//! non-conforming answer ending the run `ERROR` with the failing path.

use serde_json::{Value, json};
use turnstile_tests::{Server, http_client as client, parse_sse};

fn schema() -> String {
    json!({
        "title": "Company",
        "type": "object",
        "properties": {"name": {"type": "string"}, "employees": {"type": "integer"}},
        "required": ["name"],
    })
    .to_string()
}

async fn run(
    server: &Server,
    message: &str,
    output_schema: &str,
    stream: &str,
) -> reqwest::Response {
    client()
        .post(server.url("/agents/scripted/runs"))
        .form(&[
            ("message", message),
            ("output_schema", output_schema),
            ("stream", stream),
        ])
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_conforming_answer_is_the_parsed_object() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let body: Value = run(
        &server,
        r#"/json {"name": "Acme", "employees": 5}"#,
        &schema(),
        "false",
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(body["status"], "COMPLETED");
    assert_eq!(body["content"], json!({"name": "Acme", "employees": 5}));
    assert_eq!(body["content_type"], "Company");
    let streamed = run(&server, r#"/json {"name": "Beta"}"#, &schema(), "true")
        .await
        .text()
        .await
        .unwrap();
    let frames = parse_sse(&streamed);
    let completed = frames.last().unwrap();
    assert_eq!(completed.event, "RunCompleted");
    assert_eq!(completed.data["content"], json!({"name": "Beta"}));
    assert_eq!(completed.data["content_type"], "Company");
}

#[tokio::test]
async fn a_non_conforming_answer_ends_the_run_in_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let body: Value = run(
        &server,
        r#"/json {"name": "Acme", "employees": "many"}"#,
        &schema(),
        "false",
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(body["status"], "ERROR");
    assert!(
        body["content"].as_str().unwrap().contains("/employees"),
        "{body}"
    );
    assert_eq!(body["metadata"]["error_type"], "output_validation");
    let text: Value = run(&server, "/reply just words", &schema(), "false")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(text["status"], "ERROR");
    assert!(
        text["content"].as_str().unwrap().contains("not JSON"),
        "{text}"
    );
}

#[tokio::test]
async fn schemas_are_checked_on_entry() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    for bad in [
        r#"{"type": "array"}"#,
        "{not json",
        r#"{"type": "object", "properties": {"a": {"type": "bogus"}}}"#,
        "[]",
        // Issue 13, defect 10: a root without `"type": "object"`, as agno refuses it.
        r#"{"properties": {"a": {"type": "string"}}}"#,
        // Issue 32, item 2: `null` is a root that is not an object, not "no schema".
        "null",
        r#""a string""#,
    ] {
        let response = run(&server, "hi", bad, "false").await;
        assert_eq!(response.status(), 422, "{bad}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["detail"].as_str().unwrap().contains("output_schema"),
            "{body}"
        );
    }
}
