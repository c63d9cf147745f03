//! `turnstile serve`: open the runtime, listen, and shut down gracefully.
//!
//! On SIGINT or SIGTERM the server stops accepting, ends open streams, lets requests
//! finish, drains runs in flight for a bounded time, and closes (syncs) the journal.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use axum::serve::ListenerExt;
use tokio_util::sync::CancellationToken;
use turnstile_actors::{Runtime, RuntimeConfig};

use crate::api::sse::SseOptions;
use crate::api::{AppState, router};
use crate::config::Config;

/// Runs the server until a shutdown signal.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let agents = config.agent_specs()?;
    let data_dir: PathBuf = config.server.data_dir.clone();
    let arbiters = std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(2)
        .max(2);
    let runtime = Runtime::open(RuntimeConfig {
        data_dir: data_dir.clone(),
        arbiters,
        agents,
        max_concurrent_runs: config.server.max_concurrent_runs,
        max_queued_runs: config.server.max_queued_runs,
        session_idle: std::time::Duration::from_secs_f64(config.server.session_idle_s),
        max_event_bytes: config.server.max_event_bytes,
    })?;
    let addr: SocketAddr = config
        .server
        .addr
        .parse()
        .with_context(|| format!("server.addr {:?} is not HOST:PORT", config.server.addr))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    // Without TCP_NODELAY an SSE stream stalls ~40 ms per frame on Nagle + delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
    });
    let shutdown = CancellationToken::new();
    tokio::spawn(wait_for_signal(shutdown.clone()));
    let sse = SseOptions {
        shutdown: shutdown.clone(),
        keepalive: std::time::Duration::from_secs_f64(config.server.sse_keepalive_s),
    };
    // Auth is on when the configured environment variable holds a key.
    let api_key = match std::env::var(&config.server.api_key_env) {
        // Set but empty is a mistake, not a wish to run without auth (issue 13).
        Ok(key) if key.is_empty() => anyhow::bail!(
            "{} is set but empty: set it to the API key, or unset it to run without auth",
            config.server.api_key_env
        ),
        Ok(key) => Some(key.into()),
        Err(_) => None,
    };
    if api_key.is_some() {
        tracing::info!("API key auth is on ({} is set)", config.server.api_key_env);
    }
    let stored_events = std::sync::Arc::new(config.stored_events());
    let app = router(AppState {
        runtime: runtime.clone(),
        shutdown: shutdown.clone(),
        sse,
        api_key,
        stored_events,
        max_request_bytes: config.server.max_request_bytes,
    });
    tracing::info!(
        "turnstile listening on http://{local} (data dir {})",
        data_dir.display()
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await?;
    tracing::info!("draining runs in flight and syncing the journal");
    runtime.shutdown().await?;
    tracing::info!("turnstile stopped");
    Ok(())
}

async fn wait_for_signal(shutdown: CancellationToken) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                return;
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    tracing::info!("shutdown signal received");
    shutdown.cancel();
}

/// A bare axum JSON endpoint on the same stack as the gateway (TCP_NODELAY, body
/// parsing), answering a run request at once: the baseline of the HTTP benchmark.
pub async fn serve_baseline(addr: &str) -> anyhow::Result<()> {
    use axum::routing::post;
    let addr: SocketAddr = addr
        .parse()
        .with_context(|| format!("{addr:?} is not HOST:PORT"))?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = axum::Router::new().route(
        "/agents/{agent_id}/runs",
        post(
            |axum::Form(form): axum::Form<std::collections::HashMap<String, String>>| async move {
                axum::Json(
                    serde_json::json!({"status": "COMPLETED", "content": form.get("message")}),
                )
            },
        ),
    );
    eprintln!("baseline listening on http://{local}");
    let shutdown = CancellationToken::new();
    tokio::spawn(wait_for_signal(shutdown.clone()));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    Ok(())
}
