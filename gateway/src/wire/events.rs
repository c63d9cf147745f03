//! agno's run events: the journal's typed run events rendered in agno 3.1.10's shape
//! (`RunStarted`, `RunContent`, `ToolCallStarted`, `ToolCallCompleted`, `CustomEvent`,
//! `RunCompleted`, `RunError`, `RunCancelled`). Only the gateway knows this JSON.
//!
//! Each event is one `Object`: written straight to text for a stream (no
//! `serde_json::Value` built per event), or made a `Value` where an answer embeds it.
//! Both print the same bytes, keys sorted as serde_json's own map sorts them.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;
use turnstile_actors::WireEvent;
use turnstile_journal::{RunEvent, ToolCall, Warning};

/// Who a run's events are about: the fields every agno event carries.
#[derive(Debug, Clone)]
pub struct Who {
    /// The agent.
    pub agent_id: String,
    /// Its name.
    pub agent_name: String,
    /// The session.
    pub session_id: String,
}

/// One value of an event's JSON.
enum Field<'a> {
    Str(&'a str),
    OptStr(Option<&'a str>),
    Int(i64),
    Count(u64),
    Float(f64),
    Bool(bool),
    Strs(&'a [String]),
    Json(Value),
    Object(Object<'a>),
}

impl Serialize for Field<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Field::Str(text) => serializer.serialize_str(text),
            Field::OptStr(text) => text.serialize(serializer),
            Field::Int(number) => serializer.serialize_i64(*number),
            Field::Count(number) => serializer.serialize_u64(*number),
            Field::Float(number) => number.serialize(serializer),
            Field::Bool(flag) => serializer.serialize_bool(*flag),
            Field::Strs(texts) => texts.serialize(serializer),
            Field::Json(value) => value.serialize(serializer),
            Field::Object(object) => object.serialize(serializer),
        }
    }
}

/// A JSON object whose keys are kept sorted, the order in which serde_json prints a
/// `Value` object (its map is a `BTreeMap`): so writing an `Object` to text gives the
/// same bytes as building its `Value` and printing that.
struct Object<'a>(Vec<(&'static str, Field<'a>)>);

impl<'a> Object<'a> {
    fn new(mut fields: Vec<(&'static str, Field<'a>)>) -> Self {
        fields.sort_unstable_by_key(|(key, _)| *key);
        debug_assert!(fields.windows(2).all(|pair| pair[0].0 != pair[1].0));
        Object(fields)
    }

    /// Adds a key, keeping the order.
    fn insert(&mut self, key: &'static str, value: Field<'a>) {
        let at = self.0.partition_point(|(existing, _)| *existing < key);
        self.0.insert(at, (key, value));
    }

    fn into_value(self) -> Value {
        // A map of string keys always converts.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Serialize for Object<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// JSON text as its value; text that does not parse is `null`.
fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

fn tool_object(tool: &ToolCall) -> Object<'_> {
    Object::new(vec![
        ("tool_call_id", Field::Str(&tool.tool_call_id)),
        ("tool_name", Field::Str(&tool.tool_name)),
        ("tool_args", Field::Json(parsed(&tool.tool_args))),
        ("result", Field::OptStr(tool.result.as_deref())),
        ("tool_call_error", Field::Bool(tool.tool_call_error)),
        (
            "parent_tool_call_id",
            Field::OptStr(tool.parent_tool_call_id.as_deref()),
        ),
    ])
}

/// agno's `ToolExecution`.
pub fn tool_json(tool: &ToolCall) -> Value {
    tool_object(tool).into_value()
}

/// agno's `ToolExecution` of a call that waits for a person's decision.
fn pending_object(tool: &ToolCall) -> Object<'_> {
    let mut object = tool_object(tool);
    object.insert("requires_confirmation", Field::Bool(true));
    object.insert("confirmed", Field::Json(Value::Null));
    object
}

