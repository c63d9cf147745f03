//! `turnstile serve`: open the runtime, listen, and shut down gracefully.
//!
//! On SIGINT or SIGTERM the server stops accepting, ends open streams, lets requests
//! finish, drains runs in flight for a bounded time, and closes (syncs) the journal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;
use tokio_util::sync::CancellationToken;
use turnstile_actors::{Runtime, RuntimeConfig};

use crate::api::sse::SseOptions;
use crate::api::{AppState, router};
use crate::config::Config;
use crate::listen::ListenOptions;

/// What every route shares, from the configuration.
fn app_state(
    config: &Config,
    runtime: &Runtime,
    shutdown: &CancellationToken,
    auth: crate::auth::Auth,
) -> AppState {
    AppState {
        runtime: runtime.clone(),
        shutdown: shutdown.clone(),
        sse: SseOptions {
            shutdown: shutdown.clone(),
            keepalive: std::time::Duration::from_secs_f64(config.server.sse_keepalive_s),
        },
        auth: std::sync::Arc::new(auth),
        stored_events: std::sync::Arc::new(config.stored_events()),
        max_request_bytes: config.server.max_request_bytes,
        max_message_bytes: config.server.max_message_bytes,
        body_timeout: Duration::from_secs_f64(config.server.body_timeout_s),
    }
}

/// Runs the server until a shutdown signal.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    // Auth (the key of the configured variable, or tokens) is checked before anything
    // is opened, so a refused start leaves no data directory behind.
    let auth = crate::auth::from_config(&config)?;
    // A harness this build cannot run is refused first, then each CLI is tried.
    let agents = config.agent_specs()?;
    let versions = check_clis(&config).await?;
    let data_dir: PathBuf = config.server.data_dir.clone();
    let cores = std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(2)
        .max(2);
    // A session actor's journal reads wait on its arbiter's thread: on PostgreSQL each is
    // a network round trip, which takes no core, so more threads keep the cores busy.
    let arbiters = if config.journal.backend == crate::config::Backend::Postgres {
        cores * turnstile_journal::limits::POSTGRES_ARBITERS_PER_CORE
    } else {
        cores
    };
    // Listening first: a start that cannot listen (the port in use) opens nothing and
    // leaves no data directory behind.
    let addr = resolve(&config.server.addr).await?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!(
            "cannot listen on {addr} (server.addr {:?})",
            config.server.addr
        )
    })?;
    let local = listener.local_addr()?;
    let runtime = Runtime::open(RuntimeConfig {
        data_dir: data_dir.clone(),
        journal: config.journal_config(Some(local.port()))?,
        arbiters,
        agents,
        max_concurrent_runs: config.server.max_concurrent_runs,
        max_queued_runs: config.server.max_queued_runs,
        session_idle: std::time::Duration::from_secs_f64(config.server.session_idle_s),
        max_event_bytes: config.server.max_event_bytes,
        release_memory: Some(crate::allocator::collect),
    })?;
    let telemetry = match &config.telemetry.otlp_endpoint {
        Some(endpoint) => {
            let telemetry = crate::telemetry::Telemetry::start(runtime.journal().clone(), endpoint)
                .map_err(|error| anyhow::anyhow!(error))?;
            tracing::info!("traces: every run to {endpoint} (OTLP over HTTP)");
            Some(telemetry)
        }
        None => None,
    };
    if open_without_auth(local.ip(), !matches!(auth, crate::auth::Auth::Open)) {
        tracing::warn!(
            "listening on {local}, beyond loopback, with auth off: anyone who can reach it can run agents; set {} to an API key",
            config.server.api_key_env
        );
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(wait_for_signal(shutdown.clone()));
    let app = router(app_state(&config, &runtime, &shutdown, auth));
    let journal = runtime.journal();
    if journal.is_shared() {
        tracing::info!(
            "turnstile {} listening on http://{local} (journal {}, data dir {})",
            env!("CARGO_PKG_VERSION"),
            journal.location(),
            data_dir.display()
        );
    } else {
        tracing::info!(
            "turnstile {} listening on http://{local} (data dir {})",
            env!("CARGO_PKG_VERSION"),
            data_dir.display()
        );
    }
    for agent in &config.agents {
        match versions.get(&agent.id) {
            Some(version) => tracing::info!(
                "agent {}: harness {}, CLI {version}",
                agent.id,
                agent.harness.name()
            ),
            None => tracing::info!("agent {}: harness {}", agent.id, agent.harness.name()),
        }
    }
    match runtime.runs_recovering() {
        0 => {}
        1 => tracing::info!(
            "recovery: 1 run left open by the last stop is being resolved (queued again, resumed with a new attempt, or ended)"
        ),
        n => tracing::info!(
            "recovery: {n} runs left open by the last stop are being resolved (queued again, resumed with a new attempt, or ended)"
        ),
    }
    let listen = ListenOptions {
        header_timeout: Duration::from_secs_f64(config.server.header_timeout_s),
        idle_timeout: Duration::from_secs_f64(config.server.idle_timeout_s),
        max_connections: connection_bound(config.server.max_connections),
    };
    crate::listen::serve(listener, app, listen, shutdown.clone()).await;
    tracing::info!("draining runs in flight and syncing the journal");
    runtime.shutdown().await?;
    if let Some(telemetry) = telemetry {
        // The exporter's own thread sends what is queued (bounded by its timeout).
        tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    }
    tracing::info!("turnstile stopped");
    Ok(())
}

