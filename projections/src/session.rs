//! The session fold: the session's own facts, the length of each harness transcript,
//! and a view of each of its runs with the checkpoints a continuation can start from.
//!
//! The fold is incremental: a state holds the session's facts and the runs it has
//! folded and not yet retired (the open ones, at least), and applies each new record
//! once. Its stored forms ([`StoredSession`], [`StoredRun`]) are complete, so a state
//! is resumed from them plus the records after the sequence they are as of, never from
//! the session's first record. Transcript lines are not part of the state (they grow
//! with the conversation): [`Transcripts`] folds them when a harness needs them.
//!
//! Client-visible run events are typed ([`RunEvent`]); the fold reads from them what a
//! run view needs (streamed content, tool calls, warnings). No HTTP shape is known here.

use crate::views::push_exact;
use crate::{
    AttachmentView, Checkpoint, DecidedCall, RunHead, RunStatus, RunView, SessionView, StoredRun,
    StoredSession, ToolView, date_of_us,
};
use turnstile_journal::{Event, Recorded, RunEvent, RunId, SessionId};

/// A session and the runs it holds: the fold of one session stream.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    /// The session.
    pub session_id: SessionId,
    /// Its facts.
    pub session: SessionView,
    /// The runs this state holds, oldest first: every open run, and the ended runs
    /// folded since it was resumed and not retired ([`SessionState::retire`]).
    pub runs: Vec<RunView>,
    /// The sequence after the last record folded in.
    pub next_seq: u64,
}

impl SessionState {
    /// The empty state of a session with no events.
    pub fn new(session_id: SessionId) -> Self {
        SessionState {
            session_id,
            session: SessionView::default(),
            runs: Vec::new(),
            next_seq: 0,
        }
    }

