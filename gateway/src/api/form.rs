//! Request bodies as named fields, whatever the encoding.
//!
//! agno's client posts `application/x-www-form-urlencoded`, browsers and curl often
//! `multipart/form-data`, and services `application/json`; all three become the same
//! field map, and typed getters turn a bad value into a 422 that names the field.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::header::CONTENT_TYPE;

use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::ToSchema;

use crate::api::error::ApiError;

/// The fields of a request body, and the files of a multipart one.
#[derive(Debug, Default)]
pub struct Fields {
    values: HashMap<String, String>,
    /// Multipart file parts named `files`: (file name, media type, bytes).
    pub uploads: Vec<(String, String, Vec<u8>)>,
}

/// Fields whose value is JSON (as text in a form, as JSON in a JSON body).
const JSON_FIELDS: [&str; 9] = [
    "output_schema",
    "images",
    "input_files",
    "audio",
    "videos",
    "metadata",
    "session_state",
    "dependencies",
    "knowledge_filters",
];

impl Fields {
    /// Reads and decodes the body of `request`.
    pub async fn read(request: Request) -> Result<Fields, ApiError> {
        let content_type = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if content_type.starts_with("multipart/form-data") {
            let mut multipart = Multipart::from_request(request, &())
                .await
                .map_err(|error| {
                    ApiError::BadRequest(format!("malformed multipart body: {error}"))
                })?;
            let mut fields = HashMap::new();
            let mut uploads = Vec::new();
            while let Some(field) = multipart.next_field().await.map_err(|error| {
                if error.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::PayloadTooLarge
                } else {
                    ApiError::BadRequest(format!("malformed multipart body: {error}"))
                }
            })? {
                let name = field.name().unwrap_or_default().to_owned();
                if let Some(file_name) = field.file_name().map(str::to_owned) {
                    if name != "files" {
                        return Err(ApiError::BadRequest(format!(
                            "file part {name:?}: upload files in parts named \"files\""
                        )));
                    }
                    let media_type = field
                        .content_type()
                        .unwrap_or("application/octet-stream")
                        .to_owned();
                    let bytes = field.bytes().await.map_err(|error| {
                        if error.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                            ApiError::PayloadTooLarge
                        } else {
                            ApiError::BadRequest(format!("file {file_name:?}: {error}"))
                        }
                    })?;
                    uploads.push((file_name, media_type, bytes.to_vec()));
                    continue;
                }
                let bytes = field
                    .bytes()
                    .await
                    .map_err(|error| ApiError::BadRequest(format!("field {name:?}: {error}")))?;
                let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
                    ApiError::Unprocessable(format!("field {name:?} is not valid UTF-8"))
                })?;
                fields.insert(name, text);
            }
            return Ok(Fields {
                values: fields,
                uploads,
            });
        }
        let body = Bytes::from_request(request, &()).await.map_err(|error| {
            if error.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge
            } else {
                ApiError::BadRequest(format!("cannot read the body: {error}"))
            }
        })?;
        if content_type.starts_with("application/json") {
            if std::str::from_utf8(&body).is_err() {
                return Err(ApiError::Unprocessable("body is not valid UTF-8".into()));
            }
            let value: serde_json::Value = serde_json::from_slice(&body).map_err(|error| {
                ApiError::Unprocessable(format!("body is not valid JSON: {error}"))
            })?;
            let serde_json::Value::Object(object) = value else {
                return Err(ApiError::Unprocessable(
                    "JSON body must be an object".into(),
                ));
            };
            let mut fields = HashMap::new();
            for (name, value) in object {
                let text = match value {
                    serde_json::Value::Null => continue,
                    serde_json::Value::String(text) => text,
                    serde_json::Value::Bool(_) | serde_json::Value::Number(_) => value.to_string(),
                    // Only the fields that carry JSON may be objects or arrays.
                    structured if JSON_FIELDS.contains(&name.as_str()) => structured.to_string(),
                    _ => {
                        return Err(ApiError::Unprocessable(format!(
                            "field {name:?} must be text, a number or a boolean"
                        )));
                    }
                };
                fields.insert(name, text);
            }
            return Ok(Fields {
                values: fields,
                uploads: Vec::new(),
            });
        }
        if content_type.is_empty() && body.is_empty() {
            return Ok(Fields::default());
        }
        if content_type.is_empty() || content_type.starts_with("application/x-www-form-urlencoded")
        {
            // `curl -d '{"message": …}'` sends JSON labelled as a form: say so, instead
            // of reading one odd field and asking for `message`.
            if body.trim_ascii_start().starts_with(b"{")
                && serde_json::from_slice::<serde_json::Value>(&body).is_ok_and(|v| v.is_object())
            {
                let label = if content_type.is_empty() {
                    "no Content-Type".to_owned()
                } else {
                    format!("Content-Type {content_type:?}")
                };
                return Err(ApiError::BadRequest(format!(
                    "the body is a JSON object sent with {label}: send it with Content-Type: application/json (accepted: application/json, application/x-www-form-urlencoded, multipart/form-data)"
                )));
            }
            let pairs: Vec<(String, String)> = form_pairs(&body)?;
            return Ok(Fields {
                values: pairs.into_iter().collect(),
                uploads: Vec::new(),
            });
        }
        Err(ApiError::BadRequest(format!(
            "unsupported content type {content_type:?}: send application/json, application/x-www-form-urlencoded or multipart/form-data"
        )))
    }

    /// The body as the request type `T`. The names and types come from `T`'s schema
    /// (the one `/openapi.json` shows): a field it does not name is a 422 naming the
    /// field and the accepted ones; a boolean, integer, enumerated or JSON field whose
    /// text does not parse is a 422 naming the field; an empty value reads as absent.
    pub fn typed<T: DeserializeOwned + ToSchema>(&self) -> Result<T, ApiError> {
        let schema = serde_json::to_value(T::schema()).unwrap_or_default();
        let no_properties = serde_json::Map::new();
        let properties = schema["properties"].as_object().unwrap_or(&no_properties);
        let mut names: Vec<&String> = self.values.keys().collect();
        names.sort();
        let mut object = serde_json::Map::new();
        for name in names {
            let Some(property) = properties.get(name.as_str()) else {
                let accepted: Vec<&str> = properties.keys().map(String::as_str).collect();
                return Err(ApiError::Unprocessable(format!(
                    "unknown field {name:?}; this route accepts {}",
                    accepted.join(", ")
                )));
            };
            let text = self.values[name].as_str();
            if text.is_empty() {
                continue;
            }
            let property = not_null(property);
            let value = match json_type(property) {
                "boolean" => Value::Bool(self.boolean(name, false)?),
                "integer" => text.trim().parse::<i64>().map(Value::from).map_err(|_| {
                    ApiError::Unprocessable(format!(
                        "field {name:?} must be an integer, got {text:?}"
                    ))
                })?,
                "string" => {
                    if let Some(allowed) = property["enum"].as_array()
                        && !allowed.iter().any(|value| value == text)
                    {
                        let allowed: Vec<&str> = allowed.iter().filter_map(Value::as_str).collect();
                        return Err(ApiError::Unprocessable(format!(
                            "field {name:?} must be one of {}, got {text:?}",
                            allowed.join(", ")
                        )));
                    }
                    Value::String(text.to_owned())
                }
                _ => self.json(name)?.unwrap_or(Value::Null),
            };
            object.insert(name.clone(), value);
        }
        for required in schema["required"].as_array().into_iter().flatten() {
            if let Some(name) = required.as_str()
                && !object.contains_key(name)
            {
                return Err(ApiError::Unprocessable(format!(
                    "field {name:?} is required"
                )));
            }
        }
        serde_json::from_value(Value::Object(object))
            .map_err(|error| ApiError::Unprocessable(format!("invalid body: {error}")))
    }

    /// Fields from (name, value) pairs, as a urlencoded body gives them.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Fields {
        Fields {
            values: pairs
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
            uploads: Vec::new(),
        }
    }

    /// A field's text, if present and not empty.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .map(String::as_str)
            .filter(|text| !text.is_empty())
    }

    /// A field's text, if present and not empty, refused (422, naming the field) when
    /// it is longer than `max` bytes.
    pub fn bounded(&self, name: &str, max: usize) -> Result<Option<&str>, ApiError> {
        match self.text(name) {
            Some(text) if text.len() > max => Err(ApiError::Unprocessable(format!(
                "field {name:?} is longer than {max} bytes"
            ))),
            text => Ok(text),
        }
    }

    /// A required field.
    pub fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.text(name)
            .ok_or_else(|| ApiError::Unprocessable(format!("field {name:?} is required")))
    }

    /// A boolean field (`true`/`false`), with its default when absent.
    pub fn boolean(&self, name: &str, default: bool) -> Result<bool, ApiError> {
        match self.text(name).map(str::to_ascii_lowercase).as_deref() {
            None => Ok(default),
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            Some(other) => Err(ApiError::Unprocessable(format!(
                "field {name:?} must be true or false, got {other:?}"
            ))),
        }
    }

    /// A field that carries JSON text; 422 when it does not parse.
    pub fn json(&self, name: &str) -> Result<Option<serde_json::Value>, ApiError> {
        self.text(name)
            .map(|text| {
                serde_json::from_str(text).map_err(|error| {
                    ApiError::Unprocessable(format!("field {name:?} is not valid JSON: {error}"))
                })
            })
            .transpose()
    }
}

