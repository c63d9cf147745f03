//! The embedding API: open a runtime, start runs, stream and await them, shut down.
//!
//! [`Runtime`] owns the journal and the actix system (on its own OS thread with a pool
//! of arbiters). Its async methods run their actor round trips in a detached tokio
//! task, so a caller that gives up (an HTTP client that disconnects) never cancels a
//! command half-way: a dropped `Addr::send` future would cancel the message.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::prelude::*;
use turnstile_harness::Harness;
use turnstile_journal::limits::SHUTDOWN_DRAIN_MS;
use turnstile_journal::{EventIndex, Journal, JournalOptions, RunId, Seq, SessionId};
use turnstile_projections::{RunView, SessionState};

use crate::registry::{GetSession, Registry};
use crate::session::{CancelRunMsg, Shared, StartRunMsg};
use crate::stream::RunEvents;

/// One configured agent: an id, a display name and the harness that runs its turns.
#[derive(Clone)]
pub struct AgentSpec {
    /// Agent id (URL component).
    pub id: String,
    /// Display name.
    pub name: String,
    /// Description for listings.
    pub description: String,
    /// The harness.
    pub harness: Arc<dyn Harness>,
}

/// How to open a runtime.
pub struct RuntimeConfig {
    /// The data directory (sled journal).
    pub data_dir: PathBuf,
    /// Arbiter threads that host session actors.
    pub arbiters: usize,
    /// The agents.
    pub agents: Vec<AgentSpec>,
}

/// A turn to start.
#[derive(Debug, Clone)]
pub struct StartRun {
    /// Agent.
    pub agent_id: String,
    /// Session; a new one when `None`.
    pub session_id: Option<SessionId>,
    /// The client's user id.
    pub user_id: Option<String>,
    /// The message.
    pub message: String,
    /// Run options, recorded with the run (JSON object).
    pub options: serde_json::Value,
}

/// A start refused for a reason the caller can act on: an expected outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No such agent.
    #[error("Agent {agent_id} not found")]
    UnknownAgent {
        /// The id asked for.
        agent_id: String,
    },
    /// The session has a run in flight.
    #[error(
        "Session {session_id} already has run {run_id} in flight. A session takes one turn at a time: wait for that run to finish, or cancel it, then send the turn again."
    )]
    Busy {
        /// The session.
        session_id: SessionId,
        /// The run in flight.
        run_id: RunId,
    },
    /// The session belongs to another agent.
    #[error("Session {session_id} belongs to agent {agent_id}")]
    AgentMismatch {
        /// The session.
        session_id: SessionId,
        /// Its agent.
        agent_id: String,
    },
    /// The runtime is shutting down.
    #[error("turnstile is shutting down")]
    ShuttingDown,
}

/// A fault of the runtime (not the caller's doing).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] turnstile_journal::Error),
    /// The actor system is gone.
    #[error("the runtime has stopped")]
    Stopped,
    /// Anything else that should not happen.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<MailboxError> for RuntimeError {
    fn from(_: MailboxError) -> Self {
        RuntimeError::Stopped
    }
}

struct Inner {
    shared: Arc<Shared>,
    registry: Addr<Registry>,
    system: System,
    thread: Mutex<Option<JoinHandle<()>>>,
    agents: Vec<AgentSpec>,
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
    events: RunEvents,
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
        self.runtime
            .run_view(&self.run_id)?
            .ok_or_else(|| RuntimeError::Internal(format!("run {} vanished", self.run_id)))
    }
}

