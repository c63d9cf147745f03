//! A run's client-visible events as streams carry them: typed, with their index in the
//! run and when they were journaled; the gateway renders them in the HTTP API's shape.

use std::sync::Arc;
use tokio::sync::broadcast;
use turnstile_journal::{Event, EventIndex, Recorded, RunEvent, RunId, SessionEvent};

/// A client-visible run event, typed, with its index in the run and when it was
/// journaled (the gateway renders it in the HTTP API's shape).
#[derive(Debug, Clone, PartialEq)]
pub struct WireEvent {
    /// The run.
    pub run_id: RunId,
    /// Contiguous from 0 per run.
    pub event_index: EventIndex,
    /// When it was journaled, microseconds since the epoch.
    pub ts_us: i64,
    /// What happened.
    pub event: RunEvent,
}

impl WireEvent {
    /// Whether this event ends the run's stream.
    pub fn is_terminal(&self) -> bool {
        self.event.is_terminal()
    }

    /// The run event a journal record carries, if it carries one.
    pub fn from_record(record: &Recorded) -> Option<WireEvent> {
        match &record.event {
            Event::RunEventEmitted {
                run_id,
                event_index,
                event,
            } => Some(WireEvent {
                run_id: run_id.clone(),
                event_index: *event_index,
                ts_us: record.ts_us,
                event: event.clone(),
            }),
            _ => None,
        }
    }

    /// The run event a session's event is, if it is one (moved, not copied).
    pub fn from_session_event(event: SessionEvent) -> Option<WireEvent> {
        match event.event {
            Event::RunEventEmitted {
                run_id,
                event_index,
                event: run_event,
            } => Some(WireEvent {
                run_id,
                event_index,
                ts_us: event.ts_us,
                event: run_event,
            }),
            _ => None,
        }
    }
}

/// The smallest client-visible event index among `events`.
pub(crate) fn first_wire_index(events: &[Event]) -> Option<EventIndex> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::RunEventEmitted { event_index, .. } => Some(*event_index),
            _ => None,
        })
        .min()
}

/// Shows durable records' wire events to the run's live streams.
pub(crate) fn broadcast_wire(live: &broadcast::Sender<Arc<WireEvent>>, records: &[Arc<Recorded>]) {
    for record in records {
        if let Some(wire) = WireEvent::from_record(record) {
            // No receiver is fine: streams that come later read the journal.
            let _ = live.send(Arc::new(wire));
        }
    }
}
