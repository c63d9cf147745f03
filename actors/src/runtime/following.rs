//! The directory of a replica among others: the sessions list and the daily metrics
//! follow what the other replicas journal, folded from their records as they come.

use crate::runtime::Inner;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::time::Duration;
use turnstile_journal::{Event, Journal, Recorded, SessionId};
use turnstile_projections::SessionState;

/// Keeps the directory (the sessions list and the daily metrics) true to what the other
/// replicas do. Their records are folded as they come, the way an actor folds its own:
/// a session whose first record is among them from its start, any other from its read
/// model, read once at its next turning point (a session created or deleted, a run
/// accepted or ended, a compaction), then folded on. Sessions this replica holds, and
/// records its own actors appended (or folded before appending), are followed by those
/// actors. A failed read does not end it: the journal is followed again from where it
/// stopped, and a session that could not be read is read at the next round.
pub(super) async fn follow_other_replicas(
    weak: std::sync::Weak<Inner>,
    mut from: turnstile_journal::JournalPos,
) {
    let Some(journal) = weak.upgrade().map(|inner| inner.shared.journal.clone()) else {
        return;
    };
    let mut folds = Folds::default();
    loop {
        let mut records = journal.subscribe_from(from);
        let outcome = follow_from(&weak, &journal, &mut records, &mut folds).await;
        from = records.position();
        match outcome {
            Err(turnstile_journal::Error::Stopped) => return,
            Err(error) => tracing::warn!(%error, "following the other replicas failed; retrying"),
            Ok(()) => return,
        }
        match weak.upgrade() {
            Some(inner) if inner.shared.accepting.load(Ordering::SeqCst) => {}
            _ => return,
        }
        // Where it stopped is not known to have been folded: read again.
        folds.forget();
        tokio::time::sleep(DIRECTORY_RETRY).await;
    }
}

/// Follows `records` until the runtime is gone (`Ok`) or a read fails.
async fn follow_from(
    weak: &std::sync::Weak<Inner>,
    journal: &Journal,
    records: &mut turnstile_journal::Subscription,
    folds: &mut Folds,
) -> Result<(), turnstile_journal::Error> {
    loop {
        // A session left to read is retried after a while even if nothing else comes.
        let first = if folds.unread.is_empty() {
            Some(records.next().await?)
        } else {
            match tokio::time::timeout(DIRECTORY_RETRY, records.next()).await {
                Ok(record) => Some(record?),
                Err(_) => None,
            }
        };
        // The records of the next few milliseconds with it: the directory is told once
        // for all of them.
        let until = tokio::time::Instant::now() + DIRECTORY_FOLLOW_EVERY;
        let mut record = first;
        let mut failed = None;
        while let Some(one) = record.take() {
            folds.fold(journal, &one);
            match tokio::time::timeout_at(until, records.next()).await {
                Ok(Ok(next)) => record = Some(next),
                Ok(Err(error)) => failed = Some(error),
                Err(_) => {}
            }
        }
        let Some(inner) = weak.upgrade() else {
            return Ok(());
        };
        folds.tell(journal, &inner.shared.directory);
        if let Some(error) = failed {
            return Err(error);
        }
    }
}

/// The sessions the other replicas are changing, as folded so far.
#[derive(Default)]
struct Folds {
    /// Sessions with a run open elsewhere (or changed this round), each as of its last
    /// record folded here.
    states: HashMap<SessionId, SessionState>,
    /// Folded to a turning point since the directory was last told.
    changed: BTreeSet<SessionId>,
    /// At a turning point, not folded: to read (not seen from its start, a record
    /// missed, or a read that failed).
    unread: BTreeSet<SessionId>,
}

impl Folds {
    /// Folds one record of the journal (its records come in order).
    fn fold(&mut self, journal: &Journal, record: &Recorded) {
        let session_id = &record.session_id;
        if journal.holds_lease(session_id) || journal.seen_here(session_id, record.seq) {
            // This replica's actors follow the session: a fold here would miss theirs.
            self.states.remove(session_id);
            return;
        }
        let turning_point = turning_point(&record.event);
        let room = self.states.len() < FOLDED_SESSIONS_MAX;
        match self.states.get_mut(session_id) {
            Some(state) if record.seq.0 < state.next_seq => return,
            Some(state) if record.seq.0 == state.next_seq => state.apply(record),
            // A record not seen: the session is read again.
            Some(_) => {
                self.states.remove(session_id);
                self.unread.insert(session_id.clone());
                return;
            }
            None if record.seq.0 == 0 && room => {
                let mut state = SessionState::new(session_id.clone());
                state.apply(record);
                self.states.insert(session_id.clone(), state);
            }
            None => {
                if turning_point {
                    self.unread.insert(session_id.clone());
                }
                return;
            }
        }
        if turning_point {
            self.changed.insert(session_id.clone());
        }
    }

    /// Tells the directory what changed: the sessions folded to a turning point, and
    /// those read now (kept to fold on while a run of theirs is open). A session with no
    /// open run is forgotten (read again at its next turning point).
    fn tell(&mut self, journal: &Journal, directory: &crate::directory::Directory) {
        for session_id in std::mem::take(&mut self.unread) {
            match crate::reads::load_session(journal, &session_id) {
                Ok(state) => {
                    directory.update(&session_id, &state.session);
                    if self.states.len() < FOLDED_SESSIONS_MAX {
                        self.states.insert(session_id, state);
                    }
                }
                Err(error) => {
                    tracing::warn!(%session_id, %error, "a session another replica changed could not be read; retrying");
                    self.unread.insert(session_id);
                }
            }
        }
        for session_id in std::mem::take(&mut self.changed) {
            if let Some(state) = self.states.get(&session_id) {
                directory.update(&session_id, &state.session);
            }
        }
        self.states
            .retain(|_, state| state.open_runs().next().is_some());
    }

    /// Forgets every fold: what was folded is read again at the next round.
    fn forget(&mut self) {
        self.unread
            .extend(self.states.drain().map(|(session_id, _)| session_id));
        self.changed.clear();
    }
}

/// A session's turning point: created or deleted, a run accepted or ended, a compaction.
fn turning_point(event: &Event) -> bool {
    match event {
        Event::SessionCreated { .. }
        | Event::SessionDeleted { .. }
        | Event::RunQueued { .. }
        | Event::TranscriptCompacted { .. } => true,
        event => event.is_terminal(),
    }
}

/// Sessions folded at once at most; past it, a session is read at its turning points.
const FOLDED_SESSIONS_MAX: usize = 4_096;

/// How long the directory's follower gathers the other replicas' records before it tells
/// the directory.
const DIRECTORY_FOLLOW_EVERY: Duration = Duration::from_millis(50);

/// How long the directory's follower waits before it reads again after a failed read.
const DIRECTORY_RETRY: Duration = Duration::from_millis(500);
