//! Import into a PostgreSQL journal: records already checked by `portable`, written in
//! batches with their indexes.

use crate::Error;
use crate::codec::{self, Hash};
use crate::event::Event;
use crate::ids::{JournalPos, Seq, SessionId};
use crate::limits;
use crate::pg::PgJournal;
use crate::pg::batch::{Batch, Part, call_batch};
use crate::portable::{Checked, ImportSink};
use std::sync::atomic::Ordering;

/// One record of an import, checked: its bytes as exported, its event.
struct ImportedRecord {
    pub(crate) seq: Seq,
    pub(crate) bytes: Vec<u8>,
    pub(crate) hash: Hash,
    pub(crate) apart: Option<(Hash, Vec<u8>)>,
    pub(crate) event: Event,
}

impl PgJournal {
    /// Appends records of one session exactly as given (an import's), in one
    /// transaction, and waits for their positions, which it returns.
    fn import_records(
        &self,
        session_id: &SessionId,
        records: Vec<ImportedRecord>,
    ) -> Result<Vec<JournalPos>, Error> {
        let Some(first) = records.first() else {
            return Ok(Vec::new());
        };
        let first_seq = first.seq;
        let session = session_id.clone();
        let mut records_bytes = Vec::with_capacity(records.len());
        let mut blobs = Vec::new();
        let mut created_us = 0;
        let mut last_hash = [0; 32];
        let mut changes = Vec::with_capacity(records.len());
        for record in records {
            if matches!(record.event, Event::SessionCreated { .. })
                && let Ok(body) = codec::decode(&record.bytes)
            {
                created_us = body.ts_us;
            }
            if let Some((digest, apart)) = record.apart {
                blobs.push((digest.to_vec(), apart));
            }
            last_hash = record.hash;
            records_bytes.push(record.bytes);
            changes.push((record.seq, record.event));
        }
        let count = records_bytes.len() as u64;
        let mut batch = Batch::default();
        batch.push(
            Part {
                session_id: &session,
                // An import takes the lease as it appends (an empty database).
                epoch: None,
                expected: first_seq,
                head_hash: &last_hash,
                records: records_bytes,
                blobs,
                ts_us: created_us,
            },
            changes.iter().map(|(seq, event)| (*seq, event)),
        );
        let me = self.replica_id();
        let first_pos = self.with_client(move |client| async move {
            let verdict = call_batch(&client, &me, &batch)
                .await?
                .pop()
                .ok_or_else(|| Error::Store("PostgreSQL gave no verdict".into()))?;
            match verdict.first_pos {
                Some(pos) if verdict.status == "ok" => Ok(pos),
                _ => Err(Error::Store(format!(
                    "importing session {session} from sequence {first_seq}: the database's stream is at {}",
                    verdict.next_seq
                ))),
            }
        })?;
        self.inner
            .next_pos
            .fetch_max(first_pos + count, Ordering::SeqCst);
        if let Ok(mut heads) = self.inner.heads.lock() {
            heads.remove(session_id);
        }
        Ok((0..count)
            .map(|offset| JournalPos(first_pos + offset))
            .collect())
    }
}

/// An open, empty PostgreSQL journal being imported into: the records of one session
/// at a time, a batch per transaction, each given the position the export says.
pub(crate) struct PgImport {
    journal: PgJournal,
    batch: Vec<ImportedRecord>,
    session: Option<SessionId>,
    positions: Vec<u64>,
}

impl PgImport {
    pub(crate) fn new(journal: PgJournal) -> PgImport {
        PgImport {
            journal,
            batch: Vec::new(),
            session: None,
            positions: Vec::new(),
        }
    }

    /// Writes the batch; a refusal when the database gave other positions than the
    /// export's (another writer used it).
    fn flush(&mut self) -> Result<Option<String>, Error> {
        let Some(session) = &self.session else {
            return Ok(None);
        };
        let given = self
            .journal
            .import_records(session, std::mem::take(&mut self.batch))?;
        let given: Vec<u64> = given.iter().map(|pos| pos.0).collect();
        let wanted = std::mem::take(&mut self.positions);
        Ok((given != wanted).then(|| {
            format!("positions {wanted:?} of the export were given {given:?}: another writer used the database")
        }))
    }
}

impl ImportSink for PgImport {
    fn write(&mut self, record: Checked) -> Result<Option<String>, Error> {
        let Checked {
            pos,
            body,
            encoded,
            bytes,
        } = record;
        if self.session.as_ref() != Some(&body.session_id)
            || self.batch.len() >= limits::IMPORT_BATCH_RECORDS
        {
            if let Some(reason) = self.flush()? {
                return Ok(Some(reason));
            }
            self.session = Some(body.session_id.clone());
        }
        self.batch.push(ImportedRecord {
            seq: body.seq,
            hash: codec::hash(&bytes),
            bytes,
            apart: encoded.apart,
            event: encoded.event,
        });
        self.positions.push(pos.0);
        Ok(None)
    }

    fn finish(&mut self) -> Result<Option<String>, Error> {
        self.flush()
    }
}
