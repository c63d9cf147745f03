//! The HTTP contract as both its sides see it: the server's handlers (`api`) and the
//! operator CLI (`client`, `timeline`) use these, and neither reaches into the other.
//! agno's run events (`events`) and run metrics (`metrics`) are rendered here; a header's name and a date's format
//! are written once.

pub mod dto;
pub mod events;
pub mod metrics;

/// The header that names the position the export is as of (records before it).
pub const AS_OF_HEADER: &str = "x-turnstile-as-of";

/// The civil date (UTC) of a Unix time in seconds, as `YYYY-MM-DD`.
pub fn date_of(seconds: i64) -> String {
    turnstile_projections::date_of_us(seconds.saturating_mul(1_000_000))
}
