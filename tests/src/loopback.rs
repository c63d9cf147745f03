//! An HTTP/1 server on a loopback port of its own, on a thread of its own: what the
//! fake model APIs and the OTLP receiver of the tests are built on. It stops when the
//! returned guard is dropped.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::{Request, Response};

/// A response body of any kind.
pub type Body = BoxBody<Bytes, Infallible>;

/// Stops the server when dropped.
pub struct Stop(#[allow(dead_code)] tokio::sync::oneshot::Sender<()>);

/// Serves `handle` on `127.0.0.1:0` from a thread named `name`; returns the address
/// and the guard that stops it.
pub fn serve<H, F>(name: &str, handle: H) -> (SocketAddr, Stop)
where
    H: Fn(Request<hyper::body::Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime for the loopback server");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind loopback");
                addr_tx
                    .send(listener.local_addr().expect("local addr"))
                    .expect("send the address");
                loop {
                    let accepted = tokio::select! {
                        accepted = listener.accept() => accepted,
                        _ = &mut stop_rx => return,
                    };
                    let Ok((stream, _)) = accepted else { continue };
                    let handle = handle.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            let handle = handle.clone();
                            async move { Ok::<_, Infallible>(handle(request).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        })
        .expect("the loopback server's thread");
    let addr = addr_rx.recv().expect("the loopback server's address");
    (addr, Stop(stop_tx))
}
