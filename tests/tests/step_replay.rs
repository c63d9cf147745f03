//! Operations on a session's transcript (issue 4), through the embedding API on a real
//! journal: checkpoints, continuing or forking a finished run, replaying a turn, the
//! newest branch, compaction (also after a restart), the fresh-session fallback and
//! its history rendering rules, and the audit events they leave.

use turnstile_actors::history::{HistoryEntry, render_prompt, truncate_tool_result};
use turnstile_actors::{
    ContinueFrom, ContinueRun, Multitask, Refused, RetryPolicy, RunHandle, Runtime,
};
use turnstile_journal::{Event, JournalPos, RunId, SessionId};
use turnstile_projections::{RunStatus, RunView};
use turnstile_tests::{open_runtime, start_command};

fn open(dir: &std::path::Path) -> Runtime {
    open_runtime(dir, RetryPolicy::default(), 8, 100)
}

async fn turn(runtime: &Runtime, session: &str, message: &str) -> RunView {
    let command = start_command(session, message, Multitask::Reject);
    runtime
        .start_run(command)
        .await
        .unwrap()
        .unwrap()
        .outcome()
        .await
        .unwrap()
}

fn continuation(run_id: &RunId, continue_from: ContinueFrom, input: Option<&str>) -> ContinueRun {
    ContinueRun {
        run_id: run_id.clone(),
        continue_from,
        input: input.map(str::to_owned),
        user_id: None,
        options: Default::default(),
        multitask: Multitask::Reject,
    }
}

async fn continue_run(
    runtime: &Runtime,
    run_id: &RunId,
    from: ContinueFrom,
    input: Option<&str>,
) -> RunView {
    let handle: RunHandle = runtime
        .continue_run(continuation(run_id, from, input))
        .await
        .unwrap()
        .unwrap();
    handle.outcome().await.unwrap()
}

