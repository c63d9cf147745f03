//! Attachments over HTTP against the real binary: multipart `files` and base64
//! `images` / `input_files` staged in the agent's cwd and named in the prompt, listed
//! in the run's input with size and hash, removed after the run unless kept, staged
//! again for later turns, and refused when unsafe.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use turnstile_tests::{Server, http_client as client};

fn config(dir: &Path, workspace: &Path) -> std::path::PathBuf {
    let path = dir.join("turnstile.toml");
    let text = format!(
        "[[agents]]\nid = \"scripted\"\nharness = \"scripted\"\ncwd = \"{ws}\"\n\n[[agents]]\nid = \"keeper\"\nharness = \"scripted\"\ncwd = \"{ws}\"\nkeep_uploads = true\n",
        ws = workspace.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn uploads(workspace: &Path, run_id: &str) -> std::path::PathBuf {
    workspace
        .canonicalize()
        .unwrap()
        .join(".turnstile/uploads")
        .join(run_id)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn multipart_run(
    server: &Server,
    agent: &str,
    session: &str,
    message: &str,
    files: &[(&str, &[u8])],
) -> reqwest::Response {
    let mut form = reqwest::multipart::Form::new()
        .text("message", message.to_owned())
        .text("stream", "false")
        .text("session_id", session.to_owned());
    for (name, bytes) in files {
        form = form.part(
            "files",
            reqwest::multipart::Part::bytes(bytes.to_vec())
                .file_name(name.to_string())
                .mime_str("text/plain")
                .unwrap(),
        );
    }
    client()
        .post(server.url(&format!("/agents/{agent}/runs")))
        .multipart(form)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn attachments_are_staged_named_listed_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let config = config(dir.path(), &workspace);
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );

    let images =
        json!([{"id": "pic", "format": "png", "content": b64(b"\x89PNG fake")}]).to_string();
    let input_files =
        json!([{"filename": "spec.md", "mime_type": "text/markdown", "content": b64(b"# spec")}])
            .to_string();
    let mut form = reqwest::multipart::Form::new()
        .text("message", "read these")
        .text("stream", "false")
        .text("images", images)
        .text("input_files", input_files);
    form = form.part(
        "files",
        reqwest::multipart::Part::bytes(b"print(1)".to_vec())
            .file_name("main.py")
            .mime_str("text/x-python")
            .unwrap(),
    );
    let run: Value = client()
        .post(server.url("/agents/scripted/runs"))
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "COMPLETED", "{run}");
    let run_id = run["run_id"].as_str().unwrap();
    let content = run["content"].as_str().unwrap();
    assert!(
        // Relative to the agent's cwd: no server path reaches a client (issue 13).
        content.contains(&format!("Attached files (in .turnstile/uploads/{run_id})")),
        "{content}"
    );
    for name in [
        "pic.png (image/png, 9 bytes)",
        "spec.md (text/markdown, 6 bytes)",
        "main.py (text/x-python, 8 bytes)",
    ] {
        assert!(content.contains(name), "{name} not named in {content}");
    }
    let listed = run["input"]["files"].as_array().unwrap();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[1]["name"], "spec.md");
    assert_eq!(listed[2]["size"], 8);
    assert_eq!(listed[2]["sha256"].as_str().unwrap().len(), 64);
    assert!(
        !uploads(&workspace, run_id).exists(),
        "removed after the run"
    );

    // keep_uploads keeps them.
    let kept: Value = multipart_run(
        &server,
        "keeper",
        "k",
        "keep",
        &[("notes.txt", b"remember")],
    )
    .await
    .json()
    .await
    .unwrap();
    let kept_dir = uploads(&workspace, kept["run_id"].as_str().unwrap());
    assert_eq!(
        std::fs::read(kept_dir.join("notes.txt")).unwrap(),
        b"remember"
    );
}

