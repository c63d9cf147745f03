//! The allocator's options for the `turnstile` binary.
//!
//! mimalloc reads its options from the environment when the process starts, before
//! `main`; with its default `purge_delay` (10 ms) memory a thread frees is given back
//! to the system only the next time that thread allocates, so pages freed by session
//! actors that passivated together stay resident (measured: ~2.5 KiB a passivated
//! session against ~1.9 KiB with a delay of 0, at no measurable cost in turns per
//! second; `docs/PERFORMANCE.md`). The binary therefore runs itself again, once, with
//! `MIMALLOC_PURGE_DELAY=0` when that variable is not set; a value the user sets is
//! kept. (Setting the option through mimalloc's C API would need `unsafe`, which this
//! workspace forbids.)

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
