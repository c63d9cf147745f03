//! Helpers for the cross-crate tests: the real `turnstile` binary on loopback with a
//! real data directory, SSE parsing, and CLI runs.
//!
//! Nothing here mocks a project crate: servers are the built binary, journals are
//! sled on a temporary directory.

pub mod claude;
pub mod codex;
pub mod console;
pub mod fake_anthropic;
pub mod fake_openai;
pub mod loopback;
pub mod otlp;
pub mod postgres;
pub mod tokens;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use turnstile_actors::{AgentSpec, Multitask, RetryPolicy, Runtime, RuntimeConfig, StartRun};
use turnstile_harness::ScriptedHarness;
use turnstile_journal::SessionId;

/// The `turnstile` binary of this workspace, built (once per test process) with the
/// same profile as the tests, so tests never run a stale binary.
pub fn turnstile_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test> -> target/<profile>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target profile dir")
            .to_path_buf();
        let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
        let mut build = Command::new(env!("CARGO"));
        build
            .args([
                "build",
                "--quiet",
                "-p",
                "turnstile-gateway",
                "--bin",
                "turnstile",
                "--target-dir",
            ])
            .arg(&target_dir);
        if profile_dir
            .file_name()
            .is_some_and(|name| name == "release")
        {
            build.arg("--release");
        }
        let status = build.status().expect("cargo build of the turnstile binary");
        assert!(status.success(), "building the turnstile binary failed");
        let bin = profile_dir.join("turnstile");
        assert!(bin.exists(), "no binary at {}", bin.display());
        bin
    })
    .clone()
}

/// Log lines a [`Server`] keeps.
pub const SERVER_LOG_LINES: usize = 10_000;

/// A `turnstile serve` process on a loopback port of its own choosing.
pub struct Server {
    child: Child,
    /// Its log lines (stderr), the newest [`SERVER_LOG_LINES`] of them.
    logs: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its data directory.
    pub data_dir: PathBuf,
}

impl Server {
    /// Starts the server on `data_dir` and waits until it listens.
    pub fn start(data_dir: &Path) -> Server {
        Server::start_with(data_dir, &[])
    }

    /// Starts the server with extra arguments (for example `--config FILE`).
    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Server {
        Server::start_with_env(data_dir, extra, &[])
    }