    /// Folds a whole stream.
    pub fn fold<'a>(
        session_id: SessionId,
        records: impl IntoIterator<Item = &'a Recorded>,
    ) -> Self {
        let mut state = SessionState::new(session_id);
        for record in records {
            state.apply(record);
        }
        state
    }

    /// Resumes a state from its stored form and its open runs' stored forms; `None`
    /// when an open run's stored form is missing or is not the pending run it was
    /// (a stop lost a write): the caller then folds from the first record.
    pub fn resume(stored: StoredSession, open_runs: Vec<Option<StoredRun>>) -> Option<Self> {
        let mut runs = Vec::with_capacity(open_runs.len());
        for (run_id, found) in stored.open_runs.iter().zip(open_runs) {
            let found = found?;
            // A stored run is written when it is accepted and when it ends; in between
            // its events are folded from the session's records, which start here after
            // a pending run (a pending run has no events past its acceptance).
            if &found.run.run_id != run_id || found.run.status != RunStatus::Pending {
                return None;
            }
            runs.push(found.run);
        }
        if runs.len() != stored.open_runs.len() {
            return None;
        }
        Some(SessionState {
            session_id: stored.session_id,
            session: stored.session,
            runs,
            next_seq: stored.as_of_seq,
        })
    }

    /// The stored form of the state.
    pub fn stored(&self) -> StoredSession {
        StoredSession {
            session_id: self.session_id.clone(),
            as_of_seq: self.next_seq,
            session: self.session.clone(),
            open_runs: self.open_runs().map(|run| run.run_id.clone()).collect(),
        }
    }

    /// The stored form of one run it holds.
    pub fn stored_run(&self, run: &RunView) -> StoredRun {
        StoredRun {
            session_id: self.session_id.clone(),
            as_of_seq: self.next_seq,
            run: run.clone(),
        }
    }

    /// Forgets the ended runs (their stored forms keep them); returns how many.
    pub fn retire(&mut self) -> usize {
        let before = self.runs.len();
        self.runs.retain(|run| !run.status.is_terminal());
        // An idle session holds no run: its list should not keep room for several
        // (a run is ~0.7 KiB, and an idle actor would keep four runs' room).
        self.runs.shrink_to_fit();
        before - self.runs.len()
    }

    /// Whether a run belongs to this session as it is now (not to an earlier session
    /// of the same id, deleted since).
    pub fn owns(&self, run: &RunView) -> bool {
        self.owns_head(&RunHead::of(run))
    }

    /// [`SessionState::owns`] for a run's head.
    pub fn owns_head(&self, run: &RunHead) -> bool {
        run.session_id == self.session_id && run.queued_seq.0 >= self.session.created_seq
    }

    /// Whether the session exists: created, and not deleted since.
    pub fn exists(&self) -> bool {
        !self.session.agent_id.is_empty() && !self.session.deleted
    }

    /// A run by id.
    pub fn run(&self, run_id: &RunId) -> Option<&RunView> {
        self.runs.iter().rev().find(|run| &run.run_id == run_id)
    }

    /// Runs that have not ended, oldest first.
    pub fn open_runs(&self) -> impl Iterator<Item = &RunView> {
        self.runs.iter().filter(|run| !run.status.is_terminal())
    }

    /// Applies one record: the next of the stream. A record the state already holds
    /// (its sequence is below [`SessionState::next_seq`]) changes nothing, so a state
    /// read from a stored form and the records after it, or given a record twice, is
    /// still the fold of the stream (issue 27: a `RunQueued` applied twice made a run
    /// start twice after a SIGKILL).
    pub fn apply(&mut self, record: &Recorded) {
        if record.seq.0 < self.next_seq {
            return;
        }
        self.next_seq = record.seq.0 + 1;
        self.session.updated_at_us = record.ts_us;
        self.apply_to_session(record);
        let current_lines = self.session.transcript_len();
        let Some(run_id) = record.event.run_id() else {
            return;
        };
        let session = &mut self.session;
        let Some(run) = self.runs.iter_mut().rev().find(|run| &run.run_id == run_id) else {
            return;
        };
        run.updated_at_us = record.ts_us;
        apply_run_progress(run, record, current_lines);
        apply_run_end(run, session, record, current_lines);
    }

    /// What a record changes in the session's own facts.
    fn apply_to_session(&mut self, record: &Recorded) {
        let ts = record.ts_us;
        match &record.event {
            Event::SessionCreated { agent_id, user_id } => {
                // A session id used again after a delete starts a new session.
                if self.session.deleted {
                    *self = SessionState {
                        next_seq: self.next_seq,
                        ..SessionState::new(self.session_id.clone())
                    };
                }
                // A second `SessionCreated` of the same session (concurrent first turns
                // of older builds) changes nothing.
                if self.session.agent_id.is_empty() {
                    self.session.agent_id = agent_id.clone();
                    self.session.user_id = user_id.clone();
                    self.session.created_at_us = ts;
                    self.session.created_seq = record.seq.0;
                }
            }
            Event::RunQueued { .. } => self.queue_run(record),
            Event::TranscriptLineAppended {
                harness_session_id, ..
            } => {
                self.session.harness_session_id = Some(harness_session_id.clone());
                *self.session.lines_mut(harness_session_id) += 1;
            }
            Event::AttemptStarted {
                harness_session_id, ..
            } => {
                self.session.harness_session_id = Some(harness_session_id.clone());
                self.session.lines_mut(harness_session_id);
            }
            Event::HarnessSessionForked {
                from_harness_session_id,
                harness_session_id,
                transcript_lines,
                ..
            } => {
                let kept = self
                    .session
                    .lines_of(from_harness_session_id)
                    .min(*transcript_lines);
                *self.session.lines_mut(harness_session_id) = kept;
                self.session.harness_session_id = Some(harness_session_id.clone());
            }
            Event::SessionDeleted { .. } => self.session.deleted = true,
            Event::TranscriptCompacted {
                harness_session_id,
                summary,
                replaced_messages,
                lines,
                ..
            } => {
                *self.session.lines_mut(harness_session_id) += lines.len() as u32;
                self.session.harness_session_id = Some(harness_session_id.clone());
                push_exact(
                    &mut self.session.compactions,
                    (
                        harness_session_id.clone(),
                        summary.clone(),
                        *replaced_messages,
                    ),
                );
            }
            _ => {}
        }
    }

    /// A run accepted: the session's name (from its first message), counts, and the
    /// run's view, pending.
    fn queue_run(&mut self, record: &Recorded) {
        let Event::RunQueued {
            run_id,
            agent_id,
            user_id,
            input,
            options,
        } = &record.event
        else {
            return;
        };
        let ts = record.ts_us;
        if self.session.run_count == 0 {
            self.session.name = input
                .lines()
                .find(|line| !line.trim().is_empty())
                .map(|line| line.chars().take(50).collect())
                .unwrap_or_default();
        }
        self.session.run_count += 1;
        let previous_run = self.session.last_run.replace(run_id.clone());
        let day = self.session.day_mut(date_of_us(ts));
        day.runs += 1;
        if let Some(user) = user_id
            && !day.users.contains(user)
        {
            push_exact(&mut day.users, user.clone());
        }
        self.runs.push(RunView {
            run_id: run_id.clone(),
            session_id: self.session_id.clone(),
            agent_id: agent_id.clone(),
            user_id: user_id.clone(),
            status: RunStatus::Pending,
            input: input.clone(),
            options: options.clone(),
            content: String::new(),
            content_type: "str".into(),
            tools: Vec::new(),
            model: None,
            model_provider: None,
            metrics: None,
            error: None,
            retryable: false,
            attempts: 0,
            event_count: 0,
            queued_seq: record.seq,
            previous_run,
            background: options.background,
            last_failure: None,
            warnings: Vec::new(),
            fork: options.fork.clone(),
            harness_session_id: None,
            transcript_start: 0,
            transcript_end: 0,
            checkpoints: Vec::new(),
            attachments: Vec::new(),
            created_at_us: ts,
            updated_at_us: ts,
            pending: Vec::new(),
            paused_at_us: None,
            decisions: Vec::new(),
            continued: false,
            unspent_attempts: 0,
            usage_wait_until_us: None,
        });
    }
}

