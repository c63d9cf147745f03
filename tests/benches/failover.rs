//! Failover on PostgreSQL (issue 33), written up in `docs/PERFORMANCE.md`: two replicas
//! with `lease_s = 3`; a run is running on replica A when A is killed (SIGKILL); the
//! time from the kill to replica B journaling the run's next attempt (its
//! `AttemptStarted` record's journal time), over `BENCH_KILLS` (20) kills. A is started
//! again after each (a new process on a new port, so under a new name: the old one's
//! lease lapses, it is not retired by a restart).
//!
//! `cargo bench -p turnstile-tests --bench failover`. Not a test: nothing is asserted
//! beyond each run being taken over.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_tests::{Server, knob, median, post_form, post_form_json};

const LEASE_S: u64 = 3;

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// The journal time of the run's attempt `attempt`, once it is journaled.
fn attempt_started(
    dir: &std::path::Path,
    config: &str,
    session: &str,
    attempt: u64,
) -> Option<i64> {
    let export = turnstile_tests::turnstile_in_ok(
        dir,
        &[
            "journal",
            "export",
            "--session",
            session,
            "--config",
            config,
        ],
    );
    export
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|record| record["event"]["AttemptStarted"]["attempt"].as_u64() == Some(attempt))
        .and_then(|record| record["ts_us"].as_i64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let kills = knob("BENCH_KILLS", 20);
    let Some(url) = turnstile_tests::postgres::database() else {
        panic!("PostgreSQL is needed");
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("failover.toml");
    std::fs::write(
        &config,
        format!(
            "[journal]\nbackend = \"postgres\"\nurl = \"{url}\"\nlease_s = {LEASE_S}\n\n[[agents]]\nid = \"scripted\"\nharness = \"scripted\"\nretries = 1\ndelay_between_retries_s = 0\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    // Each on a port of its own, so a name of its own (`host:port`).
    let start = |name: String| Server::start_with(&dir.path().join(&name), &["--config", &config]);
    let b = start("b".into());
    let mut takeovers = Vec::new();
    for kill in 0..kills {
        let a = start(format!("a{kill}"));
        let session = format!("failover-{kill}");
        let accepted = post_form_json(
            &a,
            "/agents/scripted/runs",
            &[
                ("message", "/sleep 600000\nend"),
                ("session_id", session.as_str()),
                ("stream", "false"),
                ("background", "true"),
            ],
        )
        .await;
        let run_id = accepted["run_id"].as_str().unwrap().to_owned();
        while attempt_started(dir.path(), &config, &session, 1).is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Past a heartbeat or two, as a replica that has been working a while.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let killed = now_us();
        a.kill();
        let waited = Instant::now();
        let taken = loop {
            if let Some(at) = attempt_started(dir.path(), &config, &session, 2) {
                break at;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "run {run_id} was not taken over"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        let took = Duration::from_micros((taken - killed).max(0) as u64);
        println!(
            "  kill {kill}: the next attempt was journaled {:.2} s after it",
            took.as_secs_f64()
        );
        takeovers.push(took);
        // Frees the slot on B for the next kill's run.
        post_form(
            &b,
            &format!("/agents/scripted/runs/{run_id}/cancel"),
            &[("session_id", session.as_str())],
        )
        .await;
    }
    let mut sorted = takeovers.clone();
    sorted.sort();
    println!(
        "failover with lease_s = {LEASE_S}, {kills} SIGKILLs: from the kill to the next attempt journaled on the other replica p50 {:.2} s, min {:.2} s, max {:.2} s",
        median(takeovers).as_secs_f64(),
        sorted.first().unwrap().as_secs_f64(),
        sorted.last().unwrap().as_secs_f64()
    );
    b.terminate();
}