    /// Starts the server with extra arguments and environment variables.
    pub fn start_with_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(turnstile_bin());
        command
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .envs(env.iter().copied());
        Server::launch(command, data_dir)
    }

    /// Starts `turnstile serve --addr 127.0.0.1:0 EXTRA` as a user does, from `cwd`,
    /// with the paths of its configuration as written (the default data directory is
    /// `cwd/turnstile-data`).
    pub fn start_in(cwd: &Path, extra: &[&str]) -> Server {
        let mut command = Command::new(turnstile_bin());
        command
            .current_dir(cwd)
            .args(["serve", "--addr", "127.0.0.1:0"])
            .args(extra);
        Server::launch(command, &cwd.join("turnstile-data"))
    }

    /// Starts the server on `data_dir` with its descriptor limit (soft and hard) set to
    /// `nofile`, as a machine with a low `ulimit -n` runs it.
    pub fn start_limited(data_dir: &Path, extra: &[&str], nofile: u64) -> Server {
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--nofile={nofile}:{nofile}"))
            .arg(turnstile_bin())
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(extra);
        Server::launch(command, data_dir)
    }

    fn launch(mut command: Command, data_dir: &Path) -> Server {
        if !command.get_envs().any(|(key, _)| key == "RUST_LOG") {
            command.env("RUST_LOG", "info");
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn turnstile serve");
        let stderr = child.stderr.take().expect("stderr");
        let (sender, receiver) = std::sync::mpsc::channel();
        let logs = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let kept = logs.clone();
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    let _ = sender.send(addr);
                }
                if std::env::var_os("TURNSTILE_TEST_LOGS").is_some() {
                    eprintln!("[server] {line}");
                }
                if let Ok(mut kept) = kept.lock() {
                    if kept.len() == SERVER_LOG_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                }
            }
        });
        let addr = match receiver.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("turnstile serve did not start listening");
            }
        };
        Server {
            child,
            logs,
            base: format!("http://{addr}"),
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// The log lines it wrote so far (the newest [`SERVER_LOG_LINES`]).
    pub fn logs(&self) -> Vec<String> {
        self.logs
            .lock()
            .map(|logs| logs.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits for the exit; returns how long shutdown took.
    pub fn terminate(mut self) -> Duration {
        let started = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "turnstile serve exited with {status}");
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "turnstile serve ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, as [`Server::terminate`], then every line it logged, the last ones of
    /// its shutdown included.
    pub fn terminate_logs(self) -> Vec<String> {
        let logs = self.logs.clone();
        self.terminate();
        // The reader thread takes the last lines before the pipe's end.
        std::thread::sleep(Duration::from_millis(200));
        logs.lock()
            .map(|logs| logs.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// SIGKILL: the crash case.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// `id:` line.
    pub id: Option<String>,
    /// `event:` line.
    pub event: String,
    /// `data:` as JSON.
    pub data: serde_json::Value,
}

/// Parses an SSE body into frames (comments skipped).
pub fn parse_sse(body: &str) -> Vec<Frame> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut frame = Frame {
                id: None,
                event: String::new(),
                data: serde_json::Value::Null,
            };
            let mut data = String::new();
            for line in block.lines() {
                if let Some(value) = line
                    .strip_prefix("id: ")
                    .or_else(|| line.strip_prefix("id:"))
                {
                    frame.id = Some(value.to_owned());
                } else if let Some(value) = line
                    .strip_prefix("event: ")
                    .or_else(|| line.strip_prefix("event:"))
                {
                    frame.event = value.to_owned();
                } else if let Some(value) = line
                    .strip_prefix("data: ")
                    .or_else(|| line.strip_prefix("data:"))
                {
                    data.push_str(value);
                }
            }
            if frame.event.is_empty() && data.is_empty() {
                return None;
            }
            frame.data = serde_json::from_str(&data).unwrap_or(serde_json::Value::String(data));
            Some(frame)
        })
        .collect()
}

/// The event types of frames, in order.
pub fn event_types(frames: &[Frame]) -> Vec<&str> {
    frames.iter().map(|frame| frame.event.as_str()).collect()
}

/// Runs `turnstile ARGS` to completion.
pub fn turnstile(args: &[&str]) -> Output {
    Command::new(turnstile_bin())
        .args(args)
        .output()
        .expect("run turnstile")
}

/// Runs `turnstile ARGS` from `cwd`, as a user in that directory does; fails the test
/// unless it exits 0.
pub fn turnstile_in_ok(cwd: &Path, args: &[&str]) -> String {
    ok_stdout(args, turnstile_in(cwd, args))
}

/// Runs `turnstile ARGS` from `cwd`, as a user does with relative paths.
pub fn turnstile_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(turnstile_bin())
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("run turnstile")
}

