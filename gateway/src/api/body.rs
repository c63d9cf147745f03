//! Request bodies as types: the fields each POST accepts, their types and their docs.
//!
//! A handler reads its body with [`Fields::typed`](crate::api::form::Fields::typed),
//! which takes the accepted names and types from the type's derived schema: a field
//! the type does not name is a 422 naming it, and `/openapi.json` shows the same
//! schema, so what is documented is what is accepted. Fields agno 3.1.10's routes or
//! client send that turnstile has no use for are accepted and say so.

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

/// `POST /agents/{agent_id}/runs`: start a run. Form fields (what agno's client sends),
/// multipart parts (with `files` uploads) or a JSON object with the same names; an
/// empty value reads as absent.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The prompt (at most `server.max_message_bytes`, 1 MiB by default).
    pub message: String,
    /// Answer with the run's events as SSE; `false` answers the finished run as JSON.
    #[schema(default = true)]
    pub stream: Option<bool>,
    /// The session to continue; a new one when absent. One you choose has at most 128
    /// bytes of letters, digits and `. _ : -`.
    pub session_id: Option<String>,
    /// The user the run is for (at most 1 KiB).
    pub user_id: Option<String>,
    /// Put the run in the durable queue and answer at once (202, or an indexed stream).
    #[schema(default = false)]
    pub background: Option<bool>,
    /// What to do when the session already has a run in flight: `reject` (409, the
    /// default for foreground runs) or `enqueue` (FIFO behind it; always for
    /// background runs). turnstile's extension.
    #[schema(inline)]
    pub multitask_strategy: Option<MultitaskStrategy>,
    /// A JSON Schema whose root says `"type": "object"` (at most 256 KiB): the answer is
    /// structured content that validates against it.
    #[schema(value_type = Option<Object>)]
    pub output_schema: Option<Value>,
    /// Images: a JSON array of agno media objects (`url`, `filepath` is refused,
    /// `content` base64, `mime_type`, `format`, `name`).
    #[schema(value_type = Option<Vec<Object>>)]
    pub images: Option<Value>,
    /// Documents: a JSON array of agno file objects, as for `images`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub input_files: Option<Value>,
    /// Audio: a JSON array of objects; a non-empty one is refused (400) by every
    /// harness turnstile has.
    #[schema(value_type = Option<Vec<Object>>)]
    pub audio: Option<Value>,
    /// Video: as for `audio`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub videos: Option<Value>,
    /// agno: per-upload metadata. Accepted and not used.
    pub files_metadata: Option<String>,
    /// agno: the agent version. Accepted and not used (an agent has one version).
    pub version: Option<i64>,
    /// agno: factory parameters. Accepted and not used.
    pub factory_input: Option<String>,
    /// agno: session state. Accepted and not used.
    #[schema(value_type = Option<Object>)]
    pub session_state: Option<Value>,
    /// agno: dependencies. Accepted and not used.
    #[schema(value_type = Option<Object>)]
    pub dependencies: Option<Value>,
    /// agno: run metadata. Accepted and not used.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// agno: knowledge filters. Accepted and not used.
    #[schema(value_type = Option<Object>)]
    pub knowledge_filters: Option<Value>,
    /// agno: keep `output_schema` as JSON Schema. Accepted; turnstile always does.
    pub use_json_schema: Option<bool>,
    /// agno: stream intermediate events. Accepted; turnstile always streams them.
    pub stream_events: Option<bool>,
    /// agno: context switches of its own agents. Accepted and not used: a CLI
    /// harness keeps its own session history.
    pub add_history_to_context: Option<bool>,
    /// agno: as `add_history_to_context`.
    pub add_dependencies_to_context: Option<bool>,
    /// agno: as `add_history_to_context`.
    pub add_session_state_to_context: Option<bool>,
    /// agno: debug logging. Accepted and not used.
    pub debug_mode: Option<bool>,
}

/// `multitask_strategy`: what a run does when its session is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum MultitaskStrategy {
    /// Refuse with 409 `session_busy`.
    Reject,
    /// Queue behind the running turn.
    Enqueue,
}

