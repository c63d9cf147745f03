//! The directory of a replica among others: the sessions list and the daily metrics
//! follow what the other replicas journal.

use crate::runtime::Inner;
use std::sync::atomic::Ordering;
use std::time::Duration;
use turnstile_journal::SessionId;

/// Keeps the directory (the sessions list and the daily metrics) true to what the other
/// replicas do: a session's turning point journaled elsewhere (a session created or
/// deleted, a run accepted or ended, a compaction) reloads its facts from its read model.
/// Sessions this replica holds, and records its own actors appended (or folded before
/// appending), are followed by those actors. A failed read does not end it: the journal
/// is followed again from where it stopped, and a session that could not be reloaded is
/// reloaded at the next round.
pub(super) async fn follow_other_replicas(
    weak: std::sync::Weak<Inner>,
    mut from: turnstile_journal::JournalPos,
) {
    let Some(journal) = weak.upgrade().map(|inner| inner.shared.journal.clone()) else {
        return;
    };
    let mut unread = std::collections::BTreeSet::new();
    loop {
        let mut records = journal.subscribe_from(from);
        let outcome = follow_from(&weak, &journal, &mut records, &mut unread).await;
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
        tokio::time::sleep(DIRECTORY_RETRY).await;
    }
}

/// Follows `records` until the runtime is gone (`Ok`) or a read fails; `unread` holds the
/// sessions still to reload (they failed to load, or the round was cut short).
async fn follow_from(
    weak: &std::sync::Weak<Inner>,
    journal: &turnstile_journal::Journal,
    records: &mut turnstile_journal::Subscription,
    unread: &mut std::collections::BTreeSet<SessionId>,
) -> Result<(), turnstile_journal::Error> {
    loop {
        // A session left to reload is retried after a while even if nothing else comes.
        let first = if unread.is_empty() {
            Some(records.next().await?)
        } else {
            match tokio::time::timeout(DIRECTORY_RETRY, records.next()).await {
                Ok(record) => Some(record?),
                Err(_) => None,
            }
        };
        // The records of the next few milliseconds with it: a session whose turn ended
        // meanwhile (accepted, then ended) is read once for all of them.
        let until = tokio::time::Instant::now() + DIRECTORY_FOLLOW_EVERY;
        let mut record = first;
        let mut failed = None;
        while let Some(one) = record.take() {
            if turning_point_elsewhere(journal, &one) {
                unread.insert(one.session_id.clone());
            }
            match tokio::time::timeout_at(until, records.next()).await {
                Ok(Ok(next)) => record = Some(next),
                Ok(Err(error)) => failed = Some(error),
                Err(_) => {}
            }
        }
        let Some(inner) = weak.upgrade() else {
            return Ok(());
        };
        for session_id in std::mem::take(unread) {
            match crate::reads::load_session(journal, &session_id) {
                Ok(state) => inner.shared.directory.update(&session_id, &state.session),
                Err(error) => {
                    tracing::warn!(%session_id, %error, "a session another replica changed could not be read; retrying");
                    unread.insert(session_id);
                }
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
    }
}

/// A session's turning point (created or deleted, a run accepted or ended, a
/// compaction) that this replica's actors did not see.
fn turning_point_elsewhere(
    journal: &turnstile_journal::Journal,
    record: &turnstile_journal::Recorded,
) -> bool {
    let turning_point = match &record.event {
        turnstile_journal::Event::SessionCreated { .. }
        | turnstile_journal::Event::SessionDeleted { .. }
        | turnstile_journal::Event::RunQueued { .. }
        | turnstile_journal::Event::TranscriptCompacted { .. } => true,
        event => event.is_terminal(),
    };
    turning_point
        && !journal.holds_lease(&record.session_id)
        && !journal.seen_here(&record.session_id, record.seq)
}

/// How long the directory's follower gathers the other replicas' records before it reads
/// the sessions they changed.
const DIRECTORY_FOLLOW_EVERY: Duration = Duration::from_millis(50);

/// How long the directory's follower waits before it reads again after a failed read.
const DIRECTORY_RETRY: Duration = Duration::from_millis(500);
