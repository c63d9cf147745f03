//! The sled backend, the embedded default: one process, one data directory.
//! This file opens the store and answers the journal's calls; `keys` holds the layout,
//! `indexes` the secondary indexes, `committer` and `syncer` the group commit, `reads`
//! the readers, `disk` the disk gate and `verify` the whole-journal walk.
//!
//! Layout, all in one sled tree so that one `apply_batch` is atomic across keys:
//! `L` + first position (u64 BE) holds a segment: every record of one group commit,
//! with the manifest that says whose they are, so a group commit writes one sled key
//! however many appenders it serves (sled's cost is per key: a key per record, scattered
//! over the sessions, ran at 0.65-0.75 of a sequential-key ceiling). `I` + session id +
//! `0x00` + first seq (u64 BE) holds a chunk of the session index: runs of the
//! session's records and their positions (up to [`limits::SESSION_INDEX_CHUNK_RUNS`]
//! a chunk). The committer writes the index for the
//! records of the last [`limits::SESSION_INDEX_FLUSH_MS`] in one go, with `W` (the
//! position below which the index is complete) in the same atomic batch; records past
//! `W` are found through an in-memory tail that opening rebuilds from the segments.
//! `R` + run id + `0x00` holds the run's session; `O`, `N`, `K` the open runs,
//! sessions and idempotency keys.
//!
//! One committer thread owns sequence assignment and hash links: it takes every
//! waiting append request, applies them as one atomic sled batch and flushes it; a
//! sync thread then `fdatasync`s sled's log file and answers them all (group commit).
//! Appenders encode their events before queueing, so the committer only adds record
//! headers. sled's `flush` alone is only `sync_file_range` on
//! Linux, which does not survive a power loss.
//! The backend does not interpret events beyond the index rules of `chain`.

use crate::codec::Run;
use crate::event::Event;
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::sled::committer::{Committer, Job, Request};
use crate::sled::disk::storage_gate;
use crate::sled::indexes::StagedRuns;
use crate::sled::indexes::{AgentRunCounts, count_agent_runs};
use crate::sled::keys::log_key;
use crate::sled::keys::{
    LAYOUT_1_STREAM, LOG, OPEN, PROJECTIONS, SESSION, agent_runs_prefix, be_u64, decode_run_value,
    decode_session_entry, idempotency_key, run_key, session_runs_prefix, stored_id,
};
use crate::sled::reads::{
    LogReader, SessionReader, last_run, parse_segment, rebuild_tail, record_in, segment_at,
    session_runs,
};
use crate::sled::syncer::Syncer;
use crate::types::{Hashing, JournalStats};
use crate::{
    AgentRun, AppendQueueFull, AppendResult, Error, Expected, IndexedStatus, JournalOptions,
    Recorded, SessionEntry, StatsSnapshot, limits,
};
pub(crate) use import::SledImport;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::{broadcast, mpsc};

mod committer;
mod disk;
mod import;
mod indexes;
pub(crate) mod keys;
mod reads;
mod syncer;
mod verify;

struct Inner {
    stats: Arc<JournalStats>,
    path: PathBuf,
    tree: sled::Tree,
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    committer: Mutex<Option<JoinHandle<()>>>,
    live: broadcast::Sender<Arc<Recorded>>,
    next_pos: Arc<AtomicU64>,
    tail: Arc<RwLock<Tail>>,
    db: sled::Db,
    /// Runs per agent and status, as the run index holds them.
    agent_run_counts: AgentRunCounts,
    max_event_bytes: usize,
    /// Set when a write or a sync failed: the journal stopped (fail-stop).
    failed: Arc<std::sync::atomic::AtomicBool>,
}

/// The session index of the records past the watermark `W`: one run per append
/// request, by session. The committer adds to it before a batch is applied and empties
/// it once the batch that writes it to the index is applied; readers take it before
/// the index, so a run moving from one to the other is seen at least once.
#[derive(Default)]
pub(crate) struct Tail {
    runs: HashMap<SessionId, Vec<Run>>,
    len: usize,
}

