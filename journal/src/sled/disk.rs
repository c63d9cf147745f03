//! The disk gate: whether the journal's file system can take a batch, checked before
//! sled is asked to write it.

use crate::{Error, limits};
use std::path::Path;

/// Whether the journal's disk can take `bytes` more: refused as unavailable when its
/// file system is read-only or would keep less than
/// [`limits::JOURNAL_DISK_RESERVE_BYTES`] free. One `statvfs` (~1 µs): checked before
/// every batch, so sled never meets a full or read-only disk, after which it would
/// refuse everything until a restart; once space is freed the next batch goes through.
pub(crate) fn storage_gate(dir: &Path, bytes: u64) -> Result<(), Error> {
    let stat = match rustix::fs::statvfs(dir) {
        Ok(stat) => stat,
        // The directory itself is gone or unreadable: sled's write will say why.
        Err(_) => return Ok(()),
    };
    if stat.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
        return Err(Error::Unavailable(
            "the journal's data directory is read-only".into(),
        ));
    }
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    let needed = bytes.saturating_add(limits::JOURNAL_DISK_RESERVE_BYTES);
    if free < needed {
        return Err(Error::Unavailable(format!(
            "no space left on the journal's disk ({} MiB free, {} MiB needed)",
            free / (1024 * 1024),
            needed.div_ceil(1024 * 1024)
        )));
    }
    Ok(())
}
