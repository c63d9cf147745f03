//! Audit commands on a data directory the real server wrote: `journal timeline`,
//! `journal export` and `journal import` (round trip to the same bytes, refusal of an
//! edited export at its first bad line), and their refusal while a server holds it.

use std::path::Path;

use serde_json::Value;
use turnstile_journal::{Journal, JournalOptions};
use turnstile_tests::{
    Server, http_client as client, lossy, post_form_json, turnstile, write_config,
};

/// A session with a retried run, a fork, a compaction and a cancelled run.
async fn eventful_session(server: &Server) -> String {
    post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", "elsewhere"),
            ("session_id", "other"),
            ("stream", "false"),
        ],
    )
    .await;
    let first = post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            (
                "message",
                "look around\n/tool Read {\"path\":\"a.rs\"}\n/fail transient 1\n/reply seen",
            ),
            ("session_id", "audit"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(first["status"], "COMPLETED", "{first}");
    let run_id = first["run_id"].as_str().unwrap().to_owned();
    post_form_json(
        server,
        &format!("/agents/scripted/runs/{run_id}/continue"),
        &[
            ("continue_from", "3"),
            ("input", "another way"),
            ("stream", "false"),
        ],
    )
    .await;
    post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", "third"),
            ("session_id", "audit"),
            ("stream", "false"),
        ],
    )
    .await;
    post_form_json(server, "/agents/scripted/sessions/audit/compact", &[]).await;
    let background = post_form_json(
        server,
        "/agents/scripted/runs",
        &[
            ("message", "/sleep 30000"),
            ("session_id", "audit"),
            ("background", "true"),
            ("stream", "false"),
        ],
    )
    .await;
    let background_id = background["run_id"].as_str().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    client()
        .post(server.url(&format!("/agents/scripted/runs/{background_id}/cancel")))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    run_id
}

