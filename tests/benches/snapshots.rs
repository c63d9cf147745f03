//! Workspace snapshots end to end (issue 29), written up in `docs/PERFORMANCE.md`: two
//! agents of one runtime (the embedding API, sled), each session's workspace holding
//! 10,000 files of 2 KiB in 100 directories, one agent with snapshots on and one with
//! them off, their turns alternating round by round (side by side in one run):
//! - a turn of `BENCH_SNAPSHOT_CALLS` (10) tool calls that change nothing, and one of as
//!   many calls each rewriting one file (10 changed files a turn): the runtime's added
//!   time per tool call, and per turn, with snapshots on against off (medians);
//! - the first snapshot of the workspace (every file read and journaled);
//! - a restore on a new machine: the session's directory deleted and the runtime opened
//!   again, the next turn's time against the same turn on the agent without snapshots;
//! - the journal bytes a snapshot adds beyond the changed files' contents.
//!
//! `cargo bench -p turnstile-tests --bench snapshots`. Knobs: `BENCH_SNAPSHOT_FILES`
//! (10000), `BENCH_SNAPSHOT_FILE_BYTES` (2048), `BENCH_SNAPSHOT_ROUNDS` (15),
//! `BENCH_SNAPSHOT_CALLS` (10). Not a test: nothing is asserted.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile_actors::{AgentSpec, Multitask, RetryPolicy, Runtime, RuntimeConfig, Workspace};
use turnstile_harness::ScriptedHarness;
use turnstile_journal::{Event, Seq, SessionId};
use turnstile_tests::{knob, median, populate_workspace, start_command, workspace_bounds};

fn agent(id: &str, cwd: &Path, snapshots: bool) -> AgentSpec {
    AgentSpec {
        id: id.into(),
        name: id.into(),
        description: String::new(),
        harness: Arc::new(ScriptedHarness),
        retry: RetryPolicy::default(),
        cwd: cwd.to_path_buf(),
        keep_uploads: false,
        workspace: Workspace::Session,
        snapshots: snapshots.then(workspace_bounds),
        approval: Default::default(),
    }
}

fn open(data: &Path, work: &Path) -> Runtime {
    let agents = vec![
        agent("on", &work.join("on"), true),
        agent("off", &work.join("off"), false),
    ];
    Runtime::open(RuntimeConfig::new(data.to_path_buf(), agents)).unwrap()
}

async fn turn(runtime: &Runtime, agent: &str, message: &str) -> Duration {
    let mut command = start_command("bench", message, Multitask::Reject);
    command.agent_id = agent.into();
    command.session_id = Some(SessionId::parse(&format!("bench-{agent}")).unwrap());
    let started = Instant::now();
    let run = runtime.start_run(command).await.unwrap().unwrap();
    let view = run.outcome().await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        view.status,
        turnstile_projections::RunStatus::Completed,
        "{view:?}"
    );
    took
}

