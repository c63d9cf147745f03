//! The journal as JSON lines: one record a line, in journal order, hash links included,
//! so an export can be read and checked without sled, and a journal rebuilt from it.
//!
//! `import` refuses an export that was edited, naming the first line whose record does
//! not hash to its recorded hash or does not link to the line before it. Importing an
//! export and exporting again gives the same bytes. It writes only into a new directory.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufRead;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::codec::{self, Hash, ManifestEntry, Run};
use crate::event::Event;
use crate::ids::{JournalPos, Seq, SessionId};
use crate::sled::{self as store};
use crate::types::Recorded;
use crate::{Error, JournalOptions, limits};

/// One exported record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportedRecord {
    /// Global position.
    pub pos: u64,
    /// Session.
    pub session_id: SessionId,
    /// Position in the session's stream.
    pub seq: u64,
    /// Commit time, microseconds since the epoch.
    pub ts_us: i64,
    /// Hash of the session's previous record, hex.
    pub prev_hash: String,
    /// Hash of this record's bytes, hex.
    pub hash: String,
    /// The event.
    pub event: Event,
}

fn hex(hash: &Hash) -> String {
    hash.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<Hash> {
    if text.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(hash)
}

impl ExportedRecord {
    /// The export form of a record.
    pub fn from_recorded(record: &Recorded) -> Self {
        ExportedRecord {
            pos: record.pos.0,
            session_id: record.session_id.clone(),
            seq: record.seq.0,
            ts_us: record.ts_us,
            prev_hash: hex(&record.prev_hash),
            hash: hex(&record.hash),
            event: record.event.clone(),
        }
    }

    /// One line of JSON (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What an import built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    /// Records imported.
    pub records: u64,
    /// Session streams.
    pub streams: u64,
}

/// The first line an import refused, 1-based, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ImportRefusal {
    /// The line.
    pub line: u64,
    /// Why.
    pub reason: String,
}

/// One segment being built, with its secondary index entries.
struct Pending {
    batch: sled::Batch,
    manifest: Vec<ManifestEntry>,
    first_pos: u64,
    records: Vec<Vec<u8>>,
    bytes: usize,
    /// Runs queued in this batch, for the indexes of their later events.
    staged_runs: crate::sled::StagedRuns,
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
        &store::log_key(JournalPos(pending.first_pos)),
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
    store::write_index(
        tree,
        &mut batch,
        runs.iter().map(|(id, runs)| (*id, runs.as_slice())),
        JournalPos(pos),
    )?;
    tree.apply_batch(batch)?;
    Ok(())
}

/// Imports an export into an empty PostgreSQL journal, checking every line as
/// [`import`] does; the records keep their bytes, hashes and positions. Check the whole
/// export first ([`check_export`]): a refusal here leaves the lines before it imported.
pub fn import_into_postgres(
    journal: &crate::Journal,
    lines: impl BufRead,
    mut progress: impl FnMut(u64),
) -> Result<Result<ImportReport, ImportRefusal>, Error> {
    let Some(pg) = journal.postgres() else {
        return Err(Error::Store(
            "import into an open journal is for PostgreSQL; a sled journal is imported into a new directory".into(),
        ));
    };
    if journal.next_pos() != JournalPos(0) {
        return Ok(Err(ImportRefusal {
            line: 0,
            reason: format!(
                "{} holds a journal already: import into an empty database",
                journal.location()
            ),
        }));
    }
    let mut checker = Checker::default();
    let mut batch: Vec<crate::pg::ImportedRecord> = Vec::new();
    let mut batch_session: Option<SessionId> = None;
    let mut batch_pos: Vec<u64> = Vec::new();
    let mut records = 0u64;
    let flush = |session: &Option<SessionId>,
                 batch: &mut Vec<crate::pg::ImportedRecord>,
                 expected: &mut Vec<u64>|
     -> Result<Option<String>, Error> {
        let Some(session) = session else {
            return Ok(None);
        };
        let given = pg.import_records(session, std::mem::take(batch))?;
        let given: Vec<u64> = given.iter().map(|pos| pos.0).collect();
        let wanted = std::mem::take(expected);
        Ok((given != wanted).then(|| {
            format!("positions {wanted:?} of the export were given {given:?}: another writer used the database")
        }))
    };
    for checked in checker.each(lines) {
        let (number, checked) = checked?;
        let Checked {
            pos,
            body,
            encoded,
            bytes,
        } = match checked {
            Ok(checked) => checked,
            Err(reason) => {
                return Ok(Err(ImportRefusal {
                    line: number,
                    reason,
                }));
            }
        };
        if batch_session.as_ref() != Some(&body.session_id)
            || batch.len() >= limits::IMPORT_BATCH_RECORDS
        {
            if let Some(reason) = flush(&batch_session, &mut batch, &mut batch_pos)? {
                return Ok(Err(ImportRefusal {
                    line: number,
                    reason,
                }));
            }
            batch_session = Some(body.session_id.clone());
        }
        batch.push(crate::pg::ImportedRecord {
            seq: body.seq,
            hash: codec::hash(&bytes),
            bytes,
            apart: encoded.apart,
            event: encoded.event,
        });
        batch_pos.push(pos.0);
        records += 1;
        if records.is_multiple_of(4096) {
            progress(records);
        }
    }
    if let Some(reason) = flush(&batch_session, &mut batch, &mut batch_pos)? {
        return Ok(Err(ImportRefusal {
            line: records,
            reason,
        }));
    }
    progress(records);
    Ok(Ok(ImportReport {
        records,
        streams: checker.heads.len() as u64,
    }))
}

