//! The session actor: one per session, one turn at a time, a durable FIFO of turns.
//!
//! It resumes its state from the session's stored form plus the records after it
//! (never from the session's first record, see [`crate::reads`]) and resolves
//! what a stopped process left open: queued runs queue again; a run that was running
//! gets a new attempt when it has attempts left, else ends `ERROR`. A turn is accepted
//! by journaling `RunQueued`; the session's head-of-line run is elected first and only
//! then takes a worker slot, so a turn waiting behind its session costs neither an
//! attempt nor a slot. The end of a run is journaled and the session freed in one step.
//! An idle actor passivates; the next command rebuilds it from the journal.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use serde_json::json;
use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;
use turnstile_harness::{CompactRequest, Compaction, TurnRequest};
use turnstile_journal::limits::{RUN_BROADCAST_EVENTS, SESSION_MAILBOX_MESSAGES};
use turnstile_journal::{
    Event, EventIndex, Expected, Journal, Recorded, RunEvent, RunId, Seq, SessionId, Warning,
};
use turnstile_projections::{RunStatus, RunView, SessionState};

/// Earlier runs of the branch whose attachments a turn stages again.
const ATTACHMENT_RUNS_RESTORED: usize = 10;
/// How often an actor whose append failed tries to read its state again.
const HEAL_EVERY: Duration = Duration::from_secs(1);

use crate::api::{AgentSpec, CompactOutcome, Multitask, Refused, RuntimeError, StartRun};
use crate::directory::Directory;
use crate::history::{branch_history, branch_walk, render_prompt};
use crate::reads;
use crate::run::{
    Finished, RunIdentity, RunTask, WireEvent, broadcast_wire, cancelled_events, failed_events,
    journal_error_type,
};

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
    fn ensure_live(&self, run_id: &RunId) -> broadcast::Sender<Arc<WireEvent>> {
        let mut runs = self
            .live_runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        runs.entry(run_id.clone())
            .or_insert_with(|| broadcast::channel(RUN_BROADCAST_EVENTS).0)
            .clone()
    }

    fn remove_live(&self, run_id: &RunId) -> Option<broadcast::Sender<Arc<WireEvent>>> {
        self.live_runs.lock().ok()?.remove(run_id)
    }
}

struct InFlight {
    run_id: RunId,
    /// Its terminal events are being appended: once they are durable a client can
    /// read the run as ended (from the journal) before this actor frees the session.
    ending: bool,
    cancel: CancellationToken,
    /// Runs whose attachments this turn staged, removed when it ends (unless kept).
    staged: Vec<RunId>,
}

/// A session actor stopped after being idle: the registry forgets it. The session
/// sends it to whoever created it, so this module names no registry.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Passivated {
    pub session_id: SessionId,
    pub address: Addr<SessionActor>,
}

/// A run waiting for its turn.
struct Queued {
    run_id: RunId,
    /// `RunQueued` is durable (a run is queued before its append returns, so that a
    /// concurrent start sees the session busy).
    durable: bool,
    /// The run was running when a process stopped: it resumes with a new attempt.
    resume: bool,
}

pub(crate) struct SessionActor {
    session_id: SessionId,
    shared: Arc<Shared>,
    registry: Recipient<Passivated>,
    state: SessionState,
    queue: VecDeque<Queued>,
    in_flight: Option<InFlight>,
    /// Waiting for a worker slot for the head of the queue.
    electing: bool,
    /// A compaction is running: the session takes no turn meanwhile.
    compacting: bool,
    last_active: Instant,
    /// Set when the journal could not be read: the actor refuses work rather than guess.
    broken: Option<String>,
    /// Set when the journal could not be reached to take the lease or load the state:
    /// commands meanwhile get `journal_unavailable`, and the actor stops so the next
    /// command starts afresh.
    unavailable: Option<String>,
    /// A `SessionCreated` is on its way to the journal.
    creating: bool,
    /// On a shared journal: this actor holds the session's lease (and gives it back
    /// when it stops).
    leased: bool,
    /// The heartbeat's lapse number when the lease was taken: a lapse notice with a
    /// higher number fences this actor, an older one does not.
    leased_before: u64,
    /// On a shared journal: another live replica holds the session; this actor only
    /// answers who, and what the session is busy with, then stops.
    remote: Option<String>,
    /// The lease was lost: nothing more is written, in-flight turns are stopped.
    fenced: bool,
    /// Durable records not folded yet because one before them has not reached this
    /// actor (appends answer in any order): the state is always the fold of the
    /// stream's first `next_seq` records, never of a record after one it lacks.
    unfolded: BTreeMap<u64, Arc<Recorded>>,
    /// An append failed: what the journal took of it is not known, so the state is read
    /// again from the journal before the next command (crash-only).
    stale: bool,
    /// A [`SessionActor::heal`] is due.
    healing: bool,
    /// Runs whose end is being journaled: a state read again meanwhile may not show
    /// the end yet, and must not take them for runs no one works on.
    ending: HashSet<RunId>,
}

/// A run accepted.
pub(crate) struct Accepted {
    pub run_id: RunId,
    pub live: broadcast::Receiver<Arc<WireEvent>>,
    pub from_seq: Seq,
}

#[derive(Message)]
#[rtype(result = "Result<Result<Accepted, Refused>, RuntimeError>")]
pub(crate) struct StartRunMsg(pub StartRun);

#[derive(Message)]
#[rtype(result = "Result<bool, RuntimeError>")]
pub(crate) struct CancelRunMsg(pub RunId);

/// This replica lost every lease it held before its heartbeat's lapse number `.0`:
/// stop the session's turn and write nothing more, if this actor's lease is that old
/// (the notice comes a moment after the lapse, and an actor that took the session over
/// since holds a lease of the new registration: fencing it would leave the session
/// held by a live replica and worked on by no one).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Fence(pub u64);

impl Handler<Fence> for SessionActor {
    type Result = ();

    fn handle(&mut self, Fence(lapse): Fence, ctx: &mut Self::Context) {
        if self.leased && !self.fenced && lapse >= self.leased_before {
            self.fence(ctx);
        }
    }
}

#[derive(Message)]
#[rtype(result = "Result<Result<CompactOutcome, Refused>, RuntimeError>")]
pub(crate) struct CompactMsg;

/// Deletes the session (a tombstone event); `false` when it does not exist.
#[derive(Message)]
#[rtype(result = "Result<Result<bool, Refused>, RuntimeError>")]
pub(crate) struct DeleteSessionMsg;

/// Makes sure the actor exists (start-up recovery).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Wake;

#[derive(Message)]
#[rtype(result = "()")]
struct RunFinishedMsg(Finished);

