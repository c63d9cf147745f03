//! Old journals still read (issue 28): `fixtures/format3/journal.tar.gz` is a sled data
//! directory written by 89e76eb's binary (record format 3; remade by
//! `fixtures/format3/make.sh`): two sessions, a run with a tool call and usage, a second
//! turn, a continuation from a checkpoint, a compaction, and a failed run. This build
//! must verify it, fold it to the same stored projections, export it byte for byte as
//! that binary did, and serve it.

use std::path::Path;

use serde_json::Value;
use turnstile_tests::{Server, get_json, turnstile_in_ok};

/// The fixture's data directory, unpacked into `dir` (as `dir/data`).
fn unpack(dir: &Path) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/format3/journal.tar.gz");
    let status = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&fixture)
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "tar -xzf {}", fixture.display());
}

#[tokio::test]
async fn a_format_3_journal_of_89e76eb_reads_audits_and_serves_28() {
    let dir = tempfile::tempdir().unwrap();
    unpack(dir.path());
    let verified = turnstile_in_ok(dir.path(), &["journal", "verify", "--data-dir", "data"]);
    assert!(verified.starts_with("journal ok"), "{verified}");
    turnstile_in_ok(dir.path(), &["journal", "rebuild", "--data-dir", "data"]);
    turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "export",
            "--data-dir",
            "data",
            "--out",
            "export.jsonl",
        ],
    );
    let exported = std::fs::read_to_string(dir.path().join("export.jsonl")).unwrap();
    let expected = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/format3/export.jsonl"),
    )
    .unwrap();
    assert_eq!(
        exported, expected,
        "the export differs from the one 89e76eb's binary made"
    );
    // Imported, the format-3 records keep their bytes (every hash is checked), and the
    // copy exports the same lines again.
    turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "import",
            "--in",
            "export.jsonl",
            "--data-dir",
            "copy",
        ],
    );
    turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "export",
            "--data-dir",
            "copy",
            "--out",
            "again.jsonl",
        ],
    );
    let again = std::fs::read_to_string(dir.path().join("again.jsonl")).unwrap();
    assert_eq!(again, expected, "an import of the old export changed it");

    let server = Server::start(&dir.path().join("data"));
    let runs = get_json(&server, "/sessions/fixture/runs").await;
    let runs = runs.as_array().unwrap_or_else(|| panic!("{runs}"));
    assert_eq!(runs.len(), 3, "{runs:?}");
    let statuses: Vec<&str> = runs
        .iter()
        .map(|run| run["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["COMPLETED"; 3]);
    let first = &runs[0];
    assert_eq!(first["content"], "first answer", "{first}");
    assert_eq!(first["metrics"]["input_tokens"], 120, "{first}");
    assert_eq!(first["metrics"]["output_tokens"], 30, "{first}");
    assert_eq!(first["metrics"]["cache_read_tokens"], 10, "{first}");
    assert_eq!(first["tools"][0]["tool_name"], "Read", "{first}");
    let forked = &runs[2];
    assert_eq!(forked["forked_from_run_id"], first["run_id"], "{forked}");
    let session: Value = get_json(&server, "/sessions/fixture").await;
    assert_eq!(
        session["metrics"]["input_tokens"]
            .as_u64()
            .map(|n| n >= 120),
        Some(true),
        "{session}"
    );
    let failing = get_json(&server, "/sessions/failing/runs").await;
    assert_eq!(failing[0]["status"], "ERROR", "{failing}");
    // A new turn goes on the old journal.
    let next = turnstile_tests::post_form_json(
        &server,
        "/agents/scripted/runs",
        &[
            ("message", "/reply after the upgrade"),
            ("session_id", "fixture"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(next["status"], "COMPLETED", "{next}");
    assert_eq!(
        next["metrics"]["details"]["model"][0]["provider"], "turnstile",
        "{next}"
    );
    server.terminate();
    // The journal now holds both formats: it verifies, and its export says which line is
    // which (format-4 lines carry `"format":4`), and imports whole.
    let verified = turnstile_in_ok(dir.path(), &["journal", "verify", "--data-dir", "data"]);
    assert!(verified.starts_with("journal ok"), "{verified}");
    turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "export",
            "--data-dir",
            "data",
            "--out",
            "mixed.jsonl",
        ],
    );
    let mixed = std::fs::read_to_string(dir.path().join("mixed.jsonl")).unwrap();
    assert!(mixed.starts_with(&expected), "the old lines changed");
    let new_lines: Vec<&str> = mixed[expected.len()..].lines().collect();
    assert!(
        !new_lines.is_empty() && new_lines.iter().all(|line| line.contains("\"format\":4")),
        "{new_lines:#?}"
    );
    turnstile_in_ok(
        dir.path(),
        &[
            "journal",
            "import",
            "--in",
            "mixed.jsonl",
            "--data-dir",
            "mixed",
        ],
    );
}
