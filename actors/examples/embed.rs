//! Embedding turnstile as a library: open a runtime on a data directory, start a run
//! with the scripted harness, print its events as they are journaled, await the
//! outcome, and shut down.
//!
//! Run with `cargo run -p turnstile-actors --example embed [DATA_DIR]`.

use std::sync::Arc;

use turnstile_actors::{AgentSpec, Multitask, RetryPolicy, Runtime, RuntimeConfig, StartRun};
use turnstile_harness::ScriptedHarness;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let data_dir = std::env::args()
        .nth(1)
        .map(Into::into)
        .unwrap_or_else(|| std::env::temp_dir().join("turnstile-embed"));
    let runtime = Runtime::open(RuntimeConfig::new(
        data_dir,
        vec![AgentSpec {
            id: "scripted".into(),
            name: "Scripted".into(),
            description: "the built-in scripted harness".into(),
            harness: Arc::new(ScriptedHarness),
            retry: RetryPolicy::default(),
            cwd: std::env::temp_dir().join("turnstile-embed-workspace"),
            keep_uploads: false,
            workspace: turnstile_actors::Workspace::Shared,
            snapshots: None,
            approval: Default::default(),
        }],
    ))?;
    let command = StartRun {
        agent_id: "scripted".into(),
        session_id: None,
        user_id: None,
        message: "list the files\n/tool Bash {\"command\":\"ls\"}\n/reply done".into(),
        options: Default::default(),
        multitask: Multitask::Reject,
        idempotency_key: None,
        fork: None,
        attachments: Vec::new(),
        isolated: false,
    };
    let mut run = match runtime.start_run(command).await? {
        Ok(run) => run,
        Err(refused) => anyhow::bail!("refused: {refused}"),
    };
    println!("run {} in session {}", run.run_id, run.session_id);
    while let Some(event) = run.events().next().await {
        let event = event?;
        println!("#{} {:?}", event.event_index, event.event);
    }
    let view = run.outcome().await?;
    println!(
        "status {} content {:?} tools {}",
        view.status.as_str(),
        view.content,
        view.tools.len()
    );
    runtime.shutdown().await?;
    Ok(())
}
