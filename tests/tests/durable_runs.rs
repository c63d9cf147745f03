//! Runs that survive (issue 3), through the embedding API on a real journal (each case on sled and on PostgreSQL): the
//! per-session FIFO queue and worker slots, the queue limit, cancellation of queued
//! runs and during a retry backoff, retries, start-up recovery of runs a stopped
//! process left open, idempotency keys, and passivation.

use std::time::{Duration, Instant};

use turnstile_actors::{Multitask, Refused, RetryPolicy, RunHandle, Runtime, StartRun};
use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalPos, RunEvent, RunId, SessionId, Warning,
};
use turnstile_projections::{RunStatus, RunView};
use turnstile_tests::{JournalPlace, Store, open_runtime_on, scripted_agent, start_command};

turnstile_tests::on_both_backends!(
    enqueued_turns_run_one_at_a_time_first_in_first_out,
    a_turn_waiting_behind_its_session_takes_no_worker_slot,
    at_most_max_concurrent_runs_execute_at_once,
    past_max_queued_runs_starts_are_refused,
    a_cancelled_queued_run_never_reaches_the_harness,
    transient_failures_are_retried_on_the_same_run_and_harness_session,
    permanent_failures_are_not_retried,
    after_the_last_retry_the_error_says_the_last_failure_once_or_leads_with_a_different_first_13_32,
    cancelling_during_a_retry_backoff_ends_the_run_within_a_second,
    start_up_resolves_every_run_left_open,
    a_run_with_no_attempts_left_ends_with_a_reason_and_frees_its_session,
    a_repeated_idempotency_key_returns_the_first_run_also_after_a_restart,
    an_idle_session_passivates_and_is_rebuilt_from_the_journal,
    cancelling_a_run_a_crash_left_running_ends_it_and_frees_its_session,
);

turnstile_tests::on_both_backends!(
    multi_thread:
    the_next_turn_right_after_an_end_is_never_refused_as_busy,
);

fn open_with(dir: &Store, retry: RetryPolicy, slots: usize, queued: usize) -> Runtime {
    open_runtime_on(dir, retry, slots, queued)
}

fn open(dir: &Store) -> Runtime {
    open_with(dir, RetryPolicy::default(), 8, 100)
}

fn turn(session: &str, message: &str, multitask: Multitask) -> StartRun {
    start_command(session, message, multitask)
}

async fn submit(
    runtime: &Runtime,
    session: &str,
    message: &str,
    multitask: Multitask,
) -> RunHandle {
    runtime
        .start_run(turn(session, message, multitask))
        .await
        .unwrap()
        .unwrap()
}

