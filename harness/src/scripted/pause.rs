//! Where a paused scripted turn goes on (`spec/approvals.md`): its transcript since the
//! turn's user line says which tool calls it asked for, and whether the last one is
//! still waiting for its decision. A continued attempt skips what the turn did before
//! the pause (nothing runs twice) and carries out the decision on the waiting call.

use crate::{HarnessError, ToolCall, TurnRequest};
use serde_json::Value;

/// What a paused turn did before its pause.
#[derive(Debug, Default)]
pub(super) struct Continuation {
    /// Tool calls the turn asked for before the pause (the waiting one included).
    pub(super) asked: u32,
    /// The call that waits for its decision (asked, with no result).
    pub(super) waiting: Option<ToolCall>,
}

/// Reads the continuation of a turn that paused before, from its transcript; a turn that
/// never paused starts from its beginning.
pub(super) fn continuation(request: &TurnRequest) -> Result<Continuation, HarnessError> {
    if !request.paused_before {
        return Ok(Continuation::default());
    }
    let lines = request.transcript.lines()?;
    let entries: Vec<Value> = lines
        .iter()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let start = entries
        .iter()
        .rposition(|entry| entry["type"] == "user")
        .map_or(0, |position| position + 1);
    let mut continuation = Continuation::default();
    for entry in &entries[start..] {
        match entry["type"].as_str() {
            Some("tool_use") => {
                continuation.asked += 1;
                continuation.waiting = Some(ToolCall {
                    tool_call_id: entry["id"].as_str().unwrap_or_default().to_owned(),
                    tool_name: entry["name"].as_str().unwrap_or_default().to_owned(),
                    tool_args: entry["input"].as_str().unwrap_or("{}").to_owned(),
                    ..ToolCall::default()
                });
            }
            Some("tool_result")
                if continuation
                    .waiting
                    .as_ref()
                    .is_some_and(|call| entry["tool_use_id"] == call.tool_call_id.as_str()) =>
            {
                continuation.waiting = None;
            }
            _ => {}
        }
    }
    Ok(continuation)
}
