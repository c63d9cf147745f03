//! Token checks against the API key (issue 31), side by side in one run, written up in
//! `docs/PERFORMANCE.md`: two servers of the release build on the same machine, one
//! with the API key and one with `[auth] mode = "jwt"` (RS256, agno's default, and
//! per-user isolation on), driven in alternating rounds so that both see the same
//! machine noise:
//! - quick turns per second over HTTP (the scripted harness, durable), a new session
//!   each, `BENCH_AUTH_CONNECTIONS` at once;
//! - reads per second of one run (`GET /agents/scripted/runs/{id}`), where the check is
//!   the largest part of the request.
//!
//! `cargo bench -p turnstile-tests --bench auth`. Knobs: `BENCH_AUTH_ROUNDS` (5),
//! `BENCH_AUTH_TURNS` (2000 per round), `BENCH_AUTH_READS` (20000 per round),
//! `BENCH_AUTH_CONNECTIONS` (64). Not a test: nothing is asserted beyond the requests
//! succeeding.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde_json::Value;
use turnstile_tests::tokens::{claims, rsa};
use turnstile_tests::{Server, knob, median};

/// `count` requests over `connections` connections; returns requests per second.
async fn rate(
    count: usize,
    connections: usize,
    request: impl Fn(usize) -> reqwest::RequestBuilder + Send + Sync + 'static,
) -> f64 {
    let request = Arc::new(request);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (request, next) = (request.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= count {
                        break;
                    }
                    let response = request(n).send().await.unwrap();
                    assert!(response.status().is_success(), "{}", response.status());
                    response.bytes().await.unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    count as f64 / started.elapsed().as_secs_f64()
}

struct Side {
    server: Server,
    credential: String,
    run: String,
}

#[tokio::main]
async fn main() {
    let rounds = knob("BENCH_AUTH_ROUNDS", 5);
    let turns = knob("BENCH_AUTH_TURNS", 2_000);
    let reads = knob("BENCH_AUTH_READS", 20_000);
    let connections = knob("BENCH_AUTH_CONNECTIONS", 64);
    let dir = tempfile::tempdir().unwrap();
    let server_lines =
        format!("[server]\nmax_concurrent_runs = {connections}\nmax_queued_runs = 1000000\n");
    let key_config = dir.path().join("key.toml");
    std::fs::write(&key_config, &server_lines).unwrap();
    let keys = rsa();
    let jwt_config = dir.path().join("jwt.toml");
    std::fs::write(
        &jwt_config,
        format!(
            "{server_lines}\n[auth]\nmode = \"jwt\"\nuser_isolation = true\nverification_keys = ['''\n{}''']\n",
            keys.public_pem
        ),
    )
    .unwrap();
    let api_key = "bench-api-key-0123456789";
    let token = keys.sign(
        None,
        &claims(
            Some("bench-user"),
            &["agents:read", "agents:run", "sessions:read"],
        ),
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()
        .unwrap();
    let mut sides = Vec::new();
    for (name, config, env, credential) in [
        (
            "API key",
            &key_config,
            vec![("TURNSTILE_API_KEY", api_key)],
            api_key.to_owned(),
        ),
        (
            "token (RS256, isolation)",
            &jwt_config,
            vec![],
            token.clone(),
        ),
    ] {
        let server = Server::start_with_env(
            &dir.path().join(name.split(' ').next().unwrap()),
            &["--config", config.to_str().unwrap()],
            &env,
        );
        let first: Value = client
            .post(server.url("/agents/scripted/runs"))
            .bearer_auth(&credential)
            .form(&[("message", "hello"), ("stream", "false")])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let run = first["run_id"].as_str().unwrap().to_owned();
        sides.push(Side {
            server,
            credential,
            run,
        });
    }
    println!(
        "## Token checks against the API key ({rounds} rounds, alternating; {turns} quick turns and {reads} reads a round, {connections} connections)\n"
    );
    println!(
        "| round | turns/s, API key | turns/s, token | ratio | reads/s, API key | reads/s, token | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let (mut turn_ratios, mut read_ratios) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which side goes first, so neither always has the warmer machine.
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1]
        } else {
            vec![1, 0]
        };
        let mut results = [(0.0, 0.0); 2];
        for &i in &order {
            let side = &sides[i];
            let (base, credential) = (side.server.base.clone(), side.credential.clone());
            let client_turns = client.clone();
            let turn_rate = rate(turns, connections, move |n| {
                client_turns
                    .post(format!("{base}/agents/scripted/runs"))
                    .bearer_auth(&credential)
                    .form(&[
                        ("message", "hello"),
                        ("session_id", &format!("r{round}-{n}")),
                        ("stream", "false"),
                    ])
            })
            .await;
            let (base, credential, run) = (
                side.server.base.clone(),
                side.credential.clone(),
                side.run.clone(),
            );
            let client_reads = client.clone();
            let read_rate = rate(reads, connections, move |_| {
                client_reads
                    .get(format!("{base}/agents/scripted/runs/{run}"))
                    .bearer_auth(&credential)
            })
            .await;
            results[i] = (turn_rate, read_rate);
        }
        let [(key_turns, key_reads), (token_turns, token_reads)] = results;
        turn_ratios.push(std::time::Duration::from_secs_f64(token_turns / key_turns));
        read_ratios.push(std::time::Duration::from_secs_f64(token_reads / key_reads));
        println!(
            "| {} | {key_turns:.0} | {token_turns:.0} | {:.3} | {key_reads:.0} | {token_reads:.0} | {:.3} |",
            round + 1,
            token_turns / key_turns,
            token_reads / key_reads
        );
    }
    println!(
        "\nMedian ratio, token over key: turns {:.3}, reads {:.3}.",
        median(turn_ratios).as_secs_f64(),
        median(read_ratios).as_secs_f64()
    );
    for side in sides {
        side.server.terminate();
    }
}
