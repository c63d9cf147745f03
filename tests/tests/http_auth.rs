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
    let server = Server::start_with_env(dir.path(), &[], &[("TURNSTILE_API_KEY", "")]);
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
