//! Issue 12 over HTTP against the real binary: an agent's runs newest first a page at a
//! time, filtered by status and session; a deleted session's runs and metrics leave the
//! lists; and the maintained aggregates (sessions list, daily metrics, run reads) say
//! the same after a restart, from the stored read models.

use serde_json::Value;
use turnstile_tests::{Server, get_json, http_client as client, post_form_json};

async fn run(server: &Server, session: &str, message: &str) -> Value {
    let form = [
        ("message", message),
        ("session_id", session),
        ("user_id", "u1"),
        ("stream", "false"),
    ];
    post_form_json(server, "/agents/scripted/runs", &form).await
}

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["run_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn agent_runs_are_paginated_newest_first_and_follow_deletes_and_restarts_12() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut runs = Vec::new();
    for (session, message) in [
        ("a", "one\n/usage 10 5 0 0.5"),
        ("b", "two\n/fail permanent billing"),
        ("a", "three\n/usage 1 1 0 0.25"),
        ("b", "four"),
        ("a", "five"),
    ] {
        runs.push(
            run(&server, session, message).await["run_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let newest_first: Vec<String> = runs.iter().rev().cloned().collect();

    let page = get_json(&server, "/agents/scripted/runs?limit=2&page=1").await;
    assert_eq!(ids(&page), newest_first[..2]);
    assert_eq!(page["meta"]["total_count"], 5);
    assert_eq!(page["meta"]["total_pages"], 3);
    let last = get_json(&server, "/agents/scripted/runs?limit=2&page=3").await;
    assert_eq!(ids(&last), newest_first[4..]);
    // The default page holds them all, each a whole RunOutput.
    let all = get_json(&server, "/agents/scripted/runs").await;
    assert_eq!(ids(&all), newest_first);
    assert_eq!(all["meta"]["limit"], 20);
    assert_eq!(all["data"][4]["content"], "echo: one");
    let errors = get_json(&server, "/agents/scripted/runs?status=error").await;
    assert_eq!(ids(&errors), [runs[1].clone()]);
    assert_eq!(errors["meta"]["total_count"], 1);
    let of_a = get_json(&server, "/agents/scripted/runs?session_id=a&limit=2").await;
    assert_eq!(ids(&of_a), [runs[4].clone(), runs[2].clone()]);
    assert_eq!(of_a["meta"]["total_count"], 3);
    let too_many = client()
        .get(server.url("/agents/scripted/runs?limit=101"))
        .send()
        .await
        .unwrap();
    assert_eq!(too_many.status(), 422);

    let metrics = get_json(&server, "/metrics").await;
    let day = &metrics["metrics"][0];
    assert_eq!(
        (
            day["agent_runs_count"].clone(),
            day["agent_sessions_count"].clone()
        ),
        (Value::from(5), Value::from(2))
    );
    // 10 + 1, and a token for each of "four" and "five" (a quarter of their characters).
    assert_eq!(day["token_metrics"]["input_tokens"], 13);
    assert_eq!(day["token_metrics"]["cost"], 0.75);

    // Deleting a session takes its runs out of the agent's list and the metrics.
    let deleted = client()
        .delete(server.url("/sessions/b"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let after = get_json(&server, "/agents/scripted/runs").await;
    assert_eq!(
        ids(&after),
        [runs[4].clone(), runs[2].clone(), runs[0].clone()]
    );
    let metrics = get_json(&server, "/metrics").await;
    assert_eq!(metrics["metrics"][0]["agent_runs_count"], 3);
    assert_eq!(metrics["metrics"][0]["agent_sessions_count"], 1);
    let sessions = get_json(&server, "/sessions").await;
    assert_eq!(sessions["meta"]["total_count"], 1);

    // A session id used again begins with no runs.
    let again = run(&server, "b", "six").await["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let of_b = get_json(&server, "/sessions/b/runs").await;
    assert_eq!(
        of_b.as_array()
            .unwrap()
            .iter()
            .map(|run| run["run_id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        [again.as_str()]
    );

    // After a restart the same answers come from the stored read models.
    let before = (
        get_json(&server, "/agents/scripted/runs").await,
        get_json(&server, "/metrics").await["metrics"].clone(),
        get_json(&server, "/sessions").await["data"].clone(),
        get_json(&server, &format!("/agents/scripted/runs/{}", runs[0])).await,
    );
    server.terminate();
    let server = Server::start(dir.path());
    let after = (
        get_json(&server, "/agents/scripted/runs").await,
        get_json(&server, "/metrics").await["metrics"].clone(),
        get_json(&server, "/sessions").await["data"].clone(),
        get_json(&server, &format!("/agents/scripted/runs/{}", runs[0])).await,
    );
    // `created_at`/`updated_at` of a metrics day are the time of the request.
    let strip = |mut days: Value| {
        for day in days.as_array_mut().unwrap() {
            day.as_object_mut().unwrap().remove("created_at");
            day.as_object_mut().unwrap().remove("updated_at");
        }
        days
    };
    assert_eq!(before.0, after.0);
    assert_eq!(strip(before.1), strip(after.1));
    assert_eq!(before.2, after.2);
    assert_eq!(before.3, after.3);
    server.terminate();
}
