//! Claude Code turn latency (issue 6), written up in `docs/PERFORMANCE.md`: the real
//! `claude` CLI against the fake Messages API on loopback, side by side in one run:
//! - the bare CLI: a process per turn (`claude -p`, cold) and one process serving
//!   turns over stream-json (warm);
//! - turnstile's runtime (embedding API, durable journal) with the Claude Code
//!   harness: cold (no warm pool: every turn starts the CLI and restores the
//!   transcript from the journal) and warm (the pool);
//! - the runtime's own overhead: its median minus the bare CLI's, cold and warm.
//!
//! `cargo bench -p turnstile-tests --bench claude` (needs the CLI: the README's test
//! command installs it). Knobs: `BENCH_COLD_TURNS` (9), `BENCH_WARM_TURNS` (41).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile_actors::{AgentSpec, Multitask, RetryPolicy, Runtime, RuntimeConfig, StartRun};
use turnstile_harness::{ClaudeCodeHarness, ClaudeCodeOptions};
use turnstile_journal::SessionId;
use turnstile_projections::RunStatus;
use turnstile_tests::claude::claude_bin;
use turnstile_tests::fake_anthropic::FakeAnthropic;
use turnstile_tests::{knob, median};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn cli(
    bin: &std::path::Path,
    fake: &FakeAnthropic,
    config: &std::path::Path,
    cwd: &std::path::Path,
) -> Command {
    let mut command = Command::new(bin);
    command
        .current_dir(cwd)
        .env("ANTHROPIC_BASE_URL", &fake.base_url)
        .env("ANTHROPIC_API_KEY", "bench")
        .env("CLAUDE_CONFIG_DIR", config)
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .args([
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            "claude-sonnet-4-6",
        ]);
    command
}

fn bare_cold(
    bin: &std::path::Path,
    fake: &FakeAnthropic,
    dir: &std::path::Path,
    turns: usize,
) -> Duration {
    let samples = (0..turns)
        .map(|n| {
            let started = Instant::now();
            let out = cli(bin, fake, &dir.join("bare-cold"), dir)
                .args(["-p", &format!("turn {n}\n@reply ok")])
                .output()
                .unwrap();
            assert!(String::from_utf8_lossy(&out.stdout).contains("\"subtype\":\"success\""));
            started.elapsed()
        })
        .collect();
    median(samples)
}

fn bare_warm(
    bin: &std::path::Path,
    fake: &FakeAnthropic,
    dir: &std::path::Path,
    turns: usize,
) -> Duration {
    let mut child = cli(bin, fake, &dir.join("bare-warm"), dir)
        .args([
            "-p",
            "--input-format",
            "stream-json",
            "--include-partial-messages",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut samples = Vec::new();
    // The first turn starts the process: not a warm sample.
    for n in 0..=turns {
        let started = Instant::now();
        let line = serde_json::json!({"type": "user", "message": {"role": "user", "content": format!("turn {n}\n@reply ok")}});
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut text = String::new();
        loop {
            text.clear();
            assert!(stdout.read_line(&mut text).unwrap() > 0, "the CLI exited");
            if text.starts_with("{\"type\":\"result\"") || text.contains("\"type\":\"result\"") {
                break;
            }
        }
        if n > 0 {
            samples.push(started.elapsed());
        }
    }
    drop(stdin);
    let _ = child.wait();
    median(samples)
}

fn runtime(
    bin: &std::path::Path,
    fake: &FakeAnthropic,
    dir: &std::path::Path,
    warm: usize,
) -> Runtime {
    let mut options = ClaudeCodeOptions::new(bin, dir, dir.join(format!("state-{warm}")));
    options
        .env
        .insert("ANTHROPIC_BASE_URL".into(), fake.base_url.clone());
    options
        .env
        .insert("ANTHROPIC_API_KEY".into(), "bench".into());
    options.warm_processes = warm;
    let agent = AgentSpec {
        id: "claude".into(),
        name: "Claude Code".into(),
        description: String::new(),
        harness: Arc::new(ClaudeCodeHarness::new(options)),
        retry: RetryPolicy::default(),
        cwd: dir.to_path_buf(),
        keep_uploads: false,
        workspace: turnstile_actors::Workspace::Shared,
        snapshots: None,
        approval: Default::default(),
    };
    Runtime::open(RuntimeConfig::new(
        dir.join(format!("data-{warm}")),
        vec![agent],
    ))
    .unwrap()
}

async fn runtime_turns(runtime: &Runtime, turns: usize, skip_first: bool) -> Duration {
    let mut samples = Vec::new();
    for n in 0..turns + usize::from(skip_first) {
        let started = Instant::now();
        let view = runtime
            .start_run(StartRun {
                agent_id: "claude".into(),
                session_id: Some(SessionId::parse("bench").unwrap()),
                user_id: None,
                message: format!("turn {n}\n@reply ok"),
                options: Default::default(),
                multitask: Multitask::Reject,
                idempotency_key: None,
                fork: None,
                attachments: Vec::new(),
                isolated: false,
            })
            .await
            .unwrap()
            .unwrap()
            .outcome()
            .await
            .unwrap();
        assert_eq!(view.status, RunStatus::Completed, "{:?}", view.error);
        if n > 0 || !skip_first {
            samples.push(started.elapsed());
        }
    }
    median(samples)
}

#[tokio::main]
async fn main() {
    let Some(bin) = claude_bin() else {
        eprintln!("no claude CLI: run the README's test command first");
        return;
    };
    let cold_turns = knob("BENCH_COLD_TURNS", 9);
    let warm_turns = knob("BENCH_WARM_TURNS", 41);
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let version = Command::new(&bin).arg("--version").output().unwrap();
    println!("claude {}", String::from_utf8_lossy(&version.stdout).trim());

    let bare_cold = bare_cold(&bin, &fake, dir.path(), cold_turns);
    let cold_runtime = runtime(&bin, &fake, dir.path(), 0);
    let turnstile_cold = runtime_turns(&cold_runtime, cold_turns, false).await;
    cold_runtime.shutdown().await.unwrap();
    let bare_warm = bare_warm(&bin, &fake, dir.path(), warm_turns);
    let warm_runtime = runtime(&bin, &fake, dir.path(), 4);
    let turnstile_warm = runtime_turns(&warm_runtime, warm_turns, true).await;
    warm_runtime.shutdown().await.unwrap();

    println!("| turn | bare CLI | turnstile | overhead | turns |");
    println!("|---|---|---|---|---|");
    println!(
        "| cold (a process per turn) | {:.0} ms | {:.0} ms | {:+.1} ms | {cold_turns} |",
        ms(bare_cold),
        ms(turnstile_cold),
        ms(turnstile_cold) - ms(bare_cold)
    );
    println!(
        "| warm (one process, stream-json) | {:.1} ms | {:.1} ms | {:+.1} ms | {warm_turns} |",
        ms(bare_warm),
        ms(turnstile_warm),
        ms(turnstile_warm) - ms(bare_warm)
    );
    println!(
        "medians; the turnstile cold turns grow with the session: each restores the whole transcript from the journal"
    );
}
