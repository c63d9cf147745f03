//! Workspaces that travel (issue 29, spec `workspaces.md`): each tool call's and each
//! turn's changes journaled, the directory restored from the journal wherever the
//! session resumes (a restart with the agent's `cwd` deleted, an import into a new data
//! directory and a new `cwd`), rewound with a continuation, read through the files
//! routes and the timeline, bounded, and checked by `journal verify`. The real binary
//! with the scripted harness, started as a user starts it, relative paths from its
//! configuration, restarted between turns.

use std::path::Path;

use serde_json::Value;
use turnstile_tests::{Server, http_client, turnstile_in, turnstile_in_ok};

fn config(dir: &Path, extra: &str) {
    std::fs::write(
        dir.join("turnstile.toml"),
        format!(
            "[server]\ndata_dir = \"./data\"\n\n[[agents]]\nid = \"coder\"\nharness = \"scripted\"\ncwd = \"./work\"\nworkspace = \"session\"\n{extra}"
        ),
    )
    .unwrap();
}

fn start(dir: &Path) -> Server {
    Server::start_in(dir, &["--config", "turnstile.toml"])
}

async fn turn(server: &Server, session: &str, message: &str) -> Value {
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
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn get(server: &Server, path: &str) -> (u16, String) {
    let response = http_client().get(server.url(path)).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn continue_run(server: &Server, run: &Value, form: &[(&str, &str)]) -> Value {
    let path = format!(
        "/agents/coder/runs/{}/continue",
        run["run_id"].as_str().unwrap()
    );
    let mut fields = vec![
        ("session_id", run["session_id"].as_str().unwrap()),
        ("stream", "false"),
    ];
    fields.extend_from_slice(form);
    let response = http_client()
        .post(server.url(&path))
        .form(&fields)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// Each tool call's result text.
fn results(run: &Value) -> Vec<String> {
    run["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["result"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn verify(dir: &Path) {
    let out = turnstile_in(dir, &["journal", "verify", "--config", "turnstile.toml"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_restart_on_a_new_machine_restores_the_files_29() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    let run = turn(
        &server,
        "s1",
        "/write notes/a.txt hello\\nworld\n/write b.txt bee\n/rm b.txt\n/write run.sh echo hi",
    )
    .await;
    assert_eq!(run["status"], "COMPLETED", "{run}");
    server.terminate();

    // Only the journal survives: the agent's cwd is gone.
    std::fs::remove_dir_all(dir.path().join("work")).unwrap();
    let server = start(dir.path());
    let run = turn(&server, "s1", "/read notes/a.txt\n/read b.txt\n/ls").await;
    assert_eq!(
        results(&run),
        ["hello\nworld", "missing", "notes/a.txt\nrun.sh"],
        "{run}"
    );
    server.terminate();

    let timeline = turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "timeline",
            "--config",
            "turnstile.toml",
            "--session",
            "s1",
        ],
    );
    assert!(timeline.contains("files after"), "{timeline}");
    assert!(timeline.contains("+notes/a.txt"), "{timeline}");
    assert!(timeline.contains("-b.txt"), "{timeline}");
    verify(dir.path());
}

#[tokio::test]
async fn a_continuation_sees_the_files_of_its_checkpoint_29() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    let run = turn(
        &server,
        "s1",
        "/write a.txt first\n/write a.txt second\n/write c.txt later",
    )
    .await;
    assert_eq!(run["status"], "COMPLETED", "{run}");
    // From the checkpoint after the first call: a.txt as it was then, c.txt absent.
    let continued = continue_run(
        &server,
        &run,
        &[
            ("continue_from", "3"),
            ("input", "/read a.txt\n/read c.txt"),
        ],
    )
    .await;
    assert_eq!(results(&continued), ["first", "missing"], "{continued}");
    let work = dir.path().join("work/s1");
    assert_eq!(
        std::fs::read_to_string(work.join("a.txt")).unwrap(),
        "first"
    );
    assert!(!work.join("c.txt").exists());
    // The next turn goes on from the continuation's files.
    let next = turn(&server, "s1", "/read a.txt").await;
    assert_eq!(results(&next), ["first"]);

    // The files routes: what the run changed, and a file at a tool call.
    let run_id = run["run_id"].as_str().unwrap();
    let (status, body) = get(
        &server,
        &format!("/agents/coder/runs/{run_id}/files?session_id=s1"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let files: Value = serde_json::from_str(&body).unwrap();
    let changes: Vec<(String, String)> = files
        .as_array()
        .unwrap()
        .iter()
        .map(|file| {
            (
                file["path"].as_str().unwrap().to_owned(),
                file["change"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("a.txt".to_owned(), "added".to_owned()),
            ("a.txt".to_owned(), "modified".to_owned()),
            ("c.txt".to_owned(), "added".to_owned())
        ]
    );
    let first_call = files[0]["tool_call_id"].as_str().unwrap();
    let (status, body) = get(
        &server,
        &format!("/agents/coder/runs/{run_id}/files/a.txt?session_id=s1&at={first_call}"),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "first"));
    let (status, body) = get(
        &server,
        &format!("/agents/coder/runs/{run_id}/files/a.txt?session_id=s1"),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "second"));
    let (status, _) = get(
        &server,
        &format!("/agents/coder/runs/{run_id}/files/c.txt?session_id=s1&at={first_call}"),
    )
    .await;
    assert_eq!(status, 404);
    server.terminate();
    verify(dir.path());
}
