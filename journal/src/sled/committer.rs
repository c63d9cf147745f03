//! The committer thread: it takes every waiting append request, assigns sequences and
//! hash links, stages index changes, and applies the batch to sled as one atomic write,
//! then hands it to the syncer. It is the only writer of records.

use crate::AppendResult;
use crate::chain::{self, Head};
use crate::codec::{self, Run};
use crate::event::Event;
use crate::ids::{JournalPos, Seq, SessionId};
use crate::now_us;
use crate::sled::Tail;
use crate::sled::disk::storage_gate;
use crate::sled::indexes::{AgentRunCounts, StagedRuns, apply_counts, index_event};
use crate::sled::keys::{apart_key, log_key, write_index};
use crate::sled::reads::{last_run, segment_at};
use crate::{Conflict, Error, Expected, Recorded, limits};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// What the committer is sent: appends, and calls to make on its thread.
pub(super) enum Job {
    Append(Request),
    /// Called on the committer's thread once the batch it arrived with is applied.
    Call(fn()),
}

pub(super) struct Request {
    pub(super) session_id: SessionId,
    pub(super) expected: Expected,
    pub(super) events: Vec<codec::EncodedEvent>,
    pub(super) reply: oneshot::Sender<AppendResult>,
}

impl Request {
    /// Encodes the events (in the appender's thread: the committer only adds headers)
    /// and pairs the request with the receiver of its answer.
    pub(super) fn new(
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
        max_event_bytes: usize,
    ) -> Result<(Request, oneshot::Receiver<AppendResult>), Error> {
        let events = chain::encode(events, max_event_bytes)?;
        let (reply, answer) = oneshot::channel();
        Ok((
            Request {
                session_id: session_id.clone(),
                expected,
                events,
                reply,
            },
            answer,
        ))
    }

    /// Encoded bytes of its events.
    pub(super) fn bytes(&self) -> usize {
        self.events.iter().map(|event| event.bytes.len()).sum()
    }
}

pub(super) struct Committer {
    pub(super) tree: sled::Tree,
    /// Runs queued in the batch being built.
    pub(super) staged_runs: StagedRuns,
    pub(super) agent_run_counts: AgentRunCounts,
    pub(super) tail: Arc<RwLock<Tail>>,
    /// When the session index was last written.
    pub(super) index_written: Instant,
    pub(super) heads: HashMap<SessionId, Head>,
    pub(super) next_pos: u64,
    /// Set after a failed write or sync: nothing about the store can be assumed since.
    pub(super) stopped: bool,
    pub(super) syncer_db: sled::Db,
    pub(super) syncer: std::sync::mpsc::SyncSender<SyncJob>,
    pub(super) sync_failed: Arc<std::sync::atomic::AtomicBool>,
    /// The data directory, whose disk is checked before each batch.
    pub(super) dir: std::path::PathBuf,
}

/// Where one appender's answer goes, and what it will be once the batch is durable.
pub(super) type PendingAnswer = (
    oneshot::Sender<AppendResult>,
    Result<Vec<Arc<Recorded>>, Conflict>,
);

/// A batch applied to sled, waiting for the sync that makes it durable.
pub(super) struct SyncJob {
    pub(super) answers: Vec<PendingAnswer>,
    pub(super) staged: Vec<Arc<Recorded>>,
    pub(super) end_pos: u64,
}

impl Committer {
    pub(super) fn run(mut self, mut receiver: mpsc::Receiver<Job>) {
        let mut requests = Vec::with_capacity(limits::GROUP_COMMIT_REQUESTS_MAX);
        let mut calls = Vec::new();
        let mut last_batch = 1;
        while let Some(first) = receiver.blocking_recv() {
            let first = match first {
                Job::Append(request) => request,
                Job::Call(call) => {
                    call();
                    continue;
                }
            };
            let mut bytes = first.bytes();
            requests.push(first);
            // Linger briefly for as many requests as the last batch had: appenders
            // answered together come back together, a little apart. Without this, a
            // steady load splits into small batches and pays a sync for each.
            let linger_until =
                Instant::now() + Duration::from_micros(limits::GROUP_COMMIT_LINGER_US);
            while requests.len() < limits::GROUP_COMMIT_REQUESTS_MAX
                && bytes < limits::GROUP_COMMIT_BYTES_MAX
            {
                match receiver.try_recv() {
                    Ok(Job::Append(request)) => {
                        bytes += request.bytes();
                        requests.push(request);
                    }
                    Ok(Job::Call(call)) => calls.push(call),
                    Err(mpsc::error::TryRecvError::Empty)
                        if requests.len() < last_batch && Instant::now() < linger_until =>
                    {
                        std::thread::yield_now();
                    }
                    Err(_) => break,
                }
            }
            last_batch = requests.len();
            self.commit(&mut requests);
            for call in calls.drain(..) {
                call();
            }
        }
        self.write_tail_to_index();
    }

