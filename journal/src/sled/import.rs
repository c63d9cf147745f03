//! Import into a new sled journal: records already checked by `portable`, written a
//! segment at a time with their indexes, then made durable once at the end.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::codec::{self, ManifestEntry, Run};
use crate::ids::{JournalPos, SessionId};
use crate::portable::{Checked, ImportSink};
use crate::sled::indexes::{StagedRuns, index_event};
use crate::sled::keys::{apart_key, log_key, write_index};
use crate::sled::open_sled;
use crate::{Error, JournalOptions, limits};

/// One segment being built, with its secondary index entries.
struct Pending {
    batch: sled::Batch,
    manifest: Vec<ManifestEntry>,
    first_pos: u64,
    records: Vec<Vec<u8>>,
    bytes: usize,
    /// Runs queued in this batch, for the indexes of their later events.
    staged_runs: StagedRuns,
}

impl Pending {
    fn new(first_pos: u64) -> Pending {
        Pending {
            batch: sled::Batch::default(),
            manifest: Vec::new(),
            first_pos,
            records: Vec::new(),
            bytes: 0,
            staged_runs: Default::default(),
        }
    }
}

/// Writes one segment, and the session index of its records, in one atomic batch.
fn write(tree: &sled::Tree, pending: Pending) -> Result<(), Error> {
    if pending.records.is_empty() {
        return Ok(());
    }
    let mut batch = pending.batch;
    batch.insert(
        &log_key(JournalPos(pending.first_pos)),
        codec::encode_segment(&pending.manifest, &pending.records),
    );
    let mut runs: HashMap<&SessionId, Vec<Run>> = HashMap::new();
    let mut pos = pending.first_pos;
    for entry in &pending.manifest {
        runs.entry(&entry.session_id).or_default().push(Run {
            first_seq: entry.first_seq,
            count: entry.count,
            pos: JournalPos(pos),
        });
        pos += u64::from(entry.count);
    }
    write_index(
        tree,
        &mut batch,
        runs.iter().map(|(id, runs)| (*id, runs.as_slice())),
        JournalPos(pos),
    )?;
    tree.apply_batch(batch)?;
    Ok(())
}

/// A new sled journal being imported into.
pub(crate) struct SledImport {
    dir: PathBuf,
    db: sled::Db,
    tree: sled::Tree,
    pending: Pending,
}

impl SledImport {
    /// Creates the journal in `dir`.
    pub(crate) fn create(dir: &Path) -> Result<SledImport, Error> {
        let db = open_sled(dir, &JournalOptions::default())?;
        let tree = db.open_tree("journal")?;
        Ok(SledImport {
            dir: dir.to_path_buf(),
            db,
            tree,
            pending: Pending::new(0),
        })
    }
}

impl ImportSink for SledImport {
    fn write(&mut self, record: Checked) -> Result<Option<String>, Error> {
        let Checked {
            pos,
            body,
            encoded,
            bytes,
        } = record;
        let pending = &mut self.pending;
        if let Some((digest, apart)) = encoded.apart {
            pending.bytes += apart.len();
            pending.batch.insert(apart_key(&digest), apart);
        }
        pending.bytes += bytes.len();
        pending.records.push(bytes);
        index_event(
            &self.tree,
            &mut pending.batch,
            &mut pending.staged_runs,
            (&body.session_id, pos, body.seq, body.ts_us),
            &body.event,
        );
        match pending.manifest.last_mut() {
            Some(last)
                if last.session_id == body.session_id
                    && last.first_seq.0 + u64::from(last.count) == body.seq.0 =>
            {
                last.count += 1
            }
            _ => pending.manifest.push(ManifestEntry {
                session_id: body.session_id.clone(),
                first_seq: body.seq,
                count: 1,
            }),
        }
        // The position after the line's record (the checker checked it is `pos`).
        let next_pos = pos.0 + 1;
        if pending.records.len() == limits::IMPORT_BATCH_RECORDS
            || pending.bytes >= limits::GROUP_COMMIT_BYTES_MAX
        {
            write(
                &self.tree,
                std::mem::replace(pending, Pending::new(next_pos)),
            )?;
        }
        Ok(None)
    }

    fn finish(&mut self) -> Result<Option<String>, Error> {
        let first_pos = self.pending.first_pos;
        write(
            &self.tree,
            std::mem::replace(&mut self.pending, Pending::new(first_pos)),
        )?;
        self.db.flush()?;
        File::open(self.dir.join("db"))?.sync_data()?;
        // Large values (events stored apart among them) live in sled's blob files.
        if let Ok(blobs) = std::fs::read_dir(self.dir.join("blobs")) {
            for blob in blobs.flatten() {
                File::open(blob.path())?.sync_all()?;
            }
            File::open(self.dir.join("blobs"))?.sync_all()?;
        }
        Ok(None)
    }
}
