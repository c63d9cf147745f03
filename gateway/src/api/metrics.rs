//! `GET /metrics` (agno's daily aggregates, folded from the journal) and
//! `GET /metrics/prometheus` (runtime counters in the Prometheus text format).
//!
//! The daily aggregates read every session's stream: fine for the journals this build
//! serves; a stored metrics projection is the way past that (issue 7's rebuild).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use axum::Json;
use axum::extract::State;

use super::extract::Query;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use turnstile_journal::SYNC_BUCKETS_US;

use crate::api::AppState;
use crate::api::error::ApiError;

/// The civil date (UTC) of a Unix time in seconds, as `YYYY-MM-DD` (Hinnant's algorithm).
pub fn date_of(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[derive(Default)]
struct Day {
    runs: u64,
    sessions: u64,
    users: BTreeSet<String>,
    tokens: BTreeMap<&'static str, f64>,
    models: BTreeMap<(String, String), u64>,
    start_s: i64,
}

/// `starting_date` / `ending_date` filters, `YYYY-MM-DD`.
#[derive(Debug, Deserialize)]
pub struct MetricsQuery {
    starting_date: Option<String>,
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

/// agno's `MetricsResponse`: one aggregate per day with runs.
pub async fn daily(
    State(state): State<AppState>,
    Query(query): Query<MetricsQuery>,
) -> Result<Json<Value>, ApiError> {
    check_date("starting_date", &query.starting_date)?;
    check_date("ending_date", &query.ending_date)?;
    let mut days: BTreeMap<String, Day> = BTreeMap::new();
    let day_of = |us: i64| {
        (
            date_of(us / 1_000_000),
            (us / 1_000_000).div_euclid(86_400) * 86_400,
        )
    };
    for entry in state.runtime.sessions()? {
        let Some(session) = state.runtime.session_state(&entry.session_id)? else {
            continue;
        };
        let (date, start_s) = day_of(session.session.created_at_us);
        let day = days.entry(date).or_default();
        day.sessions += 1;
        day.start_s = start_s;
        for run in &session.runs {
            let (date, start_s) = day_of(run.created_at_us);
            let day = days.entry(date).or_default();
            day.start_s = start_s;
            day.runs += 1;
            if let Some(user) = &run.user_id {
                day.users.insert(user.clone());
            }
            let Some(metrics) = run
                .metrics
                .as_deref()
                .and_then(|text| serde_json::from_str::<Value>(text).ok())
            else {
                continue;
            };
            for key in [
                "input_tokens",
                "output_tokens",
                "total_tokens",
                "cache_read_tokens",
                "cache_write_tokens",
                "reasoning_tokens",
                "cost",
            ] {
                *day.tokens.entry(key).or_default() += metrics[key].as_f64().unwrap_or(0.0);
            }
            let model = (
                run.model.clone().unwrap_or_default(),
                run.model_provider.clone().unwrap_or_default(),
            );
            *day.models.entry(model).or_default() += 1;
        }
    }
    let now = crate::api::now_s();
    let metrics: Vec<Value> = days
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
            let tokens: serde_json::Map<String, Value> = day
                .tokens
                .iter()
                .map(|(key, value)| {
                    let value = if *key == "cost" {
                        json!(value)
                    } else {
                        json!(*value as u64)
                    };
                    ((*key).to_owned(), value)
                })
                .collect();
            json!({
                "id": date,
                "agent_runs_count": day.runs,
                "agent_sessions_count": day.sessions,
                "team_runs_count": 0,
                "team_sessions_count": 0,
                "workflow_runs_count": 0,
                "workflow_sessions_count": 0,
                "users_count": day.users.len(),
                "token_metrics": tokens,
                "model_metrics": day.models.iter().map(|((model, provider), count)| json!({
                    "model_id": model, "model_provider": provider, "count": count,
                })).collect::<Vec<_>>(),
                "date": day.start_s,
                "created_at": now,
                "updated_at": now,
            })
        })
        .collect();
    Ok(Json(json!({"metrics": metrics, "updated_at": now})))
}

/// Runtime counters and the journal's sync latency, in the Prometheus text format.
pub async fn prometheus(State(state): State<AppState>) -> Result<Response, ApiError> {
    let runtime = &state.runtime;
    let counters = runtime.counters();
    let stats = runtime.journal().stats();
    let active = runtime.sessions_in_memory().await? as u64;
    let sessions = runtime.sessions()?.len() as u64;
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
    let _ = writeln!(
        text,
        "# HELP turnstile_journal_sync_seconds Time of each group fdatasync.\n# TYPE turnstile_journal_sync_seconds histogram"
    );
    for (bound, count) in SYNC_BUCKETS_US.iter().zip(&stats.sync_buckets) {
        let _ = writeln!(
            text,
            "turnstile_journal_sync_seconds_bucket{{le=\"{}\"}} {count}",
            *bound as f64 / 1e6
        );
    }
    let _ = writeln!(
        text,
        "turnstile_journal_sync_seconds_bucket{{le=\"+Inf\"}} {}",
        stats.syncs
    );
    let _ = writeln!(
        text,
        "turnstile_journal_sync_seconds_sum {}",
        stats.sync_us_total as f64 / 1e6
    );
    let _ = writeln!(text, "turnstile_journal_sync_seconds_count {}", stats.syncs);
    Ok(([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

#[cfg(test)]
mod tests {
    use super::date_of;

    #[test]
    fn civil_dates() {
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(951_782_400), "2000-02-29");
        assert_eq!(date_of(1_796_040_000), "2026-11-30");
        assert_eq!(date_of(-86_400), "1969-12-31");
    }
}