/// A batch the session's running task journaled (durable).
#[derive(Message)]
#[rtype(result = "()")]
struct RecordsAppended(Vec<Arc<Recorded>>);

impl Handler<RecordsAppended> for SessionActor {
    type Result = ();

    fn handle(&mut self, RecordsAppended(records): RecordsAppended, _: &mut Self::Context) {
        self.fold(&records);
    }
}

impl SessionActor {
    pub(crate) fn new(
        session_id: SessionId,
        shared: Arc<Shared>,
        registry: Recipient<Passivated>,
    ) -> Self {
        SessionActor {
            state: SessionState::new(session_id.clone()),
            session_id,
            shared,
            registry,
            queue: VecDeque::new(),
            in_flight: None,
            electing: false,
            compacting: false,
            last_active: Instant::now(),
            broken: None,
            unavailable: None,
            creating: false,
            leased: false,
            leased_before: 0,
            remote: None,
            fenced: false,
            unfolded: BTreeMap::new(),
            stale: false,
            healing: false,
            ending: HashSet::new(),
        }
    }

    /// Crash-only: after an append failed, the state is dropped and read again from the
    /// journal (stored form and the records after), and the runs open there that no one
    /// here works on are resolved as at start-up. The running run (if any) goes on; its
    /// task's batches are folded as they come, those the read already holds skipped.
    fn ensure_fresh(&mut self, ctx: &mut Context<Self>) -> Result<(), RuntimeError> {
        if !self.stale || self.fenced || self.remote.is_some() {
            return Ok(());
        }
        let state = reads::load_whole_session(&self.shared.journal, &self.session_id)?;
        tracing::warn!(session_id = %self.session_id, next_seq = state.next_seq, "session state read again from the journal after an append failed");
        self.state = state;
        self.stale = false;
        let next_seq = self.state.next_seq;
        self.unfolded.retain(|seq, _| *seq >= next_seq);
        // Queued runs whose acceptance the journal does not hold are gone (their
        // request was answered with the error).
        let open: HashSet<RunId> = self
            .state
            .open_runs()
            .map(|run| run.run_id.clone())
            .collect();
        let before = self.queue.len();
        self.queue
            .retain(|queued| !queued.durable || open.contains(&queued.run_id));
        self.shared
            .queued
            .fetch_sub(before - self.queue.len(), Ordering::SeqCst);
        self.resolve_open_runs(ctx);
        Ok(())
    }

    /// The journal could not be reached at the start: unavailable (a `503` for the
    /// commands meanwhile, then a fresh actor) or broken.
    fn set_broken(&mut self, error: &turnstile_journal::Error, ctx: &mut Context<Self>) {
        match error.unavailable() {
            Some(detail) => {
                self.unavailable = Some(detail);
                ctx.run_later(Duration::from_millis(50), |_, ctx| ctx.stop());
            }
            None => {
                self.broken = Some(error.to_string());
                if self.shared.cluster {
                    ctx.run_later(Duration::from_millis(50), |_, ctx| ctx.stop());
                }
            }
        }
    }

    /// What a command gets from an actor that could not start.
    fn broken_error(&self) -> Option<RuntimeError> {
        if let Some(detail) = &self.unavailable {
            return Some(RuntimeError::Journal(
                turnstile_journal::Error::Unavailable(detail.clone()),
            ));
        }
        self.broken
            .as_ref()
            .map(|reason| RuntimeError::Internal(reason.clone()))
    }

    /// After an append failed: the state is read again as soon as the journal answers
    /// (every second until it does), and what the failure interrupted is resolved, also
    /// when no command comes to ask (a run whose end could not be journaled would
    /// otherwise stay open with no one working on it).
    fn heal(&mut self, ctx: &mut Context<Self>) {
        self.healing = false;
        if !self.stale || self.fenced || self.broken.is_some() || self.unavailable.is_some() {
            return;
        }
        if self.in_flight.is_some() || self.electing || self.compacting {
            // Their end heals (or comes back here).
            self.heal_later(ctx);
            return;
        }
        match self.ensure_fresh(ctx) {
            Ok(()) => self.pump(ctx),
            Err(error) => {
                tracing::debug!(session_id = %self.session_id, %error, "journal still unavailable");
                self.heal_later(ctx);
            }
        }
    }

    /// [`SessionActor::heal`] in [`HEAL_EVERY`], unless it is already due.
    fn heal_later(&mut self, ctx: &mut Context<Self>) {
        if !self.healing {
            self.healing = true;
            ctx.run_later(HEAL_EVERY, |actor, ctx| actor.heal(ctx));
        }
    }

    /// Resolves the runs open in the state that no one here works on (start-up
    /// recovery, and after a state read again): their endings are journaled before any
    /// other command is handled.
    /// Returns whether endings are being journaled (the actor pumps once they are).
    fn resolve_open_runs(&mut self, ctx: &mut Context<Self>) -> bool {
        let endings = self.recover();
        if endings.is_empty() {
            return false;
        }
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        // `wait` holds back every command until recovery is journaled.
        ctx.wait(
            async move { journal.append(&session_id, Expected::Any, endings).await }
                .into_actor(self)
                .map(|result, actor, ctx| match result {
                    Ok(Ok(records)) => {
                        for record in &records {
                            if let Some(run_id) =
                                record.event.run_id().filter(|_| record.event.is_terminal())
                                && let Some(live) = actor.shared.remove_live(run_id)
                            {
                                broadcast_wire(&live, std::slice::from_ref(record));
                            }
                        }
                        actor.apply(&records);
                        actor.pump(ctx);
                    }
                    Ok(Err(conflict)) => {
                        tracing::error!(session_id = %actor.session_id, %conflict, "recovery not journaled");
                        actor.stale = true;
                        actor.heal_later(ctx);
                    }
                    Err(error) => {
                        tracing::error!(session_id = %actor.session_id, %error, "recovery not journaled");
                        actor.stale = true;
                        actor.check_fenced(&error, ctx);
                        actor.heal_later(ctx);
                    }
                }),
        );
        true
    }

    /// What a remote session is busy with, as the journal shows it: its running run,
    /// else its oldest queued one.
    fn remote_busy(&self) -> Option<RunId> {
        let open: Vec<_> = self.state.open_runs().collect();
        open.iter()
            .find(|run| run.status == RunStatus::Running)
            .or_else(|| open.iter().min_by_key(|run| run.queued_seq))
            .map(|run| run.run_id.clone())
    }

    /// The answer of an actor whose session another replica holds. Such an actor is
    /// idle from the start, so it stops at its next idle check and the next command
    /// asks the journal again (stopping here would drop a reply still to be sent).
    fn elsewhere(&self, owner: &str, _: &mut Context<Self>) -> RuntimeError {
        RuntimeError::Elsewhere {
            session_id: self.session_id.clone(),
            owner: owner.to_owned(),
            busy: self.remote_busy(),
        }
    }

