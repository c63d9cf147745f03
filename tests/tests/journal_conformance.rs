//! The journal API's conformance suite, run against both backends in this one binary:
//! each case below expands into `sled::name` (a journal in a temporary directory) and
//! `postgres::name` (a fresh database on the test cluster, `tests/src/postgres.rs`).
//! The PostgreSQL-only cases at the end check what only a shared database can get
//! wrong: writers that commit late, several processes' handles on one journal.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use turnstile_journal::portable::{ExportedRecord, check_export, import};
use turnstile_journal::{
    Event, Expected, IndexedStatus, Journal, JournalOptions, JournalPos, Lease, PostgresOptions,
    RunId, Seq, SessionEvent, SessionId,
};

/// Where a journal under test lives; opening it again reaches the same journal.
enum Place {
    Sled(tempfile::TempDir),
    Postgres(String),
}

impl Place {
    fn open(&self) -> Journal {
        match self {
            Place::Sled(dir) => Journal::open(dir.path(), JournalOptions::default()).unwrap(),
            Place::Postgres(url) => Journal::open_postgres(
                &PostgresOptions::new(url.clone()),
                JournalOptions::default(),
            )
            .unwrap(),
        }
    }
}

fn sled_place() -> Option<Place> {
    Some(Place::Sled(tempfile::tempdir().unwrap()))
}

