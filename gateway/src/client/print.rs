//! How the operator CLI prints what the server answered: tables, short texts, times, a
//! run, an event of a tail; `--json` prints the server's own JSON instead.

use serde_json::Value;
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

pub(super) fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The first line of a text, at most `max` characters.
pub(super) fn short(value: &Value, max: usize) -> String {
    let text = text(value);
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    } else {
        line.to_owned()
    }
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(super) fn time(value: &Value) -> String {
    let Some(seconds) = value.as_i64() else {
        return text(value);
    };
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
pub(super) fn print_page(meta: &Value, what: &str) {
    outln!(
        "page {} of {} ({} {what})",
        text(&meta["page"]),
        text(&meta["total_pages"]),
        text(&meta["total_count"])
    );
}

pub(super) fn run_rows(runs: &[Value]) -> Vec<Vec<String>> {
    runs.iter()
        .map(|run| {
            vec![
                text(&run["run_id"]),
                text(&run["session_id"]),
                text(&run["status"]),
                time(&run["created_at"]),
                short(&run["content"], 40),
            ]
        })
        .collect()
}

pub(super) const RUN_HEADER: [&str; 5] = ["RUN", "SESSION", "STATUS", "CREATED", "CONTENT"];

pub(super) fn print_run(run: &Value) {
    outln!("run       {}", text(&run["run_id"]));
    outln!("agent     {}", text(&run["agent_id"]));
    outln!("session   {}", text(&run["session_id"]));
    outln!("status    {}", text(&run["status"]));
    outln!("created   {}", time(&run["created_at"]));
    if let Some(error) = run["metadata"]["error_type"].as_str() {
        outln!("error     {error}");
    }
    if !run["forked_from_run_id"].is_null() {
        outln!(
            "forked    from {} at message {}",
            text(&run["forked_from_run_id"]),
            text(&run["forked_from_message_index"])
        );
    }
    let tools = run["tools"].as_array().map_or(0, Vec::len);
    outln!("tools     {tools}");
    outln!("tokens    {}", text(&run["metrics"]["total_tokens"]));
    outln!("content   {}", text(&run["content"]));
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
