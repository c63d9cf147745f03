//! The journal as JSON lines: one record a line, in journal order, hash links included,
//! so an export can be read and checked without sled, and a journal rebuilt from it.
//!
//! `import` refuses an export that was edited, naming the first line whose record does
//! not hash to its recorded hash or does not link to the line before it. Importing an
//! export and exporting again gives the same bytes. It writes into a new directory (sled)
//! or an empty database (PostgreSQL), through each backend's [`ImportSink`].

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::codec::{self, Hash};
use crate::event::Event;
use crate::ids::{JournalPos, Seq, SessionId};
use crate::types::Recorded;
use crate::{Error, JournalOptions, limits};

/// One exported record (read back with [`ExportedRecord::from_line`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// The record's format: absent for format 3 (every export before format 4 was of
    /// format 3, and a format-3 record's line is the same as then).
    #[serde(skip_serializing_if = "is_format3")]
    pub format: u8,
    /// The event, as its format writes it.
    pub event: ExportedEvent,
}

/// A record's event in an export: the current one, or a format-3 record's as that
/// format wrote it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ExportedEvent {
    /// A record of the current format.
    Current(Event),
    /// A record of format 3.
    Format3(crate::format3::Event),
}

fn is_format3(format: &u8) -> bool {
    *format == codec::OLDEST_FORMAT_READ
}

/// A line's format, read first (the event is skipped, not built).
#[derive(Deserialize)]
struct LineFormat {
    #[serde(default)]
    format: Option<u8>,
}

/// A line, its event read as its format wrote it: straight into the event's type, so a
/// large event (an attachment's bytes) costs its own size, not a JSON tree of it.
#[derive(Deserialize)]
struct Line<E> {
    pos: u64,
    session_id: SessionId,
    seq: u64,
    ts_us: i64,
    prev_hash: String,
    hash: String,
    event: E,
}

impl<E> Line<E> {
    fn exported(self, format: u8, event: impl FnOnce(E) -> ExportedEvent) -> ExportedRecord {
        ExportedRecord {
            pos: self.pos,
            session_id: self.session_id,
            seq: self.seq,
            ts_us: self.ts_us,
            prev_hash: self.prev_hash,
            hash: self.hash,
            format,
            event: event(self.event),
        }
    }
}

