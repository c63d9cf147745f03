//! Signed tokens against the real binary (issue 31, spec `authorization.md`): keys made
//! per test (HS256, RS256, ES256, a JWKS file of two keys), every row of the scopes
//! table allowed and refused, every forged or stale token `401`, and per-user isolation
//! over every read and write route, after a restart, and on two replicas sharing one
//! PostgreSQL.

use std::path::{Path, PathBuf};

use jsonwebtoken::Algorithm;
use serde_json::{Value, json};
use turnstile_tests::tokens::{self, claims, now_s};
use turnstile_tests::{Server, http_client, turnstile_env, turnstile_in_ok};

/// A configuration with `[auth]` lines and two scripted agents.
fn config(dir: &Path, auth: &str, journal: &str) -> PathBuf {
    let path = dir.join("turnstile.toml");
    std::fs::write(
        &path,
        format!(
            "[auth]\nmode = \"jwt\"\n{auth}\n\n{journal}\n\n[[agents]]\nid = \"scripted\"\nharness = \"scripted\"\n\n[[agents]]\nid = \"helper\"\nharness = \"scripted\"\n"
        ),
    )
    .unwrap();
    path
}

fn start(dir: &Path, config: &Path, env: &[(&str, &str)]) -> Server {
    Server::start_with_env(
        &dir.join("data"),
        &["--config", config.to_str().unwrap()],
        env,
    )
}

