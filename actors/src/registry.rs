//! The registry: finds a session's actor, creating it on the next arbiter.
//!
//! Sessions are spread round-robin over the arbiter threads; a session's actor lives
//! on one arbiter for its whole life, so its turns never hop threads. A passivated
//! actor is forgotten here, and rebuilt from the journal on its next command.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use turnstile_journal::SessionId;

use crate::session::{Fence, Passivated, SessionActor, Shared, Wake};

pub(crate) struct Registry {
    shared: Arc<Shared>,
    arbiters: Vec<ArbiterHandle>,
    next_arbiter: usize,
    sessions: HashMap<SessionId, Addr<SessionActor>>,
    /// A round of [`crate::memory::release`] is scheduled.
    release_scheduled: bool,
}

impl Registry {
    pub(crate) fn new(shared: Arc<Shared>, arbiters: Vec<ArbiterHandle>) -> Self {
        Registry {
            shared,
            arbiters,
            next_arbiter: 0,
            sessions: HashMap::new(),
            release_scheduled: false,
        }
    }
}

impl Actor for Registry {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "Addr<SessionActor>")]
pub(crate) struct GetSession(pub SessionId);

/// Creates the session's actor if it is not in memory (start-up recovery).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct WakeSession(pub SessionId);

impl Handler<WakeSession> for Registry {
    type Result = ();

    fn handle(&mut self, WakeSession(session_id): WakeSession, ctx: &mut Self::Context) {
        let address = <Self as Handler<GetSession>>::handle(self, GetSession(session_id), ctx).0;
        address.do_send(Wake);
    }
}

/// This replica lost every lease it held before its heartbeat's lapse number `.0`:
/// every session actor that took its lease before that lapse stops its turn and writes
/// nothing more (one that took it since, under the new registration, goes on).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct FenceAll(pub u64);

impl Handler<FenceAll> for Registry {
    type Result = ();

    fn handle(&mut self, FenceAll(lapse): FenceAll, _: &mut Self::Context) {
        for address in self.sessions.values() {
            address.do_send(Fence(lapse));
        }
    }
}

/// How many session actors are alive.
#[derive(Message)]
#[rtype(result = "usize")]
pub(crate) struct CountSessions;

impl Handler<GetSession> for Registry {
    type Result = MessageResult<GetSession>;

    fn handle(
        &mut self,
        GetSession(session_id): GetSession,
        ctx: &mut Self::Context,
    ) -> Self::Result {
        if let Some(address) = self.sessions.get(&session_id)
            && address.connected()
        {
            return MessageResult(address.clone());
        }
        let arbiter = &self.arbiters[self.next_arbiter % self.arbiters.len()];
        self.next_arbiter = self.next_arbiter.wrapping_add(1);
        let shared = self.shared.clone();
        let registry = ctx.address().recipient();
        let id = session_id.clone();
        let address = SessionActor::start_in_arbiter(arbiter, move |_| {
            SessionActor::new(id, shared, registry)
        });
        self.sessions.insert(session_id, address.clone());
        MessageResult(address)
    }
}

impl Handler<Passivated> for Registry {
    type Result = ();

    fn handle(&mut self, passivated: Passivated, ctx: &mut Self::Context) {
        // Only forget the actor that stopped, not a newer one for the same session.
        if self
            .sessions
            .get(&passivated.session_id)
            .is_some_and(|known| *known == passivated.address)
        {
            self.sessions.remove(&passivated.session_id);
            // After a burst the map would keep room for every actor it ever held.
            if self.sessions.capacity() > 4 * self.sessions.len() + 1024 {
                self.sessions.shrink_to_fit();
            }
        }
        if !self.release_scheduled {
            self.release_scheduled = true;
            ctx.run_later(crate::memory::RELEASE_AFTER, |registry, _| {
                registry.release_scheduled = false;
                crate::memory::release(&registry.shared, &registry.arbiters);
            });
        }
    }
}

impl Handler<CountSessions> for Registry {
    type Result = usize;

    fn handle(&mut self, _: CountSessions, _: &mut Self::Context) -> usize {
        self.sessions.len()
    }
}