/// Builds a journal in `dir` (which must hold none) from an export, checking every
/// hash link; on a refusal nothing is left in `dir`.
pub fn import(
    dir: &Path,
    lines: impl BufRead,
    mut progress: impl FnMut(u64),
) -> Result<Result<ImportReport, ImportRefusal>, Error> {
    if dir.join("db").exists() {
        return Ok(Err(ImportRefusal {
            line: 0,
            reason: format!(
                "{} holds a journal already: import into a new directory",
                dir.display()
            ),
        }));
    }
    let created_dir = !dir.exists();
    let outcome = import_into(dir, lines, &mut progress);
    if !matches!(outcome, Ok(Ok(_))) {
        // Leave nothing half-built behind.
        let _ = if created_dir {
            std::fs::remove_dir_all(dir)
        } else {
            clear(dir)
        };
    }
    outcome
}

fn clear(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(path)?
        } else {
            std::fs::remove_file(path)?
        }
    }
    Ok(())
}

fn import_into(
    dir: &Path,
    lines: impl BufRead,
    progress: &mut impl FnMut(u64),
) -> Result<Result<ImportReport, ImportRefusal>, Error> {
    let db = store::open_sled(dir, &JournalOptions::default())?;
    let tree = db.open_tree("journal")?;
    let mut checker = Checker::default();
    let mut pending = Pending::new(0);
    for checked in checker.each(lines) {
        let (number, checked) = checked?;
        let Checked {
            pos,
            body,
            encoded,
            bytes,
        } = match checked {
            Ok(checked) => checked,
            Err(reason) => {
                return Ok(Err(ImportRefusal {
                    line: number,
                    reason,
                }));
            }
        };
        if let Some((digest, apart)) = encoded.apart {
            pending.bytes += apart.len();
            pending.batch.insert(store::apart_key(&digest), apart);
        }
        pending.bytes += bytes.len();
        pending.records.push(bytes);
        store::index_event(
            &tree,
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
                &tree,
                std::mem::replace(&mut pending, Pending::new(next_pos)),
            )?;
            progress(next_pos);
        }
    }
    write(&tree, pending)?;
    db.flush()?;
    File::open(dir.join("db"))?.sync_data()?;
    // Large values (events stored apart among them) live in sled's blob files.
    if let Ok(blobs) = std::fs::read_dir(dir.join("blobs")) {
        for blob in blobs.flatten() {
            File::open(blob.path())?.sync_all()?;
        }
        File::open(dir.join("blobs"))?.sync_all()?;
    }
    progress(checker.next_pos);
    Ok(Ok(ImportReport {
        records: checker.next_pos,
        streams: checker.heads.len() as u64,
    }))
}

/// One exported line, checked: its record body, its event's encoding and the record's
/// bytes.
struct Checked {
    /// Its global position.
    pos: JournalPos,
    body: codec::RecordBody,
    encoded: codec::EncodedEvent,
    bytes: Vec<u8>,
}

/// The checks of an export, line by line: positions from 0 without a gap, each
/// session's sequence without a gap, every hash link, and every record hashing to its
/// recorded hash (an edited line is named).
#[derive(Default)]
struct Checker {
    heads: HashMap<SessionId, (u64, Hash)>,
    next_pos: u64,
}

