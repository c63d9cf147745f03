//! The workspace scan (issue 29's building block, `turnstile_actors::workspace`) on
//! real directories: unchanged files are not read, changes are found (also one made
//! within the same second with the same size), removals, ignore rules, symlinks
//! recorded as links and never followed, FIFOs skipped, and the bounds leaving files
//! out by name.

use std::path::Path;
use std::time::{Duration, SystemTime};

use turnstile_actors::workspace::{Bounds, ChangeKind, EntryKind, Ignore, Index, digest_of, scan};

fn bounds() -> Bounds {
    turnstile_tests::workspace_bounds()
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

/// What an index says of each path, without the times a fresh walk cannot match.
fn contents(index: &Index) -> Vec<(String, EntryKind, bool, String)> {
    index
        .iter()
        .map(|(path, entry)| {
            (
                path.clone(),
                entry.kind,
                entry.executable,
                entry.digest.clone(),
            )
        })
        .collect()
}

/// The kernel's watch makes a snapshot list only the directories that changed: after
/// each of many seeded random steps (files written, rewritten with the same size, made
/// executable, removed; directories made, removed, renamed, moved in from outside;
/// links; ignored directories), the index kept up by the watched partial scans is the
/// index a whole walk finds, and the changes it reported take the earlier index to it.
/// Replay one seed with `WATCH_SEED`.
#[test]
fn a_watched_scan_finds_what_a_whole_walk_finds_29() {
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;
    use turnstile_actors::workspace::scan_dirs;
    use turnstile_actors::workspace::watch::{Dirty, Watch};

    let seeds: Vec<u64> = match std::env::var("WATCH_SEED") {
        Ok(seed) => vec![seed.parse().unwrap()],
        Err(_) => (1..=8).collect(),
    };
    for seed in seeds {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let bounds = bounds();
        let mut watch = Watch::start(&root, &bounds.ignore).unwrap();
        let mut index = scan(&root, &Index::new(), &bounds).unwrap().index;
        let dirs = ["", "a", "a/b", "c", "node_modules", "a/b/d"];
        let mut partial_scans = 0;
        for step in 0..150 {
            let pick = |rng: &mut rand::rngs::StdRng| dirs[rng.random_range(0..dirs.len())];
            let name = format!("f{}", rng.random_range(0..6));
            let at = |dir: &str| {
                if dir.is_empty() {
                    root.join(&name)
                } else {
                    root.join(dir).join(&name)
                }
            };
            match rng.random_range(0..10) {
                0..=2 => {
                    let path = at(pick(&mut rng));
                    let _ = std::fs::create_dir_all(path.parent().unwrap());
                    let _ = std::fs::write(&path, format!("{step:04}"));
                }
                3 => {
                    let path = at(pick(&mut rng));
                    let _ = std::fs::remove_file(&path);
                }
                4 => {
                    use std::os::unix::fs::PermissionsExt;
                    let path = at(pick(&mut rng));
                    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755));
                }
                5 => {
                    let _ = std::fs::remove_dir_all(root.join(pick(&mut rng)).join("b"));
                }
                6 => {
                    // A directory renamed within the workspace.
                    let from = root.join(pick(&mut rng));
                    let _ =
                        std::fs::rename(from.join("b"), root.join(format!("moved{}", step % 3)));
                }
                7 => {
                    // A tree made outside and moved in whole.
                    let tree = outside.join(format!("t{step}"));
                    std::fs::create_dir_all(tree.join("deep")).unwrap();
                    std::fs::write(tree.join("deep/x"), format!("{step}")).unwrap();
                    let _ = std::fs::rename(
                        &tree,
                        root.join(pick(&mut rng)).join(format!("in{}", step % 2)),
                    );
                }
                8 => {
                    let path = at(pick(&mut rng));
                    let _ = std::fs::create_dir_all(path.parent().unwrap());
                    let _ = std::fs::remove_file(&path);
                    let _ = std::os::unix::fs::symlink(format!("../t{step}"), &path);
                }
                _ => {
                    // The same size again, at once (the racy case).
                    let path = at(pick(&mut rng));
                    if path.is_file() {
                        let _ = std::fs::write(&path, format!("{:04}", step + 5000));
                    }
                }
            }
            if step % 3 != 0 {
                continue;
            }
            let before = index.clone();
            let found = match watch.take() {
                Dirty::Dirs(dirty) => {
                    partial_scans += 1;
                    scan_dirs(&root, &mut index, &bounds, &dirty)
                        .unwrap()
                        .unwrap()
                }
                Dirty::All => {
                    let found = scan(&root, &index, &bounds).unwrap();
                    index = found.index.clone();
                    found
                }
            };
            let whole = scan(&root, &Index::new(), &bounds).unwrap().index;
            assert_eq!(
                contents(&index),
                contents(&whole),
                "seed {seed}, step {step}"
            );
            // The reported changes take the earlier index to the new one.
            let mut applied: BTreeMap<String, _> = before;
            for change in &found.changes {
                match &change.entry {
                    Some(entry) => {
                        applied.insert(change.path.clone(), entry.clone());
                    }
                    None => {
                        applied.remove(&change.path);
                    }
                }
            }
            assert_eq!(
                contents(&applied),
                contents(&whole),
                "seed {seed}, step {step}: changes"
            );
        }
        assert!(
            partial_scans > 40,
            "seed {seed}: {partial_scans} partial scans"
        );
    }
}
