//! Putting a workspace directory back as the journal recorded it: files the record has
//! written from their journaled content (streamed a piece at a time, checked against
//! their digest), files it lacks removed, ignored and over-bound paths untouched.
//! Never outside the workspace: a recorded path must be confined, every directory on
//! the way is a real directory (a symlink or file in the way is removed, never
//! followed), a file is written beside its target and renamed over it (which replaces a
//! link, never writes through it), and a link is made as a link whatever its target.

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use turnstile_journal::{Event, FileEntry, FileKind, Journal, Seq, SessionId};
use turnstile_projections::{Files, WorkspaceState};

use super::scan::{Entry, EntryKind, Index, Scan, mtime_ns};

/// Where a restore reads contents from: the session's journal and its workspace's fold.
pub(crate) struct Contents<'a> {
    pub journal: &'a Journal,
    pub session_id: &'a SessionId,
    pub state: &'a WorkspaceState,
}

impl Contents<'_> {
    /// Streams the content of `digest` into `out`, checking it hashes to the digest.
    fn copy_to(&self, digest: &str, out: &mut fs::File) -> Result<(), String> {
        let seqs = self
            .state
            .contents
            .get(digest)
            .ok_or_else(|| format!("the content {digest} is not in the journal"))?;
        let mut hasher = Sha256::new();
        for seq in seqs {
            let record = self
                .journal
                .read_session(self.session_id, Seq(*seq))
                .next()
                .ok_or_else(|| format!("record {seq} of the session is missing"))?
                .map_err(|error| error.to_string())?;
            let Event::WorkspaceContent { bytes, .. } = &record.event else {
                return Err(format!(
                    "record {seq} of the session is not a workspace content"
                ));
            };
            hasher.update(bytes);
            out.write_all(bytes).map_err(|error| error.to_string())?;
        }
        let actual = crate::uploads::lower_hex(&hasher.finalize());
        if actual != digest {
            return Err(format!(
                "the journaled content {digest} hashes to {actual}: run `turnstile journal verify`"
            ));
        }
        Ok(())
    }
}

/// What a restore did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Paths written (files and links).
    pub written: usize,
    /// Paths removed.
    pub removed: usize,
}

/// Makes `root` hold exactly `target` (see the module doc), from `found`, what a scan
/// found there just before. Returns the directory's index afterwards.
pub(crate) fn restore(
    root: &Path,
    target: &Files,
    found: Scan,
    contents: &Contents<'_>,
) -> Result<(Index, Restored), String> {
    let meta = fs::symlink_metadata(root);
    match meta {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(format!("{} is not a directory", root.display())),
        Err(_) => fs::create_dir_all(root).map_err(|error| error.to_string())?,
    }
    let left_out: HashSet<String> = found.left_out.into_iter().map(|(path, _)| path).collect();
    let mut index = found.index;
    let mut done = Restored::default();
    let extra: Vec<String> = index
        .keys()
        .filter(|path| !target.contains_key(*path) && !left_out.contains(path.as_str()))
        .cloned()
        .collect();
    for path in extra {
        remove(&root.join(&path)).map_err(|error| format!("cannot remove {path}: {error}"))?;
        index.remove(&path);
        done.removed += 1;
    }
    for (path, want) in target {
        if left_out.contains(path.as_str()) || index.get(path).is_some_and(|have| same(have, want))
        {
            continue;
        }
        if !turnstile_journal::files::is_confined(path) {
            return Err(format!(
                "the journal names {path:?}, a path outside the workspace"
            ));
        }
        let full =
            prepare(root, path).map_err(|error| format!("cannot restore {path}: {error}"))?;
        match (&want.kind, &want.target) {
            (FileKind::Symlink, Some(link)) => std::os::unix::fs::symlink(link, &full)
                .map_err(|error| format!("cannot restore the link {path}: {error}"))?,
            _ => write_file(&full, want, contents)
                .map_err(|error| format!("cannot restore {path}: {error}"))?,
        }
        let meta = fs::symlink_metadata(&full).map_err(|error| error.to_string())?;
        index.insert(
            path.clone(),
            Entry::of_recorded(want, mtime_ns(&meta), meta.ino()),
        );
        done.written += 1;
    }
    Ok((index, done))
}

/// Whether a file on disk is what the journal recorded.
pub(crate) fn same(have: &Entry, want: &FileEntry) -> bool {
    have.digest == want.digest
        && have.executable == want.executable
        && (have.kind == EntryKind::Symlink) == (want.kind == FileKind::Symlink)
}

/// Removes a path whatever it is (a directory with what is in it), never following a link.
fn remove(full: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(full) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(full),
        Ok(_) => fs::remove_file(full),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// Makes every directory on the way to `path` a real directory and frees its place:
/// returns where it goes.
fn prepare(root: &Path, path: &str) -> std::io::Result<PathBuf> {
    let mut at = root.to_path_buf();
    let mut parts = path.split('/').peekable();
    while let Some(part) = parts.next() {
        at.push(part);
        let last = parts.peek().is_none();
        let meta = fs::symlink_metadata(&at);
        if last {
            if meta.is_ok() {
                remove(&at)?;
            }
        } else {
            match meta {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    fs::remove_file(&at)?;
                    fs::create_dir(&at)?;
                }
                Err(_) => fs::create_dir(&at)?,
            }
        }
    }
    Ok(at)
}

/// Writes a file beside its place, then renames it there.
fn write_file(full: &Path, want: &FileEntry, contents: &Contents<'_>) -> Result<(), String> {
    let name = full
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = full.with_file_name(format!(".{name}.turnstile-{}", uuid::Uuid::now_v7()));
    let mode = if want.executable { 0o755 } else { 0o644 };
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)
        .map_err(|error| error.to_string())?;
    let written = contents
        .copy_to(&want.digest, &mut out)
        .and_then(|()| fs::rename(&temporary, full).map_err(|error| error.to_string()));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written
}
