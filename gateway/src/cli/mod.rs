//! The command line of `spec/cli.md`: `serve`, the `journal` subcommands, and
//! `sessions`/`runs` for a running server (`client`).
//!
//! Journal commands open the data directory themselves and refuse, with a message
//! that says why, while a server holds it. Long work shows a progress bar on a
//! terminal and prints nothing extra when piped.

use crate::cli::journal::{
    export, export_online, import, rebuild, timeline, verify, verify_online,
};
use crate::cli::remote::{bench_baseline, runs, sessions};
use crate::config::Config;
use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

mod journal;
mod remote;

/// What `turnstile --help` opens with: what the tool is for, for a user.
const ABOUT: &str = "turnstile runs coding-agent CLIs (or a scripted harness) as durable sessions: \
every turn is journaled, runs survive restarts, and agno's AgentOS API drives them.";

/// The first steps, under `turnstile --help`.
const FIRST_STEPS: &str = "Start a server on 127.0.0.1:7777 with the default configuration:
  turnstile serve
Then open http://127.0.0.1:7777/ui, or run a turn:
  curl -d message=hello -d stream=false http://127.0.0.1:7777/agents/scripted/runs
Configuration: turnstile serve --print-config (docs/CONFIG.md).";

/// turnstile: durable coding-agent sessions.
#[derive(Debug, Parser)]
#[command(name = "turnstile", version, about = ABOUT, after_help = FIRST_STEPS)]
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
    /// A signed token for a server in `[auth] mode = "jwt"` (default:
    /// $TURNSTILE_TOKEN); it shows what the token may see.
    #[arg(long, global = true)]
    token: Option<String>,
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
        /// Only runs of this status (pending, running, paused, completed, error, cancelled).
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
    /// Approve a paused run's pending calls (all of them, or those named): the run goes
    /// on in the background.
    Approve(DecideArgs),
    /// Deny a paused run's pending calls (all of them, or those named): they never run,
    /// the model is told (with the note), and the run goes on in the background.
    Deny(DecideArgs),
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

/// What `runs approve` and `runs deny` take.
#[derive(Debug, clap::Args)]
struct DecideArgs {
    /// The paused run.
    run: String,
    /// Its agent (default: found from the run).
    #[arg(long)]
    agent: Option<String>,
    /// Only this pending call (repeat for several; every pending call must be decided).
    #[arg(long = "call")]
    calls: Vec<String>,
    /// A note recorded with the decision (told to the model when a call is denied).
    #[arg(long)]
    note: Option<String>,
    #[command(flatten)]
    remote: Remote,
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
