//! Attachment staging at its boundary (`turnstile_actors::uploads`), on a real
//! temporary directory: names that would leave the uploads folder, symlinks on the
//! way, exclusive creation, and a staging that fails part way.

use std::path::Path;

use turnstile_actors::uploads::{StageError, remove, run_dir, stage};

fn files(names: &[&str]) -> Vec<(String, Vec<u8>)> {
    names
        .iter()
        .map(|name| ((*name).to_owned(), format!("bytes of {name}").into_bytes()))
        .collect()
}

fn tree(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            found.push(path.strip_prefix(root).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn files_land_in_the_runs_folder_and_go_away_with_it() {
    let cwd = tempfile::tempdir().unwrap();
    let dir = stage(cwd.path(), "run-1", &files(&["a.txt", "b.png"])).unwrap();
    assert_eq!(dir, run_dir(&cwd.path().canonicalize().unwrap(), "run-1"));
    assert_eq!(std::fs::read(dir.join("a.txt")).unwrap(), b"bytes of a.txt");
    // Staging the same bytes again (a restore) is fine; other bytes are refused.
    stage(cwd.path(), "run-1", &files(&["a.txt"])).unwrap();
    let other = vec![("a.txt".to_owned(), b"different".to_vec())];
    assert!(matches!(
        stage(cwd.path(), "run-1", &other),
        Err(StageError::Exists(_))
    ));
    remove(cwd.path(), "run-1").unwrap();
    assert!(!dir.exists());
}

#[test]
fn names_that_would_leave_the_folder_are_refused_and_nothing_is_written() {
    let cwd = tempfile::tempdir().unwrap();
    for name in [
        "../evil.txt",
        "a/b.txt",
        "..",
        ".",
        "",
        "c:\\x",
        "nul\0byte",
    ] {
        assert!(
            matches!(
                stage(cwd.path(), "run-1", &files(&[name])),
                Err(StageError::BadName(_))
            ),
            "{name:?}"
        );
    }
    for run_id in ["..", "../run", "a/b"] {
        assert!(
            matches!(
                stage(cwd.path(), run_id, &files(&["a.txt"])),
                Err(StageError::BadName(_))
            ),
            "{run_id:?}"
        );
    }
    assert!(tree(cwd.path()).is_empty(), "{:?}", tree(cwd.path()));
}

#[test]
fn a_symlink_on_the_way_is_refused_and_its_target_untouched() {
    let cwd = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), cwd.path().join(".turnstile")).unwrap();
    assert!(matches!(
        stage(cwd.path(), "run-1", &files(&["a.txt"])),
        Err(StageError::Symlink(_))
    ));
    assert!(tree(elsewhere.path()).is_empty());
    // A symlink as the target file is refused too.
    let cwd = tempfile::tempdir().unwrap();
    let dir = stage(cwd.path(), "run-2", &[]).unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("victim"), dir.join("a.txt")).unwrap();
    assert!(matches!(
        stage(cwd.path(), "run-2", &files(&["a.txt"])),
        Err(StageError::Symlink(_))
    ));
    assert!(!elsewhere.path().join("victim").exists());
}

#[test]
fn a_staging_that_fails_part_way_removes_what_it_created_and_keeps_the_rest() {
    let cwd = tempfile::tempdir().unwrap();
    let dir = stage(cwd.path(), "run-1", &files(&["kept.txt"])).unwrap();
    // The third file collides with a file that was already there with other bytes.
    std::fs::write(dir.join("old.txt"), b"was here").unwrap();
    let batch = vec![
        ("new-1.txt".to_owned(), b"one".to_vec()),
        ("new-2.txt".to_owned(), b"two".to_vec()),
        ("old.txt".to_owned(), b"other".to_vec()),
    ];
    assert!(matches!(
        stage(cwd.path(), "run-1", &batch),
        Err(StageError::Exists(_))
    ));
    assert!(!dir.join("new-1.txt").exists() && !dir.join("new-2.txt").exists());
    assert_eq!(std::fs::read(dir.join("old.txt")).unwrap(), b"was here");
    assert_eq!(
        std::fs::read(dir.join("kept.txt")).unwrap(),
        b"bytes of kept.txt"
    );
    // A failed first staging leaves no folders behind either.
    let fresh = tempfile::tempdir().unwrap();
    let clash = vec![
        ("x.txt".to_owned(), b"1".to_vec()),
        ("x.txt".to_owned(), b"2".to_vec()),
    ];
    assert!(stage(fresh.path(), "run-9", &clash).is_err());
    assert!(tree(fresh.path()).is_empty(), "{:?}", tree(fresh.path()));
}
