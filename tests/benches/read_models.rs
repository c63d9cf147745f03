//! Read-model benchmarks (issue 12), written up in `docs/PERFORMANCE.md`, each a ratio
//! measured side by side in one run:
//! - one session, 10,000 sequential turns: median turn latency over turns 9,800-10,000
//!   against turns 1-200, and the same for reading the newest run (five reads after
//!   each turn), in process
//!   (embedding API) and over HTTP (the release binary);
//! - `GET /agents/{id}/runs/{run_id}`, `GET /sessions/{id}`, a `GET /sessions` page and
//!   `GET /metrics` with 100,000 sessions against 100 sessions: side by side (a second
//!   server with 100 sessions, read in turn with the big one) and one after the other
//!   (the big server before it grew);
//! - re-attaching to a finished run of 10,005 events: request to last frame.
//!
//! `cargo bench -p turnstile-tests --bench read_models` (builds the release binary
//! first: `cargo build --release --bin turnstile`). Knobs: `BENCH_LONG_TURNS` (10000),
//! `BENCH_SESSIONS_MANY` (100000). Not a test: nothing is asserted.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;
use turnstile_actors::{Multitask, RetryPolicy, Runtime, RuntimeConfig};
use turnstile_tests::{
    Server, knob, median, post_form_json, reattach_to_a_long_run, scripted_agent, start_command,
    write_config,
};

/// Reads of the newest run after each turn of the windows.
const READS_PER_TURN: usize = 5;

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Latencies of the turns and newest-run reads inside the two windows.
#[derive(Default)]
struct Windows {
    early_turns: Vec<Duration>,
    late_turns: Vec<Duration>,
    early_reads: Vec<Duration>,
    late_reads: Vec<Duration>,
    /// The control: a run of a one-turn session, read at the same moments.
    early_control: Vec<Duration>,
    late_control: Vec<Duration>,
}

impl Windows {
    fn record(&mut self, turn: usize, turns: usize, took: Duration, reads: &[Duration]) {
        if (1..=200).contains(&turn) {
            self.early_turns.push(took);
            self.early_reads.extend_from_slice(reads);
        } else if turn + 200 >= turns {
            self.late_turns.push(took);
            self.late_reads.extend_from_slice(reads);
        }
    }

    fn rows(self, path: &str, turns: usize) {
        let (et, lt) = (median(self.early_turns), median(self.late_turns));
        let (er, lr) = (median(self.early_reads), median(self.late_reads));
        println!(
            "| {path} | turn | {:.2} ms | {:.2} ms | {:.2} |",
            ms(et),
            ms(lt),
            lt.as_secs_f64() / et.as_secs_f64()
        );
        println!(
            "| {path} | read of the newest run | {:.4} ms | {:.4} ms | {:.2} |",
            ms(er),
            ms(lr),
            lr.as_secs_f64() / er.as_secs_f64()
        );
        if !self.early_control.is_empty() {
            let (ec, lc) = (median(self.early_control), median(self.late_control));
            println!(
                "| {path} | read of a one-turn session's run, at the same moments (control) | {:.4} ms | {:.4} ms | {:.2} |",
                ms(ec),
                ms(lc),
                lc.as_secs_f64() / ec.as_secs_f64()
            );
        }
        let _ = turns;
    }
}

async fn long_session_in_process(turns: usize) -> Windows {
    let dir = tempfile::tempdir().unwrap();
    let mut config = RuntimeConfig::new(
        dir.path().to_path_buf(),
        vec![scripted_agent(RetryPolicy::default())],
    );
    config.arbiters = 2;
    let runtime = Runtime::open(config).unwrap();
    let mut windows = Windows::default();
    // The control: a one-turn session's run, read at the same moments.
    let control = runtime
        .start_run(start_command("short", "hello", Multitask::Reject))
        .await
        .unwrap()
        .unwrap()
        .outcome()
        .await
        .unwrap()
        .run_id;
    for turn in 1..=turns {
        let started = Instant::now();
        let view = runtime
            .start_run(start_command("long", "hello", Multitask::Reject))
            .await
            .unwrap()
            .unwrap()
            .outcome()
            .await
            .unwrap();
        let took = started.elapsed();
        // Five reads of the newest run, each followed by one of the control; each is a
        // sample.
        let mut reads = Vec::with_capacity(READS_PER_TURN);
        let mut controls = Vec::with_capacity(READS_PER_TURN);
        for _ in 0..READS_PER_TURN {
            let started = Instant::now();
            let read = runtime.run_view(&view.run_id).unwrap().unwrap();
            reads.push(started.elapsed());
            assert_eq!(read.run_id, view.run_id);
            let started = Instant::now();
            let read = runtime.run_view(&control).unwrap().unwrap();
            controls.push(started.elapsed());
            assert_eq!(read.run_id, control);
        }
        windows.record(turn, turns, took, &reads);
        if (1..=200).contains(&turn) {
            windows.early_control.extend(controls);
        } else if turn + 200 >= turns {
            windows.late_control.extend(controls);
        }
    }
    runtime.shutdown().await.unwrap();
    windows
}