async fn view_when_ended(runtime: &Runtime, run_id: &RunId) -> RunView {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(view) = runtime.run_view(run_id).unwrap()
            && view.status.is_terminal()
        {
            return view;
        }
        assert!(Instant::now() < deadline, "run {run_id} did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The global journal order of one kind of event for these runs.
fn order_of(journal: &Journal, kind: &str, runs: &[&RunId]) -> Vec<RunId> {
    journal
        .read_from(JournalPos(0))
        .map(Result::unwrap)
        .filter(|record| record.event.kind() == kind)
        .filter_map(|record| record.event.run_id().cloned())
        .filter(|run_id| runs.contains(&run_id))
        .collect()
}

async fn enqueued_turns_run_one_at_a_time_first_in_first_out(dir: Store) {
    let runtime = open(&dir);
    let a = submit(&runtime, "s", "first\n/sleep 300", Multitask::Reject).await;
    let b = submit(&runtime, "s", "second", Multitask::Enqueue).await;
    let c = submit(&runtime, "s", "third\n/history", Multitask::Enqueue).await;
    assert_eq!(
        runtime.run_view(&b.run_id).unwrap().unwrap().status,
        RunStatus::Pending
    );
    let refused = runtime
        .start_run(turn("s", "rejected", Multitask::Reject))
        .await
        .unwrap()
        .err()
        .unwrap();
    assert_eq!(
        refused,
        Refused::Busy {
            session_id: SessionId::parse("s").unwrap(),
            run_id: a.run_id.clone()
        }
    );
    let (a_id, b_id, c_id) = (a.run_id.clone(), b.run_id.clone(), c.run_id.clone());
    let c_view = c.outcome().await.unwrap();
    assert_eq!(c_view.content, "first\nsecond\nthird");
    let journal = runtime.journal();
    assert_eq!(
        order_of(journal, "RunStarted", &[&a_id, &b_id, &c_id]),
        [a_id.clone(), b_id.clone(), c_id.clone()]
    );
    // One at a time: each run ends before the next starts.
    let lifecycle: Vec<(String, RunId)> = journal
        .read_from(JournalPos(0))
        .map(Result::unwrap)
        .filter(|r| {
            matches!(
                r.event,
                Event::RunStarted { .. } | Event::RunCompleted { .. }
            )
        })
        .map(|r| (r.event.kind().to_owned(), r.event.run_id().unwrap().clone()))
        .collect();
    let expected: Vec<(String, RunId)> = [&a_id, &b_id, &c_id]
        .iter()
        .flat_map(|id| {
            [
                ("RunStarted".to_owned(), (*id).clone()),
                ("RunCompleted".to_owned(), (*id).clone()),
            ]
        })
        .collect();
    assert_eq!(lifecycle, expected);
    runtime.shutdown().await.unwrap();
}

async fn a_turn_waiting_behind_its_session_takes_no_worker_slot(dir: Store) {
    let runtime = open_with(&dir, RetryPolicy::default(), 2, 100);
    let a = submit(&runtime, "busy", "/sleep 600", Multitask::Reject).await;
    let b = submit(&runtime, "busy", "behind a", Multitask::Enqueue).await;
    // The second slot is free for another session even though b waits.
    let started = Instant::now();
    let other = submit(&runtime, "other", "quick", Multitask::Reject)
        .await
        .outcome()
        .await
        .unwrap();
    assert_eq!(other.status, RunStatus::Completed);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "the other session waited {:?}",
        started.elapsed()
    );
    assert_eq!(
        runtime.run_view(&b.run_id).unwrap().unwrap().attempts,
        0,
        "b spent no attempt while waiting"
    );
    assert_eq!(b.outcome().await.unwrap().status, RunStatus::Completed);
    assert_eq!(a.outcome().await.unwrap().status, RunStatus::Completed);
    runtime.shutdown().await.unwrap();
}

async fn at_most_max_concurrent_runs_execute_at_once(dir: Store) {
    let runtime = open_with(&dir, RetryPolicy::default(), 2, 100);
    let mut handles = Vec::new();
    for n in 0..6 {
        handles.push(submit(&runtime, &format!("s{n}"), "/sleep 100", Multitask::Reject).await);
    }
    for handle in handles {
        assert_eq!(handle.outcome().await.unwrap().status, RunStatus::Completed);
    }
    let mut running = 0i32;
    let mut most = 0;
    for record in runtime
        .journal()
        .read_from(JournalPos(0))
        .map(Result::unwrap)
    {
        match record.event {
            Event::RunStarted { .. } => running += 1,
            Event::RunCompleted { .. } => running -= 1,
            _ => {}
        }
        most = most.max(running);
    }
    assert_eq!(most, 2);
    runtime.shutdown().await.unwrap();
}

async fn past_max_queued_runs_starts_are_refused(dir: Store) {
    let runtime = open_with(&dir, RetryPolicy::default(), 1, 2);
    let running = submit(&runtime, "a", "/sleep 400", Multitask::Reject).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _b = submit(&runtime, "b", "waits for the slot", Multitask::Enqueue).await;
    let _c = submit(&runtime, "c", "waits too", Multitask::Enqueue).await;
    let refused = runtime
        .start_run(turn("d", "one too many", Multitask::Enqueue))
        .await
        .unwrap()
        .err()
        .unwrap();
    assert_eq!(refused, Refused::QueueFull { limit: 2 });
    running.outcome().await.unwrap();
    runtime.shutdown().await.unwrap();
}

async fn a_cancelled_queued_run_never_reaches_the_harness(dir: Store) {
    let runtime = open(&dir);
    let a = submit(&runtime, "s", "/sleep 300", Multitask::Reject).await;
    let b = submit(
        &runtime,
        "s",
        "/tool Write {}\n/reply should not run",
        Multitask::Enqueue,
    )
    .await;
    assert!(runtime.cancel_run(&b.run_id).await.unwrap());
    assert!(
        !runtime.cancel_run(&b.run_id).await.unwrap(),
        "cancel is idempotent"
    );
    let b_id = b.run_id.clone();
    let b_events: Vec<&str> = {
        let mut events = b.into_events();
        let mut types = Vec::new();
        while let Some(event) = events.next().await {
            types.push(event.unwrap().event.kind());
        }
        types
    };
    assert_eq!(b_events, ["Cancelled"]);
    let view = runtime.run_view(&b_id).unwrap().unwrap();
    assert_eq!(
        (view.status, view.attempts, view.tools.len()),
        (RunStatus::Cancelled, 0, 0)
    );
    assert_eq!(a.outcome().await.unwrap().status, RunStatus::Completed);
    assert!(order_of(runtime.journal(), "AttemptStarted", &[&b_id]).is_empty());
    runtime.shutdown().await.unwrap();
}

async fn transient_failures_are_retried_on_the_same_run_and_harness_session(dir: Store) {
    let retry = RetryPolicy {
        retries: 2,
        delay_between_retries_s: 0.05,
        exponential_backoff: true,
    };
    let runtime = open_with(&dir, retry, 8, 100);
    let mut handle = submit(
        &runtime,
        "s",
        "/tool Read {}\n/fail transient 2\n/reply done",
        Multitask::Reject,
    )
    .await;
    let run_id = handle.run_id.clone();
    let mut types = Vec::new();
    let mut warnings = Vec::new();
    while let Some(event) = handle.events().next().await {
        let event = event.unwrap();
        if let RunEvent::Warning {
            warning:
                Warning::Retry {
                    attempt,
                    attempts,
                    delay_s,
                    ..
                },
        } = &event.event
        {
            warnings.push((*attempt, *attempts, *delay_s));
        }
        types.push(event.event.kind());
    }
    assert_eq!(types.first().copied(), Some("Started"));
    assert_eq!(types.last().copied(), Some("Completed"));
    assert_eq!(types.iter().filter(|t| **t == "Started").count(), 1);
    assert_eq!(warnings, [(1, 3, 0.05), (2, 3, 0.1)]);
    let view = runtime.run_view(&run_id).unwrap().unwrap();
    assert_eq!(
        (view.status, view.attempts, view.content.as_str()),
        (RunStatus::Completed, 3, "done")
    );
    // Each attempt's tool call appears once.
    let ids: Vec<&str> = view.tools.iter().map(|t| t.tool_call_id.as_str()).collect();
    assert_eq!(ids.len(), 3);
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique.len(), 3);
    // All attempts ran on one harness session.
    let sessions: Vec<String> = runtime
        .journal()
        .read_from(JournalPos(0))
        .map(Result::unwrap)
        .filter_map(|r| match r.event {
            Event::AttemptStarted {
                harness_session_id, ..
            } => Some(harness_session_id),
            _ => None,
        })
        .collect();
    assert_eq!(sessions.len(), 3);
    assert!(sessions.iter().all(|s| s == &sessions[0]));
    runtime.shutdown().await.unwrap();
}

