//! A CLI's transcript file, both ways: written back from the journal's lines before a
//! cold start, and tailed during a turn so every new line is journaled in order.
//!
//! The rule this module keeps: a line the dialect asks for (a tool result's line) is
//! mirrored before the step that follows it is shown, so a checkpoint's transcript
//! prefix ends at that result. It knows lines only through the dialect's identity.

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;
use turnstile_journal::limits::TRANSCRIPT_LAG_MS;

use super::Dialect;

pub(super) const TRANSCRIPT_LAG: Duration = Duration::from_millis(TRANSCRIPT_LAG_MS);

/// Reads the lines appended to a transcript file, keeping those read ahead.
pub(crate) struct TranscriptTail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
    /// Whole lines read and not taken yet.
    pub(crate) ahead: VecDeque<String>,
}

impl TranscriptTail {
    /// The file tailed.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Tails `path` from byte `offset` (what the caller already has).
    pub(crate) fn new(path: PathBuf, offset: u64) -> Self {
        TranscriptTail {
            path,
            offset,
            partial: Vec::new(),
            ahead: VecDeque::new(),
        }
    }

    /// Reads what was appended since, keeping whole lines in `ahead`.
    pub(crate) fn read_more(&mut self) {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            return;
        }
        self.offset += bytes.len() as u64;
        self.partial.extend_from_slice(&bytes);
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            if !line.trim().is_empty() {
                self.ahead.push_back(line);
            }
        }
    }
}

/// The transcript file's text for a resumed harness session: the journal's lines as
/// the dialect restores them into that session, one per line.
pub(crate) fn restored_text<D: Dialect + ?Sized>(
    dialect: &D,
    transcript: &[String],
    harness_session_id: &str,
) -> String {
    let mut text = String::new();
    for line in transcript {
        text.push_str(&dialect.restore_line(line, harness_session_id));
        text.push('\n');
    }
    text
}
