//! `GET /ui` (**ext**): the web console, its three files embedded in the binary (no
//! build step, nothing fetched at run time). The files hold no data: they load without
//! the API key, and the page then reads the API with the key its user gives it.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            (CACHE_CONTROL, "no-cache"),
            (
                CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
            ),
        ],
        body,
    )
        .into_response()
}

#[utoipa::path(
    get, path = "/", tag = "console", summary = "Redirects to the web console; never needs the API key", security(()),
    responses((status = 307, description = "To /ui"))
)]
pub(crate) async fn root() -> Response {
    axum::response::Redirect::temporary("/ui").into_response()
}

#[utoipa::path(
    get, path = "/ui", tag = "console", summary = "The web console (HTML); never needs the API key", security(()),
    responses((status = 200, description = "The page", body = String, content_type = "text/html"))
)]
pub(crate) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

#[utoipa::path(
    get, path = "/ui/", tag = "console", summary = "The web console, as at /ui", security(()),
    responses((status = 200, description = "The page", body = String, content_type = "text/html"))
)]
pub(crate) async fn index_slash() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

#[utoipa::path(
    get, path = "/ui/app.js", tag = "console", summary = "The console's script", security(()),
    responses((status = 200, description = "The script", body = String, content_type = "text/javascript"))
)]
pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

#[utoipa::path(
    get, path = "/ui/app.css", tag = "console", summary = "The console's style sheet", security(()),
    responses((status = 200, description = "The style sheet", body = String, content_type = "text/css"))
)]
pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// Whether `path` is one of the console's files (served without the API key).
pub(crate) fn is_console(path: &str) -> bool {
    matches!(path, "/" | "/ui" | "/ui/" | "/ui/app.js" | "/ui/app.css")
}
