//! The Claude Code harness end to end (issue 6): the real `claude` CLI, driven by the
//! real `turnstile` binary on loopback, against the fake Anthropic Messages API of
//! `tests/src/fake_anthropic.rs`. Each test scripts the model in its prompts.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstile_tests::claude::{claude_bin, claude_config, cli_pids, processes_running};
use turnstile_tests::fake_anthropic::FakeAnthropic;
use turnstile_tests::{
    Server, event_types, get_json, http_client as client, parse_sse, post_form_json, turnstile_ok,
    wait_until_passivated,
};

async fn run(server: &Server, session: &str, message: &str) -> Value {
    let form = [
        ("message", message),
        ("session_id", session),
        ("stream", "false"),
    ];
    post_form_json(server, "/agents/claude/runs", &form).await
}

/// Cancels a run and waits (at most 5 s) until it reads `CANCELLED`.
async fn cancel_and_wait(server: &Server, run_id: &str, session: &str) {
    let cancelled_at = Instant::now();
    post_form_json(server, &format!("/agents/claude/runs/{run_id}/cancel"), &[]).await;
    let path = format!("/agents/claude/runs/{run_id}?session_id={session}");
    while get_json(server, &path).await["status"] != "CANCELLED" {
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(5),
            "the run did not end CANCELLED"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The journal's events of a data directory no server holds, as exported JSON.
fn exported(data_dir: &Path) -> Vec<Value> {
    turnstile_ok(&[
        "journal",
        "export",
        "--data-dir",
        data_dir.to_str().unwrap(),
    ])
    .lines()
    .map(|line| serde_json::from_str(line).unwrap())
    .collect()
}

/// The transcript lines the journal holds, in order (mirrored one by one, or with
/// a compaction outside a turn).
fn journaled_lines(events: &[Value]) -> Vec<String> {
    let mut lines = Vec::new();
    for event in events {
        if let Some(line) = event["event"]["TranscriptLineAppended"]["line"].as_str() {
            lines.push(line.to_owned());
        }
        for line in event["event"]["TranscriptCompacted"]["lines"]
            .as_array()
            .into_iter()
            .flatten()
        {
            lines.push(line.as_str().unwrap().to_owned());
        }
    }
    lines
}

fn wait_until(what: &str, done: impl FnMut() -> bool) {
    turnstile_tests::wait_until(what, Duration::from_secs(20), done);
}

#[tokio::test]
async fn a_streamed_turn_reports_text_tools_subagents_and_metrics() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let config = claude_config(dir.path(), &bin, &fake, "", "");
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);

    let body = client()
        .post(server.url("/agents/claude/runs"))
        .form(&[
            ("message", "@bash echo hello-tool\n@read /nonexistent/file.txt\n@task @bash echo from-sub;;@reply sub done\n@usage 100 20 30 40\n@reply all done here"),
            ("session_id", "s1"),
            ("stream", "true"),
        ])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let frames = parse_sse(&body);
    let types = event_types(&frames);
    assert_eq!(types.first(), Some(&"RunStarted"), "{types:?}");
    assert_eq!(types.last(), Some(&"RunCompleted"), "{body}");
    let data_of = |frame: &turnstile_tests::Frame| -> Value { frame.data.clone() };
    let started = data_of(&frames[0]);
    assert_eq!(started["model"], "claude-sonnet-4-6");
    assert_eq!(started["model_provider"], "anthropic");

    // Text arrives as deltas (the fake streams a word per delta).
    let deltas: Vec<String> = frames
        .iter()
        .filter(|f| f.event == "RunContent")
        .map(|f| data_of(f)["content"].as_str().unwrap().to_owned())
        .collect();
    assert!(deltas.len() >= 3, "{deltas:?}");
    assert_eq!(deltas.concat(), "all done here");

    let completed: Vec<Value> = frames
        .iter()
        .filter(|f| f.event == "ToolCallCompleted")
        .map(|f| data_of(f)["tool"].clone())
        .collect();
    let bash = completed
        .iter()
        .find(|t| t["tool_args"]["command"] == "echo hello-tool")
        .unwrap();
    assert_eq!(bash["tool_name"], "Bash");
    assert_eq!(bash["result"], "hello-tool");
    assert_eq!(bash["tool_call_error"], false);
    let read = completed.iter().find(|t| t["tool_name"] == "Read").unwrap();
    assert_eq!(read["tool_call_error"], true, "{read}");
    let task = completed
        .iter()
        .find(|t| t["tool_name"] == "Agent" || t["tool_name"] == "Task")
        .unwrap();
    let sub = completed
        .iter()
        .find(|t| t["tool_args"]["command"] == "echo from-sub")
        .unwrap();
    assert_eq!(sub["parent_tool_call_id"], task["tool_call_id"]);
    assert_eq!(sub["result"], "from-sub");
    assert!(task["parent_tool_call_id"].is_null());

    let end = data_of(frames.last().unwrap());
    assert_eq!(end["content"], "all done here");
    let metrics = &end["metrics"];
    assert!(metrics["input_tokens"].as_u64().unwrap() > 0, "{metrics}");
    assert!(metrics["output_tokens"].as_u64().unwrap() > 0, "{metrics}");
    assert!(metrics["cost"].as_f64().unwrap() > 0.0, "{metrics}");
    // Four model requests of the main agent at 100/20/30/40, plus the subagent's own.
    assert!(
        metrics["input_tokens"].as_u64().unwrap() >= 400,
        "{metrics}"
    );
    assert!(
        metrics["cache_read_tokens"].as_u64().unwrap() >= 120,
        "{metrics}"
    );
    assert!(
        metrics["cache_write_tokens"].as_u64().unwrap() >= 160,
        "{metrics}"
    );
    assert_eq!(
        metrics["total_tokens"].as_u64().unwrap(),
        metrics["input_tokens"].as_u64().unwrap() + metrics["output_tokens"].as_u64().unwrap()
    );
    assert_eq!(metrics["details"]["model"][0]["id"], "claude-sonnet-4-6");
    assert_eq!(metrics["details"]["model"][0]["provider"], "anthropic");
    assert_eq!(metrics["additional_metrics"]["num_turns"], 4, "{metrics}");
    assert!(
        metrics["additional_metrics"]["api_duration"]
            .as_f64()
            .is_some()
    );
    server.terminate();
    assert!(cli_pids(&data).is_empty(), "a CLI outlived the server");

    // Every line of the CLI's transcript file is in the journal, in order, once.
    let events = exported(&data);
    let lines = journaled_lines(&events);
    let run_started = events
        .iter()
        .find_map(|e| e["event"].get("RunStarted"))
        .unwrap();
    assert_eq!(run_started["model"], "claude-sonnet-4-6");
    assert_eq!(run_started["model_provider"], "anthropic");
    let mut uuids = HashSet::new();
    for line in &lines {
        let value: Value = serde_json::from_str(line).unwrap();
        if let Some(uuid) = value["uuid"].as_str() {
            assert!(uuids.insert(uuid.to_owned()), "line {uuid} journaled twice");
        }
    }
    let files: Vec<_> = walk(&data.join("harness"))
        .into_iter()
        .filter(|p| {
            p.extension().is_some_and(|e| e == "jsonl")
                && !p.to_string_lossy().contains("subagents")
        })
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = std::fs::read_to_string(&files[0]).unwrap();
    let file_lines: Vec<&str> = file.lines().collect();
    assert!(
        file_lines.len() >= lines.len() && lines.len() > 10,
        "{} {}",
        file_lines.len(),
        lines.len()
    );
    assert_eq!(
        file_lines[..lines.len()],
        lines.iter().map(String::as_str).collect::<Vec<_>>()[..]
    );
    // Lines written after the answer are picked up by the next turn; none with a uuid.
    for late in &file_lines[lines.len()..] {
        assert!(!late.contains("\"uuid\""), "{late}");
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The text the fake model saw in the last request of the prompt holding `marker`.
fn seen_by_model(fake: &FakeAnthropic, marker: &str) -> String {
    fake.last_request_with(marker).conversation_text()
}

#[tokio::test]
async fn a_session_resumes_after_restart_passivation_and_on_another_server() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    // No warm processes: every turn starts the CLI from the journal's transcript.
    let config = claude_config(
        dir.path(),
        &bin,
        &fake,
        "session_idle_s = 1",
        "warm_processes = 0",
    );
    let config = config.to_str().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config]);
    let first = run(
        &server,
        "s",
        "The secret is KIWI-42.\n@bash echo tool-said-MANGO\n@reply noted",
    )
    .await;
    assert_eq!(first["status"], "COMPLETED", "{first}");
    server.terminate();

    // The CLI's own files are disposable: the journal alone restores the session.
    std::fs::remove_dir_all(data.join("harness")).unwrap();
    let server = Server::start_with(&data, &["--config", config]);
    let second = run(&server, "s", "after restart\n@reply second answer").await;
    assert_eq!(second["status"], "COMPLETED", "{second}");
    let seen = seen_by_model(&fake, "after restart");
    for earlier in ["KIWI-42", "tool-said-MANGO", "noted"] {
        assert!(
            seen.contains(earlier),
            "the model did not see {earlier:?}: {seen}"
        );
    }

    // After passivation (idle 1 s; actors check every 5 s) the next turn resumes too.
    wait_until_passivated(&server, 1).await;
    let third = run(&server, "s", "after passivation\n@reply third answer").await;
    assert_eq!(third["status"], "COMPLETED", "{third}");
    let seen = seen_by_model(&fake, "after passivation");
    assert!(
        seen.contains("KIWI-42") && seen.contains("second answer"),
        "{seen}"
    );
    server.terminate();

    // A second machine: a copy made with export and import, no CLI files at all.
    let export = dir.path().join("journal.jsonl");
    turnstile_ok(&[
        "journal",
        "export",
        "--data-dir",
        data.to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
    ]);
    let other = dir.path().join("other");
    turnstile_ok(&[
        "journal",
        "import",
        "--in",
        export.to_str().unwrap(),
        "--data-dir",
        other.to_str().unwrap(),
    ]);
    let server = Server::start_with(&other, &["--config", config]);
    let fourth = run(&server, "s", "on the other server\n@reply fourth answer").await;
    assert_eq!(fourth["status"], "COMPLETED", "{fourth}");
    let seen = seen_by_model(&fake, "on the other server");
    for earlier in [
        "KIWI-42",
        "tool-said-MANGO",
        "second answer",
        "third answer",
    ] {
        assert!(
            seen.contains(earlier),
            "the model did not see {earlier:?}: {seen}"
        );
    }
    let session = get_json(&server, "/sessions/s").await;
    assert_eq!(session["runs"].as_array().map(Vec::len).unwrap_or(4), 4);
    server.terminate();
}

