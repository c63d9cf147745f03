//! A run's part in its session's workspace (`spec/workspaces.md`): before the turn, the
//! directory is made to match the journal (or, for a continuation, put back as it was
//! at the checkpoint it continues from, the rewind journaled); after each batch of
//! harness events with a completed tool call, and at the end of each attempt, what
//! changed is journaled: the new contents a group of pieces at a time, then the batch's
//! own events (the call's result in the transcript) with the last pieces and one
//! `WorkspaceChanged`, in one append. The tracker's fold follows only what was durably appended; an
//! append that fails leaves it to be read again from the journal.

use std::collections::HashSet;
use std::path::PathBuf;

use turnstile_journal::{
    Event, FileChange, ForkPoint, Journal, RunEvent, RunId, Seq, SessionId, SnapshotPoint, Warning,
};
use turnstile_projections::{Files, FilesAt, workspace};

use super::RunTask;
use crate::workspace::capture::{Captured, Captures};
use crate::workspace::{Bounds, Tracker};

/// Content bytes journaled in one append at most (two pieces).
const GROUP_BYTES: usize = 1024 * 1024;

/// A run's workspace: its tracker (lent by the session actor, or read from the journal
/// on the run's first need), and what the run owes it.
pub(crate) struct WorkspaceRun {
    pub tracker: Option<Tracker>,
    pub root: PathBuf,
    pub bounds: Bounds,
    /// A continuation not begun yet: where its workspace is rewound to.
    pub rewind: Option<ForkPoint>,
    /// Paths already named in a warning of this run.
    pub warned: HashSet<String>,
    /// The tracker cannot be trusted (a failed restore or append): no more snapshots in
    /// this run, and the actor reads it again.
    pub broken: bool,
}

/// How a harness that can wait learns that its tool calls' snapshots are taken (see
/// [`turnstile_harness::ToolsSettled`]): the calls of this attempt counted as their
/// batches arrive, told once each batch is journaled.
pub(super) struct Settle {
    sender: Option<tokio::sync::watch::Sender<u64>>,
    calls: u64,
}

impl Settle {
    /// With snapshots on, the harness of `request` waits for them.
    pub(super) fn new(snapshots: bool, request: &mut turnstile_harness::TurnRequest) -> Settle {
        let sender = snapshots.then(|| {
            let (sender, settled) = turnstile_harness::ToolsSettled::channel();
            request.settled = Some(settled);
            sender
        });
        Settle { sender, calls: 0 }
    }

    /// Counts a batch's completed calls; the last one's id, if any.
    pub(super) fn count(&mut self, batch: &[turnstile_harness::HarnessEvent]) -> Option<String> {
        let mut last = None;
        for event in batch {
            if let turnstile_harness::HarnessEvent::ToolCallCompleted { tool } = event {
                self.calls += 1;
                last = Some(tool.tool_call_id.clone());
            }
        }
        last
    }

    /// The calls counted so far have their snapshots.
    pub(super) fn tell(&self) {
        if let Some(sender) = &self.sender {
            sender.send_replace(self.calls);
        }
    }

    /// No snapshot will follow (the attempt cannot be journaled): nothing waits.
    pub(super) fn release(&self) {
        if let Some(sender) = &self.sender {
            sender.send_replace(u64::MAX);
        }
    }
}

