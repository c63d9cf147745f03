//! The runtime's public types: agents, commands, outcomes, refusals and faults.
//!
//! They live apart from [`crate::Runtime`] so that the session actor, the registry and
//! the streams can name them without importing the facade that drives them: the
//! actors' modules depend on this one, never on each other in a circle.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::MailboxError;
use turnstile_harness::Harness;
use turnstile_journal::{RunId, RunOptions, SessionId};
use turnstile_projections::ForkPoint;

use crate::run::RetryPolicy;
use crate::uploads::Attachment;

/// One configured agent: an id, a display name and the harness that runs its turns.
#[derive(Clone)]
pub struct AgentSpec {
    /// Agent id (URL component).
    pub id: String,
    /// Display name.
    pub name: String,
    /// Description for listings.
    pub description: String,
    /// The harness.
    pub harness: Arc<dyn Harness>,
    /// How failed attempts are retried.
    pub retry: RetryPolicy,
    /// The harness's working directory; attachments are staged under
    /// `<cwd>/.turnstile/uploads/<run_id>/`.
    pub cwd: PathBuf,
    /// Keep staged attachments after the run.
    pub keep_uploads: bool,
    /// Whether the agent's sessions share `cwd` or each has its own directory in it.
    pub workspace: Workspace,
    /// With `Workspace::Session`: each session's workspace is snapshotted into the
    /// journal and restored from it, within these bounds (`None`: not snapshotted).
    pub snapshots: Option<crate::workspace::Bounds>,
    /// Which tool calls wait for a person, for how long, and whether a usage limit is
    /// waited out (`spec/approvals.md`).
    pub approval: ApprovalPolicy,
}

/// An agent's durable waits (`spec/approvals.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalPolicy {
    /// Tool-name patterns whose calls wait for a decision (`approvals`).
    pub tools: turnstile_harness::Approvals,
    /// An undecided call is denied (note `timed out`) after this (`None`: never).
    pub timeout: Option<std::time::Duration>,
    /// A usage limit is waited out, not failed (`wait_on_usage_limit`).
    pub wait_on_usage_limit: bool,
    /// The longest wait for a usage limit (`max_usage_wait_s`).
    pub max_usage_wait: std::time::Duration,
}

impl ApprovalPolicy {
    /// The longest usage-limit wait, when usage limits are waited out.
    pub fn usage_wait(&self) -> Option<std::time::Duration> {
        self.wait_on_usage_limit.then_some(self.max_usage_wait)
    }
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        ApprovalPolicy {
            tools: turnstile_harness::Approvals::default(),
            timeout: Some(std::time::Duration::from_secs(86_400)),
            wait_on_usage_limit: false,
            max_usage_wait: std::time::Duration::from_secs(21_600),
        }
    }
}

/// Where an agent's sessions work (`spec/workspaces.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Workspace {
    /// Every session runs in the agent's `cwd` (agno's behaviour).
    #[default]
    Shared,
    /// Each session runs in `<cwd>/<session_id>/`, created on its first turn, removed
    /// with the session.
    Session,
}

impl AgentSpec {
    /// The directory a session's turns run in (and its attachments are staged under).
    pub fn workdir(&self, session_id: &SessionId) -> PathBuf {
        match self.workspace {
            Workspace::Shared => self.cwd.clone(),
            Workspace::Session => self.cwd.join(session_id.as_str()),
        }
    }

    /// Why a session id cannot name a directory of its own under this agent's `cwd`
    /// (`None` when it can, or when the agent's sessions share `cwd`): one that starts
    /// with a dot would be `.`, `..`, or hidden among the runtime's own `.turnstile/`.
    pub fn unsafe_session_id(&self, session_id: &SessionId) -> Option<String> {
        (self.workspace == Workspace::Session && session_id.as_str().starts_with('.')).then(|| {
            format!(
                "session_id {:?} cannot name a workspace directory (agent {} has workspace = \"session\"): it may not start with a dot",
                session_id.as_str(),
                self.id
            )
        })
    }
}

/// How to open a runtime.
pub struct RuntimeConfig {
    /// The data directory: the harnesses' state (and the sled journal by default).
    pub data_dir: PathBuf,
    /// The journal: by default the sled one in `data_dir`.
    pub journal: turnstile_journal::JournalConfig,
    /// Arbiter threads that host session actors.
    pub arbiters: usize,
    /// The agents.
    pub agents: Vec<AgentSpec>,
    /// Runs executing at once, across sessions (worker slots).
    pub max_concurrent_runs: usize,
    /// Runs accepted and not yet started, across sessions; beyond it starts are refused.
    pub max_queued_runs: usize,
    /// How long a session actor stays in memory with nothing to do.
    pub session_idle: Duration,
    /// Encoded bytes of one run event at most (a transcript line, a tool result, the
    /// answer); a run that produces a larger one ends `ERROR`, saying so.
    pub max_event_bytes: usize,
    /// Asks the allocator to give back what the calling thread freed (mimalloc's
    /// `mi_collect`, glibc's `malloc_trim`). Half a second after a burst of session
    /// passivations the runtime calls it on each of its long-lived threads (the
    /// arbiters, the keeper, the journal's committer, the registry's). `None` (the
    /// default): not called. Per-thread allocators keep a thread's freed pages until
    /// that thread allocates again, and an arbiter whose actors all passivated may not
    /// for a long time.
    pub release_memory: Option<fn()>,
}

