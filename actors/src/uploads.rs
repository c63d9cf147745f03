//! Staging attachments where a harness can read them: `<cwd>/.turnstile/uploads/<run_id>/`.
//!
//! The rules follow agno's `_media.py`: the run id and every file name must be one
//! plain path component; every directory on the way is refused if it is a symlink;
//! files are created exclusively (never overwriting, never following a leaf symlink);
//! a staging that fails part way removes what it created and keeps what was there.
//! The bytes themselves live in the journal, so a later turn, a continuation, or
//! another machine can stage them again.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Why a staging was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StageError {
    /// A run id or file name that is not one plain path component.
    #[error("{0:?} is not a plain file name")]
    BadName(String),
    /// A directory on the way, or the target, is a symlink.
    #[error("{0} is a symlink; uploads never pass through one")]
    Symlink(String),
    /// The target exists already.
    #[error("{0} exists already")]
    Exists(String),
    /// The file system refused.
    #[error("cannot stage {path}: {reason}")]
    Io {
        /// Where.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Checks that `name` is one plain path component.
pub fn check_name(name: &str) -> Result<(), StageError> {
    let plain = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '\0' | ':') || c.is_control());
    if plain {
        Ok(())
    } else {
        Err(StageError::BadName(name.to_owned()))
    }
}

fn io(root: &Path, path: &Path, error: std::io::Error) -> StageError {
    StageError::Io {
        path: shown(root, path),
        reason: error.to_string(),
    }
}

/// A path as a client may see it: relative to the agent's cwd (`root`), never the
/// server's absolute path (issue 13).
fn shown(root: &Path, path: &Path) -> String {
    match path.strip_prefix(root) {
        Ok(relative) if relative.as_os_str().is_empty() => ".".to_owned(),
        Ok(relative) => relative.display().to_string(),
        Err(_) => path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| "the agent's cwd".to_owned()),
    }
}

/// The uploads folder of a run, without touching the disk.
pub fn run_dir(cwd: &Path, run_id: &str) -> PathBuf {
    cwd.join(".turnstile").join("uploads").join(run_id)
}

/// What a staging created, to undo it.
#[derive(Debug, Default)]
struct Created {
    dirs: Vec<PathBuf>,
    files: Vec<PathBuf>,
}

impl Created {
    fn undo(&self) {
        for file in self.files.iter().rev() {
            let _ = fs::remove_file(file);
        }
        for dir in self.dirs.iter().rev() {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// Makes (or walks) `<cwd>/.turnstile/uploads/<run_id>`, refusing symlinks on the way.
fn ensure_dirs(
    cwd: &Path,
    run_id: &str,
    created: &mut Created,
) -> Result<(PathBuf, PathBuf), StageError> {
    fs::create_dir_all(cwd).map_err(|e| io(cwd, cwd, e))?;
    let root = cwd.canonicalize().map_err(|e| io(cwd, cwd, e))?;
    let mut dir = root.clone();
    for part in [".turnstile", "uploads", run_id] {
        dir.push(part);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(StageError::Symlink(shown(&root, &dir)));
            }
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(StageError::Exists(shown(&root, &dir))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir(&dir).map_err(|e| io(&root, &dir, e))?;
                created.dirs.push(dir.clone());
            }
            Err(error) => return Err(io(&root, &dir, error)),
        }
    }
    Ok((root, dir))
}

/// Stages `files` (name, bytes) for `run_id`; returns the folder. A file that is
/// there already with the same bytes is left as it is (a restore); any failure
/// removes what this call created.
pub fn stage(cwd: &Path, run_id: &str, files: &[(String, Vec<u8>)]) -> Result<PathBuf, StageError> {
    stage_files(cwd, run_id, files, false).map(|(dir, _)| dir)
}

/// Stages a kept run's files again (`keep_uploads`): a file that is there with other
/// bytes was changed in the workspace and is the workspace's now, so it is left as it
/// is and named in the answer; nothing is ever overwritten.
pub fn restage_kept(
    cwd: &Path,
    run_id: &str,
    files: &[(String, Vec<u8>)],
) -> Result<(PathBuf, Vec<String>), StageError> {
    stage_files(cwd, run_id, files, true)
}

fn stage_files(
    cwd: &Path,
    run_id: &str,
    files: &[(String, Vec<u8>)],
    changed_ok: bool,
) -> Result<(PathBuf, Vec<String>), StageError> {
    check_name(run_id)?;
    for (name, _) in files {
        check_name(name)?;
    }
    let mut created = Created::default();
    let mut changed = Vec::new();
    let result = (|| {
        let (root, dir) = ensure_dirs(cwd, run_id, &mut created)?;
        for (name, bytes) in files {
            let target = dir.join(name);
            if let Ok(meta) = fs::symlink_metadata(&target) {
                if meta.file_type().is_symlink() {
                    return Err(StageError::Symlink(shown(&root, &target)));
                }
                if fs::read(&target).ok().as_deref() == Some(bytes.as_slice()) {
                    continue;
                }
                if changed_ok && meta.is_file() {
                    changed.push(name.clone());
                    continue;
                }
                return Err(StageError::Exists(shown(&root, &target)));
            }
            // `create_new` never follows a symlink put there meanwhile and never overwrites.
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&target)
                .map_err(|e| io(&root, &target, e))?;
            created.files.push(target.clone());
            file.write_all(bytes)
                .and_then(|()| file.sync_all())
                .map_err(|e| io(&root, &target, e))?;
        }
        Ok(dir)
    })();
    match result {
        Ok(dir) => Ok((dir, changed)),
        Err(error) => {
            created.undo();
            Err(error)
        }
    }
}

/// Removes a run's uploads folder (never through a symlink).
pub fn remove(cwd: &Path, run_id: &str) -> Result<(), StageError> {
    check_name(run_id)?;
    let Ok(root) = cwd.canonicalize() else {
        return Ok(());
    };
    let mut dir = root.clone();
    for part in [".turnstile", "uploads", run_id] {
        dir.push(part);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(StageError::Symlink(shown(&root, &dir)));
            }
            Ok(_) => {}
            Err(_) => return Ok(()),
        }
    }
    fs::remove_dir_all(&dir).map_err(|e| io(&root, &dir, e))
}

/// A file attached to a run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    /// File name (one plain path component).
    pub name: String,
    /// Media type.
    pub media_type: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    lower_hex(&sha2::Sha256::digest(bytes))
}

/// Bytes as lowercase hex (a digest as the journal and the API show it).
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
