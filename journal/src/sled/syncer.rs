//! The syncer thread: one `fdatasync` makes a flushed batch durable, then its appenders
//! are answered in order and its records published to the live feed.

use crate::sled::committer::SyncJob;
use crate::types::JournalStats;
use crate::{Error, Recorded};
use std::collections::HashSet;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::broadcast;

/// Makes flushed batches durable with one `fdatasync`, then answers their appenders
/// in order. It runs on its own thread so the disk's sync of one batch overlaps the
/// committer's work on the next; sled's flush stays on the committer (moving it here
/// too was measured slower: sled's flush and apply contend).
pub(super) struct Syncer {
    pub(super) stats: Arc<JournalStats>,
    pub(super) db_file: File,
    pub(super) blobs_dir: PathBuf,
    pub(super) synced_blobs: HashSet<std::ffi::OsString>,
    pub(super) durable_pos: Arc<AtomicU64>,
    pub(super) live: broadcast::Sender<Arc<Recorded>>,
    pub(super) last_sync_us: u64,
}

impl Syncer {
    pub(super) fn run(
        mut self,
        receiver: std::sync::mpsc::Receiver<SyncJob>,
        failed: Arc<std::sync::atomic::AtomicBool>,
    ) {
        while let Ok(first) = receiver.recv() {
            let mut jobs = vec![first];
            jobs.extend(receiver.try_iter());
            let synced = if failed.load(Ordering::SeqCst) {
                Err(Error::Stopped)
            } else {
                self.sync()
            };
            if let Err(error) = synced {
                tracing::error!(%error, "journal sync failed; refusing further appends");
                failed.store(true, Ordering::SeqCst);
                for job in jobs {
                    for (reply, _) in job.answers {
                        let _ =
                            reply.send(Err(Error::Io(std::io::Error::other(error.to_string()))));
                    }
                }
                continue;
            }
            let appends = jobs.iter().map(|job| job.answers.len() as u64).sum();
            self.stats.record_sync(self.last_sync_us, appends);
            for job in jobs {
                self.durable_pos.store(job.end_pos, Ordering::SeqCst);
                for record in job.staged {
                    // No receiver is fine: the journal is the source, the channel a hint.
                    let _ = self.live.send(record);
                }
                for (reply, answer) in job.answers {
                    let _ = reply.send(Ok(answer));
                }
            }
        }
    }

    /// A real `fdatasync` after sled's flush (`sync_file_range` on Linux, done by the committer).
    pub(super) fn sync(&mut self) -> Result<(), Error> {
        let started = std::time::Instant::now();
        self.db_file.sync_data()?;
        self.sync_new_blobs()?;
        self.last_sync_us = started.elapsed().as_micros() as u64;
        Ok(())
    }

    /// sled writes pages over ~128 KiB (large records, big nodes) to files under
    /// `blobs/` and never syncs them; a record that lives there must be synced too.
    pub(super) fn sync_new_blobs(&mut self) -> Result<(), Error> {
        let entries = match std::fs::read_dir(&self.blobs_dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        let mut present = HashSet::new();
        let mut synced_any = false;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if !self.synced_blobs.contains(&name) {
                match File::open(entry.path()) {
                    Ok(file) => file.sync_data()?,
                    // sled collects blobs concurrently; a vanished one needs no sync.
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(error) => return Err(error.into()),
                }
                synced_any = true;
            }
            present.insert(name);
        }
        if synced_any {
            File::open(&self.blobs_dir)?.sync_all()?;
        }
        self.synced_blobs = present;
        Ok(())
    }
}
