//! A session's workspace as files (`spec/workspaces.md`): which paths count (`ignore`),
//! what changed since the last snapshot (`scan`, at the cost of the changed files
//! only), reading a changed file into the journal (`capture`), putting a directory back
//! as the journal has it (`restore`), which directories changed, told by the kernel
//! (`watch`), and a session's workspace between turns (`track`). A run's snapshots are taken by its task (`run/snapshot.rs`); a session's
//! directory itself is `AgentSpec::workdir`.

pub(crate) mod capture;
pub mod ignore;
pub(crate) mod restore;
pub mod scan;
mod track;
pub mod watch;

pub use ignore::{DEFAULT_IGNORE, Ignore};
pub use restore::Restored;
pub use scan::{
    Bounds, Change, ChangeKind, Entry, EntryKind, Index, Scan, digest_of, scan, scan_dirs,
};
pub use track::load_state;
pub(crate) use track::{Plan, Tracker};