/// agno's `RunRequirement` of a paused call (its id is the call's: stable on every
/// read and replica), as `RunRequirement.to_dict` writes it.
pub fn requirement_json(tool: &ToolCall, paused_at_us: i64) -> Value {
    Object::new(vec![
        ("id", Field::Str(&tool.tool_call_id)),
        (
            "created_at",
            Field::Json(Value::String(super::iso_of_us(paused_at_us))),
        ),
        ("tool_execution", Field::Object(pending_object(tool))),
    ])
    .into_value()
}

fn warning_object(warning: &Warning) -> Object<'_> {
    match warning {
        Warning::Retry {
            attempt,
            attempts,
            delay_s,
            error_type,
            message,
        } => Object::new(vec![
            ("type", Field::Str("retry")),
            ("attempt", Field::Count(u64::from(*attempt))),
            ("attempts", Field::Count(u64::from(*attempts))),
            ("delay", Field::Float(*delay_s)),
            ("error_type", Field::Str(error_type)),
            ("message", Field::Str(message)),
        ]),
        Warning::SessionFallback { error } => Object::new(vec![
            ("type", Field::Str("session_fallback")),
            (
                "message",
                Field::Str(
                    "The harness session could not be resumed; the turn ran on a fresh session seeded with the conversation history.",
                ),
            ),
            ("error", Field::Str(error)),
        ]),
        Warning::AttachmentsChanged { files } => Object::new(vec![
            ("type", Field::Str("attachments_changed")),
            (
                "message",
                Field::Str(
                    "Kept attachments were changed in the workspace since they were attached; the workspace's versions were left as they are.",
                ),
            ),
            ("files", Field::Strs(files)),
        ]),
        Warning::WorkspaceOverLimit { left_out } => Object::new(vec![
            ("type", Field::Str("workspace_over_limit")),
            (
                "message",
                Field::Str(
                    "Files of the session's workspace were left out of its snapshot (over a workspace_max_* bound); the run goes on, and a restore leaves them as they are.",
                ),
            ),
            (
                "left_out",
                Field::Json(Value::Array(
                    left_out
                        .iter()
                        .map(|(path, bound)| serde_json::json!({"path": path, "bound": bound}))
                        .collect(),
                )),
            ),
        ]),
        Warning::UsageLimit {
            resets_at_us,
            attempt,
            message,
        } => Object::new(vec![
            ("type", Field::Str("usage_limit")),
            (
                "resets_at",
                Field::Json(Value::String(super::iso_of_us(*resets_at_us))),
            ),
            ("attempt", Field::Count(u64::from(*attempt))),
            ("message", Field::Str(message)),
        ]),
    }
}

/// A warning as agno's `CustomEvent` and `metadata.warnings` show it.
pub fn warning_json(warning: &Warning) -> Value {
    warning_object(warning).into_value()
}

/// Structured output is the parsed object; text is text.
pub fn content_json(content: &str, content_type: &str) -> Value {
    match content_type {
        "str" => Value::String(content.to_owned()),
        _ => serde_json::from_str(content).unwrap_or_else(|_| Value::String(content.to_owned())),
    }
}

/// agno's name of an event.
pub fn event_type(event: &RunEvent) -> &'static str {
    match event {
        RunEvent::Started { .. } => "RunStarted",
        RunEvent::ContentDelta { .. } | RunEvent::ReasoningDelta { .. } => "RunContent",
        RunEvent::ToolCallStarted { .. } => "ToolCallStarted",
        RunEvent::ToolCallCompleted { .. } => "ToolCallCompleted",
        RunEvent::Warning { .. } => "CustomEvent",
        RunEvent::Completed { .. } => "RunCompleted",
        RunEvent::Failed { .. } => "RunError",
        RunEvent::Cancelled { .. } => "RunCancelled",
        RunEvent::Paused { .. } => "RunPaused",
        RunEvent::Continued { .. } => "RunContinued",
    }
}

/// `RunPaused`'s own fields: the calls that wait, and a requirement each.
fn paused_fields(tools: &[ToolCall], paused_at_us: i64) -> [(&'static str, Field<'_>); 2] {
    let pending = tools
        .iter()
        .map(|tool| pending_object(tool).into_value())
        .collect();
    let requirements = tools
        .iter()
        .map(|tool| requirement_json(tool, paused_at_us))
        .collect();
    [
        ("tools", Field::Json(Value::Array(pending))),
        ("requirements", Field::Json(Value::Array(requirements))),
    ]
}