impl RuntimeConfig {
    /// A configuration with the defaults of `spec/cli.md` (8 slots, 10,000 queued runs)
    /// and a 60 s idle time.
    pub fn new(data_dir: PathBuf, agents: Vec<AgentSpec>) -> Self {
        RuntimeConfig {
            journal: turnstile_journal::JournalConfig::Sled(data_dir.clone()),
            data_dir,
            arbiters: 2,
            agents,
            max_concurrent_runs: 8,
            max_queued_runs: 10_000,
            session_idle: Duration::from_secs(60),
            max_event_bytes: turnstile_journal::limits::EVENT_BYTES_MAX_DEFAULT,
            release_memory: None,
        }
    }
}

/// What to do with a turn for a session that is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Multitask {
    /// Refuse it with the running run's id (agno's `SessionBusyError`).
    #[default]
    Reject,
    /// Queue it behind the session's runs, first in, first out.
    Enqueue,
}

/// A turn to start.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StartRun {
    /// Agent.
    pub agent_id: String,
    /// Session; a new one when `None`.
    pub session_id: Option<SessionId>,
    /// The client's user id.
    pub user_id: Option<String>,
    /// The message.
    pub message: String,
    /// Run options, recorded with the run (its `fork` is set from `fork` below).
    pub options: RunOptions,
    /// Busy-session behaviour.
    pub multitask: Multitask,
    /// A client key: a repeated submission with it returns the first run.
    pub idempotency_key: Option<String>,
    /// For a continuation: the run and harness transcript point it starts from.
    pub fork: Option<ForkPoint>,
    /// Files attached to the turn; journaled with it and staged for its harness.
    pub attachments: Vec<Attachment>,
    /// Per-user isolation: the session must be new or `user_id`'s; a session another
    /// user owns (its `SessionCreated` names another user) is refused as unknown, so
    /// its id cannot be taken over. Checked by the session's actor, where concurrent
    /// first turns are ordered.
    #[serde(default)]
    pub isolated: bool,
}

/// Where a continuation starts in its source run (agno's `continue_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContinueFrom {
    /// After the run's last message.
    End,
    /// Before the run's user message: replays the turn (or answers `input` instead).
    LastUser,
    /// A message boundary; one inside a tool batch moves to the batch's end.
    MessageIndex(u32),
}

/// A continuation of a finished run, as a new run in the same session.
#[derive(Debug, Clone)]
pub struct ContinueRun {
    /// The finished run.
    pub run_id: RunId,
    /// Where to continue from.
    pub continue_from: ContinueFrom,
    /// The new message; without one, `last_user` replays the turn and other points
    /// say "Continue from where you left off."
    pub input: Option<String>,
    /// The client's user id.
    pub user_id: Option<String>,
    /// Run options recorded with the new run.
    pub options: RunOptions,
    /// Busy-session behaviour.
    pub multitask: Multitask,
}

/// Decides a paused run's tool calls (`spec/approvals.md`): the same run goes on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DecideRun {
    /// The paused run.
    pub run_id: RunId,
    /// One decision per pending call.
    pub decisions: Vec<turnstile_journal::ToolDecision>,
    /// Who decides (recorded with the decision).
    pub decided_by: Option<String>,
}

/// Run counters since the runtime opened (for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeCounters {
    /// Runs that started.
    pub runs_started: u64,
    /// Runs that completed.
    pub runs_completed: u64,
    /// Runs that ended in an error.
    pub runs_failed: u64,
    /// Runs cancelled.
    pub runs_cancelled: u64,
    /// Runs waiting in the queue now.
    pub runs_queued: u64,
}

/// How a compaction request ended.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactOutcome {
    /// Whether the session was compacted.
    pub compacted: bool,
    /// `compacted`, `no_history` or `nothing_to_compact`.
    pub status: &'static str,
    /// For humans.
    pub message: String,
    /// What was compacted: harness session, summary, messages replaced.
    pub record: Option<serde_json::Value>,
}

