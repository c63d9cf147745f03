//! Pure folds from journal events to the views clients read.
//!
//! A view is a function of the events alone: the same records always fold to the same
//! view, so every view can be rebuilt from the journal at any time, and the live copy
//! a session actor keeps is the same fold applied one record at a time.
//! Nothing here does I/O, waits, or knows about actors or HTTP.

pub mod rebuild;
mod session;

pub use session::{
    AttachmentView, Checkpoint, DayCounts, ForkPoint, ModelDetails, ModelTotals, RunHead,
    RunStatus, RunView, SessionMetrics, SessionState, SessionView, StoredRun, StoredRunHead,
    StoredSession, TOKEN_KEYS, ToolView, Transcripts, date_of_us,
};