/// `turnstile journal verify --config turnstile.toml` in `dir` (a stopped server's
/// configuration, relative paths from there) passes.
pub fn verify_journal(dir: &Path) {
    let out = turnstile_in(dir, &["journal", "verify", "--config", "turnstile.toml"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `turnstile ARGS` with `env` and without the test runner's `TURNSTILE_API_KEY`
/// (a client of a server: the key is what `env` says).
pub fn turnstile_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(turnstile_bin())
        .args(args)
        .env_remove("TURNSTILE_API_KEY")
        .envs(env.iter().copied())
        .output()
        .expect("run turnstile")
}

/// A loopback port free right now (bound, then let go).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Runs `turnstile ARGS`, fails the test unless it exits 0, and returns its stdout.
pub fn turnstile_ok(args: &[&str]) -> String {
    ok_stdout(args, turnstile(args))
}

fn ok_stdout(args: &[&str], out: Output) -> String {
    let stdout = lossy(&out.stdout);
    assert!(
        out.status.success(),
        "turnstile {args:?} failed: {stdout}{}",
        lossy(&out.stderr)
    );
    stdout
}

/// Polls `done` every 50 ms; fails the test naming `what` if it is not true within
/// `within`.
pub fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (at most 20 s) until the server reports `count` passivated sessions.
pub async fn wait_until_passivated(server: &Server, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let expected = format!("turnstile_sessions_passivated {count}");
    loop {
        let text = get_text(server, "/metrics/prometheus").await;
        if text.contains(&expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the sessions never passivated: {text}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Writes a configuration file with one scripted agent; `server` and `agent` are extra
/// TOML lines for `[server]` and the agent.
pub fn write_config(dir: &Path, server: &str, agent: &str) -> PathBuf {
    let path = dir.join("turnstile.toml");
    let text = format!(
        "[server]\n{server}\n\n[[agents]]\nid = \"scripted\"\nname = \"Scripted\"\nharness = \"scripted\"\n{agent}\n"
    );
    std::fs::write(&path, text).expect("write the configuration");
    path
}

/// An HTTP client for tests: a 30 s timeout, so a hung server fails the test.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("reqwest client")
}

/// The default bounds of a workspace's snapshots (`spec/workspaces.md`), default ignore
/// rules included.
pub fn workspace_bounds() -> turnstile_actors::workspace::Bounds {
    use turnstile_actors::workspace::{DEFAULT_IGNORE, Ignore};
    turnstile_actors::workspace::Bounds {
        max_bytes: 1 << 30,
        max_file_bytes: 64 << 20,
        max_files: 100_000,
        ignore: Ignore::new(&DEFAULT_IGNORE).expect("the default ignore rules"),
    }
}

/// Fills `root` with `files` files of `bytes` bytes in 100 directories, modified an hour
/// ago (older than a scan's racy window), for the workspace benchmarks.
pub fn populate_workspace(root: &Path, files: usize, bytes: usize) {
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    for n in 0..files {
        let path = root.join(format!("dir{:03}/file{n:05}.txt", n % 100));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("{n:>width$}", width = bytes)).unwrap();
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(an_hour_ago).unwrap();
    }
}

/// The scripted agent, with a retry policy.
pub fn scripted_agent(retry: RetryPolicy) -> AgentSpec {
    AgentSpec {
        id: "scripted".into(),
        name: "Scripted".into(),
        description: String::new(),
        harness: std::sync::Arc::new(ScriptedHarness),
        retry,
        cwd: std::env::temp_dir().join("turnstile-tests-workspace"),
        keep_uploads: false,
        workspace: turnstile_actors::Workspace::Shared,
        snapshots: None,
        approval: Default::default(),
    }
}

/// Where a test's runtime keeps its journal: sled in a temporary directory, or a fresh
/// database on the test PostgreSQL (with a temporary directory for the harnesses'
/// state). Opening it again reaches the same journal: a restart.
pub enum Store {
    /// The embedded default.
    Sled(tempfile::TempDir),
    /// PostgreSQL.
    Postgres {
        /// The harnesses' state.
        dir: tempfile::TempDir,
        /// The database.
        url: String,
    },
}

/// What opens a [`Store`]'s journal, to hand to another thread.
#[derive(Debug, Clone)]
pub enum JournalPlace {
    /// A sled data directory.
    Sled(PathBuf),
    /// A PostgreSQL URL.
    Postgres(String),
}

impl JournalPlace {
    /// Opens the journal.
    pub fn open(&self) -> turnstile_journal::Journal {
        match self {
            JournalPlace::Sled(dir) => {
                turnstile_journal::Journal::open(dir, turnstile_journal::JournalOptions::default())
                    .expect("open the sled journal")
            }
            JournalPlace::Postgres(url) => turnstile_journal::Journal::open_postgres(
                &turnstile_journal::PostgresOptions::new(url.clone()),
                turnstile_journal::JournalOptions::default(),
            )
            .expect("open the PostgreSQL journal"),
        }
    }
}

impl Store {
    /// A sled journal in a new temporary directory.
    pub fn sled() -> Store {
        Store::Sled(tempfile::tempdir().expect("a temporary directory"))
    }

    /// A fresh PostgreSQL database; `None` (skip) only outside CI without PostgreSQL.
    pub fn postgres() -> Option<Store> {
        Some(Store::Postgres {
            url: postgres::database()?,
            dir: tempfile::tempdir().expect("a temporary directory"),
        })
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        match self {
            Store::Sled(dir) | Store::Postgres { dir, .. } => dir.path(),
        }
    }

    /// What opens its journal directly.
    pub fn place(&self) -> JournalPlace {
        match self {
            Store::Sled(dir) => JournalPlace::Sled(dir.path().to_path_buf()),
            Store::Postgres { url, .. } => JournalPlace::Postgres(url.clone()),
        }
    }

    /// Its journal, opened directly (not through a runtime).
    pub fn journal(&self) -> turnstile_journal::Journal {
        self.place().open()
    }

    /// A runtime configuration on this store with `agents`.
    pub fn config(&self, agents: Vec<turnstile_actors::AgentSpec>) -> RuntimeConfig {
        let mut config = RuntimeConfig::new(self.path().to_path_buf(), agents);
        if let Store::Postgres { url, .. } = self {
            config.journal = turnstile_journal::JournalConfig::Postgres(
                turnstile_journal::PostgresOptions::new(url.clone()),
            );
        }
        config
    }
}

/// A runtime on `store` with the scripted agent, `slots` worker slots and a queue of
/// `queued`.
pub fn open_runtime_on(store: &Store, retry: RetryPolicy, slots: usize, queued: usize) -> Runtime {
    let mut config = store.config(vec![scripted_agent(retry)]);
    config.max_concurrent_runs = slots;
    config.max_queued_runs = queued;
    Runtime::open(config).expect("open the runtime")
}

/// Expands each named `async fn name(store: Store)` of the calling file into the tests
/// `sled::name` and `postgres::name`: one case, both backends, one binary.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sled {
            $(#[tokio::test] async fn $name() { super::$name($crate::Store::sled()).await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $name() {
                if let Some(store) = $crate::Store::postgres() { super::$name(store).await }
            })*
        }
    };
    (multi_thread: $($name:ident),* $(,)?) => {
        mod sled_multi_thread {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() {
                super::$name($crate::Store::sled()).await
            })*
        }
        mod postgres_multi_thread {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() {
                if let Some(store) = $crate::Store::postgres() { super::$name(store).await }
            })*
        }
    };
}

