//! A run's end: its terminal events journaled and the session freed in one step, with a
//! fallback ending when the run task could not say how it ended.

use crate::session::SessionActor;
use crate::session::shared::Live;
use actix::prelude::*;
use std::sync::Arc;
use std::time::Instant;
use turnstile_journal::{Event, EventIndex, Expected, RunId};

use crate::run::{Finished, RunIdentity, broadcast_wire, failed_events, journal_error_type};

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct RunFinishedMsg(pub(super) Finished);

impl SessionActor {
    /// Appends the events that end a run, then frees the session and ends its streams.
    pub(super) fn end_run(
        &mut self,
        run_id: RunId,
        terminal: Vec<Event>,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
        ctx: &mut Context<Self>,
    ) {
        let journal = self.shared.journal.clone();
        let session_id = self.session_id.clone();
        let identity = self.identity(&run_id);
        if let Some(in_flight) = self.in_flight.as_mut().filter(|f| f.run_id == run_id) {
            in_flight.ending = true;
        }
        self.ending.insert(run_id.clone());
        ctx.spawn(
            async move {
                let appended = journal
                    .append(&session_id, Expected::Any, terminal.clone())
                    .await;
                let failure = match appended {
                    Ok(Ok(records)) => return Ok(Ok(records)),
                    Ok(Err(conflict)) => conflict.to_string(),
                    // Certainly not written: a small end takes its place.
                    Err(error @ turnstile_journal::Error::TooLarge { .. }) => error.to_string(),
                    // Perhaps written: the state is read back instead (crash-only).
                    Err(error) => return Err(error),
                };
                // No code path leaves a run open: what could not be journaled is replaced
                // by a small end that says why (the events that fit go with it).
                tracing::error!(run_id = %identity.run_id, %failure, "terminal events not journaled; ending the run with a small terminal record");
                let ending = fallback_ending(&identity, terminal, &failure, journal.max_event_bytes());
                journal.append(&session_id, Expected::Any, ending).await
            }
            .into_actor(self)
                .map(move |result, actor, ctx| {
                    // The slot frees only once the run's end is journaled, so the journal
                    // never shows more runs executing than there are slots.
                    drop(slot);
                    actor.ending.remove(&run_id);
                    if let Some(in_flight) = actor.in_flight.take_if(|f| f.run_id == run_id) {
                        actor.remove_staged(&in_flight.staged);
                    }
                    actor.last_active = Instant::now();
                    let live = actor.shared.remove_live(&run_id);
                    match result {
                        Ok(Ok(records)) => actor.run_ended(&run_id, &records, live, ctx),
                        Ok(Err(conflict)) => {
                            tracing::error!(%run_id, %conflict, "terminal event refused");
                            actor.stale = true;
                            actor.heal_later(ctx);
                        }
                        // Even the small end failed: the journal itself is failing, and
                        // start-up recovery ends the run (on a shared journal, the
                        // session's next owner).
                        Err(error) => {
                            tracing::error!(%run_id, %error, "terminal event not journaled");
                            actor.stale = true;
                            actor.check_fenced(&error, ctx);
                            actor.heal_later(ctx);
                        }
                    }
                    actor.pump(ctx);
                    actor.stop_if_given_back(ctx);
                }),
        );
    }
}

impl SessionActor {
    /// A run's end is durable: folded, a pause held, the workspace's point stored, and
    /// the end sent to the run's streams, after its final view was left for the caller
    /// waiting for it.
    fn run_ended(
        &mut self,
        run_id: &RunId,
        records: &[Arc<turnstile_journal::Recorded>],
        live: Option<Live>,
        ctx: &mut Context<Self>,
    ) {
        // Cloned only for a caller that holds the run's slot, not for nobody.
        let waited = live
            .as_ref()
            .is_some_and(|live| Arc::strong_count(&live.ended) > 1);
        let ended = self.apply_keeping(records, waited.then_some(run_id));
        // A pause ends no run: the run waits for its decision, holding the session even
        // before the state has folded the pause.
        if let Some((index, paused_at_us)) = pause_of(records) {
            self.holding = Some((run_id.clone(), index));
            self.arm_timeout_of(run_id.clone(), paused_at_us, ctx);
        }
        if let Some(tracker) = self.workspace.as_mut() {
            tracker.store(&self.shared.journal, self.state.next_seq);
        }
        if let Some(live) = live {
            // Left before the end is sent: a caller that sees the end finds the view.
            if let Some(view) = ended {
                let _ = live.ended.set(view);
            }
            broadcast_wire(&live.events, records);
        }
    }
}

