//! Verification of a PostgreSQL journal: the neutral checks over the records in global
//! order, then each stream's stored head against its last record.

use crate::Error;
use crate::chain::Head;
use crate::ids::{JournalPos, SessionId};
use crate::pg::{PgJournal, stored_id};
use crate::verify::{Corruption, VerifyReport};
use std::collections::HashMap;

impl PgJournal {
    /// The neutral checks, over the records in global order: positions from 0 without
    /// a gap, each record's checksum and format, each session's sequence from 0 and hash
    /// links; then each stream's stored head against its last record.
    pub(crate) fn verify(
        &self,
        mut progress: impl FnMut(u64),
    ) -> Result<Result<VerifyReport, Corruption>, Error> {
        let mut heads: HashMap<SessionId, Head> = HashMap::new();
        let mut report = VerifyReport::default();
        let mut expected = JournalPos(0);
        for record in self.read_from(JournalPos(0)) {
            let record = match record {
                Ok(record) => record,
                Err(Error::Corrupt { pos, reason }) => return Ok(Err(Corruption { pos, reason })),
                Err(error) => return Err(error),
            };
            if record.pos != expected {
                return Ok(Err(Corruption {
                    pos: expected,
                    reason: format!(
                        "records missing: the next record is at position {}",
                        record.pos
                    ),
                }));
            }
            let head = heads
                .entry(record.session_id.clone())
                .or_insert(Head::EMPTY);
            if record.seq != head.next_seq {
                return Ok(Err(Corruption {
                    pos: record.pos,
                    reason: format!(
                        "session {} sequence {} where {} was expected",
                        record.session_id, record.seq, head.next_seq
                    ),
                }));
            }
            if record.prev_hash != head.last_hash {
                return Ok(Err(Corruption {
                    pos: record.pos,
                    reason: format!(
                        "hash link of session {} sequence {} does not match the record before",
                        record.session_id, record.seq
                    ),
                }));
            }
            *head = Head {
                next_seq: record.seq.next(),
                last_hash: record.hash,
            };
            report.events += 1;
            report.bytes += record.size_bytes as u64;
            expected = expected.next();
            if report.events % 4096 == 0 {
                progress(report.events);
            }
        }
        report.streams = heads.len() as u64;
        progress(report.events);
        Ok(self.check_heads(&heads, expected)?.map(|()| report))
    }

    /// Each fully positioned stream's stored head against the walk's (`expected` is
    /// the position after the walk).
    fn check_heads(
        &self,
        heads: &HashMap<SessionId, Head>,
        expected: JournalPos,
    ) -> Result<Result<(), Corruption>, Error> {
        let durable = expected.0 as i64;
        let stored: Vec<(String, i64, Vec<u8>)> = self.with_client(move |client| async move {
            // Streams whose records are all positioned (one appended meanwhile is not
            // in this walk).
            let rows = client
                .query(
                    "SELECT s.session_id, s.next_seq, s.head_hash FROM turnstile.streams s \
                     WHERE NOT EXISTS (SELECT 1 FROM turnstile.events e WHERE e.session_id = s.session_id \
                     AND (e.pos IS NULL OR e.pos >= $1))",
                    &[&durable],
                )
                .await?;
            Ok(rows
                .into_iter()
                .map(|row| (row.get(0), row.get(1), row.get(2)))
                .collect())
        })?;
        for (session, next_seq, head_hash) in stored {
            let session_id: SessionId = stored_id(session)?;
            let (walked_seq, walked_hash) = heads
                .get(&session_id)
                .map(|head| (head.next_seq.0, head.last_hash))
                .unwrap_or((0, [0; 32]));
            if next_seq as u64 != walked_seq || head_hash.as_slice() != walked_hash {
                return Ok(Err(Corruption {
                    pos: expected,
                    reason: format!(
                        "the stored head of session {session_id} (next sequence {next_seq}) does not match its records (next sequence {walked_seq})"
                    ),
                }));
            }
        }
        Ok(Ok(()))
    }
}
