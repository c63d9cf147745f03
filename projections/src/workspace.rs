//! A session's workspace as its journal tells it (`spec/workspaces.md`): the fold of its
//! `WorkspaceChanged` events (the files now), where each content lives (the pieces of
//! its `WorkspaceContent` records, by digest), the files at any checkpoint, and what a
//! run changed. A `SessionDeleted` empties it: a session created again under the same
//! id starts with no files.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use turnstile_journal::{
    ChangeKind, Event, FileChange, FileEntry, Recorded, RunEvent, RunId, SessionId, SnapshotPoint,
};

/// The files of a session's workspace, by path.
pub type Files = BTreeMap<String, FileEntry>;

/// The fold of a session's workspace records, as of a sequence; also its stored form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceState {
    /// The session.
    pub session_id: SessionId,
    /// The sequence after the last record folded in.
    #[serde(rename = "as_of_seq")]
    pub next_seq: u64,
    /// The files now.
    pub files: Files,
    /// Each whole content: the sequences of its pieces' records, in order.
    pub contents: HashMap<String, Vec<u64>>,
    /// Snapshots folded in (none yet: the journal has not recorded the directory, so
    /// there is nothing to restore).
    #[serde(default)]
    pub snapshots: u64,
    /// Contents being recorded: per blob, the next offset and the pieces so far.
    pending: HashMap<String, (u64, Vec<u64>)>,
}

impl WorkspaceState {
    /// The empty workspace of a session.
    pub fn new(session_id: SessionId) -> Self {
        WorkspaceState {
            session_id,
            next_seq: 0,
            files: Files::new(),
            contents: HashMap::new(),
            snapshots: 0,
            pending: HashMap::new(),
        }
    }

    /// Folds one record of the session (in order).
    pub fn apply(&mut self, record: &Recorded) {
        if record.seq.0 < self.next_seq {
            return;
        }
        self.next_seq = record.seq.0 + 1;
        match &record.event {
            Event::WorkspaceContent {
                blob,
                offset,
                bytes,
                digest,
                ..
            } => {
                let pieces = self.pending.entry(blob.clone()).or_default();
                if *offset != pieces.0 {
                    // Not contiguous (a stop in the middle of a content): start over.
                    *pieces = (0, Vec::new());
                    if *offset != 0 {
                        return;
                    }
                }
                pieces.0 += bytes.len() as u64;
                pieces.1.push(record.seq.0);
                if let Some(digest) = digest {
                    let (_, seqs) = self.pending.remove(blob).unwrap_or_default();
                    self.contents.entry(digest.clone()).or_insert(seqs);
                }
            }
            Event::WorkspaceChanged { changes, .. } => {
                apply_changes(&mut self.files, changes);
                self.snapshots += 1;
            }
            Event::SessionDeleted { .. } => {
                self.files.clear();
                self.contents.clear();
                self.pending.clear();
                self.snapshots = 0;
            }
            _ => {}
        }
    }

    /// Whether the content of `digest` is recorded whole.
    pub fn has_content(&self, digest: &str) -> bool {
        self.contents.contains_key(digest)
    }
}

/// Applies a snapshot's changes to a set of files.
pub fn apply_changes(files: &mut Files, changes: &[FileChange]) {
    for change in changes {
        match &change.entry {
            Some(entry) => {
                files.insert(change.path.clone(), entry.clone());
            }
            None => {
                files.remove(&change.path);
            }
        }
    }
}

/// The changes that turn `from` into `to`, by path.
pub fn diff(from: &Files, to: &Files) -> Vec<FileChange> {
    let mut changes = Vec::new();
    for (path, entry) in to {
        let change = match from.get(path) {
            None => ChangeKind::Added,
            Some(before) if before != entry => ChangeKind::Modified,
            Some(_) => continue,
        };
        changes.push(FileChange {
            path: path.clone(),
            change,
            entry: Some(entry.clone()),
        });
    }
    for path in from.keys().filter(|path| !to.contains_key(*path)) {
        changes.push(FileChange {
            path: path.clone(),
            change: ChangeKind::Removed,
            entry: None,
        });
    }
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    changes
}

/// A point in a run at which its workspace can be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilesAt {
    /// When the run's turn began (after a continuation's rewind).
    RunStart,
    /// After this tool call completed (its snapshot, if it changed anything).
    ToolCall(String),
    /// When the run ended.
    RunEnd,
}

/// The files of a session's workspace at a point of one of its runs, folded from the
/// session's records (in order, from its first); `None` when the run's records do not
/// reach that point (an unknown tool call, a run not begun), or no snapshot had been
/// recorded by then (the files were not known).
pub fn files_at<R: Borrow<Recorded>>(
    records: impl IntoIterator<Item = R>,
    run_id: &RunId,
    at: &FilesAt,
) -> Option<Files> {
    let mut files = Files::new();
    let mut armed = false;
    let mut seen_run = false;
    let mut known = false;
    let reached = |files: Files, known: bool| known.then_some(files);
    for record in records {
        let event = &record.borrow().event;
        if let Event::SessionDeleted { .. } = event {
            files.clear();
            known = false;
            continue;
        }
        let ours = event.run_id() == Some(run_id);
        seen_run |= ours;
        match event {
            Event::WorkspaceChanged { point, changes, .. } => {
                let stop_before = match at {
                    FilesAt::RunStart => {
                        ours && !matches!(
                            point,
                            SnapshotPoint::Rewound { .. } | SnapshotPoint::TurnStart
                        )
                    }
                    FilesAt::ToolCall(id) => {
                        armed
                            && !matches!(point, SnapshotPoint::ToolCall { tool_call_id } if ours && tool_call_id == id)
                    }
                    FilesAt::RunEnd => false,
                };
                if stop_before {
                    return reached(files, known);
                }
                apply_changes(&mut files, changes);
                known = true;
                if armed {
                    return reached(files, known);
                }
            }
            Event::RunEventEmitted {
                event: RunEvent::ToolCallCompleted { tool },
                ..
            } if ours => {
                if armed {
                    return reached(files, known);
                }
                if let FilesAt::ToolCall(id) = at {
                    armed = &tool.tool_call_id == id;
                }
            }
            event if ours && event.is_terminal() => {
                return match at {
                    FilesAt::ToolCall(_) if !armed => None,
                    _ => reached(files, known),
                };
            }
            _ => {}
        }
    }
    match at {
        FilesAt::ToolCall(_) if !armed => None,
        _ if !seen_run => None,
        _ => reached(files, known),
    }
}

/// One change a run made, with the snapshot that recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunFileChange {
    /// The change.
    pub change: FileChange,
    /// When it was recorded.
    pub point: SnapshotPoint,
}

/// The changes a run recorded, in order (a continuation's rewind first).
pub fn run_changes<R: Borrow<Recorded>>(
    records: impl IntoIterator<Item = R>,
    run_id: &RunId,
) -> Vec<RunFileChange> {
    let mut found = Vec::new();
    for record in records {
        if let Event::WorkspaceChanged {
            run_id: of,
            point,
            changes,
        } = &record.borrow().event
            && of == run_id
        {
            found.extend(changes.iter().map(|change| RunFileChange {
                change: change.clone(),
                point: point.clone(),
            }));
        }
    }
    found
}