/// The status and JSON body (`null` when the body is not JSON) of one request.
async fn call(
    server: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    form: &[(&str, &str)],
) -> (u16, Value) {
    let mut request = http_client().request(method.parse().unwrap(), server.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if method == "POST" {
        request = request.form(form);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn turn(server: &Server, token: &str, session: &str, extra: &[(&str, &str)]) -> Value {
    let mut form = vec![
        ("message", "hello"),
        ("session_id", session),
        ("stream", "false"),
    ];
    form.extend_from_slice(extra);
    let (status, body) = call(server, "POST", "/agents/scripted/runs", Some(token), &form).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn pem_toml(pem: &str) -> String {
    format!("'''\n{pem}'''")
}

#[tokio::test]
async fn forged_stale_and_misaddressed_tokens_are_refused_and_the_log_names_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let key = tokens::rsa();
    let other = tokens::rsa();
    let file = config(
        dir.path(),
        &format!(
            "verification_keys = [{}]\nverify_audience = true\naudience = \"turnstile-test\"",
            pem_toml(&key.public_pem)
        ),
        "",
    );
    let server = start(dir.path(), &file, &[]);
    let good = |sub: &str| {
        let mut claims = claims(Some(sub), &["agents:read"]);
        claims["aud"] = json!("turnstile-test");
        claims
    };
    // Open: /health and the console's files.
    for path in ["/health", "/ui/", "/ui/app.js"] {
        assert_eq!(call(&server, "GET", path, None, &[]).await.0, 200, "{path}");
    }
    let valid = key.sign(None, &good("alice"));
    let (status, body) = call(&server, "GET", "/agents", Some(&valid), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.as_array().map(Vec::len), Some(2), "{body}");
    // The scheme in any case.
    let lower = http_client()
        .get(server.url("/agents"))
        .header("authorization", format!("bearer {valid}"))
        .send()
        .await
        .unwrap();
    assert_eq!(lower.status(), 200);

    // A token that expires while it is in use is refused once it has (the server
    // remembers tokens it verified, and checks their times on every use).
    let mut expiring = good("alice");
    expiring["exp"] = json!(now_s() - 8);
    let expiring = key.sign(None, &expiring);
    assert_eq!(
        call(&server, "GET", "/agents", Some(&expiring), &[])
            .await
            .0,
        200
    );
    tokio::time::sleep(std::time::Duration::from_millis(3_500)).await;
    let (status, body) = call(&server, "GET", "/agents", Some(&expiring), &[]).await;
    assert_eq!(
        (status, body["detail"].as_str()),
        (401, Some("Token has expired"))
    );

    let missing = http_client()
        .get(server.url("/agents"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 401);
    assert_eq!(missing.headers()["www-authenticate"], "Bearer");
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["detail"], "Authorization header missing");
    assert_eq!(body["error_type"], "unauthorized");

    let mut expired = good("alice");
    expired["exp"] = json!(now_s() - 60);
    let mut not_yet = good("alice");
    not_yet["nbf"] = json!(now_s() + 120);
    let mut elsewhere = good("alice");
    elsewhere["aud"] = json!("another-server");
    let mut no_audience = good("alice");
    no_audience.as_object_mut().unwrap().remove("aud");
    let mut no_scopes = good("alice");
    no_scopes.as_object_mut().unwrap().remove("scopes");
    let refused = [
        (
            "expired",
            key.sign(None, &expired),
            Some("Token has expired"),
        ),
        ("not yet valid", key.sign(None, &not_yet), None),
        (
            "another audience",
            key.sign(None, &elsewhere),
            Some("Invalid token audience - token not valid for this AgentOS instance"),
        ),
        ("no audience", key.sign(None, &no_audience), None),
        ("another key", other.sign(None, &good("alice")), None),
        ("alg none", tokens::unsigned(&good("alice")), None),
        (
            "the public key as an HMAC secret",
            tokens::hmac(Algorithm::HS256, key.public_pem.as_bytes(), &good("alice")),
            None,
        ),
        ("no scopes claim", key.sign(None, &no_scopes), None),
        ("not a token", "not.a.token".to_owned(), None),
        (
            "a tampered payload",
            {
                let mut parts: Vec<String> = valid.split('.').map(str::to_owned).collect();
                parts[1] = tokens::unsigned(&json!({"sub": "root", "scopes": ["agent_os:admin"]}))
                    .split('.')
                    .nth(1)
                    .unwrap()
                    .to_owned();
                parts.join(".")
            },
            None,
        ),
    ];
    for (what, token, detail) in &refused {
        let response = http_client()
            .get(server.url("/agents"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "{what}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer", "{what}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error_type"], "unauthorized", "{what}: {body}");
        match detail {
            Some(detail) => assert_eq!(body["detail"], *detail, "{what}"),
            None => assert_eq!(body["detail"], "Invalid authentication token", "{what}"),
        }
    }
    let logs = server.terminate_logs();
    assert!(
        logs.iter()
            .any(|line| line.contains("GET /agents 200") && line.contains("by alice")),
        "the request log names the caller: {logs:?}"
    );
    for (what, token, _) in refused.iter().chain([&("valid", valid.clone(), None)]) {
        let signature = token.rsplit('.').next().unwrap_or_default();
        assert!(
            // ("not.a.token" has no signature to look for.)
            signature.len() < 20 || !logs.iter().any(|line| line.contains(signature)),
            "the {what} token is in the log"
        );
    }
}

/// One row of the scopes table as a request: method, path, form, and the scope.
type Row = (
    &'static str,
    String,
    Vec<(&'static str, String)>,
    &'static str,
);

/// Every row of the spec's table: (method, path, form, scope).
fn table(run: &str) -> Vec<Row> {
    let form = |pairs: &[(&'static str, &str)]| {
        pairs
            .iter()
            .map(|(key, value)| (*key, (*value).to_owned()))
            .collect::<Vec<_>>()
    };
    vec![
        ("GET", "/agents/scripted".into(), vec![], "agents:read"),
        (
            "POST",
            "/agents/scripted/runs".into(),
            form(&[("message", "hi"), ("session_id", "s2"), ("stream", "false")]),
            "agents:run",
        ),
        (
            "POST",
            format!("/agents/scripted/runs/{run}/continue"),
            form(&[("input", "go on"), ("stream", "false")]),
            "agents:run",
        ),
        (
            "POST",
            format!("/agents/scripted/runs/{run}/cancel"),
            vec![],
            "agents:run",
        ),
        (
            "POST",
            format!("/agents/scripted/runs/{run}/resume"),
            vec![],
            "agents:run",
        ),
        ("GET", "/agents/scripted/runs".into(), vec![], "agents:read"),
        (
            "GET",
            format!("/agents/scripted/runs/{run}"),
            vec![],
            "agents:read",
        ),
        (
            "GET",
            format!("/agents/scripted/runs/{run}/checkpoints"),
            vec![],
            "agents:read",
        ),
        (
            "POST",
            "/agents/scripted/sessions/s1/compact".into(),
            vec![],
            "agents:run",
        ),
        ("GET", "/sessions".into(), vec![], "sessions:read"),
        ("GET", "/sessions/s1".into(), vec![], "sessions:read"),
        ("GET", "/sessions/s1/runs".into(), vec![], "sessions:read"),
        (
            "GET",
            format!("/sessions/s1/runs/{run}"),
            vec![],
            "sessions:read",
        ),
        ("GET", "/metrics".into(), vec![], "metrics:read"),
        ("GET", "/metrics/prometheus".into(), vec![], "metrics:read"),
        ("GET", "/openapi.json".into(), vec![], "config:read"),
        ("GET", "/journal/export".into(), vec![], "agent_os:admin"),
        ("DELETE", "/sessions/s2".into(), vec![], "sessions:delete"),
    ]
}

#[tokio::test]
async fn every_row_of_the_scopes_table_is_allowed_with_its_scope_and_refused_without() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "a-shared-hmac-secret-of-32-bytes!";
    let file = config(dir.path(), "algorithm = \"HS256\"", "");
    // The secret from the environment, as the spec allows.
    let server = start(dir.path(), &file, &[("JWT_VERIFICATION_KEY", secret)]);
    let token = |scopes: &[&str]| {
        tokens::hmac(
            Algorithm::HS256,
            secret.as_bytes(),
            &claims(Some("alice"), scopes),
        )
    };
    let admin = token(&["agent_os:admin"]);
    let first = turn(&server, &admin, "s1", &[]).await;
    let run = first["run_id"].as_str().unwrap().to_owned();
    let every: Vec<&str> = table(&run).iter().map(|row| row.3).collect();
    for (method, path, form, scope) in table(&run) {
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let others: Vec<&str> = every
            .iter()
            .copied()
            .filter(|other| *other != scope && *other != "agent_os:admin")
            .collect();
        let (status, body) = call(&server, method, &path, Some(&token(&others)), &form).await;
        assert_eq!(status, 403, "{method} {path} without {scope}: {body}");
        assert_eq!(body["error_type"], "forbidden");
        assert_eq!(
            body["detail"],
            format!("Insufficient permissions. Required scope(s): {scope}"),
            "{method} {path}"
        );
        let (status, body) = call(&server, method, &path, Some(&token(&[scope])), &form).await;
        assert!(
            (200..300).contains(&status),
            "{method} {path} with {scope}: {status} {body}"
        );
    }
    // Per-agent scopes: the agent in the path, or every agent with `*`.
    let run_on = |agent: &'static str, scope: &'static str| {
        let server = &server;
        let token = token(&[scope]);
        async move {
            call(
                server,
                "POST",
                &format!("/agents/{agent}/runs"),
                Some(&token),
                &[("message", "hi"), ("stream", "false")],
            )
            .await
            .0
        }
    };
    assert_eq!(run_on("scripted", "agents:scripted:run").await, 200);
    assert_eq!(run_on("helper", "agents:scripted:run").await, 403);
    assert_eq!(run_on("helper", "agents:*:run").await, 200);
    assert_eq!(run_on("helper", "agents:helper:read").await, 403);
    // The agent is the one the route reads, percent-decoded.
    assert_eq!(run_on("%73cripted", "agents:scripted:run").await, 200);
    assert_eq!(run_on("%73cripted", "agents:%73cripted:run").await, 403);
    let read = token(&["agents:scripted:read"]);
    assert_eq!(
        call(&server, "GET", "/agents/scripted", Some(&read), &[])
            .await
            .0,
        200
    );
    assert_eq!(
        call(&server, "GET", "/agents/helper", Some(&read), &[])
            .await
            .0,
        403
    );
    // A per-agent scope grants its agent's routes, never another family's.
    assert_eq!(
        call(&server, "GET", "/sessions", Some(&read), &[]).await.0,
        403
    );
    // `GET /agents` lists what the token may read.
    let listed = |scopes: &'static [&'static str]| {
        let server = &server;
        let token = token(scopes);
        async move {
            let (status, body) = call(server, "GET", "/agents", Some(&token), &[]).await;
            assert_eq!(status, 200, "{body}");
            body.as_array()
                .unwrap()
                .iter()
                .map(|agent| agent["id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(&["agents:read"]).await, ["scripted", "helper"]);
    assert_eq!(listed(&["agents:*:read"]).await, ["scripted", "helper"]);
    assert_eq!(listed(&["agents:helper:read"]).await, ["helper"]);
    assert!(
        listed(&["agents:helper:run", "sessions:read"])
            .await
            .is_empty()
    );
    // agno's legacy name for config:read.
    let legacy = token(&["system:read"]);
    assert_eq!(
        call(&server, "GET", "/openapi.json", Some(&legacy), &[])
            .await
            .0,
        200
    );
    // A custom admin scope is not the default one.
    server.terminate();
}

#[tokio::test]
async fn each_user_sees_and_drives_only_their_own_sessions_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let key = tokens::ec();
    let file = config(
        dir.path(),
        &format!(
            "algorithm = \"ES256\"\nuser_isolation = true\nverification_keys = [{}]",
            pem_toml(&key.public_pem)
        ),
        "",
    );
    let user_scopes = [
        "agents:read",
        "agents:run",
        "sessions:read",
        "sessions:delete",
        "metrics:read",
    ];
    let alice = key.sign(None, &claims(Some("alice"), &user_scopes));
    let bob = key.sign(None, &claims(Some("bob"), &user_scopes));
    let admin = key.sign(None, &claims(Some("root"), &["agent_os:admin"]));
    let nobody = key.sign(None, &claims(None, &user_scopes));
    let server = start(dir.path(), &file, &[]);
    // What the body says about the user is overruled by the token.
    let a1 = turn(&server, &alice, "a1", &[("user_id", "bob")]).await;
    assert_eq!(a1["user_id"], "alice", "{a1}");
    let b1 = turn(&server, &bob, "b1", &[]).await;
    let bob_run = b1["run_id"].as_str().unwrap().to_owned();
    let alice_run = a1["run_id"].as_str().unwrap().to_owned();

    check_isolation(&server, &alice, &bob, &admin, &alice_run, &bob_run).await;
    let (status, _) = call(&server, "GET", "/sessions", Some(&nobody), &[]).await;
    assert_eq!(
        status, 401,
        "a token without sub cannot use isolated routes"
    );

    // Two users racing for one new session id: it is exactly one user's.
    for round in 0..20 {
        let session = format!("race-{round}");
        let form = [
            ("message", "mine"),
            ("session_id", session.as_str()),
            ("stream", "false"),
        ];
        let (first, second) = tokio::join!(
            call(
                &server,
                "POST",
                "/agents/scripted/runs",
                Some(&alice),
                &form
            ),
            call(&server, "POST", "/agents/scripted/runs", Some(&bob), &form),
        );
        let statuses = [first.0, second.0];
        assert!(
            statuses.contains(&200) && statuses.iter().all(|s| *s == 200 || *s == 404 || *s == 409),
            "round {round}: {first:?} {second:?}"
        );
        let (_, runs) = call(
            &server,
            "GET",
            &format!("/sessions/{session}/runs"),
            Some(&admin),
            &[],
        )
        .await;
        let users: std::collections::BTreeSet<&str> = runs
            .as_array()
            .unwrap()
            .iter()
            .map(|run| run["user_id"].as_str().unwrap())
            .collect();
        assert_eq!(
            users.len(),
            1,
            "round {round}: one owner's runs only: {runs}"
        );
    }

    // After a restart, from the journal alone.
    server.terminate();
    let server = start(dir.path(), &file, &[]);
    check_isolation(&server, &alice, &bob, &admin, &alice_run, &bob_run).await;

    // The CLI shows what its token may see.
    let listed = |token: &str| {
        let output = turnstile_env(
            &["sessions", "list", "--url", &server.base, "--token", token],
            &[],
        );
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let mine = listed(&alice);
    assert!(mine.contains("a1") && !mine.contains("b1"), "{mine}");
    let output = turnstile_env(
        &["sessions", "list", "--url", &server.base],
        &[("TURNSTILE_TOKEN", &bob)],
    );
    let theirs = String::from_utf8_lossy(&output.stdout);
    assert!(
        theirs.contains("b1") && !theirs.contains("a1"),
        "{output:?}"
    );
    let output = turnstile_env(
        &[
            "sessions",
            "show",
            "b1",
            "--url",
            &server.base,
            "--token",
            &alice,
        ],
        &[],
    );
    assert!(
        !output.status.success(),
        "alice's CLI cannot show bob's session"
    );
    let data = server.data_dir.clone();
    server.terminate();

    // The journal keeps each session's owner.
    let timeline = turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "timeline",
            "--session",
            "a1",
            "--data-dir",
            data.to_str().unwrap(),
        ],
    );
    assert!(timeline.contains("user alice"), "{timeline}");

    // An export imported into a new data directory keeps every owner.
    let export = dir.path().join("export.jsonl");
    turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "export",
            "--data-dir",
            data.to_str().unwrap(),
            "--out",
            export.to_str().unwrap(),
        ],
    );
    let imported = dir.path().join("imported");
    turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "import",
            "--in",
            export.to_str().unwrap(),
            "--data-dir",
            imported.to_str().unwrap(),
        ],
    );
    let server = Server::start_with(&imported, &["--config", file.to_str().unwrap()]);
    check_isolation(&server, &alice, &bob, &admin, &alice_run, &bob_run).await;
    server.terminate();
}

/// A request: method, path, form.
type Request<'a> = (&'a str, String, Vec<(&'a str, &'a str)>);

