//! The command line of `spec/cli.md`: `serve`, the `journal` subcommands, and
//! `sessions`/`runs` for a running server (`client`).
//!
//! Journal commands open the data directory themselves and refuse, with a message
//! that says why, while a server holds it. Long work shows a progress bar on a
//! terminal and prints nothing extra when piped.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, Write};

use turnstile_journal::portable::{self, ExportedRecord};
use turnstile_journal::{Journal, JournalOptions, JournalPos, Recorded, RunId, Seq, SessionId};

use crate::config::Config;

/// turnstile: durable coding-agent sessions.
#[derive(Debug, Parser)]
#[command(name = "turnstile", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP gateway.
    #[command(after_help = SERVE_ENVIRONMENT)]
    Serve {
        /// Configuration file (TOML); defaults apply without one (docs/CONFIG.md).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Data directory (overrides `server.data_dir`, default ./turnstile-data).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Listen address HOST:PORT, a host name allowed (overrides `server.addr`,
        /// default 127.0.0.1:7777; the last one given wins).
        #[arg(long, overrides_with = "addr")]
        addr: Option<String>,
        /// Log lines as text (for a person) or JSON (one object a line, for a collector).
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
        /// Log level or filter (`info`, `debug`, `turnstile=debug,info`...); without it
        /// RUST_LOG, else `info`.
        #[arg(long)]
        log_level: Option<String>,
        /// Print the effective configuration as TOML (defaults filled in, secrets
        /// masked), which `--config` accepts back, and exit.
        #[arg(long)]
        print_config: bool,
    },
    /// A running server's sessions, over its HTTP API.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// A running server's runs, over its HTTP API.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Audit and maintain a journal.
    Journal {
        #[command(subcommand)]
        command: JournalCommand,
    },
    /// Benchmark helper: a bare axum JSON endpoint (`POST /agents/{id}/runs`) that
    /// answers at once, the baseline the gateway's overhead is measured against.
    #[command(hide = true)]
    BenchBaseline {
        /// Listen address.
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: String,
    },
}

