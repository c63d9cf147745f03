//! Who may call which route (spec `authorization.md`): open, the shared API key, or
//! signed tokens with agno's scopes and per-user isolation.
//!
//! One middleware checks every request before a handler sees it: the key or the token
//! (`401`), the route's scope (`403`), and, under `user_isolation`, the token's `sub`.
//! It hands the handler a [`Caller`]; every handler that reads or drives sessions asks
//! the caller which sessions it may see, so no read bypasses the scope (the handlers
//! answer `404` for another user's session or run). `/health` and the console's static
//! files stay open.

pub mod jwt;
pub mod scopes;

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, middleware::Next};
use serde_json::json;

/// How callers authenticate.
pub enum Auth {
    /// No key configured: every caller may do everything.
    Open,
    /// The shared API key: its holder may do everything.
    Key(Arc<str>),
    /// Signed tokens.
    Jwt(Box<Tokens>),
}

/// `mode = "jwt"`: the verifier and what its scopes mean here.
pub struct Tokens {
    /// The keys and checks.
    pub verifier: jwt::Verifier,
    /// The scope that grants everything and sees every user.
    pub admin_scope: String,
    /// Each caller sees only its own sessions.
    pub user_isolation: bool,
}

/// The caller of one request, as the middleware found it; a handler takes it as an
/// extractor. The key and open modes make every caller unrestricted.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// Under `user_isolation`, for a caller without the admin scope: the only user
    /// whose sessions and runs it may see or drive.
    owner: Option<Arc<str>>,
    /// `GET /agents`: the agents it may list (`None`: every agent).
    agents: Option<Arc<[String]>>,
}

impl Caller {
    /// The user this caller is confined to (its `sub`), when isolation applies.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// Whether the caller may see a session owned by `session_user`.
    pub fn sees(&self, session_user: Option<&str>) -> bool {
        match &self.owner {
            None => true,
            Some(owner) => session_user == Some(owner),
        }
    }

    /// Whether `GET /agents` lists this agent for the caller.
    pub fn lists_agent(&self, agent_id: &str) -> bool {
        self.agents
            .as_ref()
            .is_none_or(|agents| agents.iter().any(|id| id == agent_id))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or_default())
    }
}

/// The `sub` of a request's caller, put on its response for the request log (which
/// names the caller, never the token).
#[derive(Debug, Clone)]
pub struct LoggedCaller(pub Arc<str>);

/// What the middleware holds: the mode, and which paths stay open (the router's
/// `/health` and the console's files).
#[derive(Clone)]
pub struct Guard {
    /// How callers authenticate.
    pub auth: Arc<Auth>,
    /// Whether a path needs no credential.
    pub open: fn(&str) -> bool,
}

/// The middleware (see the module doc).
pub async fn authenticate(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    if (guard.open)(request.uri().path()) {
        return next.run(request).await;
    }
    match &*guard.auth {
        Auth::Open => next.run(request).await,
        Auth::Key(key) => {
            if matches_key(bearer(request.headers()).unwrap_or_default(), key) {
                next.run(request).await
            } else {
                unauthorized("Missing or invalid API key: send Authorization: Bearer <key>")
            }
        }
        Auth::Jwt(tokens) => check_token(tokens, request, next).await,
    }
}

/// A token's checks, in agno's order: present, valid, scoped, and (under isolation)
/// naming its user.
async fn check_token(tokens: &Tokens, mut request: Request, next: Next) -> Response {
    let Some(token) = bearer(request.headers()) else {
        return unauthorized("Authorization header missing");
    };
    let claims = match tokens.verifier.verify(token) {
        Ok(claims) => claims,
        Err(detail) => return unauthorized(detail),
    };
    let user = claims.sub.clone();
    let admin = claims.scopes.contains(&tokens.admin_scope);
    let mut caller = Caller::default();
    let requirement = scopes::requirement(
        request.method(),
        request.uri().path(),
        tokens.user_isolation,
    );
    if let Some(requirement) = requirement {
        if requirement.listing {
            caller.agents =
                scopes::listed_agents(&claims.scopes, &tokens.admin_scope).map(Arc::from);
        } else if !scopes::grants(&claims.scopes, &requirement, &tokens.admin_scope) {
            return logged(forbidden(requirement.named(&tokens.admin_scope)), &user);
        }
        if tokens.user_isolation && requirement.per_user && !admin {
            match &user {
                Some(user) => caller.owner = Some(user.clone()),
                None => {
                    return unauthorized(
                        "Invalid token subject: this server needs a sub claim to tell users apart",
                    );
                }
            }
        }
    }
    request.extensions_mut().insert(caller);
    logged(next.run(request).await, &user)
}

fn logged(mut response: Response, user: &Option<Arc<str>>) -> Response {
    if let Some(user) = user {
        response.extensions_mut().insert(LoggedCaller(user.clone()));
    }
    response
}

/// The credential of `Authorization: Bearer …` (the scheme in any case, RFC 9110
/// §11.1).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim_start_matches(' '))
        .filter(|token| !token.is_empty())
}

/// Compared without an early exit, so timing does not tell how much of a key matched.
fn matches_key(presented: &str, key: &str) -> bool {
    presented.len() == key.len()
        && presented
            .bytes()
            .zip(key.bytes())
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

/// `401` in agno's JSON, with `WWW-Authenticate: Bearer`.
fn unauthorized(detail: &str) -> Response {
    let body = json!({"detail": detail, "error_type": "unauthorized"});
    let mut response = (StatusCode::UNAUTHORIZED, Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// `403` in agno's words, naming the scope the route needs.
fn forbidden(scope: &str) -> Response {
    let body = json!({
        "detail": format!("Insufficient permissions. Required scope(s): {scope}"),
        "error_type": "forbidden",
    });
    (StatusCode::FORBIDDEN, Json(body)).into_response()
}

/// The mode of `[auth]` and `server.api_key_env`, checked before the server opens
/// anything: a key variable set but empty, or a `jwt` mode without a usable key,
/// refuses to start.
pub fn from_config(config: &crate::config::Config) -> anyhow::Result<Auth> {
    use crate::config::AuthMode;
    if config.auth.mode == AuthMode::Jwt {
        let verifier = jwt::Verifier::from_config(&config.auth)?;
        tracing::info!(
            "token auth is on ({}{})",
            config.auth.algorithm,
            if config.auth.user_isolation {
                ", each user sees only their own sessions"
            } else {
                ""
            }
        );
        return Ok(Auth::Jwt(Box::new(Tokens {
            verifier,
            admin_scope: config.auth.admin_scope.clone(),
            user_isolation: config.auth.user_isolation,
        })));
    }
    match std::env::var(&config.server.api_key_env) {
        // Set but empty is a mistake, not a wish to run without auth (issue 13).
        Ok(key) if key.is_empty() => anyhow::bail!(
            "{} is set but empty: set it to the API key, or unset it to run without auth",
            config.server.api_key_env
        ),
        Ok(key) => {
            tracing::info!("API key auth is on ({} is set)", config.server.api_key_env);
            Ok(Auth::Key(key.into()))
        }
        Err(_) => Ok(Auth::Open),
    }
}