fn apply_run_event(run: &mut RunView, event: &RunEvent, transcript_lines: u32, ts: i64) {
    match event {
        RunEvent::ContentDelta { text } => run.content.push_str(text),
        // Reasoning is shown as it streams and kept in the journal, not in the answer.
        RunEvent::ReasoningDelta { .. } => {}
        RunEvent::ToolCallStarted { tool } => apply_tool(run, tool, None),
        RunEvent::ToolCallCompleted { tool } => apply_tool(run, tool, Some((transcript_lines, ts))),
        RunEvent::Warning { warning } => {
            if let turnstile_journal::Warning::UsageLimit { resets_at_us, .. } = warning {
                // The attempt that hit the limit is given back; the next one waits.
                run.usage_wait_until_us = Some(*resets_at_us);
                run.unspent_attempts += 1;
            }
            run.warnings.push(warning.clone());
        }
        RunEvent::Paused { tools } => pause(run, tools, ts),
        RunEvent::Continued { decisions, .. } => decide(run, decisions),
        RunEvent::Completed {
            content,
            content_type,
            metrics,
        } => {
            run.content = content.clone();
            run.content_type = content_type.clone();
            run.metrics = Some(metrics.clone());
        }
        RunEvent::Started { .. } | RunEvent::Failed { .. } | RunEvent::Cancelled { .. } => {}
    }
}

/// A tool call started, or completed (with the transcript's length and the time: a
/// top-level call's result ends a batch, a checkpoint).
fn apply_tool(
    run: &mut RunView,
    tool: &turnstile_journal::ToolCall,
    completed: Option<(u32, i64)>,
) {
    let view = ToolView {
        tool_call_id: tool.tool_call_id.clone(),
        tool_name: tool.tool_name.clone(),
        tool_args: serde_json::from_str(&tool.tool_args).unwrap_or(serde_json::Value::Null),
        result: tool.result.clone(),
        tool_call_error: tool.tool_call_error,
        parent_tool_call_id: tool.parent_tool_call_id.clone(),
        requires_confirmation: false,
        confirmed: None,
        confirmation_note: None,
    };
    let id = &tool.tool_call_id;
    if completed.is_some() {
        // A decided call that ran (or was told its denial) is carried out.
        run.decisions
            .retain(|decided| &decided.tool.tool_call_id != id);
    }
    let position = match run.tools.iter().position(|known| &known.tool_call_id == id) {
        Some(position) => {
            let known = &run.tools[position];
            let view = ToolView {
                requires_confirmation: known.requires_confirmation,
                confirmed: known.confirmed,
                confirmation_note: known.confirmation_note.clone(),
                ..view
            };
            run.tools[position] = view;
            position
        }
        None => {
            run.tools.push(view);
            run.tools.len() - 1
        }
    };
    // Messages are: the user's, then per tool a call and a result, then the
    // answer; so the boundary after tool k's result is 3 + 2k. Subagent calls are
    // not checkpoints: a fork keeps whole top-level batches only.
    if let Some((transcript_lines, ts)) = completed
        && tool.parent_tool_call_id.is_none()
    {
        run.checkpoints.push(Checkpoint {
            message_index: 3 + 2 * position as u32,
            transcript_lines,
            tool_call_id: id.clone(),
            created_at_us: ts,
        });
    }
}

/// The decisions on a paused run's calls: it runs again, and its next attempt carries
/// them out.
fn decide(run: &mut RunView, decisions: &[turnstile_journal::ToolDecision]) {
    run.status = RunStatus::Running;
    run.paused_at_us = None;
    run.continued = true;
    let pending = std::mem::take(&mut run.pending);
    run.decisions = decisions
        .iter()
        .filter_map(|decision| {
            let tool = pending
                .iter()
                .find(|call| call.tool_call_id == decision.tool_call_id)?;
            Some(DecidedCall {
                tool: tool.clone(),
                confirmed: decision.confirmed,
                note: decision.note.clone(),
            })
        })
        .collect();
    for decision in decisions {
        if let Some(tool) = run
            .tools
            .iter_mut()
            .find(|tool| tool.tool_call_id == decision.tool_call_id)
        {
            tool.confirmed = Some(decision.confirmed);
            tool.confirmation_note = decision.note.clone();
        }
    }
}

