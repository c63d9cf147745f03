//! The run lifecycle in the log: one line per step a person follows, written when the
//! step is journaled, by whoever journaled it (the session actor or the run task).

use turnstile_journal::{Event, SessionId};

/// The run lifecycle in the log, one line per step a person follows, written when the
/// step is journaled: the actor's own steps (accepted, and the end: completed, failed
/// with its class, cancelled) here, as it applies them; the run task's (started, an
/// attempt failed with its class and whether it is retried) by [`log_task_step`] as
/// the task appends them (the actor folds those only when the run ends).
pub(crate) fn log_actor_step(session_id: &SessionId, event: &Event) {
    match event {
        // A quick run's start goes with its end, in the actor's append.
        Event::RunStarted { .. } | Event::AttemptFailed { .. } => log_task_step(session_id, event),
        Event::RunQueued {
            run_id, agent_id, ..
        } => tracing::info!(%run_id, %session_id, agent_id, "run accepted"),
        Event::RunCompleted { run_id, .. } => {
            tracing::info!(%run_id, %session_id, "run completed")
        }
        Event::RunFailed {
            run_id,
            error_type,
            message,
            ..
        } => tracing::warn!(%run_id, %session_id, error_type, "run failed: {message}"),
        Event::RunCancelled { run_id, reason } => {
            tracing::info!(%run_id, %session_id, "run cancelled: {reason}")
        }
        _ => {}
    }
}

/// The run task's steps in the log (see [`log_actor_step`]).
pub(crate) fn log_task_step(session_id: &SessionId, event: &Event) {
    match event {
        Event::RunStarted { run_id, model, .. } => {
            tracing::info!(%run_id, %session_id, model, "run started")
        }
        Event::AttemptFailed {
            run_id,
            attempt,
            error_type,
            message,
            retryable,
        } => tracing::warn!(
            %run_id,
            %session_id,
            attempt,
            error_type,
            retryable,
            "attempt failed: {message}"
        ),
        _ => {}
    }
}
