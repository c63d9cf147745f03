//! PostgreSQL beside sled, measured side by side in one run (issues 16 and 33), written
//! up in `docs/PERFORMANCE.md`:
//! - durable events per second through the journal API: 256 appenders, 16 events an
//!   append, on sled and on PostgreSQL (the test suite's throwaway cluster);
//! - one appender on PostgreSQL: an append of one event against the database's own
//!   single-row `INSERT` (autocommit: one round trip, one commit), rounds interleaved;
//! - quick turns per second over HTTP (scripted harness, `stream=false`, a new session
//!   a turn, 64 clients): one server on sled, one replica on PostgreSQL, two replicas
//!   on PostgreSQL with the clients split between them (one, two, two, one: the mean of
//!   each pair);
//! - stream latency: from a run's end being journaled on replica A to its terminal frame
//!   reaching a client re-attached on A itself, and on replica B;
//! - a turn on a session whose last turn was served by the other replica, against one
//!   whose last turn was served by the same replica.
//!
//! `cargo bench -p turnstile-tests --bench replicas`. Knobs: `BENCH_SECONDS` (5),
//! `BENCH_APPENDERS` (256), `BENCH_CLIENTS` (64). Failover has a bench of its own
//! (`failover.rs`). Not a test: nothing is asserted beyond the runs completing.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_journal::{
    Event, Expected, Journal, JournalOptions, PostgresOptions, RunId, SessionId,
};
use turnstile_tests::{Server, http_client, knob, median, parse_sse, quick_turn};

static APPENDERS: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| knob("BENCH_APPENDERS", 256));
static CLIENTS: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| knob("BENCH_CLIENTS", 64));
const EVENTS_PER_APPEND: usize = 16;

fn line(n: usize) -> Event {
    Event::TranscriptLineAppended {
        run_id: RunId::parse("bench").unwrap(),
        harness_session_id: "h".into(),
        line: format!(
            "{{\"type\":\"assistant\",\"n\":{n},\"text\":\"{}\"}}",
            "x".repeat(300)
        ),
    }
}

