//! The scripted harness: a deterministic coding agent driven by the message text.
//!
//! It ships in the binary (the default agent), so turnstile runs with nothing
//! installed. Directives are lines starting with `/` (see `spec/scripted-harness.md`);
//! everything else is prose. Its harness session is its transcript: JSON lines of
//! `user`, `tool_use`, `tool_result` and `assistant` entries, which the runtime
//! journals and hands back, exactly as it does for the real CLIs. `/compact` compacts
//! that transcript; `/lost-session` makes a resume fail as a vanished CLI session does.
//! Only its file tools (`files.rs`) touch the disk, in the turn's working directory;
//! it never touches the network.

mod files;
mod parse;
mod pause;

use futures::future::BoxFuture;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{
    CompactRequest, Compaction, Decision, ErrorKind, EventSink, Harness, HarnessError,
    HarnessEvent, HarnessInfo, ToolCall, TurnOutcome, TurnRequest, Usage,
};
pub use parse::DIRECTIVES;
use parse::{Script, Step, big_text, json_text, parse};

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct ScriptedHarness;

/// How `/history` names a user message: its first line of prose, or `(directives)`.
fn history_label(message: &str) -> String {
    message
        .lines()
        .find(|line| !line.starts_with('/') && !line.trim().is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| "(directives)".to_owned())
}

/// The conversation as `/history` shows it: one line per earlier user message, oldest
/// first, where the last compaction's summary stands for the messages it replaced.
fn history_lines(transcript: &[String]) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in transcript
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
    {
        match entry["type"].as_str() {
            Some("user") => lines.push(history_label(entry["text"].as_str().unwrap_or_default())),
            Some("compact_boundary") => {
                lines = vec![entry["summary"].as_str().unwrap_or_default().to_owned()];
            }
            _ => {}
        }
    }
    lines
}

/// Compacts a scripted transcript: a boundary line whose summary replaces every
/// history line so far. `None` when there are fewer than two to replace.
fn compaction(transcript: &[String]) -> Option<(String, String, u32)> {
    let replaced = history_lines(transcript).len() as u32;
    if replaced < 2 {
        return None;
    }
    let summary = format!("[summary of {replaced} messages]");
    let line = json!({"type": "compact_boundary", "uuid": uuid::Uuid::now_v7().to_string(), "summary": summary, "replaced": replaced});
    Some((line.to_string(), summary, replaced))
}

async fn emit(events: &EventSink, event: HarnessEvent) -> Result<(), HarnessError> {
    events
        .send(event)
        .await
        .map_err(|_| HarnessError::Cancelled)
}

fn check(cancel: &CancellationToken) -> Result<(), HarnessError> {
    if cancel.is_cancelled() {
        Err(HarnessError::Cancelled)
    } else {
        Ok(())
    }
}

/// Splits the answer into a few deltas, on character boundaries.
fn deltas(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(3).max(1);
    chars
        .chunks(size)
        .map(|chunk| chunk.iter().collect())
        .collect()
}

