//! The events that end a run that its harness did not end: cancelled, or failed with an
//! error type a client can act on.

use crate::run::RunIdentity;
use turnstile_journal::{Event, EventIndex, RunEvent};

/// The terminal events of a cancelled run.
pub(crate) fn cancelled_events(identity: &RunIdentity, index: EventIndex) -> Vec<Event> {
    vec![
        identity.emitted(
            index,
            RunEvent::Cancelled {
                reason: "Run cancelled".into(),
            },
        ),
        Event::RunCancelled {
            run_id: identity.run_id.clone(),
            reason: "Run cancelled".into(),
        },
    ]
}

/// The class of a run that could not be journaled: an event over `max_event_bytes` is
/// the run's doing (it produced it), anything else the journal's.
pub(crate) fn journal_error_type(message: &str) -> &'static str {
    if message.contains("exceeds max_event_bytes") {
        "event_too_large"
    } else {
        "journal_error"
    }
}

/// The terminal events of a failed run.
pub(crate) fn failed_events(
    identity: &RunIdentity,
    index: EventIndex,
    error_type: &str,
    message: &str,
    retryable: bool,
) -> Vec<Event> {
    vec![
        identity.emitted(
            index,
            RunEvent::Failed {
                error_type: error_type.to_owned(),
                message: message.to_owned(),
            },
        ),
        Event::RunFailed {
            run_id: identity.run_id.clone(),
            error_type: error_type.to_owned(),
            message: message.to_owned(),
            retryable,
        },
    ]
}
