//! One running CLI process: its pipes, the last lines of its stderr, the transcript
//! file it appends to, and how it dies (with every process it started).
//!
//! Dialect-neutral: what to run comes from the dialect; this module only owns the
//! process's lifetime and reads its files.

use std::collections::{HashMap, HashSet, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use turnstile_journal::limits::{CLI_EXIT_WAIT_MS, CLI_STDERR_LINES_KEPT};

use super::transcript::{TRANSCRIPT_LAG, TranscriptTail};
use super::{Dialect, TurnState, send};
use crate::{ErrorKind, HarnessError};
use crate::{EventSink, HarnessEvent};

/// One running CLI and the transcript file it writes.
pub(crate) struct CliProcess {
    child: Child,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    pub(crate) transcript: TranscriptTail,
    /// Identities of the transcript lines already journaled.
    pub(crate) seen: HashSet<String>,
    /// The harness session the process serves.
    pub(crate) harness_session_id: String,
    /// Whether it was started to resume that session (else to start it).
    pub(crate) resume: bool,
    /// Turns it has served.
    pub(crate) turns: u32,
    /// The dialect's memory of this process (its `Dialect::Process`).
    pub(crate) memory: Option<Box<dyn std::any::Any + Send>>,
}

impl CliProcess {
    /// Starts `command` as the leader of its own process group with piped stdio, killed
    /// if dropped; `bin` names the CLI in the error when it cannot start.
    pub(crate) fn start(
        mut command: tokio::process::Command,
        bin: &std::path::Path,
        transcript: TranscriptTail,
        seen: HashSet<String>,
        harness_session_id: String,
    ) -> Result<CliProcess, HarnessError> {
        // The wrapper would start even when the CLI cannot: say so as spawning would.
        if !runnable(command.as_std().get_program()) {
            return Err(HarnessError::Failed {
                kind: ErrorKind::InvalidRequest,
                message: format!("cannot start {}: no such executable file", bin.display()),
            });
        }
        let mut command = match guarded(&command) {
            Some(guarded) => guarded,
            None => {
                // Without the wrapper's tools the CLI still leads a process group of its
                // own (cancel and shutdown kill it), but it would outlive a killed server.
                command.process_group(0);
                command
            }
        };
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|error| HarnessError::Failed {
            kind: ErrorKind::InvalidRequest,
            message: format!("cannot start {}: {error}", bin.display()),
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(HarnessError::Failed {
                kind: ErrorKind::Transient,
                message: "the CLI's pipes are missing".into(),
            });
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let sink = tail.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut tail = sink.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == CLI_STDERR_LINES_KEPT {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        Ok(CliProcess {
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
            stderr: tail,
            transcript,
            seen,
            harness_session_id,
            resume: false,
            turns: 0,
            memory: None,
        })
    }

    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the CLI, its process group and every process it started (its tools run
    /// commands in groups of their own), collected before any dies so none is
    /// orphaned out of reach.
    pub(crate) fn kill(&mut self) {
        kill_tree(&mut self.child);
    }

    /// Kills it as [`CliProcess::kill`] does, then waits (up to
    /// [`CLI_EXIT_WAIT_MS`]) until the CLI has exited: a server that stops next
    /// leaves no CLI behind, even while a killed process takes a moment to die.
    pub(crate) fn kill_and_wait(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_millis(CLI_EXIT_WAIT_MS);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The last lines the CLI wrote to stderr.
    pub(crate) fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for CliProcess {
    fn drop(&mut self) {
        if self.alive() {
            self.kill();
        }
    }
}

/// Whether `program` names an executable file: a path, or a name found on `PATH`.
fn runnable(program: &std::ffi::OsStr) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |path: &std::path::Path| {
        std::fs::metadata(path)
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    let path = std::path::Path::new(program);
    if path.components().count() > 1 {
        return executable(path);
    }
    std::env::var_os("PATH")
        .is_some_and(|dirs| std::env::split_paths(&dirs).any(|dir| executable(&dir.join(path))))
}

/// Runs in the CLI's place: starts the watchdog, then becomes the CLI (`exec`, same
/// pid), which keeps the parent-death signal `setpriv` gave it: SIGKILL when the
/// turnstile thread that started it dies, a SIGKILLed server included (issue 13).
const WRAPPER: &str = r#"token=$1; watchdog=$2; shift 2
setpriv --pdeathsig TERM -- env -i PATH="$PATH" sh -c "$watchdog" watchdog "$token" </dev/null >/dev/null 2>&1 &
exec "$@""#;

/// The watchdog: a child of the CLI with SIGTERM as its parent-death signal, so when
/// the CLI dies, however it dies, it kills every process that carries the CLI's token in
/// its environment: the commands its tools started, whatever process group or session
/// they moved to. It carries no token (nor the CLI's secrets) itself.
const WATCHDOG: &str = r#"trap 'kill "$sleeper" 2>/dev/null; for p in /proc/[0-9]*; do if grep -qz "^TURNSTILE_CLI=$1\$" "$p/environ" 2>/dev/null; then kill -KILL "${p#/proc/}" 2>/dev/null; fi; done; exit 0' TERM
while :; do sleep 3600 & sleeper=$!; wait "$sleeper"; done"#;

/// `command` wrapped so that the CLI dies with the server and its tools' processes die
/// with the CLI: `setpriv --pdeathsig KILL -- setsid sh -c WRAPPER …` (the session
/// leader is the CLI itself, so killing its group still kills it). `None` where the
/// tools (`setpriv`, `setsid`, util-linux) are missing.
fn guarded(command: &tokio::process::Command) -> Option<tokio::process::Command> {
    static TOOLS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let available = *TOOLS.get_or_init(|| {
        let found = ["setpriv", "setsid", "grep"].iter().all(|tool| {
            std::process::Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        });
        if !found {
            tracing::warn!("setpriv or setsid not found: a CLI would outlive a killed server");
        }
        found
    });
    if !available {
        return None;
    }
    let inner = command.as_std();
    let token = uuid::Uuid::now_v7().simple().to_string();
    let mut guarded = tokio::process::Command::new("setpriv");
    guarded
        .args([
            "--pdeathsig",
            "KILL",
            "--",
            "setsid",
            "sh",
            "-c",
            WRAPPER,
            "sh",
        ])
        .arg(&token)
        .arg(WATCHDOG)
        .arg(inner.get_program())
        .args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => guarded.env(key, value),
            None => guarded.env_remove(key),
        };
    }
    if let Some(dir) = inner.get_current_dir() {
        guarded.current_dir(dir);
    }
    guarded.env("TURNSTILE_CLI", token);
    Some(guarded)
}

/// Kills a CLI, its process group and every process it started (tools run commands in
/// groups of their own), collected before any dies so none is orphaned out of reach.
/// The CLI must have been spawned as the leader of its own process group.
fn kill_tree(child: &mut Child) {
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

/// Mirrors transcript lines: those already read, then the file's new ones; with
/// `until`, stops after the line with that identity (waiting for it a little).
pub(crate) async fn mirror<D: Dialect>(
    dialect: &D,
    cli: &mut CliProcess,
    events: &EventSink,
    state: &mut TurnState,
    until: Option<&str>,
) -> Result<(), HarnessError> {
    let deadline = Instant::now() + TRANSCRIPT_LAG;
    loop {
        cli.transcript.read_more();
        while let Some(line) = cli.transcript.ahead.pop_front() {
            let identity = dialect.line_identity(&line);
            let reached = until.is_some() && identity.as_deref() == until;
            if let Some(identity) = identity
                && !cli.seen.insert(identity)
            {
                if reached {
                    return Ok(());
                }
                continue;
            }
            state.mirrored.push(line.clone());
            send(events, HarnessEvent::TranscriptLine { line }).await?;
            if reached {
                return Ok(());
            }
        }
        match until {
            None => return Ok(()),
            Some(identity) if cli.seen.contains(identity) => return Ok(()),
            Some(_) if Instant::now() >= deadline => return Ok(()),
            Some(_) => tokio::time::sleep(Duration::from_millis(3)).await,
        }
    }
}