    /// After a journal failure: a lost lease stops the actor (its turn's CLI with it)
    /// and nothing more is written here; the session's new owner resolves its runs.
    fn check_fenced(&mut self, error: &turnstile_journal::Error, ctx: &mut Context<Self>) {
        if matches!(error, turnstile_journal::Error::Fenced { .. }) && !self.fenced {
            tracing::error!(session_id = %self.session_id, "lease lost: this replica stops working on the session");
            self.fence(ctx);
        }
    }

    fn fence(&mut self, ctx: &mut Context<Self>) {
        self.fenced = true;
        self.broken = Some(format!(
            "this replica lost the lease of session {}",
            self.session_id
        ));
        if let Some(in_flight) = &self.in_flight {
            in_flight.cancel.cancel();
        }
        // Their live channels close: a stream attached here follows the journal from
        // then on, to the end the session's next owner gives the run.
        let runs = self
            .in_flight
            .iter()
            .map(|f| f.run_id.clone())
            .chain(self.queue.iter().map(|q| q.run_id.clone()));
        for run_id in runs.collect::<Vec<_>>() {
            self.shared.remove_live(&run_id);
        }
        self.shared
            .queued
            .fetch_sub(self.queue.len(), Ordering::SeqCst);
        self.queue.clear();
        ctx.stop();
    }

    fn identity(&self, run_id: &RunId) -> RunIdentity {
        RunIdentity {
            run_id: run_id.clone(),
            session_id: self.session_id.clone(),
        }
    }

    /// Applies records this actor appended (they are logged here: see
    /// [`crate::lifecycle::log_actor_step`]).
    fn apply(&mut self, records: &[Arc<Recorded>]) {
        for record in records {
            crate::lifecycle::log_actor_step(&self.session_id, &record.event);
        }
        self.fold(records);
    }

