//! `verify` against real tampering: the journal is written through the API, then
//! edited underneath with sled directly, the way an attacker or a bad disk would.

mod common;

use turnstile_journal::codec::{self, RecordBody};
use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalOptions, JournalPos, RunEvent, RunId, SessionId,
};

fn event(n: u64) -> Event {
    Event::RunEventEmitted {
        run_id: RunId::parse("r").unwrap(),
        event_index: EventIndex(n),
        event: RunEvent::ContentDelta {
            text: format!("part {n}"),
        },
    }
}

/// Ten records, alternating between sessions a and b.
fn journal_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    for n in 0..10 {
        let session = SessionId::parse(if n % 2 == 0 { "a" } else { "b" }).unwrap();
        journal
            .append_blocking(&session, Expected::Any, vec![event(n)])
            .unwrap()
            .unwrap();
    }
    journal.close().unwrap();
    dir
}

/// The sled key of the segment holding global position `pos`.
fn segment_key(tree: &sled::Tree, pos: u64) -> sled::IVec {
    let mut key = vec![b'L'];
    key.extend_from_slice(&pos.to_be_bytes());
    tree.range(..=key).next_back().unwrap().unwrap().0
}

fn first_pos(key: &[u8]) -> u64 {
    u64::from_be_bytes(key[1..9].try_into().unwrap())
}

fn record_bytes(tree: &sled::Tree, pos: u64) -> Vec<u8> {
    let key = segment_key(tree, pos);
    let bytes = tree.get(&key).unwrap().unwrap();
    let segment = codec::Segment::parse(bytes).unwrap();
    segment
        .record((pos - first_pos(&key)) as usize)
        .unwrap()
        .to_vec()
}

/// Rewrites the segment holding `pos` the way a forger would (its header checksum
/// recomputed): `edit` gets its manifest, its records and the index of `pos` in them.
fn rewrite_segment(
    tree: &sled::Tree,
    pos: u64,
    edit: impl FnOnce(&mut Vec<codec::ManifestEntry>, &mut Vec<Vec<u8>>, usize),
) {
    let key = segment_key(tree, pos);
    let segment = codec::Segment::parse(tree.get(&key).unwrap().unwrap()).unwrap();
    let mut entries = segment.entries().unwrap();
    let mut records: Vec<Vec<u8>> = (0..segment.len())
        .map(|index| segment.record(index).unwrap().to_vec())
        .collect();
    edit(&mut entries, &mut records, (pos - first_pos(&key)) as usize);
    tree.insert(key, codec::encode_segment(&entries, &records))
        .unwrap();
}

fn replace_record(tree: &sled::Tree, pos: u64, bytes: Vec<u8>) {
    rewrite_segment(tree, pos, |_, records, index| records[index] = bytes);
}

fn tamper(dir: &std::path::Path, edit: impl FnOnce(&sled::Tree)) {
    let db = common::open_sled(dir);
    let tree = db.open_tree("journal").unwrap();
    edit(&tree);
    db.flush().unwrap();
}

fn first_bad(dir: &std::path::Path) -> Option<(u64, String)> {
    let journal = Journal::open(dir, JournalOptions::default()).unwrap();
    journal
        .verify(|_| ())
        .unwrap()
        .err()
        .map(|corruption| (corruption.pos.0, corruption.reason))
}

#[test]
fn a_sound_journal_verifies() {
    let dir = journal_dir();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let report = journal.verify(|_| ()).unwrap().unwrap();
    assert_eq!((report.streams, report.events), (2, 10));
}

#[test]
fn a_flipped_byte_is_found_at_its_position() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        let mut bytes = record_bytes(tree, 5);
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        replace_record(tree, 5, bytes);
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 5);
    assert!(reason.contains("checksum"), "{reason}");
}

#[test]
fn a_removed_record_is_found() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        tree.remove(segment_key(tree, 4)).unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 4);
    assert!(reason.contains("missing"), "{reason}");
}

#[test]
fn a_removed_last_record_is_found_through_the_index() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        tree.remove(segment_key(tree, 9)).unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 9);
    assert!(reason.contains("missing"), "{reason}");
}

#[test]
fn a_record_removed_from_inside_a_segment_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let session = SessionId::parse("a").unwrap();
    journal
        .append_blocking(&session, Expected::Any, (0..3).map(event).collect())
        .unwrap()
        .unwrap();
    journal.close().unwrap();
    drop(journal);
    tamper(dir.path(), |tree| {
        rewrite_segment(tree, 1, |entries, records, index| {
            records.remove(index);
            entries[0].count -= 1;
        });
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 1, "{reason}");
    assert!(reason.contains("moved"), "{reason}");
}

