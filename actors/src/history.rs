//! The session's history on its current branch, rendered for a fresh harness session.
//!
//! When a harness session cannot be resumed, the turn runs on a new one whose prompt
//! carries the conversation so far, with agno's rules: tool results over 2,000
//! characters keep their first 1,600 and last 400 (so a trailing `[exit code 1]`
//! survives), and a 24,000-character budget keeps the newest entries whole and marks
//! `[earlier history omitted]`. The branch follows fork lineage: a continuation's
//! past is its source run up to the continuation point, never the abandoned turns.

use turnstile_journal::limits::{
    BRANCH_STEPS_MAX, HISTORY_CHARS_MAX, TOOL_RESULT_CHARS_MAX, TOOL_RESULT_TAIL_CHARS,
};
use turnstile_projections::RunView;

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

/// Walks the session's current branch back from run `current` (excluded): each earlier
/// run, newest first, with the message boundary a continuation kept of it. A
/// continuation's predecessor is its source up to the continuation point; any other
/// run's is the run queued before it. Runs are read with `load` (their stored forms), one
/// at a time, so a walk costs the runs it visits.
pub struct BranchWalk<F> {
    load: F,
    next: Option<(turnstile_journal::RunId, Option<u32>)>,
    steps: usize,
}

fn predecessor(run: &RunView) -> Option<(turnstile_journal::RunId, Option<u32>)> {
    match &run.fork {
        Some(fork) => Some((fork.from_run_id.clone(), Some(fork.message_index))),
        None => run.previous_run.clone().map(|id| (id, None)),
    }
}

/// The walk back from `current`.
pub fn branch_walk<F>(load: F, current: &RunView) -> BranchWalk<F>
where
    F: FnMut(&turnstile_journal::RunId) -> Option<RunView>,
{
    BranchWalk {
        load,
        next: predecessor(current),
        steps: 0,
    }
}

impl<F> Iterator for BranchWalk<F>
where
    F: FnMut(&turnstile_journal::RunId) -> Option<RunView>,
{
    type Item = (RunView, Option<u32>);

    fn next(&mut self) -> Option<Self::Item> {
        let (run_id, until) = self.next.take()?;
        self.steps += 1;
        if self.steps > BRANCH_STEPS_MAX {
            return None;
        }
        let run = (self.load)(&run_id)?;
        self.next = predecessor(&run);
        Some((run, until))
    }
}

/// The history of the session's current branch before run `current` (excluded),
/// oldest first: as much of it as the prompt's budget can hold, and one run more, so
/// [`render_prompt`] marks what it leaves out. Runs are read one at a time, newest
/// first, so the cost is the budget, not the session's length.
pub fn branch_history(
    load: impl FnMut(&turnstile_journal::RunId) -> Option<RunView>,
    current: &RunView,
) -> Vec<HistoryEntry> {
    let mut runs = Vec::new();
    let mut used = 0;
    for (run, until) in branch_walk(load, current) {
        let entries = run_entries(&run, until);
        used += entries
            .iter()
            .map(|entry| entry.line().chars().count() + 1)
            .sum::<usize>();
        runs.push(entries);
        if used > HISTORY_CHARS_MAX {
            break;
        }
    }
    runs.into_iter().rev().flatten().collect()
}
