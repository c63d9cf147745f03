//! The HTTP routes of `spec/http-api.md`: a thin layer that parses requests, forwards
//! commands to the runtime, and renders views and streams.
//!
//! Handlers hold no state of their own beyond the [`AppState`]; everything they answer
//! comes from the runtime, which reads it from the journal.

mod approvals;
pub mod attachments;
pub mod body;
pub mod error;
pub mod export;
mod extract;
mod files;
pub mod form;
pub mod metrics;
pub mod openapi;
mod resume;
mod runs;
mod sessions;
pub mod sse;
mod ui;

use crate::wire::dto;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use extract::Path;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use turnstile_actors::{AgentSpec, Runtime};
use turnstile_journal::{RunId, SessionId};
use turnstile_projections::{RunView, SessionState};

use crate::api::error::ApiError;
use crate::api::error::ErrorBody;
use crate::api::form::Fields;
use crate::api::sse::SseOptions;
use crate::auth::Caller;
use crate::wire::dto::{Agent, Health};

/// What every handler gets.
#[derive(Clone)]
pub struct AppState {
    /// The runtime.
    pub runtime: Runtime,
    /// Fires when the server begins to shut down.
    pub shutdown: CancellationToken,
    /// Stream settings.
    pub sse: SseOptions,
    /// How callers authenticate: open, the API key, or signed tokens.
    pub auth: Arc<crate::auth::Auth>,
    /// Per agent that stores events (agno's `store_events`): the event types it skips.
    pub stored_events: Arc<std::collections::HashMap<String, Vec<String>>>,
    /// Request bodies larger than this get 413 (`server.max_request_bytes`).
    pub max_request_bytes: usize,
    /// Messages longer than this get 422 (`server.max_message_bytes`).
    pub max_message_bytes: usize,
    /// A request's body must arrive within this, else 408 (`server.body_timeout_s`).
    pub body_timeout: std::time::Duration,
}

/// The router with every route.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/agents", get(list_agents))
        .route("/agents/{agent_id}", get(get_agent))
        .route(
            "/agents/{agent_id}/runs",
            post(runs::create_run).get(runs::list_agent_runs),
        )
        .route("/openapi.json", get(openapi::serve))
        .route("/agents/{agent_id}/runs/{run_id}", get(runs::get_run))
        .route(
            "/agents/{agent_id}/runs/{run_id}/cancel",
            post(runs::cancel_run),
        )
        .route(
            "/agents/{agent_id}/runs/{run_id}/resume",
            post(resume::resume_run),
        )
        .route(
            "/agents/{agent_id}/runs/{run_id}/checkpoints",
            get(resume::get_checkpoints),
        )
        .route(
            "/agents/{agent_id}/runs/{run_id}/files",
            get(files::run_files),
        )
        .route(
            "/agents/{agent_id}/runs/{run_id}/files/{*path}",
            get(files::run_file),
        )
        .route(
            "/agents/{agent_id}/runs/{run_id}/continue",
            post(resume::continue_run),
        )
        .route(
            "/agents/{agent_id}/sessions/{session_id}/compact",
            post(sessions::compact_session),
        )
        .route("/sessions", get(sessions::list_sessions))
        .route("/approvals", get(approvals::list_approvals))
        .route("/metrics", get(metrics::daily))
        .route("/metrics/prometheus", get(metrics::prometheus))
        .route(
            "/sessions/{session_id}",
            get(sessions::get_session).delete(sessions::delete_session),
        )
        .route(
            "/sessions/{session_id}/runs",
            get(sessions::get_session_runs),
        )
        .route(
            "/sessions/{session_id}/runs/{run_id}",
            get(sessions::get_session_run),
        )
        .route("/journal/export", get(export::export))
        .route("/", get(ui::root))
        .route("/ui", get(ui::index))
        .route("/ui/", get(ui::index_slash))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/app.css", get(ui::style))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(
            state.max_request_bytes,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            refuse_large_bodies,
        ))
        .layer(axum::middleware::from_fn_with_state(
            crate::auth::Guard {
                auth: state.auth.clone(),
                open: |path| path == "/health" || ui::is_console(path),
            },
            crate::auth::authenticate,
        ))
        .layer(axum::middleware::from_fn(log_request))
        .with_state(state)
}

