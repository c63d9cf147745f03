//! The embedding API at its boundary, on a real journal (sled in a temporary directory,
//! and PostgreSQL: each case runs on both backends):
//! one turn per session, events journaled before they are seen, streams that start
//! at any index, cancellation, and a session that resumes from the journal alone.

use std::time::{Duration, Instant};

use turnstile_actors::{Multitask, Refused, RetryPolicy, RunHandle, Runtime, StartRun};
use turnstile_journal::{Event, EventIndex, Seq, SessionId};
use turnstile_projections::RunStatus;
use turnstile_tests::{Store, open_runtime_on, start_command};

turnstile_tests::on_both_backends!(
    a_second_turn_on_a_busy_session_is_refused_with_the_running_run,
    events_stream_in_order_and_every_one_is_in_the_journal,
    a_finished_run_replays_from_any_index,
    cancel_interrupts_a_sleeping_turn_and_keeps_its_tool_calls,
    a_session_resumes_from_the_journal_after_reopening,
    an_isolated_turn_never_enters_another_users_session,
);

fn open(dir: &Store) -> Runtime {
    open_runtime_on(dir, RetryPolicy::default(), 8, 100)
}

fn turn(session: &str, message: &str) -> StartRun {
    start_command(session, message, Multitask::Reject)
}

async fn start(runtime: &Runtime, session: &str, message: &str) -> RunHandle {
    runtime
        .start_run(turn(session, message))
        .await
        .unwrap()
        .unwrap()
}

async fn collect(mut handle: RunHandle) -> Vec<(u64, String)> {
    let mut events = Vec::new();
    while let Some(event) = handle.events().next().await {
        let event = event.unwrap();
        events.push((event.event_index.0, event.event.kind().to_owned()));
    }
    events
}

async fn a_second_turn_on_a_busy_session_is_refused_with_the_running_run(dir: Store) {
    let runtime = open(&dir);
    let first = start(&runtime, "s1", "/sleep 300\n/reply first").await;
    let refused = runtime
        .start_run(turn("s1", "second"))
        .await
        .unwrap()
        .err()
        .unwrap();
    assert_eq!(
        refused,
        Refused::Busy {
            session_id: SessionId::parse("s1").unwrap(),
            run_id: first.run_id.clone()
        }
    );
    // Another session is not held up.
    let other = start(&runtime, "s2", "hello")
        .await
        .outcome()
        .await
        .unwrap();
    assert_eq!(other.status, RunStatus::Completed);
    let done = first.outcome().await.unwrap();
    assert_eq!(done.content, "first");
    // The session accepts a turn as soon as its run is seen to end.
    let next = start(&runtime, "s1", "again")
        .await
        .outcome()
        .await
        .unwrap();
    assert_eq!(next.content, "echo: again");
    runtime.shutdown().await.unwrap();
}

async fn events_stream_in_order_and_every_one_is_in_the_journal(dir: Store) {
    let runtime = open(&dir);
    let handle = start(
        &runtime,
        "s1",
        "/tool Read {\"path\":\"a.rs\"}\n/tool-error Bash {\"command\":\"false\"}\n/reply done",
    )
    .await;
    let session_id = handle.session_id.clone();
    let run_id = handle.run_id.clone();
    let events = collect(handle).await;
    let types: Vec<&str> = events.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        types,
        [
            "Started",
            "ToolCallStarted",
            "ToolCallCompleted",
            "ToolCallStarted",
            "ToolCallCompleted",
            "ContentDelta",
            "ContentDelta",
            "Completed"
        ]
    );
    let indexes: Vec<u64> = events.iter().map(|(i, _)| *i).collect();
    assert_eq!(indexes, (0..events.len() as u64).collect::<Vec<_>>());
    let journaled: Vec<(u64, String)> = runtime
        .journal()
        .read_session(&session_id, Seq(0))
        .filter_map(|record| match record.unwrap().event {
            Event::RunEventEmitted {
                run_id: r,
                event_index,
                event,
            } if r == run_id => Some((event_index.0, event.kind().to_owned())),
            _ => None,
        })
        .collect();
    assert_eq!(journaled, events);
    let view = runtime.run_view(&run_id).unwrap().unwrap();
    assert_eq!(view.tools.len(), 2);
    assert!(view.tools[1].tool_call_error);
    assert_eq!(view.tools[1].result.as_deref(), Some("error:Bash"));
    runtime.shutdown().await.unwrap();
}

async fn a_finished_run_replays_from_any_index(dir: Store) {
    let runtime = open(&dir);
    let handle = start(&runtime, "s1", "/tool Read {}\n/reply ok").await;
    let run_id = handle.run_id.clone();
    let all = collect(handle).await;
    let mut tail = runtime
        .run_events(&run_id, Some(EventIndex(2)))
        .unwrap()
        .unwrap();
    let mut replayed = Vec::new();
    while let Some(event) = tail.next().await {
        let event = event.unwrap();
        replayed.push((event.event_index.0, event.event.kind().to_owned()));
    }
    assert_eq!(replayed, all[3..]);
    runtime.shutdown().await.unwrap();
}

