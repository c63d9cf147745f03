//! A run picked up again: its events re-attached from an index (`/resume`), its
//! checkpoints, and a continue from one of them (the same run, or a fork).

use super::extract::{Path, Query};
use super::{AppState, agent_name_of, check_owner, find_agent, find_run, read_fields};
use crate::api::body::{ContinueRequest, ResumeRequest};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::runs::{SessionQuery, bounded, respond_run};
use crate::api::sse;
use crate::auth::Caller;
use crate::wire::dto;
use crate::wire::dto::{Accepted, Checkpoints, RunOutput};
use crate::wire::events;
use axum::Json;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::json;
use turnstile_actors::{ContinueFrom, ContinueRun, DecideRun, Multitask, RunOptions};
use turnstile_journal::limits::USER_ID_BYTES_MAX;
use turnstile_journal::{EventIndex, RunId, ToolDecision};
use turnstile_projections::RunHead;

/// Re-attaches to a run's events after `last_event_index` (or `Last-Event-ID`): a meta
/// frame (`replay` for a finished run; `catch_up` then `subscribed` for a live one),
/// then each missing event once, in order, then live events until the terminal one.
#[utoipa::path(
    post, path = "/agents/{agent_id}/runs/{run_id}/resume", tag = "runs", summary = "Re-attach to a run's events after last_event_index",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), ("run_id" = String, Path, description = "A run's id"), ("Last-Event-ID" = Option<String>, Header, description = "The same as last_event_index")),
    request_body(description = "Where to re-attach", content(
        (ResumeRequest = "application/x-www-form-urlencoded"),
        (ResumeRequest = "multipart/form-data"),
        (ResumeRequest = "application/json"),
    )),
    responses(
        (status = 200, description = "SSE: a meta frame (replay for a finished run; catch_up then subscribed for a live one), each missing event once, in order, with id: <event_index>, then live events to the terminal one", body = String, content_type = "text/event-stream"),
        (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such agent or run, or the run is of another agent or session", body = ErrorBody), (status = 422, description = "A field or parameter that does not parse, is over its bound, or is unknown", body = ErrorBody),
    )
)]
pub(super) async fn resume_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((agent_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let body: ResumeRequest = read_fields(&state, request).await?.typed()?;
    let not_found = || ApiError::NotFound(format!("Run {run_id} not found"));
    let parsed = RunId::parse(&run_id).map_err(|_| not_found())?;
    let last_event_index = last_event_index(body.last_event_index, &headers)?;
    let view = state.runtime.run_head(&parsed)?.ok_or_else(not_found)?;
    let wrong_session = body
        .session_id
        .as_deref()
        .is_some_and(|session| session != view.session_id.as_str());
    if view.agent_id != agent.id || wrong_session {
        return Err(not_found());
    }
    check_owner(&state, &caller, &view.session_id, not_found)?;
    let events = state.runtime.run_events_of(&view, last_event_index);
    let meta = resume_meta(&view, last_event_index);
    let who = events::Who {
        agent_id: view.agent_id.clone(),
        agent_name: agent_name_of(&state.runtime, &view.agent_id),
        session_id: view.session_id.to_string(),
    };
    Ok(sse::resume_stream(meta, events, who, state.sse.clone()))
}

#[utoipa::path(
    get, path = "/agents/{agent_id}/runs/{run_id}/checkpoints", tag = "runs", summary = "A run's tool-batch checkpoints and its end",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), ("run_id" = String, Path, description = "A run's id"), SessionQuery),
    responses((status = 200, description = "One checkpoint after each tool-result batch, then end", body = Checkpoints), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such agent or run, or the run is of another agent or session", body = ErrorBody))
)]
pub(super) async fn get_checkpoints(
    State(state): State<AppState>,
    caller: Caller,
    Path((agent_id, run_id)): Path<(String, String)>,
    Query(query): Query<SessionQuery>,
) -> Result<Json<dto::Checkpoints>, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let view = find_run(&state, &caller, agent, &run_id, query.session_id.as_deref())?;
    Ok(Json(dto::checkpoints(&view)))
}

