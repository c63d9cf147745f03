//! The live subscription: it never blocks writers, and a reader that falls behind the
//! bounded channel re-reads from the journal without skipping or repeating a record.

use turnstile_journal::limits::LIVE_BROADCAST_RECORDS;
use turnstile_journal::{Event, Expected, Journal, JournalOptions, JournalPos, SessionId};

fn created(n: usize) -> Event {
    Event::SessionCreated {
        agent_id: format!("agent-{n}"),
        user_id: None,
    }
}

#[tokio::test]
async fn a_lagging_reader_neither_blocks_writers_nor_skips_records() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let mut subscription = journal.subscribe_from(JournalPos(0));
    let total = LIVE_BROADCAST_RECORDS * 2 + 17;
    // The reader reads nothing while twice the channel's capacity is written: the
    // writer must finish anyway.
    for chunk in 0..total.div_ceil(100) {
        let events = (chunk * 100..((chunk + 1) * 100).min(total))
            .map(created)
            .collect();
        journal
            .append(&SessionId::parse("s").unwrap(), Expected::Any, events)
            .await
            .unwrap()
            .unwrap();
    }
    for n in 0..total {
        let record = subscription.next().await.unwrap();
        assert_eq!(record.pos, JournalPos(n as u64));
        assert_eq!(record.event, created(n));
    }
    // And then it follows live appends.
    let session = SessionId::parse("t").unwrap();
    let writer = journal.clone();
    let append = tokio::spawn(async move {
        writer
            .append(&session, Expected::Any, vec![created(total)])
            .await
    });
    let live = subscription.next().await.unwrap();
    assert_eq!(live.pos, JournalPos(total as u64));
    append.await.unwrap().unwrap().unwrap();
}

#[tokio::test]
async fn a_subscription_can_start_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let session = SessionId::parse("s").unwrap();
    journal
        .append(&session, Expected::Any, (0..10).map(created).collect())
        .await
        .unwrap()
        .unwrap();
    let mut subscription = journal.subscribe_from(JournalPos(7));
    for n in 7..10 {
        assert_eq!(subscription.next().await.unwrap().event, created(n));
    }
}
