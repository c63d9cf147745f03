//! The session routes: list, read, its runs, delete and compact.

use super::extract::{Path, Query};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use turnstile_actors::Refused;
use turnstile_journal::SessionId;
use turnstile_projections::RunView;
use utoipa::IntoParams;

use super::runs::runs_json;
use super::{AppState, agent_name_of, check_owner, find_agent, find_session, positive, sdk_of};
use crate::api::error::ApiError;
use crate::api::error::ErrorBody;
use crate::auth::Caller;
use crate::wire::dto;
use crate::wire::dto::{Compacted, RunOutput, SessionDetail, SessionPage};

/// `POST /agents/{agent_id}/sessions/{session_id}/compact`.
#[utoipa::path(
    post, path = "/agents/{agent_id}/sessions/{session_id}/compact", tag = "sessions", summary = "Compact the session's harness session",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), ("session_id" = String, Path, description = "A session's id")),
    responses((status = 200, description = "What compaction did", body = Compacted), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such agent or session, or the session is another agent's", body = ErrorBody), (status = 409, description = "A run is in flight (session_busy)", body = ErrorBody))
)]
pub(super) async fn compact_session(
    State(state): State<AppState>,
    caller: Caller,
    Path((agent_id, session_id)): Path<(String, String)>,
) -> Result<Json<dto::Compacted>, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let not_found = || ApiError::NotFound(format!("Session {session_id} not found"));
    let session = SessionId::parse(&session_id).map_err(|_| not_found())?;
    check_owner(&state, &caller, &session, not_found)?;
    match state.runtime.compact_session(&agent.id, &session).await? {
        Ok(outcome) => Ok(Json(dto::Compacted {
            status: outcome.status,
            message: outcome.message,
            compacted: outcome.compacted,
            record: outcome.record,
        })),
        Err(Refused::AgentMismatch { .. }) => Err(not_found()),
        Err(refused) => Err(refused.into()),
    }
}

/// The filters, order and page of `GET /sessions`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct SessionsQuery {
    /// `agent` (the default); `team` and `workflow` list nothing (turnstile has agents
    /// only).
    #[serde(rename = "type")]
    session_type: Option<String>,
    /// Only this agent's sessions.
    component_id: Option<String>,
    /// Only this user's sessions.
    user_id: Option<String>,
    /// Only sessions whose name contains this text.
    session_name: Option<String>,
    /// Sessions per page, 1 to 1,000 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// The page, from 1 (default 1).
    #[param(value_type = Option<u32>, minimum = 1)]
    page: Option<String>,
    /// `created_at` (the only order).
    sort_by: Option<String>,
    /// `desc` (newest first, the default) or `asc`.
    sort_order: Option<String>,
}

/// `GET /sessions`: paginated, filtered by agent and user, newest first by default.
#[utoipa::path(
    get, path = "/sessions", tag = "sessions", summary = "Sessions, paginated and filtered",
    params(SessionsQuery),
    responses((status = 200, description = "A page of sessions", body = SessionPage), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 422, description = "A field or parameter that does not parse, is over its bound, or is unknown", body = ErrorBody))
)]
pub(super) async fn list_sessions(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<SessionsQuery>,
) -> Result<Json<dto::SessionPage>, ApiError> {
    let limit = positive("limit", query.limit.as_deref(), 20, 1_000)?;
    let page = positive("page", query.page.as_deref(), 1, 1_000_000)?;
    let agent_sessions = match query.session_type.as_deref() {
        None | Some("agent") => true,
        // turnstile has agent sessions only.
        Some("team") | Some("workflow") => false,
        Some(other) => {
            return Err(ApiError::Unprocessable(format!(
                "type must be agent, team or workflow, got {other:?}"
            )));
        }
    };
    match query.sort_by.as_deref() {
        None | Some("created_at") => {}
        Some(other) => {
            return Err(ApiError::Unprocessable(format!(
                "sort_by must be created_at, got {other:?}"
            )));
        }
    }
    let descending = match query.sort_order.as_deref() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(ApiError::Unprocessable(format!(
                "sort_order must be asc or desc, got {other:?}"
            )));
        }
    };
    let filter = turnstile_actors::directory::SessionFilter {
        agent_id: query.component_id.clone(),
        // An isolated caller lists its own sessions, whatever it asks for.
        user_id: caller
            .owner()
            .map(str::to_owned)
            .or_else(|| query.user_id.clone()),
        name_contains: query.session_name.clone(),
    };
    let (entries, total_count) = if agent_sessions {
        state
            .runtime
            .directory()
            .page(&filter, descending, (page - 1).saturating_mul(limit), limit)
    } else {
        (Vec::new(), 0)
    };
    let mut data = Vec::with_capacity(entries.len());
    for entry in entries {
        if let Some(session) = state.runtime.session(&entry.session_id)? {
            data.push(dto::session_summary(
                &session,
                &sdk_of(&state.runtime, &entry.agent_id),
            ));
        }
    }
    Ok(Json(dto::SessionPage {
        data,
        meta: dto::PageMeta {
            page,
            limit,
            total_pages: total_count.div_ceil(limit),
            total_count,
        },
    }))
}