/// agno's event object: the common fields, then the type's own.
fn event_object<'a>(event: &'a WireEvent, who: &'a Who) -> Object<'a> {
    let mut fields = vec![
        ("created_at", Field::Int(event.ts_us.div_euclid(1_000_000))),
        ("event", Field::Str(event_type(&event.event))),
        ("agent_id", Field::Str(&who.agent_id)),
        ("agent_name", Field::Str(&who.agent_name)),
        ("run_id", Field::Str(event.run_id.as_str())),
        ("session_id", Field::Str(&who.session_id)),
    ];
    match &event.event {
        RunEvent::Started {
            model,
            model_provider,
        } => fields.extend([
            ("model", Field::Str(model)),
            ("model_provider", Field::Str(model_provider)),
        ]),
        RunEvent::ContentDelta { text } => fields.extend([
            ("content", Field::Str(text)),
            ("content_type", Field::Str("str")),
        ]),
        // As agno shows reasoning: a `RunContent` with empty content.
        RunEvent::ReasoningDelta { text } => fields.extend([
            ("content", Field::Str("")),
            ("reasoning_content", Field::Str(text)),
            ("content_type", Field::Str("str")),
        ]),
        RunEvent::ToolCallStarted { tool } | RunEvent::ToolCallCompleted { tool } => {
            fields.push(("tool", Field::Object(tool_object(tool))));
        }
        RunEvent::Warning { warning } => {
            fields.push(("warning", Field::Object(warning_object(warning))));
        }
        RunEvent::Completed {
            content,
            content_type,
            metrics,
        } => fields.extend([
            ("content", Field::Json(content_json(content, content_type))),
            ("content_type", Field::Str(content_type)),
            (
                "metrics",
                Field::Json(crate::wire::metrics::metrics_json(metrics)),
            ),
        ]),
        RunEvent::Failed {
            error_type,
            message,
        } => fields.extend([
            ("content", Field::Str(message)),
            ("error_type", Field::Str(error_type)),
        ]),
        RunEvent::Cancelled { reason } => fields.extend([
            ("reason", Field::Str(reason)),
            ("content", Field::Str(reason)),
        ]),
        RunEvent::Paused { tools } => fields.extend(paused_fields(tools, event.ts_us)),
        // agno's `RunContinued` carries only the common fields.
        RunEvent::Continued { .. } => {}
    }
    Object::new(fields)
}

/// agno's event object, as a value (for answers that embed events).
pub fn render(event: &WireEvent, who: &Who) -> (&'static str, Value) {
    (
        event_type(&event.event),
        event_object(event, who).into_value(),
    )
}

