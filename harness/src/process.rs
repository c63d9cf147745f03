//! Helpers for harnesses that run a CLI as a child process: killing it with everything
//! it started, and reading the lines a CLI appends to its transcript file.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::Child;

/// Kills a CLI, its process group and every process it started (tools run commands in
/// groups of their own), collected before any dies so none is orphaned out of reach.
/// The CLI must have been spawned as the leader of its own process group.
pub(crate) fn kill_tree(child: &mut Child) {
    if let Some(pid) = child.id() {
        let mut targets: Vec<String> = descendants(pid).iter().map(u32::to_string).collect();
        targets.push(format!("-{pid}"));
        let _ = std::process::Command::new("kill")
            .arg("-KILL")
            .arg("--")
            .args(&targets)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = child.start_kill();
}

/// Every process below `root`, from `/proc` (empty where there is no `/proc`).
fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok())
        else {
            continue;
        };
        children.entry(ppid).or_default().push(pid);
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for child in children.get(&pid).into_iter().flatten() {
            found.push(*child);
            next.push(*child);
        }
    }
    found
}

/// Reads the lines appended to a transcript file, keeping those read ahead.
pub(crate) struct TranscriptTail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
    /// Whole lines read and not taken yet.
    pub(crate) ahead: VecDeque<String>,
}

impl TranscriptTail {
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
