//! A scan of a workspace against the index of its last snapshot: what was added,
//! modified and removed. Unchanged files are not read: a file whose size, modification
//! time and inode match the index keeps its digest, unless it changed so recently that
//! its time cannot be trusted (git's "racily clean" files, read again). Changed files
//! are read in 64 KiB pieces into their digest, never whole. Symlinks are recorded as
//! links (the digest of their target's text), never followed; sockets, devices and
//! FIFOs are skipped. Over a bound, a file is left out and named.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use super::ignore::Ignore;

/// A file's modification time newer than this before the scan is not trusted.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Bytes read at a time from a changed file.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A symbolic link (its digest is its target's text's).
    Symlink,
}

/// One path of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// File or link.
    pub kind: EntryKind,
    /// Bytes (a link: its target's text).
    pub size: u64,
    /// The owner may execute it.
    pub executable: bool,
    /// SHA-256 of the content (a link: of its target's text), lowercase hex.
    pub digest: String,
    /// Modification time, nanoseconds since the epoch, and inode: how a later scan
    /// knows the file unchanged without reading it.
    pub mtime_ns: i128,
    /// The inode.
    pub inode: u64,
    /// A link's target, as its text.
    pub target: Option<String>,
}

impl Entry {
    /// A path as the journal recorded it, with the times of the file on disk (`0, 0`:
    /// none known, so a scan reads it).
    pub fn of_recorded(
        recorded: &turnstile_journal::FileEntry,
        mtime_ns: i128,
        inode: u64,
    ) -> Entry {
        Entry {
            kind: match recorded.kind {
                turnstile_journal::FileKind::File => EntryKind::File,
                turnstile_journal::FileKind::Symlink => EntryKind::Symlink,
            },
            size: recorded.size,
            executable: recorded.executable,
            digest: recorded.digest.clone(),
            mtime_ns,
            inode,
            target: recorded.target.clone(),
        }
    }
}

/// A file's modification time, nanoseconds since the epoch.
pub(crate) fn mtime_ns(meta: &std::fs::Metadata) -> i128 {
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

/// A workspace's paths (relative, `/`-separated) as its last snapshot recorded them.
pub type Index = BTreeMap<String, Entry>;

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// New since the last snapshot.
    Added,
    /// Its content, kind or executable bit changed.
    Modified,
    /// Gone.
    Removed,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The path.
    pub path: String,
    /// How.
    pub kind: ChangeKind,
    /// What it is now (none when removed).
    pub entry: Option<Entry>,
}

/// The bounds of one snapshot (`workspace_max_*`) and the ignore rules.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// All files of a snapshot together, in bytes.
    pub max_bytes: u64,
    /// One file, in bytes.
    pub max_file_bytes: u64,
    /// Paths in a snapshot.
    pub max_files: usize,
    /// Paths neither captured nor removed.
    pub ignore: Ignore,
}

/// What a scan found.
#[derive(Debug, Default)]
pub struct Scan {
    /// The workspace now (a left-out path keeps its earlier entry, if it had one).
    pub index: Index,
    /// The changes against the earlier index, by path.
    pub changes: Vec<Change>,
    /// Paths over a bound, with the bound's name.
    pub left_out: Vec<(String, &'static str)>,
    /// Files whose content was read (the cost beyond the directory walk).
    pub files_read: usize,
}

/// Scans `root` against `previous` (see the module doc). A missing `root` is an empty
/// workspace.
pub fn scan(root: &Path, previous: &Index, bounds: &Bounds) -> std::io::Result<Scan> {
    let started = SystemTime::now();
    let mut walk = Walk {
        previous,
        bounds,
        trusted_before: nanos(started.checked_sub(RACY_WINDOW).unwrap_or(UNIX_EPOCH)),
        found: Scan::default(),
        bytes: 0,
        kept: 0,
        recurse: true,
    };
    if root.is_dir() {
        walk.directory(root, "")?;
    }
    let kept = walk.kept;
    let mut found = walk.found;
    // Every earlier path still here: nothing was removed, and nothing to look up.
    if kept < previous.len() {
        for path in previous.keys() {
            if !found.index.contains_key(path) {
                found.changes.push(Change {
                    path: path.clone(),
                    kind: ChangeKind::Removed,
                    entry: None,
                });
            }
        }
    }
    found.changes.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// Scans only the directories named in `dirty` (relative, `""` for the root; each
/// without its subdirectories, which are named themselves when they changed) against
/// `index`, and updates `index` in place. The changes are those of the paths directly
/// in those directories. `None` (and `index` unchanged) when the workspace would then
/// be over `max_files` or `max_bytes`: a whole scan decides what a bound leaves out.
pub fn scan_dirs(
    root: &Path,
    index: &mut Index,
    bounds: &Bounds,
    dirty: &std::collections::BTreeSet<String>,
) -> std::io::Result<Option<Scan>> {
    let started = SystemTime::now();
    let mut walk = Walk {
        previous: index,
        bounds,
        trusted_before: nanos(started.checked_sub(RACY_WINDOW).unwrap_or(UNIX_EPOCH)),
        found: Scan::default(),
        bytes: 0,
        kept: 0,
        recurse: false,
    };
    for dir in dirty {
        let full = if dir.is_empty() {
            root.to_path_buf()
        } else {
            root.join(dir)
        };
        // A directory gone (or no longer one) has no paths now.
        if std::fs::symlink_metadata(&full).is_ok_and(|meta| meta.is_dir()) {
            match walk.directory(&full, dir) {
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
    }
    let mut found = walk.found;
    let mut removed = Vec::new();
    for dir in dirty {
        for path in children(index, dir) {
            if !found.index.contains_key(&path) {
                removed.push(path);
            }
        }
    }
    let mut total: u64 = index.values().map(|entry| entry.size).sum();
    let mut files = index.len();
    for path in &removed {
        total -= index[path].size;
        files -= 1;
    }
    for (path, entry) in &found.index {
        match index.get(path) {
            Some(before) => total = total - before.size + entry.size,
            None => {
                files += 1;
                total += entry.size;
            }
        }
    }
    if files > bounds.max_files || total > bounds.max_bytes {
        return Ok(None);
    }
    for path in removed {
        index.remove(&path);
        found.changes.push(Change {
            path,
            kind: ChangeKind::Removed,
            entry: None,
        });
    }
    index.extend(std::mem::take(&mut found.index));
    found.changes.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Some(found))
}

/// The paths of `index` directly in `dir` (`""`: the root).
fn children(index: &Index, dir: &str) -> Vec<String> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    index
        .range(prefix.clone()..)
        .map(|(path, _)| path)
        .take_while(|path| path.starts_with(&prefix))
        .filter(|path| !path[prefix.len()..].contains('/'))
        .cloned()
        .collect()
}

/// A change a restore would have to make: content, kind or executable bit.
fn differs(before: &Entry, now: &Entry) -> bool {
    before.kind != now.kind || before.digest != now.digest || before.executable != now.executable
}

fn nanos(time: SystemTime) -> i128 {
    time.duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as i128)
        .unwrap_or(0)
}

struct Walk<'a> {
    previous: &'a Index,
    bounds: &'a Bounds,
    /// Modification times before this (ns) are trusted.
    trusted_before: i128,
    found: Scan,
    bytes: u64,
    /// Earlier paths found again.
    kept: usize,
    /// Into subdirectories (a whole scan), or one directory's own paths.
    recurse: bool,
}

