//! Crash test: a child process appends under group commit from many threads and is
//! killed with SIGKILL at a random moment, again and again on the same directory.
//! After each kill the parent reopens the journal and checks that every acknowledged
//! append is there, sequences are contiguous, no batch is partial, and `verify` is
//! clean (sled's `spawn_killah` pattern).
//!
//! `harness = false`: the same binary is the parent (no arguments) and the child
//! (`TURNSTILE_CRASH_CHILD_DIR` set), so the child is real code of this test.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalOptions, RunEvent, RunId, Seq, SessionId,
};

const CHILD_ENV: &str = "TURNSTILE_CRASH_CHILD_DIR";
const KILLS_DEFAULT: usize = 24;
const THREADS: usize = 16;

fn main() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
        return;
    }
    let kills: usize = std::env::var("TURNSTILE_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(KILLS_DEFAULT);
    let started = Instant::now();
    let acked = parent(kills);
    println!(
        "crash: {kills} SIGKILLs, {acked} acknowledged appends all found, verify clean ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    println!("test result: ok. 1 passed; 0 failed; 0 ignored");
}

/// Appends batches of 1..=4 events forever, printing one line per acknowledged batch.
fn child(dir: &str) {
    let journal =
        Journal::open(dir.as_ref(), JournalOptions::default()).expect("child opens the journal");
    let stdout = std::sync::Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let pid = std::process::id();
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let journal = journal.clone();
            let stdout = stdout.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rng();
                for counter in 0u64.. {
                    let session =
                        SessionId::parse(&format!("t{thread}-s{}", rng.random_range(0..3)))
                            .unwrap();
                    let size = rng.random_range(1..=4usize);
                    let batch = format!("{pid}-{thread}-{counter}");
                    let events = (0..size)
                        .map(|i| Event::RunEventEmitted {
                            run_id: RunId::parse("crash").unwrap(),
                            event_index: EventIndex(i as u64),
                            event: RunEvent::ContentDelta {
                                text: format!(
                                    "{batch}:{i}:{size}:{}",
                                    "x".repeat(rng.random_range(10..300))
                                ),
                            },
                        })
                        .collect();
                    let records = journal
                        .append_blocking(&session, Expected::Any, events)
                        .unwrap()
                        .unwrap();
                    let mut out = stdout.lock().unwrap();
                    writeln!(out, "ack {session} {} {size} {batch}", records[0].seq.0).unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
}

struct Ack {
    session: SessionId,
    first_seq: u64,
    size: usize,
    batch: String,
}

fn parse_ack(line: &str) -> Ack {
    let parts: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(parts.len(), 5, "bad ack line {line:?}");
    Ack {
        session: SessionId::parse(parts[1]).unwrap(),
        first_seq: parts[2].parse().unwrap(),
        size: parts[3].parse().unwrap(),
        batch: parts[4].to_owned(),
    }
}

fn parent(kills: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rng();
    let mut acks: Vec<Ack> = Vec::new();
    for kill in 0..kills {
        let mut child = Command::new(&exe)
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut lines = Vec::new();
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                // A line cut by the kill has no newline: it was never acknowledged whole.
                if line.ends_with('\n') {
                    lines.push(line.trim_end().to_owned());
                }
                line.clear();
            }
            lines
        });
        let wait_ms = rng.random_range(30..400);
        std::thread::sleep(Duration::from_millis(wait_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        let lines = reader.join().unwrap();
        acks.extend(lines.iter().map(|line| parse_ack(line)));
        check(dir.path(), &acks, kill);
    }
    assert!(
        acks.len() > 100,
        "the child acknowledged too little to test anything: {}",
        acks.len()
    );
    acks.len()
}

fn check(dir: &std::path::Path, acks: &[Ack], kill: usize) {
    let journal = Journal::open(dir, JournalOptions::default()).expect("reopen after SIGKILL");
    let verified = journal.verify(|_| ()).unwrap();
    assert!(
        verified.is_ok(),
        "after kill {kill}: verify failed: {verified:?}"
    );
    // Every record, grouped by batch: a batch is all there or not at all.
    let mut batches: HashMap<String, (usize, usize)> = HashMap::new();
    let mut next_seq: HashMap<SessionId, u64> = HashMap::new();
    for record in journal.read_from(turnstile_journal::JournalPos(0)) {
        let record = record.unwrap();
        let expected = next_seq.entry(record.session_id.clone()).or_insert(0);
        assert_eq!(
            record.seq.0, *expected,
            "after kill {kill}: sequence gap in {}",
            record.session_id
        );
        *expected += 1;
        let Event::RunEventEmitted {
            event: RunEvent::ContentDelta { text: data },
            ..
        } = &record.event
        else {
            panic!("unexpected event")
        };
        let fields: Vec<&str> = data.splitn(4, ':').collect();
        let size: usize = fields[2].parse().unwrap();
        let entry = batches.entry(fields[0].to_owned()).or_insert((0, size));
        entry.0 += 1;
    }
    for (batch, (found, size)) in &batches {
        assert_eq!(found, size, "after kill {kill}: batch {batch} is partial");
    }
    for ack in acks {
        let records: Vec<_> = journal
            .read_session(&ack.session, Seq(ack.first_seq))
            .take(ack.size)
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            records.len(),
            ack.size,
            "after kill {kill}: acknowledged batch {} lost",
            ack.batch
        );
        for (i, record) in records.iter().enumerate() {
            let Event::RunEventEmitted {
                event: RunEvent::ContentDelta { text: data },
                ..
            } = &record.event
            else {
                panic!("unexpected event")
            };
            assert!(
                data.starts_with(&format!("{}:{i}:", ack.batch)),
                "after kill {kill}: acknowledged batch {} differs",
                ack.batch
            );
        }
    }
}
