//! Compatibility with a client no one here wrote: agno 3.1.10's own `AgentOSClient`
//! drives the real `turnstile serve` (`tests/agno/compat.py`): agents, runs
//! (non-streamed and streamed, events parsed into agno's types), continue, cancel, a
//! background run, sessions, a session, its runs, and metrics; the same client with
//! each user's bearer token against a server with signed tokens and per-user isolation
//! (`tests/agno/tokens.py`); and the same client driving an agent on the real codex CLI
//! (`tests/agno/codex.py`).
//!
//! Needs Python with `tests/agno/requirements.txt` installed: the README's test command
//! puts it in `target/agno-venv` (else `TURNSTILE_PYTHON`, else `python3`); without it
//! the test fails and says so.

use std::path::Path;
use std::process::Command;

use turnstile_tests::Server;
use turnstile_tests::codex::{codex_bin, codex_config};
use turnstile_tests::fake_openai::FakeOpenAi;

/// The interpreter with agno's client: the README's test command installs it into
/// `target/agno-venv` (else `TURNSTILE_PYTHON`, else `python3`).
fn python_with_agno() -> String {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/agno-venv/bin/python");
    let python = std::env::var("TURNSTILE_PYTHON").unwrap_or_else(|_| {
        if venv.exists() {
            venv.display().to_string()
        } else {
            "python3".into()
        }
    });
    let probe = Command::new(&python)
        .args(["-c", "import agno.client"])
        .output();
    let installed = probe.as_ref().is_ok_and(|output| output.status.success());
    assert!(
        installed,
        "agno's client is not installed for {python}: pip install -r tests/agno/requirements.txt ({:?})",
        probe.map(|output| String::from_utf8_lossy(&output.stderr).into_owned())
    );
    python
}

/// Runs `tests/agno/<script>` against `server`; it prints `expected` when all is well.
fn drive(script: &str, server: &Server, expected: &str) {
    drive_with(script, server, &[], expected);
}

/// [`drive`] with more arguments after the server's URL.
fn drive_with(script: &str, server: &Server, args: &[&str], expected: &str) {
    let python = python_with_agno();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("agno")
        .join(script);
    let output = Command::new(&python)
        .arg(&script)
        .arg(&server.base)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "agno's client failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(expected), "{stdout}");
}

#[test]
fn agnos_own_client_parses_every_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    drive("compat.py", &server, "all calls parsed");
}

/// Approvals (issue 30): agno's own client pauses a run, confirms or rejects its
/// requirement with agno's own `RunRequirement`, and continues the same run, plainly and
/// streamed.
#[test]
fn agnos_own_client_pauses_and_continues_a_run_30() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("turnstile.toml"),
        "[server]\ndata_dir = \"./data\"\n\n[[agents]]\nid = \"scripted\"\nharness = \"scripted\"\napprovals = [\"Bash\"]\n",
    )
    .unwrap();
    let server = Server::start_in(dir.path(), &["--config", "turnstile.toml"]);
    drive("approvals.py", &server, "paused and continued");
}

/// The same client with bearer tokens against a server in `[auth] mode = "jwt"` with
/// per-user isolation (issue 31): a user's own sessions, runs and metrics, another's
/// `404`, a missing scope `403`.
#[test]
fn agnos_own_client_works_with_signed_tokens_31() {
    use turnstile_tests::tokens::{claims, rsa};
    let dir = tempfile::tempdir().unwrap();
    let key = rsa();
    let config = dir.path().join("turnstile.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\nmode = \"jwt\"\nuser_isolation = true\nverification_keys = ['''\n{}''']\n",
            key.public_pem
        ),
    )
    .unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let user = ["agents:read", "agents:run", "sessions:read", "metrics:read"];
    let alice = key.sign(None, &claims(Some("alice"), &user));
    let bob = key.sign(None, &claims(Some("bob"), &user));
    let reader = key.sign(None, &claims(Some("carol"), &["agents:read"]));
    drive_with(
        "tokens.py",
        &server,
        &[&alice, &bob, &reader],
        "with tokens: all calls parsed",
    );
}

/// The same client drives an agent on the real codex CLI (issue 15): run, stream,
/// continue, cancel and sessions.
#[test]
fn agnos_own_client_drives_a_codex_agent_15() {
    let Some(bin) = codex_bin() else { return };
    let fake = FakeOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let config = codex_config(dir.path(), &bin, &fake, "", "");
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    drive("codex.py", &server, "all calls parsed");
}
