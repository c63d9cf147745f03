//! What a workspace snapshot records of each path (`spec/workspaces.md`): the typed
//! parts of [`crate::Event::WorkspaceChanged`]. A path is relative to the session's
//! workspace, `/`-separated, never absolute and never with a `..` component.

use serde::{Deserialize, Serialize};

use crate::ids::RunId;

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A symbolic link (recorded as its target's text, never followed).
    Symlink,
}

/// A path as a snapshot recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File or link.
    pub kind: FileKind,
    /// The owner may execute it.
    pub executable: bool,
    /// Bytes (a link: its target's text).
    pub size: u64,
    /// SHA-256 of the content (a link: of its target's text), lowercase hex.
    pub digest: String,
    /// A link's target, as its text.
    pub target: Option<String>,
}

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    /// New.
    Added,
    /// Its content, kind or executable bit changed.
    Modified,
    /// Gone.
    Removed,
}

impl ChangeKind {
    /// The word the files route and the timeline use.
    pub fn word(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Modified => "modified",
            ChangeKind::Removed => "removed",
        }
    }
}

/// One path's change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// The path.
    pub path: String,
    /// How it changed.
    pub change: ChangeKind,
    /// What it is now (`None` when removed).
    pub entry: Option<FileEntry>,
}

/// When a snapshot was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotPoint {
    /// After this tool call completed (a checkpoint).
    ToolCall {
        /// The call.
        tool_call_id: String,
    },
    /// At the end of an attempt of the turn.
    TurnEnd,
    /// A continuation put the workspace back as it was at its checkpoint.
    Rewound {
        /// The run continued from.
        from_run_id: RunId,
        /// The checkpoint's tool call (`None`: the start of that run).
        tool_call_id: Option<String>,
    },
    /// Before the session's first recorded turn: the files put in its directory before
    /// it (a first snapshot, so that they are the session's from its start).
    TurnStart,
}

/// Whether `path` is one a snapshot may record: relative, `/`-separated, no empty,
/// `.` or `..` component, no NUL.
pub fn is_confined(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}
