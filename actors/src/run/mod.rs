//! Driving one run: a harness turn whose every event is journaled, then broadcast.
//!
//! The run task runs a turn's attempts (retrying transient failures after a delay,
//! resuming the same harness session), turns harness events into journal events, appends whatever has
//! arrived in one group (so a fast harness costs one sync per batch, not per token),
//! and only then shows the client-visible ones to streams. The terminal events are
//! handed back to the session actor, which journals them and frees the session in the
//! same step, so a client that sees a run end can start the next turn at once. A turn
//! that has ended when its last events are read hands those over too: a quick turn
//! costs two syncs (accepted; everything else), not three.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use turnstile_harness::{ErrorKind, Harness, HarnessError, HarnessEvent, TurnOutcome, TurnRequest};
use turnstile_journal::limits::HARNESS_EVENTS_BUFFERED;
use turnstile_journal::{
    Event, EventIndex, Expected, Journal, Recorded, RunEvent, RunId, SessionId, SnapshotPoint,
    Warning,
};

mod answer;
mod endings;
mod retry;
mod snapshot;
mod usage;
mod wire;

pub(crate) use endings::{cancelled_events, failed_events, journal_error_type};
pub use retry::RetryPolicy;
use snapshot::Settle;
pub(crate) use snapshot::{WorkspaceRun, files_at};
pub use wire::WireEvent;
pub(crate) use wire::{broadcast_wire, first_wire_index};

/// Renders the prompt of a fresh harness session seeded with the branch's history, when
/// a harness session cannot be resumed (rare: rendered only then).
pub(crate) type FallbackPrompt = Box<dyn FnOnce() -> String + Send>;

/// Which run the events are about.
#[derive(Debug, Clone)]
pub(crate) struct RunIdentity {
    pub run_id: RunId,
    pub session_id: SessionId,
}

impl RunIdentity {
    /// The journal event of a run event at `index`.
    pub(crate) fn emitted(&self, index: EventIndex, event: RunEvent) -> Event {
        Event::RunEventEmitted {
            run_id: self.run_id.clone(),
            event_index: index,
            event,
        }
    }
}

/// What the run task hands back to its session actor.
pub(crate) struct Finished {
    pub run_id: RunId,
    /// Everything the task appended.
    pub records: Vec<Arc<Recorded>>,
    /// The terminal events, for the actor to append.
    pub terminal: Vec<Event>,
    /// The worker slot, released once the terminal events are journaled.
    pub slot: tokio::sync::OwnedSemaphorePermit,
    /// An append of the task failed: what the journal took of it is not known here, so
    /// the session's state is read again from the journal (crash-only).
    pub journal_failed: bool,
    /// The failed append was refused because this replica lost the session's lease:
    /// the actor stops working on the session (the session's next owner resolves it).
    pub fenced: bool,
    /// The session's workspace, handed back (`None` when it must be read again).
    pub workspace: Option<crate::workspace::Tracker>,
}

/// Where a run task shows its session actor each batch it journaled, as soon as it is
/// durable, so the actor's state follows the journal in order (it never holds a record
/// after one it has not seen).
pub(crate) type AppendedSink = Box<dyn Fn(Vec<Arc<Recorded>>) + Send + Sync>;

pub(crate) struct RunTask {
    pub identity: RunIdentity,
    pub journal: Journal,
    pub harness: Arc<dyn Harness>,
    pub request: TurnRequest,
    pub policy: RetryPolicy,
    pub cancel: CancellationToken,
    pub live: broadcast::Sender<Arc<WireEvent>>,
    pub next_index: EventIndex,
    /// The worker slot this run holds; released when the task ends.
    pub slot: tokio::sync::OwnedSemaphorePermit,
    /// The prompt of a fresh harness session seeded with the history, used when the
    /// harness session cannot be resumed (`None` for continuations, which never fall back).
    pub fallback_prompt: Option<FallbackPrompt>,
    /// The model identity recorded in the run's metrics (`details.model`).
    pub model: (String, String),
    /// The JSON Schema the final answer must satisfy (structured output).
    pub output_schema: Option<serde_json::Value>,
    /// Why the run's attachments could not be staged: the run fails without a turn.
    pub staging_error: Option<String>,
    /// Events held for the next append: those that start the run (`RunStarted`, a
    /// fork), journaled with the first events of the turn; and a finished turn's last
    /// events, journaled with its end.
    pub start_events: Vec<Event>,
    /// Each durable batch goes here too.
    pub appended: AppendedSink,
    /// An append failed (see [`Finished::journal_failed`]).
    pub journal_failed: bool,
    /// It was refused for a lost lease (see [`Finished::fenced`]).
    pub fenced: bool,
    /// The session's workspace, with snapshots on.
    pub workspace: Option<WorkspaceRun>,
    /// Attempts of the run so far that spent nothing of the retry budget (paused, or a
    /// usage limit waited out).
    pub unspent_attempts: u32,
    /// A usage limit is waited out for at most this (`None`: it fails the run).
    pub usage_wait: Option<Duration>,
    /// A journaled usage-limit wait not over yet (a run resumed after a restart), in
    /// microseconds since the epoch: the first attempt waits for it.
    pub usage_wait_until_us: Option<i64>,
}

