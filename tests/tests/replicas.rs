//! Two real `turnstile serve` processes on one real PostgreSQL (issue 16): one turn per
//! session across replicas, FIFO across replicas, a session resumed on the other
//! replica (scripted, and the real Claude Code CLI), streams and cancels that reach a
//! run on the other replica, and a replica killed or stopped past its lease whose runs
//! the other resolves, each exactly once, while a client attached to the other follows
//! the run to its end and the stopped one's late writes are refused; a replica that starts
//! while another makes sessions lists every one of them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_tests::{
    Server, event_types, get_json, parse_sse, post_form, post_form_json, quick_turn,
    turnstile_in_ok,
};

/// Two replicas of one cluster: a database and a configuration file (2 s leases).
struct Cluster {
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    url: String,
}

impl Cluster {
    fn new(retries: u32) -> Option<Cluster> {
        let url = turnstile_tests::postgres::database()?;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("cluster.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nmax_concurrent_runs = 8\n\n[journal]\nbackend = \"postgres\"\nurl = \"{url}\"\nlease_s = 2\n\n\
                 [[agents]]\nid = \"scripted\"\nharness = \"scripted\"\nretries = {retries}\ndelay_between_retries_s = 0\n"
            ),
        )
        .unwrap();
        Some(Cluster { dir, config, url })
    }

    /// A replica with a data directory of its own.
    fn replica(&self, name: &str) -> Server {
        Server::start_with(
            &self.dir.path().join(name),
            &["--config", self.config.to_str().unwrap()],
        )
    }

    /// The journal's records as an export (read from the database by the CLI).
    fn export(&self) -> Vec<Value> {
        let text = turnstile_in_ok(
            self.dir.path(),
            &[
                "journal",
                "export",
                "--config",
                self.config.to_str().unwrap(),
            ],
        );
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    fn verify(&self) -> String {
        turnstile_in_ok(
            self.dir.path(),
            &[
                "journal",
                "verify",
                "--config",
                self.config.to_str().unwrap(),
            ],
        )
    }
}

async fn background(server: &Server, session: &str, message: &str) -> String {
    let accepted = post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", message),
            ("session_id", session),
            ("stream", "false"),
            ("background", "true"),
        ],
    )
    .await;
    accepted["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{accepted}"))
        .to_owned()
}

async fn run_status(server: &Server, run_id: &str, session: &str) -> Value {
    get_json(
        server,
        &format!("/agents/scripted/runs/{run_id}?session_id={session}"),
    )
    .await
}