/// The pairs of a urlencoded body. Invalid UTF-8, raw or percent-encoded, is refused
/// (422) rather than replaced with U+FFFD, as it is in JSON and multipart bodies.
fn form_pairs(body: &[u8]) -> Result<Vec<(String, String)>, ApiError> {
    let mut pairs = Vec::new();
    for part in body
        .split(|byte| *byte == b'&')
        .filter(|part| !part.is_empty())
    {
        let (name, value) = match part.iter().position(|byte| *byte == b'=') {
            Some(at) => (&part[..at], &part[at + 1..]),
            None => (part, &b""[..]),
        };
        let name = form_decode(name)?;
        let value = form_decode(value)
            .map_err(|_| ApiError::Unprocessable(format!("field {name:?} is not valid UTF-8")))?;
        pairs.push((name, value));
    }
    Ok(pairs)
}

/// Decodes one urlencoded name or value: `+` is a space, `%XX` a byte (a `%` without
/// two hex digits stands for itself), and the bytes must be UTF-8.
fn form_decode(text: &[u8]) -> Result<String, ApiError> {
    let spaced: Vec<u8> = text
        .iter()
        .map(|byte| if *byte == b'+' { b' ' } else { *byte })
        .collect();
    percent_encoding::percent_decode(&spaced)
        .decode_utf8()
        .map(|text| text.into_owned())
        .map_err(|_| ApiError::Unprocessable("a form field name is not valid UTF-8".into()))
}

/// The alternative of a `oneOf` that is not `null` (utoipa's form of an inlined
/// optional type), or the property itself.
fn not_null(property: &Value) -> &Value {
    property["oneOf"]
        .as_array()
        .and_then(|alternatives| {
            alternatives
                .iter()
                .find(|alternative| alternative["type"] != "null")
        })
        .unwrap_or(property)
}

/// The JSON type a property's schema names (`["boolean", "null"]` is `boolean`).
fn json_type(property: &Value) -> &str {
    match &property["type"] {
        Value::String(name) => name,
        Value::Array(names) => names
            .iter()
            .filter_map(Value::as_str)
            .find(|name| *name != "null")
            .unwrap_or("string"),
        _ => "object",
    }
}