async fn cancel_interrupts_a_sleeping_turn_and_keeps_its_tool_calls(dir: Store) {
    let runtime = open(&dir);
    let handle = start(&runtime, "s1", "/tool Read {}\n/sleep 30000\n/reply never").await;
    let run_id = handle.run_id.clone();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cancelled_at = Instant::now();
    assert!(runtime.cancel_run(&run_id).await.unwrap());
    let events = collect(handle).await;
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(2),
        "cancel took {:?}",
        cancelled_at.elapsed()
    );
    assert_eq!(events.last().unwrap().1, "Cancelled");
    let view = runtime.run_view(&run_id).unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Cancelled);
    assert_eq!(view.content, "Run cancelled");
    assert_eq!(view.tools.len(), 1);
    runtime.shutdown().await.unwrap();
}

async fn a_session_resumes_from_the_journal_after_reopening(dir: Store) {
    let runtime = open(&dir);
    let first = start(&runtime, "s1", "remember the blue door")
        .await
        .outcome()
        .await
        .unwrap();
    runtime.shutdown().await.unwrap();
    drop(runtime);

    let runtime = open(&dir);
    let view = runtime.run_view(&first.run_id).unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Completed);
    assert_eq!(view.content, "echo: remember the blue door");
    // The scripted harness sees the transcript the journal handed back.
    let history = start(&runtime, "s1", "what did I say?\n/history")
        .await
        .outcome()
        .await
        .unwrap();
    assert_eq!(history.content, "remember the blue door\nwhat did I say?");
    assert!(runtime.journal().verify(|_| ()).unwrap().is_ok());
    runtime.shutdown().await.unwrap();
}

/// Per-user isolation, checked by the session's actor (the embedding API has no
/// gateway in front): a turn of another user on an existing session, or on one whose
/// creation is on its way to the journal, is refused as an unknown session.
async fn an_isolated_turn_never_enters_another_users_session(dir: Store) {
    let runtime = open(&dir);
    // Queued behind a busy session rather than refused: only ownership refuses.
    let as_user = |session: &str, user: &str| StartRun {
        user_id: Some(user.to_owned()),
        isolated: true,
        ..start_command(session, "hello", Multitask::Enqueue)
    };
    runtime
        .start_run(as_user("mine", "alice"))
        .await
        .unwrap()
        .unwrap()
        .outcome()
        .await
        .unwrap();
    let taken = runtime.start_run(as_user("mine", "bob")).await.unwrap();
    assert!(
        matches!(taken, Err(Refused::UnknownSession { .. })),
        "{:?}",
        taken.map(|handle| handle.run_id)
    );
    // Concurrent first turns of two users: one owns the session, the other is refused.
    for round in 0..50 {
        let session = format!("race-{round}");
        let (first, second) = tokio::join!(
            runtime.start_run(as_user(&session, "alice")),
            runtime.start_run(as_user(&session, "bob")),
        );
        let accepted = [first.unwrap(), second.unwrap()]
            .into_iter()
            .filter_map(Result::ok)
            .count();
        assert_eq!(accepted, 1, "round {round}");
    }
    // Without isolation the embedding service decides, as before.
    let shared = StartRun {
        user_id: Some("bob".into()),
        ..turn("mine", "hello")
    };
    assert!(runtime.start_run(shared).await.unwrap().is_ok());
    runtime.shutdown().await.unwrap();
}

/// Threads on which the runtime of
/// [`after_a_burst_of_passivations_every_runtime_thread_releases_memory`] called its
/// `release_memory`.
static RELEASED_ON: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn note_release() {
    let name = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .to_owned();
    RELEASED_ON.lock().unwrap().insert(name);
}

/// The threads that keep memory after sessions passivate (the arbiters that hosted
/// them, the keeper, the journal's committer, the registry's) each ask the allocator
/// to give it back, and none is asked while nothing has passivated.
#[tokio::test]
async fn after_a_burst_of_passivations_every_runtime_thread_releases_memory() {
    let store = Store::Sled(tempfile::tempdir().unwrap());
    let mut config = store.config(vec![
        turnstile_tests::scripted_agent(RetryPolicy::default()),
    ]);
    config.session_idle = Duration::from_secs(3600);
    config.release_memory = Some(note_release);
    let runtime = Runtime::open(config).unwrap();
    for n in 0..8 {
        let handle = start(&runtime, &format!("release-{n}"), "hello").await;
        assert_eq!(handle.outcome().await.unwrap().status, RunStatus::Completed);
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        RELEASED_ON.lock().unwrap().is_empty(),
        "released with every session still in memory: {:?}",
        RELEASED_ON.lock().unwrap()
    );
    runtime.set_session_idle(Duration::from_millis(1));
    let deadline = Instant::now() + Duration::from_secs(10);
    let expected = ["turnstile-keeper", "journal-commit", "turnstile-actors"];
    loop {
        let threads = RELEASED_ON.lock().unwrap().clone();
        let arbiters = threads
            .iter()
            .filter(|name| name.contains("arbiter"))
            .count();
        if arbiters == 2 && expected.iter().all(|name| threads.contains(*name)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "released on {threads:?} only (want both arbiters and {expected:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(runtime.sessions_in_memory().await.unwrap(), 0);
    runtime.shutdown().await.unwrap();
}