    /// On close: writes the in-memory tail to the session index, so that a cleanly
    /// closed journal has its index complete up to its end (and opens without
    /// reading segments back). After a crash, opening rebuilds the tail instead.
    pub(super) fn write_tail_to_index(&mut self) {
        if self.stopped {
            return;
        }
        let Ok(mut tail) = self.tail.write() else {
            return;
        };
        if tail.len == 0 {
            return;
        }
        let mut batch = sled::Batch::default();
        let written = write_index(
            &self.tree,
            &mut batch,
            tail.runs.iter().map(|(id, runs)| (id, runs.as_slice())),
            JournalPos(self.next_pos),
        )
        .and_then(|()| Ok(self.tree.apply_batch(batch)?));
        match written {
            Ok(()) => *tail = Tail::default(),
            Err(error) => tracing::warn!(%error, "could not write the session index on close"),
        }
    }

    pub(super) fn head(&mut self, session_id: &SessionId) -> Result<Head, Error> {
        if let Some(head) = self.heads.get(session_id) {
            return Ok(*head);
        }
        let head = match last_run(&self.tree, &self.tail, session_id)? {
            None => Head::EMPTY,
            Some(run) => {
                let last = JournalPos(run.pos.0 + u64::from(run.count) - 1);
                let (first_pos, segment) =
                    segment_at(&self.tree, last)?.ok_or_else(|| Error::Corrupt {
                        pos: last,
                        reason: format!("the last record of session {session_id} is missing"),
                    })?;
                let bytes = segment
                    .record((last.0 - first_pos.0) as usize)
                    .expect("segment_at found it");
                Head {
                    next_seq: Seq(run.first_seq.0 + u64::from(run.count)),
                    last_hash: codec::hash(bytes),
                }
            }
        };
        if self.heads.len() >= limits::SESSION_HEADS_CACHED_MAX {
            self.heads.clear();
        }
        self.heads.insert(session_id.clone(), head);
        Ok(head)
    }

    /// Stages and applies one group; the syncer makes it durable and answers.
    /// Fail-stop: after a failed write or flush nothing about the store can be
    /// assumed, so this batch's appenders get the error and every later one is refused.
    fn fail_stop(&mut self, what: &str, error: sled::Error, answers: Vec<PendingAnswer>) {
        tracing::error!(%error, "journal {what} failed; refusing further appends");
        self.stopped = true;
        self.sync_failed.store(true, Ordering::SeqCst);
        for (reply, _) in answers {
            let _ = reply.send(Err(Error::Io(std::io::Error::other(error.to_string()))));
        }
    }

    /// Whether the batch may be written: not after a failure (fail-stop), and not
    /// while the disk cannot take it (nothing written: the journal goes on once it can).
    /// Refused requests are answered here.
    fn admit(&mut self, requests: &mut Vec<Request>) -> bool {
        if self.stopped {
            refuse_all(requests, || Error::Stopped);
            return false;
        }
        let bytes: usize = requests.iter().map(Request::bytes).sum();
        if let Err(error) = storage_gate(&self.dir, bytes as u64) {
            let detail = error.unavailable().unwrap_or_else(|| error.to_string());
            refuse_all(requests, || Error::Unavailable(detail.clone()));
            return false;
        }
        true
    }

    pub(super) fn commit(&mut self, requests: &mut Vec<Request>) {
        if !self.admit(requests) {
            return;
        }
        let ts_us = now_us();
        let mut batch = sled::Batch::default();
        self.staged_runs.clear();
        let mut answers = Vec::with_capacity(requests.len());
        let start_pos = self.next_pos;
        let mut staged = Vec::new();
        let mut manifest = Vec::new();
        let mut records = Vec::new();
        for request in requests.drain(..) {
            let Request {
                session_id,
                expected,
                events,
                reply,
            } = request;
            match self.stage(
                &session_id,
                expected,
                events,
                ts_us,
                &mut batch,
                (&mut manifest, &mut records),
            ) {
                Ok(Ok(recorded)) => {
                    staged.extend(recorded.iter().cloned());
                    answers.push((reply, Ok(recorded)));
                }
                Ok(Err(conflict)) => answers.push((reply, Err(conflict))),
                Err(error) => {
                    let _ = reply.send(Err(error));
                }
            }
        }
        let mut index_written = false;
        if self.next_pos != start_pos {
            batch.insert(
                &log_key(JournalPos(start_pos)),
                codec::encode_segment(&manifest, &records),
            );
            drop(records);
            index_written = self.add_runs(&manifest, start_pos, &mut batch);
            if let Err(error) = self.tree.apply_batch(batch) {
                return self.fail_stop("write", error, answers);
            }
            apply_counts(&self.agent_run_counts, &self.staged_runs.counts);
        }
        if index_written && let Ok(mut tail) = self.tail.write() {
            *tail = Tail::default();
            self.index_written = Instant::now();
        }
        // sled's flush stays on this thread (it contends with apply); the fdatasync
        // that makes it durable runs on the sync thread while the next batch applies.
        if self.next_pos != start_pos
            && let Err(error) = self.syncer_db.flush()
        {
            return self.fail_stop("flush", error, answers);
        }
        let job = SyncJob {
            answers,
            staged,
            end_pos: self.next_pos,
        };
        if let Err(std::sync::mpsc::SendError(job)) = self.syncer.send(job) {
            for (reply, _) in job.answers {
                let _ = reply.send(Err(Error::Stopped));
            }
        }
        if self.sync_failed.load(Ordering::SeqCst) {
            self.stopped = true;
        }
    }

