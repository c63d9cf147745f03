//! The allocator's options for the `turnstile` binary, and its collect.
//!
//! mimalloc reads its options from the environment when the process starts, before
//! `main`; with its default `purge_delay` (10 ms) memory a thread frees is given back
//! to the system only the next time that thread allocates, so pages freed by session
//! actors that passivated together stay resident (measured: ~2.5 KiB a passivated
//! session against ~1.9 KiB with a delay of 0, at no measurable cost in turns per
//! second; `docs/PERFORMANCE.md`). The binary therefore runs itself again, once, with
//! `MIMALLOC_PURGE_DELAY=0` when that variable is not set; a value the user sets is
//! kept.
//!
//! [`collect`] is the runtime's `release_memory`: each long-lived thread calls it a
//! moment after a burst of passivations, so that the pages the thread freed (and the
//! blocks other threads freed into them) go back to the system. It is the one `unsafe`
//! call of the workspace (checked by `tests/tests/architecture.rs`).

/// The variable and the value the binary runs with.
pub const PURGE_DELAY: (&str, &str) = ("MIMALLOC_PURGE_DELAY", "0");

/// Replaces the process with itself under the allocator's options, unless they are
/// set already; returns only when they are (or when it cannot: then the defaults serve).
pub fn ensure_options() {
    use std::os::unix::process::CommandExt;
    let (name, value) = PURGE_DELAY;
    if std::env::var_os(name).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    // `exec` returns only when it failed.
    let _failed = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(name, value)
        .exec();
}

/// Asks mimalloc to give back what the calling thread freed: collects the blocks other
/// threads freed into its pages and returns its empty pages (with a purge delay of 0,
/// at once). Bounded work: one pass over the thread's pages (measured in
/// `docs/PERFORMANCE.md`, "Memory per session").
#[allow(unsafe_code)]
pub fn collect() {
    // SAFETY: `mi_collect` takes no pointer and touches only the calling thread's own
    // heap and mimalloc's shared state under its own synchronization; it may be called
    // at any time on any thread. Its documentation names this very case: "when a long
    // running thread allocates a lot of blocks that are freed by other threads it may
    // improve resource usage by calling this every once in a while".
    unsafe { libmimalloc_sys::mi_collect(false) }
}
