//! Harness transcripts folded from the journal, by harness session: they grow with the
//! conversation, so they are not part of a session's state and are folded only when a
//! harness needs them.

use std::collections::HashMap;
use turnstile_journal::{Event, Recorded};

/// Every harness session's transcript lines, oldest first, folded from a session stream
/// (a fork starts with a prefix of the session it forks; a compaction appends). Only a
/// harness that starts cold needs them, so they are not part of [`SessionState`].
#[derive(Debug, Clone, Default)]
pub struct Transcripts {
    lines: HashMap<String, Vec<String>>,
}

impl Transcripts {
    /// Applies one record.
    pub fn apply(&mut self, record: &Recorded) {
        match &record.event {
            Event::TranscriptLineAppended {
                harness_session_id,
                line,
                ..
            } => self
                .lines
                .entry(harness_session_id.clone())
                .or_default()
                .push(line.clone()),
            Event::HarnessSessionForked {
                from_harness_session_id,
                harness_session_id,
                transcript_lines,
                ..
            } => {
                let kept: Vec<String> = self
                    .lines
                    .get(from_harness_session_id)
                    .map(|lines| {
                        lines
                            .iter()
                            .take(*transcript_lines as usize)
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                self.lines.insert(harness_session_id.clone(), kept);
            }
            Event::TranscriptCompacted {
                harness_session_id,
                lines,
                ..
            } => self
                .lines
                .entry(harness_session_id.clone())
                .or_default()
                .extend(lines.iter().cloned()),
            // A session id used again after a delete begins with no transcript.
            Event::SessionDeleted { .. } => self.lines.clear(),
            _ => {}
        }
    }

    /// One harness session's lines.
    pub fn of(&self, harness_session_id: &str) -> &[String] {
        self.lines
            .get(harness_session_id)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Takes one harness session's lines.
    pub fn take(mut self, harness_session_id: &str) -> Vec<String> {
        self.lines.remove(harness_session_id).unwrap_or_default()
    }
}
