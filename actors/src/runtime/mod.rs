//! The embedding API: open a runtime, start runs, stream and await them, shut down.
//!
//! [`Runtime`] owns the journal and the actix system (on its own OS thread with a pool
//! of arbiters). Its async methods run their actor round trips in a detached tokio
//! task, so a caller that gives up (an HTTP client that disconnects) never cancels a
//! command half-way: a dropped `Addr::send` future would cancel the message.
//!
//! This file opens and stops a runtime; `commands` has the commands, `views` the reads,
//! `cluster` what a replica does on a shared journal.

use crate::api::{AgentSpec, RuntimeConfig, RuntimeCounters, RuntimeError};
use actix::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use turnstile_journal::limits::SHUTDOWN_DRAIN_MS;
use turnstile_journal::{Journal, JournalOptions, RunId, SessionId};
use turnstile_projections::RunView;

use crate::registry::{CountSessions, Registry, WakeSession};
use crate::session::Shared;
use crate::stream::RunEvents;

mod cluster;
mod commands;
mod files;
mod following;

pub use files::FileContent;
mod replica;
mod views;

struct Inner {
    shared: Arc<Shared>,
    registry: Addr<Registry>,
    system: System,
    thread: Mutex<Option<JoinHandle<()>>>,
    agents: Vec<AgentSpec>,
    /// Serializes submissions that carry an idempotency key (check, then bind).
    idempotent: tokio::sync::Mutex<()>,
    /// Runs left open by the last stop, found at open.
    recovering: usize,
}

/// The embedding API; cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

/// A started run: its ids and its event stream.
pub struct RunHandle {
    /// The run.
    pub run_id: RunId,
    /// Its session.
    pub session_id: SessionId,
    /// An earlier run returned for a repeated idempotency key.
    pub reused: bool,
    events: RunEvents,
    /// Where the session's actor leaves the run's final view, when this process
    /// accepted the run (else the view is read from the journal).
    ended: Option<Arc<std::sync::OnceLock<RunView>>>,
    runtime: Runtime,
}

impl RunHandle {
    /// The run's events, from index 0, ending with the terminal one.
    pub fn events(&mut self) -> &mut RunEvents {
        &mut self.events
    }

    /// Gives up the handle for its events.
    pub fn into_events(self) -> RunEvents {
        self.events
    }

    /// Waits for the run to end and returns its final view.
    pub async fn outcome(mut self) -> Result<RunView, RuntimeError> {
        while let Some(event) = self.events.next().await {
            event?;
        }
        // Left by the actor before it sent the end this stream saw: the view the run's
        // stored form got, without reading it back.
        if let Some(view) = self.ended.as_ref().and_then(|ended| ended.get()) {
            return Ok(view.clone());
        }
        self.runtime
            .run_view(&self.run_id)?
            .ok_or_else(|| RuntimeError::Internal(format!("run {} vanished", self.run_id)))
    }
}

impl Runtime {
    /// Opens the journal (in `config.data_dir`, or the PostgreSQL one configured) and
    /// starts the actor system. Sessions with runs left open by an earlier process wake
    /// at once and resolve them.
    pub fn open(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let options = JournalOptions {
            max_event_bytes: config.max_event_bytes,
            ..JournalOptions::default()
        };
        let journal = Journal::open_config(&config.journal, options)?;
        let cluster = journal.is_shared();
        // On a shared journal the open runs of sessions other live replicas hold are
        // theirs: this replica takes only what is claimable, through its dispatcher.
        let open_runs = if cluster {
            Vec::new()
        } else {
            journal.open_runs()?
        };
        let recovering = open_runs.len();
        // Where the directory follows the other replicas from: taken before it loads, so
        // a record appended elsewhere meanwhile is followed (read twice at worst), never
        // missed.
        let followed_from = journal.next_pos();
        let directory = crate::directory::Directory::load(&journal)?;
        let shared = Arc::new(shared_of(&config, journal, directory, cluster));
        let arbiter_count = config.arbiters.max(1);
        let (sender, receiver) = std::sync::mpsc::channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("turnstile-actors".into())
            .spawn(move || {
                let system = System::new();
                let arbiters: Vec<Arbiter> = (0..arbiter_count).map(|_| Arbiter::new()).collect();
                let handles = arbiters.iter().map(Arbiter::handle).collect();
                system.block_on(async move {
                    let registry = Registry::new(thread_shared, handles).start();
                    let _ = sender.send((System::current(), registry));
                });
                if let Err(error) = system.run() {
                    tracing::error!(%error, "actor system stopped with an error");
                }
                for arbiter in arbiters {
                    arbiter.stop();
                    let _ = arbiter.join();
                }
            })
            .map_err(RuntimeError::Spawn)?;
        let (system, registry) = receiver.recv().map_err(|_| RuntimeError::Stopped)?;
        // No ghost runs: every session with a run left open wakes now and resolves it.
        let mut sessions: Vec<SessionId> = open_runs
            .into_iter()
            .map(|(_, session_id)| session_id)
            .collect();
        sessions.sort();
        sessions.dedup();
        for session_id in sessions {
            registry.do_send(WakeSession(session_id));
        }
        let runtime = Runtime {
            inner: Arc::new(Inner {
                shared,
                registry,
                system,
                thread: Mutex::new(Some(thread)),
                agents: config.agents,
                idempotent: tokio::sync::Mutex::new(()),
                recovering,
            }),
        };
        if cluster {
            runtime.start_cluster_duties(followed_from)?;
        }
        Ok(runtime)
    }

