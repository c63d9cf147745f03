//! The run routes: start, list, read and cancel (re-attach, checkpoints and continue are
//! in `resume`).

use super::extract::{Path, Query};
use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use turnstile_actors::{Multitask, Refused, RunHandle, RunOptions, StartRun};
use turnstile_journal::limits::{
    IDEMPOTENCY_KEY_BYTES_MAX, OUTPUT_SCHEMA_BYTES_MAX, USER_ID_BYTES_MAX,
};
use turnstile_journal::{RunId, SessionId};
use turnstile_projections::{RunHead, RunStatus, RunView};
use utoipa::IntoParams;

use super::{
    AppState, check_not_foreign, check_owner, find_agent, find_run, find_session, now_s, positive,
    read_fields, sdk_of,
};
use crate::api::body::{MultitaskStrategy, RunRequest};
use crate::api::error::ApiError;
use crate::api::error::ErrorBody;
use crate::api::sse::Framing;
use crate::api::{attachments, sse};
use crate::auth::Caller;
use crate::wire::dto;
use crate::wire::dto::{Accepted, Empty, RunOutput, RunPage};
use crate::wire::events;

/// A run as agno's `RunOutput`, with its stored events when its agent keeps them:
/// agno's `store_events` lists a streamed run's events less `events_to_skip` (by
/// default `RunContent`); the journal keeps every event regardless.
pub(super) async fn run_json(
    state: &AppState,
    run: &RunView,
    agent_name: &str,
) -> Result<dto::RunOutput, ApiError> {
    let mut output = dto::run_output(run, agent_name, sdk_of(&state.runtime, &run.agent_id));
    let Some(skip) = state.stored_events.get(&run.agent_id) else {
        return Ok(output);
    };
    let streamed = run.options.stream;
    if !streamed || !run.status.is_terminal() {
        return Ok(output);
    }
    let who = events::Who {
        agent_id: run.agent_id.clone(),
        agent_name: agent_name.to_owned(),
        session_id: run.session_id.to_string(),
    };
    let mut stored = Vec::new();
    let mut events = state.runtime.run_events_of(&RunHead::of(run), None);
    while let Some(event) = events.next().await {
        let event = event?;
        let (event_type, data) = events::render(&event, &who);
        if !skip.iter().any(|skipped| skipped == event_type) {
            stored.push(data);
        }
    }
    output.events = Some(stored);
    Ok(output)
}

pub(super) async fn runs_json(
    state: &AppState,
    runs: &[&RunView],
    agent_name: &str,
) -> Result<Vec<dto::RunOutput>, ApiError> {
    let mut outputs = Vec::with_capacity(runs.len());
    for run in runs {
        outputs.push(run_json(state, run, agent_name).await?);
    }
    Ok(outputs)
}

