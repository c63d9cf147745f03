//! Warm CLI processes between turns: at most one per session, a bounded number in
//! all, the least recently used evicted.
//!
//! A warm process is reused only while it holds exactly the journal's conversation
//! (same harness session, same transcript line count, same output schema); anything
//! else is killed, so the journal stays the only source of truth.

use std::sync::Mutex;
use std::time::Instant;

use turnstile_journal::SessionId;

use super::process::CliProcess;

/// Idle warm processes, least recently used first out.
pub(crate) struct Pool {
    capacity: usize,
    warm: Mutex<Vec<Warm>>,
}

/// A process between turns, and what the journal must hold for it to be reused.
pub(crate) struct Warm {
    pub(crate) session_id: SessionId,
    pub(crate) harness_session_id: String,
    pub(crate) journaled_lines: usize,
    pub(crate) schema: Option<String>,
    pub(crate) process: CliProcess,
    pub(crate) last_used: Instant,
    /// Mid-turn, waiting for a person's decision on a call it asked to run: only the
    /// run's continuation may take it (any other turn starts a new process).
    pub(crate) paused: bool,
}

impl Pool {
    /// A pool of at most `capacity` processes (0: none is kept).
    pub(crate) fn new(capacity: usize) -> Pool {
        Pool {
            capacity,
            warm: Mutex::new(Vec::new()),
        }
    }

    /// The session's warm process if it holds exactly the journal's conversation;
    /// a stale one is killed.
    pub(crate) fn take(
        &self,
        session_id: &SessionId,
        harness_session_id: Option<&str>,
        journaled_lines: usize,
        schema: Option<&str>,
        continuing: bool,
    ) -> Option<CliProcess> {
        let mut warm = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        let at = warm.iter().position(|w| &w.session_id == session_id)?;
        let mut entry = warm.swap_remove(at);
        drop(warm);
        if Some(entry.harness_session_id.as_str()) == harness_session_id
            && entry.journaled_lines == journaled_lines
            && entry.schema.as_deref() == schema
            && entry.paused == continuing
            && entry.process.alive()
        {
            Some(entry.process)
        } else {
            entry.process.kill();
            None
        }
    }

    /// Keeps a process that served a turn well, evicting the least recently used
    /// beyond the capacity.
    pub(crate) fn put(&self, entry: Warm) {
        let mut evicted = Vec::new();
        {
            let mut warm = self.warm.lock().unwrap_or_else(|e| e.into_inner());
            warm.push(entry);
            while warm.len() > self.capacity {
                let oldest = warm
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, w)| w.last_used)
                    .map(|(at, _)| at)
                    .unwrap_or(0);
                evicted.push(warm.swap_remove(oldest));
            }
        }
        for mut entry in evicted {
            entry.process.kill();
        }
    }

    /// Kills every warm process and waits for each to exit (shutdown).
    pub(crate) fn clear(&self) {
        let warm = std::mem::take(&mut *self.warm.lock().unwrap_or_else(|e| e.into_inner()));
        for mut entry in warm {
            entry.process.kill_and_wait();
        }
    }
}
