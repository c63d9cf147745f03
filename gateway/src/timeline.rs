//! `turnstile journal timeline`: a readable, time-ordered account of a session from
//! its journal stream alone: runs, attempts, tool calls, retries, cancellations,
//! forks, compactions, attachments and warnings, each line with its journal position.
//!
//! Transcript lines and text deltas are counted, not printed: the audit trail is the
//! events, the full text is one `journal export` away.

use turnstile_journal::{ChangeKind, Event, FileChange, Recorded, RunEvent, RunId, SnapshotPoint};

fn clip(text: &str, max: usize) -> String {
    let one_line = text.replace('\n', "⏎");
    if one_line.chars().count() <= max {
        one_line
    } else {
        format!("{}…", one_line.chars().take(max).collect::<String>())
    }
}

/// `YYYY-MM-DD hh:mm:ss.mmm` (UTC) of a time in microseconds.
fn time(us: i64) -> String {
    let seconds = us.div_euclid(1_000_000);
    let of_day = seconds.rem_euclid(86_400);
    format!(
        "{} {:02}:{:02}:{:02}.{:03}",
        crate::wire::date_of(seconds),
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        us.rem_euclid(1_000_000) / 1000
    )
}

fn short(run_id: &RunId) -> String {
    let text = run_id.as_str();
    text.get(text.len().saturating_sub(8)..)
        .unwrap_or(text)
        .to_owned()
}