impl Walk<'_> {
    fn directory(&mut self, dir: &Path, prefix: &str) -> std::io::Result<()> {
        let mut entries: Vec<(String, std::fs::DirEntry)> = std::fs::read_dir(dir)?
            .map(|entry| {
                entry.map(|entry| (entry.file_name().to_string_lossy().into_owned(), entry))
            })
            .collect::<Result<_, _>>()?;
        // By name, so that which file a bound leaves out does not depend on the disk.
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (name, entry) in entries {
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            // Never followed: the entry's own type and times (an `fstatat` on the open
            // directory, cheaper than a whole path's lookup). One gone since the listing
            // is not there.
            let meta = match entry.metadata() {
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                meta => meta?,
            };
            let kind = meta.file_type();
            if kind.is_dir() {
                if self.recurse && !self.bounds.ignore.ignored(&path, true) {
                    self.directory(&entry.path(), &path)?;
                }
            } else if (kind.is_file() || kind.is_symlink())
                && !self.bounds.ignore.ignored(&path, false)
            {
                match self.file(&entry.path(), path, &meta) {
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                    other => other?,
                }
            }
        }
        Ok(())
    }

    fn file(&mut self, full: &Path, path: String, meta: &std::fs::Metadata) -> std::io::Result<()> {
        let symlink = meta.file_type().is_symlink();
        let target = match symlink {
            true => Some(std::fs::read_link(full)?.to_string_lossy().into_owned()),
            false => None,
        };
        let size = match &target {
            Some(target) => target.len() as u64,
            None => meta.len(),
        };
        let over = if !symlink && size > self.bounds.max_file_bytes {
            Some("workspace_max_file_bytes")
        } else if self.found.index.len() >= self.bounds.max_files {
            Some("workspace_max_files")
        } else if self.bytes + size > self.bounds.max_bytes {
            Some("workspace_max_bytes")
        } else {
            None
        };
        let before = self.previous.get(&path);
        if let Some(bound) = over {
            // Left out, not removed: a restore keeps what it had.
            if let Some(before) = before {
                self.kept += 1;
                self.found.index.insert(path.clone(), before.clone());
            }
            self.found.left_out.push((path, bound));
            return Ok(());
        }
        self.bytes += size;
        let mtime_ns = mtime_ns(meta);
        let kind = if symlink {
            EntryKind::Symlink
        } else {
            EntryKind::File
        };
        let executable = !symlink && meta.permissions().mode() & 0o100 != 0;
        let known = before.filter(|before| {
            before.kind == kind
                && before.size == size
                && before.mtime_ns == mtime_ns
                && before.inode == meta.ino()
                && mtime_ns < self.trusted_before
        });
        let digest = match known {
            Some(before) => before.digest.clone(),
            None => {
                self.found.files_read += 1;
                match &target {
                    Some(target) => crate::uploads::sha256_hex(target.as_bytes()),
                    None => digest_of(full)?,
                }
            }
        };
        let entry = Entry {
            kind,
            size,
            executable,
            digest,
            mtime_ns,
            inode: meta.ino(),
            target,
        };
        let change = match before {
            None => Some(ChangeKind::Added),
            Some(before) => {
                self.kept += 1;
                differs(before, &entry).then_some(ChangeKind::Modified)
            }
        };
        if let Some(kind) = change {
            self.found.changes.push(Change {
                path: path.clone(),
                kind,
                entry: Some(entry.clone()),
            });
        }
        self.found.index.insert(path, entry);
        Ok(())
    }
}

/// The SHA-256 of a file, read a piece at a time.
pub fn digest_of(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(crate::uploads::lower_hex(&hasher.finalize()))
}
