//! Codex turn latency (issue 15), written up in `docs/PERFORMANCE.md`: the real `codex`
//! CLI (0.169.0, app-server) against the fake Responses API on loopback, side by side
//! in one run:
//! - the bare CLI: a new app-server per turn that resumes the thread (cold), and one
//!   app-server serving every turn of the thread (warm), driven by a minimal JSON-RPC
//!   client;
//! - turnstile's runtime (embedding API, durable journal) with the Codex harness: cold
//!   (no warm pool: every turn starts the app-server and restores the rollout from the
//!   journal) and warm (the pool);
//! - the runtime's own overhead: its median minus the bare CLI's, cold and warm.
//!
//! `cargo bench -p turnstile-tests --bench codex` (needs the CLI: the README's test
//! command installs it). Knobs: `BENCH_COLD_TURNS` (9), `BENCH_WARM_TURNS` (41).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use turnstile_actors::{AgentSpec, Multitask, RetryPolicy, Runtime, RuntimeConfig, StartRun};
use turnstile_harness::codex::{CodexHarness, CodexOptions};
use turnstile_journal::SessionId;
use turnstile_projections::RunStatus;
use turnstile_tests::codex::codex_bin;
use turnstile_tests::fake_openai::FakeOpenAi;
use turnstile_tests::{knob, median};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The options turnstile's harness runs with, which the bare client's home copies.
fn options(bin: &Path, fake: &FakeOpenAi, dir: &Path, state: &str, warm: usize) -> CodexOptions {
    let mut options = CodexOptions::new(bin, dir.join("work"), dir.join(state));
    options.model = "gpt-test".into();
    options.base_url = Some(fake.base_url.clone());
    options.sandbox = "danger-full-access".into();
    options.env.insert("OPENAI_API_KEY".into(), "bench".into());
    options
        .env
        .insert("HOME".into(), dir.join("home").display().to_string());
    options.warm_processes = warm;
    options
}

