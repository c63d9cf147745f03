//! [`Journal`], the type everyone names, over a storage backend.
//!
//! The backend is sled (embedded, one process: the default) or PostgreSQL (shared by
//! replicas), as a [`JournalConfig`] names it. What is the same on every backend lives here or in the modules
//! this one calls (the record codec, subscriptions, the neutral checks); each backend
//! stores records, keeps its indexes and answers reads.

use std::path::Path;

use crate::Error;
use crate::event::Event;
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::limits;
use crate::pg::{PgJournal, PostgresOptions};
use crate::sled::SledJournal;
use crate::types::{
    AgentRun, AppendQueueFull, AppendResult, Expected, Hashing, JournalOptions, QueuedAppend,
    Recorded, Records, SessionEntry, SessionEvent, SessionEvents, StatsSnapshot,
};
use crate::verify::{Corruption, VerifyReport};

mod replicas;

/// A session's next sequence and one of its stored projections, if there is one.
pub type HeadAndProjection = (Seq, Option<Vec<u8>>);

/// The event journal: cheap to clone, one per data directory (or database) per process.
#[derive(Clone)]
pub struct Journal {
    backend: Backend,
    /// Faults injected by a test (the `faults` feature only).
    #[cfg(feature = "faults")]
    faults: Option<std::sync::Arc<dyn crate::faults::Faults>>,
}

#[derive(Clone)]
enum Backend {
    Sled(SledJournal),
    Postgres(PgJournal),
}

impl Journal {
    /// Opens (or creates) the sled journal in `dir`. Fails with [`Error::Locked`] when
    /// another process holds it.
    pub fn open(dir: &Path, options: JournalOptions) -> Result<Journal, Error> {
        Ok(Journal {
            backend: Backend::Sled(SledJournal::open(dir, options)?),
            #[cfg(feature = "faults")]
            faults: crate::faults::at(&dir.display().to_string()),
        })
    }

    /// Connects to (and creates or migrates) the PostgreSQL journal at `options.url`,
    /// which several processes may share.
    pub fn open_postgres(
        options: &PostgresOptions,
        journal_options: JournalOptions,
    ) -> Result<Journal, Error> {
        Ok(Journal {
            backend: Backend::Postgres(PgJournal::open(options, &journal_options)?),
            #[cfg(feature = "faults")]
            faults: crate::faults::at(&options.url),
        })
    }

    /// Where the journal is: its data directory, or the database (without a password).
    pub fn location(&self) -> String {
        match &self.backend {
            Backend::Sled(sled) => sled.path().display().to_string(),
            Backend::Postgres(pg) => pg.describe().to_owned(),
        }
    }

    /// A writer of imports into this journal while it is open, for a backend that
    /// takes them (a database); a sled journal is imported into a new directory.
    pub(crate) fn import_sink(&self) -> Option<Box<dyn crate::portable::ImportSink>> {
        match &self.backend {
            Backend::Postgres(pg) => Some(Box::new(crate::pg::PgImport::new(pg.clone()))),
            Backend::Sled(_) => None,
        }
    }

    /// Counters since the journal was opened.
    pub fn stats(&self) -> StatsSnapshot {
        match &self.backend {
            Backend::Sled(sled) => sled.stats(),
            Backend::Postgres(pg) => pg.stats(),
        }
    }

    /// Appends `events` to the session's stream, atomically, and returns once they are
    /// durable. The outer error is a fault; the inner one a sequence conflict.
    pub async fn append(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        #[cfg(feature = "faults")]
        if let Some(faults) = &self.faults {
            use crate::faults::Fault;
            let fault = faults.before_append(session_id, &events);
            if fault == Fault::Refuse {
                return Err(crate::faults::refused());
            }
            let answer = self.append_now(session_id, expected, events).await;
            return match fault {
                Fault::WriteThenRefuse => Err(crate::faults::refused()),
                Fault::Delay(delay) => {
                    tokio::time::sleep(delay).await;
                    answer
                }
                _ => answer,
            };
        }
        self.append_now(session_id, expected, events).await
    }

    async fn append_now(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        match &self.backend {
            Backend::Sled(sled) => sled.append(session_id, expected, events).await,
            Backend::Postgres(pg) => pg.append(session_id, expected, events).await,
        }
    }

