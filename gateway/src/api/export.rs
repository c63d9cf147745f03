//! `GET /journal/export` (**ext**): the online audit. The journal as JSON lines, as of
//! the position it had when the request came (a consistent prefix: records appended
//! meanwhile are not in it), streamed in bounded chunks while the server keeps taking
//! turns. `turnstile journal export|verify --url` read it.

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use turnstile_journal::limits::EXPORT_CHUNK_BYTES;
use turnstile_journal::portable::ExportedRecord;
use turnstile_journal::{JournalPos, Recorded, Seq, SessionId};
use utoipa::IntoParams;

use crate::api::AppState;
use crate::api::error::ApiError;
use crate::api::error::ErrorBody;
use crate::api::extract::Query;

/// `?session_id=`: export one session's records only.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ExportQuery {
    /// Only this session's records.
    session_id: Option<String>,
}

/// Streams the export.
#[utoipa::path(
    get, path = "/journal/export", tag = "journal", operation_id = "journal_export", summary = "The journal as JSON lines as of the position it has now (header x-turnstile-as-of), streamed: the online audit",
    params(ExportQuery),
    responses((status = 200, description = "One JSON record per line, in journal order, up to the position in x-turnstile-as-of", body = String, content_type = "application/x-ndjson",
        headers(("x-turnstile-as-of" = u64, description = "The journal position the export is as of"))), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 422, description = "A field or parameter that does not parse, is over its bound, or is unknown", body = ErrorBody))
)]
pub(crate) async fn export(
    State(state): State<AppState>,
    Query(query): Query<ExportQuery>,
) -> Result<Response, ApiError> {
    let session = query
        .session_id
        .map(|id| {
            SessionId::parse(&id)
                .map_err(|error| ApiError::Unprocessable(format!("session_id: {error}")))
        })
        .transpose()?;
    let journal = state.runtime.journal().clone();
    let as_of = journal.next_pos();
    let (chunks, received) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    tokio::task::spawn_blocking(move || {
        let records: Box<dyn Iterator<Item = Result<Recorded, turnstile_journal::Error>>> =
            match &session {
                Some(session) => Box::new(journal.read_session(session, Seq(0))),
                None => Box::new(journal.read_from(JournalPos(0))),
            };
        let mut chunk = Vec::with_capacity(EXPORT_CHUNK_BYTES + 4096);
        for record in records {
            let record = match record {
                Ok(record) => record,
                Err(error) => {
                    let _ = chunks.blocking_send(Err(std::io::Error::other(error.to_string())));
                    return;
                }
            };
            // Both readers go in increasing position: the prefix ends here.
            if record.pos >= as_of {
                break;
            }
            chunk.extend_from_slice(ExportedRecord::from_recorded(&record).to_line().as_bytes());
            chunk.push(b'\n');
            if chunk.len() >= EXPORT_CHUNK_BYTES {
                let full =
                    std::mem::replace(&mut chunk, Vec::with_capacity(EXPORT_CHUNK_BYTES + 4096));
                // The client went away: stop reading.
                if chunks.blocking_send(Ok(full)).is_err() {
                    return;
                }
            }
        }
        if !chunk.is_empty() {
            let _ = chunks.blocking_send(Ok(chunk));
        }
    });
    let stream = futures::stream::unfold(received, |mut received| async move {
        received.recv().await.map(|chunk| (chunk, received))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_owned()),
            (
                header::HeaderName::from_static(crate::wire::AS_OF_HEADER),
                as_of.0.to_string(),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}
