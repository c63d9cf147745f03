//! The session index under load: readers racing the committer while it moves runs
//! from the in-memory tail to the stored index (every 100 ms) always see each session's
//! stream whole, in order, without a repeat or a gap, and `verify` running meanwhile
//! finds nothing wrong; a journal reopened after a clean close reads the same.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalOptions, JournalPos, RunEvent, RunId, Seq,
    SessionId,
};

const SESSIONS: usize = 6;

fn event(session: usize, n: u64) -> Event {
    Event::RunEventEmitted {
        run_id: RunId::parse("r").unwrap(),
        event_index: EventIndex(n),
        event: RunEvent::ContentDelta {
            text: format!("{session}:{n}"),
        },
    }
}

fn session(n: usize) -> SessionId {
    SessionId::parse(&format!("s{n}")).unwrap()
}

/// Reads a session from `from` and checks it is that stream, whole and in order.
fn read_whole(journal: &Journal, n: usize, from: u64) -> u64 {
    let mut next = from;
    for record in journal.read_session(&session(n), Seq(from)) {
        let record = record.unwrap();
        assert_eq!(record.seq, Seq(next), "session {n} read from {from}");
        assert_eq!(record.event, event(n, next), "session {n} sequence {next}");
        next += 1;
    }
    next
}

#[test]
fn readers_racing_index_writes_see_every_stream_whole() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..SESSIONS)
        .map(|n| {
            let journal = journal.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut next = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // One to three events a request, so runs have different lengths.
                    let count = 1 + next % 3;
                    let events = (next..next + count).map(|i| event(n, i)).collect();
                    journal
                        .append_blocking(&session(n), Expected::Next(Seq(next)), events)
                        .unwrap()
                        .unwrap();
                    next += count;
                }
                next
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|reader| {
            let journal = journal.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut seen = [0u64; SESSIONS];
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) {
                    for (n, seen) in seen.iter_mut().enumerate() {
                        // A whole read never shrinks; a read from the middle starts there.
                        let whole = read_whole(&journal, n, 0);
                        assert!(
                            whole >= *seen,
                            "session {n} went back from {seen} to {whole}"
                        );
                        *seen = whole;
                        let from = whole / 2 + reader as u64;
                        let end = read_whole(&journal, n, from);
                        assert!(end >= whole.max(from), "session {n} from {from}");
                        // From near the end, where the in-memory tail may hold all
                        // that follows (and the index is then not read).
                        let near_end = whole.saturating_sub(2 + reader as u64);
                        let end = read_whole(&journal, n, near_end);
                        assert!(end >= whole, "session {n} from {near_end}");
                        let next = journal.session_next_seq(&session(n)).unwrap().0;
                        assert!(
                            next >= whole,
                            "session {n} next {next} after reading {whole}"
                        );
                        reads += 1;
                    }
                }
                reads
            })
        })
        .collect();
    // An auditor verifies the journal while it grows.
    let auditor = {
        let journal = journal.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut audits = 0;
            while !stop.load(Ordering::Relaxed) {
                let report = journal.verify(|_| ()).unwrap();
                assert!(report.is_ok(), "verify during appends: {report:?}");
                audits += 1;
            }
            audits
        })
    };
    // Long enough for several index writes (every 100 ms) under load.
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(1_200));
    stop.store(true, Ordering::Relaxed);
    let written: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let reads: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(auditor.join().unwrap() > 2);
    assert!(reads > 20, "only {reads} reads in {:?}", started.elapsed());
    for (n, written) in written.iter().enumerate() {
        assert!(*written > 50, "session {n}: only {written} events written");
        assert_eq!(read_whole(&journal, n, 0), *written);
    }
    let total: u64 = written.iter().sum();
    assert_eq!(journal.next_pos(), JournalPos(total));
    assert_eq!(journal.read_from(JournalPos(0)).count() as u64, total);
    let report = journal.verify(|_| ()).unwrap().unwrap();
    assert_eq!(report.events, total);
    journal.close().unwrap();
    drop(journal);

    // Reopened after a clean close: the same streams, and appends continue them.
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    for (n, written) in written.iter().enumerate() {
        assert_eq!(read_whole(&journal, n, 0), *written);
        assert_eq!(
            journal.session_next_seq(&session(n)).unwrap(),
            Seq(*written)
        );
    }
    let records = journal
        .append_blocking(&session(0), Expected::Any, vec![event(0, written[0])])
        .unwrap()
        .unwrap();
    assert_eq!(records[0].seq, Seq(written[0]));
    assert_eq!(records[0].pos, JournalPos(total));
    assert!(journal.verify(|_| ()).unwrap().is_ok());
}

#[test]
fn a_session_appending_a_little_at_a_time_keeps_few_index_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let writes = 6;
    for n in 0..writes {
        // Each append comes after the index's write interval, so each writes the index.
        std::thread::sleep(Duration::from_millis(
            turnstile_journal::limits::SESSION_INDEX_FLUSH_MS + 20,
        ));
        journal
            .append_blocking(&session(0), Expected::Any, vec![event(0, n)])
            .unwrap()
            .unwrap();
    }
    assert_eq!(read_whole(&journal, 0, 0), writes);
    journal.close().unwrap();
    drop(journal);
    let db = common::open_sled(dir.path());
    let tree = db.open_tree("journal").unwrap();
    let chunks: Vec<_> = tree.scan_prefix(b"Is0\0").map(Result::unwrap).collect();
    // One chunk, its runs added write after write (one run per append).
    assert_eq!(chunks.len(), 1);
    let runs = turnstile_journal::codec::decode_runs(&chunks[0].1).unwrap();
    assert_eq!(runs.len() as u64, writes);
    assert_eq!(runs.last().unwrap().first_seq, Seq(writes - 1));
}
