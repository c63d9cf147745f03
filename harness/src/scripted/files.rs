//! The scripted harness's file tools (`/write`, `/read`, `/rm`, `/ls`,
//! `spec/scripted-harness.md`): real files in the turn's working directory, so the
//! runtime's workspaces can be tested without a CLI. Every path is confined to that
//! directory: no absolute path, no `..`, never through a symlink; one that would leave
//! it is a failed tool call and nothing is touched.

use std::path::{Component, Path, PathBuf};

use serde_json::json;

/// One file tool call.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum FileAction {
    /// `/write PATH TEXT`.
    Write { path: String, text: String },
    /// `/read PATH`.
    Read { path: String },
    /// `/rm PATH`.
    Remove { path: String },
    /// `/ls`.
    List,
}

impl FileAction {
    /// The tool call's name and arguments, as the spec names them.
    pub(super) fn tool(&self) -> (&'static str, String) {
        match self {
            FileAction::Write { path, .. } => ("Write", json!({"file_path": path}).to_string()),
            FileAction::Read { path } => ("Read", json!({"file_path": path}).to_string()),
            FileAction::Remove { path } => {
                ("Bash", json!({"command": format!("rm {path}")}).to_string())
            }
            FileAction::List => ("Bash", json!({"command": "ls"}).to_string()),
        }
    }

    /// Performs the call in `root`: its result, or why it failed.
    pub(super) fn perform(&self, root: &Path) -> Result<String, String> {
        std::fs::create_dir_all(root).map_err(|error| format!("the working directory: {error}"))?;
        match self {
            FileAction::Write { path, text } => {
                let target = confined(root, path)?;
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(|error| format!("{path}: {error}"))?;
                }
                std::fs::write(&target, text.replace("\\n", "\n"))
                    .map_err(|error| format!("{path}: {error}"))?;
                Ok("ok:Write".into())
            }
            FileAction::Read { path } => {
                let target = confined(root, path)?;
                match std::fs::read(&target) {
                    Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                        Ok("missing".into())
                    }
                    Err(error) => Err(format!("{path}: {error}")),
                }
            }
            FileAction::Remove { path } => {
                let target = confined(root, path)?;
                std::fs::remove_file(&target).map_err(|error| format!("rm {path}: {error}"))?;
                Ok("ok:Bash".into())
            }
            FileAction::List => {
                let mut files = Vec::new();
                list(root, Path::new(""), &mut files).map_err(|error| format!("ls: {error}"))?;
                files.sort();
                Ok(files.join("\n"))
            }
        }
    }
}

/// `path` under `root`, when it stays there: relative, without `..`, and with no
/// existing part of it a symlink (writing or reading through one could leave `root`).
fn confined(root: &Path, path: &str) -> Result<PathBuf, String> {
    let relative = Path::new(path);
    let leaves = || format!("{path}: the path leaves the working directory");
    if path.is_empty() || relative.is_absolute() {
        return Err(leaves());
    }
    let mut target = root.to_path_buf();
    for component in relative.components() {
        match component {
            Component::Normal(part) => target.push(part),
            Component::CurDir => continue,
            _ => return Err(leaves()),
        }
        match std::fs::symlink_metadata(&target) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(format!("{path}: the path goes through a symlink"));
            }
            Ok(_) => {}
            // Nothing below a missing part exists either.
            Err(_) => break,
        }
    }
    Ok(root.join(relative))
}

/// Every file under `dir` (symlinks as themselves, never followed), as paths relative
/// to the root.
fn list(dir: &Path, prefix: &Path, files: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let relative = prefix.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            list(&entry.path(), &relative, files)?;
        } else {
            files.push(relative.to_string_lossy().into_owned());
        }
    }
    Ok(())
}