/// A start refused for a reason the caller can act on: an expected outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No such agent.
    #[error("Agent {agent_id} not found")]
    UnknownAgent {
        /// The id asked for.
        agent_id: String,
    },
    /// The session has a run in flight.
    #[error(
        "Session {session_id} already has run {run_id} in flight. A session takes one turn at a time: wait for that run to finish, or cancel it, then send the turn again."
    )]
    Busy {
        /// The session.
        session_id: SessionId,
        /// The run in flight.
        run_id: RunId,
    },
    /// The session belongs to another agent.
    #[error("Session {session_id} belongs to agent {agent_id}")]
    AgentMismatch {
        /// The session.
        session_id: SessionId,
        /// Its agent.
        agent_id: String,
    },
    /// The durable queue holds its limit of runs.
    #[error("The run queue is full ({limit} runs waiting); try again later.")]
    QueueFull {
        /// The limit.
        limit: usize,
    },
    /// The session is being compacted.
    #[error("Session {session_id} is being compacted; send the turn again in a moment.")]
    Compacting {
        /// The session.
        session_id: SessionId,
    },
    /// The session is being deleted: a turn for it would race the deletion.
    #[error("Session {session_id} is being deleted; send the turn again once it is gone.")]
    Deleting {
        /// The session.
        session_id: SessionId,
    },
    /// The input cannot be accepted (an attachment name that is not a plain file name,
    /// or two files of one name).
    #[error("{reason}")]
    InvalidInput {
        /// Why.
        reason: String,
    },
    /// The run cannot be continued.
    #[error("Cannot continue run {run_id}: {reason}")]
    NotContinuable {
        /// The run.
        run_id: RunId,
        /// Why.
        reason: String,
    },
    /// Decisions that do not decide each pending call once (`422`, naming the call).
    #[error("{reason}")]
    InvalidDecision {
        /// Why.
        reason: String,
    },
    /// A decision for a run that is not waiting for one (`run_not_paused`).
    #[error(
        "Run {run_id} is not paused: it is {status}; only a paused run takes decisions on its tool calls."
    )]
    NotPaused {
        /// The run.
        run_id: RunId,
        /// Its status (`RUNNING`, `COMPLETED`, …).
        status: String,
    },
    /// No such session.
    #[error("Session {session_id} not found")]
    UnknownSession {
        /// The id asked for.
        session_id: SessionId,
    },
    /// No such run.
    #[error("Run {run_id} not found")]
    UnknownRun {
        /// The id asked for.
        run_id: RunId,
    },
    /// The runtime is shutting down.
    #[error("turnstile is shutting down")]
    ShuttingDown,
    /// An event of the request is larger than the journal takes (`max_event_bytes`):
    /// nothing of the request was recorded.
    #[error(
        "The {field} is too large to journal: its event ({kind}) is {bytes} bytes, over server.max_event_bytes ({limit}). Nothing was recorded."
    )]
    EventTooLarge {
        /// The request's field that holds it (`message`, `files`, …).
        field: &'static str,
        /// The journal event it would have been.
        kind: &'static str,
        /// Its encoded size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

/// A fault of the runtime (not the caller's doing).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] turnstile_journal::Error),
    /// The actor system is gone.
    #[error("the runtime has stopped")]
    Stopped,
    /// Anything else that should not happen.
    #[error("internal error: {0}")]
    Internal(String),
    /// A task of the runtime panicked or was cancelled.
    #[error("a runtime task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The runtime could not start one of its threads.
    #[error("a runtime thread could not start: {0}")]
    Spawn(std::io::Error),
    /// The session's stream moved on under an append that expected its end: another
    /// writer appended first (the session's actor reads the journal again).
    #[error(transparent)]
    Conflict(#[from] turnstile_journal::Conflict),
    /// The replica that owns a session neither took a command nor gave the session up
    /// in time.
    #[error("session {session_id} stays with replica {owner}{detail}")]
    OwnerSilent {
        /// The session.
        session_id: SessionId,
        /// Its owner.
        owner: String,
        /// What was asked of it, for the message.
        detail: &'static str,
    },
    /// Another replica answered a command in a form this build does not read.
    #[error("a replica's reply: {0}")]
    ReplicaReply(String),
    /// Another live replica holds the session (PostgreSQL journal): the runtime hands
    /// the command to it, or refuses a turn as busy with the run it names.
    #[error("session {session_id} is owned by replica {owner}")]
    Elsewhere {
        /// The session.
        session_id: SessionId,
        /// The replica that holds it.
        owner: String,
        /// The run it is busy with, as the journal shows it.
        busy: Option<RunId>,
    },
}

impl From<MailboxError> for RuntimeError {
    fn from(_: MailboxError) -> Self {
        RuntimeError::Stopped
    }
}
