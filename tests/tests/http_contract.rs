//! The HTTP contract as a whole, against the real binary: every routed path is in
//! `/openapi.json`, and a table of malformed or hostile requests each gets a 4xx with
//! a clear message, none a 5xx, and none changes any state.

use std::path::Path;

use serde_json::Value;
use turnstile_tests::{Server, get_json, http_client as client, prometheus_sample};

/// (method, path) of every `.route(...)` in the gateway's router source, a wildcard
/// segment (`{*path}`) written as OpenAPI writes it (`{path}`).
fn routed() -> Vec<(String, String)> {
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway/src/api/mod.rs"),
    )
    .unwrap();
    let mut routes = Vec::new();
    for chunk in source.split(".route(").skip(1) {
        let end = chunk
            .find(".route(")
            .or_else(|| chunk.find(".fallback("))
            .unwrap_or(chunk.len());
        let chunk = &chunk[..end];
        let path = chunk.split('"').nth(1).unwrap().replace("{*", "{");
        for method in ["get", "post", "put", "patch", "delete"] {
            if chunk.contains(&format!("{method}(")) {
                routes.push((method.to_owned(), path.clone()));
            }
        }
    }
    routes
}

#[tokio::test]
async fn every_routed_path_is_in_the_openapi_document() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let document: Value = get_json(&server, "/openapi.json").await;
    assert_eq!(document["openapi"], "3.1.0");
    let routes = routed();
    assert!(routes.len() >= 18, "found only {routes:?}");
    for (method, path) in routes {
        assert!(
            document["paths"][&path][&method].is_object(),
            "{method} {path} is not in /openapi.json"
        );
    }
}

/// The other direction: every route the document names is served (a request to it
/// reaches a handler: never the router's "No route" 404 or its 405).
#[tokio::test]
async fn every_documented_route_is_served_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let document: Value = get_json(&server, "/openapi.json").await;
    let paths = document["paths"].as_object().unwrap();
    assert!(paths.len() >= 15, "{paths:?}");
    for (path, operations) in paths {
        let concrete: String = path
            .split('/')
            .map(|part| if part.starts_with('{') { "nope" } else { part })
            .collect::<Vec<_>>()
            .join("/");
        for method in operations.as_object().unwrap().keys() {
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let response = client()
                .request(method.clone(), server.url(&concrete))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            assert_ne!(status, 405, "{method} {path}: {body}");
            assert!(
                !(status == 404 && body.contains("No route")),
                "{method} {path} is documented but not routed: {body}"
            );
        }
    }
}

/// The schema of `#/components/schemas/...` or of a response, with the components
/// beside it so its references resolve.
fn rooted(schema: &Value, document: &Value) -> Value {
    let mut root = schema.clone();
    root["components"] = document["components"].clone();
    root
}

fn assert_valid(document: &Value, schema: &Value, instance: &Value, what: &str) {
    let validator = jsonschema::validator_for(&rooted(schema, document))
        .unwrap_or_else(|error| panic!("{what}: the schema does not compile: {error}"));
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|error| format!("{} at {}", error, error.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not match its schema: {errors:?}\n{instance}"
    );
}

