//! Rebuilding every projection from the events alone and comparing it with the stored
//! projections (`turnstile journal rebuild`).
//!
//! Each stored projection (a session's facts, or one run) says which sequence of its
//! session it is as of. The rebuild folds every session once, in global order, and
//! compares each stored projection when the fold reaches that sequence, so a
//! projection written before later events is not a difference. A session's stored
//! workspace (`workspace/<id>`) is compared with its workspace's fold the same way. It
//! changes nothing.

use crate::{SessionState, WorkspaceState};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use turnstile_journal::{Journal, JournalPos, RunId, SessionId};

/// What a rebuild found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebuildReport {
    /// Sessions rebuilt.
    pub sessions: u64,
    /// Events folded.
    pub events: u64,
    /// Stored projections compared.
    pub compared: u64,
    /// Stored projections in an older build's layout (a run's options and metrics as
    /// JSON text, before record format 4): not compared; a read folds such a run again
    /// from the journal and stores it anew.
    pub older_layout: u64,
    /// Each difference, as `<key>: <path>: stored <a>, rebuilt <b>`.
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
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                diff(
                    &child,
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

/// A stored projection waiting for its session's fold to reach `as_of_seq`.
struct Check {
    key: String,
    run_id: Option<RunId>,
    /// A session's workspace (`workspace/<id>`), not its facts.
    workspace: bool,
    stored: Value,
}

/// Folds every session from the journal and compares it with its stored projections.
pub fn rebuild(
    journal: &Journal,
    mut progress: impl FnMut(u64),
) -> Result<RebuildReport, turnstile_journal::Error> {
    // Stored projections by session, then by the sequence they are as of.
    let mut checks: HashMap<String, BTreeMap<u64, Vec<Check>>> = HashMap::new();
    let mut report = RebuildReport::default();
    for (key, value) in journal.projections()? {
        let stored: Value = serde_json::from_slice(&value).unwrap_or(Value::Null);
        let (Some(session), Some(as_of)) =
            (stored["session_id"].as_str(), stored["as_of_seq"].as_u64())
        else {
            report
                .differences
                .push(format!("{key}: not a stored projection"));
            continue;
        };
        let run_id = key
            .strip_prefix("run/")
            .and_then(|id| RunId::parse(id).ok());
        checks
            .entry(session.to_owned())
            .or_default()
            .entry(as_of)
            .or_default()
            .push(Check {
                workspace: key.starts_with("workspace/"),
                key,
                run_id,
                stored,
            });
    }
    let mut states: BTreeMap<SessionId, SessionState> = BTreeMap::new();
    let mut workspaces = workspaces_of(&checks);
    for record in journal.read_from(JournalPos(0)) {
        let record = record?;
        report.events += 1;
        if let Some(workspace) = workspaces.get_mut(record.session_id.as_str()) {
            workspace.apply(&record);
        }
        if report.events % 4096 == 0 {
            progress(report.events);
        }
        let state = states
            .entry(record.session_id.clone())
            .or_insert_with(|| SessionState::new(record.session_id.clone()));
        state.apply(&record);
        let Some(due) = checks
            .get_mut(record.session_id.as_str())
            .and_then(|by_seq| by_seq.remove(&state.next_seq))
        else {
            continue;
        };
        for check in due {
            if check.workspace {
                let rebuilt = workspaces
                    .get(record.session_id.as_str())
                    .map(to_json)
                    .unwrap_or(Value::Null);
                compare_value(&check, &rebuilt, &mut report);
            } else {
                compare(state, &check, &mut report);
            }
        }
    }
    progress(report.events);
    report.sessions = states.len() as u64;
    for (session, left) in checks {
        for (as_of, pending) in left {
            for check in pending {
                report.differences.push(format!(
                    "{}: stored as of sequence {as_of}, but session {session} has no such record",
                    check.key
                ));
            }
        }
    }
    Ok(report)
}

/// Compares one stored projection with the fold at its sequence (one in an older
/// build's layout is counted, not compared).
fn compare(state: &SessionState, check: &Check, report: &mut RebuildReport) {
    let rebuilt = match &check.run_id {
        Some(run_id) => match state.run(run_id) {
            Some(run) => to_json(&state.stored_run(run)),
            None => Value::Null,
        },
        None => to_json(&state.stored()),
    };
    let mut found = Vec::new();
    diff("", &check.stored, &rebuilt, &mut found, 8);
    // Only a form that differs is decoded again, to tell an older layout from a wrong read.
    if !found.is_empty() && !in_this_layout(check) {
        report.older_layout += 1;
        return;
    }
    report.compared += 1;
    report
        .differences
        .extend(found.into_iter().map(|d| format!("{}: {d}", check.key)));
}

/// The sessions with a stored workspace, each with its empty fold (only theirs are
/// folded as workspaces).
fn workspaces_of(
    checks: &HashMap<String, BTreeMap<u64, Vec<Check>>>,
) -> HashMap<String, WorkspaceState> {
    checks
        .iter()
        .filter(|(_, by_seq)| by_seq.values().flatten().any(|check| check.workspace))
        .filter_map(|(session, _)| SessionId::parse(session).ok())
        .map(|session| (session.to_string(), WorkspaceState::new(session)))
        .collect()
}

/// Compares a stored workspace with its fold at the same sequence.
fn compare_value(check: &Check, rebuilt: &Value, report: &mut RebuildReport) {
    let mut found = Vec::new();
    diff("", &check.stored, rebuilt, &mut found, 8);
    report.compared += 1;
    report
        .differences
        .extend(found.into_iter().map(|d| format!("{}: {d}", check.key)));
}

/// Whether a stored projection decodes as this build writes it.
fn in_this_layout(check: &Check) -> bool {
    match check.run_id {
        Some(_) => serde_json::from_value::<crate::StoredRun>(check.stored.clone()).is_ok(),
        None => serde_json::from_value::<crate::StoredSession>(check.stored.clone()).is_ok(),
    }
}

fn to_json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// Folds every session and stores its projections (after an import, whose export
/// carries only events). Returns the projections written.
pub fn store_all(journal: &Journal) -> Result<u64, turnstile_journal::Error> {
    let mut states: BTreeMap<SessionId, SessionState> = BTreeMap::new();
    for record in journal.read_from(JournalPos(0)) {
        let record = record?;
        states
            .entry(record.session_id.clone())
            .or_insert_with(|| SessionState::new(record.session_id.clone()))
            .apply(&record);
    }
    let mut written = 0;
    for (session_id, state) in &states {
        journal.put_projection(
            &format!("session/{session_id}"),
            to_json(&state.stored()).to_string().as_bytes(),
        )?;
        for run in &state.runs {
            journal.put_projection(
                &format!("run/{}", run.run_id),
                to_json(&state.stored_run(run)).to_string().as_bytes(),
            )?;
            written += 1;
        }
        written += 1;
    }
    Ok(written)
}
