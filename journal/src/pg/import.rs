//! Import into a PostgreSQL journal: records already checked by `portable`, written in
//! batches with their indexes.

use crate::Error;
use crate::codec::{self, Hash};
use crate::event::Event;
use crate::ids::{JournalPos, Seq, SessionId};
use crate::limits;
use crate::pg::PgJournal;
use crate::pg::append::{AppendCall, IndexArgs, call_append, position};
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
        let mut index = IndexArgs::default();
        let mut bytes = Vec::with_capacity(records.len());
        let mut digests = Vec::new();
        let mut blobs = Vec::new();
        let mut created_us = 0;
        let mut last_hash = [0; 32];
        for record in records {
            index.add(record.seq, &record.event);
            if matches!(record.event, Event::SessionCreated { .. })
                && let Ok(body) = codec::decode(&record.bytes)
            {
                created_us = body.ts_us;
            }
            if let Some((digest, apart)) = record.apart {
                digests.push(digest.to_vec());
                blobs.push(apart);
            }
            last_hash = record.hash;
            bytes.push(record.bytes);
        }
        let count = bytes.len() as u64;
        let session = session_id.clone();
        let me = self.replica_id();
        let last_pos = self.with_client(move |client| async move {
            let row = call_append(
                &client,
                AppendCall {
                    session_id: &session,
                    owner: &me,
                    // An import takes the lease as it appends (an empty database).
                    epoch: None,
                    expected: first_seq,
                    head_hash: &last_hash,
                    records: &bytes,
                    digests: &digests,
                    blobs: &blobs,
                    ts_us: created_us,
                    index: &index,
                },
            )
            .await?;
            let status: String = row.get(0);
            if status != "ok" {
                return Err(Error::Store(format!(
                    "importing session {session} from sequence {first_seq}: the database's stream is at {}",
                    row.get::<_, i64>(1)
                )));
            }
            position(&client, &session, (first_seq.0 + count - 1) as i64).await
        })?;
        self.inner
            .next_pos
            .fetch_max(last_pos + 1, Ordering::SeqCst);
        if let Ok(mut heads) = self.inner.heads.lock() {
            heads.remove(session_id);
        }
        Ok((0..count)
            .map(|offset| JournalPos(last_pos + 1 - count + offset))
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