/// The document is generated from the types: request bodies list their fields
/// (required ones marked), list routes their query parameters, and what the server
/// answers validates against the schema the document gives for it.
#[tokio::test]
async fn the_openapi_document_describes_bodies_parameters_and_answers_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let document: Value = get_json(&server, "/openapi.json").await;
    let schemas = &document["components"]["schemas"];
    // Bodies: every encoding names the same type, whose fields are listed.
    let body = &document["paths"]["/agents/{agent_id}/runs"]["post"]["requestBody"]["content"];
    for encoding in [
        "application/x-www-form-urlencoded",
        "multipart/form-data",
        "application/json",
    ] {
        assert_eq!(
            body[encoding]["schema"]["$ref"], "#/components/schemas/RunRequest",
            "{encoding}"
        );
    }
    let run_request = &schemas["RunRequest"];
    assert_eq!(run_request["required"], serde_json::json!(["message"]));
    for field in [
        "message",
        "stream",
        "session_id",
        "user_id",
        "background",
        "output_schema",
        "images",
        "multitask_strategy",
    ] {
        assert!(
            run_request["properties"][field].is_object(),
            "RunRequest lacks {field}"
        );
    }
    assert!(schemas["ContinueRequest"]["properties"]["continue_from"].is_object());
    assert!(
        schemas["ResumeRequest"]["properties"]["last_event_index"]["type"]
            .to_string()
            .contains("integer")
    );
    // Query parameters.
    let names = |path: &str| -> Vec<String> {
        document["paths"][path]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|parameter| parameter["in"] == "query")
            .map(|parameter| parameter["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names("/sessions"),
        [
            "type",
            "component_id",
            "user_id",
            "session_name",
            "limit",
            "page",
            "sort_by",
            "sort_order"
        ]
    );
    assert_eq!(
        names("/agents/{agent_id}/runs"),
        ["session_id", "status", "limit", "page"]
    );
    assert_eq!(names("/metrics"), ["starting_date", "ending_date"]);
    // No body or answer is left as a bare object.
    // (The document itself is the one free-form answer.)
    let mut paths = document["paths"].clone();
    paths.as_object_mut().unwrap().remove("/openapi.json");
    let text = paths.to_string();
    assert!(
        !text.contains(r#""schema":{"type":"object"}"#),
        "an untyped schema is left"
    );
    // What the server answers matches what the document says it answers.
    let run: Value = client()
        .post(server.url("/agents/scripted/runs"))
        .form(&[
            ("message", "/tool Read {\"file_path\": \"a\"}\n/reply done"),
            ("session_id", "typed"),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let ok = |path: &str, method: &str| {
        document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
            .clone()
    };
    assert_valid(
        &document,
        &ok("/agents/{agent_id}/runs", "post"),
        &run,
        "a run",
    );
    for (route, path) in [
        ("/agents", "/agents".to_owned()),
        ("/agents/{agent_id}", "/agents/scripted".to_owned()),
        (
            "/agents/{agent_id}/runs",
            "/agents/scripted/runs".to_owned(),
        ),
        (
            "/agents/{agent_id}/runs/{run_id}",
            format!("/agents/scripted/runs/{run_id}"),
        ),
        (
            "/agents/{agent_id}/runs/{run_id}/checkpoints",
            format!("/agents/scripted/runs/{run_id}/checkpoints"),
        ),
        ("/sessions", "/sessions".to_owned()),
        ("/sessions/{session_id}", "/sessions/typed".to_owned()),
        (
            "/sessions/{session_id}/runs",
            "/sessions/typed/runs".to_owned(),
        ),
        ("/metrics", "/metrics".to_owned()),
        ("/health", "/health".to_owned()),
    ] {
        let answer: Value = get_json(&server, &path).await;
        assert_valid(&document, &ok(route, "get"), &answer, &path);
    }
    let refused = client()
        .get(server.url("/agents/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);
    let refusal: Value = refused.json().await.unwrap();
    let schema = document["paths"]["/agents/{agent_id}"]["get"]["responses"]["404"]["content"]["application/json"]["schema"].clone();
    assert_valid(&document, &schema, &refusal, "a 404");
}

/// A misspelt field is refused naming it, in each encoding a POST takes, and nothing
/// is recorded; agno's own fields that turnstile does not use are accepted.
#[tokio::test]
async fn an_unknown_field_is_a_422_naming_it_in_every_encoding_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url("/agents/scripted/runs");
    let answers = [
        client()
            .post(&url)
            .form(&[
                ("message", "hi"),
                ("sesion_id", "typo"),
                ("stream", "false"),
            ])
            .send()
            .await
            .unwrap(),
        client()
            .post(&url)
            .json(&serde_json::json!({"message": "hi", "sesion_id": "typo", "stream": false}))
            .send()
            .await
            .unwrap(),
        client()
            .post(&url)
            .multipart(
                reqwest::multipart::Form::new()
                    .text("message", "hi")
                    .text("sesion_id", "typo")
                    .text("stream", "false"),
            )
            .send()
            .await
            .unwrap(),
    ];
    for answer in answers {
        assert_eq!(answer.status(), 422);
        let body: Value = answer.json().await.unwrap();
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains("unknown field \"sesion_id\""), "{detail}");
        assert!(detail.contains("session_id"), "{detail}");
        assert_eq!(body["error_type"], "validation_error");
    }
    let sessions: Value = get_json(&server, "/sessions").await;
    assert_eq!(sessions["meta"]["total_count"], 0, "nothing is recorded");
    // A typo in resume and continue too.
    let resumed = client()
        .post(server.url("/agents/scripted/runs/nope/resume"))
        .form(&[("last_event", "3")])
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 422);
    // agno's fields turnstile has no use for are accepted.
    let run = client()
        .post(&url)
        .form(&[
            ("message", "hi"),
            ("stream", "false"),
            ("session_state", "{\"a\": 1}"),
            ("add_history_to_context", "true"),
            ("version", "2"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(run.status(), 200, "{}", run.text().await.unwrap());
}

/// Every field a POST takes is named in `docs/API.md`.
#[tokio::test]
async fn every_request_field_is_in_the_api_document_17() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/API.md"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let document: Value = get_json(&server, "/openapi.json").await;
    let mut missing = Vec::new();
    for body in ["RunRequest", "ContinueRequest", "ResumeRequest"] {
        let properties = document["components"]["schemas"][body]["properties"]
            .as_object()
            .unwrap();
        for field in properties.keys() {
            if !doc.contains(&format!("`{field}`")) {
                missing.push(format!("{body}.{field}"));
            }
        }
    }
    assert!(missing.is_empty(), "not in docs/API.md: {missing:?}");
}

fn count(text: &str, name: &str) -> f64 {
    prometheus_sample(text, name).unwrap_or(-1.0)
}

#[tokio::test]
async fn hostile_requests_get_a_clear_4xx_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    // Some state to protect.
    let seeded: Value = client()
        .post(server.url("/agents/scripted/runs"))
        .form(&[
            ("message", "/tool Read {}\n/reply seed"),
            ("session_id", "seed"),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run = seeded["run_id"].as_str().unwrap().to_owned();
    let before_metrics = client()
        .get(server.url("/metrics/prometheus"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let before_sessions: Value = get_json(&server, "/sessions").await;

    let cases = turnstile_tests::hostile_cases(&run);
    assert!(cases.len() >= 50, "{} cases", cases.len());
    for case in cases {
        let turnstile_tests::HostileCase {
            status: expected,
            method,
            path,
            content_type,
            body,
            header,
        } = case;
        let mut request = client().request(method.parse().unwrap(), server.url(&path));
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type).body(body);
        }
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        assert_eq!(status, expected, "{method} {path}: {text}");
        let detail: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{method} {path}: not JSON: {text}"));
        assert!(
            detail["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{method} {path}: {text}"
        );
        assert!(
            !text.contains("/root/") && !text.contains("panicked"),
            "{method} {path} leaks: {text}"
        );
    }

    let after_metrics = client()
        .get(server.url("/metrics/prometheus"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let after_sessions: Value = get_json(&server, "/sessions").await;
    assert_eq!(
        count(&after_metrics, "turnstile_journal_records "),
        count(&before_metrics, "turnstile_journal_records ")
    );
    assert_eq!(
        after_sessions["meta"]["total_count"],
        before_sessions["meta"]["total_count"]
    );
}

/// Issue 13, defect 9: invalid UTF-8 had three answers (U+FFFD in urlencoded bodies, 422
/// in JSON, dropped in multipart); it has one, 422, and nothing is recorded.
#[tokio::test]
async fn invalid_utf8_is_refused_the_same_in_every_body_13() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut multipart = b"--XyZ\r\ncontent-disposition: form-data; name=\"message\"\r\n\r\nbad \xff\xfe\r\n--XyZ--\r\n".to_vec();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "application/x-www-form-urlencoded",
            b"stream=false&message=bad+\xff\xfe".to_vec(),
        ),
        (
            "application/x-www-form-urlencoded",
            b"stream=false&message=bad%FF%FE".to_vec(),
        ),
        (
            "application/json",
            b"{\"message\":\"bad \xff\xfe\",\"stream\":false}".to_vec(),
        ),
        (
            "multipart/form-data; boundary=XyZ",
            std::mem::take(&mut multipart),
        ),
    ];
    for (content_type, body) in cases {
        let answer = client()
            .post(server.url("/agents/scripted/runs"))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap();
        assert_eq!(status, 422, "{content_type}: {text}");
        let detail: Value = serde_json::from_str(&text).unwrap();
        assert!(
            detail["detail"].as_str().unwrap().contains("UTF-8"),
            "{content_type}: {text}"
        );
    }
    let sessions = get_json(&server, "/sessions").await;
    assert_eq!(sessions["meta"]["total_count"], 0, "{sessions}");
}

/// Issue 13, defects 2 and 3: a body announced larger than the limit is refused from its
/// `Content-Length` at once, before any of it is sent.
#[tokio::test]
async fn a_terabyte_content_length_is_refused_at_once_13() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"POST /agents/scripted/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000000000000\r\n\r\n")
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let read = stream.read(&mut answer).expect("an answer within 5 s");
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("\"error_type\":\"payload_too_large\""),
        "{answer}"
    );
}

/// `docs/API.md` names every route the router serves, each with every status the
/// served OpenAPI document gives it, and every event type the gateway renders.
#[tokio::test]
async fn every_route_status_and_event_is_in_the_api_document_17() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/API.md")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let document: Value = get_json(&server, "/openapi.json").await;
    let mut missing = Vec::new();
    for (method, path) in routed() {
        let name = format!("`{} {path}`", method.to_uppercase());
        let Some(row) = doc
            .lines()
            .find(|line| line.starts_with(&format!("| {name}")))
        else {
            missing.push(name);
            continue;
        };
        let statuses = document["paths"][&path][&method]["responses"]
            .as_object()
            .unwrap();
        for status in statuses.keys() {
            if !row.contains(status.as_str()) {
                missing.push(format!("{name} {status}"));
            }
        }
    }
    // The event types are the capitalized string literals of the renderer (its tests
    // left out).
    let source = std::fs::read_to_string(root.join("gateway/src/wire/events.rs")).unwrap();
    let events = source.split("#[cfg(test)]").next().unwrap();
    let names: std::collections::BTreeSet<&str> = events
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|text| {
            text.len() > 3
                && text.starts_with(|c: char| c.is_ascii_uppercase())
                && text.chars().all(|c| c.is_ascii_alphabetic())
        })
        .collect();
    assert!(names.len() >= 8, "{names:?}");
    for event in names {
        if !doc.contains(&format!("| `{event}` |")) {
            missing.push(event.to_owned());
        }
    }
    assert!(missing.is_empty(), "not in docs/API.md: {missing:?}");
}
