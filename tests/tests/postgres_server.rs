//! The real binary on a real PostgreSQL: `turnstile serve` with `[journal] backend =
//! "postgres"`, a session that resumes after a restart from the database alone, and the
//! audit CLI (`verify`, `timeline`, `export`, `import`, `rebuild`) against it.

use serde_json::Value;
use turnstile_tests::{Server, get_json, post_form_json, turnstile_in, turnstile_in_ok};

fn config(dir: &std::path::Path, url: &str) -> std::path::PathBuf {
    let path = dir.join("turnstile.toml");
    std::fs::write(
        &path,
        format!("[journal]\nbackend = \"postgres\"\nurl = \"{url}\"\n"),
    )
    .unwrap();
    path
}

async fn turn(server: &Server, session: &str, message: &str) -> Value {
    post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", message),
            ("session_id", session),
            ("stream", "false"),
        ],
    )
    .await
}

#[tokio::test]
async fn a_session_resumes_after_a_restart_from_postgres_and_the_audit_cli_reads_it() {
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), &url);
    let file = file.to_str().unwrap();
    let server = Server::start_with(&dir.path().join("data"), &["--config", file]);
    let first = turn(&server, "s1", "remember the blue door").await;
    assert_eq!(first["content"], "echo: remember the blue door", "{first}");
    assert!(
        server
            .logs()
            .iter()
            .any(|line| line.contains("postgres://")),
        "the banner names the database: {:?}",
        server.logs()
    );
    server.terminate();

    // A new data directory: nothing of the first process is left but the database.
    let server = Server::start_with(&dir.path().join("other-data"), &["--config", file]);
    let second = turn(&server, "s1", "what did I say?\n/history").await;
    assert_eq!(
        second["content"], "remember the blue door\nwhat did I say?",
        "{second}"
    );
    let runs = get_json(&server, "/sessions/s1/runs").await;
    assert_eq!(runs.as_array().map(Vec::len), Some(2), "{runs}");
    server.terminate();

    let verified = turnstile_in_ok(dir.path(), &["journal", "verify", "--config", file]);
    assert!(verified.starts_with("journal ok: 1 streams"), "{verified}");
    let timeline = turnstile_in_ok(
        dir.path(),
        &["journal", "timeline", "--session", "s1", "--config", file],
    );
    assert!(timeline.contains("remember the blue door"), "{timeline}");
    let rebuilt = turnstile_in_ok(dir.path(), &["journal", "rebuild", "--config", file]);
    assert!(rebuilt.contains("match"), "{rebuilt}");
    turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "export",
            "--out",
            "export.jsonl",
            "--config",
            file,
        ],
    );
    let export = std::fs::read_to_string(dir.path().join("export.jsonl")).unwrap();

    // The export imports into sled and into another database, each a copy that
    // verifies and exports the same lines.
    turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "import",
            "--in",
            "export.jsonl",
            "--data-dir",
            "copy",
        ],
    );
    let sled_copy = turnstile_in_ok(dir.path(), &["journal", "export", "--data-dir", "copy"]);
    assert_eq!(sled_copy, export);
    let target = turnstile_tests::postgres::database().unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    let target_file = config(target_dir.path(), &target);
    let target_file = target_file.to_str().unwrap();
    let imported = turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "import",
            "--in",
            "export.jsonl",
            "--config",
            target_file,
        ],
    );
    assert!(imported.starts_with("imported"), "{imported}");
    let pg_copy = turnstile_in_ok(dir.path(), &["journal", "export", "--config", target_file]);
    assert_eq!(pg_copy, export);
    turnstile_in_ok(dir.path(), &["journal", "verify", "--config", target_file]);
    // A second import into the same database is refused, writing nothing.
    let again = turnstile_in(
        dir.path(),
        &[
            "journal",
            "import",
            "--in",
            "export.jsonl",
            "--config",
            target_file,
        ],
    );
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("holds a journal already"),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
}

#[test]
fn a_postgres_backend_without_a_url_or_an_unreachable_one_is_a_clear_refusal() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("none.toml"),
        "[journal]\nbackend = \"postgres\"\n",
    )
    .unwrap();
    let out = turnstile_in(dir.path(), &["serve", "--config", "none.toml"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("TURNSTILE_DATABASE_URL"), "{stderr}");

    let port = turnstile_tests::free_port();
    std::fs::write(
        dir.path().join("down.toml"),
        format!("[journal]\nbackend = \"postgres\"\nurl = \"postgres://turnstile:pw@127.0.0.1:{port}/x\"\n"),
    )
    .unwrap();
    let out = turnstile_in(dir.path(), &["journal", "verify", "--config", "down.toml"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}")) && !stderr.contains("pw"),
        "names the database, not its password: {stderr}"
    );
}

/// Transactions committed on the database so far (the statistics every backend reports
/// within about a second).
fn commits(url: &str) -> u64 {
    turnstile_tests::postgres::psql(
        url,
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .parse()
    .unwrap()
}

#[tokio::test]
async fn an_idle_server_alone_does_not_poll_the_journal() {
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), &url);
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", file.to_str().unwrap()],
    );
    let first = turn(&server, "s1", "hello").await;
    assert_eq!(first["content"], "echo: hello", "{first}");
    // Past its start (and its first heartbeat, which says whether others are alive).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let before = commits(&url);
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let during = commits(&url) - before;
    // Its heartbeat (every 2 s), the claims of sessions dead replicas left and the
    // commands others sent (4 a second each): about 35. Following the journal every
    // 20 ms as if others positioned records made it about 235.
    assert!(
        during < 100,
        "an idle server alone committed {during} transactions in 4 s"
    );
    server.terminate();
}