/// Every read and write route, as alice (who owns `a1`), bob (`b1`) and the admin.
async fn check_isolation(
    server: &Server,
    alice: &str,
    bob: &str,
    admin: &str,
    alice_run: &str,
    bob_run: &str,
) {
    let ids = |body: &Value, key: &str| -> Vec<String> {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item[key].as_str().unwrap().to_owned())
            .collect()
    };
    for query in [
        "/sessions",
        "/sessions?user_id=bob",
        "/sessions?component_id=scripted",
    ] {
        let (status, body) = call(server, "GET", query, Some(alice), &[]).await;
        assert_eq!(status, 200);
        assert!(
            ids(&body, "session_id").iter().all(|id| id != "b1"),
            "{query}: {body}"
        );
        assert!(
            ids(&body, "session_id").contains(&"a1".to_owned()),
            "{query}: {body}"
        );
    }
    let (_, all) = call(server, "GET", "/sessions?limit=100", Some(admin), &[]).await;
    let everyone = ids(&all, "session_id");
    assert!(
        everyone.contains(&"a1".into()) && everyone.contains(&"b1".into()),
        "{all}"
    );
    let (_, runs) = call(
        server,
        "GET",
        "/agents/scripted/runs?limit=100",
        Some(alice),
        &[],
    )
    .await;
    let listed = ids(&runs, "run_id");
    assert!(
        listed.contains(&alice_run.to_owned()) && !listed.contains(&bob_run.to_owned()),
        "{runs}"
    );
    assert_eq!(
        runs["meta"]["total_count"].as_u64(),
        Some(listed.len() as u64),
        "{runs}"
    );
    let (_, runs) = call(
        server,
        "GET",
        "/agents/scripted/runs?limit=100",
        Some(admin),
        &[],
    )
    .await;
    assert!(ids(&runs, "run_id").contains(&bob_run.to_owned()), "{runs}");
    // Metrics: alice's runs only; the admin's include bob's.
    let count = |body: &Value| -> u64 {
        body["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|day| day["agent_runs_count"].as_u64().unwrap())
            .sum()
    };
    let (_, mine) = call(server, "GET", "/metrics", Some(alice), &[]).await;
    let (_, theirs) = call(server, "GET", "/metrics", Some(bob), &[]).await;
    let (_, all) = call(server, "GET", "/metrics", Some(admin), &[]).await;
    assert!(count(&mine) >= 1 && count(&theirs) >= 1, "{mine} {theirs}");
    assert_eq!(
        count(&mine) + count(&theirs),
        count(&all),
        "{mine} {theirs} {all}"
    );
    // Runtime-wide counters are the admin's under isolation.
    assert_eq!(
        call(server, "GET", "/metrics/prometheus", Some(alice), &[])
            .await
            .0,
        403
    );
    assert_eq!(
        call(server, "GET", "/metrics/prometheus", Some(admin), &[])
            .await
            .0,
        200
    );

    // Bob's session and run, as alice: as absent as what never existed.
    let absent: Vec<Request> = vec![
        ("GET", "/sessions/b1".into(), vec![]),
        ("GET", "/sessions/b1/runs".into(), vec![]),
        ("GET", format!("/sessions/b1/runs/{bob_run}"), vec![]),
        ("GET", "/agents/scripted/runs?session_id=b1".into(), vec![]),
        ("GET", format!("/agents/scripted/runs/{bob_run}"), vec![]),
        (
            "GET",
            format!("/agents/scripted/runs/{bob_run}/checkpoints"),
            vec![],
        ),
        (
            "POST",
            format!("/agents/scripted/runs/{bob_run}/resume"),
            vec![],
        ),
        (
            "POST",
            format!("/agents/scripted/runs/{bob_run}/continue"),
            vec![("stream", "false")],
        ),
        (
            "POST",
            format!("/agents/scripted/runs/{bob_run}/cancel"),
            vec![],
        ),
        (
            "POST",
            "/agents/scripted/sessions/b1/compact".into(),
            vec![],
        ),
        ("DELETE", "/sessions/b1".into(), vec![]),
        (
            "POST",
            "/agents/scripted/runs".into(),
            vec![
                ("message", "take it"),
                ("session_id", "b1"),
                ("stream", "false"),
            ],
        ),
        (
            "POST",
            "/agents/scripted/runs".into(),
            vec![
                ("message", "take it"),
                ("session_id", "b1"),
                ("stream", "true"),
            ],
        ),
        (
            "POST",
            "/agents/scripted/runs".into(),
            vec![
                ("message", "take it"),
                ("session_id", "b1"),
                ("background", "true"),
                ("stream", "false"),
            ],
        ),
    ];
    for (method, path, form) in &absent {
        let (status, body) = call(server, method, path, Some(alice), form).await;
        assert_eq!(status, 404, "alice: {method} {path}: {body}");
    }
    // An unknown run is answered as bob's is.
    let unknown = "0190f000-0000-7000-8000-000000000000";
    let (status, _) = call(
        server,
        "POST",
        &format!("/agents/scripted/runs/{unknown}/cancel"),
        Some(alice),
        &[],
    )
    .await;
    assert_eq!(status, 404);
    // Bob's session is untouched: one run, still there.
    let (status, runs) = call(server, "GET", "/sessions/b1/runs", Some(bob), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    // Alice's own routes work.
    for path in [
        "/sessions/a1".to_owned(),
        format!("/agents/scripted/runs/{alice_run}"),
        format!("/agents/scripted/runs/{alice_run}/checkpoints"),
    ] {
        assert_eq!(
            call(server, "GET", &path, Some(alice), &[]).await.0,
            200,
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_jwks_file_of_two_keys_verifies_tokens_by_kid() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new, stranger) = (tokens::rsa(), tokens::rsa(), tokens::rsa());
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, tokens::jwks(&[("2026-11", &old), ("2026-12", &new)])).unwrap();
    let file = config(dir.path(), "", "");
    let server = start(
        dir.path(),
        &file,
        &[("JWT_JWKS_FILE", jwks.to_str().unwrap())],
    );
    let read = claims(Some("alice"), &["agents:read"]);
    for (what, token, status) in [
        ("the old key", old.sign(Some("2026-11"), &read), 200),
        ("the new key", new.sign(Some("2026-12"), &read), 200),
        (
            "the old key under the new kid",
            old.sign(Some("2026-12"), &read),
            401,
        ),
        ("an unknown kid", stranger.sign(Some("2027-01"), &read), 401),
        ("no kid", new.sign(None, &read), 401),
    ] {
        assert_eq!(
            call(&server, "GET", "/agents", Some(&token), &[]).await.0,
            status,
            "{what}"
        );
    }
    server.terminate();
}

#[test]
fn a_jwt_mode_without_a_usable_key_refuses_to_start_naming_what_it_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |file: &Path, env: &[(&str, &str)]| {
        let data = dir.path().join("data");
        let output = turnstile_env(
            &[
                "serve",
                "--addr",
                "127.0.0.1:0",
                "--data-dir",
                data.to_str().unwrap(),
                "--config",
                file.to_str().unwrap(),
            ],
            env,
        );
        assert!(!output.status.success());
        assert!(!data.exists(), "a refused start leaves no data directory");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let none = config(dir.path(), "", "");
    let said = serve(&none, &[]);
    for named in [
        "auth.verification_keys",
        "JWT_VERIFICATION_KEY",
        "auth.jwks_file",
        "JWT_JWKS_FILE",
    ] {
        assert!(said.contains(named), "{said}");
    }
    let bad = config(dir.path(), "verification_keys = [\"not a pem\"]", "");
    let said = serve(&bad, &[]);
    assert!(
        said.contains("auth.verification_keys[0] is not a PEM RSA public key"),
        "{said}"
    );
    let missing = config(dir.path(), "jwks_file = \"nowhere.json\"", "");
    let said = serve(&missing, &[]);
    assert!(said.contains("cannot read the JWKS file"), "{said}");
    let unknown = config(dir.path(), "algorithm = \"none\"", "");
    let said = serve(&unknown, &[]);
    assert!(said.contains("auth.algorithm must be one of"), "{said}");
    // An HMAC secret is masked by --print-config; a public key is not a secret.
    let key = tokens::rsa();
    let printed = config(
        dir.path(),
        "algorithm = \"HS256\"\nverification_keys = [\"hmac-secret-value\"]\nuser_isolation = true",
        "",
    );
    let output = turnstile_env(
        &[
            "serve",
            "--config",
            printed.to_str().unwrap(),
            "--print-config",
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        text.contains("[auth]") && text.contains("user_isolation = true"),
        "{text}"
    );
    assert!(
        !text.contains("hmac-secret-value") && text.contains("<masked>"),
        "{text}"
    );
    let public = config(
        dir.path(),
        &format!("verification_keys = [{}]", pem_toml(&key.public_pem)),
        "",
    );
    let output = turnstile_env(
        &[
            "serve",
            "--config",
            public.to_str().unwrap(),
            "--print-config",
        ],
        &[],
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("BEGIN PUBLIC KEY"));
}

#[tokio::test]
async fn isolation_holds_on_two_replicas_sharing_one_postgresql() {
    let Some(url) = turnstile_tests::postgres::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let secret = "replicas-share-this-hmac-secret!";
    let file = config(
        dir.path(),
        &format!(
            "algorithm = \"HS256\"\nuser_isolation = true\nverification_keys = [\"{secret}\"]"
        ),
        &format!("[journal]\nbackend = \"postgres\"\nurl = \"{url}\"\nlease_s = 2"),
    );
    let replica = |name: &str| {
        Server::start_with(
            &dir.path().join(name),
            &["--config", file.to_str().unwrap()],
        )
    };
    let (a, b) = (replica("a"), replica("b"));
    let scopes = [
        "agents:read",
        "agents:run",
        "sessions:read",
        "sessions:delete",
        "metrics:read",
    ];
    let token = |sub: &str| {
        tokens::hmac(
            Algorithm::HS256,
            secret.as_bytes(),
            &claims(Some(sub), &scopes),
        )
    };
    let (alice, bob) = (token("alice"), token("bob"));
    let first = turn(&a, &alice, "shared-1", &[]).await;
    let run = first["run_id"].as_str().unwrap().to_owned();
    // On the other replica at once: alice sees her session, bob does not.
    let (status, body) = call(&b, "GET", "/sessions/shared-1", Some(&alice), &[]).await;
    assert_eq!(status, 200, "{body}");
    for path in [
        "/sessions/shared-1".to_owned(),
        format!("/agents/scripted/runs/{run}"),
    ] {
        assert_eq!(
            call(&b, "GET", &path, Some(&bob), &[]).await.0,
            404,
            "{path}"
        );
    }
    let (status, body) = call(
        &b,
        "POST",
        "/agents/scripted/runs",
        Some(&bob),
        &[
            ("message", "take it"),
            ("session_id", "shared-1"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(
        status, 404,
        "bob cannot take alice's session on the other replica: {body}"
    );
    // Alice's next turn on the other replica continues her session.
    let second = turn(&b, &alice, "shared-1", &[]).await;
    assert_eq!(second["session_id"], "shared-1");
    let (_, runs) = call(&a, "GET", "/sessions/shared-1/runs", Some(&alice), &[]).await;
    assert_eq!(runs.as_array().map(Vec::len), Some(2), "{runs}");
    let (_, listed) = call(&b, "GET", "/sessions", Some(&bob), &[]).await;
    assert_eq!(listed["meta"]["total_count"], 0, "{listed}");
    a.terminate();
    b.terminate();
}
