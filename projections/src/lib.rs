//! Pure folds from journal events to the views clients read.
//!
//! A view is a function of the events alone: the same records always fold to the same
//! view, so every view can be rebuilt from the journal at any time, and the live copy
//! a session actor keeps is the same fold applied one record at a time.
//! The folds do no I/O, wait for nothing, and know nothing of actors or HTTP; only
//! `rebuild` reads a journal, to fold every session again and compare.

mod metrics;
pub mod rebuild;
mod session;
mod stored;
mod transcripts;
mod views;
pub mod workspace;

pub use metrics::{DayCounts, ModelDetails, ModelTotals, SessionMetrics};
pub use session::SessionState;
pub use stored::{RunHead, StoredRun, StoredRunHead, StoredSession};
pub use transcripts::Transcripts;
pub use turnstile_journal::ForkPoint;
pub use views::{
    AttachmentView, Checkpoint, DecidedCall, RunStatus, RunView, SessionView, ToolView, date_of_us,
};
pub use workspace::{Files, FilesAt, WorkspaceState};
