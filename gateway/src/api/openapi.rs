//! `GET /openapi.json`: the OpenAPI 3.1 document of every route, generated from the
//! code: each handler's `#[utoipa::path]` (method, path, parameters, statuses) and the
//! derived schemas of the request and response types (`body.rs`, `dto.rs`). A test
//! checks it against the router in both directions.

use axum::Json;
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api::error::ErrorBody;

/// The document's source: every route's handler.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "turnstile",
        description = "Durable coding-agent sessions, speaking agno AgentOS 3.1's agent, run and session routes. POST bodies are accepted as application/x-www-form-urlencoded (what agno's client sends), multipart/form-data or application/json with the same field names; a field a route does not name is a 422."
    ),
    paths(
        super::health,
        serve,
        super::list_agents,
        super::get_agent,
        super::runs::create_run,
        super::runs::list_agent_runs,
        super::runs::get_run,
        super::runs::cancel_run,
        super::resume::resume_run,
        super::resume::get_checkpoints,
        super::files::run_files,
        super::files::run_file,
        super::resume::continue_run,
        super::sessions::compact_session,
        super::sessions::list_sessions,
        super::approvals::list_approvals,
        super::sessions::get_session,
        super::sessions::delete_session,
        super::sessions::get_session_runs,
        super::sessions::get_session_run,
        super::metrics::daily,
        super::metrics::prometheus,
        super::export::export,
        super::ui::root,
        super::ui::index,
        super::ui::index_slash,
        super::ui::script,
        super::ui::style,
    ),
    modifiers(&Bearer),
    security(("bearer" = []))
)]
struct ApiDoc;

/// The bearer credential: the API key of `[server] api_key_env`, or a signed token
/// (`[auth] mode = "jwt"`).
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
    }
}

/// The document.
pub fn document() -> Value {
    let mut document = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    document["info"]["version"] = Value::from(env!("CARGO_PKG_VERSION"));
    // Every route that needs a credential may also lack the token's scope, but for
    // `GET /agents`, which lists fewer agents instead.
    if let Some(paths) = document["paths"].as_object_mut() {
        for (path, operations) in paths.iter_mut() {
            let Some(operations) = operations.as_object_mut() else {
                continue;
            };
            for (method, operation) in operations.iter_mut() {
                if path == "/agents" && method == "get" {
                    continue;
                }
                let responses = &mut operation["responses"];
                if let Some(unauthorized) = responses.get("401").cloned() {
                    let mut forbidden = unauthorized;
                    forbidden["description"] = Value::from(
                        "The token lacks the route's scope ([auth] mode = \"jwt\"): forbidden, naming the scope",
                    );
                    responses["403"] = forbidden;
                }
            }
        }
    }
    document
}

#[utoipa::path(
    get, path = "/openapi.json", tag = "server", operation_id = "openapi", summary = "This document",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody))
)]
/// `GET /openapi.json`.
pub async fn serve() -> Json<Value> {
    Json(document())
}
