//! What every session actor of one runtime shares: the journal, the agents, the worker
//! slots, the live broadcasts of running runs, and the counters the metrics read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, broadcast};
use turnstile_journal::limits::RUN_BROADCAST_EVENTS;
use turnstile_journal::{Journal, RunId};

use crate::api::AgentSpec;
use crate::directory::Directory;
use crate::run::WireEvent;

/// What every actor of one runtime shares.
pub(crate) struct Shared {
    pub journal: Journal,
    pub agents: HashMap<String, AgentSpec>,
    /// Live channels of runs not yet ended, so streams can join without asking the actor.
    pub live_runs: Mutex<HashMap<RunId, broadcast::Sender<Arc<WireEvent>>>>,
    pub accepting: AtomicBool,
    /// Worker slots: runs executing at once.
    pub slots: Arc<Semaphore>,
    /// Runs accepted and not yet started, across sessions.
    pub queued: AtomicUsize,
    pub max_queued_runs: usize,
    /// How long an idle session actor stays in memory, in milliseconds (adjustable).
    pub session_idle_ms: AtomicU64,
    /// Runs started and ended since the runtime opened, by outcome.
    pub counters: RunCounters,
    /// Every session's listing facts and daily metrics.
    pub directory: Directory,
    /// The thread the long-lived writes are made on.
    pub keeper: crate::keeper::Keeper,
    /// The journal is shared with other replicas (PostgreSQL): sessions are leased.
    pub cluster: bool,
    /// [`RuntimeConfig::release_memory`](crate::RuntimeConfig).
    pub release_memory: Option<fn()>,
}

/// Runs started and ended since the runtime opened.
#[derive(Debug, Default)]
pub(crate) struct RunCounters {
    pub started: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
}

impl Shared {
    pub(crate) fn session_idle(&self) -> Duration {
        Duration::from_millis(self.session_idle_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn live_run(&self, run_id: &RunId) -> Option<broadcast::Receiver<Arc<WireEvent>>> {
        self.live_runs
            .lock()
            .ok()?
            .get(run_id)
            .map(broadcast::Sender::subscribe)
    }

    /// The run's live channel, created when missing.
    pub(super) fn ensure_live(&self, run_id: &RunId) -> broadcast::Sender<Arc<WireEvent>> {
        let mut runs = self
            .live_runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        runs.entry(run_id.clone())
            .or_insert_with(|| broadcast::channel(RUN_BROADCAST_EVENTS).0)
            .clone()
    }

    pub(super) fn remove_live(&self, run_id: &RunId) -> Option<broadcast::Sender<Arc<WireEvent>>> {
        self.live_runs.lock().ok()?.remove(run_id)
    }
}