/// A runtime on `dir` with the scripted agent, `slots` worker slots and a queue of `queued`.
pub fn open_runtime(dir: &Path, retry: RetryPolicy, slots: usize, queued: usize) -> Runtime {
    let mut config = RuntimeConfig::new(dir.to_path_buf(), vec![scripted_agent(retry)]);
    config.max_concurrent_runs = slots;
    config.max_queued_runs = queued;
    Runtime::open(config).expect("open the runtime")
}

/// A turn for the scripted agent on session `session`.
pub fn start_command(session: &str, message: &str, multitask: Multitask) -> StartRun {
    StartRun {
        agent_id: "scripted".into(),
        session_id: Some(SessionId::parse(session).expect("session id")),
        user_id: None,
        message: message.into(),
        options: turnstile_actors::RunOptions {
            background: multitask == Multitask::Enqueue,
            ..Default::default()
        },
        multitask,
        idempotency_key: None,
        fork: None,
        attachments: Vec::new(),
        isolated: false,
    }
}

/// `GET path` on the server, its body as JSON.
pub async fn get_json(server: &Server, path: &str) -> serde_json::Value {
    http_client()
        .get(server.url(path))
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("a JSON body")
}

/// `GET path` on the server, its body as text.
pub async fn get_text(server: &Server, path: &str) -> String {
    http_client()
        .get(server.url(path))
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("a text body")
}

/// `POST path` on the server with a form body; the response.
pub async fn post_form(server: &Server, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
    http_client()
        .post(server.url(path))
        .form(form)
        .send()
        .await
        .expect("POST")
}

/// `POST path` on the server with a form body; its body as JSON.
pub async fn post_form_json(
    server: &Server,
    path: &str,
    form: &[(&str, &str)],
) -> serde_json::Value {
    post_form(server, path, form)
        .await
        .json()
        .await
        .expect("a JSON body")
}

/// The value of a sample in Prometheus text, by the name (and labels) it starts with.
pub fn prometheus_sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)
            .map(|v| v.trim().parse().expect("a number"))
    })
}

