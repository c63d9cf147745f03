//! The sled-backed store: keys, the group-commit thread, and reads.
//!
//! Layout, all in one sled tree so that one `apply_batch` is atomic across indexes:
//! `L` + position (u64 BE) holds the record bytes; `S` + session id + `0x00` + seq
//! (u64 BE) holds the record's position; `R` + run id + `0x00` holds the run's session.
//!
//! One committer thread owns sequence assignment and hash links: it takes every
//! waiting append request, writes them in one batch, flushes, `fdatasync`s sled's log
//! file, then answers them all. sled's `flush` alone is only `sync_file_range` on
//! Linux, which does not survive a power loss.
//! This module does not interpret events beyond finding their run id.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, mpsc, oneshot};

use crate::Error;
use crate::codec::{self, Hash, RecordBody};
use crate::event::Event;
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::limits;
use crate::subscription::Subscription;

/// An event as committed: where it is and what it links to.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// Global position.
    pub pos: JournalPos,
    /// Its session.
    pub session_id: SessionId,
    /// Position in the session's stream.
    pub seq: Seq,
    /// Commit time, microseconds since the Unix epoch.
    pub ts_us: i64,
    /// Hash of the session's previous record.
    pub prev_hash: Hash,
    /// Hash of this record's bytes.
    pub hash: Hash,
    /// Encoded size in bytes.
    pub size_bytes: usize,
    /// The event.
    pub event: Event,
}

impl Recorded {
    fn from_bytes(bytes: &[u8]) -> Result<Recorded, codec::DecodeError> {
        let body = codec::decode(bytes)?;
        Ok(Recorded {
            pos: body.pos,
            session_id: body.session_id,
            seq: body.seq,
            ts_us: body.ts_us,
            prev_hash: body.prev_hash,
            hash: codec::hash(bytes),
            size_bytes: bytes.len(),
            event: body.event,
        })
    }
}

/// What the appender expects the session's stream to look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// Append wherever the stream ends.
    Any,
    /// The stream's next sequence must be this one (optimistic concurrency).
    Next(Seq),
}

/// An append refused because the stream moved on: an expected outcome, not an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("session {session_id} expected next sequence {expected}, stream is at {actual}")]
pub struct Conflict {
    /// The session.
    pub session_id: SessionId,
    /// What the appender expected.
    pub expected: Seq,
    /// The stream's real next sequence.
    pub actual: Seq,
}

/// Options passed to sled explicitly, so a version bump cannot move them.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    /// sled page cache in bytes.
    pub cache_bytes: u64,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            cache_bytes: limits::SLED_CACHE_BYTES,
        }
    }
}

type AppendResult = Result<Result<Vec<Arc<Recorded>>, Conflict>, Error>;

struct Request {
    session_id: SessionId,
    expected: Expected,
    events: Vec<Event>,
    reply: oneshot::Sender<AppendResult>,
}

struct Inner {
    path: PathBuf,
    tree: sled::Tree,
    sender: Mutex<Option<mpsc::Sender<Request>>>,
    committer: Mutex<Option<JoinHandle<()>>>,
    live: broadcast::Sender<Arc<Recorded>>,
    next_pos: Arc<AtomicU64>,
    db: sled::Db,
}

/// The event journal: cheap to clone, one per data directory per process.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Inner>,
}

pub(crate) const LOG: u8 = b'L';
pub(crate) const STREAM: u8 = b'S';
const RUN: u8 = b'R';

pub(crate) fn log_key(pos: JournalPos) -> [u8; 9] {
    let mut key = [LOG; 9];
    key[1..].copy_from_slice(&pos.0.to_be_bytes());
    key
}

fn stream_prefix(session_id: &SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(session_id.as_str().len() + 10);
    key.push(STREAM);
    key.extend_from_slice(session_id.as_str().as_bytes());
    key.push(0);
    key
}

pub(crate) fn stream_key(session_id: &SessionId, seq: Seq) -> Vec<u8> {
    let mut key = stream_prefix(session_id);
    key.extend_from_slice(&seq.0.to_be_bytes());
    key
}

fn run_key(run_id: &RunId) -> Vec<u8> {
    let mut key = Vec::with_capacity(run_id.as_str().len() + 2);
    key.push(RUN);
    key.extend_from_slice(run_id.as_str().as_bytes());
    key.push(0);
    key
}

