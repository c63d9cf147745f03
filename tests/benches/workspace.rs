//! The workspace scan (issue 29's building block) on a workspace of 10,000 files, in
//! 100 directories, written up in `docs/PERFORMANCE.md`: the first scan (every file
//! read), a scan with nothing changed (the cost of a snapshot when a tool call changed
//! nothing: no file read), and one with 10 files changed. Medians of
//! `BENCH_WORKSPACE_REPEATS` scans; knobs `BENCH_WORKSPACE_FILES` (10000) and
//! `BENCH_WORKSPACE_FILE_BYTES` (2048). Not a test: nothing is asserted.

use std::time::{Duration, Instant};

use turnstile_actors::workspace::{Index, scan};
use turnstile_tests::{knob, median, populate_workspace, workspace_bounds};

fn main() {
    let files = knob("BENCH_WORKSPACE_FILES", 10_000);
    let bytes = knob("BENCH_WORKSPACE_FILE_BYTES", 2048);
    let repeats = knob("BENCH_WORKSPACE_REPEATS", 21);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    populate_workspace(root, files, bytes);
    let bounds = workspace_bounds();
    let started = Instant::now();
    let first = scan(root, &Index::new(), &bounds).unwrap();
    let first_time = started.elapsed();
    let index = first.index;
    let unchanged: Vec<Duration> = (0..repeats)
        .map(|_| {
            let started = Instant::now();
            let found = scan(root, &index, &bounds).unwrap();
            assert_eq!(found.files_read, 0);
            started.elapsed()
        })
        .collect();
    let changed: Vec<Duration> = (0..repeats)
        .map(|round| {
            for n in 0..10 {
                let path = root.join(format!("dir{:03}/file{:05}.txt", (n * 7) % 100, n * 7));
                std::fs::write(&path, format!("{round}-{n}")).unwrap();
            }
            let started = Instant::now();
            let found = scan(root, &index, &bounds).unwrap();
            let elapsed = started.elapsed();
            assert_eq!(found.changes.len(), 10);
            elapsed
        })
        .collect();
    println!(
        "## Workspace scan, {files} files of {bytes} bytes in 100 directories ({repeats} scans each)\n"
    );
    println!("| scan | time |");
    println!("|---|---:|");
    println!(
        "| first (every file read) | {:.1} ms |",
        first_time.as_secs_f64() * 1e3
    );
    println!(
        "| nothing changed (median) | {:.2} ms |",
        median(unchanged).as_secs_f64() * 1e3
    );
    println!(
        "| 10 files changed (median) | {:.2} ms |",
        median(changed).as_secs_f64() * 1e3
    );
}