async fn run(
    request: TurnRequest,
    events: EventSink,
    cancel: CancellationToken,
) -> Result<TurnOutcome, HarnessError> {
    let script = parse(&request.message)?;
    if script.lost_session
        && let Some(id) = &request.harness_session_id
    {
        return Err(HarnessError::Failed {
            kind: ErrorKind::SessionNotFound,
            message: format!("No conversation found with session ID: {id}"),
        });
    }
    let harness_session_id = request
        .harness_session_id
        .clone()
        .unwrap_or_else(|| format!("scripted-{}", uuid::Uuid::now_v7()));
    emit(&events, HarnessEvent::SessionStarted { harness_session_id }).await?;
    let continuation = pause::continuation(&request)?;
    if !request.paused_before {
        let user_line = json!({"type": "user", "uuid": uuid::Uuid::now_v7().to_string(), "text": request.message});
        transcript_line(&events, user_line).await?;
    }
    let mut counts = Counts::default();
    for step in &script.steps {
        check(&cancel)?;
        if let Some(paused) =
            play(step, &request, &events, &cancel, &mut counts, &continuation).await?
        {
            return Ok(TurnOutcome::paused(vec![paused]));
        }
    }
    check(&cancel)?;
    if script.compact {
        return compact_turn(&request, &events).await;
    }
    let content = answer(&script, &request)?;
    for delta in deltas(&content) {
        emit(&events, HarnessEvent::ContentDelta { text: delta }).await?;
    }
    let answer_line =
        json!({"type": "assistant", "uuid": uuid::Uuid::now_v7().to_string(), "text": content});
    transcript_line(&events, answer_line).await?;
    let usage = match script.usage {
        Some((input, output, cache_read, cost)) => Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: cache_read,
            cost_usd: Some(cost),
            ..Usage::default()
        },
        None => Usage {
            input_tokens: (request.message.chars().count() / 4) as u64,
            output_tokens: (content.chars().count() / 4) as u64,
            ..Usage::default()
        },
    };
    Ok(TurnOutcome {
        content,
        usage,
        paused: Vec::new(),
    })
}

/// Emits one transcript line.
async fn transcript_line(events: &EventSink, line: serde_json::Value) -> Result<(), HarnessError> {
    emit(
        events,
        HarnessEvent::TranscriptLine {
            line: line.to_string(),
        },
    )
    .await
}

/// A turn's tool calls so far: those the script asked for (the turn's, over its
/// attempts when it paused), and those completed in this attempt.
#[derive(Debug, Default)]
struct Counts {
    asked: u32,
    completed_here: u64,
}

/// Plays one step of the script: a tool call, a sleep (cancellable), or a failure. A
/// step the turn played before its pause is skipped; a call that must wait for a
/// decision pauses the turn (`Some`: the call waiting).
async fn play(
    step: &Step,
    request: &TurnRequest,
    events: &EventSink,
    cancel: &CancellationToken,
    counts: &mut Counts,
    continuation: &pause::Continuation,
) -> Result<Option<ToolCall>, HarnessError> {
    let before_pause = counts.asked < continuation.asked;
    match step {
        Step::Tool {
            name,
            args,
            error,
            parent,
            result_bytes,
            file,
        } => {
            counts.asked += 1;
            let call = ScriptedCall {
                number: counts.asked,
                name,
                args,
                error: *error,
                parent: parent.as_deref(),
                result_bytes: *result_bytes,
                file: file.as_ref(),
            };
            play_tool(call, request, events, cancel, counts, continuation).await
        }
        _ if before_pause => Ok(None),
        Step::Sleep(duration) => {
            tokio::select! {
                _ = tokio::time::sleep(*duration) => Ok(None),
                _ = cancel.cancelled() => Err(HarnessError::Cancelled),
            }
        }
        Step::FailTransient(attempts) if request.attempt <= *attempts => {
            Err(HarnessError::Failed {
                kind: ErrorKind::Transient,
                message: format!(
                    "scripted transient failure (attempt {} of {attempts} failing)",
                    request.attempt
                ),
            })
        }
        Step::FailTransient(_) => Ok(None),
        Step::FailUsageLimit(seconds) if request.attempt == 1 => {
            let resets_at_us = turnstile_journal::now_us()
                .saturating_add((*seconds as i64).saturating_mul(1_000_000));
            Err(HarnessError::UsageLimit {
                message: format!("scripted usage limit, resetting in {seconds} s"),
                resets_at_us,
            })
        }
        Step::FailUsageLimit(_) => Ok(None),
        Step::FailPermanent(kind) => Err(HarnessError::Failed {
            kind: *kind,
            message: format!("scripted permanent failure: {}", kind.slug()),
        }),
    }
}

