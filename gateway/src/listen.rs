//! The HTTP/1 server loop under the router: a bound on connections and the timeouts a
//! public server needs, none of which `axum::serve` offers.
//!
//! A connection must send a request's headers within `header_timeout` (from its accept,
//! or from the first byte of a later request), and an idle keep-alive connection is
//! closed after `idle_timeout`; a request in flight (a long turn, a stream) is never
//! timed out here (its body has a deadline of its own, in the handlers). At
//! `max_connections` a new connection is still accepted, and the oldest connection
//! that has not sent a complete request line (silent since its accept, or idle between
//! requests) is closed to make room for it; when every connection is in the middle of a
//! request, it waits for one to end, and the next ones wait in the kernel's backlog:
//! never an accept error from a full descriptor table (`max_connections` stays under
//! the descriptor limit). Shutdown stops accepting, lets each connection finish its
//! request, and waits a bounded time.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;
use turnstile_journal::limits::{CONNECTION_WATCH_MS, SHUTDOWN_CONNECTIONS_WAIT_MS};

/// The connection bounds (`[server]` of the configuration).
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    /// A request's headers must arrive within this.
    pub header_timeout: Duration,
    /// An idle keep-alive connection is closed after this.
    pub idle_timeout: Duration,
    /// Connections served at once, at most.
    pub max_connections: usize,
}

/// What one connection has been doing, for its deadlines.
struct Activity {
    /// Requests whose response is not finished (its body not dropped).
    in_flight: usize,
    /// Bytes of a request arrived (or the connection opened) and its headers are not
    /// complete yet.
    waiting_since: Option<Instant>,
    last: Instant,
    /// A line of the next request (its request line) has arrived.
    line_seen: bool,
}

impl Activity {
    /// Since when the connection has done nothing a full server should keep it for:
    /// `None` when it is in a request or has sent a request line.
    fn sheddable_since(&self) -> Option<Instant> {
        (self.in_flight == 0 && !self.line_seen).then(|| self.waiting_since.unwrap_or(self.last))
    }
}

/// The open connections, so that a full server can close the oldest silent one.
#[derive(Default)]
struct Open {
    next: u64,
    connections: HashMap<u64, (Shared, CancellationToken)>,
}

impl Open {
    fn add(&mut self, activity: Shared, shed: CancellationToken) -> u64 {
        self.next += 1;
        self.connections.insert(self.next, (activity, shed));
        self.next
    }

    /// Closes the connection that has been silent the longest; false when none is.
    fn shed_oldest(&mut self) -> bool {
        let oldest = self
            .connections
            .iter()
            .filter(|(_, (_, shed))| !shed.is_cancelled())
            .filter_map(|(id, (activity, _))| Some((lock(activity).sheddable_since()?, *id)))
            .min();
        match oldest.and_then(|(_, id)| self.connections.get(&id)) {
            Some((_, shed)) => {
                shed.cancel();
                true
            }
            None => false,
        }
    }
}

fn lock_open(open: &Mutex<Open>) -> std::sync::MutexGuard<'_, Open> {
    open.lock().unwrap_or_else(|e| e.into_inner())
}

type Shared = Arc<Mutex<Activity>>;

fn lock(activity: &Shared) -> std::sync::MutexGuard<'_, Activity> {
    activity.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves `app` on `listener` until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: ListenOptions,
    shutdown: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let open = Arc::new(Mutex::new(Open::default()));
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(error) => {
                // Out of descriptors or a connection reset before accept: wait, go on.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                // Full: make room by closing the oldest silent connection, if any;
                // otherwise this one waits for a connection to end.
                if lock_open(&open).shed_oldest() {
                    tracing::debug!("at max_connections: closed the oldest silent connection");
                }
                tokio::select! {
                    permit = permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                    () = shutdown.cancelled() => break,
                }
            }
        };
        // Without TCP_NODELAY an SSE stream stalls ~40 ms per frame on Nagle + delayed ACK.
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let app = app.clone();
        let shutdown = shutdown.clone();
        let now = Instant::now();
        let activity: Shared = Arc::new(Mutex::new(Activity {
            in_flight: 0,
            waiting_since: Some(now),
            last: now,
            line_seen: false,
        }));
        let shed = CancellationToken::new();
        let id = lock_open(&open).add(activity.clone(), shed.clone());
        let open = open.clone();
        connections.spawn(async move {
            let ends = Ends { shutdown, shed };
            connection(tcp, app, options, activity, ends).await;
            lock_open(&open).connections.remove(&id);
            drop(permit);
        });
    }
    connections.close();
    if tokio::time::timeout(
        Duration::from_millis(SHUTDOWN_CONNECTIONS_WAIT_MS),
        connections.wait(),
    )
    .await
    .is_err()
    {
        tracing::warn!("connections still open at shutdown are closed");
    }
}

/// What ends a connection early: the server's shutdown (gracefully), or its being
/// shed to make room (at once).
struct Ends {
    shutdown: CancellationToken,
    shed: CancellationToken,
}

