//! Usage metrics folded from completed runs: per-model token totals, per-day counts and
//! a session's totals.

use crate::views::push_exact;
use serde::{Deserialize, Serialize};

/// What one session's runs of one day add to agno's daily metrics.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DayCounts {
    /// Runs created that day.
    pub runs: u64,
    /// Their user ids.
    pub users: Vec<String>,
    /// Token totals of the completed ones, in [`TOKEN_KEYS`] order.
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
    /// Adds one run's entry: numbers are summed, a cost only once some run had one.
    pub(crate) fn add(&mut self, entry: &serde_json::Value) {
        let text = |key: &str| entry[key].as_str().unwrap_or_default();
        let (id, provider) = (text("id"), text("provider"));
        let position = match self
            .model
            .iter()
            .position(|total| total.id == id && total.provider == provider)
        {
            Some(position) => position,
            None => {
                let totals = ModelTotals {
                    id: id.to_owned(),
                    provider: provider.to_owned(),
                    ..ModelTotals::default()
                };
                push_exact(&mut self.model, totals);
                self.model.len() - 1
            }
        };
        let total = &mut self.model[position];
        let tokens = |key: &str| entry[key].as_u64().unwrap_or(0);
        total.input_tokens += tokens("input_tokens");
        total.output_tokens += tokens("output_tokens");
        total.total_tokens += tokens("total_tokens");
        total.cache_read_tokens += tokens("cache_read_tokens");
        total.cache_write_tokens += tokens("cache_write_tokens");
        if let Some(cost) = entry["cost"].as_f64() {
            total.cost = Some(total.cost.unwrap_or(0.0) + cost);
        }
    }
}

impl SessionMetrics {
    pub(crate) fn add(&mut self, metrics: &str) {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(metrics) else {
            return;
        };
        let tokens = |key: &str| value[key].as_u64().unwrap_or(0);
        self.input_tokens += tokens("input_tokens");
        self.output_tokens += tokens("output_tokens");
        self.total_tokens += tokens("total_tokens");
        self.cache_read_tokens += tokens("cache_read_tokens");
        self.cache_write_tokens += tokens("cache_write_tokens");
        self.reasoning_tokens += tokens("reasoning_tokens");
        if let Some(cost) = value["cost"].as_f64() {
            self.cost = Some(self.cost.unwrap_or(0.0) + cost);
        }
        for entry in value["details"]["model"].as_array().into_iter().flatten() {
            if entry.is_object() {
                self.details.add(entry);
            }
        }
        self.runs += 1;
    }
}

/// The token keys of agno's daily `token_metrics`, in the order of [`DayCounts::tokens`].
pub const TOKEN_KEYS: [&str; 7] = [
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cost",
];

impl DayCounts {
    pub(crate) fn add_completed(&mut self, metrics: &str, model: &str, provider: &str) {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(metrics) else {
            return;
        };
        for (total, key) in self.tokens.iter_mut().zip(TOKEN_KEYS) {
            *total += value[key].as_f64().unwrap_or(0.0);
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
