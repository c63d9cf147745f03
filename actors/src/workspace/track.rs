//! A session's workspace as its actor keeps it between turns: the journal's fold of it
//! ([`WorkspaceState`], stored as `workspace/<session_id>` and read back from there plus
//! the records after) and, once this process has scanned or restored the directory,
//! the directory's index, so that a scan reads only what changed since. It is handed
//! to each run task and back; a run whose append failed drops it, and the next turn
//! reads it again from the journal (crash-only, like the session's state).

use std::path::PathBuf;

use turnstile_journal::{
    ChangeKind as JournalChange, FileChange, FileEntry, FileKind, Journal, Seq, SessionId,
};
use turnstile_projections::{Files, WorkspaceState};

use super::restore::{Contents, Restored, restore};
use super::scan::{Bounds, ChangeKind, Entry, EntryKind, Index, Scan, scan, scan_dirs};
use super::watch::{Dirty, Watch};

/// Records after the stored form, at most, before a run's end stores it again even
/// though the workspace did not change (so reading it back stays a bounded read).
const STORED_LAG_RECORDS: u64 = 1024;

fn key(session_id: &SessionId) -> String {
    format!("workspace/{session_id}")
}

/// One session's workspace (see the module doc).
pub(crate) struct Tracker {
    pub session_id: SessionId,
    pub root: PathBuf,
    pub bounds: Bounds,
    pub state: WorkspaceState,
    /// The directory as this process last scanned or restored it, matching `state.files`
    /// (`None`: not yet; the next scan reads every file).
    pub local: Option<Index>,
    /// `state.next_seq` of the stored form.
    stored_seq: u64,
    /// The kernel's word on which directories changed (`None`: not watched; each look
    /// walks the whole directory).
    watch: Option<Watch>,
    /// The workspace's fold changed since it was stored.
    pub dirty: bool,
}

/// What a scan found, as the journal will record it.
pub(crate) struct Plan {
    /// The changes against the journal's files.
    pub changes: Vec<FileChange>,
    /// The directory now.
    pub index: Index,
    /// Paths over a bound, with the bound.
    pub left_out: Vec<(String, String)>,
}

/// A session's workspace fold: its stored form and the records after it.
pub fn load_state(journal: &Journal, session_id: &SessionId) -> Result<WorkspaceState, String> {
    read_state(journal, session_id).map(|(state, _)| state)
}

/// [`load_state`], with the sequence its stored form was as of.
fn read_state(journal: &Journal, session_id: &SessionId) -> Result<(WorkspaceState, u64), String> {
    let stored: Option<WorkspaceState> = journal
        .get_projection(&key(session_id))
        .map_err(|error| error.to_string())?
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .filter(|state: &WorkspaceState| &state.session_id == session_id);
    let mut state = stored.unwrap_or_else(|| WorkspaceState::new(session_id.clone()));
    let stored_seq = state.next_seq;
    for record in journal.read_session(session_id, Seq(state.next_seq)) {
        state.apply(&record.map_err(|error| error.to_string())?);
    }
    Ok((state, stored_seq))
}

impl Tracker {
    /// Reads a session's workspace from its stored form and the records after it.
    pub(crate) fn load(
        journal: &Journal,
        session_id: &SessionId,
        root: PathBuf,
        bounds: Bounds,
    ) -> Result<Tracker, String> {
        let (state, stored_seq) = read_state(journal, session_id)?;
        Ok(Tracker {
            session_id: session_id.clone(),
            root,
            bounds,
            dirty: state.next_seq > stored_seq,
            stored_seq,
            state,
            local: None,
            watch: None,
        })
    }