/// One log line per request: method, path (without its query), status, the caller (a
/// token's `sub`, never the token), and the time to the response's head (a stream's
/// frames follow it). Refusals, 401 included, too.
async fn log_request(request: Request, next: axum::middleware::Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    // Fields, as a log collector reads them (`--log-format json` puts them under
    // `fields`); the message stays the line a person reads.
    let latency_ms = (ms * 10.0).round() / 10.0;
    let run_id = path_id(&path, "runs");
    let session_id = path_id(&path, "sessions");
    let caller = response
        .extensions()
        .get::<crate::auth::LoggedCaller>()
        .map(|caller| caller.0.clone());
    let by = caller
        .as_deref()
        .map(|user| format!(" by {user}"))
        .unwrap_or_default();
    let user = caller.as_deref();
    if status >= 500 {
        tracing::warn!(target: "turnstile::http", method = %method, path, status, latency_ms, run_id, session_id, user, "{method} {path} {status} {ms:.1} ms{by}");
    } else {
        tracing::info!(target: "turnstile::http", method = %method, path, status, latency_ms, run_id, session_id, user, "{method} {path} {status} {ms:.1} ms{by}");
    }
    response
}

/// The path segment after `collection` (`/agents/a/runs/ID/cancel` → `ID`), if any.
fn path_id<'a>(path: &'a str, collection: &str) -> Option<&'a str> {
    let mut segments = path.split('/');
    segments.find(|segment| *segment == collection)?;
    segments.next().filter(|id| !id.is_empty())
}

/// The request's fields, read within the body deadline: a client that sends its body
/// slowly, or not at all, is answered 408 instead of holding the request forever.
async fn read_fields(state: &AppState, request: Request) -> Result<Fields, ApiError> {
    tokio::time::timeout(state.body_timeout, Fields::read(request))
        .await
        .map_err(|_| ApiError::RequestTimeout(state.body_timeout.as_secs_f64()))?
}

/// A body announced larger than the limit is refused from its `Content-Length`, before
/// a byte of it is read (a client that announces a terabyte and sends nothing is
/// answered at once, not waited for).
async fn refuse_large_bodies(
    State(state): State<AppState>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let announced = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    if announced.is_some_and(|bytes| bytes > state.max_request_bytes as u64) {
        return ApiError::PayloadTooLarge.into_response();
    }
    next.run(request).await
}

async fn fallback(uri: axum::http::Uri) -> Response {
    let body = json!({"detail": format!("No route for {}", uri.path()), "error_type": "not_found"});
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    let body = json!({
        "detail": format!("{method} is not allowed on {}; see /openapi.json", uri.path()),
        "error_type": "method_not_allowed",
    });
    (StatusCode::METHOD_NOT_ALLOWED, Json(body)).into_response()
}

/// `?live=1`: liveness only (the process answers), whatever the journal's state.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct HealthQuery {
    /// `1` (or `true`): answer `200` while the process runs, without asking the journal.
    live: Option<String>,
}

#[utoipa::path(
    get, path = "/health", tag = "server", summary = "Readiness (the journal can write) or, with live=1, liveness; never needs the API key", security(()),
    params(HealthQuery),
    responses((status = 200, description = "The server is up and its journal can write (with live=1: the process answers)", body = Health),
        (status = 503, description = "The journal cannot write now (database away, disk full or read-only): error_type journal_unavailable, with Retry-After", body = ErrorBody),
        (status = 422, description = "A parameter that does not parse or is unknown", body = ErrorBody))
)]
async fn health(
    State(state): State<AppState>,
    extract::Query(query): extract::Query<HealthQuery>,
) -> Result<Json<dto::Health>, ApiError> {
    let live = query
        .live
        .is_some_and(|live| !matches!(live.as_str(), "0" | "false" | ""));
    if !live {
        // One statvfs on sled, one round trip on PostgreSQL (within its timeouts): off
        // the async threads.
        let journal = state.runtime.journal().clone();
        let writable = tokio::task::spawn_blocking(move || journal.writable())
            .await
            .map_err(|error| ApiError::Internal(error.to_string()))?;
        if let Err(error) = writable {
            let detail = error.unavailable().unwrap_or_else(|| error.to_string());
            return Err(ApiError::JournalUnavailable(detail));
        }
    }
    Ok(Json(dto::Health { status: "ok" }))
}

fn find_agent<'a>(runtime: &'a Runtime, agent_id: &str) -> Result<&'a AgentSpec, ApiError> {
    runtime.agent(agent_id).ok_or_else(|| {
        let known: Vec<&str> = runtime.agents().iter().map(|a| a.id.as_str()).collect();
        ApiError::NotFound(format!(
            "Agent {agent_id} not found: the configured agents are {}",
            known.join(", ")
        ))
    })
}