enum AttemptEnd {
    Harness(Result<TurnOutcome, HarnessError>),
    Journal(String),
}

impl RunTask {
    /// Runs the turn, with its retries, to its end; never panics on a harness or
    /// journal failure: both become the run's error.
    pub(crate) async fn drive(mut self) -> Finished {
        let started = Instant::now();
        let mut records = Vec::new();
        let mut first_token: Option<f64> = None;
        let first_attempt = self.request.attempt;
        if let Some(terminal) = self.journaled_usage_wait().await {
            return self.finish(records, terminal);
        }
        if let Some(error) = self.staging_error.take() {
            let mut terminal = std::mem::take(&mut self.start_events);
            terminal.extend(self.failed("attachment_staging", &error, false));
            return self.finish(records, terminal);
        }
        if let Err(error) = self.prepare_workspace(&mut records).await {
            let terminal = if self.journal_failed {
                Vec::new()
            } else {
                let mut terminal = std::mem::take(&mut self.start_events);
                let message = format!("The session's workspace cannot be restored: {error}");
                terminal.extend(self.failed("workspace_restore", &message, false));
                terminal
            };
            return self.finish(records, terminal);
        }
        let mut first_failure: Option<(u32, String)> = None;
        let terminal = loop {
            let end = self.attempt(&mut records, &mut first_token, started).await;
            let (kind, message) = match end {
                AttemptEnd::Journal(error) => {
                    break self.failed(journal_error_type(&error), &error, false);
                }
                AttemptEnd::Harness(Ok(outcome)) if !outcome.paused.is_empty() => {
                    break self.paused(outcome.paused);
                }
                AttemptEnd::Harness(Ok(outcome)) => {
                    break self.completed(outcome, started, first_token);
                }
                AttemptEnd::Harness(Err(HarnessError::Cancelled)) => break self.cancelled(),
                AttemptEnd::Harness(Err(HarnessError::UsageLimit {
                    message,
                    resets_at_us,
                })) => match self.usage_limit(&message, resets_at_us, &mut records).await {
                    Some(events) => break events,
                    None => continue,
                },
                AttemptEnd::Harness(Err(HarnessError::Failed {
                    kind: ErrorKind::SessionNotFound,
                    message,
                })) if self.request.harness_session_id.is_some()
                    && self.fallback_prompt.is_some() =>
                {
                    match self.fall_back(message, &mut records).await {
                        Some(events) => break events,
                        None => continue,
                    }
                }
                AttemptEnd::Harness(Err(HarnessError::Failed { kind, message })) => (kind, message),
            };
            let attempt = self.request.attempt;
            let max_attempts = self.max_attempts(first_attempt);
            let retry = kind.is_retryable() && attempt < max_attempts;
            // A later attempt often fails because of what the first one did: the first
            // real cause leads the message a user sees.
            let first_cause = first_failure
                .get_or_insert_with(|| (self.request.attempt, message.clone()))
                .clone();
            let mut events = vec![Event::AttemptFailed {
                run_id: self.identity.run_id.clone(),
                attempt,
                error_type: kind.slug().to_owned(),
                message: message.clone(),
                retryable: kind.is_retryable(),
            }];
            if !retry {
                if let Err(error) = self.append(events, &mut records).await {
                    break self.failed("journal_error", &error, false);
                }
                let message = final_message(&first_cause, message, attempt, max_attempts);
                break self.failed(kind.slug(), &message, kind.is_retryable());
            }
            let delay_s = self.policy.delay_s(attempt);
            let index = self.take_index();
            events.push(self.identity.emitted(
                index,
                RunEvent::Warning {
                    warning: Warning::Retry {
                        attempt,
                        attempts: max_attempts,
                        delay_s,
                        error_type: kind.slug().to_owned(),
                        message: message.clone(),
                    },
                },
            ));
            if let Err(error) = self.append(events, &mut records).await {
                break self.failed("journal_error", &error, false);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs_f64(delay_s)) => {}
                _ = self.cancel.cancelled() => break self.cancelled(),
            }
            self.request.attempt += 1;
        };
        if self.journal_failed {
            // Crash-only: the session actor reads the run back from the journal and
            // resolves it as after a crash (a new attempt, or its end).
            return self.finish(records, Vec::new());
        }
        // Whatever is still held (a turn that failed at once, or a finished turn's last
        // events) goes with the end.
        let terminal = if self.start_events.is_empty() {
            terminal
        } else {
            let mut all = std::mem::take(&mut self.start_events);
            all.extend(terminal);
            all
        };
        self.finish(records, terminal)
    }

    fn finish(self, records: Vec<Arc<Recorded>>, terminal: Vec<Event>) -> Finished {
        Finished {
            run_id: self.identity.run_id.clone(),
            records,
            terminal,
            slot: self.slot,
            journal_failed: self.journal_failed,
            fenced: self.fenced,
            workspace: self
                .workspace
                .filter(|work| !work.broken && !self.journal_failed)
                .and_then(|work| work.tracker),
        }
    }

    /// One attempt: the harness turn, every event journaled before it is shown. The
    /// next attempt resumes the harness session this one used, with its transcript.
    async fn attempt(
        &mut self,
        records: &mut Vec<Arc<Recorded>>,
        first_token: &mut Option<f64>,
        started: Instant,
    ) -> AttemptEnd {
        let (sender, mut receiver) = mpsc::channel(HARNESS_EVENTS_BUFFERED);
        let mut request = self.request.clone();
        let mut settle = Settle::new(self.workspace.is_some(), &mut request);
        let mut turn = self.harness.run_turn(request, sender, self.cancel.clone());
        let mut result: Option<Result<TurnOutcome, HarnessError>> = None;
        let mut journal_error: Option<String> = None;
        loop {
            let first = tokio::select! {
                biased;
                event = receiver.recv() => event,
                outcome = &mut turn, if result.is_none() => { result = Some(outcome); continue; }
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            let mut closed = drain(&mut receiver, &mut batch);
            if result.is_none() {
                // Has the turn ended meanwhile? Poll it once, without waiting.
                let ended = tokio::select! {
                    biased;
                    outcome = &mut turn => Some(outcome),
                    () = std::future::ready(()) => None,
                };
                if ended.is_some() {
                    result = ended;
                    closed = drain(&mut receiver, &mut batch);
                }
            }
            let last_call = settle.count(&batch);
            if journal_error.is_some() {
                settle.release();
                continue;
            }
            let mut events = Vec::with_capacity(batch.len());
            for event in batch {
                if first_token.is_none() && matches!(event, HarnessEvent::ContentDelta { .. }) {
                    *first_token = Some(started.elapsed().as_secs_f64());
                }
                events.push(self.journal_event(event));
            }
            if closed && result.is_some() {
                // The turn is over and these are its last events: they are journaled
                // (and shown) with whatever ends the attempt, one sync fewer per turn.
                self.start_events.extend(events);
                continue;
            }
            let journaled = match last_call {
                Some(tool_call_id) => {
                    let point = SnapshotPoint::ToolCall { tool_call_id };
                    self.journal_with_snapshot(events, point, records).await
                }
                None => self.append(events, records).await,
            };
            settle.tell();
            if let Err(error) = journaled {
                // The turn cannot be recorded, so it must not go on unrecorded.
                tracing::error!(run_id = %self.identity.run_id, %error, "journal append failed");
                journal_error = Some(error);
                settle.release();
                self.cancel.cancel();
            }
        }
        let result = match result {
            Some(result) => result,
            None => turn.await,
        };
        if journal_error.is_none() {
            journal_error = self.snapshot_turn_end(records).await.err();
        }
        match journal_error {
            Some(error) => AttemptEnd::Journal(error),
            None => AttemptEnd::Harness(result),
        }
    }

    /// Attempts the run may make: the retry budget, plus the attempts that spent none of
    /// it (paused, or a usage limit waited out), and at least those made.
    fn max_attempts(&self, first_attempt: u32) -> u32 {
        (self.policy.max_attempts() + self.unspent_attempts).max(first_attempt)
    }

    /// Calls wait for a person: the run pauses (it does not end), its slot freed.
    fn paused(&mut self, tools: Vec<turnstile_journal::ToolCall>) -> Vec<Event> {
        let index = self.take_index();
        vec![self.identity.emitted(index, RunEvent::Paused { tools })]
    }

    fn cancelled(&mut self) -> Vec<Event> {
        let index = self.take_index();
        cancelled_events(&self.identity, index)
    }

    fn failed(&mut self, error_type: &str, message: &str, retryable: bool) -> Vec<Event> {
        let index = self.take_index();
        failed_events(&self.identity, index, error_type, message, retryable)
    }

    fn take_index(&mut self) -> EventIndex {
        let index = self.next_index;
        self.next_index = index.next();
        index
    }

    fn journal_event(&mut self, event: HarnessEvent) -> Event {
        let run_id = self.identity.run_id.clone();
        match event {
            HarnessEvent::SessionStarted { harness_session_id } => {
                self.request.harness_session_id = Some(harness_session_id.clone());
                Event::AttemptStarted {
                    run_id,
                    attempt: self.request.attempt,
                    harness_session_id,
                }
            }
            HarnessEvent::TranscriptLine { line } => {
                self.request.transcript.push(line.clone());
                Event::TranscriptLineAppended {
                    run_id,
                    harness_session_id: self.request.harness_session_id.clone().unwrap_or_default(),
                    line,
                }
            }
            HarnessEvent::ContentDelta { text } => {
                let index = self.take_index();
                self.identity
                    .emitted(index, RunEvent::ContentDelta { text })
            }
            HarnessEvent::ReasoningDelta { text } => {
                let index = self.take_index();
                self.identity
                    .emitted(index, RunEvent::ReasoningDelta { text })
            }
            HarnessEvent::ToolCallStarted { tool } => {
                let index = self.take_index();
                self.identity
                    .emitted(index, RunEvent::ToolCallStarted { tool })
            }
            HarnessEvent::ToolCallCompleted { tool } => {
                let index = self.take_index();
                self.identity
                    .emitted(index, RunEvent::ToolCallCompleted { tool })
            }
            HarnessEvent::Compacted {
                summary,
                replaced_messages,
            } => Event::TranscriptCompacted {
                run_id: Some(run_id),
                harness_session_id: self.request.harness_session_id.clone().unwrap_or_default(),
                summary,
                replaced_messages,
                lines: Vec::new(),
            },
        }
    }

    async fn append(
        &mut self,
        events: Vec<Event>,
        records: &mut Vec<Arc<Recorded>>,
    ) -> Result<(), String> {
        // Should the append fail, the run's end must still find what it did not record:
        // the held start events (small) go back, and the event indexes this batch took
        // are given again, so the run's indexes stay contiguous.
        let first_index = first_wire_index(&events);
        let start_events = self.start_events.clone();
        let events = if self.start_events.is_empty() {
            events
        } else {
            let mut all = std::mem::take(&mut self.start_events);
            all.extend(events);
            all
        };
        let appended = self
            .journal
            .append(&self.identity.session_id, Expected::Any, events)
            .await;
        let failure = match appended {
            Ok(Ok(appended)) => {
                for record in &appended {
                    crate::lifecycle::log_task_step(&record.session_id, &record.event);
                }
                broadcast_wire(&self.live, &appended);
                self.workspace_appended(&appended);
                (self.appended)(appended.clone());
                records.extend(appended);
                return Ok(());
            }
            Ok(Err(conflict)) => conflict.to_string(),
            // Refused before anything was queued: certainly not written.
            Err(error @ turnstile_journal::Error::TooLarge { .. }) => error.to_string(),
            Err(error) => {
                // What the journal took of it is not known (a connection that dropped
                // during the commit, say): nothing more is written from here.
                self.journal_failed = true;
                self.workspace_broken();
                self.fenced |= matches!(error, turnstile_journal::Error::Fenced { .. });
                error.to_string()
            }
        };
        self.start_events = start_events;
        if let Some(index) = first_index {
            self.next_index = index;
        }
        Err(failure)
    }
}