/// Continues a finished run as a new sibling run, or, with `tools`, a paused run with
/// its decisions (the same run); answers like `POST /runs`.
#[utoipa::path(
    post, path = "/agents/{agent_id}/runs/{run_id}/continue", tag = "runs", summary = "Continue a finished run from a checkpoint as a new run, or decide a paused run's calls (tools) and go on with it",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), ("run_id" = String, Path, description = "A run's id")),
    request_body(description = "Where to continue from and what to send", content(
        (ContinueRequest = "application/x-www-form-urlencoded"),
        (ContinueRequest = "multipart/form-data"),
        (ContinueRequest = "application/json"),
    )),
    responses(
        (status = 200, description = "stream=false: the finished run; stream=true: its events as SSE (with background=true each frame carries event_index and run_id)", content(
            (RunOutput = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 202, description = "background=true, stream=false: the run is in the durable queue", body = Accepted),
        (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such agent or run, or the run is of another agent or session", body = ErrorBody),
        (status = 409, description = "The run is cancelled or not finished (run_not_continuable), tools for a run that is not paused (run_not_paused), or its session is busy", body = ErrorBody),
        (status = 422, description = "A field or parameter that does not parse, is over its bound, or is unknown", body = ErrorBody),
        (status = 429, description = "The durable queue is full", body = ErrorBody),
    )
)]
pub(super) async fn continue_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((agent_id, run_id)): Path<(String, String)>,
    request: Request,
) -> Result<Response, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let body: ContinueRequest = read_fields(&state, request).await?.typed()?;
    let source = find_run(&state, &caller, agent, &run_id, body.session_id.as_deref())?;
    let continue_from = match body.continue_from.as_deref().unwrap_or("end") {
        "end" => ContinueFrom::End,
        "last_user" => ContinueFrom::LastUser,
        other => ContinueFrom::MessageIndex(other.trim().parse().map_err(|_| {
            ApiError::Unprocessable(format!(
                "continue_from must be end, last_user or a message index, got {other:?}"
            ))
        })?),
    };
    let stream = body.stream.unwrap_or(true);
    let background = body.background.unwrap_or(false);
    if let Some(decisions) = decisions_of(body.tools.as_deref(), &source)? {
        if body.continue_from.is_some() || body.input.is_some() {
            return Err(ApiError::Unprocessable(
                "tools decide a paused run's calls, and continue it where it paused: continue_from and input go with a continuation from a checkpoint, not with tools".into(),
            ));
        }
        let command = DecideRun {
            run_id: source.run_id.clone(),
            decisions,
            decided_by: caller.owner().map(str::to_owned).or(bounded(
                "user_id",
                body.user_id,
                USER_ID_BYTES_MAX,
            )?),
        };
        let handle = match state.runtime.decide_run(command).await? {
            Ok(handle) => handle,
            Err(refused) => return Err(refused.into()),
        };
        return respond_run(&state, handle, stream, background, (&agent.id, &agent.name)).await;
    }
    let input = body.input;
    if input
        .as_ref()
        .is_some_and(|input| input.len() > state.max_message_bytes)
    {
        return Err(ApiError::Unprocessable(format!(
            "input is longer than {} bytes (server.max_message_bytes)",
            state.max_message_bytes
        )));
    }
    let command = ContinueRun {
        run_id: source.run_id.clone(),
        continue_from,
        input,
        // Under per-user isolation the run is the token's user's.
        user_id: caller.owner().map(str::to_owned).or(bounded(
            "user_id",
            body.user_id,
            USER_ID_BYTES_MAX,
        )?),
        options: RunOptions {
            stream,
            background,
            ..RunOptions::default()
        },
        multitask: if background {
            Multitask::Enqueue
        } else {
            Multitask::Reject
        },
    };
    let agent_name = agent.name.clone();
    let handle = match state.runtime.continue_run(command).await? {
        Ok(handle) => handle,
        Err(refused) => return Err(refused.into()),
    };
    respond_run(&state, handle, stream, background, (&agent.id, &agent_name)).await
}