fn postgres_place() -> Option<Place> {
    turnstile_tests::postgres::database().map(Place::Postgres)
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sled {
            $(#[test] fn $name() { if let Some(place) = super::sled_place() { super::$name(place) } })*
        }
        mod postgres {
            $(#[test] fn $name() { if let Some(place) = super::postgres_place() { super::$name(place) } })*
        }
    };
}

conformance!(
    streams_are_contiguous_and_hash_linked,
    an_unexpected_sequence_is_a_conflict_and_writes_nothing,
    global_order_is_contiguous_and_keeps_each_stream_in_order,
    indexes_follow_runs_sessions_and_keys,
    a_deleted_session_leaves_the_lists,
    projections_are_stored_and_listed,
    a_subscription_sees_every_record_in_order,
    verify_is_clean_and_counts,
    an_export_checks_and_imports_into_sled_with_every_link,
    an_event_stored_apart_reads_back_whole,
    a_sessions_events_are_its_records_without_hashes,
    concurrent_appenders_lose_nothing_and_repeat_nothing,
    a_reopened_journal_continues_where_it_was,
);

fn session(name: &str) -> SessionId {
    SessionId::parse(name).unwrap()
}

fn run(name: &str) -> RunId {
    RunId::parse(name).unwrap()
}

fn line(text: &str) -> Event {
    Event::TranscriptLineAppended {
        run_id: run("r"),
        harness_session_id: "h".into(),
        line: text.into(),
    }
}

fn created(agent: &str) -> Event {
    Event::SessionCreated {
        agent_id: agent.into(),
        user_id: Some("u".into()),
    }
}

fn queued(run_id: &str, agent: &str) -> Event {
    Event::RunQueued {
        run_id: run(run_id),
        agent_id: agent.into(),
        user_id: None,
        input: "hi".into(),
        options: Default::default(),
    }
}

fn started(run_id: &str) -> Event {
    Event::RunStarted {
        run_id: run(run_id),
        model: "m".into(),
        model_provider: "p".into(),
    }
}

fn completed(run_id: &str) -> Event {
    Event::RunCompleted {
        run_id: run(run_id),
    }
}

fn append(
    journal: &Journal,
    session_id: &SessionId,
    events: Vec<Event>,
) -> Vec<Arc<turnstile_journal::Recorded>> {
    journal
        .append_blocking(session_id, Expected::Any, events)
        .unwrap()
        .unwrap()
}

fn streams_are_contiguous_and_hash_linked(place: Place) {
    let journal = place.open();
    let a = session("a");
    let first = append(&journal, &a, vec![line("0"), line("1")]);
    let second = append(&journal, &a, vec![line("2")]);
    assert_eq!(
        first
            .iter()
            .chain(&second)
            .map(|r| r.seq.0)
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    let read: Vec<_> = journal
        .read_session(&a, Seq(0))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(read.len(), 3);
    assert_eq!(read[0].prev_hash, [0; 32]);
    for pair in read.windows(2) {
        assert_eq!(
            pair[1].prev_hash, pair[0].hash,
            "each record links to the one before"
        );
    }
    for (answered, stored) in first.iter().chain(&second).zip(&read) {
        assert_eq!(
            **answered, *stored,
            "an append answers what a read later shows"
        );
    }
    let from_one: Vec<_> = journal
        .read_session(&a, Seq(1))
        .map(|r| r.unwrap().seq.0)
        .collect();
    assert_eq!(from_one, [1, 2]);
    assert_eq!(journal.session_next_seq(&a).unwrap(), Seq(3));
    assert_eq!(journal.session_next_seq(&session("none")).unwrap(), Seq(0));
    assert_eq!(journal.get(read[1].pos).unwrap().unwrap(), read[1]);
    assert_eq!(journal.get(JournalPos(1_000)).unwrap(), None);
}

fn an_unexpected_sequence_is_a_conflict_and_writes_nothing(place: Place) {
    let journal = place.open();
    let a = session("a");
    append(&journal, &a, vec![line("0")]);
    let conflict = journal
        .append_blocking(&a, Expected::Next(Seq(5)), vec![line("x")])
        .unwrap()
        .unwrap_err();
    assert_eq!((conflict.expected, conflict.actual), (Seq(5), Seq(1)));
    let fine = journal
        .append_blocking(&a, Expected::Next(Seq(1)), vec![line("1")])
        .unwrap()
        .unwrap();
    assert_eq!(fine[0].seq, Seq(1));
    assert_eq!(journal.read_session(&a, Seq(0)).count(), 2);
    assert_eq!(
        journal.next_pos(),
        JournalPos(2),
        "the refusal took no position"
    );
}

fn global_order_is_contiguous_and_keeps_each_stream_in_order(place: Place) {
    let journal = place.open();
    for round in 0..5 {
        for name in ["a", "b", "c"] {
            append(
                &journal,
                &session(name),
                vec![line(&format!("{name}{round}"))],
            );
        }
    }
    let all: Vec<_> = journal
        .read_from(JournalPos(0))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(all.len(), 15);
    assert_eq!(journal.next_pos(), JournalPos(15));
    let mut next: HashMap<SessionId, u64> = HashMap::new();
    for (index, record) in all.iter().enumerate() {
        assert_eq!(record.pos, JournalPos(index as u64));
        let seq = next.entry(record.session_id.clone()).or_default();
        assert_eq!(record.seq.0, *seq);
        *seq += 1;
    }
    let tail: Vec<_> = journal
        .read_from(JournalPos(12))
        .map(|r| r.unwrap().pos.0)
        .collect();
    assert_eq!(tail, [12, 13, 14]);
}

fn indexes_follow_runs_sessions_and_keys(place: Place) {
    let journal = place.open();
    let a = session("a");
    let b = session("b");
    append(&journal, &a, vec![created("agent")]);
    append(&journal, &b, vec![created("other")]);
    append(
        &journal,
        &a,
        vec![
            queued("r1", "agent"),
            Event::IdempotencyKeyBound {
                key: "k1".into(),
                run_id: run("r1"),
            },
        ],
    );
    append(&journal, &a, vec![started("r1")]);
    append(&journal, &a, vec![completed("r1")]);
    append(&journal, &a, vec![queued("r2", "agent"), started("r2")]);
    append(&journal, &b, vec![queued("r3", "other")]);

    let sessions = journal.sessions().unwrap();
    assert_eq!(
        sessions
            .iter()
            .map(|s| (s.session_id.as_str(), s.agent_id.as_str()))
            .collect::<Vec<_>>(),
        [("a", "agent"), ("b", "other")]
    );
    assert_eq!(sessions[0].user_id.as_deref(), Some("u"));
    assert_eq!(
        journal.session_runs(&a).unwrap(),
        [(Seq(1), run("r1")), (Seq(5), run("r2"))]
    );
    assert_eq!(journal.session_of_run(&run("r3")).unwrap(), Some(b.clone()));
    assert_eq!(journal.session_of_run(&run("nope")).unwrap(), None);
    let mut open = journal.open_runs().unwrap();
    open.sort();
    assert_eq!(open, [(run("r2"), a.clone()), (run("r3"), b.clone())]);
    assert_eq!(
        journal.run_of_idempotency_key("k1").unwrap(),
        Some(run("r1"))
    );
    assert_eq!(journal.run_of_idempotency_key("k2").unwrap(), None);
    let newest: Vec<_> = journal
        .agent_runs("agent", true)
        .map(|r| {
            let r = r.unwrap();
            (r.run_id.as_str().to_owned(), r.status)
        })
        .collect();
    assert_eq!(
        newest,
        [
            ("r2".to_owned(), IndexedStatus::Running),
            ("r1".to_owned(), IndexedStatus::Completed)
        ]
    );
    let oldest: Vec<_> = journal
        .agent_runs("agent", false)
        .map(|r| r.unwrap().run_id)
        .collect();
    assert_eq!(oldest, [run("r1"), run("r2")]);
    // Pending, Running, Completed, Error, Cancelled.
    assert_eq!(journal.agent_run_counts("agent"), [0, 1, 1, 0, 0, 0]);
    assert_eq!(journal.agent_run_counts("other"), [1, 0, 0, 0, 0, 0]);
    assert_eq!(journal.agent_run_counts("nobody"), [0; 6]);
}

fn a_deleted_session_leaves_the_lists(place: Place) {
    let journal = place.open();
    let a = session("a");
    append(&journal, &a, vec![created("agent"), queued("r1", "agent")]);
    append(&journal, &a, vec![completed("r1")]);
    append(
        &journal,
        &a,
        vec![Event::SessionDeleted {
            reason: "asked".into(),
        }],
    );
    assert!(journal.sessions().unwrap().is_empty());
    assert!(journal.session_runs(&a).unwrap().is_empty());
    assert_eq!(journal.agent_runs("agent", true).count(), 0);
    assert_eq!(journal.agent_run_counts("agent"), [0; 6]);
    // The run still names its session (for audits), and the id can be used again.
    assert_eq!(journal.session_of_run(&run("r1")).unwrap(), Some(a.clone()));
    append(&journal, &a, vec![created("agent"), queued("r2", "agent")]);
    assert_eq!(journal.session_runs(&a).unwrap(), [(Seq(5), run("r2"))]);
}

fn projections_are_stored_and_listed(place: Place) {
    let journal = place.open();
    journal.put_projection("session/b", b"two").unwrap();
    journal.put_projection("session/a", b"one").unwrap();
    journal.put_projection("session/a", b"uno").unwrap();
    assert_eq!(
        journal.get_projection("session/a").unwrap().as_deref(),
        Some(&b"uno"[..])
    );
    assert_eq!(journal.get_projection("missing").unwrap(), None);
    assert_eq!(
        journal.projections().unwrap(),
        [
            ("session/a".to_owned(), b"uno".to_vec()),
            ("session/b".to_owned(), b"two".to_vec())
        ]
    );
}

fn a_subscription_sees_every_record_in_order(place: Place) {
    let journal = place.open();
    append(&journal, &session("a"), vec![line("before")]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut subscription = journal.subscribe_from(JournalPos(0));
        let writer = {
            let journal = journal.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    let name = if i % 2 == 0 { "a" } else { "b" };
                    journal
                        .append(&session(name), Expected::Any, vec![line(&i.to_string())])
                        .await
                        .unwrap()
                        .unwrap();
                }
            })
        };
        for expected in 0..51u64 {
            let record =
                tokio::time::timeout(std::time::Duration::from_secs(10), subscription.next())
                    .await
                    .expect("a record arrives")
                    .unwrap();
            assert_eq!(record.pos, JournalPos(expected));
        }
        writer.await.unwrap();
    });
}

