//! What a journal shared by replicas adds to [`Journal`]: sessions' leases, the
//! sessions left to take over, and the commands replicas leave for each other. On sled
//! (one process) every lease is this process's and there is nobody to command.

use std::time::Duration;

use super::{Backend, Journal};
use crate::Error;
use crate::ids::{Seq, SessionId};
use crate::types::{Command, Lease};

impl Journal {
    /// Whether other processes may share this journal (PostgreSQL; sessions are leased).
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// This process's id among the replicas (none on sled).
    pub fn replica_id(&self) -> Option<String> {
        match &self.backend {
            Backend::Sled(_) => None,
            Backend::Postgres(pg) => Some(pg.replica_id()),
        }
    }

    /// Takes the session's lease for this replica unless another live replica holds it
    /// (always ours on sled, which one process holds). While held, this replica's
    /// appends carry its fencing token; once lost, they are refused
    /// ([`Error::Fenced`]).
    pub fn lease(&self, session_id: &SessionId) -> Result<Lease, Error> {
        match &self.backend {
            Backend::Sled(_) => Ok(Lease::Held),
            Backend::Postgres(pg) => pg.lease(session_id),
        }
    }

    /// Whether the session's stream is known to hold no records without reading it: on
    /// PostgreSQL, a session whose lease this replica took and found empty, with no
    /// append since (a new session's first turn reads nothing); never on sled, whose
    /// reads are local.
    pub fn known_empty(&self, session_id: &SessionId) -> bool {
        match &self.backend {
            Backend::Sled(_) => false,
            Backend::Postgres(pg) => pg.known_empty(session_id),
        }
    }

    /// Whether this replica holds the session's lease now (always on sled).
    pub fn holds_lease(&self, session_id: &SessionId) -> bool {
        match &self.backend {
            Backend::Sled(_) => true,
            Backend::Postgres(pg) => pg.holds_lease(session_id),
        }
    }

    /// Whether this process's actors saw a session's record at `seq` (before the head
    /// they last appended at; always on sled).
    pub fn seen_here(&self, session_id: &SessionId, seq: Seq) -> bool {
        match &self.backend {
            Backend::Sled(_) => true,
            Backend::Postgres(pg) => pg.seen_here(session_id, seq),
        }
    }

    /// Whether the append that ended the session's last run gave its lease back while an
    /// actor here holds it (never on sled): that actor takes it again ([`Journal::lease`])
    /// and reads the session again before it acts.
    pub fn lease_given_back(&self, session_id: &SessionId) -> bool {
        match &self.backend {
            Backend::Sled(_) => false,
            Backend::Postgres(pg) => pg.lease_given_back(session_id),
        }
    }

    /// Gives a session's lease back (nothing left to do on it here).
    pub fn release(&self, session_id: &SessionId) {
        if let Backend::Postgres(pg) = &self.backend {
            pg.release(session_id);
        }
    }

    /// Sessions with open runs and no live owner (their owner died or stalled past its
    /// lease), at most `limit`: what a replica with free worker slots takes over.
    pub fn claimable(&self, limit: usize) -> Result<Vec<SessionId>, Error> {
        match &self.backend {
            Backend::Sled(_) => Ok(Vec::new()),
            Backend::Postgres(pg) => pg.claimable(limit),
        }
    }

    /// Changes each time this replica's heartbeat lapsed and it lost every lease (never
    /// on sled: the sender is gone at once).
    pub fn lapses(&self) -> tokio::sync::watch::Receiver<u64> {
        match &self.backend {
            Backend::Sled(_) => tokio::sync::watch::channel(0).1,
            Backend::Postgres(pg) => pg.lapses(),
        }
    }

    /// Leaves a command (`enqueue`, `cancel`) for the replica that owns a session.
    pub fn send_command(
        &self,
        session_id: &SessionId,
        owner: &str,
        kind: &str,
        body: String,
    ) -> Result<i64, Error> {
        match &self.backend {
            Backend::Sled(_) => Err(Error::Store("a sled journal has no other replicas".into())),
            Backend::Postgres(pg) => pg.send_command(session_id, owner, kind, body),
        }
    }

    /// Waits for the reply to a command: `None` when it will never run here (not taken
    /// in `timeout`, or its target died).
    pub async fn command_reply(&self, id: i64, timeout: Duration) -> Result<Option<String>, Error> {
        match &self.backend {
            Backend::Sled(_) => Ok(None),
            Backend::Postgres(pg) => pg.reply(id, timeout).await,
        }
    }

    /// Waits at most `timeout` for another replica to leave a command for this one
    /// (LISTEN/NOTIFY; a hint: read [`Journal::take_commands`] either way).
    pub async fn wait_for_commands(&self, timeout: Duration) {
        match &self.backend {
            Backend::Sled(_) => tokio::time::sleep(timeout).await,
            Backend::Postgres(pg) => pg.wait_for_commands(timeout).await,
        }
    }

    /// Waits at most `timeout` for a session's stream to grow (written by any replica;
    /// a hint: read the stream either way).
    pub async fn wait_for_session(&self, session_id: &SessionId, timeout: Duration) {
        match &self.backend {
            Backend::Sled(_) => tokio::time::sleep(timeout).await,
            Backend::Postgres(pg) => pg.wait_for_session(session_id, timeout).await,
        }
    }

    /// Takes the commands other replicas left for this one.
    pub fn take_commands(&self) -> Result<Vec<Command>, Error> {
        match &self.backend {
            Backend::Sled(_) => Ok(Vec::new()),
            Backend::Postgres(pg) => pg.take_commands(),
        }
    }

    /// Answers a command this replica took.
    pub fn answer_command(&self, id: i64, reply: String) -> Result<(), Error> {
        match &self.backend {
            Backend::Sled(_) => Ok(()),
            Backend::Postgres(pg) => pg.answer_command(id, reply),
        }
    }
}
