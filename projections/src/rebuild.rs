//! Rebuilding every projection from the events alone and comparing it with the stored
//! projections (`turnstile journal rebuild`).
//!
//! A stored projection says which sequence it is as of; the rebuild folds each session
//! up to there, so a projection written before the last events is not a difference.
//! It reads the journal once, in global order, and changes nothing.

use std::collections::BTreeMap;

use serde_json::Value;
use turnstile_journal::{Journal, JournalPos, SessionId};

use crate::SessionState;

/// What a rebuild found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebuildReport {
    /// Sessions rebuilt.
    pub sessions: u64,
    /// Events folded.
    pub events: u64,
    /// Each difference, as `session <id>: <path>: stored <a>, rebuilt <b>`.
    pub differences: Vec<String>,
}

/// The first differing paths between two JSON values, at most `limit`.
fn diff(path: &str, stored: &Value, rebuilt: &Value, out: &mut Vec<String>, limit: usize) {
    if out.len() >= limit || stored == rebuilt {
        return;
    }
    match (stored, rebuilt) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                diff(
                    &format!("{path}.{key}"),
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                    out,
                    limit,
                );
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (index, (x, y)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{index}]"), x, y, out, limit);
            }
        }
        _ => out.push(format!("{path}: stored {stored}, rebuilt {rebuilt}")),
    }
}

/// Folds every session from the journal and compares it with its stored projection.
pub fn rebuild(
    journal: &Journal,
    mut progress: impl FnMut(u64),
) -> Result<RebuildReport, turnstile_journal::Error> {
    let mut stored: BTreeMap<String, Value> = BTreeMap::new();
    for (key, value) in journal.projections()? {
        if let Some(session) = key.strip_prefix("session/") {
            stored.insert(
                session.to_owned(),
                serde_json::from_slice(&value).unwrap_or(Value::Null),
            );
        }
    }
    let mut states: BTreeMap<SessionId, SessionState> = BTreeMap::new();
    let mut report = RebuildReport::default();
    for record in journal.read_from(JournalPos(0)) {
        let record = record?;
        report.events += 1;
        if report.events % 4096 == 0 {
            progress(report.events);
        }
        let as_of = stored
            .get(record.session_id.as_str())
            .and_then(|s| s["as_of_seq"].as_u64())
            .unwrap_or(u64::MAX);
        if record.seq.0 >= as_of {
            continue;
        }
        states
            .entry(record.session_id.clone())
            .or_insert_with(|| SessionState::new(record.session_id.clone()))
            .apply(&record);
    }
    progress(report.events);
    report.sessions = states.len() as u64;
    for (session_id, state) in &states {
        let rebuilt = state.summary();
        match stored.get(session_id.as_str()) {
            None => report
                .differences
                .push(format!("session {session_id}: no stored projection")),
            Some(stored) => {
                let mut found = Vec::new();
                diff("", stored, &rebuilt, &mut found, 8);
                report.differences.extend(
                    found
                        .into_iter()
                        .map(|d| format!("session {session_id}: {}", d.trim_start_matches('.'))),
                );
            }
        }
    }
    for session in stored.keys() {
        if !states.keys().any(|id| id.as_str() == session) {
            report.differences.push(format!(
                "session {session}: stored projection of a session with no events"
            ));
        }
    }
    Ok(report)
}

/// Folds every session and stores its projection (after an import, whose export
/// carries only events). Returns the sessions written.
pub fn store_all(journal: &Journal) -> Result<u64, turnstile_journal::Error> {
    let mut states: BTreeMap<SessionId, SessionState> = BTreeMap::new();
    for record in journal.read_from(JournalPos(0)) {
        let record = record?;
        states
            .entry(record.session_id.clone())
            .or_insert_with(|| SessionState::new(record.session_id.clone()))
            .apply(&record);
    }
    for (session_id, state) in &states {
        journal.put_projection(
            &format!("session/{session_id}"),
            state.summary().to_string().as_bytes(),
        )?;
    }
    Ok(states.len() as u64)
}
