//! What every session actor of one runtime shares: the journal, the agents, the worker
//! slots, the live broadcasts of running runs, and the counters the metrics read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{Semaphore, broadcast};
use turnstile_journal::limits::RUN_BROADCAST_EVENTS;
use turnstile_journal::{Journal, RunId};

use crate::api::AgentSpec;
use crate::directory::Directory;
use crate::run::WireEvent;
use turnstile_projections::RunView;

/// What every actor of one runtime shares.
pub(crate) struct Shared {
    pub journal: Journal,
    pub agents: HashMap<String, AgentSpec>,
    /// Live channels of runs not yet ended, so streams can join without asking the actor.
    pub live_runs: Mutex<HashMap<RunId, Live>>,
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

/// A run's live channel, and where its session's actor leaves the run's final view
/// when it journals the run's end, for the caller that accepted the run and waits for
/// its outcome (so that the answer is not read back from the journal).
#[derive(Clone)]
pub(crate) struct Live {
    pub events: broadcast::Sender<Arc<WireEvent>>,
    pub ended: Arc<OnceLock<RunView>>,
}

impl Live {
    /// A subscription to the channel (what is sent from now on) and the view's slot.
    pub(crate) fn watch(&self) -> Watch {
        Watch {
            events: self.events.subscribe(),
            ended: self.ended.clone(),
        }
    }
}

/// A caller's side of a run's [`Live`].
pub(crate) struct Watch {
    pub events: broadcast::Receiver<Arc<WireEvent>>,
    pub ended: Arc<OnceLock<RunView>>,
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
            .map(|live| live.events.subscribe())
    }

    /// The run's live channel, created when missing.
    pub(super) fn ensure_live(&self, run_id: &RunId) -> Live {
        let mut runs = self
            .live_runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        runs.entry(run_id.clone())
            .or_insert_with(|| Live {
                events: broadcast::channel(RUN_BROADCAST_EVENTS).0,
                ended: Arc::default(),
            })
            .clone()
    }

    pub(super) fn remove_live(&self, run_id: &RunId) -> Option<Live> {
        self.live_runs.lock().ok()?.remove(run_id)
    }
}