impl RunTask {
    /// Makes the directory match the journal before the turn (see the module doc).
    pub(super) async fn prepare_workspace(
        &mut self,
        records: &mut Vec<std::sync::Arc<turnstile_journal::Recorded>>,
    ) -> Result<(), String> {
        let Some(work) = self.workspace.as_mut() else {
            return Ok(());
        };
        let journal = self.journal.clone();
        let session_id = self.identity.session_id.clone();
        let run_id = self.identity.run_id.clone();
        let tracker = work.tracker.take();
        let (root, bounds, rewind) = (work.root.clone(), work.bounds.clone(), work.rewind.take());
        let prepared = tokio::task::spawn_blocking(move || {
            let mut tracker = match tracker {
                Some(tracker) => tracker,
                None => Tracker::load(&journal, &session_id, root, bounds)?,
            };
            let rewound = match rewind {
                // Nothing recorded yet: what is there is the session's from its start
                // (recorded next), not something to remove.
                _ if tracker.state.snapshots == 0 => None,
                None => {
                    tracker.restore(&journal, None)?;
                    None
                }
                Some(fork) => {
                    let (at, point) = checkpoint_of(&journal, &fork)?;
                    match files_at(&journal, &session_id, &fork.from_run_id, &at)? {
                        Some(target) => {
                            let changes = workspace::diff(&tracker.state.files, &target);
                            tracker.restore(&journal, Some(&target))?;
                            Some((point, changes))
                        }
                        // No snapshot by then (they were turned on later): the files
                        // of then are not known, and the workspace stays as recorded.
                        None => {
                            tracker.restore(&journal, None)?;
                            None
                        }
                    }
                }
            };
            Ok::<_, String>((tracker, rewound))
        })
        .await
        .map_err(|error| error.to_string())
        .and_then(|prepared| prepared);
        let work = self.workspace.as_mut().expect("workspace present");
        let (tracker, rewound) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                work.broken = true;
                return Err(error);
            }
        };
        let first = tracker.state.snapshots == 0;
        work.tracker = Some(tracker);
        if first {
            return self
                .journal_with_snapshot(Vec::new(), SnapshotPoint::TurnStart, records)
                .await;
        }
        if let Some((point, changes)) = rewound.filter(|(_, changes)| !changes.is_empty()) {
            let event = Event::WorkspaceChanged {
                run_id,
                point,
                changes,
            };
            self.append(vec![event], records).await?;
        }
        Ok(())
    }

    /// The snapshot at the end of an attempt (with whatever events are held).
    pub(super) async fn snapshot_turn_end(
        &mut self,
        records: &mut Vec<std::sync::Arc<turnstile_journal::Recorded>>,
    ) -> Result<(), String> {
        self.journal_with_snapshot(Vec::new(), SnapshotPoint::TurnEnd, records)
            .await
    }

    /// Journals `events` and, with snapshots on, what changed in the workspace since
    /// the last snapshot, recorded at `point`.
    pub(super) async fn journal_with_snapshot(
        &mut self,
        mut events: Vec<Event>,
        point: SnapshotPoint,
        records: &mut Vec<std::sync::Arc<turnstile_journal::Recorded>>,
    ) -> Result<(), String> {
        let Some(tracker) = self
            .workspace
            .as_mut()
            .filter(|work| !work.broken)
            .and_then(|work| work.tracker.take())
        else {
            return self.append_some(events, records).await;
        };
        let scanned = tokio::task::spawn_blocking(move || {
            let mut tracker = tracker;
            let plan = tracker.plan();
            (tracker, plan)
        })
        .await;
        let Ok((tracker, plan)) = scanned else {
            self.workspace_broken();
            return self.append_some(events, records).await;
        };
        self.lend_back(tracker);
        let mut plan = match plan {
            Ok(plan) => plan,
            Err(error) => {
                // The run goes on; the next snapshot sees what this one missed.
                tracing::warn!(run_id = %self.identity.run_id, %error, "workspace not scanned");
                return self.append_some(events, records).await;
            }
        };
        let warning = self.over_limit_warning(&plan.left_out);
        if plan.changes.is_empty() && warning.is_none() {
            self.set_local(plan.index);
            return self.append_some(events, records).await;
        }
        self.capture_contents(&mut plan, &mut events, records)
            .await?;
        plan.changes.retain(|change| !change.path.is_empty());
        if !plan.changes.is_empty() {
            events.push(Event::WorkspaceChanged {
                run_id: self.identity.run_id.clone(),
                point,
                changes: plan.changes,
            });
        }
        if let Some(warning) = warning {
            let index = self.take_index();
            events.push(self.identity.emitted(index, warning));
        }
        self.append_some(events, records).await?;
        self.set_local(plan.index);
        Ok(())
    }

    /// Reads the changed files whose content the journal lacks into content records,
    /// a group at a time on a blocking thread, appending each full group. A file that
    /// cannot be read now (gone, swapped for a link, grown past its bound) is left for
    /// the next snapshot; one read as other bytes than the scan hashed is recorded as
    /// read.
    async fn capture_contents(
        &mut self,
        plan: &mut crate::workspace::Plan,
        events: &mut Vec<Event>,
        records: &mut Vec<std::sync::Arc<turnstile_journal::Recorded>>,
    ) -> Result<(), String> {
        let mut queued = HashSet::new();
        let wanted: Vec<(usize, String)> = plan
            .changes
            .iter()
            .enumerate()
            .filter_map(|(position, change)| {
                let entry = change.entry.as_ref()?;
                let new = entry.kind == turnstile_journal::FileKind::File
                    && !self.has_content(&entry.digest)
                    && queued.insert(entry.digest.clone());
                new.then(|| (position, change.path.clone()))
            })
            .collect();
        let work = self.workspace.as_ref().expect("workspace present");
        let mut queue = Captures::new(
            work.root.clone(),
            self.identity.run_id.clone(),
            work.bounds.max_file_bytes,
            wanted,
        );
        let mut stored_now = HashSet::new();
        let mut pieces = Vec::new();
        loop {
            let read = tokio::task::spawn_blocking(move || {
                let group = queue.next_group(GROUP_BYTES);
                (queue, group)
            })
            .await
            .map_err(|error| error.to_string())?;
            let (back, (group, finished)) = read;
            queue = back;
            pieces.extend(group);
            for (position, captured) in finished {
                match captured {
                    Some(captured) => {
                        if plan.changes[position]
                            .entry
                            .as_ref()
                            .is_some_and(|entry| entry.digest != captured.digest)
                        {
                            fix(plan, position, &captured);
                        }
                        stored_now.insert(captured.digest);
                    }
                    None => drop_change(plan, position),
                }
            }
            if queue.is_done() {
                break;
            }
            self.append_pieces(std::mem::take(&mut pieces), records)
                .await?;
        }
        // The last pieces go with the harness's events and the snapshot: what the
        // transcript says was done and the files it left are durable together.
        events.extend(pieces);
        // A file whose content is neither in the journal nor read now (the same content
        // as one that changed while read) waits for the next snapshot.
        for position in 0..plan.changes.len() {
            let missing = plan.changes[position].entry.as_ref().is_some_and(|entry| {
                entry.kind == turnstile_journal::FileKind::File
                    && !stored_now.contains(&entry.digest)
                    && !self.has_content(&entry.digest)
            });
            if missing {
                drop_change(plan, position);
            }
        }
        Ok(())
    }

    /// Appends content pieces alone (the held start events wait for the snapshot's own
    /// append): pieces without the snapshot that names them are ignored by every fold.
    async fn append_pieces(
        &mut self,
        pieces: Vec<Event>,
        records: &mut Vec<std::sync::Arc<turnstile_journal::Recorded>>,
    ) -> Result<(), String> {
        let held = std::mem::take(&mut self.start_events);
        let appended = self.append(pieces, records).await;
        self.start_events = held;
        appended
    }

    /// A `workspace_over_limit` warning for paths not named before in this run.
    fn over_limit_warning(&mut self, left_out: &[(String, String)]) -> Option<RunEvent> {
        let work = self.workspace.as_mut()?;
        let new: Vec<(String, String)> = left_out
            .iter()
            .filter(|(path, _)| work.warned.insert(path.clone()))
            .cloned()
            .collect();
        (!new.is_empty()).then_some(RunEvent::Warning {
            warning: Warning::WorkspaceOverLimit { left_out: new },
        })
    }

    fn has_content(&self, digest: &str) -> bool {
        self.workspace
            .as_ref()
            .and_then(|work| work.tracker.as_ref())
            .is_some_and(|tracker| tracker.state.has_content(digest))
    }

    fn lend_back(&mut self, tracker: Tracker) {
        if let Some(work) = self.workspace.as_mut() {
            work.tracker = Some(tracker);
        }
    }

    fn set_local(&mut self, index: crate::workspace::Index) {
        if let Some(tracker) = self
            .workspace
            .as_mut()
            .and_then(|work| work.tracker.as_mut())
        {
            tracker.local = Some(index);
        }
    }

    /// No more snapshots in this run; the actor reads the workspace again.
    pub(super) fn workspace_broken(&mut self) {
        if let Some(work) = self.workspace.as_mut() {
            work.broken = true;
            work.tracker = None;
        }
    }

    /// The tracker's fold takes what was appended.
    pub(super) fn workspace_appended(
        &mut self,
        appended: &[std::sync::Arc<turnstile_journal::Recorded>],
    ) {
        if let Some(tracker) = self
            .workspace
            .as_mut()
            .and_then(|work| work.tracker.as_mut())
        {
            for record in appended {
                if matches!(
                    record.event,
                    Event::WorkspaceChanged { .. } | Event::WorkspaceContent { .. }
                ) {
                    tracker.dirty = true;
                }
                tracker.state.apply(record);
            }
        }
    }

    async fn append_some(
        &mut self,
        events: Vec<Event>,
        records: &mut Vec<std::sync::Arc<turnstile_journal::Recorded>>,
    ) -> Result<(), String> {
        if events.is_empty() {
            return Ok(());
        }
        self.append(events, records).await
    }
}

