//! The `sessions` and `runs` subcommands' requests: list, show, cancel, tail and
//! continue, each one or a few HTTP calls and their printing.

use crate::client::print::{
    RUN_HEADER, describe, or_dash, print_json, print_page, print_run, run_rows, short_text, table,
    text, time,
};
use crate::client::{Failure, TERMINAL, Target, query, typed};
use crate::wire::dto::{RunOutput, RunPage, SessionDetail, SessionPage, ToolCall};
use futures::StreamExt;
use serde_json::Value;
use std::io::Write;

/// `turnstile sessions list`.
pub async fn sessions_list(
    target: &Target,
    agent: Option<String>,
    user: Option<String>,
    limit: Option<usize>,
    page: Option<usize>,
    json: bool,
) -> Result<(), Failure> {
    let path = format!(
        "/sessions{}",
        query(&[
            ("component_id", agent),
            ("user_id", user),
            ("limit", limit.map(|n| n.to_string())),
            ("page", page.map(|n| n.to_string())),
        ])
    );
    let answer = target.get(&path).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let page: SessionPage = typed(answer)?;
    let rows: Vec<Vec<String>> = page
        .data
        .iter()
        .map(|session| {
            vec![
                session.session_id.clone(),
                session.agent_id.clone(),
                or_dash(session.user_id.as_deref()),
                session.total_tokens.to_string(),
                time(session.updated_at),
                short_text(&session.session_name, 40),
            ]
        })
        .collect();
    out!(
        "{}",
        table(
            &["SESSION", "AGENT", "USER", "TOKENS", "UPDATED", "NAME"],
            &rows
        )
    );
    print_page(&page.meta, "sessions");
    Ok(())
}

/// `turnstile sessions show ID`.
pub async fn sessions_show(target: &Target, session: &str, json: bool) -> Result<(), Failure> {
    let detail = target.get(&format!("/sessions/{session}")).await?;
    let runs = target.get(&format!("/sessions/{session}/runs")).await?;
    if json {
        print_json(&serde_json::json!({"session": detail, "runs": runs}));
        return Ok(());
    }
    let detail: SessionDetail = typed(detail)?;
    let runs: Vec<RunOutput> = typed(runs)?;
    outln!("session   {}", detail.session_id);
    outln!("agent     {}", detail.agent_id);
    outln!("user      {}", or_dash(detail.user_id.as_deref()));
    outln!("name      {}", short_text(&detail.session_name, 60));
    outln!("created   {}", time(detail.created_at));
    outln!("updated   {}", time(detail.updated_at));
    outln!("tokens    {}", detail.total_tokens);
    outln!(
        "harness   {}",
        or_dash(detail.metadata.harness_session_id.as_deref())
    );
    outln!();
    out!("{}", table(&RUN_HEADER, &run_rows(&runs)));
    Ok(())
}

/// `turnstile runs list`.
pub async fn runs_list(
    target: &Target,
    agent: Option<String>,
    session: Option<String>,
    status: Option<String>,
    limit: Option<usize>,
    page: Option<usize>,
    json: bool,
) -> Result<(), Failure> {
    let agent = target.agent_of(agent, None).await?;
    let path = format!(
        "/agents/{agent}/runs{}",
        query(&[
            ("session_id", session),
            ("status", status),
            ("limit", limit.map(|n| n.to_string())),
            ("page", page.map(|n| n.to_string())),
        ])
    );
    let answer = target.get(&path).await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let page: RunPage = typed(answer)?;
    out!("{}", table(&RUN_HEADER, &run_rows(&page.data)));
    print_page(&page.meta, &format!("runs of {agent}"));
    Ok(())
}

/// `turnstile runs show RUN`.
pub async fn runs_show(
    target: &Target,
    agent: Option<String>,
    run_id: &str,
    json: bool,
) -> Result<(), Failure> {
    let agent = target.agent_of(agent, Some(run_id)).await?;
    let run = target
        .get(&format!("/agents/{agent}/runs/{run_id}"))
        .await?;
    if json {
        print_json(&run);
    } else {
        print_run(&typed(run)?);
    }
    Ok(())
}

/// `turnstile runs cancel RUN`: says what happened (cancelled, removed from the queue,
/// already finished); an unknown run is refused.
pub async fn runs_cancel(
    target: &Target,
    agent: Option<String>,
    run_id: &str,
    json: bool,
) -> Result<(), Failure> {
    let agent = target.agent_of(agent, Some(run_id)).await?;
    let path = format!("/agents/{agent}/runs/{run_id}");
    let Some(before) = target.found(&path).await? else {
        return Err(Failure::Refused(format!("run {run_id} not found")));
    };
    let before: RunOutput = typed(before)?;
    let answer = target
        .json(target.request(reqwest::Method::POST, &format!("{path}/cancel")))
        .await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    if matches!(&*before.status, "COMPLETED" | "ERROR" | "CANCELLED") {
        outln!(
            "run {run_id} had already ended ({}): nothing to cancel",
            before.status
        );
        return Ok(());
    }
    let after: RunOutput = typed(target.get(&path).await?)?;
    match (&*before.status, &*after.status) {
        ("PENDING", "CANCELLED") => outln!("run {run_id} was queued: removed and cancelled"),
        (_, "CANCELLED") => outln!("run {run_id} cancelled"),
        (_, status) => outln!("cancel of {run_id} recorded; the run is {status}"),
    }
    Ok(())
}

