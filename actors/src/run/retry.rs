//! The retry policy of an agent's runs: how many attempts, and the delay before each.

/// How a run retries failed attempts (agno's `retries`, `delay_between_retries`,
/// `exponential_backoff`; defaults 0, 1 s, false).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts after the first.
    pub retries: u32,
    /// Delay before a retry, in seconds.
    pub delay_between_retries_s: f64,
    /// Double the delay after each failed attempt.
    pub exponential_backoff: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 0,
            delay_between_retries_s: 1.0,
            exponential_backoff: false,
        }
    }
}

impl RetryPolicy {
    /// All attempts a run may make.
    pub fn max_attempts(&self) -> u32 {
        self.retries.saturating_add(1)
    }

    /// The delay after failed attempt `attempt` (1-based): `d`, or `d * 2^(attempt-1)`.
    pub fn delay_s(&self, attempt: u32) -> f64 {
        if self.exponential_backoff {
            self.delay_between_retries_s * 2f64.powi(attempt.saturating_sub(1).min(30) as i32)
        } else {
            self.delay_between_retries_s
        }
        .max(0.0)
    }
}
