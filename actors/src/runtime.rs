//! The embedding API: open a runtime, start runs, stream and await them, shut down.
//!
//! [`Runtime`] owns the journal and the actix system (on its own OS thread with a pool
//! of arbiters). Its async methods run their actor round trips in a detached tokio
//! task, so a caller that gives up (an HTTP client that disconnects) never cancels a
//! command half-way: a dropped `Addr::send` future would cancel the message.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::prelude::*;
use turnstile_journal::limits::SHUTDOWN_DRAIN_MS;
use turnstile_journal::{EventIndex, Journal, JournalOptions, RunId, Seq, SessionEntry, SessionId};
use turnstile_projections::{ForkPoint, RunStatus, RunView, SessionState};

use crate::api::{
    AgentSpec, CompactOutcome, ContinueFrom, ContinueRun, Multitask, Refused, RuntimeConfig,
    RuntimeCounters, RuntimeError, StartRun,
};
use crate::registry::{CountSessions, FenceAll, GetSession, Registry, WakeSession};
use crate::session::{
    CancelRunMsg, CompactMsg, DeleteSessionMsg, SessionActor, Shared, StartRunMsg,
};
use crate::stream::RunEvents;

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
    /// Opens the journal (in `config.data_dir`, or the PostgreSQL one configured) and
    /// starts the actor system. Sessions with runs left open by an earlier process wake
    /// at once and resolve them.
    pub fn open(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let options = JournalOptions {
            max_event_bytes: config.max_event_bytes,
            ..JournalOptions::default()
        };
        let journal = match &config.postgres {
            Some(postgres) => Journal::open_postgres(postgres, options)?,
            None => Journal::open(&config.data_dir, options)?,
        };
        let cluster = journal.is_shared();
        // On a shared journal the open runs of sessions other live replicas hold are
        // theirs: this replica takes only what is claimable, through its dispatcher.
        let open_runs = if cluster {
            Vec::new()
        } else {
            journal.open_runs()?
        };
        let recovering = open_runs.len();
        let directory = crate::directory::Directory::load(&journal)?;
        let shared = Arc::new(Shared {
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
                config.session_idle.as_millis().min(u128::from(u64::MAX)) as u64,
            ),
            cluster,
            release_memory: config.release_memory,
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
            runtime.start_cluster_duties()?;
        }
        Ok(runtime)
    }

    /// On a shared journal, a thread of this replica's own: it carries out the commands
    /// other replicas leave for sessions this one owns, takes over sessions with open
    /// runs whose owner died or stalled (as many as it has free worker slots), and stops
    /// every turn when this replica's heartbeat lapsed (its leases are gone).
    fn start_cluster_duties(&self) -> Result<(), RuntimeError> {
        let weak = Arc::downgrade(&self.inner);
        let mut lapses = self.journal().lapses();
        std::thread::Builder::new()
            .name("turnstile-replica".into())
            .spawn(move || {
                let Ok(reactor) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    tracing::error!("the replica thread could not start its runtime");
                    return;
                };
                reactor.block_on(async move {
                    tokio::spawn(follow_other_replicas(weak.clone()));
                    let mut last_claim = Instant::now() - CLAIM_EVERY;
                    loop {
                        let Some(inner) = weak.upgrade() else { return };
                        if !inner.shared.accepting.load(Ordering::SeqCst) {
                            return;
                        }
                        let runtime = Runtime { inner };
                        if lapses.has_changed().unwrap_or(false) {
                            let lapse = *lapses.borrow_and_update();
                            runtime.inner.registry.do_send(FenceAll(lapse));
                        }
                        match runtime.journal().take_commands() {
                            Ok(commands) => {
                                for command in commands {
                                    let runtime = runtime.clone();
                                    tokio::spawn(async move {
                                        let id = command.id;
                                        let reply = runtime.serve_command(command).await;
                                        let journal = runtime.journal().clone();
                                        let answered = tokio::task::spawn_blocking(move || {
                                            journal.answer_command(id, reply)
                                        })
                                        .await;
                                        if let Ok(Err(error)) = answered {
                                            tracing::warn!(%error, "answering another replica's command failed");
                                        }
                                    });
                                }
                            }
                            Err(error) => tracing::warn!(%error, "reading this replica's commands failed"),
                        }
                        if last_claim.elapsed() >= CLAIM_EVERY {
                            last_claim = Instant::now();
                            let free = runtime.inner.shared.slots.available_permits();
                            if free > 0 {
                                match runtime.journal().claimable(free) {
                                    Ok(sessions) => {
                                        for session_id in sessions {
                                            tracing::info!(%session_id, "taking over a session whose owner is gone");
                                            runtime.inner.registry.do_send(WakeSession(session_id));
                                        }
                                    }
                                    Err(error) => tracing::warn!(%error, "looking for sessions to take over failed"),
                                }
                            }
                        }
                        let journal = runtime.journal().clone();
                        drop(runtime);
                        journal.wait_for_commands(COMMANDS_EVERY).await;
                    }
                });
            })
            .map_err(|error| RuntimeError::Internal(error.to_string()))?;
        Ok(())
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

    /// Accepts a run: returns once `RunQueued` is in the journal. The run starts when
    /// its session is free and a worker slot is; with [`Multitask::Reject`](crate::Multitask::Reject) a busy
    /// session refuses at once with the id of the run it is busy with.
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
        let mut names = std::collections::HashSet::new();
        for attachment in &command.attachments {
            if let Err(error) = crate::uploads::check_name(&attachment.name) {
                return Ok(Err(Refused::InvalidInput {
                    reason: error.to_string(),
                }));
            }
            if !names.insert(attachment.name.as_str()) {
                return Ok(Err(Refused::InvalidInput {
                    reason: format!("two attachments are named {:?}", attachment.name),
                }));
            }
        }
        let runtime = self.clone();
        tokio::spawn(async move {
            let _serialized = match &command.idempotency_key {
                Some(key) => {
                    let guard = runtime.inner.idempotent.lock().await;
                    if let Some(run_id) = runtime.journal().run_of_idempotency_key(key)?
                        && let Some(mut handle) = runtime.handle_of(&run_id)?
                    {
                        handle.reused = true;
                        return Ok(Ok(handle));
                    }
                    Some(guard)
                }
                None => None,
            };
            let session_id = command.session_id.clone().unwrap_or_else(SessionId::new_v7);
            let mut command = command;
            command.session_id = Some(session_id.clone());
            let deadline = Instant::now() + ELSEWHERE_WAIT;
            let accepted = loop {
                let session = runtime
                    .inner
                    .registry
                    .send(GetSession(session_id.clone()))
                    .await?;
                let answer = match session.send(StartRunMsg(command.clone())).await {
                    Ok(answer) => answer,
                    // The actor stopped (it gave its lease back) between lookup and send.
                    Err(MailboxError::Closed)
                        if Instant::now() < deadline
                            && runtime.inner.shared.accepting.load(Ordering::SeqCst) =>
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    Err(error) => return Err(error.into()),
                };
                match answer {
                    Ok(Ok(accepted)) => break accepted,
                    Ok(Err(refused)) => return Ok(Err(refused)),
                    Err(RuntimeError::Elsewhere { owner, busy, .. }) => {
                        match (command.multitask, busy) {
                            // The same refusal as on the owner: one turn at a time.
                            (Multitask::Reject, Some(run_id)) => {
                                return Ok(Err(Refused::Busy { session_id, run_id }));
                            }
                            (Multitask::Enqueue, _) => {
                                if let Some(forwarded) =
                                    runtime.forward_start(&session_id, &owner, &command).await?
                                {
                                    return Ok(forwarded);
                                }
                            }
                            // Idle on its owner, which is giving it back: ask again.
                            (Multitask::Reject, None) => {}
                        }
                        if Instant::now() >= deadline {
                            return Err(RuntimeError::Internal(format!(
                                "session {session_id} stays with replica {owner}, which does not take the turn"
                            )));
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(error) => return Err(error),
                }
            };
            Ok(Ok(RunHandle {
                events: RunEvents::new(
                    runtime.journal().clone(),
                    session_id.clone(),
                    accepted.run_id.clone(),
                    accepted.from_seq,
                    Some(accepted.live),
                    EventIndex(0),
                ),
                run_id: accepted.run_id,
                session_id,
                reused: false,
                runtime: runtime.clone(),
            }))
        })
        .await
        .map_err(|error| RuntimeError::Internal(error.to_string()))?
    }

    /// Hands a turn for a session another replica owns to that replica (through the
    /// journal's inbox); `None` when it never ran there (not taken in time, or the
    /// owner died), so the caller asks again.
    async fn forward_start(
        &self,
        session_id: &SessionId,
        owner: &str,
        command: &StartRun,
    ) -> Result<Option<Result<RunHandle, Refused>>, RuntimeError> {
        let body = serde_json::to_string(command)
            .map_err(|error| RuntimeError::Internal(error.to_string()))?;
        let journal = self.journal().clone();
        let id = {
            let (session_id, owner) = (session_id.clone(), owner.to_owned());
            tokio::task::spawn_blocking(move || {
                journal.send_command(&session_id, &owner, "enqueue", body)
            })
            .await
            .map_err(|error| RuntimeError::Internal(error.to_string()))??
        };
        let Some(reply) = self.journal().command_reply(id, ELSEWHERE_WAIT).await? else {
            return Ok(None);
        };
        let reply: serde_json::Value = serde_json::from_str(&reply)
            .map_err(|error| RuntimeError::Internal(format!("a replica's reply: {error}")))?;
        if let Some(refused) = reply.get("refused").and_then(|r| r.as_str()) {
            return Ok(Some(Err(refused_from_reply(refused, session_id))));
        }
        let run_id: RunId = reply["run_id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| RuntimeError::Internal(format!("a replica's reply: {reply}")))?;
        let from_seq = Seq(reply["from_seq"].as_u64().unwrap_or(0));
        Ok(Some(Ok(RunHandle {
            events: RunEvents::new(
                self.journal().clone(),
                session_id.clone(),
                run_id.clone(),
                from_seq,
                None,
                EventIndex(0),
            ),
            run_id,
            session_id: session_id.clone(),
            reused: false,
            runtime: self.clone(),
        })))
    }

    /// Carries out a command another replica left for a session this one owns, and
    /// answers it.
    async fn serve_command(&self, command: turnstile_journal::Command) -> String {
        match command.kind.as_str() {
            "cancel" => {
                let cancelled = match command.body.parse::<RunId>() {
                    Ok(run_id) => self.cancel_run(&run_id).await.unwrap_or(false),
                    Err(_) => false,
                };
                serde_json::json!({ "cancelled": cancelled }).to_string()
            }
            "enqueue" => {
                let start: StartRun = match serde_json::from_str(&command.body) {
                    Ok(start) => start,
                    Err(error) => {
                        return serde_json::json!({ "refused": format!("internal: {error}") })
                            .to_string();
                    }
                };
                match self.start_run(start).await {
                    Ok(Ok(handle)) => {
                        let from_seq = self
                            .run_view(&handle.run_id)
                            .ok()
                            .flatten()
                            .map(|view| view.queued_seq.0)
                            .unwrap_or(0);
                        serde_json::json!({ "run_id": handle.run_id, "from_seq": from_seq })
                            .to_string()
                    }
                    Ok(Err(refused)) => {
                        serde_json::json!({ "refused": refused_to_reply(&refused) }).to_string()
                    }
                    Err(error) => {
                        serde_json::json!({ "refused": format!("internal: {error}") }).to_string()
                    }
                }
            }
            other => serde_json::json!({ "refused": format!("internal: unknown command {other}") })
                .to_string(),
        }
    }

    /// A handle on an existing run, its events from index 0.
    fn handle_of(&self, run_id: &RunId) -> Result<Option<RunHandle>, RuntimeError> {
        let Some(events) = self.run_events(run_id, None)? else {
            return Ok(None);
        };
        let Some(view) = self.run_view(run_id)? else {
            return Ok(None);
        };
        Ok(Some(RunHandle {
            run_id: view.run_id,
            session_id: view.session_id,
            reused: false,
            events,
            runtime: self.clone(),
        }))
    }

    /// A session's facts and the runs it holds in memory (its open runs): its stored
    /// form plus the records after it. `None` when it does not exist.
    pub fn session(&self, session_id: &SessionId) -> Result<Option<SessionState>, RuntimeError> {
        let state = crate::reads::load_session(self.journal(), session_id)?;
        Ok(state.exists().then_some(state))
    }

    /// A session's facts with every one of its runs, oldest first (costs its runs).
    pub fn session_state(
        &self,
        session_id: &SessionId,
    ) -> Result<Option<SessionState>, RuntimeError> {
        let Some(mut state) = self.session(session_id)? else {
            return Ok(None);
        };
        state.runs = crate::reads::session_runs(self.journal(), &state)?;
        Ok(Some(state))
    }

    /// A session's runs, oldest first; `None` when the session does not exist.
    pub fn session_runs(
        &self,
        session_id: &SessionId,
    ) -> Result<Option<Vec<RunView>>, RuntimeError> {
        Ok(self.session_state(session_id)?.map(|state| state.runs))
    }

    /// A run's view: its stored form once it has ended, else its session's state.
    pub fn run_view(&self, run_id: &RunId) -> Result<Option<RunView>, RuntimeError> {
        crate::reads::run_view(self.journal(), run_id)
    }

    /// [`Runtime::run_view`] as far as the run's head (agent, session, status, event
    /// count): what a stream needs, without building an ended run's tool calls and
    /// content.
    pub fn run_head(
        &self,
        run_id: &RunId,
    ) -> Result<Option<turnstile_projections::RunHead>, RuntimeError> {
        crate::reads::run_head(self.journal(), run_id)
    }

    /// The lines of one harness session's transcript, as journaled (folds the session's
    /// records: for audits and tests, not for a turn).
    pub fn transcript(
        &self,
        session_id: &SessionId,
        harness_session_id: &str,
    ) -> Result<Vec<String>, RuntimeError> {
        crate::reads::transcript(self.journal(), session_id, harness_session_id)
    }

    /// Every session's listing facts and daily metrics.
    pub fn directory(&self) -> &crate::directory::Directory {
        &self.inner.shared.directory
    }

    /// One page of an agent's runs in the order they were queued (newest first when
    /// `newest_first`), those with `status` only when it is given, and how many there
    /// are. The page reads the runs it returns and the index entries it skips; the count
    /// is kept by the journal as runs change.
    pub fn agent_runs(
        &self,
        agent_id: &str,
        status: Option<RunStatus>,
        skip: usize,
        limit: usize,
        newest_first: bool,
    ) -> Result<(Vec<RunView>, usize), RuntimeError> {
        use turnstile_journal::IndexedStatus;
        let wanted = status.map(|status| match status {
            RunStatus::Pending => IndexedStatus::Pending,
            RunStatus::Running => IndexedStatus::Running,
            RunStatus::Completed => IndexedStatus::Completed,
            RunStatus::Error => IndexedStatus::Error,
            RunStatus::Cancelled => IndexedStatus::Cancelled,
        });
        let counts = self.journal().agent_run_counts(agent_id);
        let total = match wanted {
            Some(status) => counts[status as usize],
            None => counts.iter().sum(),
        } as usize;
        let mut matched = 0;
        let mut page = Vec::new();
        for run in self.journal().agent_runs(agent_id, newest_first) {
            let run = run?;
            if wanted.is_some_and(|wanted| wanted != run.status) {
                continue;
            }
            if matched >= skip {
                page.extend(self.run_view(&run.run_id)?);
            }
            matched += 1;
            if page.len() >= limit {
                break;
            }
        }
        Ok((page, total))
    }

    /// A run's events after `after` (all of them when `None`): live until its end for
    /// a run in flight, read from the journal for a finished one.
    pub fn run_events(
        &self,
        run_id: &RunId,
        after: Option<EventIndex>,
    ) -> Result<Option<RunEvents>, RuntimeError> {
        let Some(head) = self.run_head(run_id)? else {
            return Ok(None);
        };
        Ok(Some(self.run_events_of(&head, after)))
    }

    /// [`Runtime::run_events`] of a run whose head the caller has read already (a
    /// route that checked the run), so the head is not read twice.
    pub fn run_events_of(
        &self,
        head: &turnstile_projections::RunHead,
        after: Option<EventIndex>,
    ) -> RunEvents {
        // Subscribed before the journal is read: an event journaled meanwhile is in one
        // or the other, and the stream delivers each index once.
        let live = self.inner.shared.live_run(&head.run_id);
        let from = after.map(EventIndex::next).unwrap_or_default();
        RunEvents::new(
            self.journal().clone(),
            head.session_id.clone(),
            head.run_id.clone(),
            head.queued_seq,
            live,
            from,
        )
    }

    /// Asks the run's session to cancel it; `true` when a run in flight was signalled.
    /// On a shared journal a session another replica owns is asked through it.
    pub async fn cancel_run(&self, run_id: &RunId) -> Result<bool, RuntimeError> {
        let Some(session_id) = self.journal().session_of_run(run_id)? else {
            return Ok(false);
        };
        let deadline = Instant::now() + ELSEWHERE_WAIT;
        loop {
            let answer = match self
                .ask_session(session_id.clone(), CancelRunMsg(run_id.clone()))
                .await
            {
                Ok(answer) => answer,
                // The actor stopped (it gave its lease back) between lookup and send.
                Err(RuntimeError::Stopped)
                    if Instant::now() < deadline
                        && self.inner.shared.accepting.load(Ordering::SeqCst) =>
                {
                    continue;
                }
                Err(error) => return Err(error),
            };
            match answer {
                Ok(cancelled) => return Ok(cancelled),
                Err(RuntimeError::Elsewhere { owner, .. }) => {
                    let journal = self.journal().clone();
                    let (session, run) = (session_id.clone(), run_id.to_string());
                    let id = tokio::task::spawn_blocking(move || {
                        journal.send_command(&session, &owner, "cancel", run)
                    })
                    .await
                    .map_err(|error| RuntimeError::Internal(error.to_string()))??;
                    if let Some(reply) = self.journal().command_reply(id, ELSEWHERE_WAIT).await? {
                        let reply: serde_json::Value =
                            serde_json::from_str(&reply).unwrap_or_default();
                        return Ok(reply["cancelled"].as_bool().unwrap_or(false));
                    }
                    // Its owner died meanwhile: the session is free now, or soon.
                    if Instant::now() >= deadline {
                        return Ok(false);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Sends `message` to the session's actor from a detached task, so that a caller
    /// who gives up (a dropped HTTP request) never cancels it half-way.
    async fn ask_session<M>(
        &self,
        session_id: SessionId,
        message: M,
    ) -> Result<M::Result, RuntimeError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        SessionActor: Handler<M>,
    {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let session = inner.registry.send(GetSession(session_id)).await?;
            Ok(session.send(message).await?)
        })
        .await
        .map_err(|error| RuntimeError::Internal(error.to_string()))?
    }

    /// Continues a finished run from one of its checkpoints as a new run with fork
    /// lineage; the finished run is never rewritten. The new run's harness session is a
    /// fork that remembers only what happened up to the continuation point.
    pub async fn continue_run(
        &self,
        command: ContinueRun,
    ) -> Result<Result<RunHandle, Refused>, RuntimeError> {
        let Some(source) = self.run_view(&command.run_id)? else {
            return Ok(Err(Refused::UnknownRun {
                run_id: command.run_id,
            }));
        };
        let refuse = |reason: &str| {
            Ok(Err(Refused::NotContinuable {
                run_id: source.run_id.clone(),
                reason: reason.to_owned(),
            }))
        };
        match source.status {
            RunStatus::Cancelled => return refuse("the run is cancelled"),
            RunStatus::Pending | RunStatus::Running => return refuse("the run has not finished"),
            RunStatus::Completed | RunStatus::Error => {}
        }
        let Some(harness_session_id) = source.harness_session_id.clone() else {
            return refuse("the run never reached its harness");
        };
        let message_count = source.message_count();
        let index = match command.continue_from {
            ContinueFrom::End => message_count,
            ContinueFrom::LastUser => 1,
            ContinueFrom::MessageIndex(index) if index <= message_count => index,
            ContinueFrom::MessageIndex(index) => {
                return refuse(&format!(
                    "message index {index} is past the run's {message_count} messages"
                ));
            }
        };
        let (index, transcript_lines, message) = if index == 0 {
            let Some(input) = command.input.clone() else {
                return refuse("continuing from message 0 needs an input");
            };
            (0, source.transcript_start, input)
        } else if index == 1 && command.input.is_none() {
            // Replay: the turn again, from before its user message.
            (1, source.transcript_start, source.input.clone())
        } else {
            let prompt = command
                .input
                .clone()
                .unwrap_or_else(|| "Continue from where you left off.".to_owned());
            match source
                .checkpoints
                .iter()
                .find(|checkpoint| checkpoint.message_index >= index)
            {
                Some(checkpoint)
                    if checkpoint.message_index < message_count || index < message_count =>
                {
                    (
                        checkpoint.message_index,
                        checkpoint.transcript_lines,
                        prompt,
                    )
                }
                _ => (message_count, source.transcript_end, prompt),
            }
        };
        let fork = ForkPoint {
            from_run_id: source.run_id.clone(),
            message_index: index,
            harness_session_id,
            transcript_lines,
        };
        self.start_run(StartRun {
            agent_id: source.agent_id.clone(),
            session_id: Some(source.session_id.clone()),
            user_id: command.user_id.or(source.user_id.clone()),
            message,
            options: command.options,
            multitask: command.multitask,
            idempotency_key: None,
            fork: Some(fork),
            attachments: Vec::new(),
        })
        .await
    }

    /// Compacts the session's harness session; refused while a run is in flight.
    pub async fn compact_session(
        &self,
        agent_id: &str,
        session_id: &SessionId,
    ) -> Result<Result<CompactOutcome, Refused>, RuntimeError> {
        let Some(state) = self.session(session_id)? else {
            return Ok(Err(Refused::UnknownSession {
                session_id: session_id.clone(),
            }));
        };
        if state.session.agent_id != agent_id {
            return Ok(Err(Refused::AgentMismatch {
                session_id: session_id.clone(),
                agent_id: state.session.agent_id,
            }));
        }
        self.ask_owner(session_id, || CompactMsg).await
    }

    /// Deletes a session: a tombstone event; afterwards the session and its runs read
    /// as gone while the journal keeps them. `false` when there is no such session;
    /// refused while the session has a run in flight or queued.
    pub async fn delete_session(
        &self,
        session_id: &SessionId,
    ) -> Result<Result<bool, Refused>, RuntimeError> {
        if self.session(session_id)?.is_none() {
            return Ok(Ok(false));
        }
        self.ask_owner(session_id, || DeleteSessionMsg).await
    }

    /// Sends a command that must run on the session's owner: on a shared journal a
    /// session another replica owns is busy (its running run named) or, idle and being
    /// given back, asked again until it is free.
    async fn ask_owner<M, T>(
        &self,
        session_id: &SessionId,
        message: impl Fn() -> M,
    ) -> Result<Result<T, Refused>, RuntimeError>
    where
        M: Message<Result = Result<Result<T, Refused>, RuntimeError>> + Send + 'static,
        T: Send + 'static,
        SessionActor: Handler<M>,
    {
        let deadline = Instant::now() + ELSEWHERE_WAIT;
        loop {
            match self.ask_session(session_id.clone(), message()).await {
                Ok(Err(RuntimeError::Elsewhere {
                    busy: Some(run_id), ..
                })) => {
                    return Ok(Err(Refused::Busy {
                        session_id: session_id.clone(),
                        run_id,
                    }));
                }
                Ok(Err(RuntimeError::Elsewhere { owner, .. })) if Instant::now() >= deadline => {
                    return Err(RuntimeError::Internal(format!(
                        "session {session_id} stays with replica {owner}"
                    )));
                }
                Ok(Err(RuntimeError::Elsewhere { .. })) => {}
                Err(RuntimeError::Stopped)
                    if Instant::now() < deadline
                        && self.inner.shared.accepting.load(Ordering::SeqCst) => {}
                Ok(answer) => return answer,
                Err(error) => return Err(error),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Every existing session, from the journal's session index (no stream is read).
    pub fn sessions(&self) -> Result<Vec<SessionEntry>, RuntimeError> {
        Ok(self.journal().sessions()?)
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
            .map_err(|error| RuntimeError::Internal(error.to_string()))?
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
                .map_err(|error| RuntimeError::Internal(error.to_string()))?
                .map_err(|_| RuntimeError::Internal("actor thread panicked".into()))?;
        }
        self.journal().close()?;
        Ok(())
    }
}

/// Keeps the directory (the sessions list and the daily metrics) true to what the other
/// replicas do: a session's turning point journaled elsewhere (a session created or
/// deleted, a run accepted or ended, a compaction) reloads its facts from its read model.
/// Sessions this replica holds are followed by their own actors.
async fn follow_other_replicas(weak: std::sync::Weak<Inner>) {
    let Some(journal) = weak.upgrade().map(|inner| inner.shared.journal.clone()) else {
        return;
    };
    let mut records = journal.subscribe_from(journal.next_pos());
    while let Ok(record) = records.next().await {
        let turning_point = match &record.event {
            turnstile_journal::Event::SessionCreated { .. }
            | turnstile_journal::Event::SessionDeleted { .. }
            | turnstile_journal::Event::RunQueued { .. }
            | turnstile_journal::Event::TranscriptCompacted { .. } => true,
            event => event.is_terminal(),
        };
        if !turning_point || journal.holds_lease(&record.session_id) {
            continue;
        }
        let Some(inner) = weak.upgrade() else {
            return;
        };
        match crate::reads::load_session(&journal, &record.session_id) {
            Ok(state) => inner
                .shared
                .directory
                .update(&record.session_id, &state.session),
            Err(error) => {
                tracing::warn!(session_id = %record.session_id, %error, "a session another replica changed could not be read")
            }
        }
    }
}

/// How long a command for a session another replica owns waits for it (the owner's
/// answer, or the session to come free).
const ELSEWHERE_WAIT: Duration = Duration::from_secs(10);
/// How long a replica waits for word of a command left for it (a notification) before
/// it looks anyway; sessions to take over are looked for as often.
const COMMANDS_EVERY: Duration = Duration::from_millis(250);
/// How often a replica looks for sessions to take over.
const CLAIM_EVERY: Duration = Duration::from_millis(250);

/// A refusal as a replica's reply carries it.
fn refused_to_reply(refused: &Refused) -> String {
    match refused {
        Refused::QueueFull { limit } => format!("queue_full:{limit}"),
        Refused::ShuttingDown => "shutting_down".into(),
        other => format!("other:{other}"),
    }
}

/// A replica's refusal, back as a [`Refused`].
fn refused_from_reply(reply: &str, session_id: &SessionId) -> Refused {
    if let Some(limit) = reply.strip_prefix("queue_full:") {
        return Refused::QueueFull {
            limit: limit.parse().unwrap_or(0),
        };
    }
    if reply == "shutting_down" {
        return Refused::ShuttingDown;
    }
    Refused::InvalidInput {
        reason: format!(
            "session {session_id}: {}",
            reply.strip_prefix("other:").unwrap_or(reply)
        ),
    }
}
