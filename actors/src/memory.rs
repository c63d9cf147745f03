//! Giving memory back after session actors passivate.
//!
//! Two things hold memory that nothing uses any more after a burst of passivations:
//! - sled frees the old versions of its pages through epoch-based reclamation, a few
//!   batches at a time as later operations pass by; after a burst of writes a backlog
//!   waits for the next burst;
//! - an allocator with per-thread heaps (mimalloc, the `turnstile` binary's) gives back
//!   a thread's freed pages only when that thread allocates again or collects, and a
//!   block freed by another thread (a reply dropped by its caller, a retired sled page)
//!   waits on its page until the owner looks. An arbiter whose actors all passivated,
//!   or the journal's committer once the writes stop, may not allocate for hours.
//!
//! So a moment after a burst of passivations ([`RELEASE_AFTER`] after its first, at
//! most one round per interval) the registry runs [`release`]: sled's backlog is
//! freed, then every long-lived thread of the runtime calls
//! [`RuntimeConfig::release_memory`](crate::RuntimeConfig) on itself (measured in
//! `docs/PERFORMANCE.md`, "Memory per session").

use std::time::Duration;
use turnstile_journal::limits::MEMORY_RELEASE_AFTER_MS;

use actix::ArbiterHandle;

use crate::session::Shared;

pub(crate) const RELEASE_AFTER: Duration = Duration::from_millis(MEMORY_RELEASE_AFTER_MS);

/// One round, from the registry's thread: frees sled's retired pages, then has each
/// thread that holds session memory or long-lived writes (the arbiters, the keeper,
/// the journal's committer, this one) ask its allocator to collect.
pub(crate) fn release(shared: &Shared, arbiters: &[ArbiterHandle]) {
    shared.journal.release_garbage();
    let Some(release) = shared.release_memory else {
        return;
    };
    for arbiter in arbiters {
        arbiter.spawn_fn(release);
    }
    shared.keeper.send(release);
    shared.journal.call_on_writer_threads(release);
    release();
}
