//! The scripted harness through the `Harness` trait, as the runtime drives it: each
//! directive of `spec/scripted-harness.md` and its observable effect.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use turnstile_harness::{
    ErrorKind, Harness, HarnessError, HarnessEvent, ScriptedHarness, TurnOutcome, TurnRequest,
};
use turnstile_journal::{RunId, SessionId};

fn request(message: &str, attempt: u32, transcript: Vec<String>) -> TurnRequest {
    TurnRequest {
        run_id: RunId::parse("r1").unwrap(),
        session_id: SessionId::parse("s1").unwrap(),
        attempt,
        message: message.into(),
        harness_session_id: None,
        transcript: turnstile_harness::Transcript::from_lines(transcript),
        output_schema: None,
        cwd: None,
        settled: None,
        approvals: Default::default(),
        paused_before: false,
        decisions: Vec::new(),
    }
}

async fn turn(
    request: TurnRequest,
    cancel: CancellationToken,
) -> (Vec<HarnessEvent>, Result<TurnOutcome, HarnessError>) {
    let (sender, mut receiver) = mpsc::channel(1024);
    let outcome = ScriptedHarness.run_turn(request, sender, cancel).await;
    let mut events = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        events.push(event);
    }
    (events, outcome)
}

async fn run(message: &str) -> (Vec<HarnessEvent>, Result<TurnOutcome, HarnessError>) {
    turn(request(message, 1, Vec::new()), CancellationToken::new()).await
}

fn text(events: &[HarnessEvent]) -> String {
    events
        .iter()
        .filter_map(|event| match event {
            HarnessEvent::ContentDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn plain_prose_is_echoed_in_several_deltas() {
    let (events, outcome) = run("hello there").await;
    assert_eq!(outcome.unwrap().content, "echo: hello there");
    assert_eq!(text(&events), "echo: hello there");
    let deltas = events
        .iter()
        .filter(|e| matches!(e, HarnessEvent::ContentDelta { .. }))
        .count();
    assert!(deltas > 1);
    assert!(matches!(events[0], HarnessEvent::SessionStarted { .. }));
}

#[tokio::test]
async fn tools_in_order_with_errors_and_lineage() {
    let (events, outcome) = run("/tool Read {\"path\":\"a\"}\n/tool-error Bash {\"command\":\"false\"}\n/subagent call_x Grep {}\n/reply ok").await;
    assert_eq!(outcome.unwrap().content, "ok");
    let completed: Vec<_> = events
        .iter()
        .filter_map(|event| match event {
            HarnessEvent::ToolCallCompleted { tool } => Some(tool.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(completed.len(), 3);
    assert_eq!(
        (
            completed[0].tool_name.as_str(),
            completed[0].result.as_deref(),
            completed[0].tool_call_error
        ),
        ("Read", Some("ok:Read"), false)
    );
    assert_eq!(completed[0].tool_args, "{\"path\":\"a\"}");
    assert_eq!(
        (completed[1].result.as_deref(), completed[1].tool_call_error),
        (Some("error:Bash"), true)
    );
    assert_eq!(completed[2].parent_tool_call_id.as_deref(), Some("call_x"));
    // Every call is in the transcript: use and result lines.
    let lines = events
        .iter()
        .filter(|e| matches!(e, HarnessEvent::TranscriptLine { .. }))
        .count();
    assert_eq!(lines, 1 + 3 * 2 + 1);
}

#[tokio::test]
async fn json_and_usage_are_reported() {
    let (_, outcome) = run("/json {\"name\": \"Acme\"}\n/usage 100 20 50 0.25").await;
    let outcome = outcome.unwrap();
    assert_eq!(outcome.content, "{\"name\":\"Acme\"}");
    assert_eq!(
        (
            outcome.usage.input_tokens,
            outcome.usage.output_tokens,
            outcome.usage.cache_read_tokens
        ),
        (100, 20, 50)
    );
    assert_eq!(outcome.usage.cost_usd, Some(0.25));
    let (_, bad) = run("/json {not json").await;
    assert!(matches!(
        bad,
        Err(HarnessError::Failed {
            kind: ErrorKind::InvalidRequest,
            ..
        })
    ));
}

#[tokio::test]
async fn sleep_wakes_at_once_on_cancel() {
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let (_, outcome) = turn(request("/sleep 30000", 1, Vec::new()), cancel).await;
    assert_eq!(outcome, Err(HarnessError::Cancelled));
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn failures_are_classified() {
    let (_, first) = turn(
        request("/fail transient 2\n/reply ok", 2, Vec::new()),
        CancellationToken::new(),
    )
    .await;
    assert!(matches!(
        first,
        Err(HarnessError::Failed {
            kind: ErrorKind::Transient,
            ..
        })
    ));
    let (_, third) = turn(
        request("/fail transient 2\n/reply ok", 3, Vec::new()),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(third.unwrap().content, "ok");
    let (_, permanent) = run("/fail permanent billing").await;
    assert!(matches!(
        permanent,
        Err(HarnessError::Failed {
            kind: ErrorKind::Billing,
            ..
        })
    ));
    let (_, unknown) = run("/frobnicate").await;
    assert!(matches!(
        unknown,
        Err(HarnessError::Failed {
            kind: ErrorKind::InvalidRequest,
            ..
        })
    ));
}

#[tokio::test]
async fn history_lists_the_transcript_it_was_handed() {
    let (first_events, _) = run("the first question").await;
    let transcript: Vec<String> = first_events
        .into_iter()
        .filter_map(|event| match event {
            HarnessEvent::TranscriptLine { line } => Some(line),
            _ => None,
        })
        .collect();
    let (_, outcome) = turn(
        request("second\n/history", 1, transcript),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(outcome.unwrap().content, "the first question\nsecond");
}

/// Approvals' tool-name patterns: `*` matches any run of characters, nothing else is
/// special, and a name matches only whole.
#[test]
fn approval_patterns_match_whole_tool_names() {
    let approvals = turnstile_harness::Approvals::new(vec![
        "Bash".into(),
        "mcp__github__*".into(),
        "*Edit".into(),
    ]);
    for name in [
        "Bash",
        "mcp__github__create_pr",
        "mcp__github__",
        "Edit",
        "MultiEdit",
    ] {
        assert!(approvals.matches(name), "{name}");
    }
    for name in ["bash", "Bash2", "Read", "mcp__gitlab__x", "EditX", ""] {
        assert!(!approvals.matches(name), "{name}");
    }
    assert!(!turnstile_harness::Approvals::default().matches("Bash"));
}
