//! A run's metrics in agno's `RunMetrics` shape: the only place that names its keys.

use serde_json::{Map, Value, json};
use turnstile_journal::{ModelMetrics, RunMetrics};

/// agno's `RunMetrics` of a completed run: totals, cost, timings, `details.model` per
/// model, and the harness's `additional_metrics` when it has any.
pub fn metrics_json(metrics: &RunMetrics) -> Value {
    let models: Vec<Value> = metrics.models.iter().map(model_json).collect();
    let mut object = json!({
        "input_tokens": metrics.input_tokens,
        "output_tokens": metrics.output_tokens,
        "total_tokens": metrics.total_tokens(),
        "cache_read_tokens": metrics.cache_read_tokens,
        "cache_write_tokens": metrics.cache_write_tokens,
        "reasoning_tokens": metrics.reasoning_tokens,
        "cost": metrics.cost_usd,
        "duration": metrics.duration_s,
        "time_to_first_token": metrics.first_token_s,
        "details": {"model": models},
    });
    if let Ok(Value::Object(additional)) = serde_json::from_str::<Value>(&metrics.additional)
        && !additional.is_empty()
    {
        object["additional_metrics"] = Value::Object(additional);
    }
    object
}

/// One entry of `details.model`.
fn model_json(model: &ModelMetrics) -> Value {
    let mut object = Map::new();
    object.insert("id".into(), model.id.clone().into());
    object.insert("provider".into(), model.provider.clone().into());
    object.insert("input_tokens".into(), model.input_tokens.into());
    object.insert("output_tokens".into(), model.output_tokens.into());
    object.insert("total_tokens".into(), model.total_tokens().into());
    object.insert("cache_read_tokens".into(), model.cache_read_tokens.into());
    object.insert("cache_write_tokens".into(), model.cache_write_tokens.into());
    object.insert("cost".into(), json!(model.cost_usd));
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_is_agnos_with_totals_and_details() {
        let metrics = RunMetrics {
            input_tokens: 120,
            output_tokens: 30,
            cache_read_tokens: 10,
            cost_usd: Some(0.5),
            duration_s: 1.5,
            first_token_s: Some(0.25),
            models: vec![ModelMetrics {
                id: "m".into(),
                provider: "p".into(),
                input_tokens: 120,
                output_tokens: 30,
                ..ModelMetrics::default()
            }],
            additional: r#"{"num_turns": 2}"#.into(),
            ..RunMetrics::default()
        };
        let json = metrics_json(&metrics);
        assert_eq!(json["total_tokens"], 150);
        assert_eq!(json["cost"], 0.5);
        assert_eq!(json["duration"], 1.5);
        assert_eq!(json["time_to_first_token"], 0.25);
        assert_eq!(json["details"]["model"][0]["total_tokens"], 150);
        assert!(json["details"]["model"][0]["cost"].is_null());
        assert_eq!(json["additional_metrics"]["num_turns"], 2);
        let bare = metrics_json(&RunMetrics::default());
        assert!(bare.get("additional_metrics").is_none(), "{bare}");
        assert!(bare["cost"].is_null() && bare["time_to_first_token"].is_null());
    }
}
