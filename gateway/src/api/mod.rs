//! The HTTP routes of `spec/http-api.md`: a thin layer that parses requests, forwards
//! commands to the runtime, and renders views and streams.
//!
//! Handlers hold no state of their own beyond the [`AppState`]; everything they answer
//! comes from the runtime, which reads it from the journal.

pub mod dto;
pub mod error;
pub mod form;
pub mod sse;

use axum::extract::{Path, Query, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use turnstile_actors::{AgentSpec, Refused, Runtime, StartRun};
use turnstile_journal::limits::{MESSAGE_BYTES_MAX, REQUEST_BODY_BYTES_MAX};
use turnstile_journal::{RunId, SessionId};

use crate::api::error::ApiError;
use crate::api::form::Fields;
use crate::api::sse::Framing;

/// What every handler gets.
#[derive(Clone)]
pub struct AppState {
    /// The runtime.
    pub runtime: Runtime,
    /// Fires when the server begins to shut down.
    pub shutdown: CancellationToken,
}

/// The router with every route.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/agents", get(list_agents))
        .route("/agents/{agent_id}", get(get_agent))
        .route("/agents/{agent_id}/runs", post(create_run))
        .route("/agents/{agent_id}/runs/{run_id}", get(get_run))
        .route("/agents/{agent_id}/runs/{run_id}/cancel", post(cancel_run))
        .fallback(fallback)
        .layer(axum::extract::DefaultBodyLimit::max(REQUEST_BODY_BYTES_MAX))
        .with_state(state)
}

async fn fallback(method: Method) -> Response {
    let detail = if method == Method::GET || method == Method::POST || method == Method::DELETE {
        "Not Found"
    } else {
        "Method Not Allowed"
    };
    let status = if detail == "Not Found" {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::METHOD_NOT_ALLOWED
    };
    (
        status,
        Json(json!({"detail": detail, "error_type": "not_found"})),
    )
        .into_response()
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

fn find_agent<'a>(runtime: &'a Runtime, agent_id: &str) -> Result<&'a AgentSpec, ApiError> {
    runtime
        .agent(agent_id)
        .ok_or_else(|| ApiError::NotFound(format!("Agent {agent_id} not found")))
}

async fn list_agents(State(state): State<AppState>) -> Json<Vec<serde_json::Value>> {
    Json(state.runtime.agents().iter().map(dto::agent).collect())
}

async fn get_agent(
    State(state): State<AppState>,
    Path(agent_id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(dto::agent(find_agent(&state.runtime, &agent_id)?)))
}

/// Fields this build does not take yet; refused before anything is recorded rather
/// than silently dropped.
const NOT_YET: [(&str, &str); 4] = [
    ("output_schema", "structured output"),
    ("images", "image attachments"),
    ("input_files", "file attachments"),
    ("files", "file uploads"),
];

async fn create_run(
    State(state): State<AppState>,
    Path(agent_id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let fields = Fields::read(request).await?;
    let message = fields.required("message")?;
    if message.len() > MESSAGE_BYTES_MAX {
        return Err(ApiError::Unprocessable(format!(
            "message is longer than {MESSAGE_BYTES_MAX} bytes"
        )));
    }
    let stream = fields.boolean("stream", true)?;
    let background = fields.boolean("background", false)?;
    let session_id = fields
        .text("session_id")
        .map(|text| {
            SessionId::parse(text)
                .map_err(|error| ApiError::Unprocessable(format!("session_id: {error}")))
        })
        .transpose()?;
    for kind in ["audio", "videos"] {
        if fields
            .json(kind)?
            .is_some_and(|value| value.as_array().is_none_or(|items| !items.is_empty()))
        {
            return Err(ApiError::BadRequest(format!(
                "{kind} is not supported by the {} harness",
                agent.harness.info().sdk
            )));
        }
    }
    for (field, what) in NOT_YET {
        if fields.json(field)?.is_some() {
            return Err(ApiError::BadRequest(format!(
                "{what} ({field:?}) are not supported by this build yet"
            )));
        }
    }
    match fields.text("multitask_strategy") {
        None | Some("reject") => {}
        Some("enqueue") => {
            return Err(ApiError::BadRequest(
                "multitask_strategy \"enqueue\" is not supported by this build yet".into(),
            ));
        }
        Some(other) => {
            return Err(ApiError::Unprocessable(format!(
                "multitask_strategy must be reject or enqueue, got {other:?}"
            )));
        }
    }
    if background {
        return Err(ApiError::BadRequest(
            "background runs are not supported by this build yet".into(),
        ));
    }
    let command = StartRun {
        agent_id: agent.id.clone(),
        session_id,
        user_id: fields.text("user_id").map(str::to_owned),
        message: message.to_owned(),
        options: json!({"stream": stream, "background": background}),
    };
    let agent_name = agent.name.clone();
    let handle = match state.runtime.start_run(command).await? {
        Ok(handle) => handle,
        Err(Refused::Busy { session_id, run_id }) if stream => {
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
            return Ok(sse::single("RunError", frame, state.shutdown.clone()));
        }
        Err(refused) => return Err(refused.into()),
    };
    if stream {
        return Ok(sse::run_stream(
            handle.into_events(),
            Framing::Inline,
            state.shutdown.clone(),
        ));
    }
    let shutdown = state.shutdown.clone();
    let view = tokio::select! {
        view = handle.outcome() => view?,
        _ = shutdown.cancelled() => return Err(ApiError::ShuttingDown),
    };
    Ok(Json(dto::run_output(&view, &agent_name)).into_response())
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[derive(Debug, Deserialize)]
struct SessionQuery {
    session_id: Option<String>,
}

async fn get_run(
    State(state): State<AppState>,
    Path((agent_id, run_id)): Path<(String, String)>,
    Query(query): Query<SessionQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let agent = find_agent(&state.runtime, &agent_id)?;
    let not_found = || ApiError::NotFound(format!("Run {run_id} not found"));
    let parsed = RunId::parse(&run_id).map_err(|_| not_found())?;
    let view = state.runtime.run_view(&parsed)?.ok_or_else(not_found)?;
    let wrong_session = query
        .session_id
        .as_deref()
        .is_some_and(|session| session != view.session_id.as_str());
    if view.agent_id != agent.id || wrong_session {
        return Err(not_found());
    }
    Ok(Json(dto::run_output(&view, &agent.name)))
}

async fn cancel_run(
    State(state): State<AppState>,
    Path((agent_id, run_id)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    find_agent(&state.runtime, &agent_id)?;
    // agno answers 200 {} for unknown or finished runs too: cancel records intent.
    if let Ok(run_id) = RunId::parse(&run_id) {
        state.runtime.cancel_run(&run_id).await?;
    }
    Ok(Json(json!({})))
}
