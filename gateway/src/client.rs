//! `turnstile sessions …` and `turnstile runs …`: a running server's sessions and runs
//! over its HTTP API, as readable tables (or `--json`, the server's own JSON).
//!
//! The server is `--url`, else the configured address (`--config`, else the default
//! `127.0.0.1:7777`); the API key is read from the configured variable
//! (`server.api_key_env`, `TURNSTILE_API_KEY` by default) when it is set. A refusal by
//! the server prints its message and exits 1; a server that cannot be reached, 2.

use std::io::Write;
use std::process::ExitCode;

use futures::StreamExt;
use serde_json::Value;

use crate::config::Config;

/// Where the server is and how to authenticate.
pub struct Target {
    base: String,
    api_key: Option<String>,
    client: reqwest::Client,
}

/// `println!` that does not panic when the reader went away (`| head`).
macro_rules! outln {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `print!`, likewise.
macro_rules! out {
    ($($arg:tt)*) => {{
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// Statuses that end a run's stream.
const TERMINAL: [&str; 3] = ["RunCompleted", "RunError", "RunCancelled"];

impl Target {
    /// From `--url` or the configuration.
    pub fn new(url: Option<String>, config: &Config) -> anyhow::Result<Target> {
        let base = match url {
            Some(url) => url,
            None => format!("http://{}", config.server.addr),
        };
        let base = base.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            anyhow::bail!("--url {base:?}: only http:// URLs are served by turnstile");
        }
        let api_key = std::env::var(&config.server.api_key_env)
            .ok()
            .filter(|key| !key.is_empty());
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()?;
        Ok(Target {
            base,
            api_key,
            client,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.client.request(method, format!("{}{path}", self.base));
        match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        request
            .send()
            .await
            .map_err(|error| anyhow::anyhow!("cannot reach the server at {}: {error}", self.base))
    }

    /// A JSON answer, or the server's refusal as an error.
    async fn json(&self, request: reqwest::RequestBuilder) -> Result<Value, Failure> {
        let response = self.send(request).await.map_err(Failure::Unreachable)?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        Err(Failure::Refused(refusal(status, &body)))
    }

    async fn get(&self, path: &str) -> Result<Value, Failure> {
        self.json(self.request(reqwest::Method::GET, path)).await
    }

    /// The agent a run belongs to: `--agent`, else the only configured agent, else the
    /// agent whose runs hold it.
    async fn agent_of(
        &self,
        agent: Option<String>,
        run_id: Option<&str>,
    ) -> Result<String, Failure> {
        if let Some(agent) = agent {
            return Ok(agent);
        }
        let agents = self.get("/agents").await?;
        let ids: Vec<String> = agents
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|agent| agent["id"].as_str().map(str::to_owned))
            .collect();
        if let [only] = ids.as_slice() {
            return Ok(only.clone());
        }
        if let Some(run_id) = run_id {
            for id in &ids {
                if self
                    .get(&format!("/agents/{id}/runs/{run_id}"))
                    .await
                    .is_ok()
                {
                    return Ok(id.clone());
                }
            }
            return Err(Failure::Refused(format!(
                "run {run_id} is not a run of any agent ({})",
                ids.join(", ")
            )));
        }
        Err(Failure::Refused(format!(
            "the server has several agents: pass --agent ({})",
            ids.join(", ")
        )))
    }
}

/// Why a command did not get its answer.
pub enum Failure {
    /// The server answered with a refusal (its message).
    Refused(String),
    /// No answer at all.
    Unreachable(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        Failure::Unreachable(error)
    }
}

/// The command's exit: 0, 1 for a refusal (printed), 2 when the server is unreachable.
pub fn exit(result: Result<(), Failure>) -> anyhow::Result<ExitCode> {
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(Failure::Refused(message)) => {
            eprintln!("error: {message}");
            Ok(ExitCode::from(1))
        }
        Err(Failure::Unreachable(error)) => Err(error),
    }
}

fn refusal(status: reqwest::StatusCode, body: &Value) -> String {
    let detail = body["detail"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| body.to_string());
    format!("{detail} (HTTP {})", status.as_u16())
}

/// Prints rows as aligned columns under a header.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.trim_end().to_owned()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.clone()));
        out.push('\n');
    }
    out
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The first line of a text, at most `max` characters.
fn short(value: &Value, max: usize) -> String {
    let text = text(value);
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max - 1).collect::<String>())
    } else {
        line.to_owned()
    }
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
fn time(value: &Value) -> String {
    let Some(seconds) = value.as_i64() else {
        return text(value);
    };
    let date = turnstile_projections::date_of_us(seconds * 1_000_000);
    let day = seconds.rem_euclid(86_400);
    format!(
        "{date} {:02}:{:02}:{:02}",
        day / 3600,
        day % 3600 / 60,
        day % 60
    )
}

