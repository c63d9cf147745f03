//! OpenTelemetry traces of every run (`[telemetry] otlp_endpoint`), exported over OTLP
//! HTTP (JSON) in batches.
//!
//! The traces are a projection of the journal: a thread of their own follows the
//! journal's live subscription (which never blocks a writer: a reader that falls
//! behind re-reads what it missed), keeps each open run's facts, and when the run ends
//! builds its spans with the journal's own times: one trace per run, a span per
//! attempt under the run's, a span per tool call under its attempt's, or under the
//! span of the call that delegated it (`parent_tool_call_id`). The SDK's batch
//! processor exports them from its own thread; when the endpoint is down it drops
//! them, and no turn waits for any of this.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use serde_json::Value;
use turnstile_journal::limits::{TELEMETRY_OPEN_RUNS_MAX, TELEMETRY_TOOLS_PER_RUN_MAX};
use turnstile_journal::{Event, Journal, Recorded, RunEvent};

/// The running exporter; [`Telemetry::shutdown`] flushes what is queued.
pub struct Telemetry {
    provider: SdkTracerProvider,
    stop: tokio_util::sync::CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The OTLP traces URL of an endpoint: a base URL (`http://host:4318`) gets
/// `/v1/traces`; a URL with a path is used as it is.
pub fn traces_url(endpoint: &str) -> String {
    let trimmed = endpoint.trim_end_matches('/');
    let path = trimmed
        .split_once("://")
        .map(|(_, rest)| rest)
        .and_then(|rest| rest.split_once('/'))
        .map(|(_, path)| path)
        .unwrap_or("");
    if path.is_empty() {
        format!("{trimmed}/v1/traces")
    } else {
        trimmed.to_owned()
    }
}

impl Telemetry {
    /// Starts following `journal` from its end, exporting to `endpoint`.
    pub fn start(journal: Journal, endpoint: &str) -> Result<Telemetry, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(traces_url(endpoint))
            .with_protocol(Protocol::HttpJson)
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|error| format!("telemetry.otlp_endpoint {endpoint:?}: {error}"))?;
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(8_192)
                    .with_scheduled_delay(Duration::from_millis(500))
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(
                Resource::builder()
                    .with_service_name("turnstile")
                    .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                    .build(),
            )
            .build();
        let stop = tokio_util::sync::CancellationToken::new();
        // From here, not from whenever the thread gets to run: a run accepted meanwhile
        // would otherwise be missed.
        let from = journal.next_pos();
        let follower = Follower {
            tracer: provider.tracer("turnstile"),
            open: HashMap::new(),
        };
        let thread = std::thread::Builder::new()
            .name("telemetry".into())
            .spawn({
                let stop = stop.clone();
                move || follow(journal, from, follower, stop)
            })
            .map_err(|error| format!("starting the telemetry thread: {error}"))?;
        Ok(Telemetry {
            provider,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops following the journal and exports what is queued (bounded by the
    /// exporter's timeout).
    pub fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "telemetry: the last traces were not exported");
        }
    }
}

fn follow(
    journal: Journal,
    from: turnstile_journal::JournalPos,
    mut follower: Follower,
    stop: tokio_util::sync::CancellationToken,
) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        tracing::warn!("telemetry: no runtime for the journal follower; traces are off");
        return;
    };
    runtime.block_on(async move {
        let mut subscription = journal.subscribe_from(from);
        loop {
            let record = tokio::select! {
                record = subscription.next() => record,
                _ = stop.cancelled() => return,
            };
            match record {
                Ok(record) => follower.apply(&record),
                Err(error) => {
                    tracing::debug!(%error, "telemetry: the journal closed");
                    return;
                }
            }
        }
    });
}

struct Attempt {
    number: u32,
    start_us: i64,
    end_us: Option<i64>,
    harness_session_id: String,
    error: Option<String>,
}

struct Tool {
    id: String,
    name: String,
    parent: Option<String>,
    attempt: u32,
    start_us: i64,
    end_us: Option<i64>,
    error: bool,
}

#[derive(Default)]
struct OpenRun {
    session_id: String,
    agent_id: String,
    user_id: Option<String>,
    queued_us: i64,
    started_us: Option<i64>,
    model: String,
    provider: String,
    attempts: Vec<Attempt>,
    tools: Vec<Tool>,
    usage: Option<Value>,
    forked_from: Option<String>,
}

struct Follower {
    tracer: opentelemetry_sdk::trace::SdkTracer,
    open: HashMap<String, OpenRun>,
}