/// A bare app-server and a minimal client for it.
struct AppServer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl AppServer {
    fn start(bin: &Path, home: &Path, dir: &Path) -> AppServer {
        let mut child = Command::new(bin)
            .arg("app-server")
            .current_dir(dir.join("work"))
            .env("CODEX_HOME", home)
            .env("OPENAI_API_KEY", "bench")
            .env("HOME", dir.join("home"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut server = AppServer {
            child,
            stdin,
            stdout,
            next: 0,
        };
        server.call(
            "initialize",
            json!({"clientInfo": {"name": "bench", "title": null, "version": "0"},
                   "capabilities": {"experimentalApi": true}}),
        );
        server.send(&json!({"method": "initialized"}));
        server
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        assert!(
            self.stdout.read_line(&mut line).unwrap() > 0,
            "the app-server exited"
        );
        serde_json::from_str(&line).unwrap_or(Value::Null)
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.send(&json!({"id": id, "method": method, "params": params}));
        loop {
            let message = self.read();
            if message["id"] == id && message.get("method").is_none() {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return message["result"].clone();
            }
        }
    }

    fn turn(&mut self, thread: &str, text: &str) {
        self.call(
            "turn/start",
            json!({"threadId": thread, "input": [{"type": "text", "text": text, "text_elements": []}]}),
        );
        loop {
            let message = self.read();
            if message["method"] == "turn/completed" {
                assert_eq!(
                    message["params"]["turn"]["status"], "completed",
                    "{message}"
                );
                return;
            }
        }
    }
}

impl Drop for AppServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bare_home(fake: &FakeOpenAi, dir: &Path, bin: &Path, name: &str) -> std::path::PathBuf {
    let home = dir.join(name);
    std::fs::create_dir_all(&home).unwrap();
    let codex = turnstile_harness::codex::Codex::from(options(bin, fake, dir, name, 0));
    std::fs::write(home.join("config.toml"), codex.config_toml()).unwrap();
    home
}

fn thread_params(dir: &Path) -> Value {
    json!({"cwd": dir.join("work"), "model": "gpt-test", "sandbox": "danger-full-access",
           "approvalPolicy": "never", "historyMode": "legacy"})
}

fn bare_cold(bin: &Path, fake: &FakeOpenAi, dir: &Path, turns: usize) -> Duration {
    let home = bare_home(fake, dir, bin, "bare-cold");
    let thread = {
        let mut server = AppServer::start(bin, &home, dir);
        let thread = server.call("thread/start", thread_params(dir))["thread"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        server.turn(&thread, "turn start\n@reply ok");
        thread
    };
    let samples = (0..turns)
        .map(|n| {
            let started = Instant::now();
            let mut server = AppServer::start(bin, &home, dir);
            let mut params = thread_params(dir);
            params["threadId"] = json!(thread);
            server.call("thread/resume", params);
            server.turn(&thread, &format!("turn {n}\n@reply ok"));
            started.elapsed()
        })
        .collect();
    median(samples)
}

fn bare_warm(bin: &Path, fake: &FakeOpenAi, dir: &Path, turns: usize) -> Duration {
    let home = bare_home(fake, dir, bin, "bare-warm");
    let mut server = AppServer::start(bin, &home, dir);
    let thread = server.call("thread/start", thread_params(dir))["thread"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    server.turn(&thread, "turn start\n@reply ok");
    let samples = (0..turns)
        .map(|n| {
            let started = Instant::now();
            server.turn(&thread, &format!("turn {n}\n@reply ok"));
            started.elapsed()
        })
        .collect();
    median(samples)
}

fn runtime(bin: &Path, fake: &FakeOpenAi, dir: &Path, warm: usize) -> Runtime {
    let options = options(bin, fake, dir, &format!("state-{warm}"), warm);
    let agent = AgentSpec {
        id: "codex".into(),
        name: "Codex".into(),
        description: String::new(),
        harness: Arc::new(CodexHarness::new(options)),
        retry: RetryPolicy::default(),
        cwd: dir.join("work"),
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

async fn runtime_turns(runtime: &Runtime, turns: usize) -> Duration {
    let mut samples = Vec::new();
    // The first turn starts the thread: not a sample.
    for n in 0..=turns {
        let started = Instant::now();
        let view = runtime
            .start_run(StartRun {
                agent_id: "codex".into(),
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
        if n > 0 {
            samples.push(started.elapsed());
        }
    }
    median(samples)
}

#[tokio::main]
async fn main() {
    let Some(bin) = codex_bin() else {
        eprintln!("no codex CLI: run the README's test command first");
        return;
    };
    let cold_turns = knob("BENCH_COLD_TURNS", 9);
    let warm_turns = knob("BENCH_WARM_TURNS", 41);
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("work")).unwrap();
    std::fs::create_dir_all(dir.path().join("home")).unwrap();
    let version = Command::new(&bin).arg("--version").output().unwrap();
    println!("{}", String::from_utf8_lossy(&version.stdout).trim());

    let bare_cold = bare_cold(&bin, &fake, dir.path(), cold_turns);
    let cold_runtime = runtime(&bin, &fake, dir.path(), 0);
    let turnstile_cold = runtime_turns(&cold_runtime, cold_turns).await;
    cold_runtime.shutdown().await.unwrap();
    let bare_warm = bare_warm(&bin, &fake, dir.path(), warm_turns);
    let warm_runtime = runtime(&bin, &fake, dir.path(), 4);
    let turnstile_warm = runtime_turns(&warm_runtime, warm_turns).await;
    warm_runtime.shutdown().await.unwrap();

    println!("| turn | bare CLI | turnstile | overhead | turns |");
    println!("|---|---|---|---|---|");
    println!(
        "| cold (an app-server per turn, thread resumed) | {:.0} ms | {:.0} ms | {:+.1} ms | {cold_turns} |",
        ms(bare_cold),
        ms(turnstile_cold),
        ms(turnstile_cold) - ms(bare_cold)
    );
    println!(
        "| warm (one app-server) | {:.1} ms | {:.1} ms | {:+.1} ms | {warm_turns} |",
        ms(bare_warm),
        ms(turnstile_warm),
        ms(turnstile_warm) - ms(bare_warm)
    );
    println!("medians; turnstile's cold turns also restore the rollout from the journal");
}
