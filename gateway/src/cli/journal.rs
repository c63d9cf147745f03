//! The `journal` subcommands: timeline, export and import, rebuild and verify, on a data
//! directory the command opens itself (refused, with a message that says why, while a
//! server holds it) or online through a running server. Long work shows a progress bar
//! on a terminal and prints nothing extra when piped.

use crate::cli::load_config;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use turnstile_journal::portable::{self, ExportedRecord};
use turnstile_journal::{Journal, JournalOptions, JournalPos, Recorded, RunId, Seq, SessionId};

/// A progress bar on a terminal (nothing when stdout is not one): with a total, a bar
/// with the count, the rate and the time left; without, a spinner with the count.
pub(super) fn progress_bar(message: &'static str, total: Option<u64>) -> ProgressBar {
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
pub(super) fn open_journal(
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
) -> anyhow::Result<Journal> {
    let config = load_config(config, data_dir)?;
    Ok(Journal::open_existing(
        &config.journal_config(None)?,
        JournalOptions::default(),
    )?)
}

pub(super) fn timeline(
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
pub(super) fn session_run(
    records: &[Recorded],
    session: &SessionId,
    given: &str,
) -> anyhow::Result<RunId> {
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

pub(super) fn export(
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

pub(super) fn online(
    config: Option<PathBuf>,
    url: String,
    session: Option<&str>,
) -> anyhow::Result<Result<crate::client::Export, ExitCode>> {
    let config = load_config(config, None)?;
    let target = crate::client::Target::new(Some(url), None, &config)?;
    match crate::client::export(target, session) {
        Ok(export) => Ok(Ok(export)),
        Err(crate::client::Failure::Refused(message)) => {
            eprintln!("error: {message}");
            Ok(Err(ExitCode::from(1)))
        }
        Err(crate::client::Failure::Unreachable(error)) => Err(error),
    }
}

pub(super) fn export_online(
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

pub(super) fn verify_online(config: Option<PathBuf>, url: String) -> anyhow::Result<ExitCode> {
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

pub(super) fn import(
    input: &std::path::Path,
    data_dir: Option<PathBuf>,
    config: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    std::fs::File::open(input)
        .map_err(|error| anyhow::anyhow!("cannot read {}: {error}", input.display()))?;
    let read = || {
        std::fs::File::open(input)
            .map(std::io::BufReader::new)
            .map_err(turnstile_journal::Error::from)
    };
    let target = load_config(config, data_dir)?.journal_config(None)?;
    let mut bar: Option<(portable::ImportPhase, ProgressBar)> = None;
    let outcome = portable::import_to(&target, read, |phase, records| {
        if bar.as_ref().is_none_or(|(shown, _)| *shown != phase) {
            if let Some((_, done)) = bar.take() {
                done.finish_and_clear();
            }
            let message = match phase {
                portable::ImportPhase::Checking => "checking",
                portable::ImportPhase::Importing => "importing",
            };
            bar = Some((phase, progress_bar(message, None)));
        }
        if let Some((_, shown)) = &bar {
            shown.set_position(records);
        }
    })?;
    if let Some((_, done)) = bar.take() {
        done.finish_and_clear();
    }
    reported(outcome)
}

/// What an import says: on success the projections are folded from the events (an
/// export carries events only) into the journal imported into; a refusal names its
/// line (line 0: the export was not read at all, the target holds a journal) and says
/// when nothing was written.
pub(super) fn reported(
    outcome: Result<(portable::ImportReport, Journal), (portable::ImportRefusal, bool)>,
) -> anyhow::Result<ExitCode> {
    match outcome {
        Ok((report, journal)) => {
            turnstile_projections::rebuild::store_all(&journal)?;
            let location = journal.location();
            journal.close()?;
            println!(
                "imported {} events in {} streams into {location}",
                report.records, report.streams,
            );
            Ok(ExitCode::SUCCESS)
        }
        Err((refusal, _)) if refusal.line == 0 => {
            println!("import REFUSED: {}; nothing was written", refusal.reason);
            Ok(ExitCode::from(1))
        }
        Err((refusal, wrote)) => {
            let after = if wrote { "" } else { "; nothing was written" };
            println!("import REFUSED at {refusal}{after}");
            Ok(ExitCode::from(1))
        }
    }
}

pub(super) fn rebuild(
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let journal = open_journal(config, data_dir)?;
    let bar = progress_bar("rebuilding", Some(journal.next_pos().0));
    let report =
        turnstile_projections::rebuild::rebuild(&journal, |events| bar.set_position(events))?;
    bar.finish_and_clear();
    if report.differences.is_empty() {
        let mut matched = match report.compared {
            1 => "the 1 stored projection matches".to_owned(),
            n => format!("all {n} stored projections match"),
        };
        if report.older_layout > 0 {
            matched.push_str(&format!(
                " ({} in an older build's layout, folded again when read)",
                report.older_layout
            ));
        }
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

pub(super) fn verify(
    config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
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

/// `1 session`, `2 sessions`.
pub(super) fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
