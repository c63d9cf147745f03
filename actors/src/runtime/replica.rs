//! What replicas say to each other through the journal's inbox, typed: a command for
//! a session's owner (enqueue a turn, cancel a run) and its reply. On the wire a
//! command is a kind and a body, a reply one JSON object; nothing else reads them.

use serde::{Deserialize, Serialize};
use turnstile_journal::limits::ELSEWHERE_WAIT_MS;
use turnstile_journal::{RunId, SessionId};

use crate::api::{DecideRun, Refused, RuntimeError, StartRun};
use crate::runtime::Runtime;

/// A command for the replica that owns a session.
#[derive(Debug)]
pub(super) enum ReplicaCommand {
    /// Accept this turn (as `enqueue`: it queues behind the session's running turn).
    Enqueue(Box<StartRun>),
    /// Cancel this run.
    Cancel(RunId),
    /// Decide this paused run's calls.
    Decide(Box<DecideRun>),
}

impl ReplicaCommand {
    /// Its kind and body as the inbox stores them.
    fn to_wire(&self) -> Result<(&'static str, String), RuntimeError> {
        Ok(match self {
            ReplicaCommand::Enqueue(start) => (
                "enqueue",
                serde_json::to_string(start)
                    .map_err(|error| RuntimeError::Internal(error.to_string()))?,
            ),
            ReplicaCommand::Cancel(run_id) => ("cancel", run_id.to_string()),
            ReplicaCommand::Decide(decide) => (
                "decide",
                serde_json::to_string(decide)
                    .map_err(|error| RuntimeError::Internal(error.to_string()))?,
            ),
        })
    }

    /// A command as the inbox gave it; `Err` names what this build does not read.
    pub(super) fn read(command: &turnstile_journal::Command) -> Result<ReplicaCommand, String> {
        match command.kind.as_str() {
            "enqueue" => serde_json::from_str(&command.body)
                .map(|start| ReplicaCommand::Enqueue(Box::new(start)))
                .map_err(|error| error.to_string()),
            "cancel" => command
                .body
                .parse()
                .map(ReplicaCommand::Cancel)
                .map_err(|_| format!("cancel of {:?}", command.body)),
            "decide" => serde_json::from_str(&command.body)
                .map(|decide| ReplicaCommand::Decide(Box::new(decide)))
                .map_err(|error| error.to_string()),
            other => Err(format!("unknown command {other}")),
        }
    }
}

/// An owner's reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum ReplicaReply {
    /// The paused run goes on, its `RunContinued` at this sequence and index (first:
    /// the replies are told apart by their fields).
    Continued {
        /// The run.
        run_id: RunId,
        /// Its `RunContinued`'s sequence in the session.
        from_seq: u64,
        /// Its `RunContinued`'s event index.
        from_index: u64,
    },
    /// The turn was accepted as this run, its `RunQueued` at this sequence.
    Started {
        /// The run.
        run_id: RunId,
        /// Its `RunQueued`'s sequence in the session.
        from_seq: u64,
    },
    /// Whether the run was cancelled.
    Cancelled {
        /// It was.
        cancelled: bool,
    },
    /// The command was refused (see [`refusal_text`]).
    Refused {
        /// Why, as [`refusal_text`] writes it.
        refused: String,
    },
}

impl ReplicaReply {
    /// The reply as the inbox stores it.
    pub(super) fn to_wire(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl Runtime {
    /// Leaves `command` for `owner` and waits for its reply; `None` when none came in
    /// time (not taken, or the owner died), so the caller asks again.
    pub(super) async fn ask_replica(
        &self,
        session_id: &SessionId,
        owner: &str,
        command: ReplicaCommand,
    ) -> Result<Option<ReplicaReply>, RuntimeError> {
        let (kind, body) = command.to_wire()?;
        let journal = self.journal().clone();
        let (session, owner) = (session_id.clone(), owner.to_owned());
        let id =
            tokio::task::spawn_blocking(move || journal.send_command(&session, &owner, kind, body))
                .await??;
        let wait = std::time::Duration::from_millis(ELSEWHERE_WAIT_MS);
        let Some(reply) = self.journal().command_reply(id, wait).await? else {
            return Ok(None);
        };
        serde_json::from_str(&reply)
            .map(Some)
            .map_err(|error| RuntimeError::ReplicaReply(format!("{error}: {reply}")))
    }
}

/// A refusal as a replica's reply carries it.
pub(super) fn refusal_text(refused: &Refused) -> String {
    match refused {
        Refused::QueueFull { limit } => format!("queue_full:{limit}"),
        Refused::ShuttingDown => "shutting_down".into(),
        Refused::UnknownSession { .. } => "unknown_session".into(),
        Refused::UnknownRun { run_id } => format!("unknown_run:{run_id}"),
        Refused::NotPaused { status, run_id } => format!("not_paused:{status}:{run_id}"),
        Refused::InvalidDecision { reason } => format!("invalid_decision:{reason}"),
        other => format!("other:{other}"),
    }
}

/// A replica's refusal, back as a [`Refused`].
pub(super) fn refusal_of(reply: &str, session_id: &SessionId) -> Refused {
    if let Some(limit) = reply.strip_prefix("queue_full:") {
        return Refused::QueueFull {
            limit: limit.parse().unwrap_or(0),
        };
    }
    if reply == "shutting_down" {
        return Refused::ShuttingDown;
    }
    if let Some(run_id) = reply
        .strip_prefix("unknown_run:")
        .and_then(|run_id| run_id.parse().ok())
    {
        return Refused::UnknownRun { run_id };
    }
    if let Some((status, run_id)) = reply
        .strip_prefix("not_paused:")
        .and_then(|rest| rest.split_once(':'))
        && let Ok(run_id) = run_id.parse()
    {
        return Refused::NotPaused {
            run_id,
            status: status.to_owned(),
        };
    }
    if let Some(reason) = reply.strip_prefix("invalid_decision:") {
        return Refused::InvalidDecision {
            reason: reason.to_owned(),
        };
    }
    if reply == "unknown_session" {
        return Refused::UnknownSession {
            session_id: session_id.clone(),
        };
    }
    Refused::InvalidInput {
        reason: format!(
            "session {session_id}: {}",
            reply.strip_prefix("other:").unwrap_or(reply)
        ),
    }
}
