//! Server-sent event streams of run events.
//!
//! A frame is `id: <event_index>`, `event: <type>`, `data: <compact JSON>` (compact
//! JSON never holds a raw newline, so one `data:` line always suffices). Frames that
//! are ready together go out in one write: a replay of 10,000 events is a few dozen
//! writes, not 10,000. Streams send a keepalive comment when idle and end on the
//! terminal event, on a runtime fault (one `error` frame), or when the server shuts
//! down (an open stream would otherwise hold axum's graceful shutdown forever).

use std::convert::Infallible;
use std::fmt::Write as _;
use std::pin::Pin;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, Stream, StreamExt, stream};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use turnstile_actors::{RunEvents, WireEvent};

use crate::api::events::{self, Who};

/// Frames coalesced into one write at most.
const FRAMES_PER_WRITE_MAX: usize = 256;

/// What every stream needs from the server: when to end, how often to keep alive.
#[derive(Debug, Clone)]
pub struct SseOptions {
    /// Fires when the server shuts down; every open stream ends then.
    pub shutdown: CancellationToken,
    /// Interval of `: keepalive` comments on an idle stream.
    pub keepalive: Duration,
}

/// How frames carry the index: inline streams keep agno's payload as it is, re-attachable
/// (background) streams add `event_index` to the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// agno's inline stream.
    Inline,
    /// A re-attachable stream.
    Indexed,
}

/// One SSE frame; `id` only for run events, so meta frames never move `Last-Event-ID`.
fn encode(id: Option<u64>, event_type: &str, data: &str) -> String {
    let mut frame = String::with_capacity(data.len() + event_type.len() + 32);
    if let Some(id) = id {
        let _ = writeln!(frame, "id: {id}");
    }
    let _ = write!(frame, "event: {event_type}\ndata: {data}\n\n");
    frame
}

fn frame(event: &WireEvent, framing: Framing, who: &Who) -> String {
    let index = event.event_index.0;
    let (event_type, mut data) = events::render(event, who);
    if framing == Framing::Indexed
        && let Some(object) = data.as_object_mut()
    {
        object.insert("event_index".into(), json!(index));
    }
    encode(Some(index), event_type, &data.to_string())
}

fn error_frame() -> String {
    encode(
        None,
        "error",
        &json!({"event": "error", "error": "stream failed"}).to_string(),
    )
}

struct Pump {
    frames: Pin<Box<dyn Stream<Item = String> + Send>>,
    options: SseOptions,
    done: bool,
}

fn respond(frames: impl Stream<Item = String> + Send + 'static, options: SseOptions) -> Response {
    let pump = Pump {
        frames: Box::pin(frames),
        options,
        done: false,
    };
    let body = stream::unfold(pump, |mut pump| async move {
        if pump.done {
            return None;
        }
        let first = tokio::select! {
            biased;
            _ = pump.options.shutdown.cancelled() => return None,
            frame = pump.frames.next() => frame?,
            _ = tokio::time::sleep(pump.options.keepalive) => {
                return Some((Ok::<_, Infallible>(Bytes::from_static(b": keepalive\n\n")), pump));
            }
        };
        let mut chunk = first;
        for _ in 1..FRAMES_PER_WRITE_MAX {
            match pump.frames.next().now_or_never() {
                Some(Some(frame)) => chunk.push_str(&frame),
                Some(None) => {
                    pump.done = true;
                    break;
                }
                None => break,
            }
        }
        Some((Ok(Bytes::from(chunk)), pump))
    });
    (
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

fn run_frames(events: RunEvents, framing: Framing, who: Who) -> impl Stream<Item = String> + Send {
    events.into_stream().map(move |item| match item {
        Ok(event) => frame(&event, framing, &who),
        Err(error) => {
            tracing::error!(%error, "run stream failed");
            error_frame()
        }
    })
}

/// A run's events as an SSE response.
pub fn run_stream(events: RunEvents, framing: Framing, who: Who, options: SseOptions) -> Response {
    respond(run_frames(events, framing, who), options)
}

/// A re-attached stream: meta frames (no `id`), then the run's events with their indexes.
pub fn resume_stream(
    meta: Vec<(&'static str, serde_json::Value)>,
    events: RunEvents,
    who: Who,
    options: SseOptions,
) -> Response {
    let meta = stream::iter(
        meta.into_iter()
            .map(|(event_type, data)| encode(None, event_type, &data.to_string())),
    );
    respond(
        meta.chain(run_frames(events, Framing::Indexed, who)),
        options,
    )
}

/// An SSE response of exactly one frame (the busy answer of a streamed run).
pub fn single(event_type: &str, data: serde_json::Value, options: SseOptions) -> Response {
    respond(
        stream::iter([encode(None, event_type, &data.to_string())]),
        options,
    )
}