/// A change whose file was read as other bytes than the scan hashed.
fn fix(plan: &mut crate::workspace::Plan, position: usize, captured: &Captured) {
    let change = &mut plan.changes[position];
    if let Some(entry) = change.entry.as_mut() {
        entry.digest = captured.digest.clone();
        entry.size = captured.size;
    }
    if let Some(local) = plan.index.get_mut(&change.path) {
        local.digest = captured.digest.clone();
        local.size = captured.size;
        local.mtime_ns = 0;
    }
}

/// A change that cannot be recorded now: left for the next snapshot (blanked here, and
/// forgotten by the index so that the next scan looks again).
fn drop_change(plan: &mut crate::workspace::Plan, position: usize) {
    let change = &mut plan.changes[position];
    plan.index.remove(&change.path);
    *change = FileChange {
        path: String::new(),
        ..change.clone()
    };
}

/// Where a continuation's workspace is rewound to, and how the rewind is recorded.
fn checkpoint_of(journal: &Journal, fork: &ForkPoint) -> Result<(FilesAt, SnapshotPoint), String> {
    let source = crate::reads::branch_run(journal, &fork.from_run_id)
        .ok_or_else(|| format!("run {} cannot be read", fork.from_run_id))?;
    let at = if fork.message_index <= 1 {
        FilesAt::RunStart
    } else if let Some(checkpoint) = source
        .checkpoints
        .iter()
        .find(|checkpoint| checkpoint.message_index == fork.message_index)
    {
        FilesAt::ToolCall(checkpoint.tool_call_id.clone())
    } else {
        FilesAt::RunEnd
    };
    let tool_call_id = match &at {
        FilesAt::ToolCall(id) => Some(id.clone()),
        _ => None,
    };
    Ok((
        at,
        SnapshotPoint::Rewound {
            from_run_id: fork.from_run_id.clone(),
            tool_call_id,
        },
    ))
}

/// The session's files at a point of one of its runs, folded from its records (`None`:
/// see [`workspace::files_at`]).
pub(crate) fn files_at(
    journal: &Journal,
    session_id: &SessionId,
    run_id: &RunId,
    at: &FilesAt,
) -> Result<Option<Files>, String> {
    let mut failure = None;
    let records = journal
        .read_session(session_id, Seq(0))
        .map_while(|record| record.map_err(|error| failure = Some(error)).ok());
    let files = workspace::files_at(records, run_id, at);
    match failure {
        Some(error) => Err(error.to_string()),
        None => Ok(files),
    }
}
