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

/// A time in microseconds since the epoch as ISO 8601 in UTC (`2026-12-03T20:22:35.123456+00:00`),
/// as Python's `datetime.isoformat()` writes it and `fromisoformat` reads it.
pub fn iso_of_us(us: i64) -> String {
    let seconds = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let of_day = seconds.rem_euclid(86_400);
    format!(
        "{}T{:02}:{:02}:{:02}.{micros:06}+00:00",
        turnstile_projections::date_of_us(us),
        of_day / 3_600,
        of_day % 3_600 / 60,
        of_day % 60
    )
}