#[tokio::test]
async fn continuing_from_a_tool_checkpoint_forks_the_claude_session() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let config = claude_config(dir.path(), &bin, &fake, "", "");
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);
    let source = run(
        &server,
        "s",
        "two steps\n@bash echo step-ONE\n@bash echo step-TWO\n@reply both done",
    )
    .await;
    assert_eq!(source["status"], "COMPLETED", "{source}");
    let later = run(&server, "s", "a later turn LATER-MARK\n@reply later").await;
    assert_eq!(later["status"], "COMPLETED", "{later}");
    let run_id = source["run_id"].as_str().unwrap();
    let checkpoints = get_json(
        &server,
        &format!("/agents/claude/runs/{run_id}/checkpoints?session_id=s"),
    )
    .await;
    let first = &checkpoints["checkpoints"][0];
    assert_eq!(first["reason"], "checkpoint", "{checkpoints}");
    let index = first["message_index"].to_string();

    let continued: Value = client()
        .post(server.url(&format!("/agents/claude/runs/{run_id}/continue")))
        .form(&[
            ("continue_from", index.as_str()),
            ("input", "go on from there FORK-MARK\n@reply forked answer"),
            ("stream", "false"),
            ("session_id", "s"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(continued["status"], "COMPLETED", "{continued}");
    assert_eq!(continued["content"], "forked answer");
    assert_eq!(continued["forked_from_run_id"], run_id);
    let request = fake.last_request_with("FORK-MARK");
    let seen = request.conversation_text();
    assert!(seen.contains(r#""command":"echo step-ONE""#), "{seen}");
    let results = seen_tool_results(&request.body);
    assert_eq!(results, ["step-ONE"], "the fork keeps the first batch only");
    for later in [r#""command":"echo step-TWO""#, "LATER-MARK"] {
        assert!(!seen.contains(later), "the fork saw {later:?}: {seen}");
    }
    // The source run is untouched.
    let again = get_json(
        &server,
        &format!("/agents/claude/runs/{run_id}?session_id=s"),
    )
    .await;
    assert_eq!(again["content"], "both done");
    assert_eq!(again["tools"].as_array().unwrap().len(), 2);
    // The next turn follows the newest branch: the fork.
    let next = run(&server, "s", "next NEXT-MARK\n@reply next").await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
    let seen = seen_by_model(&fake, "NEXT-MARK");
    assert!(
        seen.contains("FORK-MARK") && !seen.contains("LATER-MARK"),
        "{seen}"
    );
    server.terminate();
}

#[tokio::test]
async fn compaction_goes_through_the_cli_and_survives_a_restart() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let config = claude_config(dir.path(), &bin, &fake, "", "");
    let config = config.to_str().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config]);
    for (i, marker) in ["OLD-ONE", "OLD-TWO"].iter().enumerate() {
        let answer = run(
            &server,
            "s",
            &format!("turn {i} {marker}\n@reply answer {i}"),
        )
        .await;
        assert_eq!(answer["status"], "COMPLETED", "{answer}");
    }
    let compacted: Value = client()
        .post(server.url("/agents/claude/sessions/s/compact"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(compacted["compacted"], true, "{compacted}");
    assert_eq!(compacted["status"], "compacted");
    server.terminate();

    let events = exported(&data);
    let lines = journaled_lines(&events);
    assert!(
        lines.iter().any(|l| l.contains("compact_boundary")),
        "no boundary journaled"
    );
    assert!(
        lines.iter().any(|l| l.contains("FAKE SUMMARY")),
        "no summary journaled"
    );
    assert!(
        events
            .iter()
            .any(|e| e["event"].get("TranscriptCompacted").is_some())
    );

    std::fs::remove_dir_all(data.join("harness")).unwrap();
    let server = Server::start_with(&data, &["--config", config]);
    let after = run(&server, "s", "after compaction AFTER-MARK\n@reply fine").await;
    assert_eq!(after["status"], "COMPLETED", "{after}");
    let seen = seen_by_model(&fake, "AFTER-MARK");
    assert!(seen.contains("FAKE SUMMARY"), "{seen}");
    assert!(
        !seen.contains("OLD-ONE"),
        "the compacted turn is still sent: {seen}"
    );

    // `/compact` as a message compacts too.
    let message = run(&server, "s", "/compact").await;
    assert_eq!(message["status"], "COMPLETED", "{message}");
    server.terminate();
    let events = exported(&data);
    let compactions = events
        .iter()
        .filter(|e| e["event"].get("TranscriptCompacted").is_some())
        .count();
    assert_eq!(compactions, 2);
}

/// The tool results in a request's messages, in order.
fn seen_tool_results(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result")
        .map(|b| match &b["content"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// The harness session each attempt of a run used, from the journal.
fn attempt_sessions(events: &[Value], run_id: &str) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e["event"].get("AttemptStarted"))
        .filter(|a| a["run_id"] == run_id)
        .map(|a| a["harness_session_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn api_errors_are_classified_and_transient_ones_retried_on_the_same_session() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let config = claude_config(
        dir.path(),
        &bin,
        &fake,
        "",
        "retries = 2\ndelay_between_retries_s = 0.05",
    );
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);
    let mut retried = Vec::new();
    for status in ["529", "429", "500"] {
        let answer = run(
            &server,
            "s",
            &format!("flaky {status}\n@error {status} x1\n@reply recovered {status}"),
        )
        .await;
        assert_eq!(answer["status"], "COMPLETED", "{answer}");
        assert_eq!(answer["content"], format!("recovered {status}"));
        assert_eq!(answer["metadata"]["attempts"], 2, "{answer}");
        retried.push(answer["run_id"].as_str().unwrap().to_owned());
    }
    for (status, error_type) in [
        ("401", "authentication"),
        ("context", "context_window"),
        ("400", "invalid_request"),
    ] {
        let marker = format!("permanent {status}");
        let answer = run(&server, "s", &format!("{marker}\n@error {status}")).await;
        assert_eq!(answer["status"], "ERROR", "{answer}");
        assert_eq!(answer["metadata"]["error_type"], error_type, "{answer}");
        assert!(
            answer["metadata"]["attempts"].is_null(),
            "a permanent {status} was retried: {answer}"
        );
        assert_eq!(answer["metadata"]["warnings"], json!([]), "{answer}");
    }
    server.terminate();
    let events = exported(&data);
    for run_id in retried {
        let sessions = attempt_sessions(&events, &run_id);
        assert_eq!(sessions.len(), 2, "{sessions:?}");
        assert_eq!(
            sessions[0], sessions[1],
            "a retry must resume the same Claude session"
        );
    }
}

#[tokio::test]
async fn cancel_stops_the_cli_and_no_cli_outlives_the_server() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let config = claude_config(dir.path(), &bin, &fake, "", "");
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);

    // A slow stream, cancelled once text has arrived.
    let accepted = post_form_json(
        &server,
        "/agents/claude/runs",
        &[
            (
                "message",
                "@slow 400\n@reply one two three four five six seven eight nine ten",
            ),
            ("session_id", "slow"),
            ("background", "true"),
            ("stream", "false"),
        ],
    )
    .await;
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let path = format!("/agents/claude/runs/{run_id}?session_id=slow");
    let deadline = Instant::now() + Duration::from_secs(20);
    while get_json(&server, &path).await["content"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "no text arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel_and_wait(&server, &run_id, "slow").await;
    wait_until("the cancelled CLI is gone", || cli_pids(&data).is_empty());

    // A tool call in progress: the command the CLI started dies with it.
    let accepted = post_form_json(
        &server,
        "/agents/claude/runs",
        &[
            ("message", "@bash echo started; sleep 37.25\n@reply never"),
            ("session_id", "tool"),
            ("background", "true"),
            ("stream", "false"),
        ],
    )
    .await;
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    wait_until("the tool runs", || processes_running("sleep 37.25") > 0);
    cancel_and_wait(&server, &run_id, "tool").await;
    wait_until("the tool's command is gone", || {
        processes_running("sleep 37.25") == 0
    });
    wait_until("the cancelled CLI is gone", || cli_pids(&data).is_empty());

    // The session takes the next turn; its warm process dies with the server.
    let next = run(&server, "tool", "@reply after cancel").await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
    assert_eq!(cli_pids(&data).len(), 1, "one warm process");
    server.terminate();
    assert!(cli_pids(&data).is_empty(), "a CLI outlived the server");
}

#[tokio::test]
async fn structured_output_and_attachments_reach_the_cli() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let config = claude_config(dir.path(), &bin, &fake, "", "");
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);
    let schema = json!({"title": "Person", "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]})
    .to_string();
    let answer = post_form_json(
        &server,
        "/agents/claude/runs",
        &[
            ("message", "who?\n@json {\"name\": \"Ada\", \"age\": 36}"),
            ("session_id", "s"),
            ("stream", "false"),
            ("output_schema", &schema),
        ],
    )
    .await;
    assert_eq!(answer["status"], "COMPLETED", "{answer}");
    assert_eq!(answer["content"], json!({"name": "Ada", "age": 36}));
    assert_eq!(answer["content_type"], "Person");
    let request = fake.last_request_with("who?");
    assert!(
        request.body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "StructuredOutput"),
        "the schema did not reach the CLI"
    );

    let form = reqwest::multipart::Form::new()
        .text("message", "@read-attached\n@reply read it")
        .text("session_id", "s")
        .text("stream", "false")
        .part(
            "files",
            reqwest::multipart::Part::bytes(b"ATTACHED-CONTENT-123\n".to_vec())
                .file_name("notes.txt")
                .mime_str("text/plain")
                .unwrap(),
        );
    let answer: Value = client()
        .post(server.url("/agents/claude/runs"))
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["status"], "COMPLETED", "{answer}");
    let read = &answer["tools"][0];
    assert_eq!(read["tool_name"], "Read", "{answer}");
    assert!(
        read["tool_args"]["file_path"]
            .as_str()
            .unwrap()
            .ends_with("notes.txt"),
        "{read}"
    );
    assert!(
        read["result"]
            .as_str()
            .unwrap()
            .contains("ATTACHED-CONTENT-123"),
        "{read}"
    );
    assert_eq!(read["tool_call_error"], false);
    server.terminate();
}

#[tokio::test]
async fn warm_processes_serve_turns_are_evicted_and_replaced_when_they_die() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let config = claude_config(dir.path(), &bin, &fake, "", "warm_processes = 1");
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);
    let first = run(&server, "a", "first in a APPLE\n@reply one").await;
    assert_eq!(first["status"], "COMPLETED", "{first}");
    let warm = cli_pids(&data);
    assert_eq!(warm.len(), 1, "{warm:?}");
    let second = run(&server, "a", "second in a\n@reply two").await;
    assert_eq!(second["status"], "COMPLETED", "{second}");
    assert_eq!(
        cli_pids(&data),
        warm,
        "the warm process served the next turn"
    );

    // Another session takes the only warm slot: the least recently used goes.
    let other = run(&server, "b", "first in b\n@reply three").await;
    assert_eq!(other["status"], "COMPLETED", "{other}");
    wait_until("one warm process is left", || cli_pids(&data).len() == 1);
    assert_ne!(cli_pids(&data), warm, "session a's process was evicted");

    // A warm process that dies is replaced and the turn succeeds with its history.
    let victim = cli_pids(&data)[0];
    std::process::Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .unwrap();
    wait_until("the warm process is dead", || {
        !cli_pids(&data).contains(&victim)
    });
    let after = run(&server, "b", "after the crash BANANA\n@reply four").await;
    assert_eq!(after["status"], "COMPLETED", "{after}");
    assert_eq!(after["content"], "four");
    let seen = seen_by_model(&fake, "BANANA");
    assert!(seen.contains("first in b"), "{seen}");
    // And session a, evicted, resumes from the journal.
    let back = run(&server, "a", "back in a CHERRY\n@reply five").await;
    assert_eq!(back["status"], "COMPLETED", "{back}");
    let seen = seen_by_model(&fake, "CHERRY");
    assert!(
        seen.contains("APPLE") && seen.contains("second in a"),
        "{seen}"
    );
    server.terminate();
}