/// The sled backend of the event journal: cheap to clone, one per data directory per
/// process.
#[derive(Clone)]
pub(crate) struct SledJournal {
    inner: Arc<Inner>,
}

/// Opens sled, waiting briefly while the lock is held: sled releases its file lock
/// only when its background threads let go of the file, shortly after the last handle
/// of an earlier open in this process is dropped.
pub(crate) fn open_sled(dir: &Path, options: &JournalOptions) -> Result<sled::Db, Error> {
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(limits::LOCK_WAIT_MS);
    loop {
        let opened = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_bytes)
            .segment_size(limits::SLED_SEGMENT_BYTES)
            .flush_every_ms(Some(limits::SLED_FLUSH_EVERY_MS))
            .mode(sled::Mode::HighThroughput)
            .open();
        match opened {
            Ok(db) => return Ok(db),
            // sled wraps the lock's WouldBlock in an error of its own wording.
            Err(sled::Error::Io(io))
                if io.kind() == std::io::ErrorKind::WouldBlock
                    || io.to_string().contains("could not acquire lock") =>
            {
                if std::time::Instant::now() >= deadline {
                    return Err(Error::Locked {
                        path: dir.display().to_string(),
                    });
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(other) => return Err(other.into()),
        }
    }
}

impl SledJournal {
    /// Opens (or creates) the journal in `dir`. Fails with [`Error::Locked`] when
    /// another process holds it.
    pub fn open(dir: &Path, options: JournalOptions) -> Result<SledJournal, Error> {
        std::fs::create_dir_all(dir)?;
        let db = open_sled(dir, &options)?;
        let tree = db.open_tree("journal")?;
        // sled keeps its log in the `db` file: this is what fdatasync must reach.
        let db_file = File::open(dir.join("db"))?;
        // The directory entries of sled's files must survive a power loss too.
        File::open(dir)?.sync_all()?;
        if tree.scan_prefix([LAYOUT_1_STREAM]).next().is_some() {
            return Err(Error::Store(format!(
                "{} holds a journal in layout 1 (records under per-session keys), which this build does not read",
                dir.display()
            )));
        }
        let next_pos = end_of_log(&tree)?;
        let tail = Arc::new(RwLock::new(rebuild_tail(&tree)?));
        let next_pos = Arc::new(AtomicU64::new(next_pos));
        let (live, _) = broadcast::channel(limits::LIVE_BROADCAST_RECORDS);
        let (sender, receiver) = mpsc::channel(limits::APPEND_QUEUE_REQUESTS_MAX);
        let sync_failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sync_failed_flag = sync_failed.clone();
        let (sync_sender, sync_receiver) = std::sync::mpsc::sync_channel(1);
        let stats = Arc::new(JournalStats::default());
        let syncer = Syncer {
            stats: stats.clone(),
            db_file,
            blobs_dir: dir.join("blobs"),
            synced_blobs: HashSet::new(),
            durable_pos: next_pos.clone(),
            live: live.clone(),
            last_sync_us: 0,
        };
        let agent_run_counts: AgentRunCounts = Arc::new(Mutex::new(count_agent_runs(&tree)?));
        let committer = Committer {
            tree: tree.clone(),
            staged_runs: StagedRuns::default(),
            agent_run_counts: agent_run_counts.clone(),
            tail: tail.clone(),
            index_written: Instant::now(),
            heads: HashMap::new(),
            next_pos: next_pos.load(Ordering::SeqCst),
            stopped: false,
            syncer_db: db.clone(),
            syncer: sync_sender,
            sync_failed: sync_failed.clone(),
            dir: dir.to_path_buf(),
        };
        let sync_thread = std::thread::Builder::new()
            .name("journal-sync".into())
            .spawn(move || syncer.run(sync_receiver, sync_failed))?;
        let handle = std::thread::Builder::new()
            .name("journal-commit".into())
            .spawn(move || {
                committer.run(receiver);
                // The committer dropped its sender: the sync thread answers what is left, then ends.
                let _ = sync_thread.join();
            })?;
        Ok(SledJournal {
            inner: Arc::new(Inner {
                stats,
                path: dir.to_path_buf(),
                tree,
                sender: Mutex::new(Some(sender)),
                committer: Mutex::new(Some(handle)),
                live,
                next_pos,
                tail,
                db,
                max_event_bytes: options.max_event_bytes.min(limits::EVENT_BYTES_CEILING),
                agent_run_counts,
                failed: sync_failed_flag,
            }),
        })
    }

    /// Whether an append can be written now: `Err` (unavailable) after a failed write,
    /// or while the disk is full or read-only.
    pub fn writable(&self) -> Result<(), Error> {
        if self.inner.failed.load(Ordering::SeqCst) {
            return Err(Error::Stopped);
        }
        storage_gate(&self.inner.path, 0)
    }

    /// Counters since the journal was opened.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot(self.next_pos().0)
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn sender(&self) -> Result<mpsc::Sender<Job>, Error> {
        self.inner
            .sender
            .lock()
            .map_err(|_| Error::Stopped)?
            .clone()
            .ok_or(Error::Stopped)
    }

    /// Appends `events` to the session's stream, atomically, and returns once they are
    /// durable. The outer error is a fault; the inner one a sequence conflict.
    pub async fn append(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        let (request, answer) =
            Request::new(session_id, expected, events, self.inner.max_event_bytes)?;
        self.sender()?
            .send(Job::Append(request))
            .await
            .map_err(|_| Error::Stopped)?;
        answer.await.map_err(|_| Error::Stopped)?
    }

    /// [`SledJournal::append`], but the request is queued before this returns, so appends
    /// made one after the other (by one actor, say) are journaled in that order,
    /// whenever their futures are polled. With the append queue full
    /// ([`limits::APPEND_QUEUE_REQUESTS_MAX`] requests waiting) the append is refused
    /// rather than queued out of order.
    pub fn append_in_order(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> Result<
        Result<impl std::future::Future<Output = AppendResult> + Send + 'static, AppendQueueFull>,
        Error,
    > {
        let (request, answer) =
            Request::new(session_id, expected, events, self.inner.max_event_bytes)?;
        match self.sender()?.try_send(Job::Append(request)) {
            Ok(()) => Ok(Ok(async move { answer.await.map_err(|_| Error::Stopped)? })),
            Err(mpsc::error::TrySendError::Full(_)) => Ok(Err(AppendQueueFull)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Error::Stopped),
        }
    }

    /// [`SledJournal::append`] for threads outside an async runtime.
    pub fn append_blocking(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        let (request, answer) =
            Request::new(session_id, expected, events, self.inner.max_event_bytes)?;
        self.sender()?
            .blocking_send(Job::Append(request))
            .map_err(|_| Error::Stopped)?;
        answer.blocking_recv().map_err(|_| Error::Stopped)?
    }

    /// Encoded bytes of one event at most (`JournalOptions::max_event_bytes`).
    pub fn max_event_bytes(&self) -> usize {
        self.inner.max_event_bytes
    }

    /// The position the next durable record will get (= number of records).
    pub fn next_pos(&self) -> JournalPos {
        JournalPos(self.inner.next_pos.load(Ordering::SeqCst))
    }

    /// Reads one record by global position.
    pub fn get(&self, pos: JournalPos) -> Result<Option<Recorded>, Error> {
        if pos >= self.next_pos() {
            return Ok(None);
        }
        match segment_at(&self.inner.tree, pos)? {
            None => Ok(None),
            Some((first_pos, segment)) => {
                record_in(&self.inner.tree, &segment, first_pos, pos, Hashing::Compute).map(Some)
            }
        }
    }

    /// One session's stream from `from` on, in order, each record's hash computed or
    /// not.
    pub(crate) fn read_session(
        &self,
        session_id: &SessionId,
        from: Seq,
        hashing: Hashing,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + use<> {
        // Records applied but not yet synced are not shown: nobody sees an event
        // before it is durable.
        let durable = self.next_pos();
        let (runs, failed) =
            match session_runs(&self.inner.tree, &self.inner.tail, session_id, from) {
                Ok(runs) => (runs, None),
                Err(error) => (Vec::new(), Some(error)),
            };
        SessionReader {
            tree: self.inner.tree.clone(),
            stats: self.inner.stats.clone(),
            session_id: session_id.clone(),
            runs: runs.into_iter(),
            current: None,
            segment: None,
            next_seq: from,
            durable,
            failed,
            done: false,
            hashing,
        }
    }

    /// The whole journal from `from` on, in global order.
    pub fn read_from(
        &self,
        from: JournalPos,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + use<> {
        // Start at the segment that holds `from`, which may begin before it.
        let start = match self
            .inner
            .tree
            .range(log_key(JournalPos(0))..=log_key(from))
            .next_back()
        {
            Some(Ok((key, _))) => JournalPos(be_u64(&key).unwrap_or(0)),
            _ => from,
        };
        LogReader {
            tree: self.inner.tree.clone(),
            stats: self.inner.stats.clone(),
            segments: self
                .inner
                .tree
                .range(log_key(start)..=log_key(JournalPos(u64::MAX))),
            current: None,
            from,
            durable: self.next_pos(),
            failed: false,
        }
    }

    /// The next sequence of a session's stream (0 for a session with no events).
    pub fn session_next_seq(&self, session_id: &SessionId) -> Result<Seq, Error> {
        // Only durable records count: a run applied but not synced yet is skipped.
        let Some(last) = last_run(&self.inner.tree, &self.inner.tail, session_id)? else {
            return Ok(Seq(0));
        };
        if last.pos < self.next_pos() {
            return Ok(Seq(last.first_seq.0 + u64::from(last.count)));
        }
        // Racing an append in flight (rare): read the durable stream.
        Ok(self
            .read_session(session_id, Seq(0), Hashing::Skip)
            .last()
            .transpose()?
            .map(|record| record.seq.next())
            .unwrap_or_default())
    }

    /// The session a run belongs to, if the run was ever queued.
    pub fn session_of_run(&self, run_id: &RunId) -> Result<Option<SessionId>, Error> {
        self.inner
            .tree
            .get(run_key(run_id))?
            .map(|bytes| decode_run_value(&bytes).map(|entry| entry.session_id))
            .transpose()
    }

    /// A session's runs, oldest first, with the sequence each was queued at (none of a
    /// deleted session's; a session id used again lists only its new runs).
    pub fn session_runs(&self, session_id: &SessionId) -> Result<Vec<(Seq, RunId)>, Error> {
        self.inner
            .tree
            .scan_prefix(session_runs_prefix(session_id))
            .map(|entry| {
                let (key, value) = entry?;
                Ok((Seq(be_u64(&key).unwrap_or(0)), stored_id(&value)?))
            })
            .collect()
    }

    /// How many runs an agent has with each status, in [`IndexedStatus`] order (kept
    /// as runs change; counts runs applied and not yet durable too).
    pub fn agent_run_counts(&self, agent_id: &str) -> [u64; 6] {
        self.inner
            .agent_run_counts
            .lock()
            .ok()
            .and_then(|counts| counts.get(agent_id).copied())
            .unwrap_or_default()
    }

    /// An agent's runs in the order they were queued (newest first when `newest_first`),
    /// from the run index (no stream is read), with each run's status; none of a deleted
    /// session's.
    pub fn agent_runs(
        &self,
        agent_id: &str,
        newest_first: bool,
    ) -> impl Iterator<Item = Result<AgentRun, Error>> + use<> {
        let durable = self.next_pos();
        let scan = self.inner.tree.scan_prefix(agent_runs_prefix(agent_id));
        let entries: Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>> + Send> =
            if newest_first {
                Box::new(scan.rev())
            } else {
                Box::new(scan)
            };
        entries
            .map(|entry| {
                let (key, value) = entry?;
                let malformed = || Error::Store("malformed agent run index entry".into());
                let (status, ids) = value.split_first().ok_or_else(malformed)?;
                let split = ids.iter().position(|b| *b == 0).ok_or_else(malformed)?;
                Ok(AgentRun {
                    pos: JournalPos(be_u64(&key).ok_or_else(malformed)?),
                    session_id: stored_id(&ids[..split])?,
                    run_id: stored_id(&ids[split + 1..])?,
                    status: IndexedStatus::from_byte(*status).ok_or_else(malformed)?,
                })
            })
            // Applied but not yet synced: not shown.
            .filter(move |run| run.as_ref().map_or(true, |run| run.pos < durable))
    }

    /// Runs that have been queued and have not ended, with their sessions: what
    /// recovery must resolve after a restart.
    pub fn open_runs(&self) -> Result<Vec<(RunId, SessionId)>, Error> {
        self.inner
            .tree
            .scan_prefix([OPEN])
            .map(|entry| {
                let (key, value) = entry?;
                Ok((stored_id(&key[1..key.len() - 1])?, stored_id(&value)?))
            })
            .collect()
    }

    /// Every session that exists (created and not deleted), in id order.
    pub fn sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        self.inner
            .tree
            .scan_prefix([SESSION])
            .map(|entry| {
                let (key, value) = entry?;
                decode_session_entry(&key, &value)
            })
            .collect()
    }

    /// The run an idempotency key was bound to, if any.
    pub fn run_of_idempotency_key(&self, key: &str) -> Result<Option<RunId>, Error> {
        self.inner
            .tree
            .get(idempotency_key(key))?
            .map(|bytes| stored_id(&bytes))
            .transpose()
    }

    /// The live feed of durable records, for a [`crate::Subscription`].
    pub fn live(&self) -> broadcast::Receiver<Arc<Recorded>> {
        self.inner.live.subscribe()
    }

    pub(crate) fn tree(&self) -> &sled::Tree {
        &self.inner.tree
    }

    /// Stores a projection (derived data, rebuildable from the events: written without
    /// a sync; `journal rebuild` compares it with a fresh fold).
    pub fn put_projection(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        storage_gate(&self.inner.path, value.len() as u64)?;
        self.inner
            .db
            .open_tree(PROJECTIONS)?
            .insert(key.as_bytes(), value)?;
        Ok(())
    }

    /// A stored projection.
    pub fn get_projection(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(self
            .inner
            .db
            .open_tree(PROJECTIONS)?
            .get(key.as_bytes())?
            .map(|value| value.to_vec()))
    }

    /// Every stored projection, in key order.
    pub fn projections(&self) -> Result<Vec<(String, Vec<u8>)>, Error> {
        self.inner
            .db
            .open_tree(PROJECTIONS)?
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                Ok((String::from_utf8_lossy(&key).into_owned(), value.to_vec()))
            })
            .collect()
    }

    /// Stops the committer after it answers every queued append, and flushes.
    pub fn close(&self) -> Result<(), Error> {
        self.inner.close()
    }

    /// Queues `call` to be made on the committer's thread, after the appends queued
    /// before it (nothing when the journal is closed or the queue is full).
    pub fn call_on_committer(&self, call: fn()) {
        if let Ok(sender) = self.sender() {
            let _ = sender.try_send(Job::Call(call));
        }
    }
}

impl Inner {
    fn close(&self) -> Result<(), Error> {
        if let Ok(mut sender) = self.sender.lock() {
            sender.take();
        }
        let handle = self.committer.lock().ok().and_then(|mut h| h.take());
        if let Some(handle) = handle {
            let _ = handle.join();
        }
        self.db.flush()?;
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(error) = self.close() {
            tracing::error!(%error, "journal close failed");
        }
    }
}

/// The position after the last segment's last record: where the next append goes.
fn end_of_log(tree: &sled::Tree) -> Result<u64, Error> {
    Ok(match tree.scan_prefix([LOG]).next_back() {
        Some(entry) => {
            let (key, bytes) = entry?;
            let first_pos = be_u64(&key).unwrap_or(0);
            let segment = parse_segment(bytes, JournalPos(first_pos))?;
            first_pos + segment.len() as u64
        }
        None => 0,
    })
}
