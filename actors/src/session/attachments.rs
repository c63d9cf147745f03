//! Attachments staged for a turn: the run's own files and those of earlier runs of its
//! branch, copied into the agent's working directory before the turn and removed after.

use crate::session::SessionActor;
use std::path::Path;
use turnstile_journal::limits::ATTACHMENT_RUNS_RESTORED;
use turnstile_journal::{Event, RunId};

use turnstile_projections::RunView;

use crate::api::AgentSpec;
use crate::history::branch_walk;
use crate::reads;

impl SessionActor {
    /// Stages the run's attachments and those of the last runs of its branch, from the
    /// journal, for the harness; returns the runs staged and the note that names them in
    /// the prompt (or why staging failed), and the kept files that were changed in the
    /// workspace since (left as they are, issue 13).
    pub(super) fn stage_attachments(
        &self,
        run: &RunView,
        agent: &AgentSpec,
    ) -> (Vec<RunId>, Result<String, String>, Vec<String>) {
        let runs = self.runs_with_attachments(run);
        if runs.is_empty() {
            return (Vec::new(), Ok(String::new()), Vec::new());
        }
        let mut staged = Vec::new();
        let mut note = String::new();
        let mut changed_files = Vec::new();
        for staged_run in &runs {
            let files = self.attached_files(staged_run);
            let kept = agent.keep_uploads && staged_run.run_id != run.run_id;
            let staging = if kept {
                crate::uploads::restage_kept(
                    &agent.workdir(&self.session_id),
                    staged_run.run_id.as_str(),
                    &files,
                )
            } else {
                crate::uploads::stage(
                    &agent.workdir(&self.session_id),
                    staged_run.run_id.as_str(),
                    &files,
                )
                .map(|dir| (dir, Vec::new()))
            };
            match staging {
                Ok((_, changed)) => {
                    // Relative to the cwd the harness runs in: no server path is shown.
                    let dir = crate::uploads::run_dir(Path::new(""), staged_run.run_id.as_str());
                    staged.push(staged_run.run_id.clone());
                    note.push_str(&staged_note(
                        staged_run,
                        staged_run.run_id == run.run_id,
                        &dir,
                        &changed,
                    ));
                    changed_files.extend(
                        changed
                            .into_iter()
                            .map(|name| dir.join(name).display().to_string()),
                    );
                }
                Err(error) => {
                    self.remove_staged_in(&agent.workdir(&self.session_id), &staged);
                    return (
                        Vec::new(),
                        Err(format!("attachments could not be staged: {error}")),
                        Vec::new(),
                    );
                }
            }
        }
        (staged, Ok(note), changed_files)
    }

    /// The run itself, then up to [`ATTACHMENT_RUNS_RESTORED`] earlier runs of its
    /// branch that had attachments: the walk back stops at the oldest run with
    /// attachments, so a session without any reads no earlier run.
    fn runs_with_attachments(&self, run: &RunView) -> Vec<RunView> {
        let oldest = self
            .state
            .session
            .attachment_runs
            .iter()
            .filter(|(run_id, _)| run_id != &run.run_id)
            .map(|(_, seq)| *seq)
            .min();
        let mut runs: Vec<RunView> = Vec::new();
        if !run.attachments.is_empty() {
            runs.push(run.clone());
        }
        if let Some(oldest) = oldest {
            let load = |run_id: &RunId| reads::branch_run(&self.shared.journal, run_id);
            runs.extend(
                branch_walk(load, run)
                    .map(|(earlier, _)| earlier)
                    .take_while(|earlier| earlier.queued_seq.0 >= oldest)
                    .filter(|earlier| !earlier.attachments.is_empty())
                    .take(ATTACHMENT_RUNS_RESTORED),
            );
        }
        runs
    }

    /// A run's attached files, read from the records just after its `RunQueued`.
    fn attached_files(&self, run: &RunView) -> Vec<(String, Vec<u8>)> {
        self.shared
            .journal
            .read_session(&self.session_id, run.queued_seq)
            .take(run.attachments.len() + 3)
            .filter_map(Result::ok)
            .filter_map(|record| match record.event {
                Event::AttachmentAdded {
                    run_id,
                    name,
                    content,
                    ..
                } if run_id == run.run_id => Some((name, content)),
                _ => None,
            })
            .collect()
    }

    pub(super) fn remove_staged(&self, staged: &[RunId]) {
        let Some(agent) = self.shared.agents.get(&self.state.session.agent_id) else {
            return;
        };
        if !agent.keep_uploads {
            self.remove_staged_in(&agent.workdir(&self.session_id), staged);
        }
    }

    pub(super) fn remove_staged_in(&self, cwd: &std::path::Path, staged: &[RunId]) {
        for run_id in staged {
            if let Err(error) = crate::uploads::remove(cwd, run_id.as_str()) {
                tracing::warn!(%run_id, %error, "staged attachments not removed");
            }
        }
    }
}

/// What the turn's message says of a run's staged files: where they are (relative to
/// the cwd the harness runs in: no server path is shown) and which were changed in the
/// workspace since.
fn staged_note(run: &RunView, own: bool, dir: &Path, changed: &[String]) -> String {
    let heading = if own {
        "Attached files"
    } else {
        "Files attached earlier"
    };
    let mut note = format!("\n\n{heading} (in {}):", dir.display());
    for attachment in &run.attachments {
        let edited = if changed.contains(&attachment.name) {
            "; changed in the workspace since, left as it is"
        } else {
            ""
        };
        note.push_str(&format!(
            "\n- {} ({}, {} bytes{edited})",
            attachment.name, attachment.media_type, attachment.size
        ));
    }
    note
}
