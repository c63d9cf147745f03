//! Journal benchmark: durable appends per second with 1, 16 and 256 concurrent
//! appenders, side by side in one run with two ceilings on the same disk: raw sled
//! `insert` + `flush` + `fdatasync` per append, and raw sled `apply_batch` + one
//! `flush` + `fdatasync` per batch of as many events as there are appenders.
//! Also the p50 and p99 time from append to acknowledgement.
//!
//! `cargo bench -p turnstile-journal --bench append` (`BENCH_SECONDS` per cell, default 2;
//! `BENCH_ROUNDS` interleaved rounds, default 3, medians reported; `BENCH_APPENDERS`
//! a comma list of appender counts, default `1,16,256`).
//! Prints a Markdown table for `docs/PERFORMANCE.md`. Not a test: nothing is asserted.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalOptions, RunEvent, RunId, SessionId,
};

// The same allocator as the `turnstile` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Encoded size of one benchmark event (the record adds its header and hash link).
const EVENT_BYTES: usize = 200;

fn event(n: u64) -> Event {
    Event::RunEventEmitted {
        run_id: RunId::parse("bench").unwrap(),
        event_index: EventIndex(n),
        event: RunEvent::ContentDelta {
            text: "x".repeat(EVENT_BYTES - 60),
        },
    }
}

struct Cell {
    events_per_s: f64,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index].as_secs_f64() * 1e6
}

/// Runs `work` on `threads` threads until `seconds` pass; each call is one timed append.
fn concurrently(
    threads: usize,
    seconds: f64,
    work: impl Fn(usize, u64) + Send + Sync + 'static,
) -> Cell {
    let work = Arc::new(work);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let work = work.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let begin = Instant::now();
                    work(thread, n);
                    latencies.push(begin.elapsed());
                    n += 1;
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut latencies: Vec<Duration> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    Cell {
        events_per_s: latencies.len() as f64 / elapsed,
        p50_us: Some(percentile(&latencies, 0.50)),
        p99_us: Some(percentile(&latencies, 0.99)),
    }
}