/// A run's end when its terminal batch could not be journaled: the batch's events that
/// are not an ending and fit a record, up to the first client-visible event that does
/// not (so indexes stay contiguous), then `RunError` and `RunFailed` naming the cause.
pub(super) fn fallback_ending(
    identity: &RunIdentity,
    terminal: Vec<Event>,
    failure: &str,
    max_event_bytes: usize,
) -> Vec<Event> {
    let mut kept = Vec::new();
    let mut next_index = None;
    let fits = |event: &Event| {
        turnstile_journal::codec::encode_event(event.clone(), max_event_bytes).is_ok()
    };
    for event in terminal {
        if event.is_terminal() {
            continue;
        }
        match &event {
            Event::RunEventEmitted {
                event_index,
                event: run_event,
                ..
            } => {
                let ending = run_event.is_terminal();
                if next_index.is_none() && !ending && fits(&event) {
                    kept.push(event);
                } else if next_index.is_none() {
                    next_index = Some(*event_index);
                }
            }
            _ if fits(&event) => kept.push(event),
            _ => {}
        }
    }
    // The terminal batch always holds its wire ending, so `next_index` is set; without
    // one the end follows the last event kept.
    let index = next_index
        .or_else(|| {
            kept.iter()
                .filter_map(|event| match event {
                    Event::RunEventEmitted { event_index, .. } => Some(event_index.next()),
                    _ => None,
                })
                .max()
        })
        .unwrap_or(EventIndex(0));
    let message = format!("The run's result could not be recorded: {failure}");
    kept.extend(failed_events(
        identity,
        index,
        journal_error_type(failure),
        &message,
        false,
    ));
    kept
}

/// The event index and time of a pause among `records`, if they pause their run.
fn pause_of(records: &[std::sync::Arc<turnstile_journal::Recorded>]) -> Option<(EventIndex, i64)> {
    records.iter().find_map(|record| match &record.event {
        Event::RunEventEmitted {
            event_index,
            event: turnstile_journal::RunEvent::Paused { .. },
            ..
        } => Some((*event_index, record.ts_us)),
        _ => None,
    })
}

impl Handler<RunFinishedMsg> for SessionActor {
    type Result = ();

    fn handle(&mut self, RunFinishedMsg(finished): RunFinishedMsg, ctx: &mut Self::Context) {
        self.fold(&finished.records);
        self.workspace = finished.workspace;
        if finished.journal_failed {
            // An append of the run's task failed and what the journal took is unknown:
            // as after a crash, the run is read back from the journal and resolved from
            // there (a new attempt or its end), never from what this actor assumed.
            drop(finished.slot);
            if let Some(in_flight) = self.in_flight.take_if(|f| f.run_id == finished.run_id) {
                self.remove_staged(&in_flight.staged);
            }
            self.shared.remove_live(&finished.run_id);
            if finished.fenced {
                // This replica lost the lease: the session's next owner resolves the run.
                if self.leased && !self.fenced {
                    self.fence(ctx);
                }
                return;
            }
            self.stale = true;
            // Not at once: while the journal refuses everything, a run resumed now would
            // fail again at its first append, in a tight loop.
            self.heal_later(ctx);
            return;
        }
        self.end_run(finished.run_id, finished.terminal, Some(finished.slot), ctx);
    }
}