fn verify_is_clean_and_counts(place: Place) {
    let journal = place.open();
    append(&journal, &session("a"), vec![line("0"), line("1")]);
    append(&journal, &session("b"), vec![line("0")]);
    let report = journal.verify(|_| ()).unwrap().unwrap();
    assert_eq!((report.streams, report.events), (2, 3));
}

fn an_export_checks_and_imports_into_sled_with_every_link(place: Place) {
    let journal = place.open();
    append(
        &journal,
        &session("a"),
        vec![created("agent"), queued("r1", "agent")],
    );
    append(&journal, &session("b"), vec![line("x")]);
    append(&journal, &session("a"), vec![completed("r1")]);
    let export: String = journal
        .read_from(JournalPos(0))
        .map(|r| ExportedRecord::from_recorded(&r.unwrap()).to_line() + "\n")
        .collect();
    let checked = check_export(export.as_bytes(), |_| ()).unwrap().unwrap();
    assert_eq!(checked.records, 4);
    let target = tempfile::tempdir().unwrap();
    let dir = target.path().join("copy");
    import(&dir, export.as_bytes(), |_| ()).unwrap().unwrap();
    let copy = Journal::open(&dir, JournalOptions::default()).unwrap();
    copy.verify(|_| ()).unwrap().unwrap();
    let again: String = copy
        .read_from(JournalPos(0))
        .map(|r| ExportedRecord::from_recorded(&r.unwrap()).to_line() + "\n")
        .collect();
    assert_eq!(
        again, export,
        "the copy holds the same records, hashes and links"
    );
}