#[utoipa::path(
    post, path = "/agents/{agent_id}/runs", tag = "runs", summary = "Start a run: JSON, SSE stream, or 202 for a background run",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), ("Idempotency-Key" = Option<String>, Header, description = "The same key again (per agent and user) answers the first submission's run, never a second run")),
    request_body(description = "The run; multipart parts named files are uploads", content(
        (RunRequest = "application/x-www-form-urlencoded"),
        (RunRequest = "multipart/form-data"),
        (RunRequest = "application/json"),
    )),
    responses(
        (status = 200, description = "stream=false: the finished run; stream=true: its events as SSE (with background=true each frame carries event_index and run_id)", content(
            (RunOutput = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 202, description = "background=true, stream=false: the run is in the durable queue", body = Accepted),
        (status = 400, description = "An unsupported content type, attachment kind or file type; a JSON object sent as a form", body = ErrorBody),
        (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such agent", body = ErrorBody),
        (status = 409, description = "The session has a run in flight (multitask_strategy=reject; with stream=true a 200 SSE holding one RunError with error_type session_busy instead), or belongs to another agent", body = ErrorBody),
        (status = 413, description = "The body is larger than server.max_request_bytes (payload_too_large), or one of its events (the message, a file) is larger than server.max_event_bytes (event_too_large); nothing was recorded", body = ErrorBody),
        (status = 422, description = "A field or parameter that does not parse, is over its bound, or is unknown", body = ErrorBody),
        (status = 429, description = "The durable queue is full", body = ErrorBody),
        (status = 503, description = "The journal cannot write now (database away, disk full or read-only): journal_unavailable, with Retry-After; nothing was recorded", body = ErrorBody),
    )
)]
pub(super) async fn create_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(agent_id): Path<String>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let fields = read_fields(&state, request).await?;
    // The output schema's bound is checked on its text, before it is parsed.
    fields.bounded("output_schema", OUTPUT_SCHEMA_BYTES_MAX)?;
    let body: RunRequest = fields.typed()?;
    check_message(agent, &body.message, state.max_message_bytes)?;
    let stream = body.stream.unwrap_or(true);
    let background = body.background.unwrap_or(false);
    let session_id = session_id_field(agent, body.session_id.as_deref())?;
    let user_id = bounded("user_id", body.user_id, USER_ID_BYTES_MAX)?;
    // Under per-user isolation the run is the token's user's, whatever the body says.
    let user_id = caller.owner().map(str::to_owned).or(user_id);
    // Every malformed field is 422 before any well-formed but unsupported one is 400.
    let unsupported = unsupported_media(body.audio.as_ref(), body.videos.as_ref())?;
    let output_schema = output_schema(&fields, body.output_schema)?;
    let attachments = attachments::parse(&fields)?;
    if let Some(kind) = unsupported {
        return Err(ApiError::BadRequest(format!(
            "{kind} is not supported by the {} harness",
            agent.harness.info().sdk
        )));
    }
    let multitask = match body.multitask_strategy {
        None | Some(MultitaskStrategy::Reject) if !background => Multitask::Reject,
        _ => Multitask::Enqueue,
    };
    let idempotency_key = idempotency_key(&headers, &agent.id, user_id.as_deref())?;
    check_not_foreign(&state, &caller, session_id.as_ref())?;
    let command = StartRun {
        agent_id: agent.id.clone(),
        session_id,
        user_id,
        message: body.message.clone(),
        options: RunOptions {
            stream,
            background,
            output_schema,
            fork: None,
        },
        multitask,
        idempotency_key,
        fork: None,
        attachments,
        isolated: caller.owner().is_some(),
    };
    let agent_name = agent.name.clone();
    let handle = match state.runtime.start_run(command).await? {
        Ok(handle) => handle,
        Err(Refused::Busy { session_id, run_id }) if stream && !background => {
            let message = Refused::Busy {
                session_id: session_id.clone(),
                run_id: run_id.clone(),
            }
            .to_string();
            let frame = json!({
                "event": "RunError",
                "created_at": now_s(),
                "agent_id": agent_id,
                "agent_name": agent_name,
                "session_id": session_id,
                "run_id": run_id,
                "content": message,
                "error_type": "session_busy",
            });
            return Ok(sse::single("RunError", frame, state.sse.clone()));
        }
        Err(refused) => return Err(refused.into()),
    };
    respond_run(&state, handle, stream, background, (&agent.id, &agent_name)).await
}

/// A run's message: some text (an empty one is refused by its form; one of only
/// whitespace asks nothing, #32), within its bound, and one the agent's harness can run.
fn check_message(
    agent: &turnstile_actors::AgentSpec,
    message: &str,
    max_bytes: usize,
) -> Result<(), ApiError> {
    if message.trim().is_empty() {
        return Err(ApiError::Unprocessable(
            "message must hold some text, not only whitespace".into(),
        ));
    }
    if message.len() > max_bytes {
        return Err(ApiError::Unprocessable(format!(
            "message is longer than {max_bytes} bytes (server.max_message_bytes)"
        )));
    }
    if let Err(reason) = agent.harness.check_message(message) {
        return Err(ApiError::Unprocessable(format!("message: {reason}")));
    }
    Ok(())
}

