//! Server-sent event streams of run events.
//!
//! A frame is `id: <event_index>`, `event: <type>`, `data: <compact JSON>` (compact
//! JSON never holds a raw newline, so one `data:` line always suffices). Frames that
//! are ready together go out in one write: a replay of 10,000 events is a few dozen
//! writes, not 10,000. Streams send a keepalive comment when idle and end on the
//! terminal event, on a runtime fault (one `error` frame), or when the server shuts
//! down (an open stream would otherwise hold axum's graceful shutdown forever).

use std::convert::Infallible;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use turnstile_journal::limits::{SSE_CHUNK_BYTES, SSE_FRAMES_PER_WRITE_MAX};

use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, Stream, StreamExt, stream};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use turnstile_actors::{RunEvents, WireEvent};

use crate::wire::events::{self, Who};

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

/// What a stream sends: a run event (rendered into the write it goes out in) or a
/// frame of its own (meta, error).
enum Frame {
    Event(Arc<WireEvent>),
    Text(Vec<u8>),
}

/// One SSE frame without an `id` (meta and error frames, so they never move
/// `Last-Event-ID`).
fn text_frame(event_type: &str, data: &serde_json::Value) -> Frame {
    Frame::Text(format!("event: {event_type}\ndata: {data}\n\n").into_bytes())
}

/// A run event's frame, appended to `out`.
fn write_event(out: &mut Vec<u8>, event: &WireEvent, framing: Framing, who: &Who) {
    let index = event.event_index.0;
    let _ = write!(
        out,
        "id: {index}\nevent: {}\ndata: ",
        events::event_type(&event.event)
    );
    events::write(out, event, who, framing == Framing::Indexed);
    out.extend_from_slice(b"\n\n");
}

fn error_frame() -> Frame {
    text_frame(
        "error",
        &json!({"event": "error", "error": "stream failed"}),
    )
}

struct Pump {
    frames: Pin<Box<dyn Stream<Item = Frame> + Send>>,
    framing: Framing,
    who: Option<Who>,
    options: SseOptions,
    done: bool,
}

impl Pump {
    fn write(&self, frame: Frame, chunk: &mut Vec<u8>) {
        match (frame, &self.who) {
            (Frame::Event(event), Some(who)) => write_event(chunk, &event, self.framing, who),
            // Only `single` has no `who`, and it sends no run events.
            (Frame::Event(_), None) => {}
            (Frame::Text(text), _) if chunk.is_empty() => *chunk = text,
            (Frame::Text(text), _) => chunk.extend_from_slice(&text),
        }
    }
}

fn respond(
    frames: impl Stream<Item = Frame> + Send + 'static,
    framing: Framing,
    who: Option<Who>,
    options: SseOptions,
) -> Response {
    let pump = Pump {
        frames: Box::pin(frames),
        framing,
        who,
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
        let mut chunk = Vec::new();
        pump.write(first, &mut chunk);
        for _ in 1..SSE_FRAMES_PER_WRITE_MAX {
            if chunk.len() >= SSE_CHUNK_BYTES {
                break;
            }
            match pump.frames.next().now_or_never() {
                Some(Some(frame)) => {
                    // More frames are ready (a replay, a burst): room for a whole write
                    // at once, not a buffer doubled frame after frame. A live stream's
                    // lone frame keeps a buffer of its own size.
                    if chunk.capacity() < SSE_CHUNK_BYTES {
                        chunk.reserve(SSE_CHUNK_BYTES + SSE_CHUNK_BYTES / 8 - chunk.len());
                    }
                    pump.write(frame, &mut chunk);
                }
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

fn run_frames(events: RunEvents) -> impl Stream<Item = Frame> + Send {
    events.into_stream().map(|item| match item {
        Ok(event) => Frame::Event(event),
        Err(error) => {
            tracing::error!(%error, "run stream failed");
            error_frame()
        }
    })
}

/// A run's events as an SSE response.
pub fn run_stream(events: RunEvents, framing: Framing, who: Who, options: SseOptions) -> Response {
    respond(run_frames(events), framing, Some(who), options)
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
            .map(|(event_type, data)| text_frame(event_type, &data)),
    );
    respond(
        meta.chain(run_frames(events)),
        Framing::Indexed,
        Some(who),
        options,
    )
}

/// An SSE response of exactly one frame (the busy answer of a streamed run).
pub fn single(event_type: &str, data: serde_json::Value, options: SseOptions) -> Response {
    respond(
        stream::iter([text_frame(event_type, &data)]),
        Framing::Inline,
        None,
        options,
    )
}