/// Takes every harness event waiting in the channel; true once the channel is closed
/// (the turn dropped its sender: no event will follow).
fn drain(receiver: &mut mpsc::Receiver<HarnessEvent>, batch: &mut Vec<HarnessEvent>) -> bool {
    loop {
        match receiver.try_recv() {
            Ok(event) => batch.push(event),
            Err(mpsc::error::TryRecvError::Empty) => return false,
            Err(mpsc::error::TryRecvError::Disconnected) => return true,
        }
    }
}

/// What a failed run says: the last failure once, with the attempt count; when the
/// first attempt failed otherwise (a later attempt often fails because of what the
/// first one did), the first cause leads.
fn final_message(
    (first_attempt, first_cause): &(u32, String),
    last: String,
    attempt: u32,
    max_attempts: u32,
) -> String {
    // Failures that differ only in their numbers (an attempt count inside the text) are one.
    let words = |text: &str| {
        text.chars()
            .filter(|c| !c.is_ascii_digit())
            .collect::<String>()
    };
    if attempt <= 1 {
        last
    } else if words(first_cause) == words(&last) {
        format!("{last} (attempt {attempt} of {max_attempts})")
    } else {
        format!(
            "{first_cause} (attempt {first_attempt}); attempt {attempt} of {max_attempts}: {last}"
        )
    }
}
