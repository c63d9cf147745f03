//! The per-session hash chain and the index rules, the same on every backend: what
//! records an append makes from a stream's head, and what each event changes in the
//! journal's indexes. A backend stores the records and applies the changes its own way
//! (sled keys in one batch, PostgreSQL rows in one transaction).

use crate::Error;
use crate::codec::{self, EncodedEvent, Hash};
use crate::event::{Event, RunEvent};
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::types::Recorded;

/// Where a session's stream ends: the sequence its next record gets and the hash it
/// links to (zeros before the first record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub next_seq: Seq,
    pub last_hash: Hash,
}

impl Head {
    /// The head of a stream with no records.
    pub(crate) const EMPTY: Head = Head {
        next_seq: Seq(0),
        last_hash: [0; 32],
    };
}

/// One record of an append, sealed: its bytes, its hash and where it sits in the chain.
pub(crate) struct Sealed {
    pub seq: Seq,
    pub prev_hash: Hash,
    pub bytes: Vec<u8>,
    pub hash: Hash,
}

impl Sealed {
    /// The record it is, once appended at `pos` (of the current format).
    pub(crate) fn recorded(
        &self,
        pos: JournalPos,
        session_id: &SessionId,
        ts_us: i64,
        size_bytes: usize,
        event: Event,
    ) -> Recorded {
        Recorded {
            pos,
            session_id: session_id.clone(),
            seq: self.seq,
            ts_us,
            prev_hash: self.prev_hash,
            hash: self.hash,
            size_bytes,
            event,
            format3: None,
        }
    }
}

/// Encodes an append's events (in the appender's thread: sealing only adds headers);
/// one over `max_event_bytes` refuses the append.
pub(crate) fn encode(
    events: Vec<Event>,
    max_event_bytes: usize,
) -> Result<Vec<EncodedEvent>, Error> {
    events
        .into_iter()
        .map(|event| {
            codec::encode_event(event, max_event_bytes).map_err(|error| match error {
                codec::EncodeError::TooLarge { kind, bytes, limit } => {
                    Error::TooLarge { kind, bytes, limit }
                }
                codec::EncodeError::Codec(reason) => Error::Encode(reason),
            })
        })
        .collect()
}

/// Seals `events` as the records that follow `head`, all at `ts_us`; returns them and
/// the new head. One that does not fit a record refuses the whole append.
pub(crate) fn seal(
    session_id: &SessionId,
    head: Head,
    ts_us: i64,
    events: &[EncodedEvent],
) -> Result<(Vec<Sealed>, Head), Error> {
    let mut sealed = Vec::with_capacity(events.len());
    let mut at = head;
    for event in events {
        let bytes =
            codec::encode_parts(session_id, at.next_seq, ts_us, &at.last_hash, &event.bytes)
                .map_err(Error::Encode)?;
        let hash = codec::hash(&bytes);
        sealed.push(Sealed {
            seq: at.next_seq,
            prev_hash: at.last_hash,
            bytes,
            hash,
        });
        at = Head {
            next_seq: at.next_seq.next(),
            last_hash: hash,
        };
    }
    Ok((sealed, at))
}

/// What one event changes in the indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexChange<'a> {
    /// The session exists, with its agent and user.
    SessionCreated {
        agent_id: &'a str,
        user_id: Option<&'a str>,
    },
    /// The session is gone: it and its runs leave the lists (the runs still name it).
    SessionDeleted,
    /// A run was queued: it is open and listed, pending.
    RunQueued {
        run_id: &'a RunId,
        agent_id: &'a str,
    },
    /// A run's status changed (its byte in [`crate::IndexedStatus`] terms); a terminal
    /// one closes it.
    RunStatus {
        run_id: &'a RunId,
        status: u8,
        terminal: bool,
    },
    /// An idempotency key was bound to a run.
    KeyBound { key: &'a str, run_id: &'a RunId },
}

/// The index changes of one event, in the order they apply.
pub(crate) fn index_changes(event: &Event) -> impl Iterator<Item = IndexChange<'_>> {
    let first = match event {
        Event::RunQueued {
            run_id, agent_id, ..
        } => Some(IndexChange::RunQueued { run_id, agent_id }),
        Event::SessionCreated { agent_id, user_id } => Some(IndexChange::SessionCreated {
            agent_id,
            user_id: user_id.as_deref(),
        }),
        Event::SessionDeleted { .. } => Some(IndexChange::SessionDeleted),
        Event::IdempotencyKeyBound { key, run_id } => Some(IndexChange::KeyBound { key, run_id }),
        _ => None,
    };
    let status = match (status_byte(event), event.run_id()) {
        (Some(status), Some(run_id)) if !matches!(event, Event::RunQueued { .. }) => {
            Some(IndexChange::RunStatus {
                run_id,
                status,
                terminal: event.is_terminal(),
            })
        }
        _ => None,
    };
    first.into_iter().chain(status)
}

/// The status byte of an agent's run index for an event that changes it.
pub(crate) fn status_byte(event: &Event) -> Option<u8> {
    Some(match event {
        Event::RunQueued { .. } => b'P',
        Event::RunStarted { .. } => b'R',
        Event::RunCompleted { .. } => b'C',
        Event::RunFailed { .. } => b'E',
        Event::RunCancelled { .. } => b'X',
        Event::RunEventEmitted {
            event: RunEvent::Paused { .. },
            ..
        } => b'Z',
        Event::RunEventEmitted {
            event: RunEvent::Continued { .. },
            ..
        } => b'R',
        _ => return None,
    })
}
