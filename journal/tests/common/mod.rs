//! What the journal's tests share: opening a journal's sled directly, the way a tool
//! or an attacker underneath it would, and a whole journal as export lines.

use std::path::Path;
use std::time::{Duration, Instant};

/// Opens the sled database of a closed journal, waiting for sled to let go of its file
/// lock (it does so shortly after the last handle of the journal is dropped).
pub fn open_sled(dir: &Path) -> sled::Db {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match sled::Config::new()
            .path(dir)
            .segment_size(turnstile_journal::limits::SLED_SEGMENT_BYTES)
            .open()
        {
            Ok(db) => return db,
            Err(error) if Instant::now() < deadline => {
                assert!(error.to_string().contains("lock"), "{error}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("{error}"),
        }
    }
}

/// The whole journal as export lines, in journal order.
#[allow(dead_code)] // not every test file that shares this module exports
pub fn export(journal: &turnstile_journal::Journal) -> String {
    journal
        .read_from(turnstile_journal::JournalPos(0))
        .map(|record| {
            turnstile_journal::portable::ExportedRecord::from_recorded(&record.unwrap()).to_line()
                + "\n"
        })
        .collect()
}
