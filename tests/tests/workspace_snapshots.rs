//! Workspaces that travel (issue 29, spec `workspaces.md`): each tool call's and each
//! turn's changes journaled, the directory restored from the journal wherever the
//! session resumes (a restart with the agent's `cwd` deleted, an import into a new data
//! directory and a new `cwd`), rewound with a continuation, read through the files
//! routes and the timeline, bounded, and checked by `journal verify`. The real binary
//! with the scripted harness, started as a user starts it, relative paths from its
//! configuration, restarted between turns.

use std::path::Path;

use serde_json::Value;
use turnstile_tests::{Server, http_client, turnstile_in_ok, verify_journal};

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
    verify_journal(dir.path());
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
    verify_journal(dir.path());
}

#[tokio::test]
async fn a_continuation_from_the_start_of_a_run_sees_the_files_before_it_29() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    turn(&server, "s1", "/write kept.txt before").await;
    let run = turn(&server, "s1", "/write kept.txt during\n/write new.txt new").await;
    let replay = continue_run(
        &server,
        &run,
        &[
            ("continue_from", "0"),
            ("input", "/read kept.txt\n/read new.txt"),
        ],
    )
    .await;
    assert_eq!(results(&replay), ["before", "missing"], "{replay}");
    server.terminate();
    verify_journal(dir.path());
}

#[tokio::test]
async fn an_export_imported_on_a_new_machine_resumes_with_its_files_29() {
    let old = tempfile::tempdir().unwrap();
    config(old.path(), "");
    let server = start(old.path());
    let run = turn(
        &server,
        "s1",
        "/write src/main.rs fn main() {}\n/write README done",
    )
    .await;
    assert_eq!(run["status"], "COMPLETED", "{run}");
    server.terminate();
    turnstile_in_ok(
        old.path(),
        &[
            "journal",
            "export",
            "--config",
            "turnstile.toml",
            "--out",
            "journal.jsonl",
        ],
    );

    // A new machine: a new data directory and a new, empty cwd.
    let new = tempfile::tempdir().unwrap();
    config(new.path(), "");
    std::fs::copy(
        old.path().join("journal.jsonl"),
        new.path().join("journal.jsonl"),
    )
    .unwrap();
    turnstile_in_ok(
        new.path(),
        &[
            "journal",
            "import",
            "--in",
            "journal.jsonl",
            "--data-dir",
            "data",
        ],
    );
    verify_journal(new.path());
    let server = start(new.path());
    let next = turn(&server, "s1", "/read src/main.rs\n/ls").await;
    assert_eq!(
        results(&next),
        ["fn main() {}", "README\nsrc/main.rs"],
        "{next}"
    );
    server.terminate();
}