    /// Stores the fold as of `next_seq` (the session's next sequence: every record
    /// before it that touches the workspace is folded in, since only run tasks holding
    /// this tracker write them), when it changed or lags too far.
    pub(crate) fn store(&mut self, journal: &Journal, next_seq: u64) {
        if !self.dirty && next_seq.saturating_sub(self.stored_seq) < STORED_LAG_RECORDS {
            return;
        }
        self.state.next_seq = self.state.next_seq.max(next_seq);
        let written = serde_json::to_vec(&self.state)
            .map_err(|error| error.to_string())
            .and_then(|bytes| {
                journal
                    .put_projection(&key(&self.session_id), &bytes)
                    .map_err(|error| error.to_string())
            });
        match written {
            Ok(()) => {
                self.stored_seq = self.state.next_seq;
                self.dirty = false;
            }
            Err(error) => {
                tracing::warn!(session_id = %self.session_id, %error, "stored workspace not updated")
            }
        }
    }

    /// Makes the directory hold `target` (default: the journal's files now).
    pub(crate) fn restore(
        &mut self,
        journal: &Journal,
        target: Option<&Files>,
    ) -> Result<Restored, String> {
        let found = self.look().map_err(|error| error.to_string())?;
        let contents = Contents {
            journal,
            session_id: &self.session_id,
            state: &self.state,
        };
        let target = target.unwrap_or(&self.state.files);
        let (index, restored) = restore(&self.root, target, found, &contents)?;
        self.local = Some(index);
        Ok(restored)
    }

    /// The directory now, against what this process last saw of it (or, the first
    /// time, against what the journal recorded): with a watch, only the directories
    /// the kernel said changed are listed. The index it holds is taken (given back
    /// with the snapshot that uses it; lost on a failure, and then the next look walks
    /// everything).
    fn look(&mut self) -> std::io::Result<Scan> {
        if let (Some(mut local), Some(watch)) = (self.local.take(), self.watch.as_mut()) {
            if let Dirty::Dirs(dirty) = watch.take()
                && let Some(mut found) = scan_dirs(&self.root, &mut local, &self.bounds, &dirty)?
            {
                found.index = local;
                return Ok(found);
            }
            return scan(&self.root, &local, &self.bounds);
        }
        let previous = self
            .local
            .take()
            .unwrap_or_else(|| index_of(&self.state.files));
        // Watched before the walk: a change during it is seen by the next look (what
        // a watch had seen before is in the walk).
        if let Some(watch) = self.watch.as_mut() {
            watch.take();
        }
        if self.watch.is_none() && self.root.is_dir() {
            self.watch = Watch::start(&self.root, &self.bounds.ignore)
                .inspect_err(|error| {
                    tracing::debug!(root = %self.root.display(), %error, "workspace not watched; each snapshot walks it");
                })
                .ok();
        }
        scan(&self.root, &previous, &self.bounds)
    }

    /// Scans the directory against what the journal recorded.
    pub(crate) fn plan(&mut self) -> std::io::Result<Plan> {
        let found = self.look()?;
        let changes = found
            .changes
            .into_iter()
            .map(|change| FileChange {
                path: change.path,
                change: match change.kind {
                    ChangeKind::Added => JournalChange::Added,
                    ChangeKind::Modified => JournalChange::Modified,
                    ChangeKind::Removed => JournalChange::Removed,
                },
                entry: change.entry.as_ref().map(file_entry),
            })
            .collect();
        Ok(Plan {
            changes,
            index: found.index,
            left_out: found
                .left_out
                .into_iter()
                .map(|(path, bound)| (path, bound.to_owned()))
                .collect(),
        })
    }
}

/// A scanned entry as the journal records it.
pub(crate) fn file_entry(entry: &Entry) -> FileEntry {
    FileEntry {
        kind: match entry.kind {
            EntryKind::File => FileKind::File,
            EntryKind::Symlink => FileKind::Symlink,
        },
        executable: entry.executable,
        size: entry.size,
        digest: entry.digest.clone(),
        target: entry.target.clone(),
    }
}

/// An index of the journal's files with no times: a scan against it reads every file.
fn index_of(files: &Files) -> Index {
    files
        .iter()
        .map(|(path, entry)| (path.clone(), Entry::of_recorded(entry, 0, 0)))
        .collect()
}