    /// Applies records, logging nothing (a run task's, logged as it appended them).
    /// Records are folded in the stream's order: one that arrives before a record it
    /// follows waits for it, and one the state already holds is skipped.
    fn fold(&mut self, arrived: &[Arc<Recorded>]) {
        for record in arrived {
            if record.session_id == self.session_id && record.seq.0 >= self.state.next_seq {
                self.unfolded.insert(record.seq.0, record.clone());
            }
        }
        let mut records = Vec::new();
        while let Some(record) = self.unfolded.remove(&self.state.next_seq) {
            self.state.apply(&record);
            records.push(record);
        }
        let records = &records[..];
        for record in records {
            let counter = match record.event {
                Event::RunStarted { .. } => Some(&self.shared.counters.started),
                Event::RunCompleted { .. } => Some(&self.shared.counters.completed),
                Event::RunFailed { .. } => Some(&self.shared.counters.failed),
                Event::RunCancelled { .. } => Some(&self.shared.counters.cancelled),
                _ => None,
            };
            if let Some(counter) = counter {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Stored forms follow the session at its turning points (a run accepted or
        // ended, a compaction, a deletion): the session's key and each run's own key,
        // so a write costs the same in a long session as in a short one.
        let mut turning_point = false;
        let mut runs = Vec::new();
        for record in records {
            let run = match &record.event {
                Event::RunQueued { run_id, .. } => Some(run_id),
                event if event.is_terminal() => event.run_id(),
                Event::TranscriptCompacted { .. } | Event::SessionDeleted { .. } => None,
                _ => continue,
            };
            turning_point = true;
            if let Some(run) = run.and_then(|run_id| self.state.run(run_id)) {
                runs.push(self.state.stored_run(run));
            }
        }
        if !turning_point {
            return;
        }
        // While a run is in flight its task journals events this state has not folded
        // yet (they are applied when it ends): a session form stored now would be "as
        // of" a sequence whose fold includes them, and `journal rebuild` would call it a
        // difference (issue 12: a stop with one run in flight and one queued). The run's
        // end stores it again, complete; ended runs leave memory then, their stored
        // forms keep them.
        // Stored only when the state is a whole prefix of the stream and no run is past
        // its acceptance: `SessionState::resume` takes open runs as pending, with their
        // events in the records after the stored form.
        let idle = self.in_flight.is_none()
            && self.unfolded.is_empty()
            && self
                .state
                .open_runs()
                .all(|run| run.status == RunStatus::Pending);
        // The facts are copied once: inside the stored form when it is written, alone
        // for the directory otherwise.
        let stored = idle.then(|| self.state.stored());
        let view = stored.is_none().then(|| self.state.session.clone());
        let shared = self.shared.clone();
        let session_id = self.session_id.clone();
        // The stored forms and the directory outlive this actor: they are written on
        // the keeper's thread (see `keeper`), and the actor waits for them.
        self.shared.keeper.run(move || {
            for run in &runs {
                reads::put_run(&shared.journal, run);
            }
            if let Some(facts) = stored
                .as_ref()
                .map(|stored| &stored.session)
                .or(view.as_ref())
            {
                shared.directory.update(&session_id, facts);
            }
            if let Some(stored) = &stored {
                reads::put_session(&shared.journal, stored);
            }
        });
        if idle {
            self.state.retire();
            if self.queue.is_empty() {
                // An idle actor keeps no room for a queue it does not have.
                self.queue.shrink_to_fit();
            }
        }
    }

    /// The run the session is busy with: the one running, else the head of the queue.
    /// What a new turn would wait for. A run whose end is being journaled does not
    /// count: its client may already have read that end (from the journal) and sent the
    /// next turn, which queues and starts as soon as the end is applied.
    fn busy_for_a_new_turn(&self) -> Option<&RunId> {
        self.in_flight
            .as_ref()
            .filter(|f| !f.ending)
            .map(|f| &f.run_id)
            .or_else(|| self.queue.front().map(|q| &q.run_id))
    }

    fn busy_with(&self) -> Option<&RunId> {
        self.in_flight
            .as_ref()
            .map(|f| &f.run_id)
            .or_else(|| self.queue.front().map(|q| &q.run_id))
    }

    /// Resolves runs a stopped process left open; returns the events that end the ones
    /// that cannot go on.
    fn recover(&mut self) -> Vec<Event> {
        let mut endings = Vec::new();
        let worked_on: HashSet<RunId> = self
            .queue
            .iter()
            .map(|queued| queued.run_id.clone())
            .chain(self.in_flight.iter().map(|f| f.run_id.clone()))
            .chain(self.ending.iter().cloned())
            .collect();
        let queued_before = self.queue.len();
        let open: Vec<_> = self
            .state
            .open_runs()
            .filter(|run| !worked_on.contains(&run.run_id))
            .cloned()
            .collect();
        for run in open {
            let identity = self.identity(&run.run_id);
            let index = EventIndex(run.event_count);
            let Some(agent) = self.shared.agents.get(&run.agent_id) else {
                let message = format!("Agent {} is no longer configured.", run.agent_id);
                endings.extend(failed_events(
                    &identity,
                    index,
                    "agent_not_configured",
                    &message,
                    false,
                ));
                continue;
            };
            match run.status {
                RunStatus::Pending => {
                    tracing::info!(run_id = %run.run_id, session_id = %self.session_id, "run recovered: queued again");
                    self.queue.push_back(Queued {
                        run_id: run.run_id.clone(),
                        durable: true,
                        resume: false,
                    })
                }
                RunStatus::Running => match &run.last_failure {
                    // A permanent failure was recorded before the stop: never retried.
                    Some((attempt, error_type, false)) if *attempt == run.attempts => {
                        let message =
                            format!("Attempt {attempt} failed permanently ({error_type}).");
                        endings
                            .extend(failed_events(&identity, index, error_type, &message, false));
                    }
                    _ if run.attempts < agent.retry.max_attempts() => {
                        // It was the session's running turn: it goes first.
                        tracing::info!(
                            run_id = %run.run_id,
                            session_id = %self.session_id,
                            attempt = run.attempts + 1,
                            "run recovered: in flight at the stop, it resumes with a new attempt"
                        );
                        self.queue.push_front(Queued {
                            run_id: run.run_id.clone(),
                            durable: true,
                            resume: true,
                        });
                    }
                    _ => {
                        let message = "The turnstile process stopped while this run was in flight, and it has no attempts left.";
                        endings.extend(failed_events(
                            &identity,
                            index,
                            "process_stopped",
                            message,
                            false,
                        ));
                    }
                },
                _ => {}
            }
        }
        // The journal's order: a run resumed first (it was the session's running turn),
        // then by acceptance (a run recovered while others wait goes back before them).
        if self.queue.len() > queued_before {
            let state = &self.state;
            self.queue.make_contiguous().sort_by_key(|queued| {
                let seq = state
                    .run(&queued.run_id)
                    .filter(|_| queued.durable)
                    .map_or(u64::MAX, |run| run.queued_seq.0);
                (!queued.resume, seq)
            });
        }
        for queued in &self.queue {
            self.shared.ensure_live(&queued.run_id);
        }
        self.shared
            .queued
            .fetch_add(self.queue.len() - queued_before, Ordering::SeqCst);
        endings
    }

    /// Elects the head of the queue when the session is free, then waits for a slot.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.is_some()
            || self.electing
            || self.compacting
            || self.broken.is_some()
            || self.unavailable.is_some()
        {
            return;
        }
        if let Err(error) = self.ensure_fresh(ctx) {
            // The journal cannot be read now: the next command (or recovery) tries again.
            tracing::warn!(session_id = %self.session_id, %error, "session state not read again");
            return;
        }
        if !self.queue.front().is_some_and(|head| head.durable) {
            return;
        }
        self.electing = true;
        let slots = self.shared.slots.clone();
        ctx.spawn(
            async move { slots.acquire_owned().await }
                .into_actor(self)
                .map(|permit, actor, ctx| {
                    actor.electing = false;
                    if let Ok(permit) = permit {
                        actor.start_head(permit, ctx);
                    }
                }),
        );
    }

    fn start_head(&mut self, slot: tokio::sync::OwnedSemaphorePermit, ctx: &mut Context<Self>) {
        // The head may have been cancelled while it waited for the slot.
        let Some(head) = self.queue.pop_front() else {
            return;
        };
        self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        self.last_active = Instant::now();
        let Some(run) = self.state.run(&head.run_id).cloned() else {
            tracing::error!(run_id = %head.run_id, "queued run missing from the session state");
            return self.pump(ctx);
        };
        let identity = self.identity(&run.run_id);
        let Some(agent) = self.shared.agents.get(&run.agent_id).cloned() else {
            return self.pump(ctx);
        };
        let cancel = CancellationToken::new();
        let (staged, staging, changed_files) = self.stage_attachments(&run, &agent);
        self.in_flight = Some(InFlight {
            run_id: run.run_id.clone(),
            ending: false,
            cancel: cancel.clone(),
            staged,
        });
        let live = self.shared.ensure_live(&run.run_id);
        let mut next_index = EventIndex(run.event_count);
        let mut events = Vec::new();
        if !head.resume {
            let info = agent.harness.info();
            events.push(Event::RunStarted {
                run_id: run.run_id.clone(),
                model: info.model.clone(),
                model_provider: info.model_provider.clone(),
            });
            events.push(identity.emitted(
                next_index,
                RunEvent::Started {
                    model: info.model.clone(),
                    model_provider: info.model_provider.clone(),
                },
            ));
            next_index = next_index.next();
        }
        if !changed_files.is_empty() {
            events.push(identity.emitted(
                next_index,
                RunEvent::Warning {
                    warning: Warning::AttachmentsChanged {
                        files: changed_files,
                    },
                },
            ));
            next_index = next_index.next();
        }
        // A continuation runs on a fork of the source's harness session that keeps the
        // transcript up to the continuation point; every other run resumes the newest
        // branch. The lines are read from the journal only if the harness asks.
        let (harness_session_id, source, kept) = match (&run.fork, head.resume) {
            (Some(fork), false) => {
                let forked_id = uuid::Uuid::now_v7().to_string();
                let kept = self
                    .state
                    .session
                    .lines_of(&fork.harness_session_id)
                    .min(fork.transcript_lines);
                events.push(Event::HarnessSessionForked {
                    run_id: run.run_id.clone(),
                    from_run_id: fork.from_run_id.clone(),
                    message_index: fork.message_index,
                    from_harness_session_id: fork.harness_session_id.clone(),
                    harness_session_id: forked_id.clone(),
                    transcript_lines: kept,
                });
                (Some(forked_id), Some(fork.harness_session_id.clone()), kept)
            }
            _ => {
                let current = self.state.session.harness_session_id.clone();
                (
                    current.clone(),
                    current,
                    self.state.session.transcript_len(),
                )
            }
        };
        let transcript = match source {
            Some(source) if kept > 0 => {
                let journal = self.shared.journal.clone();
                let session_id = self.session_id.clone();
                turnstile_harness::Transcript::lazy(kept as usize, move || {
                    let mut lines = reads::transcript(&journal, &session_id, &source)
                        .map_err(|error| error.to_string())?;
                    // Lines journaled since the turn began are this turn's own.
                    lines.truncate(kept as usize);
                    Ok(lines)
                })
            }
            _ => turnstile_harness::Transcript::default(),
        };
        let output_schema = serde_json::from_str::<serde_json::Value>(&run.options)
            .ok()
            .map(|options| options["output_schema"].clone())
            .filter(|schema| schema.is_object());
        // Rendered only if the harness session cannot be resumed.
        let fallback_prompt: Option<crate::run::FallbackPrompt> = match run.fork {
            Some(_) => None,
            None => {
                let journal = self.shared.journal.clone();
                let current = run.clone();
                Some(Box::new(move || {
                    let load = |run_id: &RunId| reads::branch_run(&journal, run_id);
                    render_prompt(&branch_history(load, &current), &current.input)
                }))
            }
        };
        let task = RunTask {
            identity,
            journal: self.shared.journal.clone(),
            harness: agent.harness.clone(),
            request: TurnRequest {
                run_id: run.run_id.clone(),
                session_id: self.session_id.clone(),
                attempt: run.attempts + 1,
                message: match &staging {
                    Ok(note) => format!("{}{note}", run.input),
                    Err(_) => run.input.clone(),
                },
                harness_session_id,
                transcript,
                output_schema: output_schema.as_ref().map(|schema| schema.to_string()),
            },
            policy: agent.retry,
            cancel,
            live: live.clone(),
            next_index,
            slot,
            fallback_prompt,
            model: {
                let info = agent.harness.info();
                (info.model, info.model_provider)
            },
            output_schema: output_schema.clone(),
            staging_error: staging.err(),
            // The start goes into the journal with the turn's first events: one sync
            // fewer per turn. A stop before it leaves the run queued, as it was.
            start_events: events,
            appended: {
                let address = ctx.address();
                Box::new(move |records| address.do_send(RecordsAppended(records)))
            },
            journal_failed: false,
            fenced: false,
        };
        let address = ctx.address();
        actix::spawn(async move {
            let finished = task.drive().await;
            // `do_send` ignores the mailbox bound: the end of a run is never dropped.
            address.do_send(RunFinishedMsg(finished));
        });
    }

    /// Stages the run's attachments and those of the last runs of its branch, from the
    /// journal, for the harness; returns the runs staged and the note that names them in
    /// the prompt (or why staging failed), and the kept files that were changed in the
    /// workspace since (left as they are, issue 13).
    fn stage_attachments(
        &self,
        run: &RunView,
        agent: &AgentSpec,
    ) -> (Vec<RunId>, Result<String, String>, Vec<String>) {
        // The run itself, then up to 10 earlier runs of its branch that had attachments:
        // the walk back stops at the oldest run with attachments, so a session without
        // any reads no earlier run.
        let oldest = self
            .state
            .session
            .attachment_runs
            .iter()
            .filter(|(run_id, _)| run_id != &run.run_id)
            .map(|(_, seq)| *seq)
            .min();
        let mut runs: Vec<RunView> = Vec::new();
        if !run.attachments.is_empty() {
            runs.push(run.clone());
        }
        if let Some(oldest) = oldest {
            let load = |run_id: &RunId| reads::branch_run(&self.shared.journal, run_id);
            runs.extend(
                branch_walk(load, run)
                    .map(|(earlier, _)| earlier)
                    .take_while(|earlier| earlier.queued_seq.0 >= oldest)
                    .filter(|earlier| !earlier.attachments.is_empty())
                    .take(ATTACHMENT_RUNS_RESTORED),
            );
        }
        if runs.is_empty() {
            return (Vec::new(), Ok(String::new()), Vec::new());
        }
        let mut staged = Vec::new();
        let mut note = String::new();
        let mut changed_files = Vec::new();
        for staged_run in &runs {
            let files: Vec<(String, Vec<u8>)> = self
                .shared
                .journal
                .read_session(&self.session_id, staged_run.queued_seq)
                .take(staged_run.attachments.len() + 3)
                .filter_map(Result::ok)
                .filter_map(|record| match record.event {
                    Event::AttachmentAdded {
                        run_id,
                        name,
                        content,
                        ..
                    } if run_id == staged_run.run_id => Some((name, content)),
                    _ => None,
                })
                .collect();
            let kept = agent.keep_uploads && staged_run.run_id != run.run_id;
            let staging = if kept {
                crate::uploads::restage_kept(&agent.cwd, staged_run.run_id.as_str(), &files)
            } else {
                crate::uploads::stage(&agent.cwd, staged_run.run_id.as_str(), &files)
                    .map(|dir| (dir, Vec::new()))
            };
            match staging {
                Ok((_, changed)) => {
                    // Relative to the cwd the harness runs in: no server path is shown.
                    let dir = crate::uploads::run_dir(Path::new(""), staged_run.run_id.as_str());
                    staged.push(staged_run.run_id.clone());
                    let heading = if staged_run.run_id == run.run_id {
                        "Attached files"
                    } else {
                        "Files attached earlier"
                    };
                    note.push_str(&format!("\n\n{heading} (in {}):", dir.display()));
                    for attachment in &staged_run.attachments {
                        let edited = if changed.contains(&attachment.name) {
                            "; changed in the workspace since, left as it is"
                        } else {
                            ""
                        };
                        note.push_str(&format!(
                            "\n- {} ({}, {} bytes{edited})",
                            attachment.name, attachment.media_type, attachment.size
                        ));
                    }
                    changed_files.extend(
                        changed
                            .into_iter()
                            .map(|name| dir.join(name).display().to_string()),
                    );
                }
                Err(error) => {
                    self.remove_staged_in(&agent.cwd, &staged);
                    return (
                        Vec::new(),
                        Err(format!("attachments could not be staged: {error}")),
                        Vec::new(),
                    );
                }
            }
        }
        (staged, Ok(note), changed_files)
    }

    fn remove_staged(&self, staged: &[RunId]) {
        let Some(agent) = self.shared.agents.get(&self.state.session.agent_id) else {
            return;
        };
        if !agent.keep_uploads {
            self.remove_staged_in(&agent.cwd, staged);
        }
    }

    fn remove_staged_in(&self, cwd: &std::path::Path, staged: &[RunId]) {
        for run_id in staged {
            if let Err(error) = crate::uploads::remove(cwd, run_id.as_str()) {
                tracing::warn!(%run_id, %error, "staged attachments not removed");
            }
        }
    }

    /// Appends the events that end a run, then frees the session and ends its streams.
    fn end_run(
        &mut self,
        run_id: RunId,
        terminal: Vec<Event>,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
        ctx: &mut Context<Self>,
    ) {
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        let identity = self.identity(&run_id);
        if let Some(in_flight) = self.in_flight.as_mut().filter(|f| f.run_id == run_id) {
            in_flight.ending = true;
        }
        self.ending.insert(run_id.clone());
        ctx.spawn(
            async move {
                let appended = journal
                    .append(&session_id, Expected::Any, terminal.clone())
                    .await;
                let failure = match appended {
                    Ok(Ok(records)) => return Ok(Ok(records)),
                    Ok(Err(conflict)) => conflict.to_string(),
                    // Certainly not written: a small end takes its place.
                    Err(error @ turnstile_journal::Error::TooLarge { .. }) => error.to_string(),
                    // Perhaps written: the state is read back instead (crash-only).
                    Err(error) => return Err(error),
                };
                // No code path leaves a run open: what could not be journaled is replaced
                // by a small end that says why (the events that fit go with it).
                tracing::error!(run_id = %identity.run_id, %failure, "terminal events not journaled; ending the run with a small terminal record");
                let ending = fallback_ending(&identity, terminal, &failure, journal.max_event_bytes());
                journal.append(&session_id, Expected::Any, ending).await
            }
            .into_actor(self)
                .map(move |result, actor, ctx| {
                    // The slot frees only once the run's end is journaled, so the journal
                    // never shows more runs executing than there are slots.
                    drop(slot);
                    actor.ending.remove(&run_id);
                    if let Some(in_flight) = actor.in_flight.take_if(|f| f.run_id == run_id) {
                        actor.remove_staged(&in_flight.staged);
                    }
                    actor.last_active = Instant::now();
                    let live = actor.shared.remove_live(&run_id);
                    match result {
                        Ok(Ok(records)) => {
                            actor.apply(&records);
                            if let Some(live) = live {
                                broadcast_wire(&live, &records);
                            }
                        }
                        Ok(Err(conflict)) => {
                            tracing::error!(%run_id, %conflict, "terminal event refused");
                            actor.stale = true;
                            actor.heal_later(ctx);
                        }
                        // Even the small end failed: the journal itself is failing, and
                        // start-up recovery ends the run (on a shared journal, the
                        // session's next owner).
                        Err(error) => {
                            tracing::error!(%run_id, %error, "terminal event not journaled");
                            actor.stale = true;
                            actor.check_fenced(&error, ctx);
                            actor.heal_later(ctx);
                        }
                    }
                    actor.pump(ctx);
                }),
        );
    }
}

/// A run's end when its terminal batch could not be journaled: the batch's events that
/// are not an ending and fit a record, up to the first client-visible event that does
/// not (so indexes stay contiguous), then `RunError` and `RunFailed` naming the cause.
fn fallback_ending(
    identity: &RunIdentity,
    terminal: Vec<Event>,
    failure: &str,
    max_event_bytes: usize,
) -> Vec<Event> {
    let mut kept = Vec::new();
    let mut next_index = None;
    let fits = |event: &Event| {
        turnstile_journal::codec::encode_event(event.clone(), max_event_bytes).is_ok()
    };
    for event in terminal {
        if event.is_terminal() {
            continue;
        }
        match &event {
            Event::RunEventEmitted {
                event_index,
                event: run_event,
                ..
            } => {
                let ending = run_event.is_terminal();
                if next_index.is_none() && !ending && fits(&event) {
                    kept.push(event);
                } else if next_index.is_none() {
                    next_index = Some(*event_index);
                }
            }
            _ if fits(&event) => kept.push(event),
            _ => {}
        }
    }
    // The terminal batch always holds its wire ending, so `next_index` is set; without
    // one the end follows the last event kept.
    let index = next_index
        .or_else(|| {
            kept.iter()
                .filter_map(|event| match event {
                    Event::RunEventEmitted { event_index, .. } => Some(event_index.next()),
                    _ => None,
                })
                .max()
        })
        .unwrap_or(EventIndex(0));
    let message = format!("The run's result could not be recorded: {failure}");
    kept.extend(failed_events(
        identity,
        index,
        journal_error_type(failure),
        &message,
        false,
    ));
    kept
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(SESSION_MAILBOX_MESSAGES);
        if self.shared.cluster {
            // One replica writes a session at a time: this actor works on it only while
            // it holds the lease, and loads the session after taking it (another replica
            // may have written since).
            match self.shared.journal.lease(&self.session_id) {
                Ok(turnstile_journal::Lease::Held) => {
                    self.leased = true;
                    // A lapse noticed from now on is a later one.
                    self.leased_before = *self.shared.journal.lapses().borrow() + 1;
                }
                Ok(turnstile_journal::Lease::OwnedBy(owner)) => self.remote = Some(owner),
                Err(error) => {
                    // Commands meanwhile get the error; the next one starts afresh.
                    tracing::error!(session_id = %self.session_id, %error, "session lease unavailable");
                    self.set_broken(&error, ctx);
                    return;
                }
            }
        }
        match reads::load_whole_session(&self.shared.journal, &self.session_id) {
            Ok(state) => self.state = state,
            Err(error) => {
                tracing::error!(session_id = %self.session_id, %error, "session stream unreadable");
                match error {
                    RuntimeError::Journal(error) => self.set_broken(&error, ctx),
                    other => self.broken = Some(other.to_string()),
                }
                return;
            }
        }
        // On a shared journal an idle session gives its lease back at once, so that any
        // replica can take its next turn.
        let idle_after = |shared: &Shared| {
            if shared.cluster {
                Duration::ZERO
            } else {
                shared.session_idle()
            }
        };
        let check_every =
            idle_after(&self.shared)
                .min(Duration::from_secs(5))
                .max(Duration::from_millis(if self.shared.cluster {
                    10
                } else {
                    50
                }));
        ctx.run_interval(check_every, move |actor, ctx| {
            // A stale actor stays to resolve what the failure interrupted (its heal), but
            // on a shared journal it gives the session back: whichever replica takes the
            // session next reads it whole and resolves its open runs.
            let idle_now = actor.in_flight.is_none()
                && (!actor.stale || actor.shared.cluster)
                && actor.queue.is_empty()
                && !actor.electing
                && !actor.compacting
                && !actor.creating;
            if idle_now && actor.last_active.elapsed() >= idle_after(&actor.shared) {
                ctx.stop();
            }
        });
        if self.remote.is_some() {
            return;
        }
        if !self.resolve_open_runs(ctx) {
            self.pump(ctx);
        }
    }

    fn stopped(&mut self, ctx: &mut Self::Context) {
        if self.leased && !self.fenced {
            self.shared.journal.release(&self.session_id);
        }
        self.registry.do_send(Passivated {
            session_id: self.session_id.clone(),
            address: ctx.address(),
        });
    }
}

impl Handler<Wake> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: Wake, _: &mut Self::Context) {}
}