impl Checker {
    /// Each non-empty line of an export with its 1-based number, checked (a bad line's
    /// reason in place of the record).
    fn each<'a>(
        &'a mut self,
        lines: impl BufRead + 'a,
    ) -> impl Iterator<Item = Result<(u64, Result<Checked, String>), Error>> + 'a {
        lines
            .lines()
            .enumerate()
            .filter_map(move |(index, line)| match line {
                Err(error) => Some(Err(error.into())),
                Ok(line) if line.trim().is_empty() => None,
                Ok(line) => Some(Ok((index as u64 + 1, self.check(&line)))),
            })
    }

    fn check(&mut self, line: &str) -> Result<Checked, String> {
        let exported: ExportedRecord = serde_json::from_str(line)
            .map_err(|error| format!("not an exported record: {error}"))?;
        let next_pos = self.next_pos;
        if exported.pos != next_pos {
            return Err(format!(
                "position {} where {next_pos} was expected (an export of one session cannot be imported)",
                exported.pos
            ));
        }
        let (next_seq, last_hash) = self
            .heads
            .get(&exported.session_id)
            .copied()
            .unwrap_or((0, [0; 32]));
        if exported.seq != next_seq {
            return Err(format!(
                "session {} sequence {} where {next_seq} was expected",
                exported.session_id, exported.seq
            ));
        }
        let Some(prev_hash) = unhex(&exported.prev_hash) else {
            return Err("prev_hash is not 64 hex digits".into());
        };
        if prev_hash != last_hash {
            return Err(format!(
                "hash link of session {} sequence {} does not match the line before",
                exported.session_id, exported.seq
            ));
        }
        let body = codec::RecordBody {
            session_id: exported.session_id.clone(),
            seq: Seq(exported.seq),
            ts_us: exported.ts_us,
            prev_hash,
            event: exported.event,
        };
        // An event is stored apart exactly when the committer would have stored it so,
        // so the record, and its hash, are the same.
        let encoded = codec::encode_event(body.event.clone(), limits::EVENT_BYTES_CEILING)?;
        let bytes = codec::encode_parts(
            &body.session_id,
            body.seq,
            body.ts_us,
            &body.prev_hash,
            &encoded.bytes,
        )?;
        let hash = codec::hash(&bytes);
        if unhex(&exported.hash) != Some(hash) {
            return Err(format!(
                "the record does not hash to its recorded hash (session {} sequence {}): it was edited",
                body.session_id, body.seq
            ));
        }
        self.heads
            .insert(body.session_id.clone(), (body.seq.0 + 1, hash));
        self.next_pos += 1;
        Ok(Checked {
            pos: JournalPos(exported.pos),
            body,
            encoded,
            bytes,
        })
    }
}

/// Checks a whole export as `import` does, writing nothing: the audit of a running
/// server's journal (`journal verify --url`), streamed.
pub fn check_export(
    lines: impl BufRead,
    mut progress: impl FnMut(u64),
) -> Result<Result<ImportReport, ImportRefusal>, Error> {
    check_lines(lines, false, &mut progress)
}

/// [`check_export`] and the runtime's structural rules ([`crate::structure`]): what
/// `journal verify --url` checks of a running server's export.
pub fn verify_export(
    lines: impl BufRead,
    mut progress: impl FnMut(u64),
) -> Result<Result<ImportReport, ImportRefusal>, Error> {
    check_lines(lines, true, &mut progress)
}

fn check_lines(
    lines: impl BufRead,
    rules: bool,
    progress: &mut impl FnMut(u64),
) -> Result<Result<ImportReport, ImportRefusal>, Error> {
    let mut checker = Checker::default();
    let mut structure = crate::structure::Structure::default();
    let mut records = 0u64;
    for checked in checker.each(lines) {
        let (number, checked) = checked?;
        let checked = checked.and_then(|checked| {
            if !rules {
                return Ok(());
            }
            structure.check_at(
                checked.pos,
                &checked.body.session_id,
                checked.body.seq.0,
                &checked.body.event,
            )
        });
        if let Err(reason) = checked {
            return Ok(Err(ImportRefusal {
                line: number,
                reason,
            }));
        }
        records += 1;
        if records.is_multiple_of(4096) {
            progress(records);
        }
    }
    progress(checker.next_pos);
    Ok(Ok(ImportReport {
        records: checker.next_pos,
        streams: checker.heads.len() as u64,
    }))
}
