//! `journal export --url`: a running server's export streamed to the caller as a reader.

use crate::client::{Failure, Target, query};
use futures::StreamExt;
use serde_json::Value;

/// A running server's export (`GET /journal/export`) as a blocking reader, for the
/// audit commands; with the position it is as of.
pub struct Export {
    /// Records before this position are in it.
    pub as_of: u64,
    chunks: std::sync::mpsc::Receiver<Result<bytes::Bytes, String>>,
    current: bytes::Bytes,
}

impl std::io::Read for Export {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.recv() {
                Ok(Ok(chunk)) => self.current = chunk,
                Ok(Err(error)) => return Err(std::io::Error::other(error)),
                // The stream ended.
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

/// Starts downloading the export; a refusal is [`Failure::Refused`].
pub fn export(target: Target, session: Option<&str>) -> Result<Export, Failure> {
    let path = format!(
        "/journal/export{}",
        query(&[("session_id", session.map(str::to_owned))])
    );
    let (head, started) = std::sync::mpsc::sync_channel::<Result<u64, Failure>>(1);
    let (chunks, received) = std::sync::mpsc::sync_channel(4);
    std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                let _ = head.send(Err(Failure::Unreachable(error.into())));
                return;
            }
        };
        runtime.block_on(async move {
            let response = match target
                .send(target.request(reqwest::Method::GET, &path))
                .await
            {
                Ok(response) => response,
                Err(error) => {
                    let _ = head.send(Err(Failure::Unreachable(error)));
                    return;
                }
            };
            let status = response.status();
            if !status.is_success() {
                let body: Value = response.json().await.unwrap_or(Value::Null);
                let _ = head.send(Err(Failure::Refused(target.refusal(status, &body))));
                return;
            }
            let as_of = response
                .headers()
                .get(crate::wire::AS_OF_HEADER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse().ok())
                .unwrap_or(0);
            let _ = head.send(Ok(as_of));
            let mut stream = response.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|error| format!("the export broke off: {error}"));
                let failed = chunk.is_err();
                if chunks.send(chunk).is_err() || failed {
                    return;
                }
            }
        });
    });
    let as_of = started
        .recv()
        .map_err(|_| Failure::Unreachable(anyhow::anyhow!("the download stopped")))??;
    Ok(Export {
        as_of,
        chunks: received,
        current: bytes::Bytes::new(),
    })
}
