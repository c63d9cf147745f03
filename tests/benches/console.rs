//! Issue 18's numbers, written up in `docs/PERFORMANCE.md`:
//! - the cost of tracing on a turn: two release servers side by side in one run, one
//!   without `[telemetry]` and one exporting every run to an OTLP receiver on loopback,
//!   taking sequential turns (a tool call and an answer each) in alternating rounds;
//! - the console's load time: the sessions page in headless Chromium, from
//!   navigation to its first page of rows, with 100 sessions and with 100,000.
//!
//! `cargo bench -p turnstile-tests --bench console` (the console part needs node,
//! Chromium and playwright-core: the README's test command installs them). Knobs:
//! `BENCH_TRACE_TURNS` (200 a round), `BENCH_TRACE_ROUNDS` (5), `BENCH_SESSIONS`
//! (100000), `BENCH_PAGE_LOADS` (7).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use turnstile_actors::{Multitask, RetryPolicy, Runtime, RuntimeConfig};
use turnstile_tests::otlp::Receiver;
use turnstile_tests::{Server, http_client, knob, median, scripted_agent, start_command};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn turns(server: &Server, round: usize, count: usize) -> Vec<Duration> {
    let client = http_client();
    let mut samples = Vec::with_capacity(count);
    for turn in 0..count {
        let started = Instant::now();
        let response = client
            .post(server.url("/agents/scripted/runs"))
            .form(&[
                ("message", "/tool Read {}\n/reply ok"),
                ("session_id", &format!("bench-{round}-{}", turn % 10)),
                ("stream", "false"),
            ])
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
        let _ = response.bytes().await.unwrap();
        samples.push(started.elapsed());
    }
    samples
}

async fn tracing_cost() {
    let rounds = knob("BENCH_TRACE_ROUNDS", 5);
    let count = knob("BENCH_TRACE_TURNS", 200);
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("traced.toml");
    std::fs::write(
        &config,
        format!(
            "[telemetry]\notlp_endpoint = \"http://{}\"\n",
            receiver.addr
        ),
    )
    .unwrap();
    let off = Server::start(&dir.path().join("off"));
    let on = Server::start_with(
        &dir.path().join("on"),
        &["--config", config.to_str().unwrap()],
    );
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        without.extend(turns(&off, round, count).await);
        with.extend(turns(&on, round, count).await);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spans = receiver.spans();
    let runs = spans.iter().filter(|span| span["name"] == "run").count();
    let (a, b) = (median(without), median(with));
    println!(
        "| turn (a tool call and an answer), {rounds} x {count} each | tracing off | tracing on | on ÷ off | runs traced |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| median | {:.2} ms | {:.2} ms | {:.2} | {runs} of {} |",
        ms(a),
        ms(b),
        b.as_secs_f64() / a.as_secs_f64(),
        rounds * count
    );
    off.terminate();
    on.terminate();
}

/// A data directory with `sessions` sessions, one turn each, made with the
/// embedding API (the fastest way to many sessions).
async fn seeded(dir: &Path, sessions: usize) {
    let mut config = RuntimeConfig::new(
        dir.to_path_buf(),
        vec![scripted_agent(RetryPolicy::default())],
    );
    config.max_concurrent_runs = 64;
    config.max_queued_runs = 200_000;
    let runtime = Runtime::open(config).unwrap();
    let mut started = 0;
    while started < sessions {
        let batch: Vec<_> = (started..(started + 500).min(sessions))
            .map(|n| {
                let runtime = runtime.clone();
                tokio::spawn(async move {
                    let command = start_command(&format!("s{n:06}"), "hello", Multitask::Reject);
                    let handle = runtime.start_run(command).await.unwrap().unwrap();
                    handle.outcome().await.unwrap();
                })
            })
            .collect();
        started += batch.len();
        for task in batch {
            task.await.unwrap();
        }
    }
    runtime.shutdown().await.unwrap();
}

fn page_loads(server: &Server, loads: usize) -> Option<Vec<f64>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("console/load.cjs");
    let output = Command::new("node")
        .arg(&script)
        .arg(&server.base)
        .arg(loads.to_string())
        .output()
        .ok()?;
    if !output.status.success() {
        eprintln!(
            "page loads failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        return None;
    }
    Some(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect(),
    )
}

async fn console_load() {
    let loads = knob("BENCH_PAGE_LOADS", 7);
    let many = knob("BENCH_SESSIONS", 100_000);
    println!(
        "| sessions | sessions page, navigation to its first 20 rows (median of {loads}) | min | max |"
    );
    println!("|---|---|---|---|");
    for sessions in [100, many] {
        let dir = tempfile::tempdir().unwrap();
        let seeding = Instant::now();
        seeded(dir.path(), sessions).await;
        eprintln!(
            "seeded {sessions} sessions in {:.1} s",
            seeding.elapsed().as_secs_f64()
        );
        let server = Server::start(dir.path());
        let Some(mut times) = page_loads(&server, loads) else {
            println!("| {sessions} | (no browser) | | |");
            server.terminate();
            continue;
        };
        times.sort_by(f64::total_cmp);
        println!(
            "| {sessions} | {:.0} ms | {:.0} ms | {:.0} ms |",
            times[times.len() / 2],
            times[0],
            times[times.len() - 1]
        );
        server.terminate();
    }
}

#[tokio::main]
async fn main() {
    tracing_cost().await;
    console_load().await;
}