async fn events_per_second(journal: Journal, seconds: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..*APPENDERS)
        .map(|n| {
            let (journal, done) = (journal.clone(), done.clone());
            tokio::spawn(async move {
                let session = SessionId::parse(&format!("bench-{n}")).unwrap();
                while Instant::now() < deadline {
                    let events = (0..EVENTS_PER_APPEND).map(line).collect();
                    journal
                        .append(&session, Expected::Any, events)
                        .await
                        .unwrap()
                        .unwrap();
                    done.fetch_add(EVENTS_PER_APPEND as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Latencies of one appender's appends of one event, for `seconds`.
async fn one_appender(journal: &Journal, seconds: f64, round: usize) -> Vec<Duration> {
    let session = SessionId::parse(&format!("one-{round}")).unwrap();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut latencies = Vec::new();
    let mut n = 0;
    while Instant::now() < deadline {
        let started = Instant::now();
        journal
            .append(&session, Expected::Any, vec![line(n)])
            .await
            .unwrap()
            .unwrap();
        latencies.push(started.elapsed());
        n += 1;
    }
    latencies
}

/// One appender's p50 append beside the p50 single-row `INSERT`, in interleaved rounds.
async fn one_appender_beside_insert(url: &str, seconds: u64) -> (Duration, Duration) {
    let journal =
        Journal::open_postgres(&PostgresOptions::new(url), JournalOptions::default()).unwrap();
    let (mut appends, mut inserts) = (Vec::new(), Vec::new());
    let round = seconds as f64 / 4.0;
    for n in 0..4 {
        inserts.extend(
            turnstile_journal::postgres_insert_round_trips(url, round)
                .await
                .unwrap(),
        );
        appends.extend(one_appender(&journal, round, n).await);
    }
    journal.close().unwrap();
    (median(appends), median(inserts))
}

/// The p50 of `turns` turns on one session, each on the next of `servers` in turn.
async fn turn_latency(servers: &[&Server], session: &str, turns: usize) -> Duration {
    let client = http_client();
    let mut latencies = Vec::new();
    for n in 0..turns {
        let base = &servers[n % servers.len()].base;
        let started = Instant::now();
        quick_turn(&client, base, session).await;
        // The first turn creates the session on either.
        if n > 0 {
            latencies.push(started.elapsed());
        }
    }
    median(latencies)
}

fn config(dir: &std::path::Path, journal: &str) -> std::path::PathBuf {
    let path = dir.join("bench.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nmax_concurrent_runs = 64\nmax_queued_runs = 100000\n\n{journal}\n\n[[agents]]\nid = \"scripted\"\nharness = \"scripted\"\n"
        ),
    )
    .unwrap();
    path
}

/// Quick turns per second, each on a new session (`phase` keeps the sessions of one
/// measurement apart from another's on the same database).
async fn turns_per_second(servers: &[&Server], phase: &str, seconds: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let client = http_client();
    let tasks: Vec<_> = (0..*CLIENTS)
        .map(|n| {
            let base = servers[n % servers.len()].base.clone();
            let (client, done, phase) = (client.clone(), done.clone(), phase.to_owned());
            tokio::spawn(async move {
                let mut turn = 0;
                while Instant::now() < deadline {
                    let session = format!("{phase}-t{n}-{turn}");
                    turn += 1;
                    quick_turn(&client, &base, &session).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// From a run's terminal record (its journal time) on `runner` to its terminal frame on
/// `reader`, re-attached while the run sleeps.
async fn stream_latency(
    runner: &Server,
    reader: &Server,
    config: &std::path::Path,
    dir: &std::path::Path,
    samples: usize,
) -> Duration {
    let client = http_client();
    let mut latencies = Vec::new();
    for n in 0..samples {
        let session = format!(
            "lat-{n}-{}",
            if std::ptr::eq(runner, reader) {
                "same"
            } else {
                "across"
            }
        );
        let accepted: Value = client
            .post(format!("{}/agents/scripted/runs", runner.base))
            .form(&[
                ("message", "/sleep 150\nend"),
                ("session_id", &session),
                ("stream", "false"),
                ("background", "true"),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let run_id = accepted["run_id"].as_str().unwrap().to_owned();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut response = client
            .post(format!(
                "{}/agents/scripted/runs/{run_id}/resume",
                reader.base
            ))
            .form(&[("session_id", session.as_str())])
            .send()
            .await
            .unwrap();
        let mut body = String::new();
        let mut received = 0;
        while let Some(chunk) = response.chunk().await.unwrap() {
            body.push_str(&String::from_utf8_lossy(&chunk));
            if body.contains("RunCompleted") {
                received = now_us();
                break;
            }
        }
        let _ = parse_sse(&body);
        // The terminal record's journal time, from the audit CLI's export of the session.
        let export = turnstile_tests::turnstile_in_ok(
            dir,
            &[
                "journal",
                "export",
                "--session",
                &session,
                "--config",
                config.to_str().unwrap(),
            ],
        );
        let ended = export
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|record| {
                record["event"]["RunCompleted"]["run_id"].as_str() == Some(run_id.as_str())
            })
            .and_then(|record| record["ts_us"].as_i64())
            .unwrap();
        latencies.push(Duration::from_micros((received - ended).max(0) as u64));
        if std::env::var_os("BENCH_VERBOSE").is_some() {
            println!("  sample {n}: {:?}", latencies.last().unwrap());
        }
    }
    median(latencies)
}

/// Whether a section runs: `BENCH_ONLY` names those that do (comma-separated: events,
/// one, turns, hop, stream), all by default.
fn runs(section: &str) -> bool {
    std::env::var("BENCH_ONLY")
        .map(|only| only.split(',').any(|name| name == section))
        .unwrap_or(true)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = knob("BENCH_SECONDS", 5) as u64;
    let Some(url) = turnstile_tests::postgres::database() else {
        panic!("PostgreSQL is needed");
    };
    println!(
        "machine: {} cores",
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(0)
    );

    if runs("events") {
        // Durable events/s through the journal API.
        let dir = tempfile::tempdir().unwrap();
        let sled = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let sled_rate = events_per_second(sled.clone(), seconds).await;
        sled.close().unwrap();
        let pg = Journal::open_postgres(
            &PostgresOptions::new(url.clone()),
            JournalOptions::default(),
        )
        .unwrap();
        let pg_rate = events_per_second(pg.clone(), seconds).await;
        let stats = pg.stats();
        println!(
            "PostgreSQL appends: {}, {:.2} ms of batch time each on average",
            stats.appends,
            stats.sync_us_total as f64 / stats.appends.max(1) as f64 / 1000.0
        );
        pg.close().unwrap();
        println!(
            "durable events/s ({} appenders x {EVENTS_PER_APPEND} events): sled {sled_rate:.0}, PostgreSQL {pg_rate:.0} ({:.2}x sled)",
            *APPENDERS,
            pg_rate / sled_rate
        );
    }
    if runs("one") {
        let (append, insert) = one_appender_beside_insert(&url, seconds).await;
        println!(
            "one appender on PostgreSQL, p50: an append of one event {:.3} ms, a single-row INSERT (autocommit) {:.3} ms ({:.2}x)",
            append.as_secs_f64() * 1000.0,
            insert.as_secs_f64() * 1000.0,
            append.as_secs_f64() / insert.as_secs_f64()
        );
    }

    // Quick turns/s over HTTP.
    let turns_url = turnstile_tests::postgres::database().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sled_turns = if runs("turns") {
        let sled_config = config(dir.path(), "");
        let server = Server::start_with(
            &dir.path().join("sled"),
            &["--config", sled_config.to_str().unwrap()],
        );
        let rate = turns_per_second(&[&server], "sled", seconds).await;
        server.terminate();
        rate
    } else {
        0.0
    };
    let pg_dir = tempfile::tempdir().unwrap();
    let pg_config = config(
        pg_dir.path(),
        &format!("[journal]\nbackend = \"postgres\"\nurl = \"{turns_url}\""),
    );
    let pg_args = ["--config", pg_config.to_str().unwrap()];
    let one = Server::start_with(&pg_dir.path().join("a"), &pg_args);
    if runs("turns") {
        // One replica alone, then two (the second started for its phase and stopped
        // after it, so that the first is alone again), in the order one, two, two, one:
        // the database grows with every phase and the machine drifts, and neither
        // configuration should always come second.
        let (mut one_rates, mut two_rates) = (Vec::new(), Vec::new());
        for phase in ["one-a", "two-a", "two-b", "one-b"] {
            if phase.starts_with("one") {
                one_rates.push(turns_per_second(&[&one], phase, seconds).await);
            } else {
                let two = Server::start_with(&pg_dir.path().join("b"), &pg_args);
                two_rates.push(turns_per_second(&[&one, &two], phase, seconds).await);
                two.terminate();
                if phase == "two-b" {
                    // A replica stopped gracefully deletes its heartbeat row, but the
                    // first one learns it is alone only at its next heartbeat (every 2 s):
                    // until then it still works as one among others (one batch in flight,
                    // its appends announced), which is not "one replica alone". The wait
                    // leaves a wide margin.
                    tokio::time::sleep(Duration::from_secs(13)).await;
                }
            }
        }
        let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len() as f64;
        let (one_turns, two_turns) = (mean(&one_rates), mean(&two_rates));
        println!(
            "quick turns/s over HTTP ({} clients, a new session each): sled {sled_turns:.0}, PostgreSQL one replica {one_turns:.0} ({:.2}x sled), two replicas {two_turns:.0} ({:.2}x one); phases one, two, two, one: {:.0}, {:.0}, {:.0}, {:.0}",
            *CLIENTS,
            one_turns / sled_turns,
            two_turns / one_turns,
            one_rates[0],
            two_rates[0],
            two_rates[1],
            one_rates[1],
        );
    }
    let two = Server::start_with(&pg_dir.path().join("b"), &pg_args);

    if runs("hop") {
        // A turn on a session last served by the other replica, against the same one.
        let mut same_turns = Vec::new();
        let mut hop_turns = Vec::new();
        for round in 0..4 {
            same_turns.push(turn_latency(&[&one], &format!("stay-{round}"), 11).await);
            hop_turns.push(turn_latency(&[&one, &two], &format!("hop-{round}"), 11).await);
        }
        let (same_turn, hop_turn) = (median(same_turns), median(hop_turns));
        println!(
            "a turn, p50: on the replica that served the session's last turn {:.1} ms, on the other replica {:.1} ms ({:+.1} ms)",
            same_turn.as_secs_f64() * 1000.0,
            hop_turn.as_secs_f64() * 1000.0,
            (hop_turn.as_secs_f64() - same_turn.as_secs_f64()) * 1000.0
        );
    }

    if runs("stream") {
        // Stream latency, same replica and across replicas.
        let same = stream_latency(&one, &one, &pg_config, pg_dir.path(), 20).await;
        let across = stream_latency(&one, &two, &pg_config, pg_dir.path(), 20).await;
        println!(
            "terminal frame after the run's end was journaled (median of 20): re-attached on the same replica {:.1} ms, on the other replica {:.1} ms",
            same.as_secs_f64() * 1000.0,
            across.as_secs_f64() * 1000.0
        );
    }
    one.terminate();
    two.terminate();
}
