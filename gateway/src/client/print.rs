//! How the operator CLI prints what the server answered: tables, short texts, times, a
//! run, an event of a tail; `--json` prints the server's own JSON instead.

use serde_json::Value;

use crate::wire::dto::{PageMeta, RunOutput};
use std::io::Write;

/// Prints rows as aligned columns under a header.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.trim_end().to_owned()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.clone()));
        out.push('\n');
    }
    out
}

/// A JSON value as a cell: a string as it is, `null` as `-`.
pub(super) fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// An optional text as a cell (`-` when absent).
pub(super) fn or_dash(text: Option<&str>) -> String {
    text.unwrap_or("-").to_owned()
}

/// The first line of a text, at most `max` characters.
pub(super) fn short(value: &Value, max: usize) -> String {
    short_text(&text(value), max)
}

/// The first line of `text`, at most `max` characters.
pub(super) fn short_text(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    } else {
        line.to_owned()
    }
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(super) fn time(seconds: i64) -> String {
    let date = turnstile_projections::date_of_us(seconds * 1_000_000);
    let day = seconds.rem_euclid(86_400);
    format!(
        "{date} {:02}:{:02}:{:02}",
        day / 3600,
        day % 3600 / 60,
        day % 60
    )
}

pub(super) fn print_json(value: &Value) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// The line under a paginated table: `page 1 of 3 (47 sessions)`.
pub(super) fn print_page(meta: &PageMeta, what: &str) {
    outln!(
        "page {} of {} ({} {what})",
        meta.page,
        meta.total_pages,
        meta.total_count
    );
}

/// Runs as rows under [`RUN_HEADER`].
pub(super) fn run_rows(runs: &[RunOutput]) -> Vec<Vec<String>> {
    runs.iter()
        .map(|run| {
            vec![
                run.run_id.clone(),
                run.session_id.clone(),
                run.status.to_string(),
                time(run.created_at),
                short(&run.content, 40),
            ]
        })
        .collect()
}

pub(super) const RUN_HEADER: [&str; 5] = ["RUN", "SESSION", "STATUS", "CREATED", "CONTENT"];

/// A run, one field a line.
pub(super) fn print_run(run: &RunOutput) {
    outln!("run       {}", run.run_id);
    outln!("agent     {}", run.agent_id);
    outln!("session   {}", run.session_id);
    outln!("status    {}", run.status);
    outln!("created   {}", time(run.created_at));
    if let Some(error) = &run.metadata.error_type {
        outln!("error     {error}");
    }
    if let Some(from) = &run.forked_from_run_id {
        outln!(
            "forked    from {from} at message {}",
            run.forked_from_message_index
                .map_or_else(|| "-".to_owned(), |index| index.to_string())
        );
    }
    outln!("tools     {}", run.tools.len());
    for tool in run
        .tools
        .iter()
        .filter(|tool| tool.requires_confirmation && tool.confirmed.is_none())
    {
        outln!(
            "waiting   {} {} {} (turnstile runs approve|deny {} --call {})",
            tool.tool_call_id,
            tool.tool_name,
            tool.tool_args,
            run.run_id,
            tool.tool_call_id
        );
    }
    outln!("tokens    {}", text(&run.metrics["total_tokens"]));
    outln!("content   {}", text(&run.content));
}

/// One event as a person reads it.
pub(super) fn describe(event: &Value) -> String {
    let tool = &event["tool"];
    match event["event"].as_str().unwrap_or_default() {
        "ToolCallStarted" => format!("{} {}", text(&tool["tool_name"]), text(&tool["tool_args"])),
        "ToolCallCompleted" => format!(
            "{}{} -> {}",
            text(&tool["tool_name"]),
            if tool["tool_call_error"] == Value::Bool(true) {
                " (error)"
            } else {
                ""
            },
            short(&tool["result"], 60)
        ),
        "RunError" => format!(
            "{}: {}",
            text(&event["error_type"]),
            short(&event["content"], 80)
        ),
        "CustomEvent" => event["warning"].to_string(),
        "RunStarted" => format!("model {}", text(&event["model"])),
        _ if event.get("status").is_some() => format!(
            "{} {}",
            text(&event["status"]),
            event.get("total_events").map(text).unwrap_or_default()
        ),
        _ => short(&event["content"], 80),
    }
}
