//! A run's files (`spec/workspaces.md`, "Reading them"): what the run changed in its
//! session's workspace, and one file's content as recorded at a tool call or at the
//! run's end, streamed from the journal a piece at a time.

use super::extract::{Path, Query};
use super::{AppState, find_agent, find_run};
use crate::api::error::{ApiError, ErrorBody};
use crate::auth::Caller;
use crate::wire::dto::FileChanged;
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use turnstile_journal::{FileKind, SnapshotPoint};
use turnstile_projections::FilesAt;
use utoipa::IntoParams;

/// `?session_id=&at=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct FileQuery {
    /// The run's session; a run of another session is 404.
    pub(super) session_id: Option<String>,
    /// A tool call of the run: the file as recorded after it; `start`: when the run began
    /// (default: at the run's end).
    pub(super) at: Option<String>,
}

#[utoipa::path(
    get, path = "/agents/{agent_id}/runs/{run_id}/files", tag = "runs", summary = "The files a run changed in its session's workspace, in order",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), ("run_id" = String, Path, description = "A run's id"), super::runs::SessionQuery),
    responses((status = 200, description = "Each change, in order: path, added/modified/removed, size and digest (none when removed), and the tool call after which it was recorded (none for the end of the turn, or a continuation's rewind)", body = Vec<FileChanged>), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 403, description = "The token lacks the route's scope", body = ErrorBody), (status = 404, description = "No such agent or run, or the run is of another agent or session", body = ErrorBody))
)]
pub(super) async fn run_files(
    State(state): State<AppState>,
    caller: Caller,
    Path((agent_id, run_id)): Path<(String, String)>,
    Query(query): Query<super::runs::SessionQuery>,
) -> Result<Json<Vec<FileChanged>>, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let view = find_run(&state, &caller, agent, &run_id, query.session_id.as_deref())?;
    let changes = state.runtime.run_files(&view)?;
    Ok(Json(
        changes
            .into_iter()
            .map(|found| FileChanged {
                size: found.change.entry.as_ref().map(|entry| entry.size),
                digest: found.change.entry.map(|entry| entry.digest),
                path: found.change.path,
                change: found.change.change.word().to_owned(),
                point: match &found.point {
                    SnapshotPoint::ToolCall { .. } => "tool_call",
                    SnapshotPoint::TurnEnd => "turn_end",
                    SnapshotPoint::TurnStart => "turn_start",
                    SnapshotPoint::Rewound { .. } => "rewound",
                }
                .to_owned(),
                tool_call_id: match found.point {
                    SnapshotPoint::ToolCall { tool_call_id } => Some(tool_call_id),
                    SnapshotPoint::TurnEnd
                    | SnapshotPoint::TurnStart
                    | SnapshotPoint::Rewound { .. } => None,
                },
            })
            .collect(),
    ))
}

#[utoipa::path(
    get, path = "/agents/{agent_id}/runs/{run_id}/files/{path}", tag = "runs", summary = "A file of the run's session's workspace as recorded after a tool call, or at the run's end",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), ("run_id" = String, Path, description = "A run's id"), ("path" = String, Path, description = "The file's path in the workspace (a symlink answers its target's text)"), FileQuery),
    responses((status = 200, description = "The file's bytes (X-Turnstile-Digest: its SHA-256; X-Turnstile-Kind: file or symlink)", body = String, content_type = "application/octet-stream"), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 403, description = "The token lacks the route's scope", body = ErrorBody), (status = 404, description = "No such agent, run or tool call, or the file did not exist then", body = ErrorBody))
)]
pub(super) async fn run_file(
    State(state): State<AppState>,
    caller: Caller,
    Path((agent_id, run_id, path)): Path<(String, String, String)>,
    Query(query): Query<FileQuery>,
) -> Result<Response, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let view = find_run(&state, &caller, agent, &run_id, query.session_id.as_deref())?;
    let at = match query.at {
        Some(start) if start == "start" => FilesAt::RunStart,
        Some(tool_call_id) => {
            if !view
                .tools
                .iter()
                .any(|tool| tool.tool_call_id == tool_call_id)
            {
                return Err(ApiError::NotFound(format!(
                    "Tool call {tool_call_id} not found in run {run_id}"
                )));
            }
            FilesAt::ToolCall(tool_call_id)
        }
        None => FilesAt::RunEnd,
    };
    let not_found = || ApiError::NotFound(format!("File {path} not found in the workspace then"));
    if !turnstile_journal::files::is_confined(&path) {
        return Err(not_found());
    }
    let content = state
        .runtime
        .run_file(&view, &path, &at)?
        .ok_or_else(not_found)?;
    let kind = match content.entry.kind {
        FileKind::File => "file",
        FileKind::Symlink => "symlink",
    };
    let pieces = content
        .pieces
        .map(|piece| piece.map(Bytes::from).map_err(std::io::Error::other));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, content.entry.size.to_string()),
            (
                header::HeaderName::from_static("x-turnstile-digest"),
                content.entry.digest.clone(),
            ),
            (
                header::HeaderName::from_static("x-turnstile-kind"),
                kind.to_owned(),
            ),
        ],
        Body::from_stream(futures::stream::iter(pieces)),
    )
        .into_response())
}
