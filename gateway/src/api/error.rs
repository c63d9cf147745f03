//! One error type for every route, mapped to a status and agno's error body.
//!
//! Client mistakes get a 4xx with a message that says what to change; server faults
//! are logged with their cause and answered with a generic 500 that leaks nothing.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use turnstile_actors::{Refused, RuntimeError};
use utoipa::ToSchema;

/// The body of every refusal.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong and what to change, for a person.
    pub detail: String,
    /// A slug: `not_found`, `bad_request`, `validation_error`, `session_busy`,
    /// `session_agent_mismatch`, `run_not_continuable`, `queue_full`,
    /// `payload_too_large`, `event_too_large`, `request_timeout`, `unauthorized`,
    /// `method_not_allowed`, `shutting_down`, `journal_unavailable`, `owner_unavailable`,
    /// `internal_error`.
    pub error_type: &'static str,
    /// `session_busy` (agno's field) on a busy session's 409.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_id: Option<&'static str>,
    /// The run in flight, on a busy session's 409.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// See the module documentation.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 404.
    #[error("{0}")]
    NotFound(String),
    /// 400.
    #[error("{0}")]
    BadRequest(String),
    /// 422.
    #[error("{0}")]
    Unprocessable(String),
    /// 409 for a refusal other than a busy session.
    #[error("{message}")]
    Conflict {
        /// Slug.
        error_type: &'static str,
        /// Human message.
        message: String,
    },
    /// 409 `session_busy`, with the running run's id.
    #[error("{message}")]
    Busy {
        /// Human message naming the run.
        message: String,
        /// The run in flight.
        run_id: String,
    },
    /// 413: the body is larger than the configured limit.
    #[error("request body is larger than the configured limit (server.max_request_bytes)")]
    PayloadTooLarge,
    /// 408: the body did not arrive in time.
    #[error("the request body did not arrive within {0} s (server.body_timeout_s)")]
    RequestTimeout(f64),
    /// 429: the durable queue is full.
    #[error("{0}")]
    TooManyRequests(String),
    /// 503: shutting down.
    #[error("turnstile is shutting down; try again shortly")]
    ShuttingDown,
    /// 413: one event of the request is larger than the journal takes; nothing was
    /// recorded.
    #[error("{0}")]
    EventTooLarge(String),
    /// 503: the journal cannot write now (its database away, its disk full or
    /// read-only); nothing of the request was recorded.
    #[error(
        "The journal cannot write now: {0}. Nothing of this request was recorded; try again shortly."
    )]
    JournalUnavailable(String),
    /// 503: the live replica that owns the session neither took the command nor gave
    /// the session up in time (a shared journal); nothing of the request was recorded
    /// here.
    #[error("{0}; try again shortly")]
    OwnerUnavailable(String),
    /// 500: logged, never shown.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    fn status_and_type(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation_error"),
            ApiError::Conflict { error_type, .. } => (StatusCode::CONFLICT, error_type),
            ApiError::Busy { .. } => (StatusCode::CONFLICT, "session_busy"),
            ApiError::TooManyRequests(_) => (StatusCode::TOO_MANY_REQUESTS, "queue_full"),
            ApiError::PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            ApiError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            ApiError::EventTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "event_too_large"),
            ApiError::JournalUnavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "journal_unavailable")
            }
            ApiError::OwnerUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "owner_unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        }
    }
}

impl From<RuntimeError> for ApiError {
    fn from(error: RuntimeError) -> Self {
        if let RuntimeError::Journal(journal) = &error
            && let Some(detail) = journal.unavailable()
        {
            tracing::warn!(%journal, "journal unavailable: answered 503");
            return ApiError::JournalUnavailable(detail);
        }
        if let RuntimeError::OwnerSilent { .. } = &error {
            tracing::warn!(%error, "the session's owner did not answer: answered 503");
            return ApiError::OwnerUnavailable(error.to_string());
        }
        // Another writer appended to the session first: the client may try again.
        if let RuntimeError::Conflict(conflict) = &error {
            return ApiError::Conflict {
                error_type: "session_busy",
                message: conflict.to_string(),
            };
        }
        ApiError::Internal(error.to_string())
    }
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> Self {
        let message = refused.to_string();
        match refused {
            Refused::UnknownAgent { .. } => ApiError::NotFound(message),
            Refused::Busy { run_id, .. } => ApiError::Busy {
                message,
                run_id: run_id.to_string(),
            },
            Refused::AgentMismatch { .. } => ApiError::Conflict {
                error_type: "session_agent_mismatch",
                message,
            },
            Refused::QueueFull { .. } => ApiError::TooManyRequests(message),
            Refused::InvalidInput { .. } => ApiError::BadRequest(message),
            Refused::InvalidDecision { .. } => ApiError::Unprocessable(message),
            Refused::Compacting { .. } | Refused::Deleting { .. } => ApiError::Conflict {
                error_type: "session_busy",
                message,
            },
            Refused::NotContinuable { .. } => ApiError::Conflict {
                error_type: "run_not_continuable",
                message,
            },
            Refused::NotPaused { .. } => ApiError::Conflict {
                error_type: "run_not_paused",
                message,
            },
            Refused::UnknownRun { .. } | Refused::UnknownSession { .. } => {
                ApiError::NotFound(message)
            }
            Refused::ShuttingDown => ApiError::ShuttingDown,
            Refused::EventTooLarge { .. } => ApiError::EventTooLarge(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, error_type) = self.status_and_type();
        if let ApiError::Internal(cause) = &self {
            tracing::error!(%cause, "request failed");
        }
        let (error_id, run_id) = match &self {
            ApiError::Busy { run_id, .. } => (Some("session_busy"), Some(run_id.clone())),
            _ => (None, None),
        };
        let body = ErrorBody {
            detail: self.to_string(),
            error_type,
            error_id,
            run_id,
        };
        let mut response = (status, Json(body)).into_response();
        if matches!(
            self,
            ApiError::Busy { .. }
                | ApiError::ShuttingDown
                | ApiError::TooManyRequests(_)
                | ApiError::JournalUnavailable(_)
                | ApiError::OwnerUnavailable(_)
        ) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_owner_is_503_with_retry_after_and_names_the_session_and_replica() {
        let error = RuntimeError::OwnerSilent {
            session_id: turnstile_journal::SessionId::parse("s1").unwrap(),
            owner: "replica-a".into(),
            detail: ", which does not take the turn",
        };
        let response = ApiError::from(error).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        let body = ApiError::from(RuntimeError::OwnerSilent {
            session_id: turnstile_journal::SessionId::parse("s1").unwrap(),
            owner: "replica-a".into(),
            detail: "",
        });
        let (_, error_type) = body.status_and_type();
        assert_eq!(error_type, "owner_unavailable");
        let detail = body.to_string();
        assert!(
            detail.contains("s1") && detail.contains("replica-a"),
            "{detail}"
        );
    }
}
