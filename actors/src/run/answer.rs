//! A turn's answer: checked against the run's output schema (structured output), with
//! its metrics per model, as the events that complete the run; and the fallback to a
//! fresh harness session seeded with the history when the harness session is gone.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use turnstile_harness::TurnOutcome;
use turnstile_journal::{Event, ModelMetrics, Recorded, RunEvent, RunMetrics, Warning};

use super::RunTask;

impl RunTask {
    /// Checks a structured answer against the run's schema: the parsed object and its
    /// content type (the schema's title), or the failure naming the failing path.
    pub(super) fn structured(
        &self,
        content: &str,
    ) -> Result<Option<(serde_json::Value, String)>, String> {
        let Some(schema) = &self.output_schema else {
            return Ok(None);
        };
        let value: serde_json::Value = serde_json::from_str(content.trim()).map_err(|error| {
            format!("The answer is not JSON, but the run asked for structured output: {error}")
        })?;
        let validator = jsonschema::validator_for(schema)
            .map_err(|error| format!("The output schema is invalid: {error}"))?;
        if let Err(error) = validator.validate(&value) {
            let path = error.instance_path().to_string();
            let path = if path.is_empty() {
                "/".to_owned()
            } else {
                path
            };
            return Err(format!(
                "The answer does not match the output schema at {path}: {error}"
            ));
        }
        let title = schema["title"].as_str().unwrap_or("dict").to_owned();
        Ok(Some((value, title)))
    }

    pub(super) fn completed(
        &mut self,
        outcome: TurnOutcome,
        started: Instant,
        first_token: Option<f64>,
    ) -> Vec<Event> {
        let (content, content_type) = match self.structured(&outcome.content) {
            Err(message) => return self.failed("output_validation", &message, false),
            Ok(Some((value, title))) => (value.to_string(), title),
            Ok(None) => (outcome.content.clone(), "str".to_owned()),
        };
        let usage = &outcome.usage;
        let models = if usage.models.is_empty() {
            vec![ModelMetrics {
                id: self.model.0.clone(),
                provider: self.model.1.clone(),
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_read_tokens: usage.cache_read_tokens,
                cache_write_tokens: usage.cache_write_tokens,
                cost_usd: usage.cost_usd,
            }]
        } else {
            usage.models.clone()
        };
        let metrics = RunMetrics {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            cache_write_tokens: usage.cache_write_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            cost_usd: usage.cost_usd,
            duration_s: started.elapsed().as_secs_f64(),
            first_token_s: first_token,
            models,
            additional: if usage.additional.is_empty() {
                String::new()
            } else {
                Value::Object(usage.additional.clone()).to_string()
            },
        };
        let index = self.take_index();
        // The answer and metrics once, on the run event; `RunCompleted` ends the run.
        vec![
            self.identity.emitted(
                index,
                RunEvent::Completed {
                    content,
                    content_type,
                    metrics,
                },
            ),
            Event::RunCompleted {
                run_id: self.identity.run_id.clone(),
            },
        ]
    }

    /// The harness session is gone: the turn goes on a fresh one seeded with the
    /// history (`None`), after a warning; the events that end the run if the warning
    /// cannot be journaled.
    pub(super) async fn fall_back(
        &mut self,
        error: String,
        records: &mut Vec<Arc<Recorded>>,
    ) -> Option<Vec<Event>> {
        let warning = RunEvent::Warning {
            warning: Warning::SessionFallback { error },
        };
        let index = self.take_index();
        let event = self.identity.emitted(index, warning);
        if let Err(error) = self.append(vec![event], records).await {
            return Some(self.failed("journal_error", &error, false));
        }
        self.request.harness_session_id = None;
        self.request.transcript.clear();
        self.request.message = self
            .fallback_prompt
            .take()
            .map(|render| render())
            .unwrap_or_default();
        None
    }
}
