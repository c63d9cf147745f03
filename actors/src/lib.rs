//! The session actors and the embedding API ([`Runtime`]).
//!
//! Every session is one actix actor that takes one turn at a time; a registry actor
//! creates session actors on a pool of arbiters and finds them again. The actix
//! system runs on its own OS thread, so a caller only ever holds a [`Runtime`]: no
//! actix type crosses this crate's boundary. Every event is appended to the journal
//! before anyone sees it; streams read the same events back by index.
//!
//! This crate does not speak HTTP and does not parse configuration files.

mod api;
pub mod directory;
pub mod history;
mod keeper;
mod lifecycle;
mod memory;
mod reads;
mod registry;
mod run;
mod runtime;
mod session;
mod stream;
pub mod uploads;
pub mod workspace;

pub use api::{
    AgentSpec, ApprovalPolicy, CompactOutcome, ContinueFrom, ContinueRun, DecideRun, Multitask,
    Refused, RuntimeConfig, RuntimeCounters, RuntimeError, StartRun, Workspace,
};
pub use run::{RetryPolicy, WireEvent};
pub use runtime::{FileContent, RunHandle, Runtime};
pub use stream::RunEvents;
pub use turnstile_journal::{ModelMetrics, RunMetrics, RunOptions};
