//! `GET /metrics` (agno's daily aggregates, kept by the runtime's directory as sessions
//! change, so a request costs the days it returns) and `GET /metrics/prometheus`
//! (runtime counters in the Prometheus text format).

use std::fmt::Write as _;

use axum::Json;
use axum::extract::State;

use super::extract::Query;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use turnstile_journal::SYNC_BUCKETS_US;
use utoipa::{IntoParams, ToSchema};

use crate::api::AppState;
use crate::api::error::ApiError;
use crate::api::error::ErrorBody;
#[cfg(test)]
use crate::wire::date_of;

/// The Unix time in seconds of a `YYYY-MM-DD` day's start (Hinnant's days-from-civil).
fn day_start_s(date: &str) -> i64 {
    let part = |range: std::ops::Range<usize>| {
        date.get(range)
            .and_then(|text| text.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let (year, month, day) = (part(0..4), part(5..7), part(8..10));
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468) * 86_400
}

/// `starting_date` / `ending_date` filters, `YYYY-MM-DD`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MetricsQuery {
    /// The first day, `YYYY-MM-DD` (UTC).
    starting_date: Option<String>,
    /// The last day, `YYYY-MM-DD` (UTC).
    ending_date: Option<String>,
}

fn check_date(field: &str, value: &Option<String>) -> Result<(), ApiError> {
    match value {
        Some(text)
            if !(text.len() == 10 && text.as_bytes()[4] == b'-' && text.as_bytes()[7] == b'-') =>
        {
            Err(ApiError::Unprocessable(format!(
                "{field} must be a date YYYY-MM-DD, got {text:?}"
            )))
        }
        _ => Ok(()),
    }
}

/// `GET /metrics`: agno's `MetricsResponse`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Metrics {
    /// One aggregate per day with runs, oldest first.
    pub metrics: Vec<DayMetrics>,
    /// Seconds since the epoch.
    pub updated_at: u64,
}

/// The aggregate of one day (UTC).
#[derive(Debug, Serialize, ToSchema)]
pub struct DayMetrics {
    /// The day, `YYYY-MM-DD`.
    pub id: String,
    /// Runs that started that day.
    pub agent_runs_count: u64,
    /// Sessions created that day.
    pub agent_sessions_count: u64,
    /// Always 0: turnstile has agents only.
    pub team_runs_count: u64,
    /// Always 0.
    pub team_sessions_count: u64,
    /// Always 0.
    pub workflow_runs_count: u64,
    /// Always 0.
    pub workflow_sessions_count: u64,
    /// Distinct users with a run that day.
    pub users_count: u64,
    /// Token and cost sums of the day's completed runs (`input_tokens`, …, `cost`);
    /// empty on a day without one.
    #[schema(value_type = Object)]
    pub token_metrics: serde_json::Map<String, Value>,
    /// Completed runs per model.
    pub model_metrics: Vec<ModelCount>,
    /// The day's first second, since the epoch.
    pub date: i64,
    /// Seconds since the epoch.
    pub created_at: u64,
    /// Seconds since the epoch.
    pub updated_at: u64,
}

/// Completed runs of one model on one day.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelCount {
    /// The model.
    pub model_id: String,
    /// Its provider.
    pub model_provider: String,
    /// Completed runs.
    pub count: u64,
}

/// agno's `MetricsResponse`: one aggregate per day with runs.
#[utoipa::path(
    get, path = "/metrics", tag = "metrics", operation_id = "metrics", summary = "Daily aggregates of runs, sessions, users and tokens",
    params(MetricsQuery),
    responses((status = 200, description = "One aggregate per day", body = Metrics), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 422, description = "A field or parameter that does not parse, is over its bound, or is unknown", body = ErrorBody))
)]
pub async fn daily(
    State(state): State<AppState>,
    caller: crate::auth::Caller,
    Query(query): Query<MetricsQuery>,
) -> Result<Json<Metrics>, ApiError> {
    check_date("starting_date", &query.starting_date)?;
    check_date("ending_date", &query.ending_date)?;
    // Under per-user isolation, the caller's own sessions' days only.
    let days = match caller.owner() {
        Some(owner) => state.runtime.directory().days_of(owner),
        None => state.runtime.directory().days(),
    };
    let now = crate::api::now_s();
    let metrics: Vec<DayMetrics> = days
        .into_iter()
        .filter(|(date, _)| {
            query
                .starting_date
                .as_deref()
                .is_none_or(|from| date.as_str() >= from)
        })
        .filter(|(date, _)| {
            query
                .ending_date
                .as_deref()
                .is_none_or(|to| date.as_str() <= to)
        })
        .map(|(date, day)| {
            let tokens: serde_json::Map<String, Value> = TOKEN_KEYS
                .iter()
                .zip(day.tokens)
                // agno lists token keys for days with a completed run only.
                .filter(|_| !day.models.is_empty())
                .map(|(key, value)| {
                    let value = if *key == "cost" {
                        json!(value)
                    } else {
                        json!(value as u64)
                    };
                    ((*key).to_owned(), value)
                })
                .collect();
            DayMetrics {
                id: date.clone(),
                agent_runs_count: day.runs,
                agent_sessions_count: day.sessions,
                team_runs_count: 0,
                team_sessions_count: 0,
                workflow_runs_count: 0,
                workflow_sessions_count: 0,
                users_count: day.users.len() as u64,
                token_metrics: tokens,
                model_metrics: day
                    .models
                    .iter()
                    .map(|((model, provider), count)| ModelCount {
                        model_id: model.clone(),
                        model_provider: provider.clone(),
                        count: *count,
                    })
                    .collect(),
                date: day_start_s(&date),
                created_at: now,
                updated_at: now,
            }
        })
        .collect();
    Ok(Json(Metrics {
        metrics,
        updated_at: now,
    }))
}