/// Writes, through the journal's own API, a session whose finished turn left a Claude
/// session with bookkeeping lines only (as a CLI killed before it saved the
/// conversation would): the CLI will find no conversation to resume.
async fn leave_an_unresumable_session(data: &Path) -> String {
    use turnstile_journal::{Event, Expected, Journal, JournalOptions, RunId, SessionId};
    let journal = Journal::open(data, JournalOptions::default()).unwrap();
    let run_id = RunId::new_v7();
    let claude_session = uuid::Uuid::now_v7().to_string();
    let bookkeeping = json!({"type": "queue-operation", "operation": "enqueue",
        "timestamp": "2026-11-30T10:00:00.000Z", "sessionId": claude_session, "content": "hello"});
    let events = vec![
        Event::SessionCreated {
            agent_id: "claude".into(),
            user_id: None,
        },
        Event::RunQueued {
            run_id: run_id.clone(),
            agent_id: "claude".into(),
            user_id: None,
            input: "The secret is LIME-7.".into(),
            options: Default::default(),
        },
        Event::RunStarted {
            run_id: run_id.clone(),
            model: "claude-sonnet-4-6".into(),
            model_provider: "anthropic".into(),
        },
        Event::AttemptStarted {
            run_id: run_id.clone(),
            attempt: 1,
            harness_session_id: claude_session.clone(),
        },
        Event::TranscriptLineAppended {
            run_id: run_id.clone(),
            harness_session_id: claude_session.clone(),
            line: bookkeeping.to_string(),
        },
        Event::RunEventEmitted {
            run_id: run_id.clone(),
            event_index: turnstile_journal::EventIndex(0),
            event: turnstile_journal::RunEvent::Completed {
                content: "Noted the secret.".into(),
                content_type: "str".into(),
                metrics: Default::default(),
            },
        },
        Event::RunCompleted { run_id },
    ];
    journal
        .append(&SessionId::parse("lost").unwrap(), Expected::Any, events)
        .await
        .unwrap()
        .unwrap();
    journal.close().unwrap();
    claude_session
}