#[tokio::test]
async fn timeline_export_and_import_tell_and_keep_the_whole_story() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "",
        "retries = 1\ndelay_between_retries_s = 0.01",
    );
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap().to_owned();
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);
    let run_id = eventful_session(&server).await;
    let held = turnstile(&[
        "journal",
        "timeline",
        "--session",
        "audit",
        "--data-dir",
        &data_arg,
    ]);
    assert_eq!(held.status.code(), Some(2));
    assert!(lossy(&held.stderr).contains("held by another process"));
    server.terminate();

    let timeline = turnstile(&[
        "journal",
        "timeline",
        "--session",
        "audit",
        "--data-dir",
        &data_arg,
    ]);
    assert_eq!(
        timeline.status.code(),
        Some(0),
        "{}",
        lossy(&timeline.stderr)
    );
    let timeline = lossy(&timeline.stdout);
    for expected in [
        "session created for agent scripted",
        "queued: \"look around",
        "attempt 1 on harness session",
        "tool Read({\"path\":\"a.rs\"}) → ok:Read",
        "attempt 1 failed (transient, retryable)",
        "retry after attempt 1 of 2",
        "attempt 2 on harness session",
        "completed: \"seen\"",
        "at message 3",
        "compacted: \"[summary of",
        "cancelled: Run cancelled",
    ] {
        assert!(
            timeline.contains(expected),
            "missing {expected:?} in\n{timeline}"
        );
    }
    // Each line carries its journal position, in order.
    let positions: Vec<u64> = timeline
        .lines()
        .filter_map(|line| line.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(
        positions.windows(2).all(|pair| pair[0] < pair[1]),
        "{positions:?}"
    );
    let one_run = lossy(
        &turnstile(&[
            "journal",
            "timeline",
            "--session",
            "audit",
            "--run",
            &run_id,
            "--data-dir",
            &data_arg,
        ])
        .stdout,
    );
    assert!(!one_run.contains("third"), "{one_run}");

    // Every stored projection matches a fold of the events; a corrupted one is reported.
    let rebuilt = turnstile(&["journal", "rebuild", "--data-dir", &data_arg]);
    assert_eq!(rebuilt.status.code(), Some(0), "{}", lossy(&rebuilt.stdout));
    assert!(lossy(&rebuilt.stdout).contains("stored projections match"));
    assert!(
        !lossy(&rebuilt.stdout).contains("all 0 "),
        "{}",
        lossy(&rebuilt.stdout)
    );
    {
        let journal = Journal::open(&data, JournalOptions::default()).unwrap();
        let key = format!("run/{run_id}");
        let mut stored: Value =
            serde_json::from_slice(&journal.get_projection(&key).unwrap().unwrap()).unwrap();
        stored["run"]["status"] = "ERROR".into();
        journal
            .put_projection(&key, stored.to_string().as_bytes())
            .unwrap();
        journal.close().unwrap();
    }
    let corrupted = turnstile(&["journal", "rebuild", "--data-dir", &data_arg]);
    assert_eq!(corrupted.status.code(), Some(1));
    assert!(
        lossy(&corrupted.stdout).contains(&format!(
            "run/{run_id}: run.status: stored \"ERROR\", rebuilt \"COMPLETED\""
        )),
        "{}",
        lossy(&corrupted.stdout)
    );

    let first = dir.path().join("first.jsonl");
    let exported = turnstile(&[
        "journal",
        "export",
        "--out",
        first.to_str().unwrap(),
        "--data-dir",
        &data_arg,
    ]);
    assert_eq!(
        exported.status.code(),
        Some(0),
        "{}",
        lossy(&exported.stderr)
    );
    let lines = std::fs::read_to_string(&first).unwrap();
    for line in lines.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        assert_eq!(record["hash"].as_str().unwrap().len(), 64);
    }
    // One session's export holds only its records, in order.
    let session_only = lossy(
        &turnstile(&[
            "journal",
            "export",
            "--session",
            "audit",
            "--data-dir",
            &data_arg,
        ])
        .stdout,
    );
    assert!(session_only.lines().count() > 10);
    assert!(
        session_only
            .lines()
            .all(|line| line.contains(r#""session_id":"audit""#))
    );
    let everything = lossy(&turnstile(&["journal", "export", "--data-dir", &data_arg]).stdout);
    assert!(
        everything.contains(r#""session_id":"other""#)
            && everything.lines().count() > session_only.lines().count()
    );
    // Piped to stdout: the same lines and nothing else.
    let piped = turnstile(&["journal", "export", "--data-dir", &data_arg]);
    assert_eq!(lossy(&piped.stdout), lines);

    let copy = dir.path().join("copy");
    let import = |input: &Path, data: &Path| {
        turnstile(&[
            "journal",
            "import",
            "--in",
            input.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ])
    };
    let imported = import(&first, &copy);
    assert_eq!(
        imported.status.code(),
        Some(0),
        "{}{}",
        lossy(&imported.stdout),
        lossy(&imported.stderr)
    );
    let second = dir.path().join("second.jsonl");
    turnstile(&[
        "journal",
        "export",
        "--out",
        second.to_str().unwrap(),
        "--data-dir",
        copy.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(&first).unwrap(),
        std::fs::read(&second).unwrap(),
        "export, import, export gives the same bytes"
    );
    let verified = turnstile(&["journal", "verify", "--data-dir", copy.to_str().unwrap()]);
    assert_eq!(verified.status.code(), Some(0));
    let rebuilt_copy = turnstile(&["journal", "rebuild", "--data-dir", copy.to_str().unwrap()]);
    assert_eq!(
        rebuilt_copy.status.code(),
        Some(0),
        "{}",
        lossy(&rebuilt_copy.stdout)
    );

    // An edited export is refused at the edited line, and leaves nothing behind.
    let mut edited: Vec<String> = lines.lines().map(str::to_owned).collect();
    let target = edited
        .iter()
        .position(|line| line.contains("look around"))
        .unwrap();
    edited[target] = edited[target].replace("look around", "look elsewhere");
    let edited_path = dir.path().join("edited.jsonl");
    std::fs::write(&edited_path, edited.join("\n")).unwrap();
    let refused_dir = dir.path().join("refused");
    let refused = import(&edited_path, &refused_dir);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        lossy(&refused.stdout).contains(&format!("line {}", target + 1)),
        "{}",
        lossy(&refused.stdout)
    );
    assert!(!refused_dir.join("db").exists());
    // A removed line: refused at the line after it.
    let mut removed: Vec<String> = lines.lines().map(str::to_owned).collect();
    removed.remove(5);
    std::fs::write(&edited_path, removed.join("\n")).unwrap();
    let refused = import(&edited_path, &refused_dir);
    assert!(
        lossy(&refused.stdout).contains("line 6"),
        "{}",
        lossy(&refused.stdout)
    );
}
