//! Issue 13, defect 5: a session's background runs execute in the journal's `RunQueued`
//! order, always; 1,000 concurrent `background=true` posts to one session used to start
//! hundreds of them out of that order.

use std::collections::HashSet;

use futures::future::join_all;
use serde_json::Value;
use turnstile_tests::{Server, http_client, turnstile_ok};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_background_posts_run_in_journal_order_13() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let client = http_client();
    let posts = (0..1000).map(|n| {
        let client = client.clone();
        let url = server.url("/agents/scripted/runs");
        async move {
            let answer = client
                .post(url)
                .form(&[
                    ("message", format!("/reply {n}")),
                    ("session_id", "fifo".to_owned()),
                    ("background", "true".to_owned()),
                    ("stream", "false".to_owned()),
                ])
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 202);
            answer.json::<Value>().await.unwrap()["run_id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    });
    let accepted: HashSet<String> = join_all(posts).await.into_iter().collect();
    assert_eq!(accepted.len(), 1000);
    // Wait until every run has ended.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let runs: Value = client
            .get(server.url("/sessions/fifo/runs"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let done = runs
            .as_array()
            .unwrap()
            .iter()
            .filter(|run| run["status"] == "COMPLETED")
            .count();
        if done == 1000 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{done} of 1000 done: {} listed; not done: {:?}",
            runs.as_array().unwrap().len(),
            runs.as_array()
                .unwrap()
                .iter()
                .filter(|run| run["status"] != "COMPLETED")
                .map(|run| (run["run_id"].clone(), run["status"].clone()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    server.terminate();
    let export = turnstile_ok(&[
        "journal",
        "export",
        "--session",
        "fifo",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let mut queued = Vec::new();
    let mut started = Vec::new();
    for line in export.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        if let Some(event) = record["event"].get("RunQueued") {
            queued.push(event["run_id"].as_str().unwrap().to_owned());
        }
        if let Some(event) = record["event"].get("RunStarted") {
            started.push(event["run_id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(queued.len(), 1000);
    let out_of_order = queued
        .iter()
        .zip(&started)
        .filter(|(queued, started)| queued != started)
        .count();
    assert_eq!(out_of_order, 0, "runs started out of the journal's order");
}