impl ExportedRecord {
    /// Reads one line of an export: its format first (a line without one is format 3,
    /// as every export before format 4), then the record with its event in that format.
    pub fn from_line(line: &str) -> Result<ExportedRecord, String> {
        let format = serde_json::from_str::<LineFormat>(line)
            .map_err(|error| error.to_string())?
            .format
            .unwrap_or(codec::OLDEST_FORMAT_READ);
        match format {
            codec::FORMAT_VERSION => serde_json::from_str::<Line<Event>>(line)
                .map(|read| read.exported(format, ExportedEvent::Current)),
            codec::OLDEST_FORMAT_READ => serde_json::from_str::<Line<crate::format3::Event>>(line)
                .map(|read| read.exported(format, ExportedEvent::Format3)),
            other => return Err(format!("unknown record format {other}")),
        }
        .map_err(|error| error.to_string())
    }
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
            format: match record.format3 {
                Some(_) => codec::OLDEST_FORMAT_READ,
                None => codec::FORMAT_VERSION,
            },
            event: match &record.format3 {
                Some(old) => ExportedEvent::Format3((**old).clone()),
                None => ExportedEvent::Current(record.event.clone()),
            },
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

/// Where an import writes the records it checked: a backend's bulk writer. A refusal
/// (`Ok(Some(reason))`) stops the import at that line.
pub(crate) trait ImportSink {
    /// Takes one checked record, buffered or written.
    fn write(&mut self, record: Checked) -> Result<Option<String>, Error>;
    /// Writes what is buffered and makes everything durable.
    fn finish(&mut self) -> Result<Option<String>, Error>;
}

/// Imports an export through a sink: every line checked, in order.
fn import_with(
    sink: &mut dyn ImportSink,
    lines: impl BufRead,
    progress: &mut impl FnMut(u64),
) -> Result<Result<ImportReport, ImportRefusal>, Error> {
    let mut checker = Checker::default();
    let mut records = 0u64;
    for checked in checker.each(lines) {
        let (number, checked) = checked?;
        let refused = match checked {
            Ok(checked) => sink.write(checked)?,
            Err(reason) => Some(reason),
        };
        if let Some(reason) = refused {
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
    if let Some(reason) = sink.finish()? {
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

/// Imports an export into an open, empty journal that takes imports (one a database
/// holds), checking every line as [`import`] does; the records keep their bytes, hashes
/// and positions. Check the whole export first ([`check_export`]): a refusal here
/// leaves the lines before it imported.
pub fn import_into(
    journal: &crate::Journal,
    lines: impl BufRead,
    mut progress: impl FnMut(u64),
) -> Result<Result<ImportReport, ImportRefusal>, Error> {
    let Some(mut sink) = journal.import_sink() else {
        return Err(Error::Store(
            "this journal is not imported into while open: it is imported into a new directory"
                .into(),
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
    import_with(sink.as_mut(), lines, &mut progress)
}

/// What [`import_to`] ends with: the report and the journal imported into, open; or the
/// refusal and whether anything was written before it.
pub type ImportOutcome = Result<(ImportReport, crate::Journal), (ImportRefusal, bool)>;

/// What [`import_to`] is doing, for a progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportPhase {
    /// Checking the whole export before anything is written.
    Checking,
    /// Writing it.
    Importing,
}

/// Imports an export into the journal `config` names, whichever backend: into a new
/// directory (a refusal leaves nothing there), or into an empty database after the
/// whole export was checked (so a refusal writes nothing; one while writing means
/// another writer used the database). `read` opens the export (twice when it is
/// checked first). The journal imported into, open, or the refusal with whether
/// anything was written.
pub fn import_to<R: BufRead>(
    config: &crate::JournalConfig,
    mut read: impl FnMut() -> Result<R, Error>,
    mut progress: impl FnMut(ImportPhase, u64),
) -> Result<ImportOutcome, Error> {
    match config {
        crate::JournalConfig::Sled(dir) => {
            match import(dir, read()?, |records| {
                progress(ImportPhase::Importing, records)
            })? {
                Ok(report) => Ok(Ok((
                    report,
                    crate::Journal::open(dir, JournalOptions::default())?,
                ))),
                Err(refusal) => Ok(Err((refusal, false))),
            }
        }
        crate::JournalConfig::Postgres(_) => {
            if let Err(refusal) =
                check_export(read()?, |records| progress(ImportPhase::Checking, records))?
            {
                return Ok(Err((refusal, false)));
            }
            let journal = crate::Journal::open_config(config, JournalOptions::default())?;
            match import_into(&journal, read()?, |records| {
                progress(ImportPhase::Importing, records)
            })? {
                Ok(report) => Ok(Ok((report, journal))),
                Err(refusal) => {
                    let wrote = refusal.line > 0;
                    Ok(Err((refusal, wrote)))
                }
            }
        }
    }
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
    let outcome = crate::sled::SledImport::create(dir)
        .and_then(|mut sink| import_with(&mut sink, lines, &mut progress));
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

/// One exported line, checked: its record body, its event's encoding and the record's
/// bytes.
pub(crate) struct Checked {
    /// Its global position.
    pub(crate) pos: JournalPos,
    pub(crate) body: codec::RecordBody,
    pub(crate) encoded: codec::EncodedEvent,
    pub(crate) bytes: Vec<u8>,
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
        let exported = ExportedRecord::from_line(line)
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
        let session_id = exported.session_id.clone();
        let (seq, ts_us) = (Seq(exported.seq), exported.ts_us);
        // An event is stored apart exactly when the committer would have stored it so,
        // in the record's own format, so the record, and its hash, are the same.
        let (bytes, encoded) = match exported.event {
            ExportedEvent::Current(event) => {
                let encoded = codec::encode_event(event, limits::EVENT_BYTES_CEILING)?;
                let bytes =
                    codec::encode_parts(&session_id, seq, ts_us, &prev_hash, &encoded.bytes)?;
                (bytes, encoded)
            }
            ExportedEvent::Format3(old) => {
                encode_format3(&session_id, seq, ts_us, &prev_hash, &old)?
            }
        };
        let body = codec::RecordBody {
            session_id,
            seq,
            ts_us,
            prev_hash,
            event: encoded.event.clone(),
        };
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

/// A format-3 record encoded again from its exported event, in format 3 (so that it
/// keeps its hash): the record's bytes, and its event as [`codec::encode_event`] gives
/// it (stored apart exactly when format 3 stored it so).
fn encode_format3(
    session_id: &SessionId,
    seq: Seq,
    ts_us: i64,
    prev_hash: &Hash,
    old: &crate::format3::Event,
) -> Result<(Vec<u8>, codec::EncodedEvent), String> {
    let bytes =
        bincode::serde::encode_to_vec(old, codec::event_config()).map_err(|e| e.to_string())?;
    let (event_bytes, apart) = codec::inline_or_apart(bytes, |digest, bytes| {
        crate::format3::Event::StoredApart { digest, bytes }
    })?;
    let record = codec::encode_parts_as(
        codec::OLDEST_FORMAT_READ,
        session_id,
        seq,
        ts_us,
        prev_hash,
        &event_bytes,
    )?;
    let encoded = codec::EncodedEvent {
        event: crate::format3::upgrade(old.clone()),
        bytes: event_bytes,
        apart,
    };
    Ok((record, encoded))
}