/// A run paused on `tools`: each listed among its calls (waiting for confirmation),
/// and its attempt spent nothing of the retry budget.
fn pause(run: &mut RunView, tools: &[turnstile_journal::ToolCall], ts: i64) {
    run.status = RunStatus::Paused;
    run.pending = tools.to_vec();
    run.paused_at_us = Some(ts);
    run.unspent_attempts += 1;
    for tool in tools {
        if run
            .tools
            .iter()
            .any(|known| known.tool_call_id == tool.tool_call_id)
        {
            continue;
        }
        run.tools.push(ToolView {
            tool_call_id: tool.tool_call_id.clone(),
            tool_name: tool.tool_name.clone(),
            tool_args: serde_json::from_str(&tool.tool_args).unwrap_or(serde_json::Value::Null),
            result: None,
            tool_call_error: false,
            parent_tool_call_id: tool.parent_tool_call_id.clone(),
            requires_confirmation: true,
            confirmed: None,
            confirmation_note: None,
        });
    }
    for tool in &mut run.tools {
        if tools
            .iter()
            .any(|paused| paused.tool_call_id == tool.tool_call_id)
        {
            tool.requires_confirmation = true;
        }
    }
}

/// What a record changes in its run while the run goes: its start, attempts, events and
/// failed attempts.
fn apply_run_progress(run: &mut RunView, record: &Recorded, current_lines: u32) {
    let ts = record.ts_us;
    match &record.event {
        Event::RunStarted {
            model,
            model_provider,
            ..
        } => {
            run.status = RunStatus::Running;
            run.model = Some(model.clone());
            run.model_provider = Some(model_provider.clone());
        }
        Event::AttemptStarted {
            attempt,
            harness_session_id,
            ..
        } => {
            run.attempts = *attempt;
            run.continued = false;
            run.usage_wait_until_us = None;
            if run.harness_session_id.is_none() {
                run.harness_session_id = Some(harness_session_id.clone());
                run.transcript_start = current_lines;
            }
        }
        Event::RunEventEmitted {
            event_index, event, ..
        } => {
            run.event_count = event_index.0 + 1;
            apply_run_event(run, event, current_lines, ts);
        }
        Event::AttemptFailed {
            attempt,
            error_type,
            retryable,
            ..
        } => {
            run.last_failure = Some((*attempt, error_type.clone(), *retryable));
        }
        _ => {}
    }
}

/// What a record changes in its run at its end (and its attachments, which the
/// session lists).
fn apply_run_end(
    run: &mut RunView,
    session: &mut SessionView,
    record: &Recorded,
    current_lines: u32,
) {
    match &record.event {
        // The answer and metrics came on the run's `Completed` event, appended with
        // this record; the session counts them once the run has ended.
        Event::RunCompleted { .. } => {
            run.status = RunStatus::Completed;
            run.transcript_end = current_lines;
            let metrics = run.metrics.clone().unwrap_or_default();
            session.metrics.add(&metrics);
            let day = session.day_mut(date_of_us(run.created_at_us));
            day.add_completed(
                &metrics,
                run.model.as_deref().unwrap_or_default(),
                run.model_provider.as_deref().unwrap_or_default(),
            );
        }
        Event::RunFailed {
            error_type,
            message,
            retryable,
            ..
        } => {
            run.status = RunStatus::Error;
            run.content = message.clone();
            run.error = Some((error_type.clone(), message.clone()));
            run.retryable = *retryable;
            run.transcript_end = current_lines;
        }
        Event::RunCancelled { reason, .. } => {
            run.status = RunStatus::Cancelled;
            run.content = reason.clone();
            run.transcript_end = current_lines;
        }
        Event::AttachmentAdded {
            run_id,
            name,
            media_type,
            sha256,
            content,
        } => {
            if run.attachments.is_empty() {
                let entry = (run_id.clone(), run.queued_seq.0);
                push_exact(&mut session.attachment_runs, entry);
            }
            run.attachments.push(AttachmentView {
                name: name.clone(),
                media_type: media_type.clone(),
                size: content.len() as u64,
                sha256: sha256.clone(),
            });
        }
        _ => {}
    }
}
