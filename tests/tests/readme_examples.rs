//! Issue 17's acceptance: every example of the README's "Try it" runs as written, on
//! the real binary started from a fresh directory as a user starts it (the default data
//! directory `./turnstile-data`, the README's address `127.0.0.1:7777`): each `sh` block
//! and each inline `curl …`, `turnstile …` and `journal …` command, with a real run or
//! session for the placeholders (`RUN_ID`, `SESSION_ID`, `RUN`, `ID`, `FILE`, `NEW`, `N`). The
//! offline audit commands run after the server stops, from the same directory.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use turnstile_tests::{Server, get_json, lossy, turnstile_bin};

/// The README's "Try it" section: its `sh` blocks (continuation lines joined) and its
/// inline commands, in order.
fn examples() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let section = readme
        .split("\n## Try it\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Try it section");
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut block = String::new();
    for line in section.lines() {
        if line == "```sh" {
            in_sh = true;
            block.clear();
            continue;
        }
        if in_sh {
            if line == "```" {
                in_sh = false;
                commands.push(block.replace("\\\n", " "));
            } else if !line.trim_start().starts_with('#') {
                block.push_str(line);
                block.push('\n');
            }
            continue;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1
                && (span.starts_with("curl ")
                    || span.starts_with("turnstile ")
                    || span.starts_with("journal "))
            {
                commands.push(span.to_owned());
            }
        }
    }
    commands
}

fn run(command: &str, cwd: &Path) -> (bool, String) {
    let output = Command::new("bash")
        .args(["-c", command])
        .current_dir(cwd)
        .env_remove("TURNSTILE_API_KEY")
        .output()
        .unwrap();
    (
        output.status.success(),
        format!("{}{}", lossy(&output.stdout), lossy(&output.stderr)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_of_the_readme_runs_as_written_17() {
    let commands = examples();
    assert!(commands.len() >= 20, "{commands:#?}");
    // On the README's own address, so that every command runs exactly as written (the
    // `--url` defaults included).
    let home = tempfile::tempdir().unwrap();
    let server = Server::start_in(home.path(), &["--addr", "127.0.0.1:7777"]);
    assert_eq!(server.base, "http://127.0.0.1:7777");
    let bin = turnstile_bin().display().to_string();
    let mut run_id = String::new();
    let mut offline = Vec::new();
    let mut said = Vec::new();
    for command in &commands {
        // The audit commands that read the data directory wait until the server stops.
        let is_offline = command.starts_with("turnstile journal") && !command.contains("--url")
            || command.starts_with("journal ");
        let is_cli = command.starts_with("turnstile ") || command.starts_with("journal ");
        let mut concrete = command
            .replace("RUN_ID", &run_id)
            .replace("SESSION_ID", "demo");
        if is_cli {
            concrete = concrete
                .replace(['[', ']'], "")
                .replace(" RUN", &format!(" {run_id}"))
                .replace(" ID", " demo")
                .replace(" FILE", " export.jsonl")
                .replace(" NEW", " imported")
                .replace(" N", " 2");
            concrete = match concrete.strip_prefix("turnstile ") {
                Some(rest) => format!("{bin} {rest}"),
                None => format!("{bin} {concrete}"),
            };
        }
        if is_offline {
            offline.push(concrete);
            continue;
        }
        let (ok, output) = run(&concrete, home.path());
        assert!(ok, "{concrete}\n{output}");
        assert!(!output.contains("HTTP/1.1 5"), "{concrete}\n{output}");
        said.push((command.clone(), output.clone()));
        if concrete.contains("session_id=busy") {
            assert!(output.contains("409 Conflict"), "{concrete}\n{output}");
        } else if !is_cli {
            assert!(!output.contains("\"error_type\""), "{concrete}\n{output}");
        }
        // After the first example, the placeholders name its run.
        if run_id.is_empty() {
            let runs: Value = get_json(&server, "/agents/scripted/runs?session_id=demo").await;
            run_id = runs["data"][0]["run_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(
                !run_id.is_empty(),
                "the first example made no run: {output}"
            );
        }
    }
    operating_it_says_what_it_should(&said, &run_id);
    // The log flags of "Operating it": one JSON object a line, a request's own fields.
    let logged = Server::start_in(
        home.path(),
        &[
            "--data-dir",
            "logged",
            "--log-format",
            "json",
            "--log-level",
            "debug",
        ],
    );
    get_json(&logged, "/health").await;
    let lines = logged.terminate_logs();
    let request = lines
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["fields"]["path"] == "/health")
        .unwrap_or_else(|| panic!("no JSON request line for /health: {lines:#?}"));
    assert_eq!(request["fields"]["status"], 200, "{request}");
    assert!(
        lines
            .iter()
            .any(|line| line.contains("\"level\":\"DEBUG\"")),
        "--log-level debug logs nothing at debug: {lines:#?}"
    );
    server.terminate();
    // `journal export --out FILE` before `import --in FILE`.
    offline.sort_by_key(|command| command.contains(" import "));
    assert!(offline.len() >= 5, "{offline:#?}");
    for command in offline {
        let (ok, output) = run(&command, home.path());
        assert!(ok, "{command}\n{output}");
    }
    assert!(home.path().join("turnstile-data").exists());
    assert!(home.path().join("imported").exists());
}

/// The README's "Operating it" commands, each present and saying what a user reads it
/// for (not only exiting 0).
fn operating_it_says_what_it_should(said: &[(String, String)], run_id: &str) {
    let expected: [(&str, &[&str]); 8] = [
        (
            "turnstile serve --print-config",
            &["[server]", "max_message_bytes", "[[agents]]"],
        ),
        ("turnstile sessions list", &["demo"]),
        ("turnstile sessions show ID", &["demo", "scripted"]),
        (
            "turnstile runs list [--session ID] [--status completed]",
            &[run_id],
        ),
        ("turnstile runs show RUN", &[run_id, "COMPLETED"]),
        ("turnstile runs tail RUN [--after N]", &["RunCompleted"]),
        (
            "turnstile runs cancel RUN",
            &["already ended", "nothing to cancel"],
        ),
        (
            "turnstile runs continue RUN --from 3 --input 'try another way'",
            &["COMPLETED"],
        ),
    ];
    for (command, needles) in expected {
        let (_, output) = said
            .iter()
            .find(|(said, _)| said == command)
            .unwrap_or_else(|| panic!("the README no longer says `{command}`"));
        for needle in needles {
            assert!(
                output.contains(needle),
                "`{command}` does not say {needle:?}:\n{output}"
            );
        }
    }
}
