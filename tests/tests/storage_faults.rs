//! When storage fails (issue 27, `spec/faults.md`), the real binary on loopback:
//! - a message larger than `max_event_bytes` is `413 event_too_large` before anything is
//!   recorded, and the session is as before (it was a `500`, the next turn a `500` too,
//!   and the session's stream had lost its `SessionCreated`);
//! - a full disk and a read-only data directory (a small tmpfs, as root) are
//!   `503 journal_unavailable` with `Retry-After`, `/health` is `503` and
//!   `/health?live=1` `200`, and the same process serves again once the disk can write;
//! - a PostgreSQL outage under two replicas is `503` (it was a `500`), and both serve
//!   again once the database is back; every run ends exactly once.
//!
//! This binary has a PostgreSQL cluster of its own (stopped and started by one test).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use turnstile_tests::{Server, get_json, http_client, turnstile, write_config};

/// `journal verify` (its structural rules too) and `journal rebuild` exit 0 at `place`.
fn journal_is_sound(place: &[&str]) {
    for command in ["verify", "rebuild"] {
        let out = turnstile(&[&["journal", command], place].concat());
        assert_eq!(
            out.status.code(),
            Some(0),
            "journal {command}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

async fn post_run(server: &Server, session: &str, message: &str) -> reqwest::Response {
    http_client()
        .post(server.url("/agents/scripted/runs"))
        .form(&[
            ("message", message),
            ("session_id", session),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_message_too_large_for_the_journal_is_413_and_the_session_is_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "max_event_bytes = 65536", "");
    let data = dir.path().join("data");
    let args = ["--config", config.to_str().unwrap()];
    let server = Server::start_with(&data, &args);
    let big = "x".repeat(100 * 1024);
    let refused = post_run(&server, "big", &big).await;
    assert_eq!(refused.status(), 413);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error_type"], "event_too_large", "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("message") && detail.contains("65536"),
        "the detail names the field and the limit: {detail}"
    );
    // Nothing was recorded: the session does not exist, and its first turn creates it.
    let session = http_client()
        .get(server.url("/sessions/big"))
        .send()
        .await
        .unwrap();
    assert_eq!(session.status(), 404);
    let next = post_run(&server, "big", "hello").await;
    assert_eq!(next.status(), 200);
    let run: Value = next.json().await.unwrap();
    assert_eq!(run["status"], "COMPLETED", "{run}");
    // The same with streaming: a 413, not a stream.
    let streamed = http_client()
        .post(server.url("/agents/scripted/runs"))
        .form(&[("message", big.as_str()), ("session_id", "big")])
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 413);
    server.terminate();
    let server = Server::start_with(&data, &args);
    let runs = get_json(&server, "/sessions/big/runs").await;
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    server.terminate();
    journal_is_sound(&["--data-dir", data.to_str().unwrap()]);
}

fn df_available(dir: &Path) -> u64 {
    let out = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|line| line.trim().parse().ok())
        .unwrap()
}

/// A tmpfs of `size` mounted at `dir`, unmounted on drop; `None` (with the reason
/// printed) where it cannot be mounted, a failure under CI.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Tmpfs(dir.to_path_buf())),
            other => {
                let reason = match other {
                    Ok(out) => String::from_utf8_lossy(&out.stderr).into_owned(),
                    Err(error) => error.to_string(),
                };
                assert!(
                    std::env::var_os("CI").is_none(),
                    "the disk-full test needs to mount a tmpfs (as root): {reason}"
                );
                eprintln!("skipped: cannot mount a tmpfs (as root): {reason}");
                None
            }
        }
    }
}