/// The first of `audio` and `videos` that holds items (which this harness does not
/// take); `Err` when one is not a JSON array of objects.
fn unsupported_media(
    audio: Option<&serde_json::Value>,
    videos: Option<&serde_json::Value>,
) -> Result<Option<&'static str>, ApiError> {
    let mut unsupported = None;
    for (kind, value) in [("audio", audio), ("videos", videos)] {
        let Some(value) = value else {
            continue;
        };
        let items = value
            .as_array()
            .filter(|items| items.iter().all(serde_json::Value::is_object))
            .ok_or_else(|| {
                ApiError::Unprocessable(format!("{kind} must be a JSON array of objects"))
            })?;
        if !items.is_empty() && unsupported.is_none() {
            unsupported = Some(kind);
        }
    }
    Ok(unsupported)
}

/// The run's idempotency key from its header, scoped like agno's unique index: per
/// agent and user.
fn idempotency_key(
    headers: &HeaderMap,
    agent_id: &str,
    user_id: Option<&str>,
) -> Result<Option<String>, ApiError> {
    Ok(match headers.get("idempotency-key") {
        None => None,
        Some(value) => {
            let key = value
                .to_str()
                .ok()
                .filter(|key| !key.is_empty() && key.len() <= IDEMPOTENCY_KEY_BYTES_MAX)
                .ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} visible ASCII characters"
                    ))
                })?;
            // Keys are scoped like agno's unique index: per agent and user.
            Some(format!(
                "{}\u{1f}{}\u{1f}{key}",
                agent_id,
                user_id.unwrap_or("")
            ))
        }
    })
}

/// The answer to an accepted run: a stream, a 202, or the finished run.
pub(super) async fn respond_run(
    state: &AppState,
    handle: RunHandle,
    stream: bool,
    background: bool,
    (agent_id, agent_name): (&str, &str),
) -> Result<Response, ApiError> {
    if stream {
        let framing = if background {
            Framing::Indexed
        } else {
            Framing::Inline
        };
        let who = events::Who {
            agent_id: agent_id.to_owned(),
            agent_name: agent_name.to_owned(),
            session_id: handle.session_id.to_string(),
        };
        return Ok(sse::run_stream(
            handle.into_events(),
            framing,
            who,
            state.sse.clone(),
        ));
    }
    if background {
        let status = match handle.reused {
            true => state
                .runtime
                .run_view(&handle.run_id)?
                .map(|view| view.status.as_str())
                .unwrap_or("PENDING"),
            false => "PENDING",
        };
        let body = dto::Accepted {
            run_id: handle.run_id.to_string(),
            session_id: handle.session_id.to_string(),
            status,
        };
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }
    let shutdown = state.shutdown.clone();
    let view = tokio::select! {
        view = handle.outcome() => view?,
        _ = shutdown.cancelled() => return Err(ApiError::ShuttingDown),
    };
    // A run answered without its end would read as still running forever (issue 13);
    // a paused run answers as it is, waiting for its decision.
    if !view.status.is_terminal() && view.status != turnstile_projections::RunStatus::Paused {
        return Err(ApiError::Internal(format!(
            "run {} ended its stream without a terminal event",
            view.run_id
        )));
    }
    Ok(Json(run_json(state, &view, agent_name).await?).into_response())
}

/// A text field refused (422, naming it) when it is longer than `max` bytes.
pub(super) fn bounded(
    name: &str,
    value: Option<String>,
    max: usize,
) -> Result<Option<String>, ApiError> {
    match value {
        Some(text) if text.len() > max => Err(ApiError::Unprocessable(format!(
            "field {name:?} is longer than {max} bytes"
        ))),
        value => Ok(value),
    }
}

/// `session_id`, when the client names the session.
fn session_id_field(
    agent: &turnstile_actors::AgentSpec,
    text: Option<&str>,
) -> Result<Option<SessionId>, ApiError> {
    text.map(|text| {
        let session_id = SessionId::parse(text)
            .map_err(|error| ApiError::Unprocessable(format!("session_id: {error}")))?;
        // A session of its own directory needs a name that is one (spec workspaces.md).
        match agent.unsafe_session_id(&session_id) {
            Some(reason) => Err(ApiError::Unprocessable(reason)),
            None => Ok(session_id),
        }
    })
    .transpose()
}

