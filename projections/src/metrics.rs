//! Usage metrics folded from completed runs: per-model token totals, per-day counts and
//! a session's totals.

use crate::views::push_exact;
use serde::{Deserialize, Serialize};
use turnstile_journal::{ModelMetrics, RunMetrics};

/// What one session's runs of one day add to agno's daily metrics.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DayCounts {
    /// Runs created that day.
    pub runs: u64,
    /// Their user ids.
    pub users: Vec<String>,
    /// Totals of the completed ones: input, output and total tokens, cache reads, cache
    /// writes, reasoning tokens, and cost in US dollars, in this order.
    pub tokens: [f64; 7],
    /// Completed runs per (model, provider).
    pub models: Vec<(String, String, u64)>,
}

/// Token and cost totals of a session's completed runs (agno's `SessionMetrics`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SessionMetrics {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input plus output tokens.
    pub total_tokens: u64,
    /// Tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Tokens written to the prompt cache.
    pub cache_write_tokens: u64,
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
    /// Cost in US dollars, when any run reported one.
    pub cost: Option<f64>,
    /// Completed runs counted.
    pub runs: u64,
    /// Per model, the runs' `details.model` entries summed (agno's
    /// `accumulate_from_run`): `{"model": [{id, provider, input_tokens, …}]}`.
    pub details: ModelDetails,
}

/// The per-model totals of a session's runs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelDetails {
    /// One entry per model id and provider, in the order first seen.
    pub model: Vec<ModelTotals>,
}

/// One model's totals over a session's runs (an entry of agno's `details.model`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelTotals {
    /// Model id.
    pub id: String,
    /// Model provider.
    pub provider: String,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input plus output tokens.
    pub total_tokens: u64,
    /// Tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Tokens written to the prompt cache.
    pub cache_write_tokens: u64,
    /// Cost in US dollars, once some run reported one.
    pub cost: Option<f64>,
}

impl ModelDetails {
    /// Adds one run's model entry: numbers are summed, a cost only once some run had one.
    pub(crate) fn add(&mut self, entry: &ModelMetrics) {
        let position = match self
            .model
            .iter()
            .position(|total| total.id == entry.id && total.provider == entry.provider)
        {
            Some(position) => position,
            None => {
                let totals = ModelTotals {
                    id: entry.id.clone(),
                    provider: entry.provider.clone(),
                    ..ModelTotals::default()
                };
                push_exact(&mut self.model, totals);
                self.model.len() - 1
            }
        };
        let total = &mut self.model[position];
        total.input_tokens += entry.input_tokens;
        total.output_tokens += entry.output_tokens;
        total.total_tokens += entry.total_tokens();
        total.cache_read_tokens += entry.cache_read_tokens;
        total.cache_write_tokens += entry.cache_write_tokens;
        if let Some(cost) = entry.cost_usd {
            total.cost = Some(total.cost.unwrap_or(0.0) + cost);
        }
    }
}

impl SessionMetrics {
    pub(crate) fn add(&mut self, metrics: &RunMetrics) {
        self.input_tokens += metrics.input_tokens;
        self.output_tokens += metrics.output_tokens;
        self.total_tokens += metrics.total_tokens();
        self.cache_read_tokens += metrics.cache_read_tokens;
        self.cache_write_tokens += metrics.cache_write_tokens;
        self.reasoning_tokens += metrics.reasoning_tokens;
        if let Some(cost) = metrics.cost_usd {
            self.cost = Some(self.cost.unwrap_or(0.0) + cost);
        }
        for entry in &metrics.models {
            self.details.add(entry);
        }
        self.runs += 1;
    }
}

impl DayCounts {
    pub(crate) fn add_completed(&mut self, metrics: &RunMetrics, model: &str, provider: &str) {
        let added = [
            metrics.input_tokens as f64,
            metrics.output_tokens as f64,
            metrics.total_tokens() as f64,
            metrics.cache_read_tokens as f64,
            metrics.cache_write_tokens as f64,
            metrics.reasoning_tokens as f64,
            metrics.cost_usd.unwrap_or(0.0),
        ];
        for (total, added) in self.tokens.iter_mut().zip(added) {
            *total += added;
        }
        match self
            .models
            .iter_mut()
            .find(|(m, p, _)| m == model && p == provider)
        {
            Some((_, _, count)) => *count += 1,
            None => push_exact(&mut self.models, (model.to_owned(), provider.to_owned(), 1)),
        }
    }
}