fn run(command: &mut Command) {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Turns `dir` read-only for every path under it: a read-only bind mount of it over
/// itself (a file system cannot be remounted read-only while the server has files
/// open for writing on it; a fresh bind mount has no writer yet).
fn turn_read_only(dir: &Path) {
    run(Command::new("mount").arg("--bind").arg(dir).arg(dir));
    run(Command::new("mount")
        .args(["-o", "remount,bind,ro"])
        .arg(dir));
}

/// Undoes [`turn_read_only`].
fn turn_writable(dir: &Path) {
    run(Command::new("umount").arg(dir));
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Waits until `/health` answers `want`; returns its body.
async fn health_becomes(server: &Server, want: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = http_client()
            .get(server.url("/health"))
            .send()
            .await
            .unwrap();
        if response.status() == want {
            return response.json().await.unwrap();
        }
        assert!(Instant::now() < deadline, "/health never answered {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// While the journal cannot write, a turn is `503 journal_unavailable` with
/// `Retry-After` and a detail containing `says`; liveness stays `200`.
async fn refused_while_unavailable(server: &Server, session: &str, says: &str) {
    let health = health_becomes(server, 503).await;
    assert_eq!(health["error_type"], "journal_unavailable", "{health}");
    let live = http_client()
        .get(server.url("/health?live=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
    let started = Instant::now();
    let refused = post_run(server, session, "/tool Read {}\n/reply no room").await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at once"
    );
    let status = refused.status();
    let retry_after = refused.headers().contains_key("retry-after");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(retry_after);
    assert_eq!(body["error_type"], "journal_unavailable", "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains(says),
        "the detail says {says:?}: {body}"
    );
}

/// Waits (60 s at most) until the run, read on the first server, has ended; else
/// prints every server's log and fails.
async fn ends(servers: &[&Server], run_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = get_json(servers[0], &format!("/agents/scripted/runs/{run_id}")).await;
        let status = run["status"].as_str().unwrap_or_default().to_owned();
        if ["COMPLETED", "ERROR"].contains(&status.as_str()) {
            return;
        }
        if Instant::now() >= deadline {
            for (n, server) in servers.iter().enumerate() {
                for line in server.logs() {
                    println!("server {n}: {line}");
                }
            }
            panic!("run {run_id} stays {status}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_or_read_only_disk_is_503_and_the_same_process_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tmpfs) = Tmpfs::mount(&dir.path().join("disk"), "96m") else {
        return;
    };
    let data = tmpfs.0.join("data");
    let config = write_config(
        dir.path(),
        "",
        "retries = 2\ndelay_between_retries_s = 0.05",
    );
    let args = ["--config", config.to_str().unwrap()];
    let server = Server::start_with(&data, &args);
    let ok = post_run(&server, "disk", "/tool Read {}\n/reply fine").await;
    assert_eq!(ok.status(), 200);
    health_becomes(&server, 200).await;

    // A run in flight when the disk fills, and the disk filled.
    let client = http_client();
    let in_flight = tokio::spawn({
        let url = server.url("/agents/scripted/runs");
        async move {
            client
                .post(url)
                .form(&[
                    (
                        "message",
                        "/sleep 1500\n/tool Read {}\n/reply after the fault",
                    ),
                    ("session_id", "in-flight"),
                    ("background", "true"),
                    ("stream", "false"),
                ])
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let filler = tmpfs.0.join("filler");
    let fill = df_available(&tmpfs.0).saturating_sub(8 * 1024 * 1024);
    let out = Command::new("fallocate")
        .args(["-l", &fill.to_string()])
        .arg(&filler)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let accepted = in_flight.await.unwrap();
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    refused_while_unavailable(&server, "disk", "no space left").await;
    // Space is freed: the same process serves again within seconds.
    std::fs::remove_file(&filler).unwrap();
    health_becomes(&server, 200).await;
    let ok = post_run(&server, "disk", "/reply room again").await;
    assert_eq!(ok.status(), 200);

    // The data directory turned read-only, then writable again.
    turn_read_only(&data);
    refused_while_unavailable(&server, "disk", "read-only").await;
    turn_writable(&data);
    health_becomes(&server, 200).await;
    let ok = post_run(&server, "disk", "/reply writable again").await;
    assert_eq!(ok.status(), 200);

    // The run the fault interrupted ended, once.
    ends(&[&server], &run_id).await;
    server.terminate();
    journal_is_sound(&["--data-dir", data.to_str().unwrap()]);
    drop(tmpfs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_is_503_and_both_replicas_recover() {
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!("[journal]\nbackend = \"postgres\"\nurl = \"{url}\"\nlease_s = 2"),
        "retries = 2\ndelay_between_retries_s = 0.05",
    );
    let args = ["--config", config.to_str().unwrap()];
    let a = Server::start_with(&dir.path().join("a"), &args);
    let b = Server::start_with(&dir.path().join("b"), &args);
    let mut runs = Vec::new();
    for (n, server) in [&a, &b, &a, &b].into_iter().enumerate() {
        let accepted: Value = http_client()
            .post(server.url("/agents/scripted/runs"))
            .form(&[
                ("message", "/sleep 800\n/tool Read {}\n/reply survived"),
                ("session_id", &format!("pg-{}", n % 2)),
                ("background", "true"),
                ("stream", "false"),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        runs.push(accepted["run_id"].as_str().unwrap().to_owned());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    turnstile_tests::postgres::stop_cluster();
    for server in [&a, &b] {
        refused_while_unavailable(server, "pg-new", "does not answer").await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    turnstile_tests::postgres::start_cluster();
    for server in [&a, &b] {
        health_becomes(server, 200).await;
    }
    // Every run ends, on whichever replica; each exactly once (verify's rules).
    for run_id in &runs {
        ends(&[&a, &b], run_id).await;
    }
    let ok = post_run(&b, "pg-new", "/reply the database is back").await;
    assert_eq!(ok.status(), 200);
    // Each replica still lists what the other creates after the outage (its directory
    // follows the other replicas again).
    let ok = post_run(&a, "pg-after-a", "/reply made on A").await;
    assert_eq!(ok.status(), 200);
    let ok = post_run(&b, "pg-after-b", "/reply made on B").await;
    assert_eq!(ok.status(), 200);
    for (server, session) in [(&b, "pg-after-a"), (&a, "pg-after-b")] {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listed = get_json(server, "/sessions?limit=100").await;
            if listed.to_string().contains(&format!("\"{session}\"")) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a replica never listed {session}, made on the other after the outage: {listed}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    a.terminate();
    b.terminate();
    journal_is_sound(&["--config", config.to_str().unwrap()]);
}