async fn permanent_failures_are_not_retried(dir: Store) {
    let retry = RetryPolicy {
        retries: 3,
        delay_between_retries_s: 0.01,
        exponential_backoff: false,
    };
    let runtime = open_with(&dir, retry, 8, 100);
    for kind in [
        "authentication",
        "billing",
        "invalid_request",
        "context_window",
        "policy",
        "max_turns",
        "max_budget",
    ] {
        let view = submit(
            &runtime,
            kind,
            &format!("/fail permanent {kind}"),
            Multitask::Reject,
        )
        .await
        .outcome()
        .await
        .unwrap();
        assert_eq!(
            (view.status, view.attempts),
            (RunStatus::Error, 1),
            "{kind}"
        );
        assert_eq!(view.error.as_ref().unwrap().0, kind);
    }
    runtime.shutdown().await.unwrap();
}

async fn after_the_last_retry_the_error_says_the_last_failure_once_or_leads_with_a_different_first_13_32(
    dir: Store,
) {
    let retry = RetryPolicy {
        retries: 1,
        delay_between_retries_s: 0.0,
        exponential_backoff: false,
    };
    let runtime = open_with(&dir, retry, 8, 100);
    // The same failure each time (issue 32): said once, with the attempt count.
    let handle = submit(&runtime, "s", "/fail transient 5", Multitask::Reject).await;
    let view = handle.outcome().await.unwrap();
    assert_eq!((view.status, view.attempts), (RunStatus::Error, 2));
    let message = &view.error.as_ref().unwrap().1;
    assert_eq!(
        message, "scripted transient failure (attempt 2 of 5 failing) (attempt 2 of 2)",
        "{message}"
    );
    // A first failure of another kind (issue 13): the first real cause leads.
    let handle = submit(
        &runtime,
        "s",
        "/fail transient 1\n/fail permanent policy",
        Multitask::Reject,
    )
    .await;
    let view = handle.outcome().await.unwrap();
    assert_eq!((view.status, view.attempts), (RunStatus::Error, 2));
    let message = &view.error.as_ref().unwrap().1;
    assert_eq!(
        message,
        "scripted transient failure (attempt 1 of 1 failing) (attempt 1); attempt 2 of 2: scripted permanent failure: policy",
        "{message}"
    );
    runtime.shutdown().await.unwrap();
}

