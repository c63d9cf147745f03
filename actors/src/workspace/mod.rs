//! A session's workspace as files (`spec/workspaces.md`): which paths count (`ignore`)
//! and what changed since the last snapshot (`scan`), at the cost of the changed files
//! only. Building blocks: snapshots in the journal, restores and the files routes come
//! next (issue 29); a session's directory itself is `AgentSpec::workdir`.

pub mod ignore;
pub mod scan;

pub use ignore::{DEFAULT_IGNORE, Ignore};
pub use scan::{Bounds, Change, ChangeKind, Entry, EntryKind, Index, Scan, digest_of, scan};