#[tokio::test]
async fn a_claude_session_that_cannot_be_resumed_falls_back_to_a_fresh_one_with_history() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let config = claude_config(dir.path(), &bin, &fake, "", "");
    let data = dir.path().join("data");
    let lost = leave_an_unresumable_session(&data).await;
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);

    let answer = run(
        &server,
        "lost",
        "what was it? FALLBACK-MARK\n@reply it was lime",
    )
    .await;
    assert_eq!(answer["status"], "COMPLETED", "{answer}");
    assert_eq!(answer["content"], "it was lime");
    let warnings = answer["metadata"]["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{answer}");
    assert_eq!(warnings[0]["type"], "session_fallback");
    assert!(
        warnings[0]["error"]
            .as_str()
            .unwrap()
            .contains("No conversation found"),
        "{answer}"
    );
    // The fresh Claude session was seeded with the history, the current message last.
    let prompt = fake.last_request_with("FALLBACK-MARK").prompt_text();
    assert!(prompt.starts_with("Previous conversation"), "{prompt}");
    assert!(
        prompt.contains("user: The secret is LIME-7.")
            && prompt.contains("assistant: Noted the secret."),
        "{prompt}"
    );
    assert!(
        prompt.contains("Current message:\nwhat was it? FALLBACK-MARK"),
        "{prompt}"
    );

    // The next turn resumes the new Claude session: no second fallback.
    let next = run(&server, "lost", "and now? NEXT-MARK\n@reply still lime").await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
    assert_eq!(next["metadata"]["warnings"], json!([]), "{next}");
    let seen = seen_by_model(&fake, "NEXT-MARK");
    assert!(
        seen.contains("LIME-7") && seen.contains("it was lime"),
        "{seen}"
    );
    server.terminate();
    let events = exported(&data);
    let sessions: HashSet<String> = events
        .iter()
        .filter_map(|e| e["event"].get("AttemptStarted"))
        .map(|a| a["harness_session_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    assert!(sessions.contains(&lost));
}