async fn connection(
    tcp: TcpStream,
    app: Router,
    options: ListenOptions,
    activity: Shared,
    ends: Ends,
) {
    let io = TokioIo::new(Watched {
        inner: tcp,
        activity: activity.clone(),
        refusal: None,
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            {
                let mut state = lock(&activity);
                state.in_flight += 1;
                state.waiting_since = None;
                state.line_seen = false;
            }
            let guard = InFlight(activity.clone());
            let app = app.clone();
            async move {
                let response = app
                    .oneshot(request.map(Body::new))
                    .await
                    .unwrap_or_else(|never: Infallible| match never {});
                Ok::<_, Infallible>(response.map(|body| Tracked {
                    body,
                    _guard: guard,
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.keep_alive(true).header_read_timeout(None);
    let conn = builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut watch = tokio::time::interval(Duration::from_millis(CONNECTION_WATCH_MS));
    let mut closing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended");
                }
                return;
            }
            () = ends.shutdown.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            () = ends.shed.cancelled() => {
                // Shed while silent: nothing of a request to answer; dropping closes.
                return;
            }
            _ = watch.tick() => {
                let state = lock(&activity);
                let expired = state.in_flight == 0
                    && match state.waiting_since {
                        Some(since) => since.elapsed() > options.header_timeout,
                        None => state.last.elapsed() > options.idle_timeout,
                    };
                if expired {
                    // Dropping the connection closes the socket.
                    return;
                }
            }
        }
    }
}

/// Counts a request in flight until its response body is dropped.
struct InFlight(Shared);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = lock(&self.0);
        state.in_flight = state.in_flight.saturating_sub(1);
        state.last = Instant::now();
    }
}

/// A response body that keeps its request counted in flight.
struct Tracked {
    body: Body,
    _guard: InFlight,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The socket, noting when bytes move, and putting a JSON answer in place of the
/// empty one hyper writes itself for a request it cannot parse.
struct Watched {
    inner: TcpStream,
    activity: Shared,
    /// Our answer to an unparsable request, and how much of it is written; hyper's own
    /// bytes are swallowed from then on (it closes the connection after them).
    refusal: Option<(Vec<u8>, usize)>,
}

/// What a protocol-level refusal says, as JSON with `detail` like every other error.
fn refusal(status_line: &[u8]) -> Vec<u8> {
    let code = status_line.get(9..12).unwrap_or(b"400");
    let (status, error_type, detail) = match code {
        b"414" => (
            "414 URI Too Long",
            "uri_too_long",
            "the request's target (its path and query) is too long",
        ),
        b"431" => (
            "431 Request Header Fields Too Large",
            "headers_too_large",
            "the request's headers are too many or too large",
        ),
        _ => (
            "400 Bad Request",
            "bad_request",
            "malformed HTTP/1.1 request: its request line or headers do not parse (or repeat Content-Length with different values)",
        ),
    };
    let body = serde_json::json!({ "detail": detail, "error_type": error_type }).to_string();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

impl Watched {
    /// Whether `first` (the start of a write) is hyper's own answer to a request it
    /// could not parse: a 400, 414 or 431 status line without a content type (every
    /// answer of ours has one), written while bytes of a request have arrived and no
    /// request has reached the router since (a small answer of ours is written after
    /// its body is dropped, so "in flight" alone cannot tell).
    fn is_hypers_refusal(&self, first: &[u8]) -> bool {
        let status = first.get(..13);
        let refusal = [&b"HTTP/1.1 400 "[..], b"HTTP/1.1 414 ", b"HTTP/1.1 431 "];
        if !status.is_some_and(|status| refusal.contains(&status)) {
            return false;
        }
        let typed = first
            .windows(b"content-type:".len())
            .any(|window| window.eq_ignore_ascii_case(b"content-type:"));
        let state = lock(&self.activity);
        !typed && state.in_flight == 0 && state.waiting_since.is_some()
    }

    /// Writes what is left of our refusal; ready when all of it is written.
    fn poll_refusal(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let Some((bytes, written)) = self.refusal.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        while *written < bytes.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Takes hyper's `len` bytes in place of our refusal (begun when `first` is its
    /// status line); `None` when the write is an ordinary one.
    fn swallow(
        &mut self,
        cx: &mut Context<'_>,
        first: &[u8],
        len: usize,
    ) -> Option<Poll<std::io::Result<usize>>> {
        if self.refusal.is_none() {
            if !self.is_hypers_refusal(first) {
                return None;
            }
            self.refusal = Some((refusal(first), 0));
        }
        Some(match self.poll_refusal(cx) {
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            // The rest is written by the flush and shutdown that follow.
            _ => Poll::Ready(Ok(len)),
        })
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let mut state = lock(&self.activity);
            state.last = Instant::now();
            if state.in_flight == 0 {
                if state.waiting_since.is_none() {
                    state.waiting_since = Some(state.last);
                }
                // Only a request's head is looked at, never a body read in flight.
                if !state.line_seen {
                    state.line_seen = buf.filled()[before..].contains(&b'\n');
                }
            }
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(swallowed) = self.swallow(cx, buf, buf.len()) {
            return swallowed;
        }
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            lock(&self.activity).last = Instant::now();
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.poll_refusal(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        std::task::ready!(self.poll_refusal(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let first = bufs
            .iter()
            .find(|buf| !buf.is_empty())
            .map_or(&[][..], |buf| &buf[..]);
        let len = bufs.iter().map(|buf| buf.len()).sum();
        if let Some(swallowed) = self.swallow(cx, first, len) {
            return swallowed;
        }
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            lock(&self.activity).last = Instant::now();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
