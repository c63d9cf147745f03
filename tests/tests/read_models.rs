//! Issue 12: reads are read models, not folds from a session's first record. On a
//! session with 1,000 earlier turns, a turn, a run read, a session read, a re-attach to a
//! finished run and a session actor's rebuild after a restart each read a bounded
//! number of journal records (counted by the journal), and the stored projections still
//! agree with a fold from the start.

use turnstile_actors::{Multitask, RetryPolicy, Runtime};
use turnstile_journal::SessionId;
use turnstile_projections::RunStatus;
use turnstile_tests::{open_runtime, start_command};

/// Earlier turns of the session.
const TURNS: usize = 1_000;
/// Most records one of the reads below may touch: a turn has about ten records, so a
/// read that folded the session from its start would touch some ten thousand.
const RECORDS_MAX: u64 = 60;

fn open(dir: &std::path::Path) -> Runtime {
    open_runtime(dir, RetryPolicy::default(), 8, 100)
}

fn records_read(runtime: &Runtime) -> u64 {
    runtime.journal().stats().records_read
}

/// Runs `read` and returns what it returned and the journal records it read.
async fn counted<T>(runtime: &Runtime, read: impl AsyncFnOnce() -> T) -> (T, u64) {
    let before = records_read(runtime);
    let value = read().await;
    (value, records_read(runtime) - before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_on_a_session_with_a_thousand_turns_do_not_fold_it_from_the_start_12() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = open(dir.path());
    let session = SessionId::parse("long").unwrap();
    let mut first = None;
    let mut last = None;
    for turn in 0..TURNS {
        let handle = runtime
            .start_run(start_command(
                "long",
                &format!("turn {turn}"),
                Multitask::Reject,
            ))
            .await
            .unwrap()
            .unwrap();
        let view = handle.outcome().await.unwrap();
        assert_eq!(view.status, RunStatus::Completed);
        first.get_or_insert(view.run_id.clone());
        last = Some(view.run_id);
    }
    let (first, last) = (first.unwrap(), last.unwrap());

    // One more turn.
    let (view, read) = counted(&runtime, async || {
        let handle = runtime
            .start_run(start_command("long", "one more", Multitask::Reject))
            .await
            .unwrap()
            .unwrap();
        handle.outcome().await.unwrap()
    })
    .await;
    assert_eq!(view.content, "echo: one more");
    assert!(read <= RECORDS_MAX, "a turn read {read} records");

    // The history directive still reads the whole transcript: the lines are the
    // conversation, read when a harness asks for them.
    let handle = runtime
        .start_run(start_command("long", "/history", Multitask::Reject))
        .await
        .unwrap()
        .unwrap();
    let history = handle.outcome().await.unwrap().content;
    assert_eq!(history.lines().count(), TURNS + 2, "{history}");

    // The newest run, the first run, the session.
    for run_id in [&last, &first] {
        let (view, read) = counted(&runtime, async || runtime.run_view(run_id).unwrap()).await;
        let view = view.unwrap();
        assert_eq!(view.status, RunStatus::Completed);
        assert!(read <= RECORDS_MAX, "a run read {read} records");
        // What a stream reads of it: the same facts, from the stored form's head.
        let (head, read) = counted(&runtime, async || runtime.run_head(run_id).unwrap()).await;
        assert_eq!(head, Some(turnstile_projections::RunHead::of(&view)));
        assert!(read <= RECORDS_MAX, "a run's head read {read} records");
    }
    let (state, read) = counted(&runtime, async || runtime.session(&session).unwrap()).await;
    let state = state.unwrap();
    assert_eq!(state.session.run_count, TURNS as u64 + 2);
    assert!(read <= RECORDS_MAX, "a session read {read} records");

    // Re-attaching to a finished run reads that run's records, not the session's.
    let (events, read) = counted(&runtime, async || {
        let mut events = runtime.run_events(&first, None).unwrap().unwrap();
        let mut types = Vec::new();
        while let Some(event) = events.next().await {
            types.push(event.unwrap().event.kind());
        }
        types
    })
    .await;
    assert_eq!(events.first().copied(), Some("Started"));
    assert_eq!(events.last().copied(), Some("Completed"));
    assert!(read <= RECORDS_MAX, "a re-attach read {read} records");

    // The fresh-session history is rendered only when a harness session cannot be
    // resumed, and then from the newest runs its budget holds.
    let (view, read) = counted(&runtime, async || {
        let handle = runtime
            .start_run(start_command(
                "long",
                "/lost-session\nafter",
                Multitask::Reject,
            ))
            .await
            .unwrap()
            .unwrap();
        handle.outcome().await.unwrap()
    })
    .await;
    assert_eq!(view.status, RunStatus::Completed, "{view:?}");
    assert!(read <= RECORDS_MAX, "a fallback turn read {read} records");

    // A passivated session's actor is rebuilt from its stored form, after a restart too.
    runtime.set_session_idle(std::time::Duration::from_millis(50));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while runtime.sessions_in_memory().await.unwrap() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the session never passivated"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    runtime.shutdown().await.unwrap();
    drop(runtime);
    let runtime = open(dir.path());
    let (view, read) = counted(&runtime, async || {
        let handle = runtime
            .start_run(start_command("long", "after a restart", Multitask::Reject))
            .await
            .unwrap()
            .unwrap();
        handle.outcome().await.unwrap()
    })
    .await;
    assert_eq!(view.content, "echo: after a restart");
    assert!(
        read <= RECORDS_MAX,
        "the first turn after a restart read {read} records"
    );

    // The stored projections agree with a fold from the first record.
    let report = turnstile_projections::rebuild::rebuild(runtime.journal(), |_| {}).unwrap();
    assert!(report.differences.is_empty(), "{:?}", report.differences);
    assert!(report.compared > TURNS as u64, "{report:?}");
    runtime.shutdown().await.unwrap();
}