#[test]
fn a_reordered_pair_is_found() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        let (four, six) = (record_bytes(tree, 4), record_bytes(tree, 6));
        replace_record(tree, 4, six);
        replace_record(tree, 6, four);
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 4);
    assert!(reason.contains("moved"), "{reason}");
}

#[test]
fn a_record_from_another_session_spliced_in_is_found() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        // Re-encode session a's record 6 as if it were session b's next record, with a
        // valid checksum and a valid link to b's last record: only the manifest and
        // a's own chain can tell.
        let original = codec::decode(&record_bytes(tree, 6)).unwrap();
        let last_b = record_bytes(tree, 9);
        let forged = RecordBody {
            session_id: SessionId::parse("b").unwrap(),
            seq: turnstile_journal::Seq(5),
            prev_hash: codec::hash(&last_b),
            ..original
        };
        replace_record(tree, 6, codec::encode(&forged).unwrap());
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 6, "{reason}");
    assert!(reason.contains("spliced"), "{reason}");
}

#[test]
fn a_rewritten_record_breaks_the_next_hash_link() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        // A forger who re-encodes a record with a valid checksum still breaks the link
        // from the session's next record.
        let mut body = codec::decode(&record_bytes(tree, 2)).unwrap();
        body.event = event(99);
        replace_record(tree, 2, codec::encode(&body).unwrap());
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 4, "{reason}");
    assert!(reason.contains("hash link"), "{reason}");
}

#[test]
fn a_damaged_segment_manifest_is_found() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        let key = segment_key(tree, 3);
        let mut bytes = tree.get(&key).unwrap().unwrap().to_vec();
        // The manifest ends the header, whose length is at bytes 5..9.
        let header_end = 9 + u32::from_be_bytes(bytes[5..9].try_into().unwrap()) as usize;
        bytes[header_end - 1] ^= 0x01;
        tree.insert(key, bytes).unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 3);
    assert!(reason.contains("manifest"), "{reason}");
}

#[test]
fn a_session_index_that_names_the_wrong_records_is_found() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        // Point session b's index at session a's records.
        let (key, bytes) = tree.scan_prefix(b"Ib\0").next().unwrap().unwrap();
        let mut runs = codec::decode_runs(&bytes).unwrap();
        assert_eq!(runs[2].pos, turnstile_journal::JournalPos(5));
        runs[2].pos = turnstile_journal::JournalPos(4);
        tree.insert(key, codec::encode_runs(&runs)).unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 4, "{reason}");
    assert!(reason.contains("session index of b"), "{reason}");
    // Reading the session does not hand out session a's record as b's.
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let read: Result<Vec<_>, _> = journal
        .read_session(&SessionId::parse("b").unwrap(), turnstile_journal::Seq(0))
        .collect();
    assert!(read.unwrap_err().to_string().contains("session index"));
}

#[test]
fn a_journal_without_its_index_is_read_from_its_segments() {
    let dir = journal_dir();
    // As after a crash before the index was written: no index, no watermark.
    tamper(dir.path(), |tree| {
        for key in tree.scan_prefix(b"I").keys() {
            tree.remove(key.unwrap()).unwrap();
        }
        assert!(tree.remove(b"W").unwrap().is_some());
    });
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let a = SessionId::parse("a").unwrap();
    let seqs: Vec<u64> = journal
        .read_session(&a, turnstile_journal::Seq(2))
        .map(|record| record.unwrap().pos.0)
        .collect();
    assert_eq!(seqs, vec![4, 6, 8]);
    assert_eq!(journal.session_next_seq(&a).unwrap().0, 5);
    let records = journal
        .append_blocking(&a, Expected::Any, vec![event(10)])
        .unwrap()
        .unwrap();
    assert_eq!((records[0].seq.0, records[0].pos.0), (5, 10));
    assert!(journal.verify(|_| ()).unwrap().is_ok());
    journal.close().unwrap();
    drop(journal);
    // Closing wrote the index again, up to the end.
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    assert_eq!(
        journal.read_session(&a, turnstile_journal::Seq(0)).count(),
        6
    );
    assert!(journal.verify(|_| ()).unwrap().is_ok());
}

#[test]
fn appends_continue_the_chain_after_reopen() {
    let dir = journal_dir();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let session = SessionId::parse("a").unwrap();
    let records = journal
        .append_blocking(&session, Expected::Any, vec![event(10)])
        .unwrap()
        .unwrap();
    assert_eq!(records[0].seq.0, 5);
    assert_eq!(records[0].pos, JournalPos(10));
    let conflict = journal
        .append_blocking(
            &session,
            Expected::Next(turnstile_journal::Seq(3)),
            vec![event(11)],
        )
        .unwrap();
    assert_eq!(conflict.unwrap_err().actual.0, 6);
    assert!(journal.verify(|_| ()).unwrap().is_ok());
}