async fn get_timed(client: &reqwest::Client, server: &Server, path: &str) -> Duration {
    let started = Instant::now();
    let read = client.get(server.url(path)).send().await.unwrap();
    assert_eq!(read.status(), 200);
    let _ = read.bytes().await.unwrap();
    started.elapsed()
}

async fn long_session_http(server: &Server, turns: usize) -> Windows {
    let client = reqwest::Client::new();
    let mut windows = Windows::default();
    let control = post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", "hello"),
            ("stream", "false"),
            ("session_id", "short"),
        ],
    )
    .await;
    let control = format!(
        "/agents/scripted/runs/{}",
        control["run_id"].as_str().unwrap()
    );
    for turn in 1..=turns {
        let started = Instant::now();
        let run: Value = client
            .post(server.url("/agents/scripted/runs"))
            .form(&[
                ("message", "hello"),
                ("stream", "false"),
                ("session_id", "long"),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let took = started.elapsed();
        let newest = format!("/agents/scripted/runs/{}", run["run_id"].as_str().unwrap());
        let in_window = turn <= 200 || turn + 200 >= turns;
        let mut reads = Vec::with_capacity(READS_PER_TURN);
        let mut controls = Vec::with_capacity(READS_PER_TURN);
        for _ in 0..if in_window { READS_PER_TURN } else { 0 } {
            reads.push(get_timed(&client, server, &newest).await);
            controls.push(get_timed(&client, server, &control).await);
        }
        windows.record(turn, turns, took, &reads);
        if (1..=200).contains(&turn) {
            windows.early_control.extend(controls);
        } else if in_window {
            windows.late_control.extend(controls);
        }
    }
    windows
}

/// Creates sessions with one turn each, 64 at a time; returns one run id.
async fn create_sessions(server: &Server, count: usize) -> String {
    let client = reqwest::Client::new();
    let slots = Arc::new(Semaphore::new(64));
    let mut tasks = Vec::with_capacity(count);
    for _ in 0..count {
        let permit = slots.clone().acquire_owned().await.unwrap();
        let client = client.clone();
        let url = server.url("/agents/scripted/runs");
        tasks.push(tokio::spawn(async move {
            let run: Value = client
                .post(url)
                .form(&[("message", "hello"), ("stream", "false"), ("user_id", "u")])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            drop(permit);
            run["run_id"].as_str().unwrap_or_default().to_owned()
        }));
    }
    let mut last = String::new();
    for task in tasks {
        last = task.await.unwrap();
    }
    last
}

/// Median latency of `GET path`, over `samples` requests.
async fn get_median(
    client: &reqwest::Client,
    server: &Server,
    path: &str,
    samples: usize,
) -> Duration {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        let response = client.get(server.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let _ = response.bytes().await.unwrap();
        times.push(started.elapsed());
    }
    median(times)
}

/// The four reads of the table, for a server and one of its runs.
async fn read_paths(client: &reqwest::Client, server: &Server, run_id: &str) -> [String; 4] {
    let run: Value = client
        .get(server.url(&format!("/agents/scripted/runs/{run_id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session_id = run["session_id"].as_str().unwrap().to_owned();
    [
        format!("/agents/scripted/runs/{run_id}"),
        format!("/sessions/{session_id}"),
        "/sessions?limit=20&page=1".to_owned(),
        "/metrics".to_owned(),
    ]
}

async fn reads_at(server: &Server, run_id: &str) -> [Duration; 4] {
    let client = reqwest::Client::new();
    let paths = read_paths(&client, server, run_id).await;
    let mut medians = [Duration::ZERO; 4];
    for (median, path) in medians.iter_mut().zip(&paths) {
        *median = get_median(&client, server, path, 300).await;
    }
    medians
}

/// The same reads on two servers, one request to each in turn (300 each): a ratio of
/// their medians is measured at the same moments, so a shared machine's drift between
/// two measurements does not enter it.
async fn reads_alternately(
    (few, few_run): (&Server, &str),
    (lots, lots_run): (&Server, &str),
) -> [(Duration, Duration); 4] {
    let client = reqwest::Client::new();
    let few_paths = read_paths(&client, few, few_run).await;
    let lots_paths = read_paths(&client, lots, lots_run).await;
    let mut medians = [(Duration::ZERO, Duration::ZERO); 4];
    for (index, pair) in medians.iter_mut().enumerate() {
        let (mut a, mut b) = (Vec::with_capacity(300), Vec::with_capacity(300));
        for _ in 0..300 {
            a.push(get_timed(&client, few, &few_paths[index]).await);
            b.push(get_timed(&client, lots, &lots_paths[index]).await);
        }
        *pair = (median(a), median(b));
    }
    medians
}

fn server(dir: &std::path::Path) -> Server {
    let config = write_config(
        dir,
        "max_concurrent_runs = 64\nmax_queued_runs = 1000000",
        "",
    );
    Server::start_with(&dir.join("data"), &["--config", config.to_str().unwrap()])
}

#[tokio::main]
async fn main() {
    let turns = knob("BENCH_LONG_TURNS", 10_000);
    let many = knob("BENCH_SESSIONS_MANY", 100_000);

    println!("## One session, {turns} sequential turns (scripted harness, durable)\n");
    println!("| path | what | median over turns 1-200 | median over the last 200 turns | ratio |");
    println!("|---|---|---:|---:|---:|");
    long_session_in_process(turns)
        .await
        .rows("in process", turns);
    {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path());
        long_session_http(&server, turns).await.rows("HTTP", turns);
        server.terminate();
    }

    println!("\n## Reads with {many} sessions against 100 (HTTP, median of 300 requests)\n");
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let few_run = create_sessions(&server, 100).await;
    let few = reads_at(&server, &few_run).await;
    // A second server keeps 100 sessions, for reads side by side with the big one.
    let control_dir = tempfile::tempdir().unwrap();
    let control = self::server(control_dir.path());
    let control_run = create_sessions(&control, 100).await;
    let started = Instant::now();
    let many_run = create_sessions(&server, many - 100).await;
    let created = started.elapsed();
    let lots = reads_at(&server, &many_run).await;
    let side_by_side = reads_alternately((&control, &control_run), (&server, &many_run)).await;
    control.terminate();
    println!(
        "({} sessions created in {:.0} s. Side by side: a second server with 100 sessions and this one, one request to each in turn; one after the other: this server before and after it grew)\n",
        many - 100,
        created.as_secs_f64()
    );
    println!(
        "| request | side by side: 100 sessions | {many} sessions | ratio | one after the other: 100 sessions | {many} sessions | ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (index, name) in [
        "`GET /agents/{id}/runs/{run_id}`",
        "`GET /sessions/{id}`",
        "`GET /sessions` (page 1 of 20)",
        "`GET /metrics`",
    ]
    .iter()
    .enumerate()
    {
        let (a, b) = side_by_side[index];
        println!(
            "| {name} | {:.3} ms | {:.3} ms | {:.2} | {:.3} ms | {:.3} ms | {:.2} |",
            ms(a),
            ms(b),
            b.as_secs_f64() / a.as_secs_f64(),
            ms(few[index]),
            ms(lots[index]),
            lots[index].as_secs_f64() / few[index].as_secs_f64()
        );
    }

    // Re-attaching to a finished run of 10,005 events.
    let (times, frames) = reattach_to_a_long_run(&server, 11).await;
    let best = *times.iter().min().unwrap();
    println!("\n## Re-attaching to a finished run\n");
    println!("| run events | frames received | request to last frame, median of 11 | best |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {} | {frames} | {:.1} ms | {:.1} ms |",
        frames - 1,
        ms(median(times)),
        ms(best)
    );
    server.terminate();
}
