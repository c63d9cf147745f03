//! What a CLI's dialect says, and nothing else: the command and its environment, where
//! the transcript lives and what identifies a line, how a line is restored into a
//! (forked) session, how one output line becomes steps, and how a turn's end is read and
//! its errors classified. The core (`cli/mod.rs`) drives any dialect the same way.

use super::transcript::restored_text;
use crate::{ErrorKind, HarnessError, HarnessEvent, HarnessInfo, TurnOutcome, TurnRequest};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The options every CLI harness has, borrowed from the dialect's own.
#[derive(Debug, Clone, Copy)]
pub struct CliSettings<'a> {
    /// Path (or name on `PATH`) of the CLI.
    pub bin: &'a Path,
    /// Working directory of the CLI (created if missing).
    pub cwd: &'a Path,
    /// Where the runtime keeps the CLI's config directories, one per session.
    pub state_dir: &'a Path,
    /// Environment added to the CLI's, after the dialect's own.
    pub env: &'a BTreeMap<String, String>,
    /// Warm processes kept at most (0: a process per turn).
    pub warm_processes: usize,
}

/// What a process is started for.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// The session's config directory (the CLI's home), created by the core.
    pub config_dir: &'a Path,
    /// The working directory, canonical.
    pub cwd: &'a Path,
    /// The harness session the process serves.
    pub harness_session_id: &'a str,
    /// Whether it resumes that session from the restored transcript (else it starts it).
    pub resume: bool,
    /// The turn's JSON Schema, for structured output.
    pub output_schema: Option<&'a str>,
    /// The transcript written back is not a continuation of the file the CLI left
    /// there (shorter or different): what the CLI derived from the old file is stale.
    pub transcript_replaced: bool,
    /// Some tool calls wait for a person (the agent's `approvals`): the CLI is to ask
    /// the runtime before a call it would otherwise ask a user about.
    pub approvals: bool,
}

/// What the core does with one output line, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The CLI answered something: a warm process that dies after this is not retried.
    Received,
    /// Journal the transcript's new lines; with an identity, up to and including that
    /// line (waiting briefly for it).
    Mirror(Option<String>),
    /// Show an event.
    Emit(HarnessEvent),
    /// The turn ended; the dialect reads its outcome from this value.
    End(Value),
    /// Write this line to the CLI's stdin (a request or an answer of a protocol that
    /// takes several exchanges per turn).
    Send(String),
    /// The CLI asks to run calls that wait for a person's decision (`approvals`): the
    /// turn pauses here, the process kept (warm, if the pool has room) to be told the
    /// decision when the run is continued.
    Pause(Vec<crate::ToolCall>),
    /// The CLI named the harness session it created (dialects whose CLI assigns the
    /// ids): the process serves `harness_session_id` from now on, whose transcript is
    /// at `transcript`. The core announces the session then.
    Session {
        /// The CLI's id of the session.
        harness_session_id: String,
        /// Where its transcript will be.
        transcript: PathBuf,
    },
}

/// What the dialect knows of the process a turn starts on.
#[derive(Debug, Clone, Copy)]
pub struct TurnStart<'a> {
    /// The process has served no turn yet (it was started for this one).
    pub first: bool,
    /// It resumes `harness_session_id` from the restored transcript (else the session
    /// is new).
    pub resume: bool,
    /// The harness session (for a new one of a CLI that assigns ids: a placeholder).
    pub harness_session_id: &'a str,
}

/// What the dialect may read while it turns a line into steps.
#[derive(Debug, Clone, Copy)]
pub struct LineContext<'a> {
    /// The transcript the turn started from (its lines are read on demand).
    pub transcript: &'a crate::Transcript,
    /// The lines mirrored in this turn so far.
    pub mirrored: &'a [String],
    /// Which calls wait for a person's decision.
    pub approvals: &'a crate::Approvals,
}

/// Everything that makes one CLI different from another.
pub trait Dialect: Send + Sync + 'static {
    /// What the dialect remembers while it reads one turn's output.
    type Turn: Default + Send;

    /// What the dialect remembers of one process across its turns.
    type Process: Default + Send + 'static;

    /// Whether the CLI assigns the ids of new sessions ([`Step::Session`] names them);
    /// else the core chooses them ([`Dialect::new_session_id`]).
    const ASSIGNS_SESSION_IDS: bool = false;

    /// The CLI's name, for messages and logs (`claude`).
    const CLI: &'static str;

    /// Identity for listings and `RunStarted`.
    fn info(&self) -> HarnessInfo;

    /// The options the core needs.
    fn settings(&self) -> CliSettings<'_>;

    /// A new harness session id, for a cold start with nothing to resume.
    fn new_session_id(&self) -> String {
        uuid::Uuid::now_v7().to_string()
    }

    /// Where the CLI keeps the transcript of `harness_session_id`, given the lines it
    /// will hold (some CLIs name the file after its first line).
    fn transcript_path(
        &self,
        config_dir: &Path,
        cwd: &Path,
        harness_session_id: &str,
        transcript: &[String],
    ) -> PathBuf;

    /// What identifies a transcript line, for lines the CLI may write twice.
    fn line_identity(&self, line: &str) -> Option<String>;

    /// A journaled line as it goes into `harness_session_id`'s file (a fork keeps
    /// another session's lines).
    fn restore_line(&self, line: &str, harness_session_id: &str) -> String;

    /// The file written back before a cold start: every journaled line restored, in
    /// order (a dialect may leave out what the CLI must not see again, such as a
    /// failed turn that is being retried).
    fn restore(&self, transcript: &[String], harness_session_id: &str) -> String {
        restored_text(self, transcript, harness_session_id)
    }

    /// The command that starts a process for `launch` (arguments and the dialect's
    /// environment; the core adds the cwd, the configured environment and the pipes).
    fn command(&self, launch: &Launch<'_>) -> Result<tokio::process::Command, HarnessError>;

    /// The line written to the CLI's stdin to start a turn.
    fn turn_input(
        &self,
        request: &TurnRequest,
        start: TurnStart<'_>,
        process: &mut Self::Process,
        turn: &mut Self::Turn,
    ) -> String;

    /// The steps one stdout line stands for.
    fn on_line(
        &self,
        line: &str,
        turn: &mut Self::Turn,
        process: &mut Self::Process,
        context: LineContext<'_>,
    ) -> Vec<Step>;

    /// The line that asks the CLI to stop the turn when the run is cancelled, if it has
    /// one; the core then reads on until the turn ends (at most a few seconds), and
    /// kills the process and everything below it either way.
    fn interrupt(&self, _turn: &Self::Turn) -> Option<String> {
        None
    }

    /// How the turn ended, from the value of [`Step::End`].
    fn outcome(
        &self,
        end: &Value,
        turn: &Self::Turn,
        stderr: &str,
    ) -> Result<TurnOutcome, HarnessError>;

    /// The class of a turn whose CLI exited without an end (`message` says how).
    fn classify_exit(&self, message: &str) -> ErrorKind;

    /// The message that asks the CLI to compact its session, sent as a turn.
    fn compact_message(&self) -> String;
}