    /// [`Journal::append`], but the request is queued before this returns, so appends
    /// made one after the other (by one actor, say) are journaled in that order,
    /// whenever their futures are polled. With the append queue full
    /// ([`limits::APPEND_QUEUE_REQUESTS_MAX`] requests waiting) the append is
    /// refused rather than queued out of order.
    pub fn append_in_order(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> Result<Result<QueuedAppend, AppendQueueFull>, Error> {
        #[cfg(feature = "faults")]
        if let Some(faults) = &self.faults {
            use crate::faults::Fault;
            let fault = faults.before_append(session_id, &events);
            if fault == Fault::Refuse {
                return Ok(Ok(Box::pin(async { Err(crate::faults::refused()) })));
            }
            let queued = match self.append_in_order_now(session_id, expected, events)? {
                Ok(queued) => queued,
                Err(full) => return Ok(Err(full)),
            };
            return Ok(Ok(Box::pin(async move {
                let answer = queued.await;
                match fault {
                    Fault::WriteThenRefuse => Err(crate::faults::refused()),
                    Fault::Delay(delay) => {
                        tokio::time::sleep(delay).await;
                        answer
                    }
                    _ => answer,
                }
            })));
        }
        self.append_in_order_now(session_id, expected, events)
    }

    fn append_in_order_now(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> Result<Result<QueuedAppend, AppendQueueFull>, Error> {
        match &self.backend {
            Backend::Sled(sled) => Ok(sled
                .append_in_order(session_id, expected, events)?
                .map(|queued| Box::pin(queued) as QueuedAppend)),
            Backend::Postgres(pg) => Ok(pg
                .append_in_order(session_id, expected, events)?
                .map(|queued| Box::pin(queued) as QueuedAppend)),
        }
    }

    /// [`Journal::append`] for threads outside an async runtime.
    pub fn append_blocking(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        #[cfg(feature = "faults")]
        if let Some(faults) = &self.faults {
            use crate::faults::Fault;
            let fault = faults.before_append(session_id, &events);
            if fault == Fault::Refuse {
                return Err(crate::faults::refused());
            }
            let answer = match &self.backend {
                Backend::Sled(sled) => sled.append_blocking(session_id, expected, events),
                Backend::Postgres(pg) => pg.append_blocking(session_id, expected, events),
            };
            return match fault {
                Fault::WriteThenRefuse => Err(crate::faults::refused()),
                Fault::Delay(delay) => {
                    std::thread::sleep(delay);
                    answer
                }
                _ => answer,
            };
        }
        match &self.backend {
            Backend::Sled(sled) => sled.append_blocking(session_id, expected, events),
            Backend::Postgres(pg) => pg.append_blocking(session_id, expected, events),
        }
    }

    /// Whether the journal can write now: `Err` ([`Error::unavailable`] says why) while
    /// its database does not answer, its disk is full or read-only, or after a failed
    /// write. What `GET /health` answers from; bounded (one `statvfs`, or one query with
    /// the pool's timeouts).
    pub fn writable(&self) -> Result<(), Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.writable(),
            Backend::Postgres(pg) => pg.writable(),
        }
    }

    /// Encoded bytes of one event at most (`JournalOptions::max_event_bytes`).
    pub fn max_event_bytes(&self) -> usize {
        match &self.backend {
            Backend::Sled(sled) => sled.max_event_bytes(),
            Backend::Postgres(pg) => pg.max_event_bytes(),
        }
    }

    /// The position the next durable record will get (= number of records).
    pub fn next_pos(&self) -> JournalPos {
        match &self.backend {
            Backend::Sled(sled) => sled.next_pos(),
            Backend::Postgres(pg) => pg.next_pos(),
        }
    }