#[tokio::test(flavor = "multi_thread")]
async fn links_executables_bounds_and_ignored_paths_29() {
    let dir = tempfile::tempdir().unwrap();
    config(
        dir.path(),
        "workspace_max_file_bytes = 16\nworkspace_ignore = [\"cache/\"]\n",
    );
    std::fs::write(dir.path().join("secret.txt"), "outside the workspace").unwrap();
    let server = start(dir.path());
    // The turn sleeps while a link and an executable appear in its workspace, as a
    // tool the harness ran would make them.
    let url = server.url("/agents/coder/runs");
    let turn_in_flight = tokio::spawn(async move {
        let response = http_client()
            .post(url)
            .form(&[
                ("message", "/write small.txt ok\n/write big.txt 0123456789abcdefXYZ\n/write cache/x.txt ignored\n/sleep 1500"),
                ("session_id", "s1"),
                ("stream", "true"),
            ])
            .send()
            .await
            .unwrap();
        response.text().await.unwrap()
    });
    let work = dir.path().join("work/s1");
    turnstile_tests::wait_until(
        "the session's directory",
        std::time::Duration::from_secs(10),
        || work.join("small.txt").exists(),
    );
    std::os::unix::fs::symlink("../../secret.txt", work.join("out-link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent-turnstile-target/x", work.join("dangling")).unwrap();
    std::fs::write(work.join("tool.sh"), "echo hi\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(work.join("tool.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let frames = turnstile_tests::parse_sse(&turn_in_flight.await.unwrap());
    let warnings: Vec<&Value> = frames
        .iter()
        .filter(|frame| frame.event == "CustomEvent")
        .map(|frame| &frame.data["warning"])
        .collect();
    assert_eq!(warnings.len(), 1, "{frames:?}");
    assert_eq!(warnings[0]["type"], "workspace_over_limit");
    assert_eq!(warnings[0]["left_out"][0]["path"], "big.txt");
    assert_eq!(
        warnings[0]["left_out"][0]["bound"],
        "workspace_max_file_bytes"
    );
    let run_id = frames[0].data["run_id"].as_str().unwrap().to_owned();

    // The link's content is its target's text, never what it points to.
    let (status, body) = get(
        &server,
        &format!("/agents/coder/runs/{run_id}/files/out-link"),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "../../secret.txt"));
    let (status, _) = get(
        &server,
        &format!("/agents/coder/runs/{run_id}/files/big.txt"),
    )
    .await;
    assert_eq!(status, 404, "a file over its bound is never captured");
    server.terminate();

    // A restart on the same directory: the over-bound and ignored files stay as they are.
    let server = start(dir.path());
    turn(&server, "s1", "/reply hello").await;
    assert!(work.join("big.txt").exists() && work.join("cache/x.txt").exists());
    server.terminate();

    // A new machine: links restored as links (their targets not made), the executable
    // bit kept, the over-bound and ignored files never captured.
    std::fs::remove_dir_all(dir.path().join("work")).unwrap();
    std::fs::remove_file(dir.path().join("secret.txt")).unwrap();
    let server = start(dir.path());
    let run = turn(&server, "s1", "/ls").await;
    assert_eq!(
        results(&run),
        ["dangling\nout-link\nsmall.txt\ntool.sh"],
        "{run}"
    );
    assert_eq!(
        std::fs::read_link(work.join("out-link")).unwrap(),
        Path::new("../../secret.txt")
    );
    assert!(!dir.path().join("secret.txt").exists());
    assert!(!Path::new("/nonexistent-turnstile-target").exists());
    let mode = std::fs::metadata(work.join("tool.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o100, 0o100, "{mode:o}");
    server.terminate();
    verify_journal(dir.path());
}

#[tokio::test]
async fn two_replicas_on_postgresql_each_with_its_own_cwd_see_the_same_files_29() {
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let replica = |name: &str| {
        let home = dir.path().join(name);
        std::fs::create_dir_all(&home).unwrap();
        config(
            &home,
            &format!("\n[journal]\nbackend = \"postgres\"\nurl = \"{url}\"\nlease_s = 2\n"),
        );
        start(&home)
    };
    let (a, b) = (replica("a"), replica("b"));
    let bytes = "line one\\nline two\\n  indented";
    let first = turn(&a, "shared", &format!("/write docs/notes.md {bytes}")).await;
    assert_eq!(first["status"], "COMPLETED", "{first}");
    let second = turn(&b, "shared", "/read docs/notes.md").await;
    assert_eq!(
        results(&second),
        ["line one\nline two\n  indented"],
        "{second}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("b/work/shared/docs/notes.md")).unwrap(),
        std::fs::read(dir.path().join("a/work/shared/docs/notes.md")).unwrap()
    );
    // B's change goes back to A.
    turn(&b, "shared", "/rm docs/notes.md\n/write b.txt from b").await;
    let third = turn(&a, "shared", "/ls").await;
    assert_eq!(results(&third), ["b.txt"], "{third}");
    a.terminate();
    b.terminate();
}

#[tokio::test]
async fn files_put_in_a_new_sessions_directory_before_its_first_turn_are_its_own_29() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    // A repository cloned into the session's directory before its first turn.
    let work = dir.path().join("work/s1");
    std::fs::create_dir_all(work.join("src")).unwrap();
    std::fs::write(work.join("src/lib.rs"), "pub fn answer() -> u32 { 42 }").unwrap();
    let server = start(dir.path());
    let run = turn(&server, "s1", "/read src/lib.rs\n/write src/lib.rs changed").await;
    assert_eq!(results(&run)[0], "pub fn answer() -> u32 { 42 }", "{run}");
    // From the start of that turn: the cloned file as it was, not an empty directory.
    let replay = continue_run(
        &server,
        &run,
        &[("continue_from", "0"), ("input", "/read src/lib.rs")],
    )
    .await;
    assert_eq!(
        results(&replay),
        ["pub fn answer() -> u32 { 42 }"],
        "{replay}"
    );
    server.terminate();
    std::fs::remove_dir_all(dir.path().join("work")).unwrap();
    let server = start(dir.path());
    let again = turn(&server, "s1", "/read src/lib.rs").await;
    assert_eq!(
        results(&again),
        ["pub fn answer() -> u32 { 42 }"],
        "{again}"
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
    assert!(
        timeline.contains("files before the session's first turn: +src/lib.rs"),
        "{timeline}"
    );
    verify_journal(dir.path());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_file_is_journaled_in_pieces_and_restored_whole_29() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let server = start(dir.path());
    let url = server.url("/agents/coder/runs");
    let in_flight = tokio::spawn(async move {
        let response = http_client()
            .post(url)
            .form(&[
                ("message", "/write small.txt s\n/sleep 1500"),
                ("session_id", "big"),
                ("stream", "false"),
            ])
            .send()
            .await
            .unwrap();
        response.json::<Value>().await.unwrap()
    });
    // 3 MiB and a bit, not a multiple of the piece size, made while the turn runs.
    let work = dir.path().join("work/big");
    turnstile_tests::wait_until(
        "the session's directory",
        std::time::Duration::from_secs(10),
        || work.join("small.txt").exists(),
    );
    let bytes: Vec<u8> = (0..3 * 1024 * 1024 + 12345)
        .map(|n: u32| (n.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(work.join("data.bin"), &bytes).unwrap();
    let run = in_flight.await.unwrap();
    assert_eq!(run["status"], "COMPLETED", "{run}");
    let run_id = run["run_id"].as_str().unwrap();
    let response = http_client()
        .get(server.url(&format!("/agents/coder/runs/{run_id}/files/data.bin")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.bytes().await.unwrap().as_ref(), bytes.as_slice());
    server.terminate();

    std::fs::remove_dir_all(dir.path().join("work")).unwrap();
    let server = start(dir.path());
    turn(&server, "big", "/reply back").await;
    assert_eq!(std::fs::read(work.join("data.bin")).unwrap(), bytes);
    server.terminate();
    verify_journal(dir.path());
}
