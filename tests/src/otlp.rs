//! An OTLP HTTP receiver on loopback that keeps the JSON trace exports it is sent,
//! for the telemetry tests and benchmark.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use serde_json::Value;

/// Collects the JSON bodies posted to `/v1/traces`.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    /// Starts it on a port of its own, on a thread of its own.
    pub fn start() -> Receiver {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = bodies.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let kept = kept.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(
                            move |request: Request<hyper::body::Incoming>| {
                                let kept = kept.clone();
                                async move {
                                    let path = request.uri().path().to_owned();
                                    let bytes =
                                        request.into_body().collect().await.unwrap().to_bytes();
                                    if path == "/v1/traces" {
                                        kept.lock().unwrap().push(
                                            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                                        );
                                    }
                                    Ok::<_, Infallible>(Response::new(Full::new(
                                        bytes::Bytes::from_static(b"{}"),
                                    )))
                                }
                            },
                        );
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        Receiver {
            addr: rx.recv().unwrap(),
            bodies,
        }
    }

    /// Every span received, with its resource's attributes.
    pub fn spans(&self) -> Vec<Value> {
        let mut spans = Vec::new();
        for body in self.bodies.lock().unwrap().iter() {
            for resource in body["resourceSpans"].as_array().into_iter().flatten() {
                for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                    for span in scope["spans"].as_array().into_iter().flatten() {
                        let mut span = span.clone();
                        span["resource"] = resource["resource"].clone();
                        spans.push(span);
                    }
                }
            }
        }
        spans
    }
}