fn an_event_stored_apart_reads_back_whole(place: Place) {
    let journal = place.open();
    let big = "x".repeat(300_000);
    append(&journal, &session("a"), vec![line(&big), line("small")]);
    let read: Vec<_> = journal
        .read_session(&session("a"), Seq(0))
        .collect::<Result<_, _>>()
        .unwrap();
    match &read[0].event {
        Event::TranscriptLineAppended { line, .. } => assert_eq!(line.len(), 300_000),
        other => panic!("{other:?}"),
    }
    assert!(read[0].size_bytes > 300_000);
    journal.verify(|_| ()).unwrap().unwrap();
}

/// What a stream of run events reads (no hashes) is what a full read gives, from any
/// sequence, an event stored apart included.
fn a_sessions_events_are_its_records_without_hashes(place: Place) {
    let journal = place.open();
    let a = session("a");
    append(&journal, &a, vec![created("agent"), queued("r1", "agent")]);
    append(&journal, &session("b"), vec![line("elsewhere")]);
    append(
        &journal,
        &a,
        vec![line(&"y".repeat(300_000)), completed("r1")],
    );
    for from in 0..5 {
        let full: Vec<SessionEvent> = journal
            .read_session(&a, Seq(from))
            .map(|record| SessionEvent::from(record.unwrap()))
            .collect();
        let events: Vec<SessionEvent> = journal
            .read_session_events(&a, Seq(from))
            .map(Result::unwrap)
            .collect();
        assert_eq!(events, full, "from {from}");
        assert_eq!(events.len(), 4usize.saturating_sub(from as usize));
    }
}