async fn wait_for_end(server: &Server, run_id: &str, session: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let run = run_status(server, run_id, session).await;
        if matches!(
            run["status"].as_str(),
            Some("COMPLETED" | "ERROR" | "CANCELLED")
        ) {
            return run;
        }
        assert!(Instant::now() < deadline, "run {run_id} did not end: {run}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A stream's events, each once and in order (its frames' ids are event indexes).
fn assert_gap_free(frames: &[turnstile_tests::Frame]) {
    let indexes: Vec<i64> = frames
        .iter()
        .filter_map(|frame| frame.id.as_deref()?.parse().ok())
        .collect();
    assert!(
        indexes.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "each event once, in order: {indexes:?}"
    );
}

/// The kind of each record's event (its externally tagged name).
fn kind(record: &Value) -> &str {
    record["event"]
        .as_object()
        .and_then(|event| event.keys().next())
        .map(String::as_str)
        .unwrap_or("")
}

fn run_of(record: &Value) -> Option<&str> {
    record["event"]
        .as_object()
        .and_then(|event| event.values().next())
        .and_then(|body| body["run_id"].as_str())
}

/// Terminal events per run in the journal.
fn endings(export: &[Value]) -> HashMap<String, usize> {
    let mut endings = HashMap::new();
    for record in export {
        if matches!(kind(record), "RunCompleted" | "RunFailed" | "RunCancelled")
            && let Some(run) = run_of(record)
        {
            *endings.entry(run.to_owned()).or_default() += 1;
        }
    }
    endings
}

/// A session's turns sent to each replica in turn, each as soon as the last answered:
/// the append that ends a turn gives the lease back, so the other replica takes the next
/// at once, and a replica whose actor lived on takes the lease again and reads what the
/// other wrote before it acts. Each turn completes (a turn accepted by an actor behind
/// the other replica's records was once left pending forever, ~1 in 30 turns).
#[tokio::test]
async fn turns_alternating_between_replicas_each_complete_at_once() {
    let Some(cluster) = Cluster::new(0) else {
        return;
    };
    let replicas = [cluster.replica("a"), cluster.replica("b")];
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut turns = 0;
    for session in 0..15 {
        let session = format!("alternate-{session}");
        for n in 0..11 {
            let server = &replicas[n % 2];
            let run: Value = client
                .post(server.url("/agents/scripted/runs"))
                .form(&[
                    ("message", "hi"),
                    ("session_id", session.as_str()),
                    ("stream", "false"),
                ])
                .send()
                .await
                .unwrap_or_else(|error| panic!("turn {n} of {session}: {error}"))
                .json()
                .await
                .unwrap();
            assert_eq!(run["status"], "COMPLETED", "turn {n} of {session}: {run}");
            turns += 1;
        }
    }
    assert_eq!(turns, 165);
    let [a, b] = replicas;
    a.terminate();
    b.terminate();
    let export = cluster.export();
    let endings = endings(&export);
    assert_eq!(endings.len(), 165);
    assert!(endings.values().all(|count| *count == 1), "{endings:?}");
    assert!(cluster.verify().starts_with("journal ok"));
}

/// A replica lists every session another one made while it was starting: its directory
/// follows the others from the journal's position taken before it loaded. It once
/// followed from wherever the journal was after loading, so what the other replica made
/// meanwhile was never listed (1,000 sessions make the load long enough to see it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_lists_the_sessions_another_made_while_it_started() {
    let Some(cluster) = Cluster::new(0) else {
        return;
    };
    let a = cluster.replica("a");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let before = 1_000;
    futures::StreamExt::for_each_concurrent(futures::stream::iter(0..before), 32, |n| {
        let (client, base) = (client.clone(), a.base.clone());
        async move { quick_turn(&client, &base, &format!("before-{n}")).await }
    })
    .await;
    // A keeps making sessions while B starts, and a little after.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let maker = {
        let (client, base, stop) = (client.clone(), a.base.clone(), stop.clone());
        tokio::spawn(async move {
            let mut made = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                quick_turn(&client, &base, &format!("during-{made}")).await;
                made += 1;
            }
            made
        })
    };
    let (data_dir, config) = (cluster.dir.path().join("b"), cluster.config.clone());
    let b = tokio::task::spawn_blocking(move || {
        Server::start_with(&data_dir, &["--config", config.to_str().unwrap()])
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let during = maker.await.unwrap();
    assert!(during > 0, "A made no session while B started");
    let made = before + during;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = get_json(&b, "/sessions?limit=1").await;
        if listed["meta"]["total_count"] == made {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B lists {} of the {made} sessions A made ({during} while B started)",
            listed["meta"]["total_count"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.terminate();
    b.terminate();
}

/// What one replica lists and counts, the other lists and counts the same: sessions made
/// there (its directory folds them from their first record), later turns on them (read
/// once, then folded), deletions, and a session that moved from one replica to the other;
/// and so does a replica that starts afterwards (its directory loaded from stored forms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_replica_lists_and_counts_what_one_did() {
    let Some(cluster) = Cluster::new(0) else {
        return;
    };
    let (a, b) = (cluster.replica("a"), cluster.replica("b"));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    futures::StreamExt::for_each_concurrent(futures::stream::iter(0..40), 8, |n| {
        let (client, base) = (client.clone(), a.base.clone());
        async move { quick_turn(&client, &base, &format!("made-{n}")).await }
    })
    .await;
    for n in 0..15 {
        quick_turn(&client, &a.base, &format!("made-{n}")).await;
    }
    for n in 35..40 {
        let deleted = client
            .delete(format!("{}/sessions/made-{n}", a.base))
            .send()
            .await
            .unwrap();
        assert!(deleted.status().is_success(), "{}", deleted.status());
    }
    quick_turn(&client, &b.base, "moved").await;
    quick_turn(&client, &a.base, "moved").await;
    let view = |server: &Server| {
        let (client, base) = (client.clone(), server.base.clone());
        async move {
            let get = |path: &str| {
                let (client, url) = (client.clone(), format!("{base}{path}"));
                async move {
                    let body: Value = client.get(url).send().await.unwrap().json().await.unwrap();
                    body
                }
            };
            let mut sessions = get("/sessions?limit=100").await["data"].clone();
            if let Some(listed) = sessions.as_array_mut() {
                listed.sort_by_key(|session| session["session_id"].to_string());
            }
            (sessions, get("/metrics").await)
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (on_a, on_b) = (view(&a).await, view(&b).await);
        assert_eq!(on_a.0.as_array().map(Vec::len), Some(36), "{}", on_a.0);
        if on_a == on_b {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B lists or counts differently from A:\nA {on_a:?}\nB {on_b:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A replica that starts now loads the same from the stored forms.
    let c = cluster.replica("c");
    assert_eq!(
        view(&c).await,
        view(&a).await,
        "C loaded differently from A"
    );
    a.terminate();
    b.terminate();
    c.terminate();
}

#[tokio::test]
async fn a_busy_session_is_refused_on_the_other_replica_and_its_next_turn_resumes_there() {
    let Some(cluster) = Cluster::new(0) else {
        return;
    };
    let a = cluster.replica("a");
    let b = cluster.replica("b");
    let first = post_form_json(
        &a,
        "/agents/scripted/runs",
        &[
            ("message", "remember the blue door"),
            ("session_id", "s1"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(first["content"], "echo: remember the blue door", "{first}");
    // B lists the session A created (its directory follows the other replicas).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let listed = get_json(&b, "/sessions").await;
        if listed.to_string().contains("\"s1\"") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B never listed A's session: {listed}\nB's log:\n{}",
            b.logs().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Turn 2 on the other replica resumes the session from the journal.
    let second = post_form_json(
        &b,
        "/agents/scripted/runs",
        &[
            ("message", "what did I say?\n/history"),
            ("session_id", "s1"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(
        second["content"], "remember the blue door\nwhat did I say?",
        "{second}"
    );

    // A long turn on A: B refuses a second one with the same 409, naming A's run.
    let long = background(&a, "s1", "/sleep 1500\nlong").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = post_form(
        &b,
        "/agents/scripted/runs",
        &[
            ("message", "now"),
            ("session_id", "s1"),
            ("stream", "false"),
        ],
    )
    .await;
    let status = refused.status();
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        status,
        409,
        "{body}\nA: {:#?}\nB: {:#?}",
        a.logs(),
        b.logs()
    );
    assert_eq!(body["error_type"], "session_busy", "{body}");
    assert_eq!(body["run_id"], long.as_str(), "{body}");
    let ended = wait_for_end(&a, &long, "s1", Duration::from_secs(10)).await;
    assert_eq!(ended["status"], "COMPLETED");
    a.terminate();
    b.terminate();
    assert!(cluster.verify().starts_with("journal ok"));
}

#[tokio::test]
async fn background_runs_sent_to_both_replicas_run_one_at_a_time_in_order() {
    let Some(cluster) = Cluster::new(0) else {
        return;
    };
    let a = cluster.replica("a");
    let b = cluster.replica("b");
    let mut runs = Vec::new();
    for i in 0..8 {
        let server = if i % 2 == 0 { &a } else { &b };
        runs.push(background(server, "fifo", &format!("/sleep 50\nturn {i}")).await);
    }
    for run in &runs {
        let ended = wait_for_end(&a, run, "fifo", Duration::from_secs(20)).await;
        assert_eq!(ended["status"], "COMPLETED", "{ended}");
    }
    a.terminate();
    b.terminate();
    let export = cluster.export();
    // In journal order: each run starts after the one before ended, in submission order.
    let mut order = Vec::new();
    let mut running: Option<String> = None;
    for record in &export {
        match kind(record) {
            "RunStarted" => {
                assert!(
                    running.is_none(),
                    "two runs of one session running at once: {running:?}"
                );
                let run = run_of(record).unwrap().to_owned();
                order.push(run.clone());
                running = Some(run);
            }
            "RunCompleted" | "RunFailed" | "RunCancelled" => running = None,
            "AttemptStarted" => {
                let body = &record["event"]["AttemptStarted"];
                assert_eq!(body["attempt"], 1, "a queued turn spent no attempt");
            }
            _ => {}
        }
    }
    assert_eq!(order, runs, "first in, first out across replicas");
    assert!(endings(&export).values().all(|count| *count == 1));
}

#[tokio::test]
async fn a_run_on_one_replica_streams_and_cancels_from_the_other() {
    let Some(cluster) = Cluster::new(0) else {
        return;
    };
    let a = cluster.replica("a");
    let b = cluster.replica("b");
    let run = background(
        &a,
        "live",
        "/tool Read {\"file\":\"a\"}\n/sleep 300\n/tool Read {\"file\":\"b\"}\n/sleep 300\ndone",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Re-attached on B while it runs on A: every event once, in order, to the end.
    let response = post_form(
        &b,
        &format!("/agents/scripted/runs/{run}/resume"),
        &[("session_id", "live")],
    )
    .await;
    assert_eq!(response.status(), 200);
    let frames = parse_sse(&response.text().await.unwrap());
    let types = event_types(&frames);
    assert_eq!(types.last(), Some(&"RunCompleted"), "{types:?}");
    assert_eq!(
        types.iter().filter(|t| **t == "ToolCallCompleted").count(),
        2,
        "{types:?}"
    );
    assert_gap_free(&frames);

    // A long run on A, cancelled from B: it ends within a second.
    let long = background(&a, "cancel", "/tool Bash {}\n/sleep 30000\nnever").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let cancelled = post_form(
        &b,
        &format!("/agents/scripted/runs/{long}/cancel"),
        &[("session_id", "cancel")],
    )
    .await;
    assert_eq!(cancelled.status(), 200);
    let ended = wait_for_end(&b, &long, "cancel", Duration::from_secs(5)).await;
    let took = started.elapsed();
    assert_eq!(ended["status"], "CANCELLED", "{ended}");
    assert!(took < Duration::from_secs(1), "cancel took {took:?}");
    a.terminate();
    b.terminate();
    assert!(cluster.verify().starts_with("journal ok"));
}

#[tokio::test]
async fn a_killed_replicas_run_is_finished_by_the_other_exactly_once() {
    let Some(cluster) = Cluster::new(1) else {
        return;
    };
    let a = cluster.replica("a");
    let b = cluster.replica("b");
    let run = background(&a, "crash", "/sleep 1500\nsurvived").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A client attached on B while the run executes on A follows it through A's death
    // to its end.
    let attached = {
        let url = b.url(&format!("/agents/scripted/runs/{run}/resume"));
        tokio::spawn(async move {
            let response = turnstile_tests::http_client()
                .post(url)
                .form(&[("session_id", "crash")])
                .send()
                .await
                .unwrap();
            parse_sse(&response.text().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    a.kill();
    // B takes the session once A's lease (2 s) lapses, and gives the run its second
    // attempt.
    let ended = wait_for_end(&b, &run, "crash", Duration::from_secs(15)).await;
    assert_eq!(ended["status"], "COMPLETED", "{ended}");
    assert_eq!(ended["content"], "echo: survived");
    let frames = attached.await.unwrap();
    let types = event_types(&frames);
    assert_eq!(types.last(), Some(&"RunCompleted"), "{types:?}");
    assert_gap_free(&frames);
    b.terminate();
    let export = cluster.export();
    assert_eq!(endings(&export).get(&run), Some(&1));
    let attempts: Vec<_> = export
        .iter()
        .filter(|record| kind(record) == "AttemptStarted")
        .map(|record| record["event"]["AttemptStarted"]["attempt"].clone())
        .collect();
    assert_eq!(attempts, [1, 2]);
    assert!(cluster.verify().starts_with("journal ok"));
}

#[tokio::test]
async fn a_replica_stopped_past_its_lease_is_fenced_and_writes_nothing_more() {
    let Some(cluster) = Cluster::new(1) else {
        return;
    };
    let a = cluster.replica("a");
    let b = cluster.replica("b");
    let run = background(&a, "paused", "/sleep 1500\nafter the pause").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stop = |signal: &str| {
        std::process::Command::new("kill")
            .args([signal, &a.pid().to_string()])
            .status()
            .unwrap()
    };
    stop("-STOP");
    let ended = wait_for_end(&b, &run, "paused", Duration::from_secs(15)).await;
    assert_eq!(ended["status"], "COMPLETED", "{ended}");
    let before = cluster.export().len();
    stop("-CONT");
    // A wakes up believing it holds the session: its first write is refused, and it
    // stops working on it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let export = cluster.export();
    assert_eq!(
        export.len(),
        before,
        "nothing written after the takeover by the stopped replica: {:?}",
        &export[before..]
    );
    assert_eq!(endings(&export).get(&run), Some(&1));
    assert!(
        // The messages, not a module path (`session::leases`) that also says "lease".
        a.logs()
            .iter()
            .any(|line| line.contains("lost its leases") || line.contains("lease lost")),
        "A says it lost the lease: {:?}",
        a.logs()
    );
    // Both replicas serve the session afterwards.
    let next = post_form_json(
        &a,
        "/agents/scripted/runs",
        &[
            ("message", "again"),
            ("session_id", "paused"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(next["content"], "echo: again", "{next}");
    a.terminate();
    b.terminate();
    assert!(cluster.verify().starts_with("journal ok"));
    let _ = &cluster.url;
}

/// The real Claude Code CLI on two replicas: turn 1 on A, turn 2 on B, whose CLI starts
/// from the journal's transcript alone (each replica has a data directory of its own,
/// so B has none of A's CLI files), and the fake model receives the whole history.
#[tokio::test]
async fn a_claude_session_started_on_one_replica_resumes_on_the_other() {
    let Some(bin) = turnstile_tests::claude::claude_bin() else {
        return;
    };
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let fake = turnstile_tests::fake_anthropic::FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    let config = turnstile_tests::claude::claude_config(
        dir.path(),
        &bin,
        &fake,
        &format!("\n[journal]\nbackend = \"postgres\"\nurl = \"{url}\"\nlease_s = 2"),
        "warm_processes = 0",
    );
    let config = config.to_str().unwrap();
    let a = Server::start_with(&dir.path().join("a"), &["--config", config]);
    let b = Server::start_with(&dir.path().join("b"), &["--config", config]);
    let turn = |server: &Server, message: &str| {
        let form = [
            ("message", message.to_owned()),
            ("session_id", "claude-s".to_owned()),
            ("stream", "false".to_owned()),
        ];
        let url = server.url("/agents/claude/runs");
        async move {
            turnstile_tests::http_client()
                .post(url)
                .form(&form)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let first = turn(
        &a,
        "The secret is KIWI-42.\n@bash echo tool-said-MANGO\n@reply noted",
    )
    .await;
    assert_eq!(first["status"], "COMPLETED", "{first}");
    let second = turn(&b, "on the other replica\n@reply second answer").await;
    assert_eq!(second["status"], "COMPLETED", "{second}");
    let seen = fake
        .last_request_with("on the other replica")
        .conversation_text();
    for earlier in ["KIWI-42", "tool-said-MANGO", "noted"] {
        assert!(
            seen.contains(earlier),
            "the model did not see {earlier:?}: {seen}"
        );
    }
    a.terminate();
    b.terminate();
}