impl Handler<StartRunMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<Accepted, Refused>, RuntimeError>>;

    fn handle(
        &mut self,
        StartRunMsg(command): StartRunMsg,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        let refuse = |refused| -> Self::Result { Box::pin(fut::ready(Ok(Err(refused)))) };
        self.last_active = Instant::now();
        if let Some(owner) = self.remote.clone() {
            return Box::pin(fut::ready(Err(self.elsewhere(&owner, ctx))));
        }
        if let Some(error) = self.broken_error() {
            return Box::pin(fut::ready(Err(error)));
        }
        if let Err(error) = self.ensure_fresh(ctx) {
            return Box::pin(fut::ready(Err(error)));
        }
        if self.compacting && command.multitask == Multitask::Reject {
            return refuse(Refused::Compacting {
                session_id: self.session_id.clone(),
            });
        }
        if command.multitask == Multitask::Reject
            && let Some(run_id) = self.busy_for_a_new_turn()
        {
            return refuse(Refused::Busy {
                session_id: self.session_id.clone(),
                run_id: run_id.clone(),
            });
        }
        let Some(agent) = self.shared.agents.get(&command.agent_id).cloned() else {
            return refuse(Refused::UnknownAgent {
                agent_id: command.agent_id,
            });
        };
        if self.state.exists() && self.state.session.agent_id != agent.id {
            return refuse(Refused::AgentMismatch {
                session_id: self.session_id.clone(),
                agent_id: self.state.session.agent_id.clone(),
            });
        }
        let queued = self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if queued >= self.shared.max_queued_runs {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return refuse(Refused::QueueFull {
                limit: self.shared.max_queued_runs,
            });
        }
        let run_id = RunId::new_v7();
        let mut events = Vec::with_capacity(3);
        // Concurrent first turns: only the first journals the session's creation.
        if !self.state.exists() && !self.creating {
            self.creating = true;
            events.push(Event::SessionCreated {
                agent_id: agent.id.clone(),
                user_id: command.user_id.clone(),
            });
        }
        events.push(Event::RunQueued {
            run_id: run_id.clone(),
            agent_id: agent.id.clone(),
            user_id: command.user_id.clone(),
            input: command.message.clone(),
            options: match &command.fork {
                Some(fork) => {
                    let mut options = command.options.clone();
                    options["fork"] = serde_json::to_value(fork).unwrap_or_default();
                    options.to_string()
                }
                None => command.options.to_string(),
            },
        });
        if let Some(key) = &command.idempotency_key {
            events.push(Event::IdempotencyKeyBound {
                key: key.clone(),
                run_id: run_id.clone(),
            });
        }
        // The bytes go into the journal with the run: any later turn or machine can stage them.
        for attachment in &command.attachments {
            events.push(Event::AttachmentAdded {
                run_id: run_id.clone(),
                name: attachment.name.clone(),
                media_type: attachment.media_type.clone(),
                sha256: crate::uploads::sha256_hex(&attachment.bytes),
                content: attachment.bytes.clone(),
            });
        }
        // The append is queued to the journal here, in the handler, so the journal's
        // order of `RunQueued` is the order of this queue (issue 13: queued from a
        // future polled later, 1,000 concurrent starts ran out of journal order).
        let append =
            match self
                .shared
                .journal
                .append_in_order(&self.session_id, Expected::Any, events)
            {
                Ok(Ok(append)) => append,
                Ok(Err(_full)) => {
                    self.creating = false;
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    return refuse(Refused::QueueFull {
                        limit: turnstile_journal::limits::APPEND_QUEUE_REQUESTS_MAX,
                    });
                }
                Err(error) => {
                    // Nothing of the request was recorded: the session is as before.
                    self.creating = false;
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    if let turnstile_journal::Error::TooLarge { kind, bytes, limit } = error {
                        let field = match kind {
                            "AttachmentAdded" => "files",
                            "IdempotencyKeyBound" => "idempotency_key",
                            _ => "message",
                        };
                        return refuse(Refused::EventTooLarge {
                            field,
                            kind,
                            bytes,
                            limit,
                        });
                    }
                    self.stale = true;
                    self.heal_later(ctx);
                    return Box::pin(fut::ready(Err(RuntimeError::from(error))));
                }
            };
        // Queued before the append returns, so that a concurrent start sees the session busy.
        self.queue.push_back(Queued {
            run_id: run_id.clone(),
            durable: false,
            resume: false,
        });
        let live = self.shared.ensure_live(&run_id).subscribe();
        Box::pin(append.into_actor(self).map(move |result, actor, ctx| {
            actor.creating = false;
            let accepted = match result {
                Ok(Ok(records)) => records,
                failure => {
                    actor.stale = true;
                    actor.heal_later(ctx);
                    actor.queue.retain(|queued| queued.run_id != run_id);
                    actor.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    actor.shared.remove_live(&run_id);
                    return Err(match failure {
                        Err(error) => {
                            actor.check_fenced(&error, ctx);
                            RuntimeError::from(error)
                        }
                        Ok(Err(conflict)) => RuntimeError::Internal(conflict.to_string()),
                        Ok(Ok(_)) => unreachable!("handled above"),
                    });
                }
            };
            actor.apply(&accepted);
            if let Some(queued) = actor
                .queue
                .iter_mut()
                .find(|queued| queued.run_id == run_id)
            {
                queued.durable = true;
            }
            let from_seq = accepted
                .iter()
                .find(|record| matches!(record.event, Event::RunQueued { .. }))
                .map(|record| record.seq)
                .unwrap_or_default();
            actor.pump(ctx);
            Ok(Ok(Accepted {
                run_id,
                live,
                from_seq,
            }))
        }))
    }
}