/// Files under `root`.
fn walk(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    entries
        .map(|entry| {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                walk(&entry.path())
            } else {
                1
            }
        })
        .sum()
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() {
    let files = knob("BENCH_SNAPSHOT_FILES", 10_000);
    let bytes = knob("BENCH_SNAPSHOT_FILE_BYTES", 2048);
    let rounds = knob("BENCH_SNAPSHOT_ROUNDS", 15);
    let calls = knob("BENCH_SNAPSHOT_CALLS", 10);
    let dir = tempfile::tempdir().unwrap();
    let (data, work) = (dir.path().join("data"), dir.path().join("work"));
    populate_workspace(&work.join("on/bench-on"), files, bytes);
    populate_workspace(&work.join("off/bench-off"), files, bytes);
    let runtime = open(&data, &work);

    let first_on = turn(&runtime, "on", "/reply first").await;
    let first_off = turn(&runtime, "off", "/reply first").await;
    let nothing = "/tool Bash {\"command\":\"true\"}\n".repeat(calls) + "/reply done";
    let (mut on_nothing, mut off_nothing, mut on_changed, mut off_changed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let changed: String = (0..calls)
            .map(|n| {
                let file = n * 997 % files;
                format!(
                    "/write dir{:03}/file{file:05}.txt round {round} call {n}\n",
                    file % 100
                )
            })
            .collect::<String>()
            + "/reply done";
        // Alternate which agent goes first, so that neither always follows the other.
        for agent in if round % 2 == 0 {
            ["on", "off"]
        } else {
            ["off", "on"]
        } {
            let took = turn(&runtime, agent, &nothing).await;
            match agent {
                "on" => on_nothing.push(took),
                _ => off_nothing.push(took),
            }
            let took = turn(&runtime, agent, &changed).await;
            match agent {
                "on" => on_changed.push(took),
                _ => off_changed.push(took),
            }
        }
    }
    // The journal's bytes of the last changed turn's snapshots.
    let (mut event_bytes, mut content_bytes, mut snapshots) = (0usize, 0usize, 0usize);
    let session = SessionId::parse("bench-on").unwrap();
    let records: Vec<_> = runtime
        .journal()
        .read_session(&session, Seq(0))
        .map(Result::unwrap)
        .collect();
    let last_run = records
        .iter()
        .rev()
        .find_map(|record| match &record.event {
            Event::RunQueued { run_id, .. } => Some(run_id.clone()),
            _ => None,
        })
        .unwrap();
    for record in records
        .iter()
        .filter(|record| record.event.run_id() == Some(&last_run))
    {
        let size = turnstile_journal::codec::encode_event(record.event.clone(), usize::MAX)
            .unwrap()
            .bytes
            .len();
        match &record.event {
            Event::WorkspaceContent { bytes, .. } => {
                event_bytes += size;
                content_bytes += bytes.len();
            }
            Event::WorkspaceChanged { .. } => {
                event_bytes += size;
                snapshots += 1;
            }
            _ => {}
        }
    }
    runtime.shutdown().await.unwrap();
    drop(runtime);

    // A new machine: the journal only; the off agent's directory stays as the control.
    std::fs::remove_dir_all(work.join("on/bench-on")).unwrap();
    let runtime = open(&data, &work);
    let restored_on = turn(&runtime, "on", "/reply back").await;
    let restored_files = walk(&work.join("on/bench-on"));
    let restarted_off = turn(&runtime, "off", "/reply back").await;
    runtime.shutdown().await.unwrap();

    let per_call = |on: &[Duration], off: &[Duration]| {
        (ms(median(on.to_vec())) - ms(median(off.to_vec()))) / calls as f64
    };
    println!(
        "## Workspace snapshots, {files} files of {bytes} bytes, {calls} tool calls a turn, {rounds} rounds\n"
    );
    println!("| | snapshots on | off | added per turn | added per tool call |");
    println!("|---|---|---|---|---|");
    for (what, on, off) in [
        ("turn, nothing changed", &on_nothing, &off_nothing),
        ("turn, one file changed per call", &on_changed, &off_changed),
    ] {
        let (m_on, m_off) = (ms(median(on.clone())), ms(median(off.clone())));
        println!(
            "| {what} | {m_on:.1} ms | {m_off:.1} ms | {:.1} ms | {:.2} ms |",
            m_on - m_off,
            per_call(on, off)
        );
    }
    println!(
        "\nFirst snapshot (every file read and journaled): {:.0} ms (the same turn without: {:.0} ms)",
        ms(first_on),
        ms(first_off)
    );
    println!(
        "Restore on a new machine (the directory deleted, the runtime opened again): first turn {:.0} ms ({restored_files} files restored), against {:.0} ms without snapshots",
        ms(restored_on),
        ms(restarted_off)
    );
    println!(
        "Journal bytes of the last turn's {snapshots} snapshots: {event_bytes} bytes of events for {content_bytes} bytes of content: {:.0} bytes a snapshot beyond the content",
        (event_bytes - content_bytes) as f64 / snapshots.max(1) as f64
    );
}