/// What `turnstile runs approve|deny` decides.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Approve (else deny).
    pub confirmed: bool,
    /// The calls named (empty: every pending call).
    pub calls: Vec<String>,
    /// The note.
    pub note: Option<String>,
}

/// `turnstile runs approve|deny RUN`: decides the paused run's pending calls (all, or
/// those named) and lets it go on in the background; says what was decided.
pub async fn runs_decide(
    target: &Target,
    agent: Option<String>,
    run_id: &str,
    decision: Decision,
    json: bool,
) -> Result<(), Failure> {
    let agent = target.agent_of(agent, Some(run_id)).await?;
    let path = format!("/agents/{agent}/runs/{run_id}");
    let Some(run) = target.found(&path).await? else {
        return Err(Failure::Refused(format!("run {run_id} not found")));
    };
    let run: RunOutput = typed(run)?;
    if run.status != "PAUSED" {
        return Err(Failure::Refused(format!(
            "run {run_id} is {}, not paused: it has no call waiting for a decision",
            run.status
        )));
    }
    let pending: Vec<&ToolCall> = run
        .tools
        .iter()
        .filter(|tool| tool.requires_confirmation && tool.confirmed.is_none())
        .collect();
    if let Some(unknown) = decision
        .calls
        .iter()
        .find(|call| !pending.iter().any(|tool| &tool.tool_call_id == *call))
    {
        return Err(Failure::Refused(format!(
            "{unknown} is not a pending call of run {run_id}"
        )));
    }
    let decided: Vec<serde_json::Value> = pending
        .iter()
        .filter(|tool| decision.calls.is_empty() || decision.calls.contains(&tool.tool_call_id))
        .map(|tool| {
            serde_json::json!({
                "tool_call_id": tool.tool_call_id,
                "tool_name": tool.tool_name,
                "confirmed": decision.confirmed,
                "confirmation_note": decision.note,
            })
        })
        .collect();
    let form = [
        (
            "tools",
            serde_json::Value::Array(decided.clone()).to_string(),
        ),
        ("session_id", run.session_id.clone()),
        ("stream", "false".to_owned()),
        ("background", "true".to_owned()),
    ];
    let answer = target
        .json(
            target
                .request(reqwest::Method::POST, &format!("{path}/continue"))
                .form(&form),
        )
        .await?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let verdict = if decision.confirmed {
        "approved"
    } else {
        "denied"
    };
    for tool in &decided {
        outln!(
            "{verdict} {} ({})",
            tool["tool_call_id"].as_str().unwrap_or_default(),
            tool["tool_name"].as_str().unwrap_or_default()
        );
    }
    outln!("run {run_id} goes on");
    Ok(())
}

/// `turnstile runs tail RUN`: its events from an index on, live, until its end.
pub async fn runs_tail(
    target: &Target,
    agent: Option<String>,
    run_id: &str,
    after: Option<i64>,
    json: bool,
) -> Result<(), Failure> {
    let agent = target.agent_of(agent, Some(run_id)).await?;
    let mut form = vec![];
    if let Some(after) = after {
        form.push(("last_event_index", after.to_string()));
    }
    let request = target
        .request(
            reqwest::Method::POST,
            &format!("/agents/{agent}/runs/{run_id}/resume"),
        )
        .form(&form);
    let response = target.send(request).await?;
    let status = response.status();
    if !status.is_success() {
        let body: Value = response.json().await.unwrap_or(Value::Null);
        return Err(Failure::Refused(target.refusal(status, &body)));
    }
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|error| Failure::Unreachable(anyhow::anyhow!("the stream broke: {error}")))?;
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            let Some(data) = frame.lines().find_map(|line| line.strip_prefix("data: ")) else {
                continue;
            };
            let Ok(event) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            let kind = text(&event["event"]);
            let id = frame
                .lines()
                .find_map(|line| line.strip_prefix("id: "))
                .unwrap_or("-");
            let written = if json {
                writeln!(out, "{data}")
            } else {
                writeln!(out, "{id:>5}  {kind:<18} {}", describe(&event))
            };
            // The reader went away: nothing more to follow for.
            if written.and_then(|()| out.flush()).is_err() {
                return Ok(());
            }
            if TERMINAL.contains(&kind.as_str()) {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// `turnstile runs continue RUN`: a new run from one of its checkpoints.
pub async fn runs_continue(
    target: &Target,
    agent: Option<String>,
    run_id: &str,
    from: String,
    input: Option<String>,
    json: bool,
) -> Result<(), Failure> {
    let agent = target.agent_of(agent, Some(run_id)).await?;
    let mut form = vec![("continue_from", from), ("stream", "false".to_owned())];
    if let Some(input) = input {
        form.push(("input", input));
    }
    let run = target
        .json(
            target
                .request(
                    reqwest::Method::POST,
                    &format!("/agents/{agent}/runs/{run_id}/continue"),
                )
                .form(&form),
        )
        .await?;
    if json {
        print_json(&run);
    } else {
        print_run(&typed(run)?);
    }
    Ok(())
}
