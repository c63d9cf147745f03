//! `verify` against real tampering: the journal is written through the API, then
//! edited underneath with sled directly, the way an attacker or a bad disk would.

use turnstile_journal::codec::{self, RecordBody};
use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalOptions, JournalPos, RunId, SessionId,
};

fn event(n: u64) -> Event {
    Event::RunEventEmitted {
        run_id: RunId::parse("r").unwrap(),
        event_index: EventIndex(n),
        event_type: "RunContent".into(),
        data: format!("{{\"content\":\"part {n}\"}}"),
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

/// The sled key of the record at global position `pos` (records are stored by session).
fn key_of(tree: &sled::Tree, pos: u64) -> sled::IVec {
    tree.scan_prefix([b'S'])
        .map(Result::unwrap)
        .find(|(_, bytes)| codec::decode(bytes).unwrap().pos.0 == pos)
        .map(|(key, _)| key)
        .expect("record exists")
}

fn record_bytes(tree: &sled::Tree, pos: u64) -> sled::IVec {
    tree.get(key_of(tree, pos)).unwrap().unwrap()
}

fn tamper(dir: &std::path::Path, edit: impl FnOnce(&sled::Tree)) {
    let db = sled::Config::new().path(dir).open().unwrap();
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
        let key = key_of(tree, 5);
        let mut bytes = tree.get(&key).unwrap().unwrap().to_vec();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x20;
        tree.insert(key, bytes).unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 5);
    assert!(reason.contains("checksum"), "{reason}");
}

#[test]
fn a_removed_record_is_found() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        tree.remove(key_of(tree, 4)).unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 4);
    assert!(reason.contains("missing"), "{reason}");
}

#[test]
fn a_removed_last_record_is_found_through_its_index() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        tree.remove(key_of(tree, 9)).unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 9);
    assert!(reason.contains("missing"), "{reason}");
}

#[test]
fn a_reordered_pair_is_found() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        let (four, six) = (key_of(tree, 4), key_of(tree, 6));
        let (four_bytes, six_bytes) = (record_bytes(tree, 4), record_bytes(tree, 6));
        tree.insert(four, six_bytes).unwrap();
        tree.insert(six, four_bytes).unwrap();
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
        // valid checksum and a valid link to b's last record: only the stream index and
        // a's own chain can tell.
        let original = codec::decode(&record_bytes(tree, 6)).unwrap();
        let last_b = record_bytes(tree, 9);
        let forged = RecordBody {
            session_id: SessionId::parse("b").unwrap(),
            seq: turnstile_journal::Seq(5),
            prev_hash: codec::hash(&last_b),
            ..original
        };
        tree.insert(key_of(tree, 6), codec::encode(&forged).unwrap())
            .unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 6, "{reason}");
}

#[test]
fn a_rewritten_record_breaks_the_next_hash_link() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        // A forger who re-encodes a record with a valid checksum still breaks the link
        // from the session's next record.
        let mut body = codec::decode(&record_bytes(tree, 2)).unwrap();
        body.event = event(99);
        tree.insert(key_of(tree, 2), codec::encode(&body).unwrap())
            .unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 4, "{reason}");
    assert!(reason.contains("hash link"), "{reason}");
}

#[test]
fn a_damaged_batch_manifest_is_found() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        let (key, manifest) = tree.scan_prefix([b'L']).nth(3).unwrap().unwrap();
        let mut bytes = manifest.to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        tree.insert(key, bytes).unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 3);
    assert!(reason.contains("manifest"), "{reason}");
}

#[test]
fn a_stray_record_no_manifest_names_is_found() {
    let dir = journal_dir();
    tamper(dir.path(), |tree| {
        // Drop the last batch's manifest: its record stays, named by nothing.
        let (key, _) = tree.scan_prefix([b'L']).next_back().unwrap().unwrap();
        tree.remove(key).unwrap();
    });
    let (pos, reason) = first_bad(dir.path()).unwrap();
    assert_eq!(pos, 9);
    assert!(reason.contains("no batch manifest"), "{reason}");
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
