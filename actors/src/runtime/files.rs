//! The reads of a session's workspace (`spec/workspaces.md`, "Reading them"): what a run
//! changed, and a file's content at a point of a run, streamed from the journal a piece
//! at a time. Both fold the session's records from its first (an audit's read, not a
//! turn's).

use turnstile_journal::{Event, FileEntry, FileKind, Seq};
use turnstile_projections::workspace::{RunFileChange, run_changes};
use turnstile_projections::{FilesAt, RunView};

use crate::Runtime;
use crate::api::RuntimeError;

/// A file as a snapshot recorded it, with its content to read.
pub struct FileContent {
    /// What it is (a link's content is its target's text).
    pub entry: FileEntry,
    /// The content, a piece at a time, read from the journal as it is consumed.
    pub pieces: Box<dyn Iterator<Item = Result<Vec<u8>, RuntimeError>> + Send>,
}

impl Runtime {
    /// The changes a run recorded in its session's workspace, in order.
    pub fn run_files(&self, run: &RunView) -> Result<Vec<RunFileChange>, RuntimeError> {
        let mut failure = None;
        let records = self
            .journal()
            .read_session(&run.session_id, Seq(run.queued_seq.0))
            .map_while(|record| record.map_err(|error| failure = Some(error)).ok());
        let changes = run_changes(records, &run.run_id);
        match failure {
            Some(error) => Err(error.into()),
            None => Ok(changes),
        }
    }

    /// A file of a run's session's workspace as it was at `at`; `Ok(None)` when the
    /// file did not exist then, or the run has no such point.
    pub fn run_file(
        &self,
        run: &RunView,
        path: &str,
        at: &FilesAt,
    ) -> Result<Option<FileContent>, RuntimeError> {
        let journal = self.journal().clone();
        let files = crate::run::files_at(&journal, &run.session_id, &run.run_id, at)
            .map_err(|error| RuntimeError::Journal(turnstile_journal::Error::Unavailable(error)))?;
        let Some(files) = files else {
            return Ok(None);
        };
        let Some(entry) = files.get(path).cloned() else {
            return Ok(None);
        };
        if entry.kind == FileKind::Symlink {
            let target = entry.target.clone().unwrap_or_default().into_bytes();
            return Ok(Some(FileContent {
                entry,
                pieces: Box::new(std::iter::once(Ok(target))),
            }));
        }
        let state = crate::workspace::load_state(&journal, &run.session_id)
            .map_err(|error| RuntimeError::Journal(turnstile_journal::Error::Unavailable(error)))?;
        let Some(seqs) = state.contents.get(&entry.digest).cloned() else {
            return Ok(None);
        };
        let session_id = run.session_id.clone();
        let pieces = seqs.into_iter().map(move |seq| {
            let record = journal
                .read_session(&session_id, Seq(seq))
                .next()
                .transpose()?;
            match record.map(|record| record.event) {
                Some(Event::WorkspaceContent { bytes, .. }) => Ok(bytes),
                _ => Err(RuntimeError::Journal(
                    turnstile_journal::Error::Unavailable(format!(
                        "record {seq} of session {session_id} is not a workspace content"
                    )),
                )),
            }
        });
        Ok(Some(FileContent {
            entry,
            pieces: Box::new(pieces),
        }))
    }
}