/// Whether the server listens where others can reach it with no API key: a warning.
fn open_without_auth(ip: std::net::IpAddr, auth: bool) -> bool {
    !ip.is_loopback() && !auth
}

/// `server.addr` as a socket address: `HOST:PORT`, the host an IP address or a name
/// (`localhost:7777`), the first address it resolves to.
async fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(addr) = addr.parse() {
        return Ok(addr);
    }
    let mut found = tokio::net::lookup_host(addr).await.with_context(|| {
        format!("server.addr {addr:?} is not HOST:PORT with a host that resolves")
    })?;
    // IPv4 first: `localhost` then means 127.0.0.1, as clients try it.
    let all: Vec<SocketAddr> = found.by_ref().collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or_else(|| all.first())
        .copied()
        .with_context(|| format!("server.addr {addr:?} resolves to no address"))
}

/// Each agent's CLI runs (`--version`) before the server starts: a missing or broken
/// binary is refused at once, naming its configuration key, instead of failing every
/// run later. Returns each CLI's version, by agent.
async fn check_clis(config: &Config) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let mut versions = std::collections::HashMap::new();
    for agent in &config.agents {
        let Some((key, bin)) = agent.harness.cli_bin() else {
            continue;
        };
        let refuse = |why: String| {
            anyhow::anyhow!(
                "agent {:?}: {key} = {:?} {why}",
                agent.id,
                bin.display().to_string()
            )
        };
        let run = tokio::process::Command::new(bin)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .map_err(|_| refuse("did not answer `--version` within 30 s".into()))?
            .map_err(|error| refuse(format!("cannot be run: {error}")))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(refuse(format!(
                "failed `--version` ({}): {}",
                output.status,
                stderr.trim()
            )));
        }
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        versions.insert(agent.id.clone(), version);
    }
    Ok(versions)
}

/// Raises the descriptor limit to its hard limit and bounds the connections by it, so a
/// flood of connections waits in the backlog instead of failing accepts (`Too many
/// open files`) for everyone, `/health` included.
fn connection_bound(configured: usize) -> usize {
    let limit = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(error) => {
            tracing::warn!(%error, "cannot read the descriptor limit");
            return configured;
        }
    };
    let available = limit
        .saturating_sub(turnstile_journal::limits::DESCRIPTORS_RESERVED)
        .max(16);
    let bound = configured.min(usize::try_from(available).unwrap_or(usize::MAX));
    if bound < configured {
        tracing::warn!(
            "server.max_connections {configured} lowered to {bound}: the descriptor limit is {limit}"
        );
    }
    bound
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

#[cfg(test)]
mod tests {
    use super::open_without_auth;

    // Only decided, never bound: servers in tests listen on loopback only.
    #[test]
    fn listening_beyond_loopback_without_auth_is_warned_of_17() {
        let lan: std::net::IpAddr = "192.168.1.10".parse().unwrap();
        let any: std::net::IpAddr = "0.0.0.0".parse().unwrap();
        let loopback: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let loopback6: std::net::IpAddr = "::1".parse().unwrap();
        assert!(open_without_auth(lan, false));
        assert!(open_without_auth(any, false));
        assert!(!open_without_auth(lan, true));
        assert!(!open_without_auth(loopback, false));
        assert!(!open_without_auth(loopback6, false));
    }

    #[tokio::test]
    async fn a_host_name_resolves_to_its_ipv4_address_first_17() {
        let addr = super::resolve("localhost:7777").await.unwrap();
        assert_eq!(addr, "127.0.0.1:7777".parse().unwrap());
        assert!(super::resolve("no-port").await.is_err());
    }
}