fn concurrent_appenders_lose_nothing_and_repeat_nothing(place: Place) {
    let journal = place.open();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let acknowledged: Vec<(JournalPos, SessionId, Seq)> = runtime.block_on(async {
        let tasks: Vec<_> = (0..16)
            .map(|task| {
                let journal = journal.clone();
                tokio::spawn(async move {
                    let mut mine = Vec::new();
                    for i in 0..25 {
                        // Sessions shared by two tasks each: conflicts on the head happen.
                        let name = format!("s{}", (task + i) % 8);
                        let records = journal
                            .append(&session(&name), Expected::Any, vec![line("a"), line("b")])
                            .await
                            .unwrap()
                            .unwrap();
                        mine.extend(records.iter().map(|r| (r.pos, r.session_id.clone(), r.seq)));
                    }
                    mine
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.unwrap());
        }
        all
    });
    assert_eq!(acknowledged.len(), 16 * 25 * 2);
    let positions: HashSet<_> = acknowledged.iter().map(|(pos, _, _)| pos.0).collect();
    assert_eq!(
        positions.len(),
        acknowledged.len(),
        "no position given twice"
    );
    assert_eq!(
        positions.iter().max(),
        Some(&(acknowledged.len() as u64 - 1)),
        "no gap"
    );
    let read: Vec<_> = journal
        .read_from(JournalPos(0))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(read.len(), acknowledged.len());
    for (pos, session_id, seq) in &acknowledged {
        let record = &read[pos.0 as usize];
        assert_eq!((&record.session_id, record.seq), (session_id, *seq));
    }
    journal.verify(|_| ()).unwrap().unwrap();
}

fn a_reopened_journal_continues_where_it_was(place: Place) {
    {
        let journal = place.open();
        append(
            &journal,
            &session("a"),
            vec![created("agent"), queued("r1", "agent")],
        );
        journal.close().unwrap();
    }
    // sled lets go of its lock shortly after the last handle is dropped.
    let journal = place.open();
    assert_eq!(journal.next_pos(), JournalPos(2));
    let more = append(&journal, &session("a"), vec![started("r1")]);
    assert_eq!((more[0].pos, more[0].seq), (JournalPos(2), Seq(2)));
    assert_eq!(
        more[0].prev_hash,
        journal.get(JournalPos(1)).unwrap().unwrap().hash
    );
    assert_eq!(journal.open_runs().unwrap(), [(run("r1"), session("a"))]);
}

// PostgreSQL only.

/// Positions are given in the appending transaction under the global order's lock, held
/// to its commit: a transaction that holds it (an appender between its positions and its
/// commit) holds every later append back, so nothing committed meanwhile is passed over;
/// a transaction that does not (an operator's, holding an id) holds nothing back.
#[test]
fn postgres_a_late_commit_is_never_passed_over() {
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let journal = Place::Postgres(url.clone()).open();
    append(&journal, &session("early"), vec![line("0")]);
    let hold = |sql: &'static str| {
        let url = url.clone();
        std::thread::spawn(move || turnstile_tests::postgres::psql(&url, sql))
    };
    // An unrelated transaction with an id: appends go on.
    let holder = hold("BEGIN; SELECT pg_current_xact_id(); SELECT pg_sleep(1.5); COMMIT;");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    let beside = append(&journal, &session("beside"), vec![line("1")]);
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_millis(900),
        "an append waited {waited:?} for a transaction that gives no positions"
    );
    assert_eq!(beside[0].pos.0, 1);
    holder.join().unwrap();
    // A transaction between its positions and its commit: the next append waits for it.
    let holder = hold(
        "BEGIN; SELECT next_pos FROM turnstile.positions FOR UPDATE; SELECT pg_sleep(1.5); COMMIT;",
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    let late = append(&journal, &session("late"), vec![line("2"), line("3")]);
    let waited = started.elapsed();
    holder.join().unwrap();
    assert!(
        waited >= std::time::Duration::from_millis(900),
        "the append was answered before the positioning transaction ended ({waited:?}): its position could have been passed over"
    );
    assert_eq!(late.iter().map(|r| r.pos.0).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(journal.read_from(JournalPos(0)).count(), 4);
}

/// Two handles on one database (two processes' worth): one writes a session at a time
/// (the lease), their appends to one stream interleave without a gap in the stream or
/// in the global order, and each sees the other's records.
#[test]
fn postgres_two_handles_share_one_journal() {
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let one = Place::Postgres(url.clone()).open();
    let two = Place::Postgres(url).open();
    let a = session("a");
    for i in 0..10 {
        let (journal, other) = if i % 2 == 0 {
            (&one, &two)
        } else {
            (&two, &one)
        };
        assert_eq!(journal.lease(&a).unwrap(), Lease::Held);
        // One writer at a time: the other handle is refused while this one holds it.
        assert!(matches!(
            other.append_blocking(&a, Expected::Any, vec![line("not now")]),
            Err(turnstile_journal::Error::Owned { .. })
        ));
        assert_eq!(
            other.lease(&a).unwrap(),
            Lease::OwnedBy(journal.replica_id().unwrap())
        );
        let record = append(journal, &a, vec![line(&i.to_string())]);
        assert_eq!(
            record[0].seq,
            Seq(i),
            "each handle appends at the real head"
        );
        journal.release(&a);
    }
    assert_eq!(one.lease(&a).unwrap(), Lease::Held);
    let conflict = one
        .append_blocking(&a, Expected::Next(Seq(3)), vec![line("stale")])
        .unwrap()
        .unwrap_err();
    assert_eq!(conflict.actual, Seq(10));
    let seen: Vec<_> = two
        .read_session(&a, Seq(0))
        .map(|r| r.unwrap().seq.0)
        .collect();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    // The other handle learns of positions it did not give within its poll interval.
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(one.next_pos(), JournalPos(10));
    assert_eq!(two.next_pos(), JournalPos(10));
    one.verify(|_| ()).unwrap().unwrap();
}

/// A replica whose heartbeat lapsed loses its leases: another takes the session with a
/// new fencing token, and the late replica's appends are refused, writing nothing.
#[test]
fn postgres_a_replica_past_its_lease_is_fenced() {
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let open = |name: &str| {
        let mut options = PostgresOptions::new(url.clone());
        options.replica_name = name.into();
        options.lease = std::time::Duration::from_secs(60);
        Journal::open_postgres(&options, JournalOptions::default()).unwrap()
    };
    let a_side = open("a");
    let b_side = open("b");
    let s = session("s");
    assert_eq!(a_side.lease(&s).unwrap(), Lease::Held);
    append(&a_side, &s, vec![line("by a")]);
    assert!(matches!(b_side.lease(&s).unwrap(), Lease::OwnedBy(_)));
    // A stalls: the database's clock says its heartbeat expired.
    turnstile_tests::postgres::psql(
        &url,
        &format!(
            "UPDATE turnstile.replicas SET expires_at = now() - interval '1 s' WHERE replica_id = '{}'",
            a_side.replica_id().unwrap()
        ),
    );
    assert_eq!(b_side.lease(&s).unwrap(), Lease::Held);
    append(&b_side, &s, vec![line("by b")]);
    let late = a_side.append_blocking(&s, Expected::Any, vec![line("late write by a")]);
    assert!(
        matches!(late, Err(turnstile_journal::Error::Fenced { .. })),
        "{late:?}"
    );
    let lines: Vec<_> = b_side
        .read_session(&s, Seq(0))
        .map(|r| match r.unwrap().event {
            Event::TranscriptLineAppended { line, .. } => line,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(lines, ["by a", "by b"]);
    let epoch = turnstile_tests::postgres::psql(
        &url,
        "SELECT lease_epoch FROM turnstile.streams WHERE session_id = 's'",
    );
    assert_eq!(epoch, "2", "the takeover gave a new fencing token");
}
