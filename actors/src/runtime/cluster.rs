//! A runtime among replicas on a shared journal: the duties of a replica (commands left
//! for it, sessions to take over, records other replicas appended) and commands for a
//! session that another replica owns, handed to that owner and answered.

use crate::api::{Refused, RuntimeError, StartRun};
use crate::registry::{FenceAll, WakeSession};
use crate::runtime::replica::{ReplicaCommand, ReplicaReply, refusal_of, refusal_text};
use crate::session::SessionActor;
use crate::stream::RunEvents;
use crate::{RunHandle, Runtime};
use actix::prelude::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use turnstile_journal::limits::{CLAIM_EVERY_MS, COMMANDS_EVERY_MS, ELSEWHERE_WAIT_MS};
use turnstile_journal::{EventIndex, Seq, SessionId};

impl Runtime {
    /// On a shared journal, a thread of this replica's own: it carries out the commands
    /// other replicas leave for sessions this one owns, takes over sessions with open
    /// runs whose owner died or stalled (as many as it has free worker slots), and stops
    /// every turn when this replica's heartbeat lapsed (its leases are gone). The
    /// directory follows the other replicas' records from `followed_from` on.
    pub(super) fn start_cluster_duties(
        &self,
        followed_from: turnstile_journal::JournalPos,
    ) -> Result<(), RuntimeError> {
        let weak = Arc::downgrade(&self.inner);
        let mut lapses = self.journal().lapses();
        std::thread::Builder::new()
            .name("turnstile-replica".into())
            .spawn(move || {
                let Ok(reactor) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    tracing::error!("the replica thread could not start its runtime");
                    return;
                };
                reactor.block_on(async move {
                    tokio::spawn(crate::runtime::following::follow_other_replicas(
                        weak.clone(),
                        followed_from,
                    ));
                    let mut last_claim = Instant::now() - CLAIM_EVERY;
                    loop {
                        let Some(inner) = weak.upgrade() else { return };
                        if !inner.shared.accepting.load(Ordering::SeqCst) {
                            return;
                        }
                        let runtime = Runtime { inner };
                        if lapses.has_changed().unwrap_or(false) {
                            let lapse = *lapses.borrow_and_update();
                            runtime.inner.registry.do_send(FenceAll(lapse));
                        }
                        match runtime.journal().take_commands() {
                            Ok(commands) => {
                                for command in commands {
                                    let runtime = runtime.clone();
                                    tokio::spawn(async move {
                                        let id = command.id;
                                        let reply = runtime.serve_command(command).await;
                                        let journal = runtime.journal().clone();
                                        let answered = tokio::task::spawn_blocking(move || {
                                            journal.answer_command(id, reply)
                                        })
                                        .await;
                                        if let Ok(Err(error)) = answered {
                                            tracing::warn!(%error, "answering another replica's command failed");
                                        }
                                    });
                                }
                            }
                            Err(error) => tracing::warn!(%error, "reading this replica's commands failed"),
                        }
                        if last_claim.elapsed() >= CLAIM_EVERY {
                            last_claim = Instant::now();
                            let free = runtime.inner.shared.slots.available_permits();
                            if free > 0 {
                                match runtime.journal().claimable(free) {
                                    Ok(sessions) => {
                                        for session_id in sessions {
                                            tracing::info!(%session_id, "taking over a session whose owner is gone");
                                            runtime.inner.registry.do_send(WakeSession(session_id));
                                        }
                                    }
                                    Err(error) => tracing::warn!(%error, "looking for sessions to take over failed"),
                                }
                            }
                        }
                        let journal = runtime.journal().clone();
                        drop(runtime);
                        journal.wait_for_commands(COMMANDS_EVERY).await;
                    }
                });
            })
            .map_err(RuntimeError::Spawn)?;
        Ok(())
    }

    /// Hands a turn for a session another replica owns to that replica (through the
    /// journal's inbox); `None` when it never ran there (not taken in time, or the
    /// owner died), so the caller asks again.
    pub(super) async fn forward_start(
        &self,
        session_id: &SessionId,
        owner: &str,
        command: &StartRun,
    ) -> Result<Option<Result<RunHandle, Refused>>, RuntimeError> {
        let command = ReplicaCommand::Enqueue(Box::new(command.clone()));
        let (run_id, from_seq) = match self.ask_replica(session_id, owner, command).await? {
            None => return Ok(None),
            Some(ReplicaReply::Refused { refused }) => {
                return Ok(Some(Err(refusal_of(&refused, session_id))));
            }
            Some(ReplicaReply::Started { run_id, from_seq }) => (run_id, Seq(from_seq)),
            Some(other) => return Err(RuntimeError::ReplicaReply(other.to_wire())),
        };
        Ok(Some(Ok(RunHandle {
            events: RunEvents::new(
                self.journal().clone(),
                session_id.clone(),
                run_id.clone(),
                from_seq,
                None,
                EventIndex(0),
            ),
            run_id,
            session_id: session_id.clone(),
            reused: false,
            ended: None,
            runtime: self.clone(),
        })))
    }

    /// Carries out a command another replica left for a session this one owns, and
    /// answers it.
    pub(super) async fn serve_command(&self, command: turnstile_journal::Command) -> String {
        let refused = |reason: String| ReplicaReply::Refused {
            refused: format!("internal: {reason}"),
        };
        let reply = match ReplicaCommand::read(&command) {
            Err(reason) => refused(reason),
            Ok(ReplicaCommand::Cancel(run_id)) => ReplicaReply::Cancelled {
                cancelled: self.cancel_run(&run_id).await.unwrap_or(false),
            },
            Ok(ReplicaCommand::Decide(decide)) => match self.decide_run(*decide).await {
                Ok(Ok(handle)) => ReplicaReply::Continued {
                    run_id: handle.run_id.clone(),
                    from_seq: handle.events.from_seq().0,
                    from_index: handle.events.next_index().0,
                },
                Ok(Err(refusal)) => ReplicaReply::Refused {
                    refused: refusal_text(&refusal),
                },
                Err(error) => refused(error.to_string()),
            },
            Ok(ReplicaCommand::Enqueue(start)) => match self.start_run(*start).await {
                Ok(Ok(handle)) => ReplicaReply::Started {
                    from_seq: self
                        .run_view(&handle.run_id)
                        .ok()
                        .flatten()
                        .map(|view| view.queued_seq.0)
                        .unwrap_or(0),
                    run_id: handle.run_id,
                },
                Ok(Err(refusal)) => ReplicaReply::Refused {
                    refused: refusal_text(&refusal),
                },
                Err(error) => refused(error.to_string()),
            },
        };
        reply.to_wire()
    }

    /// Sends a command that must run on the session's owner: on a shared journal a
    /// session another replica owns is busy (its running run named) or, idle and being
    /// given back, asked again until it is free.
    pub(super) async fn ask_owner<M, T>(
        &self,
        session_id: &SessionId,
        message: impl Fn() -> M,
    ) -> Result<Result<T, Refused>, RuntimeError>
    where
        M: Message<Result = Result<Result<T, Refused>, RuntimeError>> + Send + 'static,
        T: Send + 'static,
        SessionActor: Handler<M>,
    {
        let deadline = Instant::now() + ELSEWHERE_WAIT;
        loop {
            match self.ask_session(session_id.clone(), message()).await {
                Ok(Err(RuntimeError::Elsewhere {
                    busy: Some(run_id), ..
                })) => {
                    return Ok(Err(Refused::Busy {
                        session_id: session_id.clone(),
                        run_id,
                    }));
                }
                Ok(Err(RuntimeError::Elsewhere { owner, .. })) if Instant::now() >= deadline => {
                    return Err(RuntimeError::OwnerSilent {
                        session_id: session_id.clone(),
                        owner,
                        detail: "",
                    });
                }
                Ok(Err(RuntimeError::Elsewhere { .. })) => {}
                Err(RuntimeError::Stopped)
                    if Instant::now() < deadline
                        && self.inner.shared.accepting.load(Ordering::SeqCst) => {}
                Ok(answer) => return answer,
                Err(error) => return Err(error),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

pub(super) const ELSEWHERE_WAIT: Duration = Duration::from_millis(ELSEWHERE_WAIT_MS);

pub(super) const COMMANDS_EVERY: Duration = Duration::from_millis(COMMANDS_EVERY_MS);

pub(super) const CLAIM_EVERY: Duration = Duration::from_millis(CLAIM_EVERY_MS);