    /// Reads one record by global position.
    pub fn get(&self, pos: JournalPos) -> Result<Option<Recorded>, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.get(pos),
            Backend::Postgres(pg) => pg.get(pos),
        }
    }

    /// One session's stream from `from` on, in order.
    pub fn read_session(&self, session_id: &SessionId, from: Seq) -> Records {
        self.session_records(session_id, from, Hashing::Compute)
    }

    /// One session's events from `from` on, in order, without the records' hashes
    /// (what a stream of a run's events reads; see [`SessionEvent`]).
    pub fn read_session_events(&self, session_id: &SessionId, from: Seq) -> SessionEvents {
        Box::new(
            self.session_records(session_id, from, Hashing::Skip)
                .map(|record| record.map(SessionEvent::from)),
        )
    }

    fn session_records(&self, session_id: &SessionId, from: Seq, hashing: Hashing) -> Records {
        match &self.backend {
            Backend::Sled(sled) => Box::new(sled.read_session(session_id, from, hashing)),
            Backend::Postgres(pg) => Box::new(pg.read_session(session_id, from, hashing)),
        }
    }

    /// The whole journal from `from` on, in global order.
    pub fn read_from(&self, from: JournalPos) -> Records {
        match &self.backend {
            Backend::Sled(sled) => Box::new(sled.read_from(from)),
            Backend::Postgres(pg) => Box::new(pg.read_from(from)),
        }
    }

    /// The next sequence of a session's stream (0 for a session with no events).
    pub fn session_next_seq(&self, session_id: &SessionId) -> Result<Seq, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.session_next_seq(session_id),
            Backend::Postgres(pg) => pg.session_next_seq(session_id),
        }
    }

    /// The next sequence of a session's stream as committed (PostgreSQL: its head row);
    /// equal to [`Journal::session_next_seq`], every committed record being readable.
    pub fn session_committed_seq(&self, session_id: &SessionId) -> Result<Seq, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.session_next_seq(session_id),
            Backend::Postgres(pg) => pg.session_committed_seq(session_id),
        }
    }

    /// The session a run belongs to, if the run was ever queued.
    pub fn session_of_run(&self, run_id: &RunId) -> Result<Option<SessionId>, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.session_of_run(run_id),
            Backend::Postgres(pg) => pg.session_of_run(run_id),
        }
    }

    /// A session's runs, oldest first, with the sequence each was queued at (none of a
    /// deleted session's; a session id used again lists only its new runs).
    pub fn session_runs(&self, session_id: &SessionId) -> Result<Vec<(Seq, RunId)>, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.session_runs(session_id),
            Backend::Postgres(pg) => pg.session_runs(session_id),
        }
    }

    /// How many runs an agent has with each status, in [`crate::IndexedStatus`] order
    /// (kept as runs change; counts runs applied and not yet durable too).
    pub fn agent_run_counts(&self, agent_id: &str) -> [u64; 6] {
        match &self.backend {
            Backend::Sled(sled) => sled.agent_run_counts(agent_id),
            Backend::Postgres(pg) => pg.agent_run_counts(agent_id),
        }
    }

    /// An agent's runs in the order they were queued (newest first when `newest_first`),
    /// from the run index (no stream is read), with each run's status; none of a deleted
    /// session's.
    pub fn agent_runs(
        &self,
        agent_id: &str,
        newest_first: bool,
    ) -> Box<dyn Iterator<Item = Result<AgentRun, Error>> + Send> {
        match &self.backend {
            Backend::Sled(sled) => Box::new(sled.agent_runs(agent_id, newest_first)),
            Backend::Postgres(pg) => Box::new(pg.agent_runs(agent_id, newest_first)),
        }
    }

    /// Runs that have been queued and have not ended, with their sessions: what
    /// recovery must resolve after a restart.
    pub fn open_runs(&self) -> Result<Vec<(RunId, SessionId)>, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.open_runs(),
            Backend::Postgres(pg) => pg.open_runs(),
        }
    }

    /// Every session that exists (created and not deleted), in id order.
    pub fn sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.sessions(),
            Backend::Postgres(pg) => pg.sessions(),
        }
    }

    /// The run an idempotency key was bound to, if any.
    pub fn run_of_idempotency_key(&self, key: &str) -> Result<Option<RunId>, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.run_of_idempotency_key(key),
            Backend::Postgres(pg) => pg.run_of_idempotency_key(key),
        }
    }

    /// The live feed of durable records, as each backend publishes them.
    pub(crate) fn live(&self) -> tokio::sync::broadcast::Receiver<std::sync::Arc<Recorded>> {
        match &self.backend {
            Backend::Sled(sled) => sled.live(),
            Backend::Postgres(pg) => pg.live(),
        }
    }

    /// Stores a projection (derived data, rebuildable from the events: written without
    /// a sync; `journal rebuild` compares it with a fresh fold).
    pub fn put_projection(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        #[cfg(feature = "faults")]
        if let Some(faults) = &self.faults
            && !faults.projection_allowed()
        {
            return Err(crate::faults::refused());
        }
        match &self.backend {
            Backend::Sled(sled) => sled.put_projection(key, value),
            Backend::Postgres(pg) => pg.put_projection(key, value),
        }
    }

    /// A stored projection.
    pub fn get_projection(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.get_projection(key),
            Backend::Postgres(pg) => pg.get_projection(key),
        }
    }

    /// Each session's next sequence and the projection under `key_prefix` + its id, in
    /// the order asked: on PostgreSQL one round trip for them all (a replica's start
    /// reads every session's stored form this way).
    pub fn heads_and_projections(
        &self,
        session_ids: &[SessionId],
        key_prefix: &str,
    ) -> Result<Vec<HeadAndProjection>, Error> {
        match &self.backend {
            Backend::Sled(sled) => session_ids
                .iter()
                .map(|session_id| {
                    Ok((
                        sled.session_next_seq(session_id)?,
                        sled.get_projection(&format!("{key_prefix}{session_id}"))?,
                    ))
                })
                .collect(),
            Backend::Postgres(pg) => pg.heads_and_projections(session_ids, key_prefix),
        }
    }

    /// Every stored projection, in key order.
    pub fn projections(&self) -> Result<Vec<(String, Vec<u8>)>, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.projections(),
            Backend::Postgres(pg) => pg.projections(),
        }
    }

    /// Checks every record; `progress` is called with the number of records checked so
    /// far, every few thousand records. The outer error is an I/O fault. Appends made
    /// while it runs are checked as far as the walk reaches them. This is the journal's
    /// integrity (checksums, hash links, indexes) for any events; `journal verify` also
    /// checks the runtime's structural rules ([`Journal::check_structure`]).
    pub fn verify(
        &self,
        progress: impl FnMut(u64),
    ) -> Result<Result<VerifyReport, Corruption>, Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.verify(progress),
            Backend::Postgres(pg) => pg.verify(progress),
        }
    }

    /// The structural rules of the runtime's journal ([`crate::structure`]) over the
    /// records below position `end` (what a [`Journal::verify`] checked): the first
    /// record that breaks one. One walk in global order; memory: each open run's
    /// state and each ended run's id.
    pub fn check_structure(
        &self,
        end: u64,
        mut progress: impl FnMut(u64),
    ) -> Result<Result<(), Corruption>, Error> {
        let mut structure = crate::structure::Structure::default();
        for record in self.read_from(JournalPos(0)) {
            let record = record?;
            if record.pos.0 >= end {
                break;
            }
            if let Err(corruption) = structure.check(&record) {
                return Ok(Err(corruption));
            }
            if (record.pos.0 + 1).is_multiple_of(4096) {
                progress(record.pos.0 + 1);
            }
        }
        progress(end);
        Ok(Ok(()))
    }

    /// Frees what the embedded store retired and has not freed yet (sled's epoch-based
    /// reclamation leaves tens of MiB after a burst of 100,000 sessions). Bounded work:
    /// [`limits::GARBAGE_FLUSHES_MAX`](limits::GARBAGE_FLUSHES_MAX) flushes (~0.1 ms).
    /// Nothing to do on PostgreSQL.
    pub fn release_garbage(&self) {
        if let Backend::Sled(_) = &self.backend {
            for _ in 0..limits::GARBAGE_FLUSHES_MAX {
                crossbeam_epoch::pin().flush();
            }
        }
    }

    /// Makes `call` on sled's committer thread after what is queued there (the runtime's
    /// `release_memory`: the allocator's collect). Nothing on PostgreSQL.
    pub fn call_on_writer_threads(&self, call: fn()) {
        if let Backend::Sled(sled) = &self.backend {
            sled.call_on_committer(call);
        }
    }

    /// Stops accepting appends after answering every queued one, and flushes.
    pub fn close(&self) -> Result<(), Error> {
        match &self.backend {
            Backend::Sled(sled) => sled.close(),
            Backend::Postgres(pg) => pg.close(),
        }
    }
}
