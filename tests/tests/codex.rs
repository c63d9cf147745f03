//! The Codex harness end to end (issue 15): the real `codex` CLI (app-server), driven by
//! the real `turnstile` binary on loopback, against the fake Responses API of
//! `tests/src/fake_openai.rs`. Each test scripts the model in its prompts.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstile_tests::claude::processes_running;
use turnstile_tests::codex::{codex_bin, codex_config};
use turnstile_tests::fake_openai::FakeOpenAi;
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
    post_form_json(server, "/agents/codex/runs", &form).await
}

/// The fake model, a directory and a server with one codex agent talking to it.
fn started(bin: &Path) -> (FakeOpenAi, tempfile::TempDir, Server) {
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let config = codex_config(dir.path(), bin, &fake, "", "");
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    (fake, dir, server)
}

/// What the model was sent with the prompt holding `marker`: user messages, answers
/// and tool outputs, one a line.
fn seen_by_model(fake: &FakeOpenAi, marker: &str) -> String {
    let request = fake.last_request_with(marker);
    let mut seen = request.user_texts();
    seen.extend(request.assistant_texts());
    seen.extend(request.tool_outputs());
    seen.join("\n")
}

#[tokio::test]
async fn a_turn_streams_text_tool_calls_and_exact_metrics() {
    let Some(bin) = codex_bin() else { return };
    let (fake, _dir, server) = started(&bin);
    let body = client()
        .post(server.url("/agents/codex/runs"))
        .form(&[
            (
                "message",
                "work\n@reasoning Thinking about kiwis.\n@bash echo hello-codex-tool\n@bash sh -c 'echo oops; exit 3'\n@search kiwi facts\n@two all done",
            ),
            ("session_id", "tools"),
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
    let tools: Vec<&Value> = frames
        .iter()
        .filter(|frame| frame.event == "ToolCallCompleted")
        .map(|frame| &frame.data["tool"])
        .collect();
    assert_eq!(tools.len(), 3, "{body}");
    assert_eq!(tools[2]["tool_name"], "web_search", "{}", tools[2]);
    assert_eq!(tools[2]["tool_args"]["query"], "kiwi facts", "{}", tools[2]);
    assert_eq!(tools[0]["tool_name"], "shell");
    assert!(
        tools[0]["tool_args"]["command"]
            .as_str()
            .unwrap()
            .contains("echo hello-codex-tool"),
        "{}",
        tools[0]
    );
    assert_eq!(tools[0]["result"], "hello-codex-tool\n");
    assert_eq!(tools[0]["tool_call_error"], false);
    assert_eq!(tools[1]["tool_call_error"], true);
    assert!(
        tools[1]["result"]
            .as_str()
            .unwrap()
            .ends_with("\n[exit code 3]"),
        "{}",
        tools[1]
    );
    // Reasoning streams beside the answer, as agno's CodexAgent shows it.
    let reasoning: String = frames
        .iter()
        .filter(|frame| frame.event == "RunContent")
        .filter_map(|frame| frame.data["reasoning_content"].as_str())
        .collect();
    assert_eq!(reasoning, "Thinking about kiwis.", "{body}");
    // Two messages read as one text with a blank line between them; the answer is
    // the last message.
    let streamed: String = frames
        .iter()
        .filter(|frame| frame.event == "RunContent")
        .map(|frame| frame.data["content"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, "First part.\n\nall done");
    let completed = &frames.last().unwrap().data;
    assert_eq!(completed["content"], "all done");
    // Usage: every model request of the turn, summed (the fake's usage is exact).
    let requests = fake.requests_with("@two all done");
    assert_eq!(
        requests.len(),
        3,
        "one request per tool call and one for the answer"
    );
    let input: u64 = requests.iter().map(|r| r.usage().0).sum();
    let cached: u64 = requests.iter().map(|r| r.usage().1).sum();
    let metrics = &completed["metrics"];
    // As agno's CodexAgent counts them: the input includes its cached part.
    assert_eq!(metrics["input_tokens"], input, "{metrics}");
    assert!(cached > 0 && cached < input, "{metrics}");
    assert_eq!(metrics["cache_read_tokens"], cached, "{metrics}");
    assert_eq!(metrics["output_tokens"], 21, "{metrics}");
    let models = metrics["details"]["model"].as_array().unwrap();
    assert_eq!(models.len(), 1, "{metrics}");
    assert_eq!(models[0]["id"], "gpt-test");
    assert_eq!(models[0]["provider"], "openai");
    assert!(metrics["cost"].is_null(), "{metrics}");
    // Offline: every request the CLI made reached the fake, with the configured key.
    for request in fake.requests() {
        assert_eq!(request.path, "/v1/responses");
        assert_eq!(request.headers["authorization"], "Bearer test-key");
    }
    // The agent and session say it is Codex.
    let agent = get_json(&server, "/agents/codex").await;
    assert_eq!(agent["metadata"]["sdk"], "codex");
    assert_eq!(agent["model"]["provider"], "openai");
    server.terminate();
}

#[tokio::test]
async fn a_thread_resumes_after_restart_passivation_and_on_another_server() {
    let Some(bin) = codex_bin() else { return };
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    // No warm processes: every turn starts the CLI from the journal's rollout.
    let config = codex_config(
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
    let thread = get_json(&server, "/sessions/s").await["metadata"]["harness_session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    server.terminate();

    // The CLI's own files are disposable: the journal alone restores the thread.
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
    let request = fake.last_request_with("after restart");
    assert_eq!(
        request.headers["thread-id"], thread,
        "the same thread resumed"
    );
    // The turn's usage is its own request's, not the thread's total.
    assert_eq!(
        second["metrics"]["input_tokens"],
        request.usage().0,
        "{second}"
    );

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
    assert_eq!(
        fake.last_request_with("on the other server").headers["thread-id"],
        thread
    );
    server.terminate();
}

/// A journal whose Codex thread has a rollout the CLI cannot resume.
async fn leave_an_unresumable_thread(data: &Path) -> String {
    use turnstile_journal::{Event, Expected, Journal, JournalOptions, RunId, SessionId};
    let journal = Journal::open(data, JournalOptions::default()).unwrap();
    let run_id = RunId::new_v7();
    let thread = uuid::Uuid::now_v7().to_string();
    // Its only turn failed before the thread was written: restored without the failed
    // turn, the rollout is gone, and the CLI says so.
    let lines = [
        json!({"timestamp": "2026-11-30T10:00:00.000Z", "type": "event_msg",
            "payload": {"type": "task_started", "turn_id": "t"}}),
        json!({"timestamp": "2026-11-30T10:00:01.000Z", "type": "event_msg",
            "payload": {"type": "task_complete", "turn_id": "t", "last_agent_message": null,
                        "error": {"message": "overloaded", "codex_error_info": "server_overloaded"}}}),
    ];
    let events = vec![
        Event::SessionCreated {
            agent_id: "codex".into(),
            user_id: None,
        },
        Event::RunQueued {
            run_id: run_id.clone(),
            agent_id: "codex".into(),
            user_id: None,
            input: "The secret is LIME-7.".into(),
            options: Default::default(),
        },
        Event::RunStarted {
            run_id: run_id.clone(),
            model: "gpt-test".into(),
            model_provider: "openai".into(),
        },
        Event::AttemptStarted {
            run_id: run_id.clone(),
            attempt: 1,
            harness_session_id: thread.clone(),
        },
        Event::TranscriptLineAppended {
            run_id: run_id.clone(),
            harness_session_id: thread.clone(),
            line: lines[0].to_string(),
        },
        Event::TranscriptLineAppended {
            run_id: run_id.clone(),
            harness_session_id: thread.clone(),
            line: lines[1].to_string(),
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
    thread
}

#[tokio::test]
async fn an_unresumable_thread_falls_back_to_a_fresh_one_seeded_with_the_history() {
    let Some(bin) = codex_bin() else { return };
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let config = codex_config(dir.path(), &bin, &fake, "", "");
    let data = dir.path().join("data");
    let lost = leave_an_unresumable_thread(&data).await;
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
    // The fresh thread was seeded with the history, the current message last.
    let prompt = fake.last_request_with("FALLBACK-MARK").prompt_text();
    assert!(
        prompt.contains("LIME-7") && prompt.contains("Noted the secret."),
        "{prompt}"
    );
    let session = get_json(&server, "/sessions/lost").await;
    let thread = session["metadata"]["harness_session_id"].as_str().unwrap();
    assert_ne!(thread, lost, "a new thread");
    server.terminate();
}

#[tokio::test]
async fn cancel_interrupts_the_turn_and_leaves_no_command_running() {
    let Some(bin) = codex_bin() else { return };
    let (_fake, _dir, server) = started(&bin);
    let accepted = post_form_json(
        &server,
        "/agents/codex/runs",
        &[
            ("message", "long one\n@bash sleep 41.5"),
            ("session_id", "c"),
            ("stream", "false"),
            ("background", "true"),
        ],
    )
    .await;
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let started = Instant::now();
    while processes_running("sleep 41.5") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the command never ran"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A second turn while it runs: the app-server would merge it; turnstile refuses it.
    let busy = client()
        .post(server.url("/agents/codex/runs"))
        .form(&[
            ("message", "me too"),
            ("session_id", "c"),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(busy.status(), 409);
    let busy: Value = busy.json().await.unwrap();
    assert_eq!(busy["run_id"], run_id.as_str());
    post_form_json(&server, &format!("/agents/codex/runs/{run_id}/cancel"), &[]).await;
    let cancelled_at = Instant::now();
    loop {
        let run = get_json(&server, &format!("/agents/codex/runs/{run_id}")).await;
        if run["status"] == "CANCELLED" {
            break;
        }
        assert!(cancelled_at.elapsed() < Duration::from_secs(10), "{run}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        processes_running("sleep 41.5"),
        0,
        "the command outlived the cancel"
    );
    // The thread goes on.
    let next = run(&server, "c", "after the cancel\n@history").await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
    assert!(
        next["content"].as_str().unwrap().contains("user: long one"),
        "{next}"
    );
    server.terminate();
}

#[tokio::test]
async fn permanent_errors_fail_at_once_and_transient_ones_retry_on_the_same_thread() {
    let Some(bin) = codex_bin() else { return };
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let config = codex_config(
        dir.path(),
        &bin,
        &fake,
        "",
        "retries = 2\ndelay_between_retries_s = 0",
    );
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    for (directive, class) in [
        ("@error 401", "authentication"),
        ("@error quota", "billing"),
        ("@error context", "context_window"),
        ("@error 400", "invalid_request"),
    ] {
        let before = fake.requests().len();
        let failed = run(
            &server,
            &format!("p-{class}"),
            &format!("fail\n{directive}"),
        )
        .await;
        assert_eq!(failed["status"], "ERROR", "{failed}");
        assert_eq!(failed["metadata"]["error_type"], class, "{failed}");
        assert_eq!(failed["metadata"]["retryable"], false, "{failed}");
        assert_eq!(fake.requests().len() - before, 1, "{class}: not retried");
    }
    // A transient failure (500, then 429) is retried on the same thread, and the failed
    // prompt is not sent twice.
    let first = run(&server, "t", "earlier turn\n@reply ok").await;
    assert_eq!(first["status"], "COMPLETED", "{first}");
    let retried = run(&server, "t", "RETRY-MARK flaky\n@error 500 x1\n@history").await;
    assert_eq!(retried["status"], "COMPLETED", "{retried}");
    assert_eq!(retried["metadata"]["attempts"], 2, "{retried}");
    let history = retried["content"].as_str().unwrap();
    assert_eq!(history.matches("RETRY-MARK").count(), 1, "{history}");
    assert!(history.contains("user: earlier turn"), "{history}");
    let threads: Vec<&String> = fake
        .requests_with("RETRY-MARK")
        .iter()
        .map(|r| r.headers.get("thread-id").unwrap())
        .cloned()
        .collect::<Vec<_>>()
        .leak()
        .iter()
        .collect();
    assert_eq!(threads.len(), 2);
    assert_eq!(threads[0], threads[1], "the retry runs on the same thread");
    server.terminate();
}

#[tokio::test]
async fn structured_output_reaches_the_model_and_comes_back_parsed() {
    let Some(bin) = codex_bin() else { return };
    let (fake, _dir, server) = started(&bin);
    let schema = json!({"type": "object", "title": "Fruit",
        "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": false});
    let answer = post_form_json(
        &server,
        "/agents/codex/runs",
        &[
            ("message", "name a fruit\n@json {\"name\": \"kiwi\"}"),
            ("session_id", "j"),
            ("stream", "false"),
            ("output_schema", &schema.to_string()),
        ],
    )
    .await;
    assert_eq!(answer["status"], "COMPLETED", "{answer}");
    assert_eq!(answer["content"], json!({"name": "kiwi"}));
    assert_eq!(answer["content_type"], "Fruit");
    let request = fake.last_request_with("name a fruit");
    assert_eq!(
        request.body["text"]["format"]["type"], "json_schema",
        "{}",
        request.body["text"]
    );
    assert_eq!(
        request.body["text"]["format"]["schema"]["properties"]["name"]["type"],
        "string"
    );
    server.terminate();
}

#[tokio::test]
async fn continuing_from_a_tool_checkpoint_forks_the_thread() {
    let Some(bin) = codex_bin() else { return };
    let (fake, _dir, server) = started(&bin);
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
        &format!("/agents/codex/runs/{run_id}/checkpoints?session_id=s"),
    )
    .await;
    let first = &checkpoints["checkpoints"][0];
    assert_eq!(first["reason"], "checkpoint", "{checkpoints}");
    let index = first["message_index"].to_string();
    let continued = post_form_json(
        &server,
        &format!("/agents/codex/runs/{run_id}/continue"),
        &[
            ("continue_from", index.as_str()),
            ("input", "go on from there FORK-MARK\n@reply forked answer"),
            ("stream", "false"),
            ("session_id", "s"),
        ],
    )
    .await;
    assert_eq!(continued["status"], "COMPLETED", "{continued}");
    assert_eq!(continued["content"], "forked answer");
    assert_eq!(continued["forked_from_run_id"], run_id);
    let request = fake.last_request_with("FORK-MARK");
    let outputs = request.tool_outputs().join("\n");
    assert!(outputs.contains("step-ONE"), "{outputs}");
    assert!(
        !outputs.contains("step-TWO"),
        "the fork keeps the first tool only: {outputs}"
    );
    let seen = seen_by_model(&fake, "FORK-MARK");
    assert!(!seen.contains("LATER-MARK"), "{seen}");
    let source_thread = fake.last_request_with("LATER-MARK").headers["thread-id"].clone();
    assert_ne!(request.headers["thread-id"], source_thread, "a new thread");
    // The source is untouched, and the next turn follows the newest branch: the fork.
    let again = get_json(
        &server,
        &format!("/agents/codex/runs/{run_id}?session_id=s"),
    )
    .await;
    assert_eq!(again["content"], "both done");
    assert_eq!(again["tools"].as_array().unwrap().len(), 2);
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
async fn compaction_goes_through_the_app_server_and_survives_a_restart() {
    let Some(bin) = codex_bin() else { return };
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let config = codex_config(dir.path(), &bin, &fake, "", "");
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
        .post(server.url("/agents/codex/sessions/s/compact"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(compacted["compacted"], true, "{compacted}");
    assert_eq!(compacted["status"], "compacted");
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.prompt_text().contains("CONTEXT CHECKPOINT COMPACTION")),
        "the model was asked to summarise"
    );
    server.terminate();

    std::fs::remove_dir_all(data.join("harness")).unwrap();
    let server = Server::start_with(&data, &["--config", config]);
    let after = run(&server, "s", "after compaction AFTER-MARK\n@reply fine").await;
    assert_eq!(after["status"], "COMPLETED", "{after}");
    let seen = seen_by_model(&fake, "AFTER-MARK");
    assert!(seen.contains("FAKE-SUMMARY"), "{seen}");
    // Codex keeps the user's messages and replaces the answers with the summary.
    let answers = fake.last_request_with("AFTER-MARK").assistant_texts();
    assert!(
        !answers.iter().any(|text| text.contains("answer 0")),
        "the compacted answers are still sent: {answers:?}"
    );
    server.terminate();
}

#[tokio::test]
async fn an_image_reaches_the_model_as_an_image() {
    let Some(bin) = codex_bin() else { return };
    let (fake, _dir, server) = started(&bin);
    // A 1x1 PNG.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    let images = json!([{"content": png, "mime_type": "image/png", "format": "png", "id": "red"}]);
    let answer = post_form_json(
        &server,
        "/agents/codex/runs",
        &[
            ("message", "what is in the picture IMAGE-MARK\n@reply a dot"),
            ("session_id", "img"),
            ("stream", "false"),
            ("images", &images.to_string()),
        ],
    )
    .await;
    assert_eq!(answer["status"], "COMPLETED", "{answer}");
    let request = fake.last_request_with("IMAGE-MARK");
    assert_eq!(request.images(), 1, "{}", request.body["input"]);
    server.terminate();
}

/// Offline: the CLI, and every process it starts, connects to nothing but the
/// configured endpoint (`strace` records every `connect` of the app-server's tree).
#[tokio::test]
async fn the_cli_connects_to_nothing_but_the_configured_endpoint() {
    let Some(bin) = codex_bin() else { return };
    let strace = Path::new("/usr/bin/strace");
    assert!(
        strace.exists() || std::env::var_os("CI").is_none(),
        "strace is missing: .ci/run installs it"
    );
    if !strace.exists() {
        eprintln!("skipped: no strace");
        return;
    }
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces");
    std::fs::create_dir_all(&traces).unwrap();
    let wrapper = dir.path().join("codex-traced");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} -f -qq -e trace=connect -o {}/connect.$$ {} \"$@\"\n",
            strace.display(),
            traces.display(),
            bin.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = codex_config(dir.path(), &wrapper, &fake, "", "");
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let answer = run(
        &server,
        "offline",
        "offline\n@bash echo offline-tool\n@search offline facts\n@reply done",
    )
    .await;
    assert_eq!(answer["status"], "COMPLETED", "{answer}");
    server.terminate();
    let port = fake
        .base_url
        .rsplit(':')
        .next()
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();
    let mut inet = 0;
    for trace in std::fs::read_dir(&traces).unwrap() {
        let text = std::fs::read_to_string(trace.unwrap().path()).unwrap();
        for line in text.lines().filter(|line| line.contains("connect(")) {
            if line.contains("AF_UNIX") {
                continue;
            }
            inet += 1;
            assert!(
                line.contains("inet_addr(\"127.0.0.1\")")
                    && line.contains(&format!("htons({port})")),
                "the CLI connected elsewhere: {line}"
            );
        }
    }
    assert!(inet > 0, "no connection traced at all");
}
