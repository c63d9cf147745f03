//! Export and import through the library: an import of large records writes segments
//! of bounded size, and the imported journal reads, verifies and exports the same.

mod common;

use turnstile_journal::portable::import;
use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalOptions, RunEvent, RunId, Seq, SessionId,
};

fn big_event(n: u64) -> Event {
    Event::RunEventEmitted {
        run_id: RunId::parse("r").unwrap(),
        event_index: EventIndex(n),
        // A large tool result: a few of them fill a segment.
        event: RunEvent::ContentDelta {
            text: format!("{n}:{}", "y".repeat(300 * 1024)),
        },
    }
}

#[test]
fn an_import_of_large_records_reads_verifies_and_exports_the_same() {
    let source = tempfile::tempdir().unwrap();
    let journal = Journal::open(source.path(), JournalOptions::default()).unwrap();
    for n in 0..12 {
        let session = SessionId::parse(if n % 3 == 0 { "a" } else { "b" }).unwrap();
        journal
            .append_blocking(&session, Expected::Any, vec![big_event(n)])
            .unwrap()
            .unwrap();
    }
    let exported = common::export(&journal);
    journal.close().unwrap();

    let target = tempfile::tempdir().unwrap();
    let report = import(target.path(), exported.as_bytes(), |_| ())
        .unwrap()
        .unwrap();
    assert_eq!((report.records, report.streams), (12, 2));
    {
        // 12 records of ~300 KiB: a segment ends once it holds 1 MiB, so 4 records each.
        let db = common::open_sled(target.path());
        let segments = db.open_tree("journal").unwrap().scan_prefix(b"L").count();
        assert_eq!(segments, 3);
    }
    let imported = Journal::open(target.path(), JournalOptions::default()).unwrap();
    let verified = imported.verify(|_| ()).unwrap().unwrap();
    assert_eq!(verified.events, 12);
    let a: Vec<u64> = imported
        .read_session(&SessionId::parse("a").unwrap(), Seq(0))
        .map(|record| record.unwrap().pos.0)
        .collect();
    assert_eq!(a, vec![0, 3, 6, 9]);
    assert_eq!(common::export(&imported), exported);
}