impl Handler<RunFinishedMsg> for SessionActor {
    type Result = ();

    fn handle(&mut self, RunFinishedMsg(finished): RunFinishedMsg, ctx: &mut Self::Context) {
        self.fold(&finished.records);
        if finished.journal_failed {
            // An append of the run's task failed and what the journal took is unknown:
            // as after a crash, the run is read back from the journal and resolved from
            // there (a new attempt or its end), never from what this actor assumed.
            drop(finished.slot);
            if let Some(in_flight) = self.in_flight.take_if(|f| f.run_id == finished.run_id) {
                self.remove_staged(&in_flight.staged);
            }
            self.shared.remove_live(&finished.run_id);
            if finished.fenced {
                // This replica lost the lease: the session's next owner resolves the run.
                if self.leased && !self.fenced {
                    self.fence(ctx);
                }
                return;
            }
            self.stale = true;
            // Not at once: while the journal refuses everything, a run resumed now would
            // fail again at its first append, in a tight loop.
            self.heal_later(ctx);
            return;
        }
        self.end_run(finished.run_id, finished.terminal, Some(finished.slot), ctx);
    }
}

impl Handler<CancelRunMsg> for SessionActor {
    type Result = Result<bool, RuntimeError>;

    fn handle(
        &mut self,
        CancelRunMsg(run_id): CancelRunMsg,
        ctx: &mut Self::Context,
    ) -> Result<bool, RuntimeError> {
        self.last_active = Instant::now();
        if let Some(owner) = self.remote.clone() {
            return Err(self.elsewhere(&owner, ctx));
        }
        if let Some(error) = self.broken_error() {
            return Err(error);
        }
        self.ensure_fresh(ctx)?;
        if let Some(in_flight) = self.in_flight.as_ref().filter(|f| f.run_id == run_id) {
            in_flight.cancel.cancel();
            return Ok(true);
        }
        let Some(position) = self
            .queue
            .iter()
            .position(|queued| queued.run_id == run_id && queued.durable)
        else {
            return Ok(false);
        };
        // A queued run ends here and never reaches its harness.
        self.queue.remove(position);
        self.shared.queued.fetch_sub(1, Ordering::SeqCst);
        let Some(run) = self.state.run(&run_id).cloned() else {
            return Ok(false);
        };
        let identity = self.identity(&run_id);
        let terminal = cancelled_events(&identity, EventIndex(run.event_count));
        self.end_run(run_id, terminal, None, ctx);
        Ok(true)
    }
}

