//! Issue 27's fault search found it (seed 9315765066857002865): a turn accepted while
//! its session's deletion was being appended was journaled after the `SessionDeleted`,
//! a run of a session that no longer had a `SessionCreated`. Here the race is made
//! certain instead of found: the journal answers the deletion's append a second late
//! (it is written at once), and a turn for the session arrives meanwhile. The turn is
//! refused (`Refused::Deleting`, 409 `session_busy` over HTTP); once the deletion is
//! answered, the same id starts a new session; the journal verifies, structure
//! included. On both backends. On PostgreSQL this first failed otherwise: an idle
//! session actor there gives its session back at once, and it stopped while its
//! deletion was in flight, so the deletion's answer was dropped and the caller, asking
//! again, heard "no such session" (a `DELETE` answered 404 after deleting).

use std::sync::Arc;
use std::time::Duration;

use turnstile_actors::{Multitask, Refused, RetryPolicy};
use turnstile_journal::faults::{self, Fault, Faults};
use turnstile_journal::{Event, SessionId};
use turnstile_tests::{Store, open_runtime_on, start_command};

turnstile_tests::on_both_backends!(
    a_turn_during_a_deletion_is_refused_and_the_journal_stays_whole_27
);

/// Answers every append that deletes a session a second late, and says when one began.
#[derive(Default)]
struct SlowDeletion {
    began: tokio::sync::Notify,
}

impl Faults for SlowDeletion {
    fn before_append(&self, _session_id: &SessionId, events: &[Event]) -> Fault {
        if events
            .iter()
            .any(|event| matches!(event, Event::SessionDeleted { .. }))
        {
            self.began.notify_one();
            Fault::Delay(Duration::from_secs(1))
        } else {
            Fault::None
        }
    }

    fn projection_allowed(&self) -> bool {
        true
    }
}

async fn a_turn_during_a_deletion_is_refused_and_the_journal_stays_whole_27(store: Store) {
    let place = match &store {
        Store::Sled(dir) => dir.path().display().to_string(),
        Store::Postgres { url, .. } => url.clone(),
    };
    let slow = Arc::new(SlowDeletion::default());
    faults::install(&place, slow.clone());
    let runtime = Arc::new(open_runtime_on(&store, RetryPolicy::default(), 4, 100));
    let session = SessionId::parse("doomed").unwrap();
    let first = runtime
        .start_run(start_command(
            "doomed",
            "before the deletion",
            Multitask::Reject,
        ))
        .await
        .unwrap()
        .unwrap();
    first.outcome().await.unwrap();

    let deleting = {
        let runtime = runtime.clone();
        let session = session.clone();
        tokio::spawn(async move { runtime.delete_session(&session).await })
    };
    // The deletion is being appended, and is not answered for a second: a turn now
    // races it.
    tokio::time::timeout(Duration::from_secs(10), slow.began.notified())
        .await
        .expect("the deletion's append began");
    let raced = runtime
        .start_run(start_command(
            "doomed",
            "during the deletion",
            Multitask::Reject,
        ))
        .await
        .unwrap();
    match raced {
        Err(Refused::Deleting { .. }) => {}
        Err(other) => panic!("a turn during the deletion was refused otherwise: {other:?}"),
        Ok(handle) => panic!(
            "a turn during the deletion was accepted: run {}",
            handle.run_id
        ),
    }
    assert_eq!(deleting.await.unwrap().unwrap(), Ok(true));

    // Gone, the id starts a new session, whose first record is its creation.
    let again = runtime
        .start_run(start_command(
            "doomed",
            "after the deletion",
            Multitask::Reject,
        ))
        .await
        .unwrap()
        .unwrap();
    let view = again.outcome().await.unwrap();
    assert!(view.status.is_terminal(), "{view:?}");
    runtime.shutdown().await.unwrap();
    drop(runtime);
    faults::remove(&place);

    let journal = store.journal();
    let report = journal.verify(|_| {}).unwrap().unwrap();
    journal
        .check_structure(report.events, |_| {})
        .unwrap()
        .unwrap_or_else(|corruption| panic!("the journal's structure: {corruption:?}"));
    let kinds: Vec<&str> = journal
        .read_session(&session, turnstile_journal::Seq(0))
        .map(|record| record.unwrap().event.kind())
        .filter(|kind| matches!(*kind, "SessionCreated" | "SessionDeleted" | "RunQueued"))
        .collect();
    assert_eq!(
        kinds,
        [
            "SessionCreated",
            "RunQueued",
            "SessionDeleted",
            "SessionCreated",
            "RunQueued"
        ],
        "no run of the racing turn, and the new session begins with its creation"
    );
}