/// `POST /agents/{agent_id}/runs/{run_id}/continue`: continue a finished run from a
/// checkpoint as a new run, or decide a paused run's calls.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ContinueRequest {
    /// The run's session, when the caller knows it (a run of another session is 404).
    pub session_id: Option<String>,
    /// `end` (the default), `last_user`, or a `message_index` from `…/checkpoints`.
    #[schema(default = "end")]
    pub continue_from: Option<String>,
    /// agno's flag for a new sibling run: turnstile always continues as a new run.
    pub fork: Option<bool>,
    /// A new user message to send after the checkpoint (at most
    /// `server.max_message_bytes`, 1 MiB by default).
    pub input: Option<String>,
    /// As for `POST …/runs`.
    #[schema(default = true)]
    pub stream: Option<bool>,
    /// As for `POST …/runs`; a background continuation queues behind a busy session.
    #[schema(default = false)]
    pub background: Option<bool>,
    /// The user the continuation is for (at most 1 KiB).
    pub user_id: Option<String>,
    /// A paused run's decisions: agno's `ToolExecution`s as JSON, each pending call with
    /// `confirmed` true or false and an optional `confirmation_note` (`[]`: none).
    pub tools: Option<String>,
    /// agno: regenerate the last answer. Accepted and not used.
    pub regenerate: Option<bool>,
    /// agno: replace the original run. Accepted and not used: a finished run is never
    /// rewritten.
    pub replace_original: Option<bool>,
    /// agno: extra instructions. Accepted and not used.
    pub additional_instructions: Option<String>,
}

/// `POST /agents/{agent_id}/runs/{run_id}/resume`: re-attach to a run's events.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    /// Send the events after this index (0-based); absent (or negative) means from the
    /// start. The `Last-Event-ID` header means the same.
    pub last_event_index: Option<i64>,
    /// The run's session, when the caller knows it (a run of another session is 404).
    pub session_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::error::ApiError;
    use crate::api::form::Fields;

    fn read<T: serde::de::DeserializeOwned + ToSchema>(
        pairs: &[(&str, &str)],
    ) -> Result<T, String> {
        Fields::from_pairs(pairs)
            .typed::<T>()
            .map_err(|error| match error {
                ApiError::Unprocessable(message) => message,
                other => panic!("not a 422: {other:?}"),
            })
    }

    #[test]
    fn a_misspelt_field_is_refused_by_name_with_the_accepted_ones_17() {
        let error = read::<RunRequest>(&[("message", "hi"), ("sesion_id", "s")]).unwrap_err();
        assert!(error.contains("unknown field \"sesion_id\""), "{error}");
        assert!(error.contains("session_id"), "{error}");
        let error = read::<ResumeRequest>(&[("last_event", "3")]).unwrap_err();
        assert!(error.contains("\"last_event\""), "{error}");
    }

    #[test]
    fn values_are_read_with_the_types_of_the_schema_17() {
        let body = read::<RunRequest>(&[
            ("message", "hi"),
            ("stream", "FALSE"),
            ("version", " 3"),
            ("multitask_strategy", "enqueue"),
            ("output_schema", r#"{"type": "object"}"#),
            ("session_id", ""),
        ])
        .unwrap();
        assert_eq!(body.message, "hi");
        assert_eq!(body.stream, Some(false));
        assert_eq!(body.version, Some(3));
        assert_eq!(body.multitask_strategy, Some(MultitaskStrategy::Enqueue));
        assert_eq!(body.output_schema.unwrap()["type"], "object");
        assert_eq!(body.session_id, None, "an empty value reads as absent");
        let body = read::<ResumeRequest>(&[("last_event_index", "-1")]).unwrap();
        assert_eq!(body.last_event_index, Some(-1));
    }

    #[test]
    fn a_value_that_does_not_parse_is_refused_naming_the_field_17() {
        for (pairs, expected) in [
            (
                vec![("stream", "yes")],
                "field \"stream\" must be true or false",
            ),
            (
                vec![("version", "two")],
                "field \"version\" must be an integer",
            ),
            (
                vec![("multitask_strategy", "later")],
                "field \"multitask_strategy\" must be one of reject, enqueue",
            ),
            (
                vec![("metadata", "{")],
                "field \"metadata\" is not valid JSON",
            ),
        ] {
            let mut pairs = pairs;
            pairs.push(("message", "hi"));
            let error = read::<RunRequest>(&pairs).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
        let error = read::<RunRequest>(&[("stream", "true")]).unwrap_err();
        assert_eq!(error, "field \"message\" is required");
        let error = read::<RunRequest>(&[("message", "")]).unwrap_err();
        assert_eq!(error, "field \"message\" is required");
    }
}
