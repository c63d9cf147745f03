//! A usage limit waited out (`wait_on_usage_limit`, `spec/approvals.md`): the attempt
//! that hit the account's limit is journaled as failed (retryable) with a `usage_limit`
//! warning naming when the limit resets, which is the wait's timer: the run task sleeps
//! until then (a cancel ends the wait at once) and tries again with the same run id,
//! spending no attempt. After a restart the run resumes and waits out what is left of
//! the journaled wait first. The wait holds the run's worker slot.

use std::sync::Arc;
use std::time::Duration;

use turnstile_journal::{Event, Recorded, RunEvent, Warning, now_us};

use super::RunTask;

impl RunTask {
    /// The attempt hit the usage limit until `resets_at_us`: `None` once it is waited out
    /// (the next attempt, spending none, is set up), else the events that end the run
    /// (waits are off, the reset is too far, a cancel, or the journal failed).
    pub(super) async fn usage_limit(
        &mut self,
        message: &str,
        resets_at_us: i64,
        records: &mut Vec<Arc<Recorded>>,
    ) -> Option<Vec<Event>> {
        let attempt = self.request.attempt;
        let wait_us = resets_at_us.saturating_sub(now_us()).max(0);
        let within = self
            .usage_wait
            .is_some_and(|max| wait_us as u128 <= max.as_micros());
        if !within {
            let why = match self.usage_wait {
                None => message.to_owned(),
                Some(max) => format!(
                    "{message} (it resets in {} s, past max_usage_wait_s = {})",
                    wait_us / 1_000_000,
                    max.as_secs()
                ),
            };
            return Some(self.failed("usage_limit", &why, false));
        }
        let index = self.take_index();
        let events = vec![
            Event::AttemptFailed {
                run_id: self.identity.run_id.clone(),
                attempt,
                error_type: "usage_limit".into(),
                message: message.to_owned(),
                retryable: true,
            },
            self.identity.emitted(
                index,
                RunEvent::Warning {
                    warning: Warning::UsageLimit {
                        resets_at_us,
                        attempt,
                        message: message.to_owned(),
                    },
                },
            ),
        ];
        if let Err(error) = self.append(events, records).await {
            return Some(self.failed("journal_error", &error, false));
        }
        if !self.sleep_until(resets_at_us).await {
            return Some(self.cancelled());
        }
        // Tried again, spending no attempt.
        self.unspent_attempts += 1;
        self.request.attempt += 1;
        None
    }

    /// A run resumed during a journaled wait waits out what is left of it first: the
    /// events that end it if it is cancelled meanwhile.
    pub(super) async fn journaled_usage_wait(&mut self) -> Option<Vec<Event>> {
        let until = self.usage_wait_until_us.take()?;
        if self.sleep_until(until).await {
            None
        } else {
            Some(self.cancelled())
        }
    }

    /// Sleeps until `until_us`; `false` when cancelled first.
    pub(super) async fn sleep_until(&self, until_us: i64) -> bool {
        let wait = Duration::from_micros(until_us.saturating_sub(now_us()).max(0) as u64);
        tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = self.cancel.cancelled() => false,
        }
    }
}