#[utoipa::path(
    get, path = "/agents", tag = "agents", summary = "Configured agents with their model and metadata.sdk",
    responses((status = 200, description = "Every configured agent", body = Vec<Agent>), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody))
)]
async fn list_agents(State(state): State<AppState>, caller: Caller) -> Json<Vec<dto::Agent>> {
    Json(
        state
            .runtime
            .agents()
            .iter()
            .filter(|agent| caller.lists_agent(&agent.id))
            .map(dto::agent)
            .collect(),
    )
}

#[utoipa::path(
    get, path = "/agents/{agent_id}", tag = "agents", summary = "One agent",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)")),
    responses((status = 200, description = "The agent", body = Agent), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such agent", body = ErrorBody))
)]
async fn get_agent(
    State(state): State<AppState>,
    Path(agent_id): Path<String>,
) -> Result<Json<dto::Agent>, ApiError> {
    Ok(Json(dto::agent(find_agent(&state.runtime, &agent_id)?)))
}

pub(crate) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn positive(
    field: &str,
    value: Option<&str>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    match value {
        None => Ok(default),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| {
                ApiError::Unprocessable(format!(
                    "{field} must be a whole number from 1 to {max}, got {text:?}"
                ))
            }),
    }
}

/// A session that exists and the caller may see, by the id in the path; another
/// user's session is as absent as one that never was.
fn find_session(
    state: &AppState,
    caller: &Caller,
    session_id: &str,
) -> Result<SessionState, ApiError> {
    let not_found = || ApiError::NotFound(format!("Session {session_id} not found"));
    let parsed = SessionId::parse(session_id).map_err(|_| not_found())?;
    state
        .runtime
        .session(&parsed)?
        .filter(|session| caller.sees(session.session.user_id.as_deref()))
        .ok_or_else(not_found)
}

/// The run a route names, checked against its agent and the optional `session_id`.
fn find_run(
    state: &AppState,
    caller: &Caller,
    agent: &AgentSpec,
    run_id: &str,
    session_id: Option<&str>,
) -> Result<RunView, ApiError> {
    let not_found = || ApiError::NotFound(format!("Run {run_id} not found"));
    let parsed = RunId::parse(run_id).map_err(|_| not_found())?;
    let view = state.runtime.run_view(&parsed)?.ok_or_else(not_found)?;
    if view.agent_id != agent.id
        || session_id.is_some_and(|session| session != view.session_id.as_str())
    {
        return Err(not_found());
    }
    check_owner(state, caller, &view.session_id, not_found)?;
    Ok(view)
}

/// Under per-user isolation, `Err(not_found())` unless the session (of a run the
/// route names) is the caller's; nothing to check for an unrestricted caller.
fn check_owner(
    state: &AppState,
    caller: &Caller,
    session_id: &SessionId,
    not_found: impl Fn() -> ApiError,
) -> Result<(), ApiError> {
    if caller.owner().is_none() {
        return Ok(());
    }
    match owner_of(state, session_id)? {
        Some(user) if caller.sees(user.as_deref()) => Ok(()),
        _ => Err(not_found()),
    }
}

/// The user a session belongs to (`Some(None)`: created without one), or `None` when
/// there is no such session. The directory answers without reading the journal; a
/// session it does not list yet (just created on another replica) is read from it.
fn owner_of(state: &AppState, session_id: &SessionId) -> Result<Option<Option<String>>, ApiError> {
    if let Some(user) = state.runtime.directory().owner(session_id) {
        return Ok(Some(user));
    }
    Ok(state
        .runtime
        .session(session_id)?
        .map(|session| session.session.user_id))
}

/// Under per-user isolation, `Err(404)` when a turn names a session another user owns
/// (its actor checks again, where concurrent first turns are ordered).
fn check_not_foreign(
    state: &AppState,
    caller: &Caller,
    session_id: Option<&SessionId>,
) -> Result<(), ApiError> {
    let (Some(_), Some(session_id)) = (caller.owner(), session_id) else {
        return Ok(());
    };
    match owner_of(state, session_id)? {
        Some(user) if !caller.sees(user.as_deref()) => Err(ApiError::NotFound(format!(
            "Session {session_id} not found"
        ))),
        _ => Ok(()),
    }
}

fn sdk_of(runtime: &Runtime, agent_id: &str) -> String {
    runtime
        .agent(agent_id)
        .map(|agent| agent.harness.info().sdk)
        .unwrap_or_else(|| "unknown".to_owned())
}

fn agent_name_of(runtime: &Runtime, agent_id: &str) -> String {
    runtime
        .agent(agent_id)
        .map(|agent| agent.name.clone())
        .unwrap_or_default()
}
