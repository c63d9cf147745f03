//! Workspaces per session (issue 29, spec `workspaces.md`), the first part: with
//! `workspace = "session"` each session works in `<cwd>/<session_id>/`, so two sessions
//! never see each other's files; a session id that cannot name a directory is `422`;
//! `DELETE /sessions/{id}` removes the directory; the scripted harness's file tools
//! stay inside it (no `..`, no absolute path, never through a symlink). Snapshots are off
//! here (`snapshot_workspace = false`: the isolation alone), so that a link put in the
//! directory between turns stays (`workspace_snapshots.rs` has the snapshots). The real binary,
//! started as a user starts it, with relative paths from its configuration.

use std::path::Path;

use serde_json::Value;
use turnstile_tests::{Server, http_client};

fn config(dir: &Path) {
    std::fs::write(
        dir.join("turnstile.toml"),
        "[[agents]]\nid = \"isolated\"\nharness = \"scripted\"\ncwd = \"./work\"\nworkspace = \"session\"\nsnapshot_workspace = false\n\n\
         [[agents]]\nid = \"shared\"\nharness = \"scripted\"\ncwd = \"./common\"\n",
    )
    .unwrap();
}

async fn turn(server: &Server, agent: &str, session: &str, message: &str) -> (u16, Value) {
    let response = http_client()
        .post(server.url(&format!("/agents/{agent}/runs")))
        .form(&[
            ("message", message),
            ("session_id", session),
            ("stream", "false"),
        ])
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Each tool call's (result, failed).
fn results(run: &Value) -> Vec<(String, bool)> {
    run["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| {
            (
                tool["result"].as_str().unwrap_or_default().to_owned(),
                tool["tool_call_error"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

#[tokio::test]
async fn each_session_works_in_a_directory_of_its_own_29() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let server = Server::start_in(dir.path(), &["--config", "turnstile.toml"]);
    let work = dir.path().join("work");

    let (status, run) = turn(
        &server,
        "isolated",
        "s1",
        "/write notes/a.txt hello\\nworld\n/ls",
    )
    .await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(
        results(&run),
        [
            ("ok:Write".to_owned(), false),
            ("notes/a.txt".to_owned(), false)
        ]
    );
    assert_eq!(
        std::fs::read_to_string(work.join("s1/notes/a.txt")).unwrap(),
        "hello\nworld"
    );
    assert_eq!(run["tools"][0]["tool_name"], "Write");

    // Another session does not see it; its directory is its own.
    let (_, other) = turn(&server, "isolated", "s2", "/read notes/a.txt\n/ls").await;
    assert_eq!(
        results(&other),
        [("missing".to_owned(), false), (String::new(), false)]
    );
    assert!(work.join("s2").is_dir());
    let (_, again) = turn(&server, "isolated", "s1", "/read notes/a.txt").await;
    assert_eq!(results(&again), [("hello\nworld".to_owned(), false)]);

    // Paths that leave the directory are failed calls, and nothing is written.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), work.join("s1/out")).unwrap();
    let (_, refused) = turn(
        &server,
        "isolated",
        "s1",
        "/write ../escaped.txt x\n/write /tmp/turnstile-absolute.txt x\n/write out/x.txt x\n/read out/secret\n/rm ../s2",
    )
    .await;
    let refused = results(&refused);
    assert_eq!(refused.len(), 5);
    assert!(refused.iter().all(|(_, failed)| *failed), "{refused:?}");
    assert!(refused[2].0.contains("symlink"), "{refused:?}");
    assert!(!work.join("escaped.txt").exists());
    assert!(!Path::new("/tmp/turnstile-absolute.txt").exists());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    assert!(work.join("s2").is_dir());

    // A session id that cannot name a directory, for this agent only.
    for bad in [".hidden", "..", "."] {
        let (status, body) = turn(&server, "isolated", bad, "hello").await;
        assert_eq!(status, 422, "{bad}: {body}");
    }
    let (_, body) = turn(&server, "isolated", ".hidden", "hello").await;
    assert!(
        body["detail"].as_str().unwrap().contains("workspace"),
        "{body}"
    );
    assert_eq!(turn(&server, "shared", ".hidden", "hello").await.0, 200);

    // The shared agent works in its cwd, as before.
    let (_, shared) = turn(&server, "shared", "t1", "/write common.txt c").await;
    assert_eq!(results(&shared), [("ok:Write".to_owned(), false)]);
    assert!(dir.path().join("common/common.txt").exists());

    // Deleting a session removes its directory (not through the symlink), and only its.
    let deleted = http_client()
        .delete(server.url("/sessions/s1"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(!work.join("s1").exists());
    // Moved aside at once, removed on a thread of its own.
    turnstile_tests::wait_until(
        "the deleted workspace is removed",
        std::time::Duration::from_secs(10),
        || {
            std::fs::read_dir(work.join(".turnstile/deleted"))
                .map(|entries| entries.count() == 0)
                .unwrap_or(true)
        },
    );
    assert!(outside.path().is_dir());
    assert!(outside.path().read_dir().unwrap().next().is_none());
    assert!(work.join("s2").is_dir());
    server.terminate();
}