/// turnstile's appenders are async tasks (session actors, run tasks), so they are
/// tokio tasks here too, on a two-worker runtime like the server's.
fn journal_cell(dir: &Path, appenders: usize, seconds: f64) -> Cell {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let journal = Journal::open(dir, JournalOptions::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..appenders)
        .map(|i| {
            let journal = journal.clone();
            let stop = stop.clone();
            let session = SessionId::parse(&format!("s{i}")).unwrap();
            runtime.spawn(async move {
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let begin = Instant::now();
                    journal
                        .append(&session, Expected::Any, vec![event(n)])
                        .await
                        .unwrap()
                        .unwrap();
                    latencies.push(begin.elapsed());
                    n += 1;
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut latencies: Vec<Duration> = runtime.block_on(async { futures_join(tasks).await });
    let elapsed = started.elapsed().as_secs_f64();
    journal.close().unwrap();
    latencies.sort();
    Cell {
        events_per_s: latencies.len() as f64 / elapsed,
        p50_us: Some(percentile(&latencies, 0.50)),
        p99_us: Some(percentile(&latencies, 0.99)),
    }
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>) -> Vec<Duration> {
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

fn raw_db(dir: &Path) -> (sled::Db, sled::Tree, File) {
    let db = sled::Config::new()
        .path(dir)
        .cache_capacity(64 * 1024 * 1024)
        .flush_every_ms(Some(500))
        .mode(sled::Mode::HighThroughput)
        .open()
        .unwrap();
    let tree = db.open_tree("raw").unwrap();
    let file = File::open(dir.join("db")).unwrap();
    (db, tree, file)
}

/// The raw ceilings write values as large as the journal's records (header and hash
/// link included), so both sides move the same bytes.
fn raw_value() -> Vec<u8> {
    let body = turnstile_journal::RecordBody {
        session_id: SessionId::parse("s100").unwrap(),
        seq: turnstile_journal::Seq(1000),
        ts_us: 1_796_000_000_000_000,
        prev_hash: [0xaa; 32],
        event: event(1000),
    };
    vec![7u8; turnstile_journal::codec::encode(&body).unwrap().len()]
}

fn raw_per_append_cell(dir: &Path, appenders: usize, seconds: f64) -> Cell {
    let (db, tree, file) = raw_db(dir);
    let file = Arc::new(file);
    let value = raw_value();
    concurrently(appenders, seconds, move |thread, n| {
        let key = [(thread as u64).to_be_bytes(), n.to_be_bytes()].concat();
        tree.insert(key, value.as_slice()).unwrap();
        db.flush().unwrap();
        file.sync_data().unwrap();
    })
}

/// `by_session`: keys shaped like the journal's (one stream per appender, so each
/// batch touches as many key ranges as there are appenders); otherwise one sequential
/// key space, sled's most favourable case.
fn raw_batched_cell(dir: &Path, batch: usize, seconds: f64, by_session: bool) -> Cell {
    let (db, tree, file) = raw_db(dir);
    let value = raw_value();
    let started = Instant::now();
    let mut events = 0u64;
    let mut round = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        let mut writes = sled::Batch::default();
        for appender in 0..batch {
            let key = if by_session {
                let mut key = format!("Ss{appender}").into_bytes();
                key.push(0);
                key.extend_from_slice(&round.to_be_bytes());
                key
            } else {
                events.to_be_bytes().to_vec()
            };
            writes.insert(key, value.as_slice());
            events += 1;
        }
        round += 1;
        tree.apply_batch(writes).unwrap();
        db.flush().unwrap();
        file.sync_data().unwrap();
    }
    Cell {
        events_per_s: events as f64 / started.elapsed().as_secs_f64(),
        p50_us: None,
        p99_us: None,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    let root = std::env::var("BENCH_DIR")
        .map(Into::into)
        .unwrap_or_else(|_| std::env::temp_dir());
    // `BENCH_ONLY_JOURNAL=N` runs only the journal cell with N appenders (for profiling).
    if let Some(appenders) = std::env::var("BENCH_ONLY_JOURNAL")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let dir = tempfile::tempdir_in(&root).unwrap();
        let cell = journal_cell(dir.path(), appenders, seconds);
        println!(
            "journal, {appenders} appenders: {:.0} events/s",
            cell.events_per_s
        );
        return;
    }
    // The machine is shared and noisy: each cell runs `BENCH_ROUNDS` times, interleaved
    // with its ceilings, and the table shows medians (ratios are medians of per-round ratios).
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!(
        "| appenders | turnstile journal (events/s) | p50 ack (µs) | p99 ack (µs) | raw: insert+flush+fdatasync per append | raw: apply_batch of N, sequential keys | raw: apply_batch of N, per-session keys | journal / batched (sequential) | journal / batched (per-session) | journal / per-append |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    // `BENCH_APPENDERS=256` (a comma list) runs only those rows.
    let counts: Vec<usize> = std::env::var("BENCH_APPENDERS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 256]);
    for appenders in counts {
        let dir = || tempfile::tempdir_in(&root).unwrap();
        let mut rows: Vec<[f64; 9]> = Vec::new();
        for _ in 0..rounds {
            let journal = journal_cell(dir().path(), appenders, seconds);
            let per_append = raw_per_append_cell(dir().path(), appenders, seconds);
            let sequential = raw_batched_cell(dir().path(), appenders, seconds, false);
            let by_session = raw_batched_cell(dir().path(), appenders, seconds, true);
            rows.push([
                journal.events_per_s,
                journal.p50_us.unwrap_or_default(),
                journal.p99_us.unwrap_or_default(),
                per_append.events_per_s,
                sequential.events_per_s,
                by_session.events_per_s,
                journal.events_per_s / sequential.events_per_s,
                journal.events_per_s / by_session.events_per_s,
                journal.events_per_s / per_append.events_per_s,
            ]);
        }
        let median = |column: usize| {
            let mut values: Vec<f64> = rows.iter().map(|row| row[column]).collect();
            values.sort_by(|a, b| a.total_cmp(b));
            values[values.len() / 2]
        };
        println!(
            "| {appenders} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1}x |",
            median(0),
            median(1),
            median(2),
            median(3),
            median(4),
            median(5),
            median(6),
            median(7),
            median(8),
        );
    }
}