/// `+added ~modified -removed`, by path.
fn changed_files(changes: &[FileChange]) -> String {
    changes
        .iter()
        .map(|change| {
            let sign = match change.change {
                ChangeKind::Added => '+',
                ChangeKind::Modified => '~',
                ChangeKind::Removed => '-',
            };
            format!("{sign}{}", change.path)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What one record says, or `None` for records the timeline only counts.
fn describe(event: &Event) -> Option<String> {
    Some(match event {
        Event::SessionCreated { agent_id, user_id } => {
            format!(
                "session created for agent {agent_id}{}",
                user_id
                    .as_ref()
                    .map(|u| format!(", user {u}"))
                    .unwrap_or_default()
            )
        }
        Event::SessionDeleted { reason } => format!("session deleted ({reason})"),
        // Readers resolve it to the event it stands for; seen only in a damaged journal.
        Event::StoredApart { bytes, .. } => format!("an event of {bytes} bytes stored apart"),
        Event::RunQueued { run_id, input, .. } => {
            format!("run …{} queued: \"{}\"", short(run_id), clip(input, 60))
        }
        Event::RunStarted {
            run_id,
            model,
            model_provider,
        } => format!(
            "run …{} started on {model} ({model_provider})",
            short(run_id)
        ),
        Event::AttemptStarted {
            run_id,
            attempt,
            harness_session_id,
        } => {
            format!(
                "run …{} attempt {attempt} on harness session {harness_session_id}",
                short(run_id)
            )
        }
        Event::AttemptFailed {
            run_id,
            attempt,
            error_type,
            message,
            retryable,
        } => format!(
            "run …{} attempt {attempt} failed ({error_type}, {}): {}",
            short(run_id),
            if *retryable { "retryable" } else { "permanent" },
            clip(message, 80)
        ),
        // Said on its `Completed` run event, which carries the answer and metrics.
        Event::RunCompleted { .. } => return None,
        Event::RunFailed {
            run_id,
            error_type,
            message,
            ..
        } => format!(
            "run …{} failed ({error_type}): {}",
            short(run_id),
            clip(message, 80)
        ),
        Event::RunCancelled { run_id, reason } => {
            format!("run …{} cancelled: {reason}", short(run_id))
        }
        Event::HarnessSessionForked {
            run_id,
            from_run_id,
            message_index,
            from_harness_session_id,
            harness_session_id,
            transcript_lines,
        } => format!(
            "run …{} forks run …{} at message {message_index}: harness session {from_harness_session_id} → {harness_session_id}, {transcript_lines} transcript lines kept",
            short(run_id),
            short(from_run_id)
        ),
        Event::TranscriptCompacted {
            harness_session_id,
            summary,
            replaced_messages,
            ..
        } => {
            format!(
                "harness session {harness_session_id} compacted: \"{}\" replaces {replaced_messages} messages",
                clip(summary, 60)
            )
        }
        Event::IdempotencyKeyBound { run_id, .. } => {
            format!("run …{} bound to an idempotency key", short(run_id))
        }
        Event::AttachmentAdded {
            run_id,
            name,
            media_type,
            sha256,
            content,
        } => format!(
            "run …{} attached {name} ({media_type}, {} bytes, sha256 {}…)",
            short(run_id),
            content.len(),
            sha256.get(..12).unwrap_or(sha256)
        ),
        // Counted, not printed: the snapshot that names them says what changed.
        Event::WorkspaceContent { .. } => return None,
        Event::WorkspaceChanged {
            run_id,
            point,
            changes,
        } => describe_snapshot(run_id, point, changes),
        Event::RunEventEmitted { run_id, event, .. } => describe_run_event(run_id, event)?,
        Event::TranscriptLineAppended { .. } => return None,
    })
}

/// A run paused: the calls that wait.
fn describe_pause(run_id: &RunId, tools: &[turnstile_journal::ToolCall]) -> String {
    let calls: Vec<String> = tools
        .iter()
        .map(|tool| {
            format!(
                "{} {}({})",
                tool.tool_call_id,
                tool.tool_name,
                clip(&tool.tool_args, 50)
            )
        })
        .collect();
    format!(
        "run …{} paused: waiting for a decision on {}",
        short(run_id),
        calls.join(", ")
    )
}

/// A paused run decided: each call approved or denied, by whom.
fn describe_decisions(
    run_id: &RunId,
    decisions: &[turnstile_journal::ToolDecision],
    decided_by: Option<&str>,
) -> String {
    let decided: Vec<String> = decisions
        .iter()
        .map(|decision| {
            let verdict = if decision.confirmed {
                "approved"
            } else {
                "denied"
            };
            let note = decision
                .note
                .as_deref()
                .map(|note| format!(" (\"{}\")", clip(note, 40)))
                .unwrap_or_default();
            format!("{} {verdict}{note}", decision.tool_call_id)
        })
        .collect();
    let by = decided_by.map(|by| format!(" by {by}")).unwrap_or_default();
    format!(
        "run …{} continued{by}: {}",
        short(run_id),
        decided.join(", ")
    )
}

/// What a run event says, or `None` for those the timeline only counts.
fn describe_run_event(run_id: &RunId, event: &RunEvent) -> Option<String> {
    Some(match event {
        RunEvent::Completed {
            content, metrics, ..
        } => format!(
            "run …{} completed: \"{}\" ({} tokens in, {} out)",
            short(run_id),
            clip(content, 60),
            metrics.input_tokens,
            metrics.output_tokens
        ),
        RunEvent::ToolCallCompleted { tool } => {
            let tool = &crate::wire::events::tool_json(tool);
            format!(
                "run …{} tool {}({}) → {}{}",
                short(run_id),
                tool["tool_name"].as_str().unwrap_or("?"),
                clip(&tool["tool_args"].to_string(), 50),
                clip(tool["result"].as_str().unwrap_or(""), 50),
                if tool["tool_call_error"] == true {
                    " [error]"
                } else {
                    ""
                }
            )
        }
        RunEvent::Paused { tools } => describe_pause(run_id, tools),
        RunEvent::Continued {
            decisions,
            decided_by,
        } => describe_decisions(run_id, decisions, decided_by.as_deref()),
        RunEvent::Warning { warning } => {
            let warning = &crate::wire::events::warning_json(warning);
            match warning["type"].as_str() {
                Some("retry") => format!(
                    "run …{} retry after attempt {} of {}, in {}s: {}",
                    short(run_id),
                    warning["attempt"],
                    warning["attempts"],
                    warning["delay"],
                    clip(warning["message"].as_str().unwrap_or(""), 60)
                ),
                _ => format!(
                    "run …{} warning {}: {}",
                    short(run_id),
                    warning["type"],
                    clip(warning["message"].as_str().unwrap_or(""), 80)
                ),
            }
        }
        _ => return None,
    })
}

/// A snapshot's line: when it was taken, and `+added ~modified -removed`.
fn describe_snapshot(run_id: &RunId, point: &SnapshotPoint, changes: &[FileChange]) -> String {
    format!(
        "run …{} files{}: {}",
        short(run_id),
        match point {
            SnapshotPoint::ToolCall { tool_call_id } => format!(" after {tool_call_id}"),
            SnapshotPoint::TurnEnd => " at the turn's end".to_owned(),
            SnapshotPoint::TurnStart => " before the session's first turn".to_owned(),
            SnapshotPoint::Rewound {
                from_run_id,
                tool_call_id,
            } => format!(
                " rewound to run …{}{}",
                short(from_run_id),
                tool_call_id
                    .as_ref()
                    .map(|id| format!(" after {id}"))
                    .unwrap_or_else(|| "'s start".to_owned())
            ),
        },
        clip(&changed_files(changes), 120)
    )
}

/// The timeline of a session's records, optionally of one run.
pub fn render(records: impl Iterator<Item = Recorded>, run: Option<&RunId>) -> Vec<String> {
    let mut lines = Vec::new();
    let mut quiet = 0u64;
    for record in records {
        if let Some(run) = run
            && record.event.run_id() != Some(run)
        {
            continue;
        }
        match describe(&record.event) {
            Some(text) => lines.push(format!(
                "{:>8}  {}  {text}",
                record.pos.0,
                time(record.ts_us)
            )),
            None => quiet += 1,
        }
    }
    lines.push(format!(
        "({quiet} transcript lines and streamed text deltas not shown)"
    ));
    lines
}