impl Runtime {
    /// Opens the journal in `config.data_dir` and starts the actor system.
    /// Must be called inside a tokio runtime only if the caller later awaits on it;
    /// opening itself is synchronous.
    pub fn open(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let journal = Journal::open(&config.data_dir, JournalOptions::default())?;
        let shared = Arc::new(Shared {
            journal,
            agents: config
                .agents
                .iter()
                .map(|agent| (agent.id.clone(), agent.clone()))
                .collect(),
            live_runs: Mutex::new(HashMap::new()),
            accepting: AtomicBool::new(true),
        });
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
            .map_err(|error| RuntimeError::Internal(error.to_string()))?;
        let (system, registry) = receiver.recv().map_err(|_| RuntimeError::Stopped)?;
        Ok(Runtime {
            inner: Arc::new(Inner {
                shared,
                registry,
                system,
                thread: Mutex::new(Some(thread)),
                agents: config.agents,
            }),
        })
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

    /// Starts a run. Returns once the run is in the journal; refuses at once when the
    /// session has a run in flight.
    pub async fn start_run(
        &self,
        command: StartRun,
    ) -> Result<Result<RunHandle, Refused>, RuntimeError> {
        if !self.inner.shared.accepting.load(Ordering::SeqCst) {
            return Ok(Err(Refused::ShuttingDown));
        }
        if self.agent(&command.agent_id).is_none() {
            return Ok(Err(Refused::UnknownAgent {
                agent_id: command.agent_id,
            }));
        }
        let session_id = command.session_id.clone().unwrap_or_else(SessionId::new_v7);
        let inner = self.inner.clone();
        let target = session_id.clone();
        let started = tokio::spawn(async move {
            let session = inner.registry.send(GetSession(target)).await?;
            session.send(StartRunMsg(command)).await?
        })
        .await
        .map_err(|error| RuntimeError::Internal(error.to_string()))??;
        Ok(started.map(|started| RunHandle {
            events: RunEvents::new(
                self.journal().clone(),
                session_id.clone(),
                started.run_id.clone(),
                started.from_seq,
                Some(started.live),
                EventIndex(0),
            ),
            run_id: started.run_id,
            session_id,
            runtime: self.clone(),
        }))
    }

    /// A session's state, folded from its journal stream.
    pub fn session_state(
        &self,
        session_id: &SessionId,
    ) -> Result<Option<SessionState>, RuntimeError> {
        let mut state = SessionState::new(session_id.clone());
        for record in self.journal().read_session(session_id, Seq(0)) {
            state.apply(&record?);
        }
        Ok(state.exists().then_some(state))
    }

    /// A run's view, folded from its session's journal stream.
    pub fn run_view(&self, run_id: &RunId) -> Result<Option<RunView>, RuntimeError> {
        let Some(session_id) = self.journal().session_of_run(run_id)? else {
            return Ok(None);
        };
        Ok(self
            .session_state(&session_id)?
            .and_then(|state| state.run(run_id).cloned()))
    }

    /// A run's events after `after` (all of them when `None`): live until its end for
    /// a run in flight, read from the journal for a finished one.
    pub fn run_events(
        &self,
        run_id: &RunId,
        after: Option<EventIndex>,
    ) -> Result<Option<RunEvents>, RuntimeError> {
        let live = self.inner.shared.live_run(run_id);
        let Some(view) = self.run_view(run_id)? else {
            return Ok(None);
        };
        let from = after.map(EventIndex::next).unwrap_or_default();
        Ok(Some(RunEvents::new(
            self.journal().clone(),
            view.session_id,
            view.run_id,
            view.queued_seq,
            live,
            from,
        )))
    }

    /// Asks the run's session to cancel it; `true` when a run in flight was signalled.
    pub async fn cancel_run(&self, run_id: &RunId) -> Result<bool, RuntimeError> {
        let Some(session_id) = self.journal().session_of_run(run_id)? else {
            return Ok(false);
        };
        let inner = self.inner.clone();
        let run_id = run_id.clone();
        tokio::spawn(async move {
            let session = inner.registry.send(GetSession(session_id)).await?;
            Ok(session.send(CancelRunMsg(run_id)).await?)
        })
        .await
        .map_err(|error| RuntimeError::Internal(error.to_string()))?
    }

    /// Runs in flight in this process.
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
        self.inner.shared.accepting.store(false, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_millis(SHUTDOWN_DRAIN_MS);
        while self.runs_in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.inner.system.stop();
        let thread = self
            .inner
            .thread
            .lock()
            .ok()
            .and_then(|mut thread| thread.take());
        if let Some(thread) = thread {
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .map_err(|error| RuntimeError::Internal(error.to_string()))?
                .map_err(|_| RuntimeError::Internal("actor thread panicked".into()))?;
        }
        self.journal().close()?;
        Ok(())
    }
}
