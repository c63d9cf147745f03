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
//!
//! This file holds the actor and its messages; `accept`, `queue`, `end`, `compact` and
//! `delete` handle a turn's life, `fold`, `recovery` and `heal` keep the actor a fold of
//! what is durable, `leases` the shared journal's ownership, `attachments` a turn's files,
//! `shared` what every actor of a runtime shares.

use actix::prelude::*;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use turnstile_journal::limits::SESSION_MAILBOX_MESSAGES;
use turnstile_journal::{Recorded, RunId, Seq, SessionId};

use turnstile_projections::SessionState;

mod accept;
mod approvals;
mod attachments;
mod compact;
mod delete;
mod end;
mod fold;
mod heal;
mod leases;
mod queue;
mod recovery;
mod shared;

pub(crate) use approvals::DecideMsg;
pub(crate) use leases::Fence;
pub(crate) use shared::Shared;

use crate::api::{CompactOutcome, Refused, RuntimeError, StartRun};
use crate::reads;

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
    /// Its `SessionDeleted` is being appended: no turn, compaction or second deletion
    /// may be accepted meanwhile (the fault search found a turn journaled after the
    /// deletion without the session's creation).
    deleting: bool,
    last_active: Instant,
    /// Set when the journal could not be read: the actor refuses work rather than guess.
    broken: Option<String>,
    /// Set when the journal could not be reached to take the lease or load the state:
    /// commands meanwhile get `journal_unavailable`, and the actor stops so the next
    /// command starts afresh.
    unavailable: Option<String>,
    /// A `SessionCreated` is on its way to the journal.
    creating: bool,
    /// The user that `SessionCreated` names (the session's owner once it is durable).
    creator: Option<String>,
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
    /// The session's workspace between turns, with snapshots on (`None`: read from the
    /// journal by the next turn; lent to the run in flight meanwhile).
    workspace: Option<crate::workspace::Tracker>,
    /// A paused run whose decision is being appended: no second decision meanwhile.
    deciding: Option<RunId>,
    /// A run this actor paused, with its pause's event index: until the state has
    /// folded the pause (a record before it may still be on its way here), the run
    /// still holds the session.
    holding: Option<(RunId, turnstile_journal::EventIndex)>,
}

/// A run accepted.
pub(crate) struct Accepted {
    pub run_id: RunId,
    /// Subscribed before any of the events it is shown from was sent.
    pub live: shared::Watch,
    pub from_seq: Seq,
    /// The index its events are shown from (0 for a new run; a continued run's
    /// `RunContinued`).
    pub from_index: turnstile_journal::EventIndex,
}

#[derive(Message)]
#[rtype(result = "Result<Result<Accepted, Refused>, RuntimeError>")]
pub(crate) struct StartRunMsg(pub StartRun);

#[derive(Message)]
#[rtype(result = "Result<bool, RuntimeError>")]
pub(crate) struct CancelRunMsg(pub RunId);

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
            deleting: false,
            last_active: Instant::now(),
            broken: None,
            unavailable: None,
            creating: false,
            creator: None,
            leased: false,
            leased_before: 0,
            remote: None,
            fenced: false,
            unfolded: BTreeMap::new(),
            stale: false,
            healing: false,
            ending: HashSet::new(),
            workspace: None,
            deciding: None,
            holding: None,
        }
    }
}

impl SessionActor {
    /// On a shared journal, stops an idle actor whose run's end gave the session's lease
    /// back: its next turn may be taken by any replica at once.
    pub(super) fn stop_if_given_back(&self, ctx: &mut Context<Self>) {
        if self.shared.cluster && self.idle_now() {
            ctx.stop();
        }
    }

    /// Whether this actor has nothing to do and may stop (giving the session back).
    pub(super) fn idle_now(&self) -> bool {
        // A stale actor stays to resolve what the failure interrupted (its heal), but
        // on a shared journal it gives the session back: whichever replica takes the
        // session next reads it whole and resolves its open runs.
        self.in_flight.is_none()
            && (!self.stale || self.shared.cluster)
            && self.queue.is_empty()
            && !self.electing
            && !self.compacting
            && !self.creating
            // A paused run's actor keeps its session (and, on a shared journal, its
            // lease) and the timer of its approval timeout; an actor that only
            // answers for another replica's session does not.
            && (self.held_paused().is_none() || self.remote.is_some())
            && self.deciding.is_none()
            // A deletion in flight is answered by this actor: stopping now would
            // drop the answer (the caller asks again and hears "no such session")
            // and let a new actor take a turn before the deletion is durable.
            && !self.deleting
    }
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
        // A session the lease found empty has nothing to read (a new session's first turn).
        let loaded = match self.shared.journal.known_empty(&self.session_id) {
            true => Ok(turnstile_projections::SessionState::new(
                self.session_id.clone(),
            )),
            false => reads::load_session(&self.shared.journal, &self.session_id),
        };
        match loaded {
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
            if actor.idle_now() && actor.last_active.elapsed() >= idle_after(&actor.shared) {
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
