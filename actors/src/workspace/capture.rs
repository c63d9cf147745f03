//! Reading a changed file into the journal: pieces of at most [`PIECE_BYTES`], read a
//! group at a time so that a large file is never whole in memory, each piece a
//! `WorkspaceContent` record of one blob, the last naming the digest of all the bytes
//! read. The file is opened without following a link (a file swapped for a link since
//! the scan is refused, never read through); what is read is what is recorded, even if
//! the file changed since the scan hashed it (the snapshot then names the new digest).

use std::fs::{File, OpenOptions};
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};
use turnstile_journal::{Event, RunId};

/// Bytes of one `WorkspaceContent` record at most: well under the size at which a
/// record is stored apart, so contents stay in the journal's segments.
pub const PIECE_BYTES: usize = 512 * 1024;

/// One file being read into the journal.
pub(crate) struct Capture {
    file: File,
    run_id: RunId,
    blob: String,
    offset: u64,
    /// Bytes it may have: a file grown past the bound since the scan is left out.
    max_bytes: u64,
    hasher: Sha256,
}

/// A capture's last group: the content's digest and size.
pub(crate) struct Captured {
    pub digest: String,
    pub size: u64,
}

impl Capture {
    /// Opens `full` (never through a link at its last component).
    pub(crate) fn open(full: &Path, run_id: RunId, max_bytes: u64) -> std::io::Result<Capture> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(full)?;
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        Ok(Capture {
            file,
            run_id,
            blob: uuid::Uuid::now_v7().to_string(),
            offset: 0,
            max_bytes,
            hasher: Sha256::new(),
        })
    }

    /// Reads pieces until about `group_bytes` are read or the file ends: their records,
    /// and at the end the content's digest and size. An error leaves the capture
    /// unfinished (its pieces are orphans a later fold ignores).
    pub(crate) fn next_group(
        &mut self,
        group_bytes: usize,
    ) -> std::io::Result<(Vec<Event>, Option<Captured>)> {
        let mut events = Vec::new();
        let mut read_now = 0usize;
        loop {
            let mut piece = vec![0u8; PIECE_BYTES];
            let mut filled = 0;
            while filled < PIECE_BYTES {
                match self.file.read(&mut piece[filled..])? {
                    0 => break,
                    read => filled += read,
                }
            }
            piece.truncate(filled);
            let offset = self.offset;
            self.offset += filled as u64;
            if self.offset > self.max_bytes {
                return Err(std::io::Error::other(
                    "the file grew past workspace_max_file_bytes",
                ));
            }
            self.hasher.update(&piece);
            read_now += filled;
            let end = filled < PIECE_BYTES;
            let digest = end
                .then(|| crate::uploads::lower_hex(&std::mem::take(&mut self.hasher).finalize()));
            events.push(Event::WorkspaceContent {
                run_id: self.run_id.clone(),
                blob: self.blob.clone(),
                offset,
                bytes: piece,
                digest: digest.clone(),
            });
            if let Some(digest) = digest {
                return Ok((
                    events,
                    Some(Captured {
                        digest,
                        size: self.offset,
                    }),
                ));
            }
            if read_now >= group_bytes {
                return Ok((events, None));
            }
        }
    }
}

/// The files one snapshot reads, in order: groups of pieces across files, so that many
/// small files cost one blocking call and one append per group, not one per file.
pub(crate) struct Captures {
    root: std::path::PathBuf,
    run_id: RunId,
    max_bytes: u64,
    /// (position of the change, path), in order, not begun yet.
    wanted: std::collections::VecDeque<(usize, String)>,
    current: Option<(usize, Capture)>,
}

impl Captures {
    /// The captures of `wanted` files under `root`.
    pub(crate) fn new(
        root: std::path::PathBuf,
        run_id: RunId,
        max_bytes: u64,
        wanted: Vec<(usize, String)>,
    ) -> Captures {
        Captures {
            root,
            run_id,
            max_bytes,
            wanted: wanted.into(),
            current: None,
        }
    }

    /// Whether every file was read.
    pub(crate) fn is_done(&self) -> bool {
        self.current.is_none() && self.wanted.is_empty()
    }

    /// Reads about `group_bytes` of pieces: their records, and each file finished with
    /// its content (`None`: it could not be read).
    #[allow(clippy::type_complexity)]
    pub(crate) fn next_group(
        &mut self,
        group_bytes: usize,
    ) -> (Vec<Event>, Vec<(usize, Option<Captured>)>) {
        let (mut events, mut finished, mut bytes) = (Vec::new(), Vec::new(), 0usize);
        while bytes < group_bytes {
            let (position, mut capture) = match self.current.take() {
                Some(current) => current,
                None => {
                    let Some((position, path)) = self.wanted.pop_front() else {
                        break;
                    };
                    let full = self.root.join(&path);
                    match Capture::open(&full, self.run_id.clone(), self.max_bytes) {
                        Ok(capture) => (position, capture),
                        Err(_) => {
                            finished.push((position, None));
                            continue;
                        }
                    }
                }
            };
            match capture.next_group(group_bytes - bytes) {
                Ok((pieces, done)) => {
                    bytes += pieces
                        .iter()
                        .map(|piece| match piece {
                            Event::WorkspaceContent { bytes, .. } => bytes.len().max(1),
                            _ => 0,
                        })
                        .sum::<usize>();
                    events.extend(pieces);
                    match done {
                        Some(captured) => finished.push((position, Some(captured))),
                        None => self.current = Some((position, capture)),
                    }
                }
                Err(_) => finished.push((position, None)),
            }
        }
        (events, finished)
    }
}
