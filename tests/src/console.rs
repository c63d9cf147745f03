//! The web console driven in headless Chromium (Debian's `chromium` through
//! `playwright-core`, `tests/console/console.cjs`) against the real binary: shared by
//! the console's test and by the example that remakes the docs' screenshots
//! (`cargo run -p turnstile-tests --example screenshots`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::{Server, http_client};

const KEY: &str = "console-test-key";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Node, Chromium and playwright-core, or `None` (with a note) outside CI.
pub fn tools() -> Option<()> {
    let chromium =
        std::env::var("TURNSTILE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let node = Command::new("node").arg("--version").output();
    let missing: Vec<&str> = [
        (node.is_err(), "node"),
        (
            !Path::new(&chromium).exists(),
            "chromium (apt-get install chromium)",
        ),
        (
            !repo()
                .join("target/clis/node_modules/playwright-core")
                .exists(),
            "playwright-core (the README's test command installs it)",
        ),
    ]
    .into_iter()
    .filter_map(|(missing, what)| missing.then_some(what))
    .collect();
    if missing.is_empty() {
        return Some(());
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the console tests need {missing:?}: .ci/run installs them"
    );
    eprintln!("skipped: missing {missing:?}");
    None
}

async fn post(server: &Server, path: &str, form: &[(&str, &str)]) -> Value {
    let response = http_client()
        .post(server.url(path))
        .bearer_auth(KEY)
        .form(form)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    response.json().await.unwrap()
}

/// The session the page is checked against: a delegated tool call, a retry, a fork, a
/// compaction and a turn after it.
async fn seed(server: &Server) {
    let nested = post(
        server,
        "/agents/scripted/runs",
        &[
            (
                "message",
                "/tool Task {\"prompt\": \"look around\"}\n/subagent #1 Read {\"file_path\": \"a.txt\"}\n/reply looked",
            ),
            ("session_id", "console-demo"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(nested["status"], "COMPLETED", "{nested}");
    let retried = post(
        server,
        "/agents/scripted/runs",
        &[
            ("message", "/fail transient 1\n/reply recovered"),
            ("session_id", "console-demo"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(retried["metadata"]["attempts"], 2, "{retried}");
    let run_id = nested["run_id"].as_str().unwrap();
    let checkpoints: Value = http_client()
        .get(server.url(&format!("/agents/scripted/runs/{run_id}/checkpoints")))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let from = checkpoints["checkpoints"][0]["message_index"].to_string();
    let forked = post(
        server,
        &format!("/agents/scripted/runs/{run_id}/continue"),
        &[
            ("continue_from", from.as_str()),
            ("input", "another way"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(forked["forked_from_run_id"], run_id, "{forked}");
    // A compaction, then one more turn: the page draws it between the runs around it.
    let compacted = post(
        server,
        "/agents/scripted/sessions/console-demo/compact",
        &[],
    )
    .await;
    assert_eq!(compacted["compacted"], true, "{compacted}");
    let after = post(
        server,
        "/agents/scripted/runs",
        &[
            ("message", "after the compaction"),
            ("session_id", "console-demo"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(after["status"], "COMPLETED", "{after}");
}

/// Starts the real binary with an API key, seeds a session, and has the console's
/// script check every page in headless Chromium, saving a screenshot of each in `shots`.
pub fn console_run(shots: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(
        &config,
        "[[agents]]\nid = \"scripted\"\nharness = \"scripted\"\nretries = 1\ndelay_between_retries_s = 0\n",
    )
    .unwrap();
    let server = Server::start_with_env(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
        &[("TURNSTILE_API_KEY", KEY)],
    );
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(seed(&server));
    drive(
        &server,
        "console.cjs",
        &[KEY],
        shots,
        "console: all checks passed",
    );
    for page in [
        "login",
        "sessions",
        "timeline",
        "run",
        "metrics",
        "sessions-phone",
    ] {
        assert!(
            shots.join(format!("{page}.png")).exists(),
            "no screenshot of {page}"
        );
    }
}

/// Starts the real binary with signed tokens and per-user isolation, seeds one session
/// per user, and has `tests/console/tokens.cjs` sign in as each in headless Chromium.
pub fn console_tokens_run(shots: &Path) {
    use crate::tokens::{claims, hmac};
    let dir = tempfile::tempdir().unwrap();
    let secret = "console-test-hmac-secret-32-bytes";
    let config = dir.path().join("turnstile.toml");
    std::fs::write(
        &config,
        format!("[auth]\nmode = \"jwt\"\nalgorithm = \"HS256\"\nuser_isolation = true\nverification_keys = [\"{secret}\"]\n"),
    )
    .unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let scopes = ["agents:read", "agents:run", "sessions:read", "metrics:read"];
    let token = |sub: &str| {
        hmac(
            jsonwebtoken::Algorithm::HS256,
            secret.as_bytes(),
            &claims(Some(sub), &scopes),
        )
    };
    let (alice, bob) = (token("alice"), token("bob"));
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        for (user, session) in [(&alice, "alice-notes"), (&bob, "bob-notes")] {
            let response = http_client()
                .post(server.url("/agents/scripted/runs"))
                .bearer_auth(user)
                .form(&[
                    ("message", format!("notes of {session}").as_str()),
                    ("session_id", session),
                    ("stream", "false"),
                ])
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success(), "{}", response.status());
        }
    });
    drive(
        &server,
        "tokens.cjs",
        &[&alice, &bob],
        shots,
        "console tokens: all checks passed",
    );
}

/// A run's changed files and their diffs in the console (issue 29): a session of an agent
/// with `workspace = "session"` whose second run rewrote, removed and added files.
pub fn console_files_run(shots: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(
        &config,
        "[[agents]]\nid = \"coder\"\nharness = \"scripted\"\nworkspace = \"session\"\n",
    )
    .unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let run_id = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut run_id = String::new();
        for message in [
            "/write notes.md one\\ntwo\\nthree\n/write gone.txt bye",
            "/write notes.md one\\n2\\nthree\\nfour\n/rm gone.txt\n/write new.txt hi",
        ] {
            let response = http_client()
                .post(server.url("/agents/coder/runs"))
                .form(&[
                    ("message", message),
                    ("session_id", "notes"),
                    ("stream", "false"),
                ])
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success(), "{}", response.status());
            let run: serde_json::Value = response.json().await.unwrap();
            run_id = run["run_id"].as_str().unwrap().to_owned();
        }
        run_id
    });
    drive(
        &server,
        "files.cjs",
        &[&format!("coder/{run_id}")],
        shots,
        "console files: all checks passed",
    );
}

/// The console's approvals (issue 30): two runs paused on a Bash call, approved and
/// denied from the page.
pub fn console_approvals_run(shots: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(
        &config,
        "[[agents]]\nid = \"coder\"\nharness = \"scripted\"\napprovals = [\"Bash\"]\n",
    )
    .unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        for (session, message) in [
            (
                "deploy",
                "/tool Bash {\"command\":\"make deploy\"}\ndeployed",
            ),
            (
                "cleanup",
                "/tool Bash {\"command\":\"rm -rf build\"}\ncleaned",
            ),
        ] {
            let response = http_client()
                .post(server.url("/agents/coder/runs"))
                .form(&[
                    ("message", message),
                    ("session_id", session),
                    ("stream", "false"),
                ])
                .send()
                .await
                .unwrap();
            let run: serde_json::Value = response.json().await.unwrap();
            assert_eq!(run["status"], "PAUSED", "{run}");
        }
    });
    drive(
        &server,
        "approvals.cjs",
        &[],
        shots,
        "console approvals: all checks passed",
    );
}

/// Runs `tests/console/<script> BASE ARGS… SHOTS` in node; it must exit 0 and say
/// `passed`.
fn drive(server: &Server, script: &str, args: &[&str], shots: &Path, passed: &str) {
    let output = Command::new("node")
        .arg(repo().join("tests/console").join(script))
        .arg(&server.base)
        .args(args)
        .arg(shots)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the console failed:\n{stdout}\n{stderr}\nserver:\n{}",
        server.logs().join("\n")
    );
    assert!(stdout.contains(passed), "{stdout}");
}