/// The `output_schema` field (`parsed` from `fields`): a JSON Schema whose root is an
/// object, checked on entry, as JSON text. A field sent as `null` is a schema whose root
/// is not an object (422), not "no schema".
fn output_schema(
    fields: &crate::api::Fields,
    parsed: Option<serde_json::Value>,
) -> Result<Option<String>, ApiError> {
    let sent = fields
        .text("output_schema")
        .is_some_and(|text| !text.is_empty());
    let Some(schema) = parsed.or(sent.then_some(serde_json::Value::Null)) else {
        return Ok(None);
    };
    // agno 3.1.10 refuses a root that does not say `"type": "object"` (issue 13).
    let is_object_schema = schema.is_object() && schema["type"] == "object";
    if !is_object_schema {
        return Err(ApiError::Unprocessable(
            "output_schema must be a JSON Schema whose root is an object (\"type\": \"object\")"
                .into(),
        ));
    }
    jsonschema::validator_for(&schema).map_err(|error| {
        ApiError::Unprocessable(format!("output_schema is not a valid JSON Schema: {error}"))
    })?;
    Ok(Some(schema.to_string()))
}

/// `?session_id=`: the run's session, when the caller knows it.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct SessionQuery {
    /// The run's session; a run of another session is 404.
    pub(super) session_id: Option<String>,
}

#[utoipa::path(
    get, path = "/agents/{agent_id}/runs/{run_id}", tag = "runs", summary = "One run (agno's RunOutput)",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), ("run_id" = String, Path, description = "A run's id"), SessionQuery),
    responses((status = 200, description = "The run", body = RunOutput), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such agent or run, or the run is of another agent or session", body = ErrorBody))
)]
pub(super) async fn get_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((agent_id, run_id)): Path<(String, String)>,
    Query(query): Query<SessionQuery>,
) -> Result<Json<dto::RunOutput>, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let view = find_run(&state, &caller, agent, &run_id, query.session_id.as_deref())?;
    Ok(Json(run_json(&state, &view, &agent.name).await?))
}

#[utoipa::path(
    post, path = "/agents/{agent_id}/runs/{run_id}/cancel", tag = "runs", summary = "Cancel a run; always 200 {} once the agent exists",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), ("run_id" = String, Path, description = "A run's id")),
    responses((status = 200, description = "The intent is recorded (also for an unknown or finished run, as agno does)", body = Empty), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such agent", body = ErrorBody))
)]
pub(super) async fn cancel_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((agent_id, run_id)): Path<(String, String)>,
) -> Result<Json<dto::Empty>, ApiError> {
    find_agent(&state.runtime, &agent_id)?;
    let parsed = RunId::parse(&run_id);
    if caller.owner().is_some() {
        // Under per-user isolation a run that is not the caller's is 404, and so is an
        // unknown one: the answer does not tell another user's run from no run.
        let not_found = || ApiError::NotFound(format!("Run {run_id} not found"));
        let head = match &parsed {
            Ok(parsed) => state.runtime.run_head(parsed)?,
            Err(_) => None,
        };
        let head = head.ok_or_else(not_found)?;
        check_owner(&state, &caller, &head.session_id, not_found)?;
    }
    // agno answers 200 {} for unknown or finished runs too: cancel records intent.
    if let Ok(run_id) = parsed {
        state.runtime.cancel_run(&run_id).await?;
    }
    Ok(Json(dto::Empty {}))
}

/// The filters and page of `GET /agents/{agent_id}/runs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct AgentRunsQuery {
    /// Only this session's runs.
    session_id: Option<String>,
    /// Only runs with this status (`pending`, `running`, `paused`, `completed`,
    /// `error`, `cancelled`; any case).
    status: Option<String>,
    /// Runs per page, 1 to 100 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 100)]
    limit: Option<String>,
    /// The page, from 1 (default 1).
    #[param(value_type = Option<u32>, minimum = 1)]
    page: Option<String>,
}