#[tokio::test]
async fn later_turns_get_earlier_attachments_staged_again() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let config = config(dir.path(), &workspace);
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let first: Value = multipart_run(
        &server,
        "scripted",
        "s",
        "first",
        &[("data.csv", b"a,b\n1,2\n")],
    )
    .await
    .json()
    .await
    .unwrap();
    let first_dir = uploads(&workspace, first["run_id"].as_str().unwrap());
    assert!(!first_dir.exists());
    let url = server.url("/agents/scripted/runs");
    let second = tokio::spawn(async move {
        client()
            .post(url)
            .form(&[
                ("message", "second\n/sleep 800"),
                ("session_id", "s"),
                ("stream", "false"),
            ])
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        std::fs::read(first_dir.join("data.csv")).unwrap(),
        b"a,b\n1,2\n",
        "restored while the later turn runs"
    );
    let second = second.await.unwrap();
    assert!(
        second["content"]
            .as_str()
            .unwrap()
            .contains("Files attached earlier"),
        "{second}"
    );
    assert!(!first_dir.exists(), "removed again afterwards");
}

#[tokio::test]
async fn unsafe_attachments_are_refused_and_write_nothing_outside() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let config = config(dir.path(), &workspace);
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let traversal = multipart_run(&server, "scripted", "t", "x", &[("../evil.txt", b"evil")]).await;
    assert_eq!(traversal.status(), 400);
    assert!(!dir.path().join("evil.txt").exists() && !workspace.join("evil.txt").exists());
    for (field, value, status) in [
        (
            "images",
            json!([{"url": "https://example.invalid/a.png"}]).to_string(),
            400,
        ),
        (
            "input_files",
            json!([{"filepath": "/etc/passwd"}]).to_string(),
            400,
        ),
        ("images", json!({"content": "aGk="}).to_string(), 422),
        (
            "input_files",
            json!([{"filename": "clip.mp4", "mime_type": "video/mp4", "content": "aGk="}])
                .to_string(),
            400,
        ),
        (
            "images",
            json!([{"id": "x", "content": "not base64!!"}]).to_string(),
            422,
        ),
    ] {
        let response = client()
            .post(server.url("/agents/scripted/runs"))
            .form(&[
                ("message", "x"),
                ("stream", "false"),
                (field, value.as_str()),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{field} {value}");
    }
    // A symlink on the way: the run fails, the symlink's target stays empty.
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), workspace.join(".turnstile")).unwrap();
    let run: Value = multipart_run(&server, "scripted", "l", "x", &[("a.txt", b"a")])
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(run["status"], "ERROR", "{run}");
    assert!(
        run["content"].as_str().unwrap().contains("symlink"),
        "{run}"
    );
    // Issue 13, defect 7: the message names the path relative to the cwd.
    let text = run["content"].as_str().unwrap();
    assert!(text.contains(".turnstile is a symlink"), "{text}");
    assert!(
        !text.contains(&workspace.canonicalize().unwrap().display().to_string()),
        "{text}"
    );
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

/// Issue 13, defect 6: with `keep_uploads`, a kept file the agent (or anyone) edited is
/// the workspace's now: later turns proceed with a warning, and it is not overwritten.
#[tokio::test]
async fn an_edited_kept_upload_is_left_as_it_is_and_later_turns_proceed_13() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    let config = config(dir.path(), &workspace);
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let first: Value = multipart_run(&server, "keeper", "k", "first", &[("a.txt", b"original")])
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(first["status"], "COMPLETED", "{first}");
    let kept = uploads(&workspace, first["run_id"].as_str().unwrap()).join("a.txt");
    std::fs::write(&kept, b"edited by the agent").unwrap();
    for turn in ["second", "third"] {
        let later: Value = client()
            .post(server.url("/agents/keeper/runs"))
            .form(&[("message", turn), ("stream", "false"), ("session_id", "k")])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(later["status"], "COMPLETED", "{later}");
        let warnings = later["metadata"]["warnings"].to_string();
        assert!(warnings.contains("attachments_changed"), "{later}");
        assert!(warnings.contains(".turnstile/uploads/"), "{warnings}");
        assert!(
            later["content"]
                .as_str()
                .unwrap()
                .contains("changed in the workspace since"),
            "{later}"
        );
    }
    assert_eq!(std::fs::read(&kept).unwrap(), b"edited by the agent");
}
