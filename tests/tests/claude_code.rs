//! The Claude Code harness end to end (issue 6): the real `claude` CLI, driven by the
//! real `turnstile` binary on loopback, against the fake Anthropic Messages API of
//! `tests/src/fake_anthropic.rs`. Each test scripts the model in its prompts.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstile_tests::claude::{claude_bin, claude_config, cli_pids};
use turnstile_tests::fake_anthropic::FakeAnthropic;
use turnstile_tests::{Server, event_types, get_json, http_client as client, parse_sse, turnstile};

async fn run(server: &Server, session: &str, message: &str) -> Value {
    client()
        .post(server.url("/agents/claude/runs"))
        .form(&[
            ("message", message),
            ("session_id", session),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The journal's events of a data directory no server holds, as exported JSON.
fn exported(data_dir: &Path) -> Vec<Value> {
    let out = turnstile(&[
        "journal",
        "export",
        "--data-dir",
        data_dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The transcript lines the journal holds, in order.
fn journaled_lines(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e["event"]["TranscriptLineAppended"]["line"].as_str())
        .map(str::to_owned)
        .collect()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
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
            ("message", "@bash echo hello-tool\n@read /nonexistent/file.txt\n@task @bash echo from-sub;;@reply sub done\n@reply all done here"),
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