pub(crate) fn be_u64(bytes: &[u8]) -> Option<u64> {
    let tail: [u8; 8] = bytes.get(bytes.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(u64::from_be_bytes(tail))
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

impl Journal {
    /// Opens (or creates) the journal in `dir`. Fails with [`Error::Locked`] when
    /// another process holds it.
    pub fn open(dir: &Path, options: JournalOptions) -> Result<Journal, Error> {
        std::fs::create_dir_all(dir)?;
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_bytes)
            .flush_every_ms(Some(limits::SLED_FLUSH_EVERY_MS))
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|error| match error {
                // sled wraps the lock's WouldBlock in an error of its own wording.
                sled::Error::Io(io)
                    if io.kind() == std::io::ErrorKind::WouldBlock
                        || io.to_string().contains("could not acquire lock") =>
                {
                    Error::Locked {
                        path: dir.display().to_string(),
                    }
                }
                other => Error::from(other),
            })?;
        let tree = db.open_tree("journal")?;
        // sled keeps its log in the `db` file: this is what fdatasync must reach.
        let db_file = File::open(dir.join("db"))?;
        // The directory entries of sled's files must survive a power loss too.
        File::open(dir)?.sync_all()?;
        let next_pos = match tree.scan_prefix([LOG]).next_back() {
            Some(entry) => {
                let (key, _) = entry?;
                be_u64(&key).map(|p| p + 1).unwrap_or(0)
            }
            None => 0,
        };
        let next_pos = Arc::new(AtomicU64::new(next_pos));
        let (live, _) = broadcast::channel(limits::LIVE_BROADCAST_RECORDS);
        let (sender, receiver) = mpsc::channel(limits::APPEND_QUEUE_REQUESTS_MAX);
        let committer = Committer {
            tree: tree.clone(),
            db: db.clone(),
            db_file,
            blobs_dir: dir.join("blobs"),
            synced_blobs: HashSet::new(),
            heads: HashMap::new(),
            next_pos: next_pos.load(Ordering::SeqCst),
            durable_pos: next_pos.clone(),
            live: live.clone(),
            stopped: false,
        };
        let handle = std::thread::Builder::new()
            .name("journal-commit".into())
            .spawn(move || committer.run(receiver))?;
        Ok(Journal {
            inner: Arc::new(Inner {
                path: dir.to_path_buf(),
                tree,
                sender: Mutex::new(Some(sender)),
                committer: Mutex::new(Some(handle)),
                live,
                next_pos,
                db,
            }),
        })
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn sender(&self) -> Result<mpsc::Sender<Request>, Error> {
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
        let (reply, answer) = oneshot::channel();
        let request = Request {
            session_id: session_id.clone(),
            expected,
            events,
            reply,
        };
        self.sender()?
            .send(request)
            .await
            .map_err(|_| Error::Stopped)?;
        answer.await.map_err(|_| Error::Stopped)?
    }

    /// [`Journal::append`] for threads outside an async runtime.
    pub fn append_blocking(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            session_id: session_id.clone(),
            expected,
            events,
            reply,
        };
        self.sender()?
            .blocking_send(request)
            .map_err(|_| Error::Stopped)?;
        answer.blocking_recv().map_err(|_| Error::Stopped)?
    }

    /// The position the next durable record will get (= number of records).
    pub fn next_pos(&self) -> JournalPos {
        JournalPos(self.inner.next_pos.load(Ordering::SeqCst))
    }

    /// Reads one record by global position.
    pub fn get(&self, pos: JournalPos) -> Result<Option<Recorded>, Error> {
        match self.inner.tree.get(log_key(pos))? {
            None => Ok(None),
            Some(bytes) => Recorded::from_bytes(&bytes)
                .map(Some)
                .map_err(|e| Error::Corrupt {
                    pos,
                    reason: e.to_string(),
                }),
        }
    }

    /// One session's stream from `from` on, in order.
    pub fn read_session(
        &self,
        session_id: &SessionId,
        from: Seq,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + use<> {
        let journal = self.clone();
        let start = stream_key(session_id, from);
        let end = stream_key(session_id, Seq(u64::MAX));
        self.inner.tree.range(start..=end).map(move |entry| {
            let (_, value) = entry?;
            let pos = JournalPos(be_u64(&value).ok_or(Error::Store("bad stream index".into()))?);
            journal.get(pos)?.ok_or(Error::Corrupt {
                pos,
                reason: "indexed record missing".into(),
            })
        })
    }

    /// The whole journal from `from` on, in global order.
    pub fn read_from(
        &self,
        from: JournalPos,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + use<> {
        self.inner
            .tree
            .range(log_key(from)..=log_key(JournalPos(u64::MAX)))
            .map(|entry| {
                let (key, bytes) = entry?;
                let pos = JournalPos(be_u64(&key).unwrap_or(0));
                Recorded::from_bytes(&bytes).map_err(|e| Error::Corrupt {
                    pos,
                    reason: e.to_string(),
                })
            })
    }

    /// The next sequence of a session's stream (0 for a session with no events).
    pub fn session_next_seq(&self, session_id: &SessionId) -> Result<Seq, Error> {
        match self
            .inner
            .tree
            .scan_prefix(stream_prefix(session_id))
            .next_back()
        {
            None => Ok(Seq(0)),
            Some(entry) => {
                let (key, _) = entry?;
                Ok(Seq(be_u64(&key).unwrap_or(0) + 1))
            }
        }
    }

    /// The session a run belongs to, if the run was ever queued.
    pub fn session_of_run(&self, run_id: &RunId) -> Result<Option<SessionId>, Error> {
        match self.inner.tree.get(run_key(run_id))? {
            None => Ok(None),
            Some(bytes) => {
                let text = std::str::from_utf8(&bytes).map_err(|e| Error::Store(e.to_string()))?;
                Ok(Some(
                    SessionId::parse(text).map_err(|e| Error::Store(e.to_string()))?,
                ))
            }
        }
    }

    /// A live subscription to every record from `from` on. It never blocks writers: a
    /// reader that falls behind the bounded channel re-reads from the journal.
    pub fn subscribe_from(&self, from: JournalPos) -> Subscription {
        Subscription::new(self.clone(), self.inner.live.subscribe(), from)
    }

    pub(crate) fn tree(&self) -> &sled::Tree {
        &self.inner.tree
    }

    /// Stops the committer after it answers every queued append, and flushes.
    pub fn close(&self) -> Result<(), Error> {
        self.inner.close()
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

#[derive(Clone, Copy)]
struct Head {
    next_seq: Seq,
    last_hash: Hash,
}

struct Committer {
    tree: sled::Tree,
    db: sled::Db,
    db_file: File,
    blobs_dir: PathBuf,
    synced_blobs: HashSet<std::ffi::OsString>,
    heads: HashMap<SessionId, Head>,
    next_pos: u64,
    durable_pos: Arc<AtomicU64>,
    live: broadcast::Sender<Arc<Recorded>>,
    stopped: bool,
}

impl Committer {
    fn run(mut self, mut receiver: mpsc::Receiver<Request>) {
        let mut requests = Vec::with_capacity(limits::GROUP_COMMIT_REQUESTS_MAX);
        while let Some(first) = receiver.blocking_recv() {
            requests.push(first);
            while requests.len() < limits::GROUP_COMMIT_REQUESTS_MAX {
                match receiver.try_recv() {
                    Ok(request) => requests.push(request),
                    Err(_) => break,
                }
            }
            self.commit(&mut requests);
        }
    }

    fn head(&mut self, session_id: &SessionId) -> Result<Head, Error> {
        if let Some(head) = self.heads.get(session_id) {
            return Ok(*head);
        }
        let head = match self.tree.scan_prefix(stream_prefix(session_id)).next_back() {
            None => Head {
                next_seq: Seq(0),
                last_hash: [0; 32],
            },
            Some(entry) => {
                let (key, value) = entry?;
                let seq = be_u64(&key).unwrap_or(0);
                let pos = JournalPos(be_u64(&value).unwrap_or(0));
                let bytes = self.tree.get(log_key(pos))?.ok_or(Error::Corrupt {
                    pos,
                    reason: "indexed record missing".into(),
                })?;
                Head {
                    next_seq: Seq(seq + 1),
                    last_hash: codec::hash(&bytes),
                }
            }
        };
        if self.heads.len() >= limits::SESSION_HEADS_CACHED_MAX {
            self.heads.clear();
        }
        self.heads.insert(session_id.clone(), head);
        Ok(head)
    }

    fn commit(&mut self, requests: &mut Vec<Request>) {
        if self.stopped {
            for request in requests.drain(..) {
                let _ = request.reply.send(Err(Error::Stopped));
            }
            return;
        }
        let ts_us = now_us();
        let mut batch = sled::Batch::default();
        let mut answers: Vec<(
            oneshot::Sender<AppendResult>,
            Result<Vec<Arc<Recorded>>, Conflict>,
        )> = Vec::with_capacity(requests.len());
        let start_pos = self.next_pos;
        let mut staged = Vec::new();
        for request in requests.drain(..) {
            match self.stage(&request, ts_us, &mut batch) {
                Ok(Ok(records)) => {
                    staged.extend(records.iter().cloned());
                    answers.push((request.reply, Ok(records)));
                }
                Ok(Err(conflict)) => answers.push((request.reply, Err(conflict))),
                Err(error) => {
                    let _ = request.reply.send(Err(error));
                }
            }
        }
        if self.next_pos != start_pos {
            if let Err(error) = self.write_durably(batch) {
                // Fail-stop: after a failed sync nothing about the store can be assumed.
                tracing::error!(%error, "journal write failed; refusing further appends");
                self.stopped = true;
                for (reply, _) in answers {
                    let _ = reply.send(Err(Error::Io(std::io::Error::other(error.to_string()))));
                }
                return;
            }
            self.durable_pos.store(self.next_pos, Ordering::SeqCst);
            for record in staged {
                let _ = self.live.send(record);
            }
        }
        for (reply, answer) in answers {
            let _ = reply.send(Ok(answer));
        }
    }

    fn stage(
        &mut self,
        request: &Request,
        ts_us: i64,
        batch: &mut sled::Batch,
    ) -> Result<Result<Vec<Arc<Recorded>>, Conflict>, Error> {
        let mut head = self.head(&request.session_id)?;
        if let Expected::Next(expected) = request.expected {
            if expected != head.next_seq {
                return Ok(Err(Conflict {
                    session_id: request.session_id.clone(),
                    expected,
                    actual: head.next_seq,
                }));
            }
        }
        // Encode everything first so that a too-large event refuses the whole request.
        let mut encoded = Vec::with_capacity(request.events.len());
        let mut pos = self.next_pos;
        for event in &request.events {
            let body = RecordBody {
                pos: JournalPos(pos),
                session_id: request.session_id.clone(),
                seq: head.next_seq,
                ts_us,
                prev_hash: head.last_hash,
                event: event.clone(),
            };
            let bytes = codec::encode(&body).map_err(|reason| Error::Corrupt {
                pos: JournalPos(pos),
                reason: format!("event not encodable: {reason}"),
            })?;
            let hash = codec::hash(&bytes);
            encoded.push((body, bytes, hash));
            head = Head {
                next_seq: head.next_seq.next(),
                last_hash: hash,
            };
            pos += 1;
        }
        let mut records = Vec::with_capacity(encoded.len());
        for (body, bytes, hash) in encoded {
            batch.insert(&log_key(body.pos), bytes.as_slice());
            batch.insert(
                stream_key(&body.session_id, body.seq),
                &body.pos.0.to_be_bytes(),
            );
            if let Event::RunQueued { run_id, .. } = &body.event {
                batch.insert(run_key(run_id), body.session_id.as_str().as_bytes());
            }
            records.push(Arc::new(Recorded {
                pos: body.pos,
                session_id: body.session_id,
                seq: body.seq,
                ts_us: body.ts_us,
                prev_hash: body.prev_hash,
                hash,
                size_bytes: bytes.len(),
                event: body.event,
            }));
        }
        self.next_pos = pos;
        self.heads.insert(request.session_id.clone(), head);
        Ok(Ok(records))
    }

    fn write_durably(&mut self, batch: sled::Batch) -> Result<(), Error> {
        self.tree.apply_batch(batch)?;
        self.db.flush()?;
        self.db_file.sync_data()?;
        self.sync_new_blobs()?;
        Ok(())
    }

    /// sled writes pages over ~128 KiB (large records, big nodes) to files under
    /// `blobs/` and never syncs them; a record that lives there must be synced too.
    fn sync_new_blobs(&mut self) -> Result<(), Error> {
        let entries = match std::fs::read_dir(&self.blobs_dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        let mut present = HashSet::new();
        let mut synced_any = false;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if !self.synced_blobs.contains(&name) {
                match File::open(entry.path()) {
                    Ok(file) => file.sync_data()?,
                    // sled collects blobs concurrently; a vanished one needs no sync.
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(error) => return Err(error.into()),
                }
                synced_any = true;
            }
            present.insert(name);
        }
        if synced_any {
            File::open(&self.blobs_dir)?.sync_all()?;
        }
        self.synced_blobs = present;
        Ok(())
    }
}
