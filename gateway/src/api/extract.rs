//! Path and query extractors whose refusals are the API's JSON errors: axum's own
//! answer a malformed segment (`/agents/%FF`) or query (`?limit=1&limit=2`) with
//! `400 text/plain`, which bypasses [`ApiError`] (issue 13).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// `axum::extract::Path`, refused as `400 {"detail", "error_type"}`.
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|rejection| {
                ApiError::BadRequest(format!("Malformed path: {}", rejection.body_text()))
            })
    }
}

/// `axum::extract::Query`, refused as `400 {"detail", "error_type"}`.
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(|rejection| {
                ApiError::BadRequest(format!("Malformed query string: {}", rejection.body_text()))
            })
    }
}
