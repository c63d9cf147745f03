//! Bearer API key auth against the real binary: on when the configured environment
//! variable is set; every route but `/health` answers 401 without the key.

use turnstile_tests::{Server, http_client as client};

#[tokio::test]
async fn routes_need_the_key_once_it_is_configured() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with_env(dir.path(), &[], &[("TURNSTILE_API_KEY", "s3cret-key")]);
    assert_eq!(
        client()
            .get(server.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for (method, path) in [
        ("GET", "/agents"),
        ("GET", "/sessions"),
        ("POST", "/agents/scripted/runs"),
        ("GET", "/agents/scripted/runs/x"),
    ] {
        let request = client().request(method.parse().unwrap(), server.url(path));
        let missing = request.try_clone().unwrap().send().await.unwrap();
        assert_eq!(missing.status(), 401, "{method} {path}");
        assert_eq!(missing.headers()["www-authenticate"], "Bearer");
        let body: serde_json::Value = missing.json().await.unwrap();
        assert_eq!(body["error_type"], "unauthorized");
        let wrong = request
            .try_clone()
            .unwrap()
            .bearer_auth("s3cret-kez")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401, "{method} {path}");
    }
    let agents = client()
        .get(server.url("/agents"))
        .bearer_auth("s3cret-key")
        .send()
        .await
        .unwrap();
    assert_eq!(agents.status(), 200);
    let run = client()
        .post(server.url("/agents/scripted/runs"))
        .bearer_auth("s3cret-key")
        .form(&[("message", "hi"), ("stream", "false")])
        .send()
        .await
        .unwrap();
    assert_eq!(run.status(), 200);
}

#[tokio::test]
async fn without_a_key_auth_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    assert_eq!(
        client()
            .get(server.url("/agents"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// Issue 13, defect 9: an empty key used to turn auth off silently.
#[test]
fn an_empty_key_variable_refuses_to_start_naming_it_13() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(turnstile_tests::turnstile_bin())
        .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("TURNSTILE_API_KEY", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("TURNSTILE_API_KEY is set but empty"),
        "{stderr}"
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "a refused start wrote into the data directory"
    );
}

/// Issue 13, defect 9: the scheme is case-insensitive (RFC 9110 §11.1).
#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive_13() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with_env(dir.path(), &[], &[("TURNSTILE_API_KEY", "k3y")]);
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let answer = client()
            .get(server.url("/agents"))
            .header("authorization", format!("{scheme} k3y"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{scheme}");
    }
    let wrong = client()
        .get(server.url("/agents"))
        .header("authorization", "Basic k3y")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
}