impl Handler<CompactMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<CompactOutcome, Refused>, RuntimeError>>;

    fn handle(&mut self, _: CompactMsg, ctx: &mut Self::Context) -> Self::Result {
        self.last_active = Instant::now();
        let ready = |outcome| -> Self::Result { Box::pin(fut::ready(outcome)) };
        if let Some(owner) = self.remote.clone() {
            return ready(Err(self.elsewhere(&owner, ctx)));
        }
        if let Some(error) = self.broken_error() {
            return ready(Err(error));
        }
        if let Err(error) = self.ensure_fresh(ctx) {
            return ready(Err(error));
        }
        if let Some(run_id) = self.busy_with() {
            return ready(Ok(Err(Refused::Busy {
                session_id: self.session_id.clone(),
                run_id: run_id.clone(),
            })));
        }
        if self.compacting {
            return ready(Ok(Err(Refused::Compacting {
                session_id: self.session_id.clone(),
            })));
        }
        let no_history = |message: String| CompactOutcome {
            compacted: false,
            status: "no_history",
            message,
            record: None,
        };
        let Some(harness_session_id) = self.state.session.harness_session_id.clone() else {
            return ready(Ok(Ok(no_history(format!(
                "Session {} has no history to compact.",
                self.session_id
            )))));
        };
        let Some(agent) = self
            .shared
            .agents
            .get(&self.state.session.agent_id)
            .cloned()
        else {
            return ready(Ok(Ok(no_history(format!(
                "Session {} belongs to no configured agent.",
                self.session_id
            )))));
        };
        let transcript =
            match reads::transcript(&self.shared.journal, &self.session_id, &harness_session_id) {
                Ok(lines) => lines,
                Err(error) => return ready(Err(error)),
            };
        let request = CompactRequest {
            session_id: self.session_id.clone(),
            harness_session_id: harness_session_id.clone(),
            transcript,
        };
        self.compacting = true;
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        Box::pin(
            async move {
                let outcome = agent.harness.compact(request).await;
                let (lines, summary, replaced_messages) = match outcome {
                    Ok(Compaction::Compacted {
                        lines,
                        summary,
                        replaced_messages,
                    }) => (lines, summary, replaced_messages),
                    Ok(Compaction::NothingToCompact { reason }) => {
                        return Ok((
                            CompactOutcome {
                                compacted: false,
                                status: "nothing_to_compact",
                                message: reason,
                                record: None,
                            },
                            Vec::new(),
                        ));
                    }
                    Err(error) => {
                        return Err(RuntimeError::Internal(format!(
                            "compaction failed: {error}"
                        )));
                    }
                };
                let event = Event::TranscriptCompacted {
                    run_id: None,
                    harness_session_id: harness_session_id.clone(),
                    summary: summary.clone(),
                    replaced_messages,
                    lines,
                };
                let records = journal
                    .append(&session_id, Expected::Any, vec![event])
                    .await?
                    .map_err(|c| RuntimeError::Internal(c.to_string()))?;
                let outcome = CompactOutcome {
                    compacted: true,
                    status: "compacted",
                    message: format!("Compacted {replaced_messages} messages into a summary."),
                    record: Some(json!({
                        "harness_session_id": harness_session_id,
                        "summary": summary,
                        "replaced_messages": replaced_messages,
                    })),
                };
                Ok((outcome, records))
            }
            .into_actor(self)
            .map(|result, actor, ctx| {
                actor.compacting = false;
                if result.is_err() {
                    actor.stale = true;
                    actor.heal_later(ctx);
                }
                let result = result.map(|(outcome, records)| {
                    actor.apply(&records);
                    outcome
                });
                actor.pump(ctx);
                result.map(Ok)
            }),
        )
    }
}

