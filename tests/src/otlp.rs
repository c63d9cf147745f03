//! An OTLP HTTP receiver on loopback that keeps the JSON trace exports it is sent,
//! for the telemetry tests and benchmark.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::Response;
use serde_json::Value;

/// Collects the JSON bodies posted to `/v1/traces`.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Value>>>,
    _stop: crate::loopback::Stop,
}

impl Receiver {
    /// Starts it on a port of its own, on a thread of its own.
    pub fn start() -> Receiver {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let (addr, stop) = crate::loopback::serve("otlp-receiver", move |request| {
            let kept = kept.clone();
            async move {
                let path = request.uri().path().to_owned();
                let bytes = request
                    .into_body()
                    .collect()
                    .await
                    .unwrap_or_default()
                    .to_bytes();
                if path == "/v1/traces" {
                    kept.lock()
                        .unwrap()
                        .push(serde_json::from_slice(&bytes).unwrap_or(Value::Null));
                }
                Response::new(Full::new(bytes::Bytes::from_static(b"{}")).boxed())
            }
        });
        Receiver {
            addr,
            bodies,
            _stop: stop,
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
