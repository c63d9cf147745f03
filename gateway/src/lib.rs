//! The `turnstile` binary's library: configuration, the HTTP gateway and the CLI.
//!
//! The gateway parses requests, forwards commands to the runtime of `turnstile-actors`,
//! and renders what the runtime reads from the journal in agno's JSON. It is the only
//! crate that names `axum`. It keeps no run state that the journal does not have: the
//! telemetry's open runs are a projection of the journal's live feed.

pub mod allocator;
pub mod api;
pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod listen;
pub mod serve;
pub mod telemetry;
pub mod timeline;
pub mod wire;