impl Handler<DeleteSessionMsg> for SessionActor {
    type Result = ResponseActFuture<Self, Result<Result<bool, Refused>, RuntimeError>>;

    fn handle(&mut self, _: DeleteSessionMsg, ctx: &mut Self::Context) -> Self::Result {
        self.last_active = Instant::now();
        if let Some(owner) = self.remote.clone() {
            return Box::pin(fut::ready(Err(self.elsewhere(&owner, ctx))));
        }
        if let Some(error) = self.broken_error() {
            return Box::pin(fut::ready(Err(error)));
        }
        if let Err(error) = self.ensure_fresh(ctx) {
            return Box::pin(fut::ready(Err(error)));
        }
        if !self.state.exists() {
            return Box::pin(fut::ready(Ok(Ok(false))));
        }
        if let Some(run_id) = self.busy_with() {
            let refused = Refused::Busy {
                session_id: self.session_id.clone(),
                run_id: run_id.clone(),
            };
            return Box::pin(fut::ready(Ok(Err(refused))));
        }
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        let event = Event::SessionDeleted {
            reason: "deleted through the API".into(),
        };
        Box::pin(
            async move {
                journal
                    .append(&session_id, Expected::Any, vec![event])
                    .await
            }
            .into_actor(self)
            .map(|result, actor, ctx| match result {
                Ok(Ok(records)) => {
                    actor.apply(&records);
                    Ok(Ok(true))
                }
                Ok(Err(conflict)) => {
                    actor.stale = true;
                    actor.heal_later(ctx);
                    Err(RuntimeError::Internal(conflict.to_string()))
                }
                Err(error) => {
                    actor.stale = true;
                    actor.heal_later(ctx);
                    Err(error.into())
                }
            }),
        )
    }
}
