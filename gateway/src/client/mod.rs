//! `turnstile sessions …` and `turnstile runs …`: a running server's sessions and runs
//! over its HTTP API, as readable tables (or `--json`, the server's own JSON).
//!
//! The server is `--url`, else the configured address (`--config`, else the default
//! `127.0.0.1:7777`); the credential is `--token` or `$TURNSTILE_TOKEN` (a signed token,
//! for a server in `[auth] mode = "jwt"`), else the API key of the configured variable
//! (`server.api_key_env`, `TURNSTILE_API_KEY` by default) when it is set. A refusal by
//! the server prints its message and exits 1; a server that cannot be reached, 2.

use crate::config::Config;
pub use commands::{
    Decision, runs_cancel, runs_continue, runs_decide, runs_list, runs_show, runs_tail,
    sessions_list, sessions_show,
};
use serde_json::Value;
use std::process::ExitCode;

pub use export::{Export, export};

/// Where the server is and how to authenticate.
pub struct Target {
    base: String,
    /// The bearer credential sent: the token, else the API key.
    api_key: Option<String>,
    /// Where it was read from, for the hint of a 401.
    api_key_env: String,
    /// The credential is a token (`--token` or `$TURNSTILE_TOKEN`).
    token: bool,
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

// Declared after the macros, which they use.
mod commands;
mod export;
mod print;

/// The server's answer as the type the HTTP API documents it as; a server that answers
/// otherwise is not one this CLI can drive.
fn typed<T: serde::de::DeserializeOwned>(answer: Value) -> Result<T, Failure> {
    serde_json::from_value(answer).map_err(|error| {
        Failure::Unreachable(anyhow::anyhow!(
            "the server's answer does not read as turnstile's API: {error}"
        ))
    })
}

/// Statuses that end a run's stream.
const TERMINAL: [&str; 3] = ["RunCompleted", "RunError", "RunCancelled"];

impl Target {
    /// From `--url` or the configuration, with `--token` (else `$TURNSTILE_TOKEN`, else
    /// the configured API key variable).
    pub fn new(
        url: Option<String>,
        token: Option<String>,
        config: &Config,
    ) -> anyhow::Result<Target> {
        let base = match url {
            Some(url) => url,
            None => format!("http://{}", config.server.addr),
        };
        let base = base.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            anyhow::bail!("--url {base:?}: only http:// URLs are served by turnstile");
        }
        let token = token
            .or_else(|| std::env::var("TURNSTILE_TOKEN").ok())
            .filter(|token| !token.is_empty());
        let is_token = token.is_some();
        let (api_key, api_key_env) = match token {
            Some(token) => (Some(token), "TURNSTILE_TOKEN".to_owned()),
            None => (
                std::env::var(&config.server.api_key_env)
                    .ok()
                    .filter(|key| !key.is_empty()),
                config.server.api_key_env.clone(),
            ),
        };
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()?;
        Ok(Target {
            base,
            api_key,
            api_key_env,
            token: is_token,
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

    /// The answer's status and JSON body (`null` when it has none).
    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, Value), Failure> {
        let response = self.send(request).await.map_err(Failure::Unreachable)?;
        let status = response.status();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// A JSON answer, or the server's refusal as an error.
    async fn json(&self, request: reqwest::RequestBuilder) -> Result<Value, Failure> {
        let (status, body) = self.exchange(request).await?;
        if status.is_success() {
            return Ok(body);
        }
        Err(Failure::Refused(self.refusal(status, &body)))
    }

    async fn get(&self, path: &str) -> Result<Value, Failure> {
        self.json(self.request(reqwest::Method::GET, path)).await
    }

    /// A `GET` whose `404` is an answer (`None`), not a refusal.
    async fn found(&self, path: &str) -> Result<Option<Value>, Failure> {
        let (status, body) = self
            .exchange(self.request(reqwest::Method::GET, path))
            .await?;
        match status {
            reqwest::StatusCode::NOT_FOUND => Ok(None),
            status if status.is_success() => Ok(Some(body)),
            status => Err(Failure::Refused(self.refusal(status, &body))),
        }
    }

    /// What a refusal says: the server's `detail` and status; for a `401`, where this
    /// CLI reads the key from and how to set it.
    fn refusal(&self, status: reqwest::StatusCode, body: &Value) -> String {
        let detail = body["detail"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| body.to_string());
        let mut message = format!("{detail} (HTTP {})", status.as_u16());
        if status == reqwest::StatusCode::UNAUTHORIZED && self.token {
            message.push_str(
                "\nthe token (--token or TURNSTILE_TOKEN) was refused: it may have expired, or be signed for another server",
            );
        } else if status == reqwest::StatusCode::UNAUTHORIZED {
            let variable = &self.api_key_env;
            let read = if self.api_key.is_some() {
                format!("the key in {variable} is not the server's")
            } else {
                format!("{variable} is not set")
            };
            message.push_str(&format!(
                "\n{read}: this command sends the key it finds there (`export {variable}=<the server's key>`)"
            ));
        }
        message
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
        let agents: Vec<crate::wire::dto::Agent> = typed(self.get("/agents").await?)?;
        let ids: Vec<String> = agents.into_iter().map(|agent| agent.id).collect();
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