async fn cancelling_during_a_retry_backoff_ends_the_run_within_a_second(dir: Store) {
    let retry = RetryPolicy {
        retries: 3,
        delay_between_retries_s: 30.0,
        exponential_backoff: false,
    };
    let runtime = open_with(&dir, retry, 8, 100);
    let mut handle = submit(&runtime, "s", "/fail transient 5", Multitask::Reject).await;
    while let Some(event) = handle.events().next().await {
        if matches!(event.unwrap().event, RunEvent::Warning { .. }) {
            break;
        }
    }
    let cancelled_at = Instant::now();
    assert!(runtime.cancel_run(&handle.run_id).await.unwrap());
    let view = handle.outcome().await.unwrap();
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(1),
        "took {:?}",
        cancelled_at.elapsed()
    );
    assert_eq!((view.status, view.attempts), (RunStatus::Cancelled, 1));
    runtime.shutdown().await.unwrap();
}

/// Writes what a process that stopped mid-way would have left: a queued run, and runs
/// that were running, one of whose last attempt failed permanently.
fn leave_open_runs(place: &JournalPlace) -> [RunId; 4] {
    let journal = place.open();
    let ids = [
        RunId::new_v7(),
        RunId::new_v7(),
        RunId::new_v7(),
        RunId::new_v7(),
    ];
    let queued = |run_id: &RunId, message: &str| Event::RunQueued {
        run_id: run_id.clone(),
        agent_id: "scripted".into(),
        user_id: None,
        input: message.into(),
        options: Default::default(),
    };
    let started = |run_id: &RunId| Event::RunStarted {
        run_id: run_id.clone(),
        model: "scripted".into(),
        model_provider: "turnstile".into(),
    };
    let attempt = |run_id: &RunId| Event::AttemptStarted {
        run_id: run_id.clone(),
        attempt: 1,
        harness_session_id: "h".into(),
    };
    let created = Event::SessionCreated {
        agent_id: "scripted".into(),
        user_id: None,
    };
    let sessions = [
        vec![created.clone(), queued(&ids[0], "was queued")],
        vec![
            created.clone(),
            queued(&ids[1], "was running"),
            started(&ids[1]),
            attempt(&ids[1]),
        ],
        vec![
            created.clone(),
            queued(&ids[2], "failed for good"),
            started(&ids[2]),
            attempt(&ids[2]),
            Event::AttemptFailed {
                run_id: ids[2].clone(),
                attempt: 1,
                error_type: "billing".into(),
                message: "no credit".into(),
                retryable: false,
            },
        ],
        vec![
            created,
            queued(&ids[3], "queued behind"),
            started(&ids[3]),
            attempt(&ids[3]),
        ],
    ];
    for (n, events) in sessions.into_iter().enumerate() {
        journal
            .append_blocking(
                &SessionId::parse(&format!("left-{n}")).unwrap(),
                Expected::Any,
                events,
            )
            .unwrap()
            .unwrap();
    }
    journal.close().unwrap();
    ids
}

