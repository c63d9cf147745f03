//! Fault injection for the fault search (`tests/tests/fault_search.rs`): built only with
//! the `faults` feature, which only the tests enable, so the release binary has none of
//! it (no field, no check on the append path).
//!
//! A test installs a [`Faults`] for a place (a sled data directory or a PostgreSQL URL)
//! before the runtime opens it; every `Journal` opened there asks it before each append
//! and each stored projection write, and does what it says: refuse the append whole
//! (nothing written), write it and answer that it failed (an outcome the caller cannot
//! know, as when a database connection drops during a commit), or answer late. A test
//! "crashes" a runtime by refusing everything from then on and stopping it: what was
//! written before is exactly what survives.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::event::Event;
use crate::ids::SessionId;

/// What happens to one append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Written and answered as usual.
    None,
    /// Refused whole: nothing written, an error answered.
    Refuse,
    /// Written, but answered with an error.
    WriteThenRefuse,
    /// Written, and answered this much later.
    Delay(Duration),
}

/// The test's side: decides each append's fate.
pub trait Faults: Send + Sync {
    /// The fate of one append of `events` to `session_id`.
    fn before_append(&self, session_id: &SessionId, events: &[Event]) -> Fault;
    /// Whether a stored projection may be written now (a crashed runtime writes none).
    fn projection_allowed(&self) -> bool;
}

type Installed = Vec<(String, Arc<dyn Faults>)>;

static INSTALLED: Mutex<Installed> = Mutex::new(Vec::new());

/// Installs `faults` for every journal opened at `place` from now on (replacing any).
pub fn install(place: &str, faults: Arc<dyn Faults>) {
    let mut installed = INSTALLED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    installed.retain(|(at, _)| at != place);
    installed.push((place.to_owned(), faults));
}

/// Removes the faults of `place`.
pub fn remove(place: &str) {
    let mut installed = INSTALLED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    installed.retain(|(at, _)| at != place);
}

/// The faults installed for `place`.
pub(crate) fn at(place: &str) -> Option<Arc<dyn Faults>> {
    let installed = INSTALLED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    installed
        .iter()
        .find(|(at, _)| at == place)
        .map(|(_, faults)| faults.clone())
}

/// The error an injected refusal answers.
pub(crate) fn refused() -> crate::Error {
    crate::Error::Unavailable("a fault injected by the fault search".into())
}