/// Plays a tool call: skipped when it ran before the turn's pause; the call the turn
/// paused on carries out its decision; a call that must wait pauses the turn.
async fn play_tool(
    call: ScriptedCall<'_>,
    request: &TurnRequest,
    events: &EventSink,
    cancel: &CancellationToken,
    counts: &mut Counts,
    continuation: &pause::Continuation,
) -> Result<Option<ToolCall>, HarnessError> {
    let waiting = continuation
        .waiting
        .as_ref()
        .filter(|_| counts.asked == continuation.asked);
    if counts.asked <= continuation.asked && waiting.is_none() {
        return Ok(None);
    }
    let decided = match waiting {
        Some(waiting) => match decision_on(request, waiting) {
            Some(decision) => Some(decision),
            // Asked before, still undecided: it waits again.
            None => return Ok(Some(waiting.clone())),
        },
        None if request.approvals.matches(call.tool().0) => {
            return ask(request, events, &call).await.map(Some);
        }
        None => None,
    };
    call_tool(request, events, call, decided).await?;
    counts.completed_here += 1;
    // The runtime records the workspace after the call before the next one runs.
    if let Some(settled) = &request.settled {
        tokio::select! {
            () = settled.wait(counts.completed_here) => {}
            _ = cancel.cancelled() => return Err(HarnessError::Cancelled),
        }
    }
    Ok(None)
}

/// One tool call of a script.
struct ScriptedCall<'a> {
    /// Its number in the attempt, from 1.
    number: u32,
    name: &'a str,
    args: &'a str,
    error: bool,
    /// The call that delegated it (`#N`: this attempt's N-th).
    parent: Option<&'a str>,
    /// Its result's length, from `/big`.
    result_bytes: Option<usize>,
    /// A file tool, done in the turn's working directory.
    file: Option<&'a files::FileAction>,
}

impl ScriptedCall<'_> {
    /// The call's name and arguments as its events carry them.
    fn tool(&self) -> (&str, &str) {
        (self.name, self.args)
    }

    /// The call as its events carry it, without a result.
    fn journaled(&self, request: &TurnRequest) -> ToolCall {
        ToolCall {
            tool_call_id: format!(
                "call_{}_{}_{}",
                request.run_id, request.attempt, self.number
            ),
            tool_name: self.name.to_owned(),
            tool_args: self.args.to_owned(),
            result: None,
            tool_call_error: false,
            // `#N` names this attempt's N-th call (its id is made here).
            parent_tool_call_id: self.parent.map(|parent| {
                match parent.strip_prefix('#').and_then(|n| n.parse::<u32>().ok()) {
                    Some(n) => format!("call_{}_{}_{n}", request.run_id, request.attempt),
                    None => parent.to_owned(),
                }
            }),
        }
    }
}

/// The decision on a call the turn paused on, if the request carries one.
fn decision_on<'a>(request: &'a TurnRequest, waiting: &ToolCall) -> Option<&'a Decision> {
    request
        .decisions
        .iter()
        .find(|decision| decision.tool.tool_call_id == waiting.tool_call_id)
}

/// A call that waits for a decision: its use line is written (the model asked for it),
/// and the turn pauses before it runs.
async fn ask(
    request: &TurnRequest,
    events: &EventSink,
    call: &ScriptedCall<'_>,
) -> Result<ToolCall, HarnessError> {
    let tool = call.journaled(request);
    let use_line =
        json!({"type": "tool_use", "id": tool.tool_call_id, "name": call.name, "input": call.args});
    transcript_line(events, use_line).await?;
    Ok(tool)
}

