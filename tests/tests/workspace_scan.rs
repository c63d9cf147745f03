//! The workspace scan (issue 29's building block, `turnstile_actors::workspace`) on
//! real directories: unchanged files are not read, changes are found (also one made
//! within the same second with the same size), removals, ignore rules, symlinks
//! recorded as links and never followed, FIFOs skipped, and the bounds leaving files
//! out by name.

use std::path::Path;
use std::time::{Duration, SystemTime};

use turnstile_actors::workspace::{
    Bounds, ChangeKind, DEFAULT_IGNORE, EntryKind, Ignore, Index, digest_of, scan,
};

fn bounds() -> Bounds {
    Bounds {
        max_bytes: 1 << 30,
        max_file_bytes: 64 << 20,
        max_files: 100_000,
        ignore: Ignore::new(&DEFAULT_IGNORE).unwrap(),
    }
}

/// Writes a file with a modification time an hour ago (older than the racy window).
fn old_file(root: &Path, path: &str, text: &str) {
    let full = root.join(path);
    std::fs::create_dir_all(full.parent().unwrap()).unwrap();
    std::fs::write(&full, text).unwrap();
    let file = std::fs::File::options().write(true).open(&full).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
}

fn changes(found: &turnstile_actors::workspace::Scan) -> Vec<(String, ChangeKind)> {
    found
        .changes
        .iter()
        .map(|change| (change.path.clone(), change.kind))
        .collect()
}

#[test]
fn a_rescan_reads_only_what_changed_29() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for n in 0..50 {
        old_file(root, &format!("src/file{n}.rs"), &format!("fn f{n}() {{}}"));
    }
    old_file(root, "node_modules/pkg/index.js", "ignored");
    old_file(root, ".turnstile/uploads/r1/a.png", "ignored");
    let first = scan(root, &Index::new(), &bounds()).unwrap();
    assert_eq!(first.files_read, 50);
    assert_eq!(first.changes.len(), 50);
    assert!(first.changes.iter().all(|c| c.kind == ChangeKind::Added));
    assert!(
        first.index.keys().all(|path| path.starts_with("src/")),
        "{:?}",
        first.index.keys()
    );
    assert_eq!(
        first.index["src/file7.rs"].digest,
        digest_of(&root.join("src/file7.rs")).unwrap()
    );

    // Nothing changed: nothing read, nothing to record.
    let again = scan(root, &first.index, &bounds()).unwrap();
    assert_eq!((again.files_read, again.changes.len()), (0, 0));

    // One file modified (same size, just now), one removed, one added, one touched only.
    std::fs::write(root.join("src/file1.rs"), "fn g1() {}").unwrap();
    std::fs::remove_file(root.join("src/file2.rs")).unwrap();
    std::fs::write(root.join("src/new.rs"), "new").unwrap();
    let touched = std::fs::File::options()
        .write(true)
        .open(root.join("src/file3.rs"))
        .unwrap();
    touched
        .set_modified(SystemTime::now() - Duration::from_secs(60))
        .unwrap();
    let third = scan(root, &again.index, &bounds()).unwrap();
    assert_eq!(
        changes(&third),
        [
            ("src/file1.rs".to_owned(), ChangeKind::Modified),
            ("src/file2.rs".to_owned(), ChangeKind::Removed),
            ("src/new.rs".to_owned(), ChangeKind::Added),
        ]
    );
    // The modified, the new and the touched one were read; the 46 others were not.
    assert_eq!(third.files_read, 3);
}

#[test]
fn links_are_recorded_never_followed_and_odd_files_skipped_29() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "not yours").unwrap();
    let root = dir.path();
    std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
    std::os::unix::fs::symlink("../../etc/passwd", root.join("up")).unwrap();
    let fifo = root.join("pipe");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    old_file(root, "run.sh", "#!/bin/sh\n");
    let mut perms = std::fs::metadata(root.join("run.sh"))
        .unwrap()
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(root.join("run.sh"), perms).unwrap();
    let found = scan(root, &Index::new(), &bounds()).unwrap();
    let paths: Vec<&str> = found.index.keys().map(String::as_str).collect();
    assert_eq!(
        paths,
        ["out", "run.sh", "up"],
        "the FIFO is skipped, the links not entered"
    );
    assert_eq!(found.index["out"].kind, EntryKind::Symlink);
    assert_eq!(
        found.index["up"].size,
        "../../etc/passwd".len() as u64,
        "a link's size is its target's text"
    );
    assert!(found.index["run.sh"].executable);
    assert!(!found.index["out"].executable);
}

#[test]
fn over_a_bound_a_file_is_left_out_by_name_29() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    old_file(root, "a.txt", "aaaa");
    old_file(root, "big.bin", &"x".repeat(100));
    old_file(root, "c.txt", "cccc");
    old_file(root, "d.txt", "dddd");
    let tight = Bounds {
        max_bytes: 10,
        max_file_bytes: 50,
        max_files: 100,
        ignore: Ignore::default(),
    };
    let found = scan(root, &Index::new(), &tight).unwrap();
    assert_eq!(
        found.left_out,
        [
            ("big.bin".to_owned(), "workspace_max_file_bytes"),
            ("d.txt".to_owned(), "workspace_max_bytes"),
        ]
    );
    let few = Bounds {
        max_files: 1,
        ..tight
    };
    let found = scan(root, &Index::new(), &few).unwrap();
    assert_eq!(found.index.len(), 1);
    assert!(
        found
            .left_out
            .iter()
            .any(|(path, bound)| path == "c.txt" && *bound == "workspace_max_files")
    );
    // A file left out keeps what the earlier snapshot had: it is not a removal.
    let all = scan(root, &Index::new(), &bounds()).unwrap();
    let shrunk = scan(root, &all.index, &few).unwrap();
    assert!(shrunk.changes.is_empty(), "{:?}", shrunk.changes);
}