#[utoipa::path(
    get, path = "/sessions/{session_id}/runs/{run_id}", tag = "sessions", summary = "One run of a session (agno's get_session_run)",
    params(("session_id" = String, Path, description = "A session's id"), ("run_id" = String, Path, description = "A run's id")),
    responses((status = 200, description = "The run", body = RunOutput), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such session, or no such run in it", body = ErrorBody))
)]
pub(super) async fn get_session_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((session_id, run_id)): Path<(String, String)>,
) -> Result<Json<dto::RunOutput>, ApiError> {
    let session = find_session(&state, &caller, &session_id)?;
    let not_found =
        || ApiError::NotFound(format!("Run {run_id} not found in session {session_id}"));
    let parsed = turnstile_journal::RunId::parse(&run_id).map_err(|_| not_found())?;
    let view = state.runtime.run_view(&parsed)?.ok_or_else(not_found)?;
    if view.session_id != session.session_id {
        return Err(not_found());
    }
    let name = agent_name_of(&state.runtime, &view.agent_id);
    Ok(Json(super::runs::run_json(&state, &view, &name).await?))
}

#[utoipa::path(
    get, path = "/sessions/{session_id}", tag = "sessions", summary = "One session with its metrics and harness session",
    params(("session_id" = String, Path, description = "A session's id")),
    responses((status = 200, description = "The session", body = SessionDetail), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such session (or it was deleted)", body = ErrorBody))
)]
pub(super) async fn get_session(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
) -> Result<Json<dto::SessionDetail>, ApiError> {
    let session = find_session(&state, &caller, &session_id)?;
    let agent_id = &session.session.agent_id;
    let (sdk, name) = (
        sdk_of(&state.runtime, agent_id),
        agent_name_of(&state.runtime, agent_id),
    );
    Ok(Json(dto::session_detail(&session, &sdk, &name)))
}

#[utoipa::path(
    get, path = "/sessions/{session_id}/runs", tag = "sessions", summary = "A session's runs",
    params(("session_id" = String, Path, description = "A session's id")),
    responses((status = 200, description = "The session's runs, oldest first", body = Vec<RunOutput>), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such session (or it was deleted)", body = ErrorBody))
)]
pub(super) async fn get_session_runs(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
) -> Result<Json<Vec<dto::RunOutput>>, ApiError> {
    let session = find_session(&state, &caller, &session_id)?;
    let name = agent_name_of(&state.runtime, &session.session.agent_id);
    let runs = state
        .runtime
        .session_runs(&session.session_id)?
        .unwrap_or_default();
    let runs: Vec<&RunView> = runs.iter().collect();
    Ok(Json(runs_json(&state, &runs, &name).await?))
}

/// `DELETE /sessions/{id}`: a tombstone event; 204, or 409 while a run is in flight.
#[utoipa::path(
    delete, path = "/sessions/{session_id}", tag = "sessions", summary = "Delete a session (a tombstone; the journal keeps it)",
    params(("session_id" = String, Path, description = "A session's id")),
    responses((status = 204, description = "Deleted: the session and its runs read as 404 from now on"), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such session (or it was deleted)", body = ErrorBody), (status = 409, description = "A run is in flight (session_busy)", body = ErrorBody))
)]
pub(super) async fn delete_session(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
) -> Result<Response, ApiError> {
    let session = find_session(&state, &caller, &session_id)?;
    match state.runtime.delete_session(&session.session_id).await? {
        Ok(true) => Ok(StatusCode::NO_CONTENT.into_response()),
        Ok(false) => Err(ApiError::NotFound(format!(
            "Session {session_id} not found"
        ))),
        Err(refused) => Err(refused.into()),
    }
}