/// Runtime counters and the journal's sync latency, in the Prometheus text format.
#[utoipa::path(
    get, path = "/metrics/prometheus", tag = "metrics", summary = "Runtime counters in the Prometheus text format",
    responses((status = 200, description = "Counters, gauges and the journal's sync histogram", body = String, content_type = "text/plain"), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody))
)]
pub async fn prometheus(State(state): State<AppState>) -> Result<Response, ApiError> {
    let runtime = &state.runtime;
    let counters = runtime.counters();
    let stats = runtime.journal().stats();
    let active = runtime.sessions_in_memory().await? as u64;
    let sessions = runtime.directory().len() as u64;
    let mut text = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(text, "{name}{labels} {value}");
        }
    };
    metric(
        "turnstile_runs_started_total",
        "counter",
        "Runs started since the server started.",
        &[("", counters.runs_started as f64)],
    );
    metric(
        "turnstile_runs_ended_total",
        "counter",
        "Runs ended since the server started, by status.",
        &[
            ("{status=\"COMPLETED\"}", counters.runs_completed as f64),
            ("{status=\"ERROR\"}", counters.runs_failed as f64),
            ("{status=\"CANCELLED\"}", counters.runs_cancelled as f64),
        ],
    );
    metric(
        "turnstile_runs_queued",
        "gauge",
        "Runs accepted and waiting for their session or a worker slot.",
        &[("", counters.runs_queued as f64)],
    );
    metric(
        "turnstile_runs_in_flight",
        "gauge",
        "Runs accepted and not ended (queued or running).",
        &[("", runtime.runs_in_flight() as f64)],
    );
    metric(
        "turnstile_journal_appends_total",
        "counter",
        "Appends acknowledged (durable) since the server started.",
        &[("", stats.appends as f64)],
    );
    metric(
        "turnstile_journal_records",
        "gauge",
        "Records in the journal.",
        &[("", stats.records as f64)],
    );
    metric(
        "turnstile_sessions_active",
        "gauge",
        "Session actors in memory.",
        &[("", active as f64)],
    );
    metric(
        "turnstile_sessions_passivated",
        "gauge",
        "Sessions that exist but have no actor in memory.",
        &[("", sessions.saturating_sub(active) as f64)],
    );
    sync_histogram(&mut text, &stats);
    Ok(([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// The journal's sync-latency histogram in Prometheus's text format.
fn sync_histogram(text: &mut String, stats: &turnstile_journal::StatsSnapshot) {
    let _ = writeln!(
        *text,
        "# HELP turnstile_journal_sync_seconds Time of each group fdatasync.\n# TYPE turnstile_journal_sync_seconds histogram"
    );
    for (bound, count) in SYNC_BUCKETS_US.iter().zip(&stats.sync_buckets) {
        let _ = writeln!(
            *text,
            "turnstile_journal_sync_seconds_bucket{{le=\"{}\"}} {count}",
            *bound as f64 / 1e6
        );
    }
    let _ = writeln!(
        *text,
        "turnstile_journal_sync_seconds_bucket{{le=\"+Inf\"}} {}",
        stats.syncs
    );
    let _ = writeln!(
        *text,
        "turnstile_journal_sync_seconds_sum {}",
        stats.sync_us_total as f64 / 1e6
    );
    let _ = writeln!(
        *text,
        "turnstile_journal_sync_seconds_count {}",
        stats.syncs
    );
}

#[cfg(test)]
mod tests {
    use super::{date_of, day_start_s};

    #[test]
    fn civil_dates() {
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(951_782_400), "2000-02-29");
        assert_eq!(date_of(1_796_040_000), "2026-11-30");
        assert_eq!(date_of(-86_400), "1969-12-31");
        for seconds in [0, 951_782_400, 1_796_040_000, -86_400, 1_709_164_800] {
            assert_eq!(
                day_start_s(&date_of(seconds)),
                seconds.div_euclid(86_400) * 86_400
            );
        }
    }
}

/// agno's daily `token_metrics` keys, in the order of `DayCounts::tokens`.
const TOKEN_KEYS: [&str; 7] = [
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cost",
];
