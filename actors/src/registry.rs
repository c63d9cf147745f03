//! The registry: finds a session's actor, creating it on the next arbiter.
//!
//! Sessions are spread round-robin over the arbiter threads; a session's actor lives
//! on one arbiter for its whole life, so its turns never hop threads.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use turnstile_journal::SessionId;

use crate::session::{SessionActor, Shared};

pub(crate) struct Registry {
    shared: Arc<Shared>,
    arbiters: Vec<ArbiterHandle>,
    next_arbiter: usize,
    sessions: HashMap<SessionId, Addr<SessionActor>>,
}

impl Registry {
    pub(crate) fn new(shared: Arc<Shared>, arbiters: Vec<ArbiterHandle>) -> Self {
        Registry {
            shared,
            arbiters,
            next_arbiter: 0,
            sessions: HashMap::new(),
        }
    }
}

impl Actor for Registry {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "Addr<SessionActor>")]
pub(crate) struct GetSession(pub SessionId);

impl Handler<GetSession> for Registry {
    type Result = MessageResult<GetSession>;

    fn handle(
        &mut self,
        GetSession(session_id): GetSession,
        _: &mut Self::Context,
    ) -> Self::Result {
        if let Some(address) = self.sessions.get(&session_id) {
            if address.connected() {
                return MessageResult(address.clone());
            }
        }
        let arbiter = &self.arbiters[self.next_arbiter % self.arbiters.len()];
        self.next_arbiter = self.next_arbiter.wrapping_add(1);
        let shared = self.shared.clone();
        let id = session_id.clone();
        let address =
            SessionActor::start_in_arbiter(arbiter, move |_| SessionActor::new(id, shared));
        self.sessions.insert(session_id, address.clone());
        MessageResult(address)
    }
}
