//! Issue 13, defect 1: an event larger than a record (a transcript line with an image,
//! a tool that printed a large file) is journaled intact, stored apart from its record,
//! and every reader (by session, in global order, live, export and import, verify)
//! sees it as the one event it is; past `max_event_bytes` it is refused by name.

mod common;

use turnstile_journal::portable::import;
use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalOptions, JournalPos, RunEvent, RunId, Seq,
    SessionId,
};

fn line(bytes: usize) -> Event {
    Event::TranscriptLineAppended {
        run_id: RunId::parse("r").unwrap(),
        harness_session_id: "h".into(),
        line: format!("{{\"image\":\"{}\"}}", "Q".repeat(bytes)),
    }
}

fn wire(index: u64, bytes: usize) -> Event {
    Event::RunEventEmitted {
        run_id: RunId::parse("r").unwrap(),
        event_index: EventIndex(index),
        event: RunEvent::ContentDelta {
            text: "z".repeat(bytes),
        },
    }
}

#[test]
fn events_larger_than_a_record_are_journaled_whole_and_read_back_as_one_13() {
    let dir = tempfile::tempdir().unwrap();
    let session = SessionId::parse("s").unwrap();
    let events = vec![line(5 << 20), wire(0, 10 << 20), wire(1, 10)];
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let mut live = journal.subscribe_from(JournalPos(0));
    let appended = journal
        .append_blocking(&session, Expected::Any, events.clone())
        .unwrap()
        .unwrap();
    assert_eq!(appended.len(), 3, "one record per event");
    assert_eq!(appended[0].event, events[0]);
    assert!(appended[1].size_bytes > 10 << 20);

    let read: Vec<Event> = journal
        .read_session(&session, Seq(0))
        .map(|record| record.unwrap().event)
        .collect();
    assert_eq!(read, events);
    let seqs: Vec<u64> = journal
        .read_session(&session, Seq(0))
        .map(|record| record.unwrap().seq.0)
        .collect();
    assert_eq!(seqs, vec![0, 1, 2]);
    assert_eq!(
        journal.get(JournalPos(1)).unwrap().unwrap().event,
        events[1]
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let first_live = runtime.block_on(async { live.next().await.unwrap() });
    assert_eq!(first_live.event, events[0]);

    let report = journal.verify(|_| ()).unwrap().unwrap();
    assert_eq!(report.events, 3);
    assert!(report.bytes > 15 << 20, "{report:?}");

    // Past the bound: refused, naming the bound; nothing is journaled.
    let small = Journal::open(
        tempfile::tempdir().unwrap().path(),
        JournalOptions {
            max_event_bytes: 1 << 20,
            ..JournalOptions::default()
        },
    )
    .unwrap();
    let refused = small
        .append_blocking(&session, Expected::Any, vec![line(2 << 20)])
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("exceeds max_event_bytes (1048576)"),
        "{refused}"
    );
    assert_eq!(small.next_pos(), JournalPos(0));

    // Export shows each event whole; an import builds the same journal, byte for byte.
    let exported = common::export(&journal);
    assert_eq!(exported.lines().count(), 3);
    assert!(!exported.contains("StoredApart"));
    journal.close().unwrap();
    drop(journal);
    let target = tempfile::tempdir().unwrap();
    import(target.path(), exported.as_bytes(), |_| ())
        .unwrap()
        .unwrap();
    let imported = Journal::open(target.path(), JournalOptions::default()).unwrap();
    assert_eq!(imported.verify(|_| ()).unwrap().unwrap().events, 3);
    assert_eq!(common::export(&imported), exported);
    imported.close().unwrap();
}

#[test]
fn verify_names_an_event_stored_apart_that_was_damaged_13() {
    let dir = tempfile::tempdir().unwrap();
    let session = SessionId::parse("s").unwrap();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        journal
            .append_blocking(&session, Expected::Any, vec![wire(0, 1), line(3 << 20)])
            .unwrap()
            .unwrap();
        journal.close().unwrap();
    }
    {
        let db = common::open_sled(dir.path());
        let tree = db.open_tree("journal").unwrap();
        let (key, value) = tree.scan_prefix(b"A").next().unwrap().unwrap();
        let mut value = value.to_vec();
        value[100] ^= 1;
        tree.insert(key, value).unwrap();
        db.flush().unwrap();
    }
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let corruption = journal.verify(|_| ()).unwrap().unwrap_err().to_string();
    assert!(
        corruption.contains("does not match its digest"),
        "{corruption}"
    );
    assert!(
        corruption.contains("position 1") || corruption.contains(" 1"),
        "{corruption}"
    );
    let read = journal.read_session(&session, Seq(0)).nth(1).unwrap();
    assert!(read.is_err(), "a damaged event must not read as sound");
}
