//! The command line of `spec/cli.md`: `serve` and the `journal` subcommands.
//!
//! Journal commands open the data directory themselves and refuse, with a message
//! that says why, while a server holds it. Long work shows a progress bar on a
//! terminal and prints nothing extra when piped.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use turnstile_journal::{Journal, JournalOptions};

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
    Serve {
        /// Configuration file (TOML); defaults apply without one.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Data directory (overrides the configuration).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Listen address HOST:PORT (overrides the configuration).
        #[arg(long)]
        addr: Option<String>,
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

#[derive(Debug, Subcommand)]
enum JournalCommand {
    /// Check every record: checksum, format version, sequence contiguity, hash chain.
    Verify {
        /// Configuration file, for its data directory.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Data directory (overrides the configuration).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

fn load_config(path: Option<PathBuf>, data_dir: Option<PathBuf>) -> anyhow::Result<Config> {
    let mut config = Config::load(path.as_deref())?;
    if let Some(data_dir) = data_dir {
        config.server.data_dir = data_dir;
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
        } => run_serve(config, data_dir, addr),
        Command::Journal {
            command: JournalCommand::Verify { config, data_dir },
        } => verify(config, data_dir),
        Command::BenchBaseline { addr } => bench_baseline(&addr),
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
) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut config = load_config(config, data_dir)?;
    if let Some(addr) = addr {
        config.server.addr = addr;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(crate::serve::serve(config))?;
    Ok(ExitCode::SUCCESS)
}

fn progress_bar(message: &'static str) -> ProgressBar {
    if !std::io::stdout().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {pos} records ({per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(message);
    bar
}

fn verify(config: Option<PathBuf>, data_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let config = load_config(config, data_dir)?;
    let dir = &config.server.data_dir;
    if !dir.join("db").exists() {
        anyhow::bail!("{} holds no journal", dir.display());
    }
    let journal = Journal::open(dir, JournalOptions::default())?;
    let bar = progress_bar("verifying");
    let outcome = journal.verify(|checked| bar.set_position(checked))?;
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

fn bench_baseline(addr: &str) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(crate::serve::serve_baseline(addr))?;
    Ok(ExitCode::SUCCESS)
}
