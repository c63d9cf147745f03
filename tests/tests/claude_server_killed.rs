//! Issue 13, defect 8: a SIGKILLed server used to leave its `claude` child (and the
//! command the CLI's tool started) running, so after a restart the same turn could run
//! twice. Every CLI, and every process it started, dies with the server.

use std::time::Duration;

use turnstile_tests::claude::{claude_bin, claude_config, cli_pids, processes_running};
use turnstile_tests::fake_anthropic::FakeAnthropic;
use turnstile_tests::{Server, post_form_json, wait_until};

#[tokio::test]
async fn a_killed_server_takes_its_cli_and_the_clis_tools_with_it_13() {
    let Some(bin) = claude_bin() else { return };
    let fake = FakeAnthropic::start();
    let dir = tempfile::tempdir().unwrap();
    // Two sessions: one turn mid-tool, one warm process idle in the pool.
    let config = claude_config(dir.path(), &bin, &fake, "", "");
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);
    let warm = post_form_json(
        &server,
        "/agents/claude/runs",
        &[
            ("message", "@reply warm"),
            ("session_id", "warm"),
            ("stream", "false"),
        ],
    )
    .await;
    assert_eq!(warm["status"], "COMPLETED", "{warm}");
    post_form_json(
        &server,
        "/agents/claude/runs",
        &[
            ("message", "@bash echo started; sleep 41.75\n@reply never"),
            ("session_id", "tool"),
            ("background", "true"),
            ("stream", "false"),
        ],
    )
    .await;
    wait_until("the tool runs", Duration::from_secs(20), || {
        processes_running("sleep 41.75") > 0
    });
    assert!(cli_pids(&data).len() >= 2, "a warm CLI and a busy one");

    server.kill();
    wait_until(
        "no CLI outlives the killed server",
        Duration::from_secs(5),
        || cli_pids(&data).is_empty(),
    );
    wait_until(
        "the tool's command dies too",
        Duration::from_secs(5),
        || processes_running("sleep 41.75") == 0,
    );
}