/// agno's event object as compact JSON appended to `out`, with `event_index` added for
/// re-attachable streams: what printing [`render`]'s value (plus that key) would give.
pub fn write(out: &mut Vec<u8>, event: &WireEvent, who: &Who, with_index: bool) {
    let mut object = event_object(event, who);
    if with_index {
        object.insert("event_index", Field::Count(event.event_index.0));
    }
    // Writing to a `Vec` fails only on a key that is not a string; every key here is one.
    let _ = serde_json::to_writer(out, &object);
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_journal::{EventIndex, RunId};
    fn tool(result: Option<&str>) -> ToolCall {
        ToolCall {
            tool_call_id: "toolu_1".into(),
            tool_name: "Read".into(),
            tool_args: r#"{ "path": "a\"b.rs", "limit": 3, "flags": {"z": 1, "a": [1, 2.5]} }"#
                .into(),
            result: result.map(str::to_owned),
            tool_call_error: result.is_none(),
            parent_tool_call_id: result.map(|_| "toolu_0".to_owned()),
        }
    }

    fn every_event() -> Vec<RunEvent> {
        vec![
            RunEvent::Started {
                model: "m".into(),
                model_provider: "p".into(),
            },
            RunEvent::ContentDelta {
                text: "line\n\u{1}é\"".into(),
            },
            RunEvent::ReasoningDelta {
                text: "think".into(),
            },
            RunEvent::ToolCallStarted { tool: tool(None) },
            RunEvent::ToolCallCompleted {
                tool: tool(Some("ok")),
            },
            RunEvent::Warning {
                warning: Warning::Retry {
                    attempt: 1,
                    attempts: 3,
                    delay_s: 0.25,
                    error_type: "rate_limit".into(),
                    message: "slow down".into(),
                },
            },
            RunEvent::Warning {
                warning: Warning::SessionFallback {
                    error: "gone".into(),
                },
            },
            RunEvent::Warning {
                warning: Warning::AttachmentsChanged {
                    files: vec!["b.txt".into(), "a.txt".into()],
                },
            },
            RunEvent::Warning {
                warning: Warning::WorkspaceOverLimit {
                    left_out: vec![("big.bin".into(), "workspace_max_file_bytes".into())],
                },
            },
            RunEvent::Completed {
                content: r#"{"b": 1, "a": null}"#.into(),
                content_type: "Answer".into(),
                metrics: turnstile_journal::RunMetrics {
                    input_tokens: 1,
                    output_tokens: 2,
                    cost_usd: Some(0.125),
                    first_token_s: Some(0.5),
                    additional: r#"{"num_turns": 3}"#.into(),
                    ..Default::default()
                },
            },
            RunEvent::Completed {
                content: "done".into(),
                content_type: "str".into(),
                metrics: turnstile_journal::RunMetrics::default(),
            },
            RunEvent::Failed {
                error_type: "harness".into(),
                message: "boom".into(),
            },
            RunEvent::Cancelled {
                reason: "asked".into(),
            },
        ]
    }

    /// The text a stream writes is the text of the value an answer embeds, printed by
    /// serde_json: every key, in its order, every escape.
    #[test]
    fn written_events_are_their_values_printed() {
        let who = Who {
            agent_id: "scripted".into(),
            agent_name: "Scripted \"agent\"".into(),
            session_id: "s-1".into(),
        };
        for (index, event) in every_event().into_iter().enumerate() {
            let wire = WireEvent {
                run_id: RunId::new_v7(),
                event_index: EventIndex(index as u64),
                ts_us: -1_500_000 + 7_000_000 * index as i64,
                event,
            };
            let (name, mut value) = render(&wire, &who);
            assert_eq!(value["event"], name);
            let mut plain = Vec::new();
            write(&mut plain, &wire, &who, false);
            assert_eq!(String::from_utf8(plain).unwrap(), value.to_string());
            value
                .as_object_mut()
                .unwrap()
                .insert("event_index".into(), Value::from(index));
            let mut indexed = Vec::new();
            write(&mut indexed, &wire, &who, true);
            assert_eq!(String::from_utf8(indexed).unwrap(), value.to_string());
        }
    }

    /// The frame a re-attach sends most, as agno's clients read it.
    #[test]
    fn a_completed_tool_call_is_agnos_tool_call_completed() {
        let who = Who {
            agent_id: "scripted".into(),
            agent_name: "Scripted".into(),
            session_id: "s-1".into(),
        };
        let wire = WireEvent {
            run_id: RunId::parse("r-1").unwrap(),
            event_index: EventIndex(4),
            ts_us: 1_700_000_000_900_000,
            event: RunEvent::ToolCallCompleted {
                tool: tool(Some("ok")),
            },
        };
        let mut text = Vec::new();
        write(&mut text, &wire, &who, true);
        assert_eq!(
            String::from_utf8(text).unwrap(),
            concat!(
                r#"{"agent_id":"scripted","agent_name":"Scripted","created_at":1700000000,"#,
                r#""event":"ToolCallCompleted","event_index":4,"run_id":"r-1","session_id":"s-1","#,
                r#""tool":{"parent_tool_call_id":"toolu_0","result":"ok","#,
                r#""tool_args":{"flags":{"a":[1,2.5],"z":1},"limit":3,"path":"a\"b.rs"},"#,
                r#""tool_call_error":false,"tool_call_id":"toolu_1","tool_name":"Read"}}"#
            )
        );
    }
}
