//! The `turnstile` command line: `journal verify` on a data directory a server wrote,
//! its refusal while a server holds the directory, configuration errors that name the
//! key, and `--help` on every subcommand.

use std::time::Duration;

use turnstile_tests::{Server, lossy, turnstile};

#[tokio::test]
async fn verify_reports_a_sound_journal_and_refuses_while_a_server_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap().to_owned();
    let server = Server::start(dir.path());
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    for n in 0..3 {
        let response = client
            .post(server.url("/agents/scripted/runs"))
            .form(&[
                ("message", format!("turn {n}\n/tool Read {{}}")),
                ("stream", "false".into()),
                ("session_id", format!("s{n}")),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    let held = turnstile(&["journal", "verify", "--data-dir", &data_dir]);
    assert_eq!(held.status.code(), Some(2));
    assert!(
        lossy(&held.stderr).contains("held by another process"),
        "{}",
        lossy(&held.stderr)
    );
    server.terminate();

    let verified = turnstile(&["journal", "verify", "--data-dir", &data_dir]);
    assert_eq!(
        verified.status.code(),
        Some(0),
        "{}",
        lossy(&verified.stderr)
    );
    let summary = lossy(&verified.stdout);
    assert!(summary.contains("3 streams"), "{summary}");
    assert!(summary.contains("journal ok"), "{summary}");
    // Piped output is one line: no progress bar noise.
    assert_eq!(summary.lines().count(), 1, "{summary}");
}

#[test]
fn verify_of_a_directory_without_a_journal_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let output = turnstile(&[
        "journal",
        "verify",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        lossy(&output.stderr).contains("holds no journal"),
        "{}",
        lossy(&output.stderr)
    );
}

#[test]
fn an_unknown_configuration_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(
        &config,
        "[server]\naddr = \"127.0.0.1:0\"\nmax_concurent_runs = 3\n",
    )
    .unwrap();
    let output = turnstile(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
    ]);
    assert_ne!(output.status.code(), Some(0));
    assert!(
        lossy(&output.stderr).contains("max_concurent_runs"),
        "{}",
        lossy(&output.stderr)
    );
}

#[test]
fn every_subcommand_has_help() {
    for args in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["journal", "--help"],
        vec!["journal", "verify", "--help"],
        vec!["journal", "timeline", "--help"],
        vec!["journal", "export", "--help"],
        vec!["journal", "import", "--help"],
        vec!["journal", "rebuild", "--help"],
    ] {
        let output = turnstile(&args);
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        assert!(lossy(&output.stdout).contains("Usage"), "{args:?}");
    }
}
