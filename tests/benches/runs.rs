//! Run benchmarks (issue 3), written up in `docs/PERFORMANCE.md`:
//! - memory per session: RSS with 100,000 sessions created, their actors alive, then
//!   passivated; and with each passivated soon after its turn (each in a fresh process);
//!   the runtime releases memory as the binary has it (`release_memory` is mimalloc's
//!   collect), and both ways once more without it, for the difference;
//! - turns per second with the scripted harness, durable: one session sequentially and
//!   1,000 sessions in parallel, in process (embedding API) and over HTTP, beside a
//!   bare axum JSON endpoint on the same machine in the same run;
//! - re-attaching to a finished run of 10,000 events: request to last frame.
//!
//! `cargo bench -p turnstile-tests --bench runs`. Knobs: `BENCH_SESSIONS_IDLE`
//! (100000), `BENCH_TURNS_SEQUENTIAL` (1000), `BENCH_SESSIONS_PARALLEL` (1000).
//! Not a test: nothing is asserted beyond the runs completing.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;
use turnstile_actors::{Multitask, RetryPolicy, Runtime, RuntimeConfig, StartRun};
use turnstile_projections::RunStatus;
use turnstile_tests::{
    Server, knob, reattach_to_a_long_run, scripted_agent, start_command, turnstile_bin,
    write_config,
};

const IN_FLIGHT: usize = 256;
const TURNS_PER_SESSION: usize = 3;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// A runtime as the binary opens it: `release_memory` is its allocator's collect unless
/// `release` is false.
fn runtime(dir: &std::path::Path, session_idle: Duration, release: bool) -> Runtime {
    let agent = scripted_agent(RetryPolicy::default());
    let mut config = RuntimeConfig::new(dir.to_path_buf(), vec![agent]);
    config.max_concurrent_runs = IN_FLIGHT;
    config.max_queued_runs = 1_000_000;
    config.session_idle = session_idle;
    config.arbiters = 2;
    config.release_memory = release.then_some(turnstile_gateway::allocator::collect as fn());
    Runtime::open(config).unwrap()
}

fn turn(session: &str, message: &str) -> StartRun {
    start_command(session, message, Multitask::Reject)
}

async fn in_process_turn(runtime: &Runtime, session: &str) {
    let view = runtime
        .start_run(turn(session, "hello"))
        .await
        .unwrap()
        .unwrap()
        .outcome()
        .await
        .unwrap();
    assert_eq!(view.status, RunStatus::Completed);
}