/// A process's output as text.
pub fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A benchmark knob: the environment variable `name` as a number, else `default`.
pub fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One quick turn (`hi`, `stream=false`) of the scripted agent on `session` at `base`
/// (a server's `http://127.0.0.1:PORT`), through `client` (shared, so connections are
/// reused); it must complete.
pub async fn quick_turn(client: &reqwest::Client, base: &str, session: &str) {
    let run: serde_json::Value = client
        .post(format!("{base}/agents/scripted/runs"))
        .form(&[
            ("message", "hi"),
            ("session_id", session),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap_or_else(|error| panic!("{session}: {error}"))
        .json()
        .await
        .expect("a JSON body");
    assert_eq!(run["status"], "COMPLETED", "{session}: {run}");
}

/// The median of some durations (zero for none).
pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// Runs a scripted turn of 5,000 tool calls (10,005 events) to its end, then re-attaches
/// to it `repeats` times with `POST /resume`: each request-to-last-frame time, sorted,
/// and the frames one re-attach received.
pub async fn reattach_to_a_long_run(server: &Server, repeats: usize) -> (Vec<Duration>, usize) {
    let message = "/tool Read {}\n".repeat(5_000);
    let run = post_form_json(
        server,
        "/agents/scripted/runs",
        &[("message", message.as_str()), ("stream", "false")],
    )
    .await;
    let run_id = run["run_id"].as_str().expect("a run id").to_owned();
    let client = reqwest::Client::new();
    let mut times = Vec::with_capacity(repeats);
    let mut frames = 0;
    for _ in 0..repeats {
        let started = Instant::now();
        let body = client
            .post(server.url(&format!("/agents/scripted/runs/{run_id}/resume")))
            .send()
            .await
            .expect("POST /resume")
            .text()
            .await
            .expect("an SSE body");
        times.push(started.elapsed());
        frames = parse_sse(&body).len();
    }
    times.sort();
    (times, frames)
}

/// A CLI the tests run: `$variable` when it names a file, else `installed` (relative to
/// the repository, where `.ci/run` puts it). Outside CI a missing CLI is `None` with a
/// note; under CI (`CI` set) it fails the test, never skips it.
pub fn installed_cli(name: &str, variable: &str, installed: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(variable).map(PathBuf::from)
        && path.exists()
    {
        return Some(path);
    }
    let installed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(installed);
    if installed.exists() {
        return Some(installed);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the {name} CLI is missing: .ci/run installs it; or set {variable}"
    );
    eprintln!("skipped: no {name} CLI (set {variable} or run .ci/run)");
    None
}

/// One row of `fixtures/hostile_requests.txt`.
pub struct HostileCase {
    /// The status it must get.
    pub status: u16,
    /// Its method.
    pub method: String,
    /// Its path and query.
    pub path: String,
    /// Its content type; without one, no body is sent.
    pub content_type: Option<String>,
    /// Its body.
    pub body: String,
    /// One header, name and value.
    pub header: Option<(String, String)>,
}

/// The rows of the hostile-request table (`fixtures/hostile_requests.txt`), its
/// placeholders filled in (`{run}` with `run`): requests that must get a clear 4xx and
/// change nothing, run against the real binary and through the router in process.
pub fn hostile_cases(run: &str) -> Vec<HostileCase> {
    let table = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hostile_requests.txt"),
    )
    .expect("the hostile-request table");
    let fill = |text: &str| {
        text.replace("{run}", run)
            .replace("{5MiB}", &"u".repeat(5 * 1024 * 1024))
            .replace("{200s}", &"s".repeat(200))
            .replace("{300k}", &"k".repeat(300))
    };
    let field = |text: &str| (text != "-").then(|| fill(text));
    table
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| {
            let fields: Vec<&str> = line.split(" | ").map(str::trim).collect();
            let [status, method, path, content_type, body, header] = fields[..] else {
                panic!("a row of six fields: {line}");
            };
            HostileCase {
                status: status.parse().unwrap(),
                method: method.to_owned(),
                path: fill(path),
                content_type: field(content_type),
                body: field(body).unwrap_or_default(),
                header: field(header).map(|header| {
                    let (name, value) = header.split_once(": ").unwrap();
                    (name.to_owned(), value.to_owned())
                }),
            }
        })
        .collect()
}
