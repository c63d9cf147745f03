//! The structural rules of a journal, checked record by record in global order: each
//! session stream begins with `SessionCreated` (again after a `SessionDeleted`), a run's
//! events come in lifecycle order (queued, started once, attempts numbered 1, 2, 3…,
//! client-visible events indexed 0, 1, 2… without a repeat or a gap, tool call ids
//! once, one end and nothing after it), and a session's workspace contents are whole
//! (each blob's pieces contiguous, hashing to the digest its last piece names) before a
//! snapshot names their digest.
//!
//! `verify` runs it on both backends after the checksums and hash links, and the online
//! verify on an export's lines; it names the first record that breaks a rule. It knows
//! nothing of stored forms (`journal rebuild` compares those). Memory: what each open run
//! needs, the id of each ended run, and each session's content digests.

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};

use crate::event::{Event, RunEvent};
use crate::ids::{JournalPos, RunId, SessionId};
use crate::types::Recorded;
use crate::verify::Corruption;

/// What the walk knows of one open run.
#[derive(Default)]
struct OpenRun {
    started: bool,
    attempts: u32,
    next_index: u64,
    tool_calls: HashSet<String>,
}

/// The structural checker: feed it every record in global order.
#[derive(Default)]
pub struct Structure {
    /// Sessions whose stream is open (created and not deleted since).
    created: HashSet<SessionId>,
    /// Sessions that have records at all.
    seen: HashSet<SessionId>,
    open: HashMap<RunId, OpenRun>,
    ended: HashSet<RunId>,
    /// Workspace contents being read: per session and blob, the hash so far and the
    /// next offset.
    blobs: HashMap<(SessionId, String), (Sha256, u64)>,
    /// Whole workspace contents, per session, by digest.
    contents: HashSet<(SessionId, String)>,
}

impl Structure {
    /// Checks one record against what came before it.
    pub fn check(&mut self, record: &Recorded) -> Result<(), Corruption> {
        let bad = |reason: String| {
            Err(Corruption {
                pos: record.pos,
                reason,
            })
        };
        self.check_at(record.pos, &record.session_id, record.seq.0, &record.event)
            .or_else(bad)
    }

    /// [`Structure::check`] for a record given by its parts.
    pub fn check_at(
        &mut self,
        _pos: JournalPos,
        session_id: &SessionId,
        seq: u64,
        event: &Event,
    ) -> Result<(), String> {
        let first = self.seen.insert(session_id.clone());
        match event {
            Event::SessionCreated { .. } => {
                self.created.insert(session_id.clone());
                return Ok(());
            }
            Event::SessionDeleted { .. } => {
                if !self.created.remove(session_id) {
                    return Err(format!(
                        "session {session_id} sequence {seq}: SessionDeleted of a session not created"
                    ));
                }
                return Ok(());
            }
            // An event stored apart is checked where it is resolved.
            Event::StoredApart { .. } => return Ok(()),
            _ => {}
        }
        if !self.created.contains(session_id) {
            let what = if first {
                "the stream does not begin with SessionCreated"
            } else {
                "an event of a session deleted and not created again"
            };
            return Err(format!(
                "session {session_id} sequence {seq}: {} ({what})",
                event.kind()
            ));
        }
        if let Some(broken) = self.workspace(session_id, event) {
            return Err(format!("session {session_id} sequence {seq}: {broken}"));
        }
        match event.run_id() {
            Some(run_id) => self.run_rules(session_id, seq, run_id, event),
            None => Ok(()),
        }
    }