/// `GET /agents/{agent_id}/runs?session_id=&status=&limit=&page=`: this agent's runs,
/// newest first, paginated like `/sessions`. A page reads the runs it shows (and the
/// index entries it skips); the count is the journal's, kept as runs change.
#[utoipa::path(
    get, path = "/agents/{agent_id}/runs", tag = "runs", summary = "The runs of this agent, newest first, paginated (limit, page), optionally of one session and status",
    params(("agent_id" = String, Path, description = "An agent's id (GET /agents lists them)"), AgentRunsQuery),
    responses((status = 200, description = "A page of runs", body = RunPage), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 404, description = "No such agent, or no such session", body = ErrorBody), (status = 422, description = "A field or parameter that does not parse, is over its bound, or is unknown", body = ErrorBody))
)]
pub(super) async fn list_agent_runs(
    State(state): State<AppState>,
    caller: Caller,
    Path(agent_id): Path<String>,
    Query(query): Query<AgentRunsQuery>,
) -> Result<Json<dto::RunPage>, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let limit = positive("limit", query.limit.as_deref(), 20, 100)?;
    let page = positive("page", query.page.as_deref(), 1, 1_000_000)?;
    let status = match query
        .status
        .as_deref()
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        None => None,
        Some("PENDING") => Some(RunStatus::Pending),
        Some("RUNNING") => Some(RunStatus::Running),
        Some("COMPLETED") => Some(RunStatus::Completed),
        Some("ERROR") => Some(RunStatus::Error),
        Some("CANCELLED") => Some(RunStatus::Cancelled),
        Some("PAUSED") => Some(RunStatus::Paused),
        Some(other) => {
            return Err(ApiError::Unprocessable(format!(
                "status must be one of pending, running, paused, completed, error, cancelled, got {other:?}"
            )));
        }
    };
    let skip = (page - 1).saturating_mul(limit);
    let (runs, total_count) = match query.session_id.as_deref() {
        Some(session_id) => {
            let session = find_session(&state, &caller, session_id)?;
            let mut runs: Vec<RunView> = state
                .runtime
                .session_runs(&session.session_id)?
                .unwrap_or_default()
                .into_iter()
                .filter(|run| run.agent_id == agent.id)
                .filter(|run| status.is_none_or(|status| run.status == status))
                .collect();
            runs.reverse();
            let total = runs.len();
            (runs.into_iter().skip(skip).take(limit).collect(), total)
        }
        None => match caller.owner() {
            Some(owner) => own_runs(&state, &agent.id, owner, status, skip, limit)?,
            None => state
                .runtime
                .agent_runs(&agent.id, status, skip, limit, true)?,
        },
    };
    let runs: Vec<&RunView> = runs.iter().collect();
    Ok(Json(dto::RunPage {
        data: runs_json(&state, &runs, &agent.name).await?,
        meta: dto::PageMeta {
            page,
            limit,
            total_pages: total_count.div_ceil(limit),
            total_count,
        },
    }))
}

/// One page of an agent's runs in one user's sessions, newest first, and how many
/// there are (per-user isolation): costs that user's runs of the agent, not everyone's.
fn own_runs(
    state: &AppState,
    agent_id: &str,
    owner: &str,
    status: Option<RunStatus>,
    skip: usize,
    limit: usize,
) -> Result<(Vec<RunView>, usize), ApiError> {
    let filter = turnstile_actors::directory::SessionFilter {
        agent_id: Some(agent_id.to_owned()),
        user_id: Some(owner.to_owned()),
        name_contains: None,
    };
    let (sessions, _) = state.runtime.directory().page(&filter, true, 0, usize::MAX);
    let mut runs = Vec::new();
    for entry in sessions {
        let session_runs = state.runtime.session_runs(&entry.session_id)?;
        runs.extend(
            session_runs
                .unwrap_or_default()
                .into_iter()
                .filter(|run| run.agent_id == agent_id)
                .filter(|run| status.is_none_or(|status| run.status == status)),
        );
    }
    // Run ids are UUIDv7: their text sorts by creation time.
    runs.sort_by(|a, b| b.run_id.as_str().cmp(a.run_id.as_str()));
    let total = runs.len();
    Ok((runs.into_iter().skip(skip).take(limit).collect(), total))
}