async fn start_up_resolves_every_run_left_open(dir: Store) {
    let path = dir.place();
    let [queued, running, permanent, _] = std::thread::spawn(move || leave_open_runs(&path))
        .join()
        .unwrap();
    // With one retry allowed, the interrupted run gets a second attempt.
    let retry = RetryPolicy {
        retries: 1,
        delay_between_retries_s: 0.0,
        exponential_backoff: false,
    };
    let runtime = open_with(&dir, retry, 8, 100);
    let queued_view = view_when_ended(&runtime, &queued).await;
    assert_eq!(
        (queued_view.status, queued_view.content.as_str()),
        (RunStatus::Completed, "echo: was queued")
    );
    let running_view = view_when_ended(&runtime, &running).await;
    assert_eq!(
        (running_view.status, running_view.attempts),
        (RunStatus::Completed, 2)
    );
    let permanent_view = view_when_ended(&runtime, &permanent).await;
    assert_eq!(
        (permanent_view.status, permanent_view.attempts),
        (RunStatus::Error, 1)
    );
    assert!(runtime.journal().open_runs().unwrap().is_empty());
    runtime.shutdown().await.unwrap();
}

async fn a_run_with_no_attempts_left_ends_with_a_reason_and_frees_its_session(dir: Store) {
    let path = dir.place();
    let [_, running, _, _] = std::thread::spawn(move || leave_open_runs(&path))
        .join()
        .unwrap();
    let runtime = open(&dir);
    let view = view_when_ended(&runtime, &running).await;
    assert_eq!(view.status, RunStatus::Error);
    let (error_type, message) = view.error.unwrap();
    assert_eq!(error_type, "process_stopped");
    assert!(message.contains("stopped"), "{message}");
    let next = submit(&runtime, "left-1", "again", Multitask::Reject)
        .await
        .outcome()
        .await
        .unwrap();
    assert_eq!(next.status, RunStatus::Completed);
    // Its stream ends with the error, at the next index.
    let mut events = runtime.run_events(&running, None).unwrap().unwrap();
    let mut last = None;
    while let Some(event) = events.next().await {
        last = Some(event.unwrap());
    }
    let last = last.unwrap();
    assert_eq!(
        (last.event.kind(), last.event_index),
        ("Failed", EventIndex(0))
    );
    runtime.shutdown().await.unwrap();
}

async fn a_repeated_idempotency_key_returns_the_first_run_also_after_a_restart(dir: Store) {
    let runtime = open(&dir);
    let keyed = |message: &str| StartRun {
        idempotency_key: Some("key-1".into()),
        ..turn("s", message, Multitask::Enqueue)
    };
    let first = runtime.start_run(keyed("once")).await.unwrap().unwrap();
    let second = runtime.start_run(keyed("twice")).await.unwrap().unwrap();
    assert_eq!(second.run_id, first.run_id);
    assert!(second.reused);
    drop(second);
    let first_id = first.run_id.clone();
    first.outcome().await.unwrap();
    runtime.shutdown().await.unwrap();
    drop(runtime);
    let runtime = open(&dir);
    let third = runtime.start_run(keyed("thrice")).await.unwrap().unwrap();
    assert_eq!(third.run_id, first_id);
    let view = third.outcome().await.unwrap();
    assert_eq!(view.content, "echo: once");
    assert_eq!(
        runtime
            .session_state(&SessionId::parse("s").unwrap())
            .unwrap()
            .unwrap()
            .runs
            .len(),
        1
    );
    runtime.shutdown().await.unwrap();
}