/// A scripted tool call: started, its use and result lines, completed. A call decided
/// after a pause keeps its id and use line; denied, it does not run and its result
/// says so.
async fn call_tool(
    request: &TurnRequest,
    events: &EventSink,
    call: ScriptedCall<'_>,
    decided: Option<&Decision>,
) -> Result<(), HarnessError> {
    let mut tool = match decided {
        Some(decision) => decision.tool.clone(),
        None => call.journaled(request),
    };
    let ScriptedCall {
        name,
        mut error,
        result_bytes,
        file,
        ..
    } = call;
    emit(events, HarnessEvent::ToolCallStarted { tool: tool.clone() }).await?;
    if decided.is_none() {
        let use_line = json!({"type": "tool_use", "id": tool.tool_call_id, "name": name, "input": tool.tool_args});
        transcript_line(events, use_line).await?;
    }
    let result = match (file, result_bytes) {
        _ if decided.is_some_and(|decision| !decision.confirmed) => {
            error = true;
            decided.map(Decision::denial).unwrap_or_default()
        }
        (Some(file), _) => {
            let root = request
                .cwd
                .clone()
                .unwrap_or_else(|| std::path::PathBuf::from("."));
            let done = file.perform(&root);
            error = done.is_err();
            done.unwrap_or_else(|failure| failure)
        }
        (None, Some(bytes)) => big_text(bytes),
        (None, None) if error => format!("error:{name}"),
        (None, None) => format!("ok:{name}"),
    };
    let result_line = json!({"type": "tool_result", "tool_use_id": tool.tool_call_id, "content": result, "is_error": error});
    transcript_line(events, result_line).await?;
    tool.result = Some(result);
    tool.tool_call_error = error;
    emit(events, HarnessEvent::ToolCallCompleted { tool }).await
}

/// `/compact` as a message compacts the session so far, this message excluded.
async fn compact_turn(
    request: &TurnRequest,
    events: &EventSink,
) -> Result<TurnOutcome, HarnessError> {
    let compacted = compaction(&request.transcript.lines()?);
    let content = match &compacted {
        Some((_, summary, replaced)) => format!("Compacted {replaced} messages into {summary}"),
        None => "Not enough messages to compact".to_owned(),
    };
    if let Some((line, summary, replaced_messages)) = compacted {
        emit(events, HarnessEvent::TranscriptLine { line }).await?;
        emit(
            events,
            HarnessEvent::Compacted {
                summary,
                replaced_messages,
            },
        )
        .await?;
    }
    for delta in deltas(&content) {
        emit(events, HarnessEvent::ContentDelta { text: delta }).await?;
    }
    Ok(TurnOutcome {
        content,
        usage: Usage::default(),
        paused: Vec::new(),
    })
}

/// The turn's answer: the scripted JSON or reply, the history, or an echo.
fn answer(script: &Script, request: &TurnRequest) -> Result<String, HarnessError> {
    Ok(if let Some(bytes) = script.big {
        big_text(bytes)
    } else if let Some(json) = &script.json {
        json_text(json, "json")?
    } else if let Some(reply) = &script.reply {
        reply.clone()
    } else if script.history {
        let mut lines = history_lines(&request.transcript.lines()?);
        lines.push(history_label(&request.message));
        lines.join("\n")
    } else if script.has_directive {
        format!("echo: {}", script.prose.join("\n"))
    } else {
        format!("echo: {}", request.message)
    })
}

impl Harness for ScriptedHarness {
    fn check_message(&self, message: &str) -> Result<(), String> {
        match parse(message) {
            Ok(_) => Ok(()),
            Err(HarnessError::Failed { message, .. }) => Err(message),
            Err(other) => Err(other.to_string()),
        }
    }

    fn info(&self) -> HarnessInfo {
        HarnessInfo {
            sdk: "scripted".into(),
            model: "scripted".into(),
            model_provider: "turnstile".into(),
        }
    }

    fn run_turn(
        &self,
        request: TurnRequest,
        events: EventSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<TurnOutcome, HarnessError>> {
        Box::pin(run(request, events, cancel))
    }

    fn compact(
        &self,
        request: CompactRequest,
    ) -> BoxFuture<'static, Result<Compaction, HarnessError>> {
        let outcome = match compaction(&request.transcript) {
            Some((line, summary, replaced_messages)) => Compaction::Compacted {
                lines: vec![line],
                summary,
                replaced_messages,
            },
            None => Compaction::NothingToCompact {
                reason: "Not enough messages to compact".into(),
            },
        };
        Box::pin(futures::future::ready(Ok(outcome)))
    }
}
