//! The `sessions` and `runs` subcommands, and `bench-baseline`: a running server driven
//! over its HTTP API (`client`).

use crate::cli::{DecideArgs, Remote, RunsCommand, SessionsCommand, load_config};
use std::process::ExitCode;

pub(super) fn remote(
    remote: &Remote,
) -> anyhow::Result<(crate::client::Target, tokio::runtime::Runtime)> {
    let config = load_config(remote.config.clone(), None)?;
    let target = crate::client::Target::new(remote.url.clone(), remote.token.clone(), &config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok((target, runtime))
}

pub(super) fn sessions(command: SessionsCommand) -> anyhow::Result<ExitCode> {
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

pub(super) fn runs(command: RunsCommand) -> anyhow::Result<ExitCode> {
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
        RunsCommand::Approve(args) => decide(args, true),
        RunsCommand::Deny(args) => decide(args, false),
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

/// `turnstile runs approve|deny`.
fn decide(args: DecideArgs, confirmed: bool) -> anyhow::Result<ExitCode> {
    let (target, runtime) = remote(&args.remote)?;
    let decision = crate::client::Decision {
        confirmed,
        calls: args.calls,
        note: args.note,
    };
    crate::client::exit(runtime.block_on(crate::client::runs_decide(
        &target,
        args.agent,
        &args.run,
        decision,
        args.remote.json,
    )))
}

pub(super) fn bench_baseline(addr: &str) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(crate::serve::serve_baseline(addr))?;
    Ok(ExitCode::SUCCESS)
}
