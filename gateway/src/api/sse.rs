//! Server-sent event streams of run events.
//!
//! A frame is `id: <event_index>`, `event: <type>`, `data: <compact JSON>`. Streams
//! send a keepalive comment when idle and end on the terminal event, on a runtime
//! fault (one `error` frame), or when the server shuts down (an open stream would
//! otherwise hold axum's graceful shutdown forever).

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt, stream};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use turnstile_actors::{RunEvents, WireEvent};

/// What every stream needs from the server: when to end, how often to keep alive.
#[derive(Debug, Clone)]
pub struct SseOptions {
    /// Fires when the server shuts down; every open stream ends then.
    pub shutdown: CancellationToken,
    /// Interval of `: keepalive` comments on an idle stream.
    pub keepalive: Duration,
}

/// How frames carry the index: inline streams keep agno's payload as it is, re-attachable
/// (background) streams add `event_index` and `run_id` to the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// agno's inline stream.
    Inline,
    /// A re-attachable stream.
    Indexed,
}

fn frame(event: &WireEvent, framing: Framing) -> Event {
    let data = match framing {
        Framing::Inline => event.data.clone(),
        // The stored JSON already names the run: splice the index in front rather than
        // parse and re-serialize every event of a long replay.
        Framing::Indexed => match event.data.strip_prefix('{') {
            Some(rest) if rest.trim_start().starts_with('}') => {
                format!("{{\"event_index\":{}}}", event.event_index.0)
            }
            Some(rest) => format!("{{\"event_index\":{},{rest}", event.event_index.0),
            None => event.data.clone(),
        },
    };
    Event::default()
        .id(event.event_index.to_string())
        .event(&event.event_type)
        .data(data)
}

fn respond(frames: impl Stream<Item = Event> + Send + 'static, options: SseOptions) -> Response {
    let frames = frames
        .map(Ok::<_, Infallible>)
        .take_until(options.shutdown.cancelled_owned());
    Sse::new(frames)
        .keep_alive(
            KeepAlive::new()
                .interval(options.keepalive)
                .text("keepalive"),
        )
        .into_response()
}

/// A run's events as an SSE response.
pub fn run_stream(events: RunEvents, framing: Framing, options: SseOptions) -> Response {
    let frames = events.into_stream().map(move |item| match item {
        Ok(event) => frame(&event, framing),
        Err(error) => {
            tracing::error!(%error, "run stream failed");
            Event::default()
                .event("error")
                .data(json!({"event": "error", "error": "stream failed"}).to_string())
        }
    });
    respond(frames, options)
}

/// A re-attached stream: meta frames (no `id`, so they never move a client's
/// `Last-Event-ID`), then the run's events with their indexes.
pub fn resume_stream(
    meta: Vec<(&'static str, serde_json::Value)>,
    events: RunEvents,
    options: SseOptions,
) -> Response {
    let meta = stream::iter(
        meta.into_iter()
            .map(|(event_type, data)| Event::default().event(event_type).data(data.to_string())),
    );
    let frames = events.into_stream().map(move |item| match item {
        Ok(event) => frame(&event, Framing::Indexed),
        Err(error) => {
            tracing::error!(%error, "run stream failed");
            Event::default()
                .event("error")
                .data(json!({"event": "error", "error": "stream failed"}).to_string())
        }
    });
    respond(meta.chain(frames), options)
}

/// An SSE response of exactly one frame (the busy answer of a streamed run).
pub fn single(event_type: &str, data: serde_json::Value, options: SseOptions) -> Response {
    let frame = Event::default().event(event_type).data(data.to_string());
    respond(stream::iter([frame]), options)
}
