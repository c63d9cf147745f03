//! Which directories of a workspace changed, told by the kernel (inotify) instead of
//! found by a walk: every directory of the workspace is watched (ignored ones left
//! out), a directory created or moved in is watched as it appears (and counted changed
//! whole, since files may have been written in it before its watch), one removed or
//! moved out is forgotten. A snapshot then lists only the changed directories: the cost
//! of what changed, not of the workspace. When the kernel's queue overflowed, or a watch
//! could not be added (the user's `fs.inotify` limits), the next look says "all" and
//! the snapshot walks the whole workspace, as without a watch.

use std::collections::{BTreeSet, HashMap};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use super::ignore::Ignore;

/// What changed since the last look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dirty {
    /// Not known: walk everything.
    All,
    /// These directories' own paths (relative, `""` for the root).
    Dirs(BTreeSet<String>),
}

/// A workspace's watches.
pub struct Watch {
    fd: OwnedFd,
    root: PathBuf,
    ignore: Ignore,
    /// Watch descriptor → directory.
    dirs: HashMap<i32, String>,
    dirty: BTreeSet<String>,
    /// Something was missed: the next look is `All`.
    lost: bool,
}

const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::DONT_FOLLOW);

impl Watch {
    /// Watches every directory under `root` (which must exist).
    pub fn start(root: &Path, ignore: &Ignore) -> std::io::Result<Watch> {
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?;
        let mut watch = Watch {
            fd,
            root: root.to_path_buf(),
            ignore: ignore.clone(),
            dirs: HashMap::new(),
            dirty: BTreeSet::new(),
            lost: false,
        };
        watch.add_tree("");
        // What the first look reports is what changed from now on.
        watch.dirty.clear();
        if watch.lost {
            return Err(std::io::Error::other(
                "the workspace could not be watched whole",
            ));
        }
        Ok(watch)
    }

    /// What changed since the last look (and forgets it).
    pub fn take(&mut self) -> Dirty {
        self.drain();
        let dirty = std::mem::take(&mut self.dirty);
        if std::mem::take(&mut self.lost) {
            Dirty::All
        } else {
            Dirty::Dirs(dirty)
        }
    }

    /// Watches `dir` and every directory under it, each counted changed.
    fn add_tree(&mut self, dir: &str) {
        let full = if dir.is_empty() {
            self.root.clone()
        } else {
            self.root.join(dir)
        };
        match inotify::add_watch(&self.fd, &full, MASK) {
            Ok(wd) => {
                self.dirs.insert(wd, dir.to_owned());
            }
            // Gone already: its parent's listing says so.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return,
            Err(_) => {
                self.lost = true;
                return;
            }
        }
        self.dirty.insert(dir.to_owned());
        let Ok(entries) = std::fs::read_dir(&full) else {
            return;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = join(dir, &name);
            if !self.ignore.ignored(&path, true) {
                self.add_tree(&path);
            }
        }
    }

    /// Forgets the watches of `dir` and every directory under it, each counted changed
    /// (its paths are gone from there).
    fn forget_tree(&mut self, dir: &str) {
        let prefix = format!("{dir}/");
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, path)| *path == dir || path.starts_with(&prefix))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            if let Some(path) = self.dirs.remove(&wd) {
                self.dirty.insert(path);
            }
            let _ = inotify::remove_watch(&self.fd, wd);
        }
    }

    /// Reads every event waiting.
    fn drain(&mut self) {
        let mut buffer = [MaybeUninit::<u8>::uninit(); 16 * 1024];
        let mut found: Vec<(i32, ReadFlags, Option<String>)> = Vec::new();
        {
            let mut reader = inotify::Reader::new(&self.fd, &mut buffer);
            loop {
                match reader.next() {
                    Ok(event) => found.push((
                        event.wd(),
                        event.events(),
                        event
                            .file_name()
                            .map(|name| name.to_string_lossy().into_owned()),
                    )),
                    Err(rustix::io::Errno::AGAIN) => break,
                    Err(_) => {
                        self.lost = true;
                        break;
                    }
                }
            }
        }
        for (wd, flags, name) in found {
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                self.lost = true;
                continue;
            }
            let Some(dir) = self.dirs.get(&wd).cloned() else {
                continue;
            };
            if flags.contains(ReadFlags::IGNORED) {
                self.dirs.remove(&wd);
                if dir.is_empty() {
                    // The workspace itself is gone.
                    self.lost = true;
                }
                continue;
            }
            self.dirty.insert(dir.clone());
            let (Some(name), true) = (name, flags.contains(ReadFlags::ISDIR)) else {
                continue;
            };
            let child = join(&dir, &name);
            if flags.intersects(ReadFlags::DELETE | ReadFlags::MOVED_FROM) {
                self.forget_tree(&child);
            }
            if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO)
                && !self.ignore.ignored(&child, true)
            {
                self.add_tree(&child);
            }
        }
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}
