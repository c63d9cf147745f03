//! The `turnstile` binary's library: configuration, the HTTP gateway and the CLI.
//!
//! The gateway is thin: it parses requests, forwards commands to the runtime of
//! `turnstile-actors`, and renders what the runtime reads from the journal. It is the
//! only crate that names `axum`. It holds no run state of its own.

pub mod allocator;
pub mod api;
pub mod cli;
pub mod client;
pub mod config;
pub mod listen;
pub mod serve;
pub mod telemetry;
pub mod timeline;
pub mod wire;