    /// Adds the runs of a segment's manifest to the in-memory tail of the session index
    /// and, when the tail is due ([`limits::SESSION_INDEX_FLUSH_MS`]) or full, adds the
    /// whole tail to the batch as index chunks with the new watermark. Returns whether
    /// it did: the tail is emptied once the batch is applied.
    pub(super) fn add_runs(
        &mut self,
        manifest: &[codec::ManifestEntry],
        start_pos: u64,
        batch: &mut sled::Batch,
    ) -> bool {
        let Ok(mut tail) = self.tail.write() else {
            return false;
        };
        let mut pos = start_pos;
        for entry in manifest {
            tail.runs
                .entry(entry.session_id.clone())
                .or_default()
                .push(Run {
                    first_seq: entry.first_seq,
                    count: entry.count,
                    pos: JournalPos(pos),
                });
            tail.len += 1;
            pos += u64::from(entry.count);
        }
        let due = tail.len >= limits::SESSION_INDEX_TAIL_RUNS_MAX
            || self.index_written.elapsed()
                >= Duration::from_millis(limits::SESSION_INDEX_FLUSH_MS);
        if !due {
            return false;
        }
        match write_index(
            &self.tree,
            batch,
            tail.runs.iter().map(|(id, runs)| (id, runs.as_slice())),
            JournalPos(pos),
        ) {
            Ok(()) => true,
            Err(error) => {
                // The tail stays and is written with a later batch.
                tracing::warn!(%error, "session index not written with this batch");
                false
            }
        }
    }

    /// Assigns positions, sequences and hash links to one request's events and adds
    /// them to the segment. Events arrive encoded; only the header is encoded here.
    pub(super) fn stage(
        &mut self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<codec::EncodedEvent>,
        ts_us: i64,
        batch: &mut sled::Batch,
        (manifest, records): (&mut Vec<codec::ManifestEntry>, &mut Vec<Vec<u8>>),
    ) -> Result<Result<Vec<Arc<Recorded>>, Conflict>, Error> {
        let head = self.head(session_id)?;
        if let Expected::Next(expected) = expected
            && expected != head.next_seq
        {
            return Ok(Err(Conflict {
                session_id: session_id.clone(),
                expected,
                actual: head.next_seq,
            }));
        }
        // Every record is sealed first, so that one too large refuses the whole request.
        let (sealed, head) = chain::seal(session_id, head, ts_us, &events)?;
        if let Some(first) = sealed.first() {
            manifest.push(codec::ManifestEntry {
                session_id: session_id.clone(),
                first_seq: first.seq,
                count: sealed.len() as u32,
            });
        }
        let mut pos = self.next_pos;
        let mut recorded = Vec::with_capacity(sealed.len());
        for (sealed, event) in sealed.into_iter().zip(events) {
            index_event(
                &self.tree,
                batch,
                &mut self.staged_runs,
                (session_id, JournalPos(pos), sealed.seq, ts_us),
                &event.event,
            );
            let mut size_bytes = sealed.bytes.len();
            if let Some((digest, apart)) = event.apart {
                size_bytes += apart.len();
                batch.insert(apart_key(&digest), apart);
            }
            recorded.push(Arc::new(sealed.recorded(
                JournalPos(pos),
                &session_id,
                ts_us,
                size_bytes,
                event.event,
            )));
            records.push(sealed.bytes);
            pos += 1;
        }
        self.next_pos = pos;
        self.heads.insert(session_id.clone(), head);
        Ok(Ok(recorded))
    }
}

/// Answers every request with an error: nothing of them was written.
fn refuse_all(requests: &mut Vec<Request>, error: impl Fn() -> Error) {
    for request in requests.drain(..) {
        let _ = request.reply.send(Err(error()));
    }
}