    /// The rules of a run's lifecycle, for one of its records.
    fn run_rules(
        &mut self,
        session_id: &SessionId,
        seq: u64,
        run_id: &RunId,
        event: &Event,
    ) -> Result<(), String> {
        let kind = event.kind();
        let at = |rule: &str| {
            format!("session {session_id} sequence {seq}: {kind} of run {run_id} {rule}")
        };
        if let Event::RunQueued { .. } = event {
            if self.ended.contains(run_id) || self.open.contains_key(run_id) {
                return Err(at("queued twice"));
            }
            self.open.insert(run_id.clone(), OpenRun::default());
            return Ok(());
        }
        // A compaction names the run it followed, which may have ended.
        if let Event::TranscriptCompacted { .. } = event {
            return Ok(());
        }
        if self.ended.contains(run_id) {
            return Err(at("after the run ended"));
        }
        let Some(run) = self.open.get_mut(run_id) else {
            return Err(at("before the run was queued"));
        };
        match event {
            Event::RunStarted { .. } => {
                if run.started {
                    return Err(at("a second time (the run started twice)"));
                }
                run.started = true;
            }
            Event::AttemptStarted { attempt, .. } => {
                if !run.started {
                    return Err(at("before RunStarted"));
                }
                if *attempt != run.attempts + 1 {
                    return Err(at(&format!(
                        "numbered {attempt} where {} was expected",
                        run.attempts + 1
                    )));
                }
                run.attempts = *attempt;
            }
            Event::AttemptFailed { attempt, .. } if *attempt == 0 || *attempt > run.attempts => {
                return Err(at(&format!(
                    "names attempt {attempt}, which has not started"
                )));
            }
            Event::TranscriptLineAppended { .. } if !run.started => {
                return Err(at("before RunStarted"));
            }
            Event::RunEventEmitted {
                event_index,
                event: run_event,
                ..
            } => {
                if event_index.0 != run.next_index {
                    return Err(at(&format!(
                        "has event index {} where {} was expected",
                        event_index.0, run.next_index
                    )));
                }
                run.next_index += 1;
                if let RunEvent::ToolCallStarted { tool } = run_event
                    && !run.tool_calls.insert(tool.tool_call_id.clone())
                {
                    return Err(at(&format!(
                        "starts tool call {} a second time",
                        tool.tool_call_id
                    )));
                }
            }
            event if event.is_terminal() => {
                self.open.remove(run_id);
                self.ended.insert(run_id.clone());
            }
            _ => {}
        }
        Ok(())
    }
}

impl Structure {
    /// The workspace rules: a blob's pieces in order and hashing to their digest; a
    /// snapshot's files named by digests whose content came before, at confined paths.
    fn workspace(&mut self, session_id: &SessionId, event: &Event) -> Option<String> {
        match event {
            Event::WorkspaceContent {
                blob,
                offset,
                bytes,
                digest,
                ..
            } => {
                let key = (session_id.clone(), blob.clone());
                let (hasher, next) = self.blobs.entry(key.clone()).or_default();
                if *offset != *next {
                    return Some(format!(
                        "WorkspaceContent of blob {blob} at offset {offset} where {next} was expected"
                    ));
                }
                hasher.update(bytes);
                *next += bytes.len() as u64;
                if let Some(digest) = digest {
                    let (hasher, _) = self.blobs.remove(&key).unwrap_or_default();
                    let actual: String = hasher
                        .finalize()
                        .iter()
                        .map(|byte| format!("{byte:02x}"))
                        .collect();
                    if &actual != digest {
                        return Some(format!(
                            "WorkspaceContent of blob {blob} hashes to {actual}, not to its digest {digest}"
                        ));
                    }
                    self.contents.insert((session_id.clone(), digest.clone()));
                }
                None
            }
            Event::WorkspaceChanged { changes, .. } => changes.iter().find_map(|change| {
                if !crate::files::is_confined(&change.path) {
                    return Some(format!(
                        "WorkspaceChanged names {:?}, a path outside the workspace",
                        change.path
                    ));
                }
                let entry = change.entry.as_ref()?;
                let missing = entry.kind == crate::files::FileKind::File
                    && !self
                        .contents
                        .contains(&(session_id.clone(), entry.digest.clone()));
                missing.then(|| {
                    format!(
                        "WorkspaceChanged names {} with digest {}, whose content was never recorded",
                        change.path, entry.digest
                    )
                })
            }),
            _ => None,
        }
    }
}