/// Runs `turns` turns on each of `sessions` sessions, at most IN_FLIGHT sessions at once.
async fn parallel<F, Fut>(sessions: usize, turns: usize, one_turn: F) -> f64
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let one_turn = Arc::new(one_turn);
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let started = Instant::now();
    let tasks: Vec<_> = (0..sessions)
        .map(|n| {
            let one_turn = one_turn.clone();
            let gate = gate.clone();
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.unwrap();
                for _ in 0..turns {
                    one_turn(format!("p{n}")).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (sessions * turns) as f64 / started.elapsed().as_secs_f64()
}

async fn http_turn(client: &reqwest::Client, base: &str, session: &str) {
    let response = client
        .post(format!("{base}/agents/scripted/runs"))
        .form(&[
            ("message", "hello"),
            ("session_id", session),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "COMPLETED");
}

async fn http_rates(base: String, sequential: usize, sessions: usize) -> (f64, f64) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(IN_FLIGHT)
        .build()
        .unwrap();
    let started = Instant::now();
    for _ in 0..sequential {
        http_turn(&client, &base, "seq").await;
    }
    let sequential_rate = sequential as f64 / started.elapsed().as_secs_f64();
    let parallel_rate = parallel(sessions, TURNS_PER_SESSION, move |session| {
        let client = client.clone();
        let base = base.clone();
        async move { http_turn(&client, &base, &session).await }
    })
    .await;
    (sequential_rate, parallel_rate)
}

struct Baseline(std::process::Child, String);

impl Baseline {
    fn start() -> Baseline {
        use std::io::BufRead;
        let mut child = std::process::Command::new(turnstile_bin())
            .args(["bench-baseline", "--addr", "127.0.0.1:0"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stderr)
            .read_line(&mut line)
            .unwrap();
        let addr = line.split("http://").nth(1).unwrap().trim().to_owned();
        Baseline(child, format!("http://{addr}"))
    }
}

impl Drop for Baseline {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Set in the child process that measures one way of passivating.
const MEMORY_CHILD: &str = "BENCH_MEMORY_CHILD";

/// `together`: every session keeps its actor until all have had their turn (the idle
/// timeout is an hour), then all passivate. `as they go`: each passivates 50 ms after
/// its turn, as sessions do on a server whose clients come and go. `..., nothing
/// released`: the same with no `release_memory`. Prints table rows, with the turns per
/// second of the 100,000 first turns (the cost of releasing, if any, is in them).
async fn memory_child(mode: &str, sessions: usize) {
    let together = mode.starts_with("together");
    let idle = if together {
        Duration::from_secs(3600)
    } else {
        Duration::from_millis(50)
    };
    let dir = tempfile::tempdir().unwrap();
    let runtime = runtime(dir.path(), idle, !mode.ends_with("nothing released"));
    let before = rss_bytes();
    let rt = runtime.clone();
    let rate = parallel(sessions, 1, move |session| {
        let runtime = rt.clone();
        async move { in_process_turn(&runtime, &session).await }
    })
    .await;
    let alive = runtime.sessions_in_memory().await.unwrap();
    let with_sessions = rss_bytes();
    runtime.set_session_idle(Duration::from_millis(1));
    while runtime.sessions_in_memory().await.unwrap() > 0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let passivated = rss_bytes();
    let row = |state: &str, actors: usize, rss: u64| {
        let growth = rss.saturating_sub(before);
        println!(
            "| {mode} | {state} | {actors} | {:.1} MiB | {:.0} B | {rate:.0} |",
            growth as f64 / 1048576.0,
            growth as f64 / sessions as f64
        );
    };
    if together {
        row("after their turn", alive, with_sessions);
    }
    row("passivated", 0, passivated);
    runtime.shutdown().await.unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let idle_sessions = knob("BENCH_SESSIONS_IDLE", 100_000);
    let sequential = knob("BENCH_TURNS_SEQUENTIAL", 1_000);
    let sessions = knob("BENCH_SESSIONS_PARALLEL", 1_000);

    // Memory first: each way of passivating in a fresh process of its own (this bench
    // again), so that neither inherits the other's allocator pages.
    if let Ok(mode) = std::env::var(MEMORY_CHILD) {
        memory_child(&mode, idle_sessions).await;
        return;
    }
    println!(
        "## Memory per session ({idle_sessions} sessions, one turn each, each way in a fresh process)\n"
    );
    println!(
        "| sessions passivated | state | session actors in memory | RSS growth | per session | turns/s |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for mode in [
        "together",
        "as they go",
        "together, nothing released",
        "as they go, nothing released",
    ] {
        // The allocator's options as the `turnstile` binary runs with them
        // (`gateway/src/allocator.rs`), unless the caller set them.
        let purge_delay = std::env::var("MIMALLOC_PURGE_DELAY").unwrap_or_else(|_| "0".to_owned());
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args(std::env::args().skip(1))
            .env("MIMALLOC_PURGE_DELAY", purge_delay)
            .env(MEMORY_CHILD, mode)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        print!("{}", String::from_utf8_lossy(&output.stdout));
    }
    println!();

    // Turns per second, in process.
    let (in_process_sequential, in_process_parallel) = {
        let dir = tempfile::tempdir().unwrap();
        let runtime = runtime(dir.path(), Duration::from_secs(60), true);
        let started = Instant::now();
        for _ in 0..sequential {
            in_process_turn(&runtime, "seq").await;
        }
        let sequential_rate = sequential as f64 / started.elapsed().as_secs_f64();
        let rt = runtime.clone();
        let parallel_rate = parallel(sessions, TURNS_PER_SESSION, move |session| {
            let runtime = rt.clone();
            async move { in_process_turn(&runtime, &session).await }
        })
        .await;
        runtime.shutdown().await.unwrap();
        (sequential_rate, parallel_rate)
    };

    // Turns per second over HTTP, beside the bare endpoint.
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!("max_concurrent_runs = {IN_FLIGHT}\nmax_queued_runs = 1000000"),
        "",
    );
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let (http_sequential, http_parallel) =
        http_rates(server.base.clone(), sequential, sessions).await;
    let baseline = Baseline::start();
    let (bare_sequential, bare_parallel) =
        http_rates(baseline.1.clone(), sequential, sessions).await;
    drop(baseline);

    println!(
        "## Turns per second, scripted harness, durable ({sequential} sequential turns on one session; {sessions} sessions x {TURNS_PER_SESSION} turns, {IN_FLIGHT} sessions in flight)\n"
    );
    println!("| path | one session, sequential | {sessions} sessions, parallel |");
    println!("|---|---:|---:|");
    println!(
        "| in process (embedding API) | {in_process_sequential:.0} | {in_process_parallel:.0} |"
    );
    println!("| HTTP, `turnstile serve` | {http_sequential:.0} | {http_parallel:.0} |");
    println!("| HTTP, bare axum JSON endpoint | {bare_sequential:.0} | {bare_parallel:.0} |");
    println!(
        "| turnstile HTTP / bare axum | {:.3} | {:.3} |",
        http_sequential / bare_sequential,
        http_parallel / bare_parallel
    );
    println!(
        "| turnstile HTTP / in process | {:.2} | {:.2} |\n",
        http_sequential / in_process_sequential,
        http_parallel / in_process_parallel
    );

    // Re-attaching to a finished run of 10,005 events.
    let (times, frames) = reattach_to_a_long_run(&server, 7).await;
    println!("## Re-attaching to a finished run\n");
    println!(
        "| run events | frames received | request to last frame, median of 7 | best | worst |"
    );
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {frames} | {:.1} ms | {:.1} ms | {:.1} ms |",
        frames - 1,
        times[3].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[6].as_secs_f64() * 1e3
    );
    server.terminate();
}
