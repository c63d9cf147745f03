//! The sessions API over HTTP against the real binary: listing with filters and
//! pages, one session's detail and runs with accumulated metrics, and deletion as a
//! tombstone that the journal keeps.

use std::time::Duration;

use serde_json::Value;
use turnstile_journal::{Journal, JournalOptions, JournalPos};
use turnstile_tests::{Server, http_client as client, post_form_json};

async fn run(server: &Server, session: &str, user: &str, message: &str) -> Value {
    let form = [
        ("message", message),
        ("session_id", session),
        ("user_id", user),
        ("stream", "false"),
    ];
    post_form_json(server, "/agents/scripted/runs", &form).await
}

async fn get(server: &Server, path: &str) -> (u16, Value) {
    let response = client().get(server.url(path)).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn sessions_list_filter_page_and_sort() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    for (session, user) in [("s-a", "u1"), ("s-b", "u1"), ("s-c", "u2")] {
        run(
            &server,
            session,
            user,
            &format!("hello from {session}\n/usage 10 5 2 0.01"),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, all) = get(&server, "/sessions").await;
    assert_eq!(status, 200);
    assert_eq!(all["meta"]["total_count"], 3);
    let ids: Vec<&str> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["s-c", "s-b", "s-a"], "newest first");
    assert_eq!(all["data"][0]["metadata"]["sdk"], "scripted");
    assert_eq!(all["data"][0]["session_name"], "hello from s-c");
    let (_, mine) = get(&server, "/sessions?type=agent&user_id=u1&sort_order=asc").await;
    let ids: Vec<&str> = mine["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["s-a", "s-b"]);
    let (_, page) = get(&server, "/sessions?limit=2&page=2").await;
    assert_eq!(page["meta"]["total_pages"], 2);
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    let (_, named) = get(&server, "/sessions?session_name=FROM%20S-B").await;
    assert_eq!(named["meta"]["total_count"], 1);
    assert_eq!(named["data"][0]["session_id"], "s-b");
    let (_, other_agent) = get(&server, "/sessions?component_id=nobody").await;
    assert_eq!(other_agent["meta"]["total_count"], 0);
    for bad in [
        "/sessions?limit=0",
        "/sessions?page=x",
        "/sessions?sort_order=sideways",
        "/sessions?type=robot",
    ] {
        assert_eq!(get(&server, bad).await.0, 422, "{bad}");
    }
}

#[tokio::test]
async fn a_session_shows_its_runs_and_summed_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    run(&server, "s", "u", "first\n/usage 100 20 5 0.5").await;
    run(&server, "s", "u", "second\n/usage 50 10 0 0.25").await;
    let (status, detail) = get(&server, "/sessions/s").await;
    assert_eq!(status, 200);
    for key in ["agent_id", "agent_session_id", "session_id", "session_name"] {
        assert!(detail[key].is_string(), "{key}: {detail}");
    }
    assert_eq!(detail["session_metrics"]["total_tokens"], 180);
    assert_eq!(detail["session_metrics"]["cost"], 0.75);
    assert_eq!(detail["metadata"]["sdk"], "scripted");
    assert!(detail["metadata"]["harness_session_id"].is_string());
    let (_, runs) = get(&server, "/sessions/s/runs").await;
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(
        runs.iter()
            .all(|r| r["status"] == "COMPLETED" && r["run_id"].is_string())
    );
    assert!(
        runs.iter().all(|r| r["metadata"]["sdk"] == "scripted"),
        "{runs:?}"
    );
    assert_eq!(get(&server, "/sessions/nope").await.0, 404);
    assert_eq!(get(&server, "/sessions/nope/runs").await.0, 404);
}

#[tokio::test]
async fn deleting_a_session_leaves_a_tombstone_and_the_audit_trail() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let first = run(&server, "gone", "u", "remember me").await;
    let run_id = first["run_id"].as_str().unwrap().to_owned();

    let busy_run = {
        let url = server.url("/agents/scripted/runs");
        tokio::spawn(async move {
            client()
                .post(url)
                .form(&[
                    ("message", "/sleep 600"),
                    ("session_id", "gone"),
                    ("stream", "false"),
                ])
                .send()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let busy = client()
        .delete(server.url("/sessions/gone"))
        .send()
        .await
        .unwrap();
    assert_eq!(busy.status(), 409);
    busy_run.await.unwrap().unwrap();

    let deleted = client()
        .delete(server.url("/sessions/gone"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(get(&server, "/sessions/gone").await.0, 404);
    assert_eq!(
        get(&server, &format!("/agents/scripted/runs/{run_id}"))
            .await
            .0,
        404
    );
    assert_eq!(get(&server, "/sessions").await.1["meta"]["total_count"], 0);
    assert_eq!(
        client()
            .delete(server.url("/sessions/gone"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    // The id can be used again, for a new session that remembers nothing.
    let fresh = run(&server, "gone", "u", "new start\n/history").await;
    assert_eq!(fresh["content"], "new start");
    server.terminate();

    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let kinds: Vec<&'static str> = journal
        .read_from(JournalPos(0))
        .map(|r| r.unwrap().event.kind())
        .collect();
    assert!(kinds.contains(&"SessionDeleted"));
    assert_eq!(kinds.iter().filter(|k| **k == "SessionCreated").count(), 2);
    assert!(journal.verify(|_| ()).unwrap().is_ok());
}
