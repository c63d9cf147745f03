//! The CLI harness core: what every harness that drives a real coding-agent CLI does,
//! whatever the CLI's dialect.
//!
//! [`CliHarness`] owns a CLI session's lifecycle: a per-session config directory the
//! runtime owns, the transcript written back from the journal before a cold start and
//! mirrored line by line during a turn, the warm process pool, the turn loop (a warm
//! process that died before answering is replaced by a cold one; a process goes back
//! to the pool only after a turn that ended well), cancellation (kill the CLI and every
//! process below it) and compaction driven as a turn.
//!
//! A [`Dialect`] says everything CLI-specific: the command and its environment, where
//! the transcript lives and what identifies a line, how a line is restored into a
//! (forked) session, how one output line becomes steps, and how a turn's end is read
//! and its errors classified. This module names no CLI.

mod dialect;
mod pool;
mod process;
mod transcript;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile_journal::limits::INTERRUPT_GRACE_MS;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use crate::{
    CompactRequest, Compaction, ErrorKind, EventSink, Harness, HarnessError, HarnessEvent,
    HarnessInfo, TurnOutcome, TurnRequest,
};
use pool::{Pool, Warm};
use process::CliProcess;
use process::mirror;
use transcript::TranscriptTail;

pub use dialect::{CliSettings, Dialect, Launch, LineContext, Step, TurnStart};

/// A harness that drives a real CLI through its dialect; see the module documentation.
pub struct CliHarness<D: Dialect> {
    dialect: Arc<D>,
    pool: Arc<Pool>,
}

impl<D: Dialect> Clone for CliHarness<D> {
    fn clone(&self) -> Self {
        CliHarness {
            dialect: self.dialect.clone(),
            pool: self.pool.clone(),
        }
    }
}

impl<D: Dialect + std::fmt::Debug> std::fmt::Debug for CliHarness<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CliHarness")
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> CliHarness<D> {
    /// A harness speaking `dialect`; it starts no process until a turn needs one.
    pub fn new(dialect: impl Into<D>) -> Self {
        let dialect = dialect.into();
        let capacity = dialect.settings().warm_processes;
        CliHarness {
            dialect: Arc::new(dialect),
            pool: Arc::new(Pool::new(capacity)),
        }
    }
}

impl<D: Dialect> Harness for CliHarness<D> {
    fn info(&self) -> HarnessInfo {
        self.dialect.info()
    }

    fn run_turn(
        &self,
        request: TurnRequest,
        events: EventSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<TurnOutcome, HarnessError>> {
        let this = self.clone();
        Box::pin(async move { this.turn(request, events, cancel).await })
    }

    fn compact(
        &self,
        request: CompactRequest,
    ) -> BoxFuture<'static, Result<Compaction, HarnessError>> {
        let this = self.clone();
        Box::pin(async move { this.compact_session(request).await })
    }

    fn shutdown(&self) {
        self.pool.clear();
    }
}

/// What one turn did besides its events.
#[derive(Default)]
pub(crate) struct TurnState {
    /// The lines mirrored in this turn, in order.
    pub(crate) mirrored: Vec<String>,
    /// The CLI answered something.
    received: bool,
}

enum TurnEnd {
    /// The dialect's end of the turn.
    End(Value),
    /// The turn waits for a person's decision on these calls.
    Paused(Vec<crate::ToolCall>),
    /// stdout closed without one.
    Died(String),
}

fn io_error(what: &str, error: std::io::Error) -> HarnessError {
    HarnessError::Failed {
        kind: ErrorKind::Transient,
        message: format!("{what}: {error}"),
    }
}