#[tokio::test]
async fn a_run_has_a_checkpoint_after_each_tool_batch() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    let run = turn(
        &runtime,
        "s",
        "look\n/tool Read {}\n/tool Grep {}\n/reply done",
    )
    .await;
    let indexes: Vec<u32> = run.checkpoints.iter().map(|c| c.message_index).collect();
    assert_eq!(indexes, [3, 5]);
    assert_eq!(run.message_count(), 6);
    assert!(run.checkpoints[0].transcript_lines < run.checkpoints[1].transcript_lines);
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn continuing_from_a_checkpoint_forks_the_harness_session_there() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    turn(&runtime, "s", "first").await;
    let source = turn(
        &runtime,
        "s",
        "second\n/tool Read {}\n/tool Grep {}\n/reply done",
    )
    .await;
    let source_lines = runtime
        .session(&source.session_id)
        .unwrap()
        .unwrap()
        .session
        .transcript_len() as usize;

    let forked = continue_run(
        &runtime,
        &source.run_id,
        ContinueFrom::MessageIndex(3),
        Some("third\n/history"),
    )
    .await;
    assert_eq!(forked.content, "first\nsecond\nthird");
    let fork = forked.fork.clone().unwrap();
    assert_eq!(
        (fork.from_run_id, fork.message_index),
        (source.run_id.clone(), 3)
    );
    assert_ne!(forked.run_id, source.run_id);

    // The source run and its harness session are untouched.
    let state = runtime.session_state(&source.session_id).unwrap().unwrap();
    let again = state.run(&source.run_id).unwrap();
    assert_eq!(
        (again.status, again.content.as_str(), again.tools.len()),
        (RunStatus::Completed, "done", 2)
    );
    let transcript = |harness_session_id: &Option<String>| {
        runtime
            .transcript(&source.session_id, harness_session_id.as_ref().unwrap())
            .unwrap()
    };
    assert_eq!(transcript(&source.harness_session_id).len(), source_lines);
    // The fork kept the transcript up to the first tool result: the Read call, not the Grep call.
    let fork_lines = &transcript(&forked.harness_session_id);
    assert!(
        !fork_lines
            .iter()
            .any(|line| line.contains(r#""name":"Grep""#)),
        "{fork_lines:#?}"
    );
    assert!(
        fork_lines
            .iter()
            .any(|line| line.contains(r#""name":"Read""#)),
        "{fork_lines:#?}"
    );
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn last_user_without_input_replays_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    turn(&runtime, "s", "first").await;
    let source = turn(&runtime, "s", "again\n/history").await;
    assert_eq!(source.content, "first\nagain");
    let replay = continue_run(&runtime, &source.run_id, ContinueFrom::LastUser, None).await;
    assert_eq!(replay.input, source.input);
    assert_eq!(
        replay.content, "first\nagain",
        "the harness no longer remembers the replayed turn"
    );
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn later_turns_follow_the_newest_branch_and_never_see_the_abandoned_one() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    let one = turn(&runtime, "s", "one").await;
    turn(&runtime, "s", "two").await;
    turn(&runtime, "s", "three").await;
    continue_run(&runtime, &one.run_id, ContinueFrom::End, Some("branch")).await;
    let after = turn(&runtime, "s", "after\n/history").await;
    assert_eq!(after.content, "one\nbranch\nafter");
    // Also after a restart, from the journal alone.
    runtime.shutdown().await.unwrap();
    drop(runtime);
    let runtime = open(dir.path());
    let later = turn(&runtime, "s", "later\n/history").await;
    assert_eq!(later.content, "one\nbranch\nafter\nlater");
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_or_unfinished_run_cannot_be_continued() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    let command = start_command("s", "/sleep 30000", Multitask::Reject);
    let handle = runtime.start_run(command).await.unwrap().unwrap();
    let run_id = handle.run_id.clone();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let refused = runtime
        .continue_run(continuation(&run_id, ContinueFrom::End, Some("x")))
        .await
        .unwrap()
        .err()
        .unwrap();
    assert!(
        matches!(refused, Refused::NotContinuable { .. }),
        "{refused:?}"
    );
    runtime.cancel_run(&run_id).await.unwrap();
    handle.outcome().await.unwrap();
    let refused = runtime
        .continue_run(continuation(&run_id, ContinueFrom::End, Some("x")))
        .await
        .unwrap()
        .err()
        .unwrap();
    assert_eq!(
        refused.to_string(),
        format!("Cannot continue run {run_id}: the run is cancelled")
    );
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn compaction_replaces_the_history_with_a_summary_also_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    let session = SessionId::parse("s").unwrap();
    // A session with no events is unknown (issue 13, defect 9).
    let unknown = runtime
        .compact_session("scripted", &session)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(unknown, turnstile_actors::Refused::UnknownSession { .. }),
        "{unknown:?}"
    );
    turn(&runtime, "s", "alpha").await;
    let too_little = runtime
        .compact_session("scripted", &session)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (too_little.compacted, too_little.status),
        (false, "nothing_to_compact")
    );
    turn(&runtime, "s", "beta").await;
    turn(&runtime, "s", "gamma").await;
    let compacted = runtime
        .compact_session("scripted", &session)
        .await
        .unwrap()
        .unwrap();
    assert!(compacted.compacted);
    assert_eq!(compacted.record.as_ref().unwrap()["replaced_messages"], 3);
    assert_eq!(
        turn(&runtime, "s", "delta\n/history").await.content,
        "[summary of 3 messages]\ndelta"
    );
    runtime.shutdown().await.unwrap();
    drop(runtime);
    let runtime = open(dir.path());
    assert_eq!(
        turn(&runtime, "s", "epsilon\n/history").await.content,
        "[summary of 3 messages]\ndelta\nepsilon"
    );
    // `/compact` as a message compacts too.
    let compact = turn(&runtime, "s", "/compact").await;
    assert_eq!(
        compact.content,
        "Compacted 3 messages into [summary of 3 messages]"
    );
    assert_eq!(
        turn(&runtime, "s", "zeta\n/history").await.content,
        "[summary of 3 messages]\nzeta"
    );
    // The journal shows what each summary replaced.
    let compactions: Vec<(String, u32)> = runtime
        .journal()
        .read_from(JournalPos(0))
        .filter_map(|record| match record.unwrap().event {
            Event::TranscriptCompacted {
                summary,
                replaced_messages,
                ..
            } => Some((summary, replaced_messages)),
            _ => None,
        })
        .collect();
    assert_eq!(
        compactions,
        [
            ("[summary of 3 messages]".to_owned(), 3),
            ("[summary of 3 messages]".to_owned(), 3)
        ]
    );
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn compaction_is_refused_while_a_run_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    turn(&runtime, "s", "one").await;
    let command = start_command("s", "/sleep 400", Multitask::Reject);
    let handle = runtime.start_run(command).await.unwrap().unwrap();
    let refused = runtime
        .compact_session("scripted", &SessionId::parse("s").unwrap())
        .await
        .unwrap()
        .err()
        .unwrap();
    assert_eq!(
        refused,
        Refused::Busy {
            session_id: SessionId::parse("s").unwrap(),
            run_id: handle.run_id.clone()
        }
    );
    handle.outcome().await.unwrap();
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_session_that_cannot_be_resumed_falls_back_to_a_fresh_one_seeded_with_history() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    turn(&runtime, "s", "first question").await;
    turn(
        &runtime,
        "s",
        "look\n/tool Bash {\"command\":\"ls\"}\n/reply listed",
    )
    .await;
    let fallback = turn(&runtime, "s", "/lost-session\nthird question").await;
    assert_eq!(fallback.status, RunStatus::Completed);
    assert!(
        fallback
            .content
            .starts_with("echo: Previous conversation (for context, do not repeat it):"),
        "{}",
        fallback.content
    );
    for expected in [
        "user: first question",
        "assistant: echo: first question",
        "assistant called Bash({\"command\":\"ls\"})",
        "tool result: ok:Bash",
        "assistant: listed",
    ] {
        assert!(
            fallback.content.contains(expected),
            "missing {expected:?} in {}",
            fallback.content
        );
    }
    assert!(
        fallback
            .content
            .ends_with("Current message:\nthird question"),
        "{}",
        fallback.content
    );
    assert_eq!(fallback.warnings.len(), 1);
    assert!(
        matches!(
            fallback.warnings[0],
            turnstile_journal::Warning::SessionFallback { .. }
        ),
        "{:?}",
        fallback.warnings
    );
    // Later turns continue on the fresh session.
    let next = turn(&runtime, "s", "fourth\n/history").await;
    assert_eq!(
        next.content,
        "Previous conversation (for context, do not repeat it):\nfourth"
    );
    runtime.shutdown().await.unwrap();
}

#[test]
fn long_tool_results_keep_their_head_and_tail() {
    let result = format!("{}[exit code 1]", "x".repeat(2_500 - 13));
    let truncated = truncate_tool_result(&result);
    assert!(
        truncated.contains("[... 500 characters truncated ...]"),
        "{truncated}"
    );
    assert!(truncated.ends_with("[exit code 1]"));
    assert!(truncated.starts_with(&"x".repeat(1_600)));
    assert_eq!(truncate_tool_result("short"), "short");
    let prompt = render_prompt(
        &[
            HistoryEntry::User("run it".into()),
            HistoryEntry::ToolResult(result),
        ],
        "again",
    );
    assert!(prompt.contains("characters truncated") && prompt.contains("[exit code 1]"));
}

#[test]
fn the_history_budget_keeps_the_newest_entries() {
    let mut history = vec![HistoryEntry::User("the very first request".into())];
    for n in 0..60 {
        history.push(HistoryEntry::ToolCall {
            name: "Bash".into(),
            arguments: format!("{{\"n\":{n}}}"),
        });
        history.push(HistoryEntry::ToolResult(format!(
            "result {n} {}",
            "y".repeat(900)
        )));
    }
    let prompt = render_prompt(&history, "now");
    assert!(
        prompt.chars().count() <= 24_500,
        "{} chars",
        prompt.chars().count()
    );
    assert!(prompt.contains("[earlier history omitted]"));
    assert!(!prompt.contains("the very first request"));
    assert!(prompt.contains("result 59 "));
    assert!(prompt.ends_with("Current message:\nnow"));
    assert_eq!(render_prompt(&[], "alone"), "alone");
}

#[tokio::test]
async fn forks_appear_in_the_journal_with_their_origin() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    let source = turn(&runtime, "s", "/tool Read {}\n/reply one").await;
    let forked = continue_run(
        &runtime,
        &source.run_id,
        ContinueFrom::MessageIndex(3),
        Some("other"),
    )
    .await;
    let forks: Vec<(RunId, RunId, u32)> = runtime
        .journal()
        .read_from(JournalPos(0))
        .filter_map(|record| match record.unwrap().event {
            Event::HarnessSessionForked {
                run_id,
                from_run_id,
                message_index,
                ..
            } => Some((run_id, from_run_id, message_index)),
            _ => None,
        })
        .collect();
    assert_eq!(forks, [(forked.run_id, source.run_id, 3)]);
    runtime.shutdown().await.unwrap();
}
