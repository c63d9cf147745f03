//! The Claude Code harness through the library API, with the real `claude` CLI against
//! the fake Messages API: what a service embedding turnstile sees of a stored Claude
//! session the CLI cannot resume.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use turnstile_harness::{
    ClaudeCodeHarness, ClaudeCodeOptions, ErrorKind, Harness, HarnessError, HarnessEvent,
    TurnRequest,
};
use turnstile_journal::{RunId, SessionId};
use turnstile_tests::claude::{claude_bin, cli_pids};
use turnstile_tests::fake_anthropic::FakeAnthropic;

fn harness(
    dir: &std::path::Path,
    bin: &std::path::Path,
    fake: &FakeAnthropic,
) -> ClaudeCodeHarness {
    let mut options = ClaudeCodeOptions::new(bin, dir.join("workspace"), dir.join("state"));
    options
        .env
        .insert("ANTHROPIC_BASE_URL".into(), fake.base_url.clone());
    options
        .env
        .insert("ANTHROPIC_API_KEY".into(), "test-key".into());
    ClaudeCodeHarness::new(options)
}

fn request(
    harness_session_id: Option<String>,
    transcript: Vec<String>,
    message: &str,
) -> TurnRequest {
    TurnRequest {
        run_id: RunId::new_v7(),
        session_id: SessionId::parse("embedded").unwrap(),
        attempt: 1,
        message: message.into(),
        harness_session_id,
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
    harness: &ClaudeCodeHarness,
    request: TurnRequest,
) -> (
    Result<turnstile_harness::TurnOutcome, HarnessError>,
    Vec<HarnessEvent>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        harness.run_turn(request, tx, CancellationToken::new()),
    )
    .await
    .expect("the turn ended");
    let mut events = Vec::new();
    while let Ok(event) = rx.try_recv() {
        events.push(event);
    }
    (outcome, events)
}

#[tokio::test]
async fn a_transcript_the_cli_cannot_resume_is_reported_as_a_missing_session() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let harness = harness(dir.path(), &bin, &fake);

    // A first turn; its transcript, as the runtime would journal it.
    let (outcome, events) =
        turn(&harness, request(None, Vec::new(), "hello PEAR\n@reply hi")).await;
    assert_eq!(outcome.unwrap().content, "hi");
    let id = events
        .iter()
        .find_map(|e| match e {
            HarnessEvent::SessionStarted { harness_session_id } => Some(harness_session_id.clone()),
            _ => None,
        })
        .unwrap();
    let transcript: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            HarnessEvent::TranscriptLine { line } => Some(line.clone()),
            _ => None,
        })
        .collect();
    assert!(transcript.iter().any(|l| l.contains("hello PEAR")));

    // Resumed from the journal's lines alone (no warm process, no CLI files): works.
    harness.shutdown();
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    let (outcome, _) = turn(
        &harness,
        request(Some(id.clone()), transcript.clone(), "again\n@reply again"),
    )
    .await;
    assert_eq!(outcome.unwrap().content, "again");
    let seen = fake.message_requests().last().unwrap().conversation_text();
    assert!(seen.contains("hello PEAR"), "{seen}");

    // Only bookkeeping left of the conversation: the CLI finds none, and says so.
    harness.shutdown();
    let bookkeeping: Vec<String> = transcript
        .into_iter()
        .filter(|l| !l.contains("\"uuid\""))
        .collect();
    let (outcome, _) = turn(&harness, request(Some(id), bookkeeping, "lost\n@reply x")).await;
    match outcome {
        Err(HarnessError::Failed { kind, message }) => {
            assert_eq!(kind, ErrorKind::SessionNotFound, "{message}");
            assert!(message.contains("No conversation found"), "{message}");
        }
        other => panic!("expected a missing session, got {other:?}"),
    }
    harness.shutdown();
    assert!(cli_pids(dir.path()).is_empty());
}
