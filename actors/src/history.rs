//! The session's history on its current branch, rendered for a fresh harness session.
//!
//! When a harness session cannot be resumed, the turn runs on a new one whose prompt
//! carries the conversation so far, with agno's rules: tool results over 2,000
//! characters keep their first 1,600 and last 400 (so a trailing `[exit code 1]`
//! survives), and a 24,000-character budget keeps the newest entries whole and marks
//! `[earlier history omitted]`. The branch follows fork lineage: a continuation's
//! past is its source run up to the continuation point, never the abandoned turns.

use turnstile_projections::{RunView, SessionState};

/// Longest tool result kept whole, in characters.
pub const TOOL_RESULT_CHARS_MAX: usize = 2_000;
/// Characters kept from the end of a truncated tool result.
pub const TOOL_RESULT_TAIL_CHARS: usize = 400;
/// Budget of the rendered history, in characters.
pub const HISTORY_CHARS_MAX: usize = 24_000;

/// One entry of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryEntry {
    /// A user message.
    User(String),
    /// An assistant answer.
    Assistant(String),
    /// An assistant tool call.
    ToolCall {
        /// Tool name.
        name: String,
        /// Arguments as JSON text.
        arguments: String,
    },
    /// A tool's result.
    ToolResult(String),
}

impl HistoryEntry {
    fn line(&self) -> String {
        match self {
            HistoryEntry::User(text) => format!("user: {text}"),
            HistoryEntry::Assistant(text) => format!("assistant: {text}"),
            HistoryEntry::ToolCall { name, arguments } => {
                format!("assistant called {name}({arguments})")
            }
            HistoryEntry::ToolResult(result) => {
                format!("tool result: {}", truncate_tool_result(result))
            }
        }
    }
}

/// Keeps the head and the tail of a long tool result, saying how much was cut.
pub fn truncate_tool_result(result: &str) -> String {
    let chars: Vec<char> = result.chars().collect();
    if chars.len() <= TOOL_RESULT_CHARS_MAX {
        return result.to_owned();
    }
    let head: String = chars[..TOOL_RESULT_CHARS_MAX - TOOL_RESULT_TAIL_CHARS]
        .iter()
        .collect();
    let tail: String = chars[chars.len() - TOOL_RESULT_TAIL_CHARS..]
        .iter()
        .collect();
    let cut = chars.len() - TOOL_RESULT_CHARS_MAX;
    format!("{head}\n[... {cut} characters truncated ...]\n{tail}")
}

/// The prompt of a fresh session: the history, newest entries first to fit the budget,
/// then the current message. Without history, the message alone.
pub fn render_prompt(history: &[HistoryEntry], input: &str) -> String {
    if history.is_empty() {
        return input.to_owned();
    }
    let mut kept = Vec::new();
    let mut used = 0;
    for entry in history.iter().rev() {
        let line = entry.line();
        let cost = line.chars().count() + 1;
        if used + cost > HISTORY_CHARS_MAX {
            break;
        }
        used += cost;
        kept.push(line);
    }
    kept.reverse();
    let mut prompt = String::from("Previous conversation (for context, do not repeat it):\n");
    if kept.len() < history.len() {
        prompt.push_str("[earlier history omitted]\n");
    }
    prompt.push_str(&kept.join("\n"));
    prompt.push_str("\n\nCurrent message:\n");
    prompt.push_str(input);
    prompt
}

/// A run's messages as history entries, up to message boundary `until` (all when `None`).
fn run_entries(run: &RunView, until: Option<u32>) -> Vec<HistoryEntry> {
    // A run that never reached its harness is not part of the conversation.
    if run.attempts == 0 {
        return Vec::new();
    }
    let mut entries = vec![HistoryEntry::User(run.input.clone())];
    for tool in &run.tools {
        entries.push(HistoryEntry::ToolCall {
            name: tool.tool_name.clone(),
            arguments: tool.tool_args.to_string(),
        });
        if let Some(result) = &tool.result {
            entries.push(HistoryEntry::ToolResult(result.clone()));
        }
    }
    if run.status.is_terminal() && !run.content.is_empty() {
        entries.push(HistoryEntry::Assistant(run.content.clone()));
    }
    if let Some(until) = until {
        entries.truncate(until as usize);
    }
    entries
}

/// The runs of the session's current branch before run `current`, oldest first.
pub fn branch_runs<'a>(
    state: &'a SessionState,
    current: &turnstile_journal::RunId,
) -> Vec<&'a RunView> {
    branch_chain(state, current)
        .into_iter()
        .map(|(index, _)| &state.runs[index])
        .collect()
}

/// The history of the session's current branch before run `current` (excluded).
pub fn branch_history(
    state: &SessionState,
    current: &turnstile_journal::RunId,
) -> Vec<HistoryEntry> {
    branch_chain(state, current)
        .iter()
        .flat_map(|(index, until)| run_entries(&state.runs[*index], *until))
        .collect()
}

/// Indexes of the branch's runs before `current`, oldest first, each with the message
/// boundary a continuation kept of it.
fn branch_chain(
    state: &SessionState,
    current: &turnstile_journal::RunId,
) -> Vec<(usize, Option<u32>)> {
    let Some(position) = state.runs.iter().position(|run| &run.run_id == current) else {
        return Vec::new();
    };
    // Walk back from the run before `current`: a continuation's predecessor is its
    // source up to the continuation point; any other run's is the run before it.
    let predecessor = |index: usize| match &state.runs[index].fork {
        Some(fork) => state
            .runs
            .iter()
            .position(|run| run.run_id == fork.from_run_id)
            .map(|i| (i, Some(fork.message_index))),
        None => index.checked_sub(1).map(|i| (i, None)),
    };
    let mut chain = Vec::new();
    let mut cursor = predecessor(position);
    while let Some((index, until)) = cursor {
        chain.push((index, until));
        if chain.len() > state.runs.len() {
            break;
        }
        cursor = predecessor(index);
    }
    chain.reverse();
    chain
}