fn at(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

impl Follower {
    fn apply(&mut self, record: &Recorded) {
        let ts = record.ts_us;
        match &record.event {
            Event::RunQueued {
                run_id,
                agent_id,
                user_id,
                ..
            } => {
                if self.open.len() >= TELEMETRY_OPEN_RUNS_MAX
                    && let Some(oldest) = self
                        .open
                        .iter()
                        .min_by_key(|(_, run)| run.queued_us)
                        .map(|(id, _)| id.clone())
                {
                    self.open.remove(&oldest);
                }
                self.open.insert(
                    run_id.to_string(),
                    OpenRun {
                        session_id: record.session_id.to_string(),
                        agent_id: agent_id.clone(),
                        user_id: user_id.clone(),
                        queued_us: ts,
                        ..OpenRun::default()
                    },
                );
            }
            Event::RunStarted {
                run_id,
                model,
                model_provider,
            } => {
                // A run queued before the follower began (recovered at start-up, or
                // queued while it started) is traced from its start.
                let run = self
                    .open
                    .entry(run_id.to_string())
                    .or_insert_with(|| OpenRun {
                        session_id: record.session_id.to_string(),
                        queued_us: ts,
                        ..OpenRun::default()
                    });
                run.started_us = Some(ts);
                run.model = model.clone();
                run.provider = model_provider.clone();
            }
            Event::HarnessSessionForked {
                run_id,
                from_run_id,
                ..
            } => {
                if let Some(run) = self.open.get_mut(&run_id.to_string()) {
                    run.forked_from = Some(from_run_id.to_string());
                }
            }
            Event::AttemptStarted {
                run_id,
                attempt,
                harness_session_id,
            } => {
                if let Some(run) = self.open.get_mut(&run_id.to_string()) {
                    if let Some(open) = run.attempts.last_mut().filter(|a| a.end_us.is_none()) {
                        open.end_us = Some(ts);
                    }
                    run.attempts.push(Attempt {
                        number: *attempt,
                        start_us: ts,
                        end_us: None,
                        harness_session_id: harness_session_id.clone(),
                        error: None,
                    });
                }
            }
            Event::AttemptFailed {
                run_id,
                attempt,
                error_type,
                ..
            } => {
                if let Some(run) = self.open.get_mut(&run_id.to_string())
                    && let Some(failed) =
                        run.attempts.iter_mut().rev().find(|a| a.number == *attempt)
                {
                    failed.end_us = Some(ts);
                    failed.error = Some(error_type.clone());
                }
            }
            Event::RunEventEmitted { run_id, event, .. } => {
                let Some(run) = self.open.get_mut(&run_id.to_string()) else {
                    return;
                };
                let attempt = run.attempts.last().map_or(1, |a| a.number);
                match event {
                    RunEvent::ToolCallStarted { tool }
                        if run.tools.len() < TELEMETRY_TOOLS_PER_RUN_MAX =>
                    {
                        run.tools.push(Tool {
                            id: tool.tool_call_id.clone(),
                            name: tool.tool_name.clone(),
                            parent: tool.parent_tool_call_id.clone(),
                            attempt,
                            start_us: ts,
                            end_us: None,
                            error: false,
                        });
                    }
                    RunEvent::ToolCallCompleted { tool } => {
                        if let Some(known) = run
                            .tools
                            .iter_mut()
                            .rev()
                            .find(|known| known.id == tool.tool_call_id)
                        {
                            known.end_us = Some(ts);
                            known.error = tool.tool_call_error;
                        }
                    }
                    RunEvent::Completed { metrics, .. } => {
                        run.usage = Some(crate::wire::metrics::metrics_json(metrics));
                    }
                    _ => {}
                }
            }
            Event::RunCompleted { run_id, .. } => {
                self.end(run_id.to_string(), ts, "COMPLETED", None)
            }
            Event::RunFailed {
                run_id,
                error_type,
                message,
                ..
            } => self.end(
                run_id.to_string(),
                ts,
                "ERROR",
                Some((error_type.clone(), message.clone())),
            ),
            Event::RunCancelled { run_id, .. } => {
                self.end(run_id.to_string(), ts, "CANCELLED", None)
            }
            _ => {}
        }
    }

    /// The run's spans, from its facts, with the journal's times.
    fn end(&mut self, run_id: String, end_us: i64, status: &str, error: Option<(String, String)>) {
        let Some(run) = self.open.remove(&run_id) else {
            return;
        };
        let tracer = &self.tracer;
        let attributes = run_attributes(&run_id, &run, status, error.as_ref());
        let mut span = tracer
            .span_builder("run")
            .with_kind(SpanKind::Internal)
            .with_start_time(at(run.started_us.unwrap_or(run.queued_us)))
            .with_attributes(attributes)
            .start(tracer);
        if let Some((_, message)) = &error {
            span.set_status(Status::error(message.clone()));
        }
        let run_cx = Context::new().with_span(span);
        let mut attempt_cx: HashMap<u32, Context> = HashMap::new();
        for attempt in &run.attempts {
            let mut span = tracer
                .span_builder(format!("attempt {}", attempt.number))
                .with_start_time(at(attempt.start_us))
                .with_attributes(vec![
                    KeyValue::new("turnstile.run_id", run_id.clone()),
                    KeyValue::new("turnstile.attempt", i64::from(attempt.number)),
                    KeyValue::new(
                        "turnstile.harness_session_id",
                        attempt.harness_session_id.clone(),
                    ),
                ])
                .start_with_context(tracer, &run_cx);
            if let Some(class) = &attempt.error {
                span.set_attribute(KeyValue::new("error.type", class.clone()));
                span.set_status(Status::error(class.clone()));
            }
            attempt_cx.insert(attempt.number, run_cx.with_span(span));
        }
        // Tools start in order, so a delegating call's span exists before its children's.
        let mut tool_cx: HashMap<&str, Context> = HashMap::new();
        for tool in &run.tools {
            let parent = tool
                .parent
                .as_deref()
                .and_then(|parent| tool_cx.get(parent))
                .or_else(|| attempt_cx.get(&tool.attempt))
                .unwrap_or(&run_cx)
                .clone();
            let mut span = tracer
                .span_builder(format!("tool {}", tool.name))
                .with_start_time(at(tool.start_us))
                .with_attributes(vec![
                    KeyValue::new("turnstile.run_id", run_id.clone()),
                    KeyValue::new("gen_ai.tool.name", tool.name.clone()),
                    KeyValue::new("gen_ai.tool.call.id", tool.id.clone()),
                    KeyValue::new("turnstile.tool.error", tool.error),
                ])
                .start_with_context(tracer, &parent);
            if tool.error {
                span.set_status(Status::error("the tool call failed"));
            }
            tool_cx.insert(&tool.id, parent.with_span(span));
        }
        for tool in run.tools.iter().rev() {
            if let Some(cx) = tool_cx.get(tool.id.as_str()) {
                cx.span()
                    .end_with_timestamp(at(tool.end_us.unwrap_or(end_us)));
            }
        }
        for attempt in &run.attempts {
            if let Some(cx) = attempt_cx.get(&attempt.number) {
                cx.span()
                    .end_with_timestamp(at(attempt.end_us.unwrap_or(end_us)));
            }
        }
        run_cx.span().end_with_timestamp(at(end_us));
    }
}

/// A run span's attributes: its identity, status, model, usage and error class.
fn run_attributes(
    run_id: &str,
    run: &OpenRun,
    status: &str,
    error: Option<&(String, String)>,
) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("turnstile.run_id", run_id.to_owned()),
        KeyValue::new("turnstile.session_id", run.session_id.clone()),
        KeyValue::new("turnstile.agent_id", run.agent_id.clone()),
        KeyValue::new("turnstile.status", status.to_owned()),
        KeyValue::new("turnstile.attempts", run.attempts.len() as i64),
        KeyValue::new("gen_ai.request.model", run.model.clone()),
        KeyValue::new("gen_ai.provider.name", run.provider.clone()),
    ];
    if let Some(user) = &run.user_id {
        attributes.push(KeyValue::new("turnstile.user_id", user.clone()));
    }
    if let Some(from) = &run.forked_from {
        attributes.push(KeyValue::new("turnstile.forked_from_run_id", from.clone()));
    }
    if let Some(usage) = &run.usage {
        for (key, name) in [
            ("input_tokens", "gen_ai.usage.input_tokens"),
            ("output_tokens", "gen_ai.usage.output_tokens"),
            ("cache_read_tokens", "gen_ai.usage.cache_read_tokens"),
            ("total_tokens", "turnstile.usage.total_tokens"),
        ] {
            if let Some(value) = usage[key].as_i64() {
                attributes.push(KeyValue::new(name, value));
            }
        }
        if let Some(cost) = usage["cost"].as_f64() {
            attributes.push(KeyValue::new("turnstile.usage.cost_usd", cost));
        }
    }
    if let Some((class, _)) = error {
        attributes.push(KeyValue::new("error.type", class.clone()));
    }
    attributes
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn a_base_url_gets_the_traces_path() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://127.0.0.1:4318/"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/custom/traces"),
            "http://collector:4318/custom/traces"
        );
    }
}