/// The decisions a `continue` carries in `tools` (agno's `ToolExecution`s as JSON):
/// each call with `confirmed` true or false is decided (with its `confirmation_note`);
/// one without is left undecided, which only the run's own calls may be (a client sends
/// the run's `tools` back whole). `None`: no tools (absent, empty, or `[]`).
fn decisions_of(
    tools: Option<&str>,
    run: &turnstile_projections::RunView,
) -> Result<Option<Vec<ToolDecision>>, ApiError> {
    let Some(text) = tools.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(None);
    };
    let invalid = |why: String| ApiError::Unprocessable(format!("tools: {why}"));
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| invalid(format!("not JSON: {error}")))?;
    let serde_json::Value::Array(entries) = value else {
        return Err(invalid("must be a JSON array of tool executions".into()));
    };
    if entries.is_empty() {
        return Ok(None);
    }
    let mut decisions = Vec::new();
    for (position, entry) in entries.iter().enumerate() {
        let Some(id) = entry.get("tool_call_id").and_then(|id| id.as_str()) else {
            return Err(invalid(format!("entry {position} has no tool_call_id")));
        };
        let note = match entry.get("confirmation_note") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(note)) => Some(note.clone()),
            Some(_) => {
                return Err(invalid(format!(
                    "confirmation_note of {id} must be a string"
                )));
            }
        };
        let decided_before = run
            .tools
            .iter()
            .any(|tool| tool.tool_call_id == id && tool.confirmed.is_some());
        match entry.get("confirmed") {
            // The run's tools sent back whole: a call decided before keeps its decision.
            Some(serde_json::Value::Bool(_)) if decided_before => {}
            Some(serde_json::Value::Bool(confirmed)) => decisions.push(ToolDecision {
                tool_call_id: id.to_owned(),
                confirmed: *confirmed,
                note,
            }),
            None | Some(serde_json::Value::Null) => {
                if !run.tools.iter().any(|tool| tool.tool_call_id == id) {
                    return Err(invalid(format!(
                        "tool_call_id {id:?} is not a call of run {}",
                        run.run_id
                    )));
                }
            }
            Some(_) => return Err(invalid(format!("confirmed of {id} must be true or false"))),
        }
    }
    Ok(Some(decisions))
}

/// The index a re-attach resumes after: the body's `last_event_index`, else the
/// `Last-Event-ID` header; absent, from the start; negative, refused.
fn last_event_index(
    from_body: Option<i64>,
    headers: &HeaderMap,
) -> Result<Option<EventIndex>, ApiError> {
    let header_index = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok());
    let index = match (from_body, header_index) {
        (Some(index), _) => index,
        (None, None) => return Ok(None),
        (None, Some(text)) => text.trim().parse().map_err(|_| {
            ApiError::Unprocessable(format!("last_event_index must be an integer, got {text:?}"))
        })?,
    };
    // Absent means from the start; a negative index is a client's mistake (#32).
    u64::try_from(index).map(|index| Some(EventIndex(index))).map_err(|_| {
        ApiError::Unprocessable(format!(
            "last_event_index must be 0 or more (leave it out to replay from the start), got {index}"
        ))
    })
}

/// The frames a re-attach opens with: a replay of an ended run, or a catch-up and a
/// subscription for a running one.
fn resume_meta(
    view: &RunHead,
    last_event_index: Option<EventIndex>,
) -> Vec<(&'static str, serde_json::Value)> {
    let requested = last_event_index
        .map(|index| json!(index.0))
        .unwrap_or(json!(null));
    let after = last_event_index.map(|index| index.0 + 1).unwrap_or(0);
    let missed = view.event_count.saturating_sub(after);
    if view.status.is_terminal() {
        vec![(
            "replay",
            json!({
                "event": "replay",
                "run_id": view.run_id,
                "status": view.status.as_str(),
                "total_events": view.event_count,
                "last_event_index_requested": requested,
                "message": format!("Run {}. Replaying {missed} stored events from the journal.", view.status.as_str().to_lowercase()),
            }),
        )]
    } else {
        vec![
            (
                "catch_up",
                json!({
                    "event": "catch_up",
                    "run_id": view.run_id,
                    "status": view.status.as_str(),
                    "missed_events": missed,
                    "current_event_count": view.event_count,
                    "last_event_index_requested": requested,
                    "message": format!("Run is {}; sending {missed} missed events.", view.status.as_str().to_lowercase()),
                }),
            ),
            (
                "subscribed",
                json!({
                    "event": "subscribed",
                    "run_id": view.run_id,
                    "status": view.status.as_str(),
                    "current_event_count": view.event_count,
                    "message": "Subscribed to live events.",
                }),
            ),
        ]
    }
}
