//! Issue 17, item 2, on the real binary: `journal verify --url` and `journal export
//! --url` audit a running server while it takes turns: the export is a consistent
//! prefix (as of the position the journal had when it started), identical to what the
//! offline export later shows for those positions, and it imports into a journal that
//! verifies.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use turnstile_tests::{Server, http_client, lossy, turnstile_env as audit, turnstile_ok};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_server_is_exported_and_verified_under_load_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.base.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let turns = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for worker in 0..4 {
        let (stop, turns, url) = (stop.clone(), turns.clone(), url.clone());
        load.push(tokio::spawn(async move {
            let client = http_client();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let answer = client
                    .post(format!("{url}/agents/scripted/runs"))
                    .form(&[
                        ("message", "/tool Read {}\n/reply ok"),
                        ("stream", "false"),
                        ("session_id", &format!("load-{worker}-{}", n % 5)),
                    ])
                    .send()
                    .await
                    .unwrap();
                assert_eq!(answer.status(), 200);
                turns.fetch_add(1, Ordering::SeqCst);
                n += 1;
            }
        }));
    }
    while turns.load(Ordering::SeqCst) < 50 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let out_dir = tempfile::tempdir().unwrap();
    let export_path = out_dir.path().join("online.jsonl");
    let export_path_text = export_path.to_str().unwrap().to_owned();
    let (verified, exported) = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            let verified = audit(&["journal", "verify", "--url", &url], &[]);
            let exported = audit(
                &[
                    "journal",
                    "export",
                    "--url",
                    &url,
                    "--out",
                    &export_path_text,
                ],
                &[],
            );
            (verified, exported)
        }
    })
    .await
    .unwrap();
    let during = turns.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    for task in load {
        task.await.unwrap();
    }
    let after = turns.load(Ordering::SeqCst);
    assert!(
        after > during,
        "the server kept taking turns during the audit"
    );

    let verified_text = lossy(&verified.stdout);
    assert!(
        verified.status.success(),
        "{verified_text}{}",
        lossy(&verified.stderr)
    );
    assert!(verified_text.starts_with("journal ok:"), "{verified_text}");
    assert!(
        verified_text.contains("of the running server"),
        "{verified_text}"
    );
    let exported_text = lossy(&exported.stdout);
    assert!(
        exported.status.success(),
        "{exported_text}{}",
        lossy(&exported.stderr)
    );
    let as_of: usize = exported_text
        .split("as of position ")
        .nth(1)
        .and_then(|rest| rest.trim_end().trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("{exported_text}"));
    let online = std::fs::read_to_string(&export_path).unwrap();
    assert_eq!(online.lines().count(), as_of);
    assert!(as_of > 0);

    // The same positions, exported offline once the server stopped: the same bytes.
    server.terminate();
    let offline = turnstile_ok(&[
        "journal",
        "export",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        offline.lines().count() > as_of,
        "the journal grew after the export"
    );
    let prefix: Vec<&str> = offline.lines().take(as_of).collect();
    assert_eq!(online.lines().collect::<Vec<_>>(), prefix);

    // And it imports into a journal that verifies.
    let imported = out_dir.path().join("imported");
    let imported = imported.to_str().unwrap();
    turnstile_ok(&[
        "journal",
        "import",
        "--in",
        &export_path.to_string_lossy(),
        "--data-dir",
        imported,
    ]);
    let check = turnstile_ok(&["journal", "verify", "--data-dir", imported]);
    assert!(check.starts_with("journal ok:"), "{check}");
}

#[tokio::test]
async fn the_online_audit_needs_the_key_17() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with_env(dir.path(), &[], &[("TURNSTILE_API_KEY", "k1")]);
    let refused = audit(&["journal", "verify", "--url", &server.base], &[]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        lossy(&refused.stderr).contains("(HTTP 401)"),
        "{}",
        lossy(&refused.stderr)
    );
    let allowed = audit(
        &["journal", "verify", "--url", &server.base],
        &[("TURNSTILE_API_KEY", "k1")],
    );
    assert!(allowed.status.success(), "{}", lossy(&allowed.stderr));
    // No server there: exit 2.
    let nobody = audit(&["journal", "export", "--url", "http://127.0.0.1:9"], &[]);
    assert_eq!(nobody.status.code(), Some(2));
    // `--url` and `--data-dir` together are refused.
    let both = audit(
        &[
            "journal",
            "verify",
            "--url",
            &server.base,
            "--data-dir",
            "x",
        ],
        &[],
    );
    assert_eq!(both.status.code(), Some(2));
}
