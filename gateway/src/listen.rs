//! The HTTP/1 server loop under the router: a bound on connections and the timeouts a
//! public server needs, none of which `axum::serve` offers.
//!
//! A connection must send a request's headers within `header_timeout` (from its accept,
//! or from the first byte of a later request), and an idle keep-alive connection is
//! closed after `idle_timeout`; a request in flight (a long turn, a stream) is never
//! timed out here (its body has a deadline of its own, in the handlers). Beyond
//! `max_connections` new connections wait in the kernel's backlog: never an accept
//! error from a full descriptor table. Shutdown stops accepting, lets each connection
//! finish its request, and waits a bounded time.

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
    let connections = TaskTracker::new();
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = shutdown.cancelled() => break,
        };
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
        // Without TCP_NODELAY an SSE stream stalls ~40 ms per frame on Nagle + delayed ACK.
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let app = app.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            connection(tcp, app, options, shutdown).await;
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

async fn connection(
    tcp: TcpStream,
    app: Router,
    options: ListenOptions,
    shutdown: CancellationToken,
) {
    let now = Instant::now();
    let activity: Shared = Arc::new(Mutex::new(Activity {
        in_flight: 0,
        waiting_since: Some(now),
        last: now,
    }));
    let io = TokioIo::new(Watched {
        inner: tcp,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            {
                let mut state = lock(&activity);
                state.in_flight += 1;
                state.waiting_since = None;
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
            () = shutdown.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
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

/// The socket, noting when bytes move.
struct Watched {
    inner: TcpStream,
    activity: Shared,
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
            if state.in_flight == 0 && state.waiting_since.is_none() {
                state.waiting_since = Some(state.last);
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
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            lock(&self.activity).last = Instant::now();
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
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