async fn an_idle_session_passivates_and_is_rebuilt_from_the_journal(dir: Store) {
    let mut config = dir.config(vec![scripted_agent(RetryPolicy::default())]);
    config.session_idle = Duration::from_millis(100);
    let runtime = Runtime::open(config).unwrap();
    submit(&runtime, "s", "before passivation", Multitask::Reject)
        .await
        .outcome()
        .await
        .unwrap();
    // On sled it stays for its idle time; on a shared journal an idle session gives its
    // lease back at once (any replica may take the next turn), so it may be gone already.
    if matches!(dir, Store::Sled(_)) {
        assert_eq!(runtime.sessions_in_memory().await.unwrap(), 1);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while runtime.sessions_in_memory().await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "the session never passivated");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = submit(&runtime, "s", "after\n/history", Multitask::Reject)
        .await
        .outcome()
        .await
        .unwrap();
    assert_eq!(after.content, "before passivation\nafter");
    runtime.shutdown().await.unwrap();
}

async fn cancelling_a_run_a_crash_left_running_ends_it_and_frees_its_session(dir: Store) {
    let path = dir.place();
    let run_id = std::thread::spawn(move || {
        let journal = path.open();
        let run_id = RunId::new_v7();
        let events = vec![
            Event::SessionCreated {
                agent_id: "scripted".into(),
                user_id: None,
            },
            Event::RunQueued {
                run_id: run_id.clone(),
                agent_id: "scripted".into(),
                user_id: None,
                input: "/tool Read {}\n/sleep 30000".into(),
                options: Default::default(),
            },
            Event::RunStarted {
                run_id: run_id.clone(),
                model: "scripted".into(),
                model_provider: "turnstile".into(),
            },
            Event::AttemptStarted {
                run_id: run_id.clone(),
                attempt: 1,
                harness_session_id: "h".into(),
            },
        ];
        journal
            .append_blocking(&SessionId::parse("crashed").unwrap(), Expected::Any, events)
            .unwrap()
            .unwrap();
        journal.close().unwrap();
        run_id
    })
    .join()
    .unwrap();
    let retry = RetryPolicy {
        retries: 1,
        delay_between_retries_s: 0.0,
        exponential_backoff: false,
    };
    let runtime = open_with(&dir, retry, 8, 100);
    // Recovery gives it a second attempt; the client cancels it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(runtime.cancel_run(&run_id).await.unwrap());
    let view = view_when_ended(&runtime, &run_id).await;
    assert_eq!(view.status, RunStatus::Cancelled);
    assert_eq!(view.attempts, 2);
    let next = submit(&runtime, "crashed", "free again", Multitask::Reject)
        .await
        .outcome()
        .await
        .unwrap();
    assert_eq!(next.content, "echo: free again");
    runtime.shutdown().await.unwrap();
}

/// A client that reads a run's end and sends the session's next turn at once is never
/// refused as busy, however loaded the runtime: the end a client reads may come from the
/// journal (a lagging stream re-reads it) before the session's actor has applied it
/// (the runs benchmark with 1,000 parallel sessions found this).
async fn the_next_turn_right_after_an_end_is_never_refused_as_busy(dir: Store) {
    let runtime = open_runtime_on(&dir, RetryPolicy::default(), 256, 100_000);
    let tasks: Vec<_> = (0..1_000)
        .map(|n| {
            let runtime = runtime.clone();
            tokio::spawn(async move {
                for turn in 0..5 {
                    let handle = runtime
                        .start_run(start_command(
                            &format!("b{n}"),
                            &format!("turn {turn}"),
                            Multitask::Reject,
                        ))
                        .await
                        .unwrap()
                        .unwrap_or_else(|refused| panic!("turn {turn} of b{n}: {refused}"));
                    let view = handle.outcome().await.unwrap();
                    assert_eq!(view.status, RunStatus::Completed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    runtime.shutdown().await.unwrap();
}