/// How to reach a running server.
#[derive(Debug, clap::Args)]
struct Remote {
    /// The server (default: `http://` + the configured `server.addr`, 127.0.0.1:7777);
    /// the API key is read from the configured variable (TURNSTILE_API_KEY).
    #[arg(long, global = true)]
    url: Option<String>,
    /// Configuration file, for the address and the API key's variable.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// The server's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum SessionsCommand {
    /// Sessions, newest first, a page at a time.
    List {
        /// Only this agent's.
        #[arg(long)]
        agent: Option<String>,
        /// Only this user's.
        #[arg(long)]
        user: Option<String>,
        /// Sessions per page (default 20).
        #[arg(long)]
        limit: Option<usize>,
        /// Page, from 1.
        #[arg(long)]
        page: Option<usize>,
        #[command(flatten)]
        remote: Remote,
    },
    /// One session and its runs.
    Show {
        /// The session.
        session: String,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// An agent's runs, newest first, a page at a time.
    List {
        /// The agent (default: the server's only agent).
        #[arg(long)]
        agent: Option<String>,
        /// Only this session's.
        #[arg(long)]
        session: Option<String>,
        /// Only runs of this status (pending, running, completed, error, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// Runs per page (default 20, at most 100).
        #[arg(long)]
        limit: Option<usize>,
        /// Page, from 1.
        #[arg(long)]
        page: Option<usize>,
        #[command(flatten)]
        remote: Remote,
    },
    /// One run.
    Show {
        /// The run.
        run: String,
        /// Its agent (default: found from the run).
        #[arg(long)]
        agent: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cancel a run (a finished one is left as it is).
    Cancel {
        /// The run.
        run: String,
        /// Its agent (default: found from the run).
        #[arg(long)]
        agent: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Follow a run's events by index, live, until its end (a finished run replays).
    Tail {
        /// The run.
        run: String,
        /// Its agent (default: found from the run).
        #[arg(long)]
        agent: Option<String>,
        /// Only the events after this index (default: from the first).
        #[arg(long)]
        after: Option<i64>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Continue a finished run from a checkpoint as a new run, and wait for its end.
    Continue {
        /// The run.
        run: String,
        /// Its agent (default: found from the run).
        #[arg(long)]
        agent: Option<String>,
        /// `end`, `last_user`, or a message index from `GET …/checkpoints`.
        #[arg(long, default_value = "end")]
        from: String,
        /// The new run's message.
        #[arg(long)]
        input: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Debug, Subcommand)]
enum JournalCommand {
    /// A readable, time-ordered account of a session, with journal positions.
    Timeline {
        /// The session.
        #[arg(long)]
        session: String,
        /// Only this run.
        #[arg(long)]
        run: Option<String>,
        /// Configuration file, for its data directory.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Data directory (overrides the configuration).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Every event as one JSON object a line, in journal order, with hash links.
    Export {
        /// Only this session (such an export can be read and checked, not imported).
        #[arg(long)]
        session: Option<String>,
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Configuration file, for its data directory (or, with `--url`, its API key's
        /// variable).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Data directory (overrides the configuration).
        #[arg(long, conflicts_with = "url")]
        data_dir: Option<PathBuf>,
        /// Export from a running server instead (`GET /journal/export`: a consistent
        /// export as of the position its journal has when the export starts).
        #[arg(long)]
        url: Option<String>,
    },
    /// Recompute every projection from the events and compare with the stored ones.
    Rebuild {
        /// Configuration file, for its data directory.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Data directory (overrides the configuration).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Build a journal in a new data directory (or an empty PostgreSQL database) from an
    /// export, checking every hash link.
    Import {
        /// The export.
        #[arg(long = "in")]
        input: PathBuf,
        /// The new data directory.
        #[arg(long, required_unless_present = "config")]
        data_dir: Option<PathBuf>,
        /// Configuration file whose `[journal]` names the PostgreSQL database to import
        /// into (a sled configuration imports into its data directory).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Check every record: checksum, format version, sequence contiguity, hash chain.
    Verify {
        /// Configuration file, for its data directory (or, with `--url`, its API key's
        /// variable).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Data directory (overrides the configuration).
        #[arg(long, conflicts_with = "url")]
        data_dir: Option<PathBuf>,
        /// Verify a running server's journal instead, from its export as of now: every
        /// position, sequence, hash link and record hash, without stopping it.
        #[arg(long)]
        url: Option<String>,
    },
}

/// The environment `turnstile serve` reads, shown by `--help`.
const SERVE_ENVIRONMENT: &str = "Environment:
  TURNSTILE_API_KEY  the API key; auth is on when it is set (the variable's name is
                     `server.api_key_env`)
  RUST_LOG           the log filter when --log-level is not given (default info)
  Agents' CLIs inherit the server's environment, plus their `env` table.";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

fn load_config(path: Option<PathBuf>, data_dir: Option<PathBuf>) -> anyhow::Result<Config> {
    let mut config = Config::load(path.as_deref())?;
    if let Some(data_dir) = data_dir {
        config.set_data_dir(&data_dir);
    }
    Ok(config)
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve {
            config,
            data_dir,
            addr,
            log_format,
            log_level,
            print_config,
        } => run_serve(config, data_dir, addr, log_format, log_level, print_config),
        Command::Journal {
            command:
                JournalCommand::Verify {
                    config,
                    data_dir: _,
                    url: Some(url),
                },
        } => verify_online(config, url),
        Command::Journal {
            command: JournalCommand::Verify {
                config, data_dir, ..
            },
        } => verify(config, data_dir),
        Command::BenchBaseline { addr } => bench_baseline(&addr),
        Command::Sessions { command } => sessions(command),
        Command::Runs { command } => runs(command),
        Command::Journal {
            command:
                JournalCommand::Timeline {
                    session,
                    run,
                    config,
                    data_dir,
                },
        } => timeline(&session, run.as_deref(), config, data_dir),
        Command::Journal {
            command:
                JournalCommand::Export {
                    session,
                    out,
                    config,
                    data_dir: _,
                    url: Some(url),
                },
        } => export_online(session.as_deref(), out, config, url),
        Command::Journal {
            command:
                JournalCommand::Export {
                    session,
                    out,
                    config,
                    data_dir,
                    url: None,
                },
        } => export(session.as_deref(), out, config, data_dir),
        Command::Journal {
            command:
                JournalCommand::Import {
                    input,
                    data_dir,
                    config,
                },
        } => import(&input, data_dir, config),
        Command::Journal {
            command: JournalCommand::Rebuild { config, data_dir },
        } => rebuild(config, data_dir),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run_serve(
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    addr: Option<String>,
    log_format: LogFormat,
    log_level: Option<String>,
    print_config: bool,
) -> anyhow::Result<ExitCode> {
    let mut config = load_config(config, data_dir)?;
    if let Some(addr) = addr {
        config.server.addr = addr;
    }
    if print_config {
        print!("{}", config.to_toml()?);
        return Ok(ExitCode::SUCCESS);
    }
    let filter = match log_level {
        Some(level) => tracing_subscriber::EnvFilter::try_new(&level)
            .map_err(|error| anyhow::anyhow!("--log-level {level:?}: {error}"))?,
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal (both outputs, as `spec/cli.md` says of
        // stdout), never in a file or a pipe.
        .with_ansi(std::io::stderr().is_terminal() && std::io::stdout().is_terminal());
    match log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(crate::serve::serve(config))?;
    Ok(ExitCode::SUCCESS)
}

/// A progress bar on a terminal (nothing when stdout is not one): with a total, a bar
/// with the count, the rate and the time left; without, a spinner with the count.
fn progress_bar(message: &'static str, total: Option<u64>) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(total) => (
            ProgressBar::new(total),
            "{msg} [{bar:30}] {human_pos}/{human_len} records, {rate}, {eta} left",
        ),
        None => (
            ProgressBar::new_spinner(),
            "{spinner} {msg} {human_pos} records",
        ),
    };
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_spinner())
            .with_key(
                "rate",
                |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
                    let _ = write!(out, "{:.0}/s", state.per_sec());
                },
            )
            .progress_chars("=> "),
    );
    bar.set_message(message);
    bar
}

/// Opens the configured journal for a command; says so when there is none, and
/// refuses (through the journal's lock) while a server holds it.
fn open_journal(config: Option<PathBuf>, data_dir: Option<PathBuf>) -> anyhow::Result<Journal> {
    let config = load_config(config, data_dir)?;
    if let Some(postgres) = config.postgres(None)? {
        return Ok(Journal::open_postgres(
            &postgres,
            JournalOptions::default(),
        )?);
    }
    let dir = &config.server.data_dir;
    if !dir.join("db").exists() {
        anyhow::bail!("{} holds no journal", dir.display());
    }
    Ok(Journal::open(dir, JournalOptions::default())?)
}

fn timeline(
    session: &str,
    run: Option<&str>,
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let session =
        SessionId::parse(session).map_err(|error| anyhow::anyhow!("--session: {error}"))?;
    let journal = open_journal(config, data_dir)?;
    let records: Vec<_> = journal
        .read_session(&session, Seq(0))
        .collect::<Result<_, _>>()?;
    if records.is_empty() {
        anyhow::bail!("session {session} has no events in this journal");
    }
    let run = run
        .map(|run| session_run(&records, &session, run))
        .transpose()?;
    let mut out = std::io::stdout().lock();
    for line in crate::timeline::render(records.into_iter(), run.as_ref()) {
        writeln!(out, "{line}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The session's run that `--run` names: the run itself, or the one run whose id
/// starts with it; refused, listing the session's runs, otherwise.
fn session_run(records: &[Recorded], session: &SessionId, given: &str) -> anyhow::Result<RunId> {
    let runs: Vec<&RunId> = records
        .iter()
        .filter_map(|record| match &record.event {
            turnstile_journal::Event::RunQueued { run_id, .. } => Some(run_id),
            _ => None,
        })
        .collect();
    if let Some(run) = runs.iter().find(|run| run.as_str() == given) {
        return Ok((*run).clone());
    }
    let matching: Vec<&&RunId> = runs
        .iter()
        .filter(|run| run.as_str().starts_with(given))
        .collect();
    let listed = |runs: &[&RunId]| {
        let shown: Vec<&str> = runs.iter().take(10).map(|run| run.as_str()).collect();
        let more = runs.len().saturating_sub(10);
        if more > 0 {
            format!("{} and {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        }
    };
    match matching.as_slice() {
        [one] => Ok((**one).clone()),
        [] => anyhow::bail!(
            "--run {given}: no run of session {session} is or starts with it (its runs: {})",
            listed(&runs)
        ),
        several => {
            let several: Vec<&RunId> = several.iter().map(|run| **run).collect();
            anyhow::bail!(
                "--run {given}: {} runs of session {session} start with it ({}): give more of the id",
                several.len(),
                listed(&several)
            )
        }
    }
}

fn export(
    session: Option<&str>,
    out: Option<PathBuf>,
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let session = session
        .map(|s| SessionId::parse(s).map_err(|error| anyhow::anyhow!("--session: {error}")))
        .transpose()?;
    let journal = open_journal(config, data_dir)?;
    let records: Box<dyn Iterator<Item = Result<Recorded, turnstile_journal::Error>>> =
        match &session {
            Some(session) => Box::new(journal.read_session(session, Seq(0))),
            None => Box::new(journal.read_from(JournalPos(0))),
        };
    // The bar goes to the terminal only when the export goes to a file.
    let total = session.is_none().then(|| journal.next_pos().0);
    let bar = if out.is_some() {
        progress_bar("exporting", total)
    } else {
        ProgressBar::hidden()
    };
    let mut writer: Box<dyn Write> = match &out {
        Some(path) => Box::new(std::io::BufWriter::new(std::fs::File::create(path)?)),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut count = 0u64;
    for record in records {
        writeln!(
            writer,
            "{}",
            ExportedRecord::from_recorded(&record?).to_line()
        )?;
        count += 1;
        if count.is_multiple_of(4096) {
            bar.set_position(count);
        }
    }
    writer.flush()?;
    bar.finish_and_clear();
    if let Some(path) = out {
        println!("exported {count} events to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn online(
    config: Option<PathBuf>,
    url: String,
    session: Option<&str>,
) -> anyhow::Result<Result<crate::client::Export, ExitCode>> {
    let config = load_config(config, None)?;
    let target = crate::client::Target::new(Some(url), &config)?;
    match crate::client::export(target, session) {
        Ok(export) => Ok(Ok(export)),
        Err(crate::client::Failure::Refused(message)) => {
            eprintln!("error: {message}");
            Ok(Err(ExitCode::from(1)))
        }
        Err(crate::client::Failure::Unreachable(error)) => Err(error),
    }
}

fn export_online(
    session: Option<&str>,
    out: Option<PathBuf>,
    config: Option<PathBuf>,
    url: String,
) -> anyhow::Result<ExitCode> {
    let export = match online(config, url, session)? {
        Ok(export) => export,
        Err(code) => return Ok(code),
    };
    let as_of = export.as_of;
    let bar = if out.is_some() {
        progress_bar("exporting", session.is_none().then_some(as_of))
    } else {
        ProgressBar::hidden()
    };
    let mut writer: Box<dyn Write> = match &out {
        Some(path) => Box::new(std::io::BufWriter::new(std::fs::File::create(path)?)),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut count = 0u64;
    for line in std::io::BufReader::new(export).lines() {
        writeln!(writer, "{}", line?)?;
        count += 1;
        if count.is_multiple_of(4096) {
            bar.set_position(count);
        }
    }
    writer.flush()?;
    bar.finish_and_clear();
    if let Some(path) = out {
        println!(
            "exported {count} events to {} (the server's journal as of position {as_of})",
            path.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn verify_online(config: Option<PathBuf>, url: String) -> anyhow::Result<ExitCode> {
    let export = match online(config, url, None)? {
        Ok(export) => export,
        Err(code) => return Ok(code),
    };
    let as_of = export.as_of;
    let bar = progress_bar("verifying", Some(as_of));
    let outcome = portable::verify_export(std::io::BufReader::new(export), |checked| {
        bar.set_position(checked)
    })?;
    bar.finish_and_clear();
    match outcome {
        Ok(report) if report.records == as_of => {
            println!(
                "journal ok: {} streams, {} events, as of position {as_of} of the running server (format version {})",
                report.streams,
                report.records,
                turnstile_journal::FORMAT_VERSION
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(report) => {
            println!(
                "journal INCOMPLETE: the export ended after {} of {as_of} events",
                report.records
            );
            Ok(ExitCode::from(1))
        }
        Err(refusal) => {
            println!("journal CORRUPT at export {refusal}");
            Ok(ExitCode::from(1))
        }
    }
}

fn import(
    input: &std::path::Path,
    data_dir: Option<PathBuf>,
    config: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let read = || {
        std::fs::File::open(input)
            .map(std::io::BufReader::new)
            .map_err(|error| anyhow::anyhow!("cannot read {}: {error}", input.display()))
    };
    let loaded = load_config(config, data_dir.clone())?;
    if let Some(postgres) = loaded.postgres(None)? {
        return import_postgres(read, &postgres);
    }
    let data_dir = data_dir.unwrap_or(loaded.server.data_dir);
    let data_dir = data_dir.as_path();
    let file = std::fs::File::open(input)
        .map_err(|error| anyhow::anyhow!("cannot read {}: {error}", input.display()))?;
    let bar = progress_bar("importing", None);
    let outcome = portable::import(data_dir, std::io::BufReader::new(file), |records| {
        bar.set_position(records)
    })?;
    bar.finish_and_clear();
    // A refused import into a new directory leaves nothing behind.
    reported(outcome, "; nothing was written", || {
        let journal = Journal::open(data_dir, JournalOptions::default())?;
        Ok((journal, data_dir.display().to_string()))
    })
}

/// What an import says: on success the projections are folded from the events (an
/// export carries events only) into the journal `target` opens; a refusal names its
/// line (line 0: the export was not read at all, the target holds a journal).
fn reported(
    outcome: Result<portable::ImportReport, portable::ImportRefusal>,
    refused_after: &str,
    target: impl FnOnce() -> anyhow::Result<(Journal, String)>,
) -> anyhow::Result<ExitCode> {
    match outcome {
        Ok(report) => {
            let (journal, location) = target()?;
            turnstile_projections::rebuild::store_all(&journal)?;
            journal.close()?;
            println!(
                "imported {} events in {} streams into {location}",
                report.records, report.streams,
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(refusal) if refusal.line == 0 => {
            println!("import REFUSED: {}; nothing was written", refusal.reason);
            Ok(ExitCode::from(1))
        }
        Err(refusal) => {
            println!("import REFUSED at {refusal}{refused_after}");
            Ok(ExitCode::from(1))
        }
    }
}

/// An import into an empty PostgreSQL journal: the whole export is checked first, so a
/// refused one writes nothing.
fn import_postgres(
    read: impl Fn() -> anyhow::Result<std::io::BufReader<std::fs::File>>,
    postgres: &turnstile_journal::PostgresOptions,
) -> anyhow::Result<ExitCode> {
    let bar = progress_bar("checking", None);
    let checked = portable::check_export(read()?, |records| bar.set_position(records))?;
    bar.finish_and_clear();
    if let Err(refusal) = checked {
        println!("import REFUSED at {refusal}; nothing was written");
        return Ok(ExitCode::from(1));
    }
    let journal = Journal::open_postgres(postgres, JournalOptions::default())?;
    let bar = progress_bar("importing", None);
    let outcome =
        portable::import_into_postgres(&journal, read()?, |records| bar.set_position(records))?;
    bar.finish_and_clear();
    // Checked first, so a refusal here means another writer used the database meanwhile.
    reported(outcome, "", || {
        let location = journal.location();
        Ok((journal, location))
    })
}

fn rebuild(config: Option<PathBuf>, data_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let journal = open_journal(config, data_dir)?;
    let bar = progress_bar("rebuilding", Some(journal.next_pos().0));
    let report =
        turnstile_projections::rebuild::rebuild(&journal, |events| bar.set_position(events))?;
    bar.finish_and_clear();
    if report.differences.is_empty() {
        let matched = match report.compared {
            1 => "the 1 stored projection matches".to_owned(),
            n => format!("all {n} stored projections match"),
        };
        println!(
            "rebuilt {} from {}: {matched}",
            plural(report.sessions as u64, "session"),
            plural(report.events as u64, "event"),
        );
        return Ok(ExitCode::SUCCESS);
    }
    for difference in &report.differences {
        println!("DIFFERENCE {difference}");
    }
    println!(
        "rebuilt {} from {}: {}",
        plural(report.sessions as u64, "session"),
        plural(report.events as u64, "event"),
        plural(report.differences.len() as u64, "difference")
    );
    Ok(ExitCode::from(1))
}

fn verify(config: Option<PathBuf>, data_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let journal = open_journal(config, data_dir)?;
    let bar = progress_bar("verifying", Some(journal.next_pos().0));
    let outcome = journal.verify(|checked| bar.set_position(checked))?;
    // The structural rules (one start, attempts 1, 2…, indices 0, 1…, one end) over the
    // records the integrity walk checked.
    let outcome = match outcome {
        Ok(report) => {
            bar.set_message("checking the runs' structure");
            bar.set_position(0);
            journal
                .check_structure(report.events, |checked| bar.set_position(checked))?
                .map(|()| report)
        }
        Err(corruption) => Err(corruption),
    };
    bar.finish_and_clear();
    match outcome {
        Ok(report) => {
            println!(
                "journal ok: {} streams, {} events, {} bytes (format version {})",
                report.streams,
                report.events,
                report.bytes,
                turnstile_journal::FORMAT_VERSION
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(corruption) => {
            println!(
                "journal CORRUPT at position {}: {}",
                corruption.pos, corruption.reason
            );
            Ok(ExitCode::from(1))
        }
    }
}

fn remote(remote: &Remote) -> anyhow::Result<(crate::client::Target, tokio::runtime::Runtime)> {
    let config = load_config(remote.config.clone(), None)?;
    let target = crate::client::Target::new(remote.url.clone(), &config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok((target, runtime))
}

fn sessions(command: SessionsCommand) -> anyhow::Result<ExitCode> {
    use crate::client;
    match command {
        SessionsCommand::List {
            agent,
            user,
            limit,
            page,
            remote: r,
        } => {
            let (target, runtime) = remote(&r)?;
            client::exit(runtime.block_on(client::sessions_list(
                &target, agent, user, limit, page, r.json,
            )))
        }
        SessionsCommand::Show { session, remote: r } => {
            let (target, runtime) = remote(&r)?;
            client::exit(runtime.block_on(client::sessions_show(&target, &session, r.json)))
        }
    }
}

fn runs(command: RunsCommand) -> anyhow::Result<ExitCode> {
    use crate::client;
    match command {
        RunsCommand::List {
            agent,
            session,
            status,
            limit,
            page,
            remote: r,
        } => {
            let (target, runtime) = remote(&r)?;
            client::exit(runtime.block_on(client::runs_list(
                &target, agent, session, status, limit, page, r.json,
            )))
        }
        RunsCommand::Show {
            run,
            agent,
            remote: r,
        } => {
            let (target, runtime) = remote(&r)?;
            client::exit(runtime.block_on(client::runs_show(&target, agent, &run, r.json)))
        }
        RunsCommand::Cancel {
            run,
            agent,
            remote: r,
        } => {
            let (target, runtime) = remote(&r)?;
            client::exit(runtime.block_on(client::runs_cancel(&target, agent, &run, r.json)))
        }
        RunsCommand::Tail {
            run,
            agent,
            after,
            remote: r,
        } => {
            let (target, runtime) = remote(&r)?;
            client::exit(runtime.block_on(client::runs_tail(&target, agent, &run, after, r.json)))
        }
        RunsCommand::Continue {
            run,
            agent,
            from,
            input,
            remote: r,
        } => {
            let (target, runtime) = remote(&r)?;
            client::exit(runtime.block_on(client::runs_continue(
                &target, agent, &run, from, input, r.json,
            )))
        }
    }
}

/// `1 session`, `2 sessions`.
fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn bench_baseline(addr: &str) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(crate::serve::serve_baseline(addr))?;
    Ok(ExitCode::SUCCESS)
}