impl<D: Dialect> CliHarness<D> {
    /// Starts a process for the request's harness session, writing its transcript
    /// back from the journal first.
    fn spawn(
        &self,
        request: &TurnRequest,
        schema: Option<&str>,
    ) -> Result<CliProcess, HarnessError> {
        let settings = self.dialect.settings();
        let cwd = request.cwd.as_deref().unwrap_or(settings.cwd);
        std::fs::create_dir_all(cwd).map_err(|e| io_error("creating the cwd", e))?;
        let cwd = cwd
            .canonicalize()
            .map_err(|e| io_error("resolving the cwd", e))?;
        // Absolute: the CLI runs in `cwd`, where a relative directory names another place.
        let state_dir = std::path::absolute(settings.state_dir)
            .map_err(|e| io_error("resolving the state directory", e))?;
        let config_dir = state_dir.join(request.session_id.as_str());
        let lines = request.transcript.lines()?;
        let (harness_session_id, resume) = match &request.harness_session_id {
            Some(id) if !request.transcript.is_empty() => (id.clone(), true),
            // A fresh session, or a fork that keeps nothing (continuing from message 0).
            fresh => (
                fresh
                    .clone()
                    .unwrap_or_else(|| self.dialect.new_session_id()),
                false,
            ),
        };
        let text = if resume {
            self.dialect.restore(&lines, &harness_session_id)
        } else {
            String::new()
        };
        let path = self
            .dialect
            .transcript_path(&config_dir, &cwd, &harness_session_id, &lines);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error("creating the config dir", e))?;
        }
        let replaced = std::fs::read(&path).is_ok_and(|left| !text.as_bytes().starts_with(&left));
        if text.is_empty() {
            // A CLI may refuse a new session id whose file exists.
            let _ = std::fs::remove_file(&path);
        } else {
            std::fs::write(&path, &text).map_err(|e| io_error("writing the transcript", e))?;
        }
        let mut command = self.dialect.command(&Launch {
            config_dir: &config_dir,
            cwd: &cwd,
            harness_session_id: &harness_session_id,
            resume,
            output_schema: schema,
            transcript_replaced: replaced,
            approvals: !request.approvals.is_empty(),
        })?;
        command.current_dir(&cwd).envs(settings.env);
        let seen: HashSet<String> = lines
            .iter()
            .filter_map(|line| self.dialect.line_identity(line))
            .collect();
        let mut process = CliProcess::start(
            command,
            settings.bin,
            TranscriptTail::new(path, text.len() as u64),
            seen,
            harness_session_id,
        )?;
        process.resume = resume;
        Ok(process)
    }

    async fn turn(
        self,
        mut request: TurnRequest,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Result<TurnOutcome, HarnessError> {
        let schema = request.output_schema.clone();
        let mut process = self.pool.take(
            &request.session_id,
            request.harness_session_id.as_deref(),
            request.transcript.len(),
            schema.as_deref(),
            !request.decisions.is_empty(),
        );
        let mut announced = false;
        loop {
            let warm = process.is_some();
            let mut cli = match process.take() {
                Some(cli) => cli,
                None => self.spawn(&request, schema.as_deref())?,
            };
            // A CLI that names its new sessions announces them itself (`Step::Session`).
            if !announced && (cli.resume || !D::ASSIGNS_SESSION_IDS || cli.turns > 0) {
                announced = true;
                let started = HarnessEvent::SessionStarted {
                    harness_session_id: cli.harness_session_id.clone(),
                };
                if send(&events, started).await.is_err() {
                    cli.kill();
                    return Err(HarnessError::Cancelled);
                }
            }
            let mut state = TurnState::default();
            let mut turn = D::Turn::default();
            let end = self
                .drive(&mut cli, &request, &events, &cancel, &mut state, &mut turn)
                .await;
            let end = match end {
                Err(error) => {
                    cli.kill();
                    return Err(error);
                }
                Ok(end) => end,
            };
            match end {
                TurnEnd::Died(_) if warm && !state.received => {
                    // A warm process that died between turns: the turn runs on a cold one,
                    // from the transcript as journaled now.
                    tracing::warn!(session_id = %request.session_id, cli = D::CLI, "warm CLI process died; starting a new one");
                    cli.kill();
                    request.transcript.extend(state.mirrored.drain(..));
                    continue;
                }
                TurnEnd::Died(message) => {
                    cli.kill();
                    return Err(HarnessError::Failed {
                        kind: self.dialect.classify_exit(&message),
                        message,
                    });
                }
                TurnEnd::Paused(calls) => {
                    // Kept waiting for the decision, mid-turn: the continuation answers it.
                    self.keep_warm(cli, &request, &state, schema, true);
                    return Ok(TurnOutcome::paused(calls));
                }
                TurnEnd::End(end) => {
                    let outcome = self.dialect.outcome(&end, &turn, &cli.stderr_tail());
                    cli.turns += 1;
                    if outcome.is_ok() {
                        self.keep_warm(cli, &request, &state, schema, false);
                    } else {
                        cli.kill();
                    }
                    return outcome;
                }
            }
        }
    }

    /// Puts the process back in the pool after a turn that ended well, or paused.
    fn keep_warm(
        &self,
        cli: CliProcess,
        request: &TurnRequest,
        state: &TurnState,
        schema: Option<String>,
        paused: bool,
    ) {
        self.pool.put(Warm {
            session_id: request.session_id.clone(),
            harness_session_id: cli.harness_session_id.clone(),
            journaled_lines: request.transcript.len() + state.mirrored.len(),
            schema,
            process: cli,
            last_used: Instant::now(),
            paused,
        });
    }

    /// Writes the turn's input and follows the CLI's output until the turn ends, the
    /// CLI dies or the run is cancelled.
    async fn drive(
        &self,
        cli: &mut CliProcess,
        request: &TurnRequest,
        events: &EventSink,
        cancel: &CancellationToken,
        state: &mut TurnState,
        turn: &mut D::Turn,
    ) -> Result<TurnEnd, HarnessError> {
        let dialect = &*self.dialect;
        // Lines the process wrote after the last turn's answer.
        mirror(dialect, cli, events, state, None).await?;
        let mut memory = cli
            .memory
            .take()
            .and_then(|memory| memory.downcast::<D::Process>().ok())
            .unwrap_or_default();
        let start = TurnStart {
            first: cli.turns == 0,
            resume: cli.resume,
            harness_session_id: &cli.harness_session_id,
        };
        let input = dialect.turn_input(request, start, &mut memory, turn);
        let end = self
            .follow(
                cli,
                request,
                events,
                cancel,
                state,
                turn,
                &mut memory,
                input,
            )
            .await;
        cli.memory = Some(memory);
        end
    }

    /// Takes one step of a stdout line: `Some` when it ends the turn. While a cancel
    /// is `stopping` the turn, nothing more is shown, and its end stops it.
    async fn take_step(
        &self,
        step: Step,
        cli: &mut CliProcess,
        events: &EventSink,
        state: &mut TurnState,
        stopping: bool,
    ) -> Result<Option<TurnEnd>, HarnessError> {
        let dialect = &*self.dialect;
        match step {
            Step::Received => state.received = true,
            Step::Mirror(until) => {
                mirror(dialect, cli, events, state, until.as_deref()).await?;
            }
            Step::Emit(event) if !stopping => send(events, event).await?,
            Step::Emit(_) => {}
            Step::End(_) if stopping => {
                // The turn stopped as asked: what it wrote is journaled, then
                // nothing of it is left running.
                let _ = mirror(dialect, cli, events, state, None).await;
                cli.kill();
                return Err(HarnessError::Cancelled);
            }
            Step::End(end) => return Ok(Some(TurnEnd::End(end))),
            Step::Pause(_) if stopping => {
                cli.kill();
                return Err(HarnessError::Cancelled);
            }
            Step::Pause(calls) => return Ok(Some(TurnEnd::Paused(calls))),
            Step::Send(line) => {
                if let Err(error) = write_line(cli, &line).await {
                    return Ok(Some(TurnEnd::Died(format!(
                        "cannot write to the CLI: {error}"
                    ))));
                }
            }
            Step::Session {
                harness_session_id,
                transcript,
            } => {
                if transcript != cli.transcript.path() {
                    cli.transcript = TranscriptTail::new(transcript, 0);
                }
                cli.harness_session_id = harness_session_id.clone();
                if !stopping {
                    send(events, HarnessEvent::SessionStarted { harness_session_id }).await?;
                }
            }
        }
        Ok(None)
    }

    /// Writes `input` and follows the CLI's output; see [`CliHarness::drive`].
    #[allow(clippy::too_many_arguments)]
    async fn follow(
        &self,
        cli: &mut CliProcess,
        request: &TurnRequest,
        events: &EventSink,
        cancel: &CancellationToken,
        state: &mut TurnState,
        turn: &mut D::Turn,
        memory: &mut D::Process,
        input: String,
    ) -> Result<TurnEnd, HarnessError> {
        let dialect = &*self.dialect;
        if let Err(error) = write_line(cli, &input).await {
            return Ok(TurnEnd::Died(format!("cannot write to the CLI: {error}")));
        }
        // Once cancelled, the CLI has until then to end the turn it was asked to stop.
        let mut stop_by: Option<tokio::time::Instant> = None;
        loop {
            let line = match stop_by {
                None => tokio::select! {
                    line = cli.stdout.next_line() => line,
                    _ = cancel.cancelled() => {
                        match dialect.interrupt(turn) {
                            Some(stop) if write_line(cli, &stop).await.is_ok() => {
                                stop_by = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                                continue;
                            }
                            _ => {
                                cli.kill();
                                return Err(HarnessError::Cancelled);
                            }
                        }
                    }
                },
                Some(deadline) => {
                    match tokio::time::timeout_at(deadline, cli.stdout.next_line()).await {
                        Ok(line) => line,
                        Err(_) => {
                            cli.kill();
                            return Err(HarnessError::Cancelled);
                        }
                    }
                }
            };
            if stop_by.is_some() && !matches!(line, Ok(Some(_))) {
                cli.kill();
                return Err(HarnessError::Cancelled);
            }
            let Ok(Some(line)) = line else {
                // Let the stderr reader catch up with the last words.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = mirror(dialect, cli, events, state, None).await;
                let stderr = cli.stderr_tail();
                let exited = format!("the {} CLI exited without a result", D::CLI);
                return Ok(TurnEnd::Died(if stderr.is_empty() {
                    exited
                } else {
                    format!("{exited}: {stderr}")
                }));
            };
            let context = LineContext {
                transcript: &request.transcript,
                mirrored: &state.mirrored,
                approvals: &request.approvals,
            };
            for step in dialect.on_line(&line, turn, memory, context) {
                if let Some(end) = self
                    .take_step(step, cli, events, state, stop_by.is_some())
                    .await?
                {
                    return Ok(end);
                }
            }
        }
    }

    /// Compaction is a turn whose message asks the CLI to compact; the transcript
    /// lines it writes are the compaction's record.
    async fn compact_session(self, request: CompactRequest) -> Result<Compaction, HarnessError> {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        let turn = TurnRequest {
            run_id: turnstile_journal::RunId::new_v7(),
            session_id: request.session_id.clone(),
            attempt: 1,
            message: self.dialect.compact_message(),
            harness_session_id: Some(request.harness_session_id.clone()),
            transcript: crate::Transcript::from_lines(request.transcript.clone()),
            output_schema: None,
            cwd: request.cwd.clone(),
            settled: None,
            approvals: Default::default(),
            paused_before: false,
            decisions: Vec::new(),
        };
        let collect = tokio::spawn(async move {
            let mut lines = Vec::new();
            let mut compacted = None;
            while let Some(event) = rx.recv().await {
                match event {
                    HarnessEvent::TranscriptLine { line } => lines.push(line),
                    HarnessEvent::Compacted {
                        summary,
                        replaced_messages,
                    } => compacted = Some((summary, replaced_messages)),
                    _ => {}
                }
            }
            (lines, compacted)
        });
        let outcome = self.turn(turn, tx, CancellationToken::new()).await;
        let (lines, compacted) = collect.await.unwrap_or_default();
        let outcome = outcome?;
        Ok(match compacted {
            Some((summary, replaced_messages)) => Compaction::Compacted {
                lines,
                summary,
                replaced_messages,
            },
            None => Compaction::NothingToCompact {
                reason: if outcome.content.is_empty() {
                    "Not enough messages to compact".into()
                } else {
                    outcome.content
                },
            },
        })
    }
}

const INTERRUPT_GRACE: Duration = Duration::from_millis(INTERRUPT_GRACE_MS);

async fn write_line(cli: &mut CliProcess, line: &str) -> std::io::Result<()> {
    cli.stdin.write_all(format!("{line}\n").as_bytes()).await?;
    cli.stdin.flush().await
}

/// Shows an event; a closed receiver means the run task is gone, so the turn stops.
pub(crate) async fn send(events: &EventSink, event: HarnessEvent) -> Result<(), HarnessError> {
    events
        .send(event)
        .await
        .map_err(|_| HarnessError::Cancelled)
}