fn print_json(value: &Value) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let mut url = reqwest::Url::parse("http://x/").expect("a URL");
    {
        let mut query = url.query_pairs_mut();
        for (key, value) in pairs {
            if let Some(value) = value {
                query.append_pair(key, value);
            }
        }
    }
    url.query().map(|q| format!("?{q}")).unwrap_or_default()
}

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
    let rows: Vec<Vec<String>> = answer["data"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|session| {
            vec![
                text(&session["session_id"]),
                text(&session["agent_id"]),
                text(&session["user_id"]),
                text(&session["total_tokens"]),
                time(&session["updated_at"]),
                short(&session["session_name"], 40),
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
    print_page(&answer["meta"], "sessions");
    Ok(())
}

/// The line under a paginated table: `page 1 of 3 (47 sessions)`.
fn print_page(meta: &Value, what: &str) {
    outln!(
        "page {} of {} ({} {what})",
        text(&meta["page"]),
        text(&meta["total_pages"]),
        text(&meta["total_count"])
    );
}

fn run_rows(runs: &[Value]) -> Vec<Vec<String>> {
    runs.iter()
        .map(|run| {
            vec![
                text(&run["run_id"]),
                text(&run["session_id"]),
                text(&run["status"]),
                time(&run["created_at"]),
                short(&run["content"], 40),
            ]
        })
        .collect()
}

const RUN_HEADER: [&str; 5] = ["RUN", "SESSION", "STATUS", "CREATED", "CONTENT"];

/// `turnstile sessions show ID`.
pub async fn sessions_show(target: &Target, session: &str, json: bool) -> Result<(), Failure> {
    let detail = target.get(&format!("/sessions/{session}")).await?;
    let runs = target.get(&format!("/sessions/{session}/runs")).await?;
    if json {
        print_json(&serde_json::json!({"session": detail, "runs": runs}));
        return Ok(());
    }
    outln!("session   {}", text(&detail["session_id"]));
    outln!("agent     {}", text(&detail["agent_id"]));
    outln!("user      {}", text(&detail["user_id"]));
    outln!("name      {}", short(&detail["session_name"], 60));
    outln!("created   {}", time(&detail["created_at"]));
    outln!("updated   {}", time(&detail["updated_at"]));
    outln!("tokens    {}", text(&detail["total_tokens"]));
    outln!(
        "harness   {}",
        text(&detail["metadata"]["harness_session_id"])
    );
    outln!();
    let runs: Vec<Value> = runs.as_array().cloned().unwrap_or_default();
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
    let runs: Vec<Value> = answer["data"].as_array().cloned().unwrap_or_default();
    out!("{}", table(&RUN_HEADER, &run_rows(&runs)));
    print_page(&answer["meta"], &format!("runs of {agent}"));
    Ok(())
}

fn print_run(run: &Value) {
    outln!("run       {}", text(&run["run_id"]));
    outln!("agent     {}", text(&run["agent_id"]));
    outln!("session   {}", text(&run["session_id"]));
    outln!("status    {}", text(&run["status"]));
    outln!("created   {}", time(&run["created_at"]));
    if let Some(error) = run["metadata"]["error_type"].as_str() {
        outln!("error     {error}");
    }
    if !run["forked_from_run_id"].is_null() {
        outln!(
            "forked    from {} at message {}",
            text(&run["forked_from_run_id"]),
            text(&run["forked_from_message_index"])
        );
    }
    let tools = run["tools"].as_array().map_or(0, Vec::len);
    outln!("tools     {tools}");
    outln!("tokens    {}", text(&run["metrics"]["total_tokens"]));
    outln!("content   {}", text(&run["content"]));
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
        print_run(&run);
    }
    Ok(())
}

/// `turnstile runs cancel RUN`.
pub async fn runs_cancel(
    target: &Target,
    agent: Option<String>,
    run_id: &str,
    json: bool,
) -> Result<(), Failure> {
    let agent = target.agent_of(agent, Some(run_id)).await?;
    let answer = target
        .json(target.request(
            reqwest::Method::POST,
            &format!("/agents/{agent}/runs/{run_id}/cancel"),
        ))
        .await?;
    if json {
        print_json(&answer);
    } else {
        outln!("cancel of {run_id} recorded (a finished run is left as it is)");
    }
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
        return Err(Failure::Refused(refusal(status, &body)));
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

/// One event as a person reads it.
fn describe(event: &Value) -> String {
    let tool = &event["tool"];
    match event["event"].as_str().unwrap_or_default() {
        "ToolCallStarted" => format!("{} {}", text(&tool["tool_name"]), text(&tool["tool_args"])),
        "ToolCallCompleted" => format!(
            "{}{} -> {}",
            text(&tool["tool_name"]),
            if tool["tool_call_error"] == Value::Bool(true) {
                " (error)"
            } else {
                ""
            },
            short(&tool["result"], 60)
        ),
        "RunError" => format!(
            "{}: {}",
            text(&event["error_type"]),
            short(&event["content"], 80)
        ),
        "CustomEvent" => event["warning"].to_string(),
        "RunStarted" => format!("model {}", text(&event["model"])),
        _ if event.get("status").is_some() => format!(
            "{} {}",
            text(&event["status"]),
            event.get("total_events").map(text).unwrap_or_default()
        ),
        _ => short(&event["content"], 80),
    }
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
        print_run(&run);
    }
    Ok(())
}

/// A running server's export (`GET /journal/export`) as a blocking reader, for the
/// audit commands; with the position it is as of.
pub struct Export {
    /// Records before this position are in it.
    pub as_of: u64,
    chunks: std::sync::mpsc::Receiver<Result<bytes::Bytes, String>>,
    current: bytes::Bytes,
}

impl std::io::Read for Export {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.recv() {
                Ok(Ok(chunk)) => self.current = chunk,
                Ok(Err(error)) => return Err(std::io::Error::other(error)),
                // The stream ended.
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

/// Starts downloading the export; a refusal is [`Failure::Refused`].
pub fn export(target: Target, session: Option<&str>) -> Result<Export, Failure> {
    let path = format!(
        "/journal/export{}",
        query(&[("session_id", session.map(str::to_owned))])
    );
    let (head, started) = std::sync::mpsc::sync_channel::<Result<u64, Failure>>(1);
    let (chunks, received) = std::sync::mpsc::sync_channel(4);
    std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                let _ = head.send(Err(Failure::Unreachable(error.into())));
                return;
            }
        };
        runtime.block_on(async move {
            let response = match target
                .send(target.request(reqwest::Method::GET, &path))
                .await
            {
                Ok(response) => response,
                Err(error) => {
                    let _ = head.send(Err(Failure::Unreachable(error)));
                    return;
                }
            };
            let status = response.status();
            if !status.is_success() {
                let body: Value = response.json().await.unwrap_or(Value::Null);
                let _ = head.send(Err(Failure::Refused(refusal(status, &body))));
                return;
            }
            let as_of = response
                .headers()
                .get(crate::api::export::AS_OF_HEADER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse().ok())
                .unwrap_or(0);
            let _ = head.send(Ok(as_of));
            let mut stream = response.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|error| format!("the export broke off: {error}"));
                let failed = chunk.is_err();
                if chunks.send(chunk).is_err() || failed {
                    return;
                }
            }
        });
    });
    let as_of = started
        .recv()
        .map_err(|_| Failure::Unreachable(anyhow::anyhow!("the download stopped")))??;
    Ok(Export {
        as_of,
        chunks: received,
        current: bytes::Bytes::new(),
    })
}