    /// Runs a stop left open (queued or in flight) that recovery resolves: each is queued
    /// again, resumed with a new attempt, or ended, as its session wakes at open.
    pub fn runs_recovering(&self) -> usize {
        self.inner.recovering
    }

    /// The journal (for reads, verification and audits).
    pub fn journal(&self) -> &Journal {
        &self.inner.shared.journal
    }

    /// The configured agents, in configuration order.
    pub fn agents(&self) -> &[AgentSpec] {
        &self.inner.agents
    }

    /// An agent by id.
    pub fn agent(&self, agent_id: &str) -> Option<&AgentSpec> {
        self.inner.agents.iter().find(|agent| agent.id == agent_id)
    }

    /// Changes how long idle session actors stay in memory; actors check within 5 s.
    pub fn set_session_idle(&self, idle: Duration) {
        let ms = idle.as_millis().min(u128::from(u64::MAX)) as u64;
        self.inner
            .shared
            .session_idle_ms
            .store(ms, Ordering::Relaxed);
    }

    /// Session actors in memory (the rest are passivated).
    pub async fn sessions_in_memory(&self) -> Result<usize, RuntimeError> {
        let registry = self.inner.registry.clone();
        tokio::spawn(async move { Ok(registry.send(CountSessions).await?) })
            .await
            .map_err(RuntimeError::from)?
    }

    /// Run counters since the runtime opened, and the queue's depth now.
    pub fn counters(&self) -> RuntimeCounters {
        let counters = &self.inner.shared.counters;
        RuntimeCounters {
            runs_started: counters.started.load(Ordering::Relaxed),
            runs_completed: counters.completed.load(Ordering::Relaxed),
            runs_failed: counters.failed.load(Ordering::Relaxed),
            runs_cancelled: counters.cancelled.load(Ordering::Relaxed),
            runs_queued: self.inner.shared.queued.load(Ordering::Relaxed) as u64,
        }
    }

    /// Runs accepted and not yet ended in this process (queued or running).
    pub fn runs_in_flight(&self) -> usize {
        self.inner
            .shared
            .live_runs
            .lock()
            .map(|runs| runs.len())
            .unwrap_or(0)
    }

    /// Stops accepting runs, waits a bounded time for runs in flight to end, stops
    /// the actors and closes the journal. Runs still open are resolved by the next
    /// start from the journal.
    pub async fn shutdown(&self) -> Result<(), RuntimeError> {
        self.stop(Duration::from_millis(SHUTDOWN_DRAIN_MS)).await
    }

    /// Stops at once, as a crash would, without waiting for the runs in flight: the
    /// actors stop and the journal closes. Runs still open are resolved by the next
    /// start from the journal (the fault search stops a runtime so).
    pub async fn halt(&self) -> Result<(), RuntimeError> {
        self.stop(Duration::ZERO).await
    }

    async fn stop(&self, drain: Duration) -> Result<(), RuntimeError> {
        self.inner.shared.accepting.store(false, Ordering::SeqCst);
        let deadline = Instant::now() + drain;
        while self.runs_in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let abandoned = self.runs_in_flight();
        if abandoned > 0 {
            tracing::warn!(
                runs = abandoned,
                "runs still open at shutdown: at the next start a queued one runs, a running one resumes with a new attempt if it has one left, else it ends ERROR (process_stopped)"
            );
        }
        self.inner.system.stop();
        for agent in self.inner.shared.agents.values() {
            agent.harness.shutdown();
        }
        let thread = self
            .inner
            .thread
            .lock()
            .ok()
            .and_then(|mut thread| thread.take());
        if let Some(thread) = thread {
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .map_err(RuntimeError::from)?
                .map_err(|_| RuntimeError::Internal("actor thread panicked".into()))?;
        }
        self.journal().close()?;
        Ok(())
    }
}

/// What every actor of a runtime opened with `config` shares.
fn shared_of(
    config: &RuntimeConfig,
    journal: Journal,
    directory: crate::directory::Directory,
    cluster: bool,
) -> Shared {
    Shared {
        directory,
        keeper: crate::keeper::Keeper::start(),
        journal,
        agents: config
            .agents
            .iter()
            .map(|agent| (agent.id.clone(), agent.clone()))
            .collect(),
        live_runs: Mutex::new(HashMap::new()),
        accepting: AtomicBool::new(true),
        slots: Arc::new(tokio::sync::Semaphore::new(
            config.max_concurrent_runs.max(1),
        )),
        queued: AtomicUsize::new(0),
        max_queued_runs: config.max_queued_runs,
        counters: Default::default(),
        session_idle_ms: AtomicU64::new(
            config.session_idle.as_millis().min(u128::from(u64::MAX)) as u64
        ),
        cluster,
        release_memory: config.release_memory,
    }
}
