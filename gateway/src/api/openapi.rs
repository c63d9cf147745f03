//! `GET /openapi.json`: the OpenAPI 3.1 document of every route.
//!
//! [`ROUTES`] is the one list of what the router serves; a test checks it against
//! the router's source and against the served document, so neither can drift.

use axum::Json;
use serde_json::{Map, Value, json};

/// Every route: method, path, summary, and the statuses it answers.
pub const ROUTES: &[(&str, &str, &str, &[u16])] = &[
    (
        "get",
        "/health",
        "Liveness; never needs the API key",
        &[200],
    ),
    ("get", "/openapi.json", "This document", &[200, 401]),
    (
        "get",
        "/agents",
        "Configured agents with their model and metadata.sdk",
        &[200, 401],
    ),
    ("get", "/agents/{agent_id}", "One agent", &[200, 401, 404]),
    (
        "post",
        "/agents/{agent_id}/runs",
        "Start a run: JSON, SSE stream, or 202 for a background run",
        &[200, 202, 400, 401, 404, 409, 413, 422, 429],
    ),
    (
        "get",
        "/agents/{agent_id}/runs",
        "The runs of this agent, newest first, paginated (limit, page), optionally of one session and status",
        &[200, 401, 404, 422],
    ),
    (
        "get",
        "/agents/{agent_id}/runs/{run_id}",
        "One run (agno's RunOutput)",
        &[200, 401, 404],
    ),
    (
        "post",
        "/agents/{agent_id}/runs/{run_id}/cancel",
        "Cancel a run; always 200 {} once the agent exists",
        &[200, 401, 404],
    ),
    (
        "post",
        "/agents/{agent_id}/runs/{run_id}/resume",
        "Re-attach to a run's events after last_event_index",
        &[200, 401, 404, 422],
    ),
    (
        "get",
        "/agents/{agent_id}/runs/{run_id}/checkpoints",
        "A run's tool-batch checkpoints and its end",
        &[200, 401, 404],
    ),
    (
        "post",
        "/agents/{agent_id}/runs/{run_id}/continue",
        "Continue a finished run from a checkpoint as a new run",
        &[200, 202, 401, 404, 409, 422, 429],
    ),
    (
        "post",
        "/agents/{agent_id}/sessions/{session_id}/compact",
        "Compact the session's harness session",
        &[200, 401, 404, 409],
    ),
    (
        "get",
        "/sessions",
        "Sessions, paginated and filtered",
        &[200, 401, 422],
    ),
    (
        "get",
        "/sessions/{session_id}",
        "One session with its metrics and harness session",
        &[200, 401, 404],
    ),
    (
        "delete",
        "/sessions/{session_id}",
        "Delete a session (a tombstone; the journal keeps it)",
        &[204, 401, 404, 409],
    ),
    (
        "get",
        "/sessions/{session_id}/runs",
        "A session's runs",
        &[200, 401, 404],
    ),
    (
        "get",
        "/metrics",
        "Daily aggregates of runs, sessions, users and tokens",
        &[200, 401, 422],
    ),
    (
        "get",
        "/journal/export",
        "The journal as JSON lines as of the position it has now (header x-turnstile-as-of), streamed: the online audit",
        &[200, 401, 422],
    ),
    (
        "get",
        "/metrics/prometheus",
        "Runtime counters in the Prometheus text format",
        &[200, 401],
    ),
];

fn describe(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted: queued in the journal",
        204 => "No content",
        400 => "Bad request",
        401 => "Missing or invalid API key",
        404 => "Unknown agent, run or session",
        409 => "Session busy, or the run cannot be continued",
        413 => "Body too large",
        422 => "Invalid field",
        429 => "Run queue full",
        _ => "Other",
    }
}

/// The document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for (method, path, summary, statuses) in ROUTES {
        let parameters: Vec<Value> = path
            .split('/')
            .filter_map(|part| part.strip_prefix('{').and_then(|p| p.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let responses: Map<String, Value> = statuses
            .iter()
            .map(|status| {
                (
                    status.to_string(),
                    json!({"description": describe(*status)}),
                )
            })
            .collect();
        let mut operation =
            json!({"summary": summary, "parameters": parameters, "responses": responses});
        if *method == "post" {
            operation["requestBody"] = json!({"content": {
                "application/x-www-form-urlencoded": {"schema": {"type": "object"}},
                "multipart/form-data": {"schema": {"type": "object"}},
                "application/json": {"schema": {"type": "object"}},
            }});
        }
        let entry = paths.entry((*path).to_owned()).or_insert_with(|| json!({}));
        entry[*method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "turnstile", "version": env!("CARGO_PKG_VERSION"), "description": "Durable coding-agent sessions (agno AgentOS 3.1 compatible)"},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": paths,
    })
}

/// `GET /openapi.json`.
pub async fn serve() -> Json<Value> {
    Json(document())
}
