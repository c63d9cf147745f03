//! Appends, by group commit: one appender gathers the requests waiting at one moment
//! into a batch, at most one append of a session (a session's next append waits for the
//! batch that holds its last, so a session's appends are journaled in the order they
//! were made), seals each on its stream's head, and sends the batch as one call of
//! `turnstile.append_batch` (`batch.rs`): one round trip, one transaction, one WAL
//! flush, each append checked against its stream's head and its lease's fencing token
//! inside the database and refused alone. A few batches are on their way at once, of
//! disjoint sessions (one per replica when there are others).

use crate::chain::{self, Head};
use crate::codec::Hash;
use crate::ids::{JournalPos, Seq, SessionId};
use crate::now_us;
use crate::pg::batch::{Batch, Part, Verdict, call_batch};
use crate::pg::follower::deliver_own;
use crate::pg::replicas::LeaseState;
use crate::pg::{Inner, Request};
use crate::types::{Conflict, Expected, Recorded};
use crate::{Error, limits};
use futures::FutureExt;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::collections::{HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;
use tokio::sync::mpsc;

/// What a batch gives back to the appender when it is done: the requests to send again
/// (sealed on a stale cached head). Its sessions are free for their next append then.
struct Landed {
    again: Vec<Request>,
}

/// Gathers the requests into batches and sends them, until the journal closes.
pub(super) async fn appender(inner: Weak<Inner>, mut receiver: mpsc::Receiver<Request>) {
    let mut waiting: VecDeque<Request> = VecDeque::new();
    let mut busy: HashMap<u64, Vec<SessionId>> = HashMap::new();
    // The batches on their way, polled by this task itself (no hand-off to another task
    // and back for each one); a batch that panics answers nothing, and its callers see
    // the journal stopped (their reply channels are gone).
    let mut flights = FuturesUnordered::new();
    let mut next_flight = 0u64;
    let room = limits::POSTGRES_BATCH_APPENDS_MAX * limits::POSTGRES_BATCHES_IN_FLIGHT;
    let mut open = true;
    loop {
        while open && waiting.len() < room {
            match receiver.try_recv() {
                Ok(request) => waiting.push_back(request),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        // Among other replicas, one batch each: theirs are the ones on their way beside
        // it (all take the global order's lock in turn), and a second would only split
        // this replica's appends into smaller batches, one more commit each.
        let alone = inner
            .upgrade()
            .is_some_and(|inner| !inner.others.load(Ordering::SeqCst));
        let limit = match alone {
            true => limits::POSTGRES_BATCHES_IN_FLIGHT,
            false => 1,
        };
        while flights.len() < limit {
            let in_flight: HashSet<&SessionId> = busy.values().flatten().collect();
            let batch = take_batch(&mut waiting, &in_flight);
            if batch.is_empty() {
                break;
            }
            let Some(strong) = inner.upgrade() else {
                for request in batch {
                    let _ = request.reply.send(Err(Error::Stopped));
                }
                continue;
            };
            let sessions = batch.iter().map(|r| r.session_id.clone()).collect();
            let flight = next_flight;
            next_flight += 1;
            flights.push(
                AssertUnwindSafe(send_batch(strong, batch))
                    .catch_unwind()
                    .map(move |landed| (flight, landed.ok())),
            );
            busy.insert(flight, sessions);
        }
        if !open && waiting.is_empty() && flights.is_empty() {
            return;
        }
        tokio::select! {
            request = receiver.recv(), if open && waiting.len() < room => match request {
                Some(request) => waiting.push_back(request),
                None => open = false,
            },
            landed = flights.next(), if !flights.is_empty() => if let Some((flight, landed)) = landed {
                busy.remove(&flight);
                for request in landed.into_iter().flat_map(|landed: Landed| landed.again).rev() {
                    waiting.push_front(request);
                }
            },
        }
    }
}

/// The next batch: the waiting requests in order, skipping a session already in flight
/// or already in this batch (and so every later request of it), up to the batch's size.
fn take_batch(waiting: &mut VecDeque<Request>, in_flight: &HashSet<&SessionId>) -> Vec<Request> {
    let mut batch = Vec::new();
    let mut taken: HashSet<SessionId> = HashSet::new();
    let mut rest = VecDeque::with_capacity(waiting.len());
    let mut bytes = 0;
    while let Some(request) = waiting.pop_front() {
        let size: usize = request.events.iter().map(|e| e.bytes.len()).sum();
        let full = batch.len() >= limits::POSTGRES_BATCH_APPENDS_MAX
            || (!batch.is_empty() && bytes + size > limits::POSTGRES_BATCH_BYTES_MAX);
        if full || in_flight.contains(&request.session_id) || taken.contains(&request.session_id) {
            rest.push_back(request);
            continue;
        }
        bytes += size;
        taken.insert(request.session_id.clone());
        batch.push(request);
    }
    *waiting = rest;
    batch
}

async fn send_batch(inner: Arc<Inner>, requests: Vec<Request>) -> Landed {
    let again = match inner.pool.get().await {
        Ok(client) => append_batch(&inner, &client, requests).await,
        Err(error) => {
            let error = Error::from(error);
            for request in requests {
                let _ = request.reply.send(Err(copy(&error)));
            }
            Vec::new()
        }
    };
    Landed { again }
}

/// The same failure for each request of a batch that failed whole.
fn copy(error: &Error) -> Error {
    match error {
        Error::Unavailable(detail) => Error::Unavailable(detail.clone()),
        Error::Stopped => Error::Stopped,
        other => Error::Store(other.to_string()),
    }
}

/// One request of a batch, sealed: what its answer is made of.
struct Sealed {
    request: Request,
    sealed: Vec<chain::Sealed>,
    at: Head,
    ts_us: i64,
    sizes: Vec<usize>,
    /// Sent without a token because an earlier append gave the lease back.
    given_back: bool,
}

/// Seals the requests, sends them as one batch, answers each; returns those to send
/// again.
async fn append_batch(
    inner: &Inner,
    client: &deadpool_postgres::Client,
    requests: Vec<Request>,
) -> Vec<Request> {
    let started = Instant::now();
    if let Err(error) = read_heads(inner, client, &requests).await {
        for request in requests {
            let _ = request.reply.send(Err(copy(&error)));
        }
        return Vec::new();
    }
    let mut batch = Batch::default();
    let mut sealed = Vec::with_capacity(requests.len());
    for request in requests {
        if let Some(one) = seal(inner, request, &mut batch) {
            sealed.push(one);
        }
    }
    if sealed.is_empty() {
        return Vec::new();
    }
    let me = inner
        .replica_id
        .lock()
        .map(|id| id.clone())
        .unwrap_or_default();
    let verdicts = match call_batch(client, &me, &batch).await {
        Ok(verdicts) => verdicts,
        Err(error) => {
            for one in sealed {
                let _ = one.request.reply.send(Err(copy(&error)));
            }
            return Vec::new();
        }
    };
    let mut again = Vec::new();
    let mut appended = 0;
    for (one, verdict) in sealed.into_iter().zip(verdicts) {
        if verdict.status == "ok" {
            appended += 1;
        }
        if let Some(request) = answer(inner, one, verdict) {
            again.push(request);
        }
    }
    if appended > 0 {
        inner
            .stats
            .record_sync(started.elapsed().as_micros() as u64, appended);
    }
    again
}

/// Reads, in one query, the heads of the sessions not cached and of those whose
/// expected sequence disagrees with the cache (another process may have appended).
async fn read_heads(
    inner: &Inner,
    client: &deadpool_postgres::Client,
    requests: &[Request],
) -> Result<(), Error> {
    let stale: Vec<SessionId> = {
        let heads = inner.heads.lock().map_err(|_| Error::Stopped)?;
        requests
            .iter()
            .filter(
                |request| match (heads.get(&request.session_id), request.expected) {
                    (None, _) => true,
                    (Some(head), Expected::Next(expected)) => head.next_seq != expected,
                    (Some(_), Expected::Any) => false,
                },
            )
            .map(|request| request.session_id.clone())
            .collect()
    };
    if stale.is_empty() {
        return Ok(());
    }
    let rows = client
        .query(
            &client
                .prepare_cached(
                    "SELECT session_id, next_seq, head_hash FROM turnstile.streams \
             WHERE session_id = ANY ($1)",
                )
                .await?,
            &[&stale.iter().map(SessionId::as_str).collect::<Vec<_>>()],
        )
        .await?;
    let mut found = HashMap::with_capacity(rows.len());
    for row in rows {
        let hash: Vec<u8> = row.get(2);
        let head = Head {
            next_seq: Seq(row.get::<_, i64>(1) as u64),
            last_hash: hash
                .try_into()
                .map_err(|_| Error::Store("malformed stream head".into()))?,
        };
        found.insert(row.get::<_, String>(0), head);
    }
    for session_id in stale {
        let head = found
            .get(session_id.as_str())
            .copied()
            .unwrap_or(Head::EMPTY);
        inner.remember_head(&session_id, head);
    }
    Ok(())
}

/// Checks a request against what this replica knows (its lease, the stream's head) and
/// seals it into the batch; a request refused here is answered at once.
fn seal(inner: &Inner, request: Request, batch: &mut Batch) -> Option<Sealed> {
    let session_id = &request.session_id;
    let state = inner
        .leases
        .lock()
        .ok()
        .and_then(|leases| leases.get(session_id).copied());
    let given_back = matches!(state, Some(LeaseState::Released { .. }));
    let epoch = match state {
        Some(LeaseState::Held { epoch, .. }) => Some(epoch),
        // Given back with an earlier append: taken again by this one if still free.
        Some(LeaseState::Released { .. }) => None,
        Some(LeaseState::Lost) => {
            let error = Error::Fenced {
                session_id: session_id.to_string(),
            };
            let _ = request.reply.send(Err(error));
            return None;
        }
        None => None,
    };
    let head = inner
        .heads
        .lock()
        .ok()
        .and_then(|heads| heads.get(session_id).copied())
        .unwrap_or(Head::EMPTY);
    if let Expected::Next(expected) = request.expected
        && expected != head.next_seq
    {
        let conflict = Conflict {
            session_id: session_id.clone(),
            expected,
            actual: head.next_seq,
        };
        let _ = request.reply.send(Ok(Err(conflict)));
        return None;
    }
    let ts_us = now_us();
    let (mut sealed, at) = match chain::seal(session_id, head, ts_us, &request.events) {
        Ok(sealed) => sealed,
        Err(error) => {
            let _ = request.reply.send(Err(error));
            return None;
        }
    };
    let (records, blobs, sizes) = take_bytes(&mut sealed, &request.events);
    batch.push(
        Part {
            session_id,
            epoch,
            expected: head.next_seq,
            head_hash: &at.last_hash,
            records,
            blobs,
            ts_us,
        },
        sealed
            .iter()
            .zip(&request.events)
            .map(|(one, event)| (one.seq, &event.event)),
    );
    Some(Sealed {
        request,
        sealed,
        at,
        ts_us,
        sizes,
        given_back,
    })
}

/// The sealed records' bytes (moved out), the events stored apart, and each record's
/// size with what it stores apart.
#[allow(clippy::type_complexity)]
fn take_bytes(
    sealed: &mut [chain::Sealed],
    events: &[crate::codec::EncodedEvent],
) -> (Vec<Vec<u8>>, Vec<(Vec<u8>, Vec<u8>)>, Vec<usize>) {
    let mut records = Vec::with_capacity(sealed.len());
    let mut blobs = Vec::new();
    let mut sizes = Vec::with_capacity(sealed.len());
    for (one, event) in sealed.iter_mut().zip(events) {
        let mut size = one.bytes.len();
        if let Some((digest, apart)) = &event.apart {
            size += apart.len();
            blobs.push((digest.to_vec(), apart.clone()));
        }
        sizes.push(size);
        records.push(std::mem::take(&mut one.bytes));
    }
    (records, blobs, sizes)
}

/// Answers one request by its verdict; returns it when it is to be sent again.
fn answer(inner: &Inner, one: Sealed, verdict: Verdict) -> Option<Request> {
    match verdict.status.as_str() {
        "ok" => {
            hold(
                inner,
                &one.request.session_id,
                verdict.epoch,
                verdict.released,
            );
            accepted(inner, one, &verdict);
            None
        }
        // Fenced; or another replica took the session, or wrote to it, after this one
        // gave the lease back: what the actors here know is behind, so for them a lost
        // lease (nothing written; they stop, and the lease stays as it is).
        "fenced" => lost(inner, one),
        _ if one.given_back => lost(inner, one),
        "owned" => {
            let error = Error::Owned {
                session_id: one.request.session_id.to_string(),
                owner: verdict.owner.unwrap_or_default(),
            };
            let _ = one.request.reply.send(Err(error));
            None
        }
        _ => conflicted(inner, one, &verdict),
    }
}

/// A lost lease: appends of the session are refused here until it is taken again.
fn lost(inner: &Inner, one: Sealed) -> Option<Request> {
    let session_id = &one.request.session_id;
    if let Ok(mut leases) = inner.leases.lock() {
        leases.insert(session_id.clone(), LeaseState::Lost);
    }
    let error = Error::Fenced {
        session_id: session_id.to_string(),
    };
    let _ = one.request.reply.send(Err(error));
    None
}

/// A conflict: the caller's, or (sealed on a stale cached head) sent again.
fn conflicted(inner: &Inner, one: Sealed, verdict: &Verdict) -> Option<Request> {
    let session_id = one.request.session_id.clone();
    let actual = verdict.next_seq;
    let last_hash: Hash = verdict.head_hash.unwrap_or([0; 32]);
    inner.remember_head(
        &session_id,
        Head {
            next_seq: actual,
            last_hash,
        },
    );
    match one.request.expected {
        Expected::Next(expected) if expected != actual => {
            let conflict = Conflict {
                session_id,
                expected,
                actual,
            };
            let _ = one.request.reply.send(Ok(Err(conflict)));
            None
        }
        _ => Some(one.request),
    }
}

/// The records of an accepted append, at their positions: to the caller and the feed.
fn accepted(inner: &Inner, one: Sealed, verdict: &Verdict) {
    let session_id = one.request.session_id.clone();
    inner.remember_head(&session_id, one.at);
    let first_pos = verdict.first_pos.unwrap_or(0);
    let count = one.sealed.len() as u64;
    if count > 0 {
        inner
            .next_pos
            .fetch_max(first_pos + count, Ordering::SeqCst);
        if inner.others.load(Ordering::SeqCst) {
            let _ = inner.touched.send(session_id.clone());
        } else {
            // Alone: only this replica's own waiters, told here (no notifier hop).
            inner.notify_locally(session_id.as_str().to_owned());
        }
    }
    let records: Vec<Arc<Recorded>> = one
        .sealed
        .iter()
        .zip(one.request.events)
        .zip(one.sizes)
        .enumerate()
        .map(|(offset, ((sealed, event), size))| {
            Arc::new(sealed.recorded(
                JournalPos(first_pos + offset as u64),
                &session_id,
                one.ts_us,
                size,
                event.event,
            ))
        })
        .collect();
    // Others' records before these: the follower reads them (and then hands these on).
    if deliver_own(inner, &records) {
        inner.appended.notify_one();
    }
    let _ = one.request.reply.send(Ok(Ok(records)));
}

/// Records the lease's fencing token after an append the database let through (or that
/// took the lease itself: a caller that never asked for it), or that the append gave
/// the lease back.
fn hold(inner: &Inner, session_id: &SessionId, epoch: i64, released: bool) {
    if let Ok(mut leases) = inner.leases.lock() {
        let holders = match leases.get(session_id) {
            Some(LeaseState::Held { holders, .. } | LeaseState::Released { holders }) => *holders,
            _ => 0,
        };
        match (released, holders) {
            // No actor here holds it (an append made without a lease): nothing to keep.
            (true, 0) => {
                leases.remove(session_id);
            }
            (true, holders) => {
                leases.insert(session_id.clone(), LeaseState::Released { holders });
            }
            (false, holders) => {
                leases.insert(session_id.clone(), LeaseState::Held { epoch, holders });
            }
        }
    }
}
