//! Attachments of a run request: `images` and `input_files` (JSON arrays of agno's
//! media objects carrying base64 `content`) and multipart `files`.
//!
//! turnstile fetches nothing and reads no server path: a media object must carry its
//! content. Audio and video are refused (no harness takes them), like agno's external
//! agents. Names are checked here and again where files are staged.

use base64::Engine as _;
use serde_json::Value;
use turnstile_actors::uploads::{Attachment, check_name};
use turnstile_journal::limits::ATTACHMENT_BYTES_MAX;

use crate::api::error::ApiError;
use crate::api::form::Fields;

fn refused_kind(media_type: &str) -> bool {
    media_type.starts_with("audio/") || media_type.starts_with("video/")
}

fn checked(name: String, media_type: String, bytes: Vec<u8>) -> Result<Attachment, ApiError> {
    check_name(&name)
        .map_err(|error| ApiError::BadRequest(format!("attachment name refused: {error}")))?;
    if refused_kind(&media_type) {
        return Err(ApiError::BadRequest(format!(
            "Unsupported file type {media_type:?} for {name:?}: no harness takes audio or video"
        )));
    }
    if bytes.len() > ATTACHMENT_BYTES_MAX {
        return Err(ApiError::PayloadTooLarge);
    }
    Ok(Attachment {
        name,
        media_type,
        bytes,
    })
}

/// One agno media object (`Image.to_dict()`, `File.to_dict()`).
fn media(
    field: &str,
    index: usize,
    item: &Value,
    default_type: &str,
) -> Result<Attachment, ApiError> {
    let Some(object) = item.as_object() else {
        return Err(ApiError::Unprocessable(format!(
            "'{field}' items must be JSON objects"
        )));
    };
    let Some(content) = object.get("content").and_then(Value::as_str) else {
        let source = if object.contains_key("url") {
            "a url"
        } else if object.contains_key("filepath") {
            "a server path"
        } else {
            "nothing"
        };
        return Err(ApiError::BadRequest(format!(
            "'{field}' item {index} carries {source}: send its bytes as base64 `content` (turnstile fetches no URL and reads no server path)"
        )));
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(content.trim())
        .map_err(|error| {
            ApiError::Unprocessable(format!(
                "'{field}' item {index}: content is not base64: {error}"
            ))
        })?;
    let format = object.get("format").and_then(Value::as_str);
    let media_type = object
        .get("mime_type")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| format.map(|format| format!("{default_type}/{format}")))
        .unwrap_or_else(|| "application/octet-stream".to_owned());
    let name = ["filename", "name"]
        .iter()
        .find_map(|key| object.get(*key).and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| {
            let stem = object
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("{field}-{index}"));
            match format {
                Some(format) => format!("{stem}.{format}"),
                None => stem,
            }
        });
    checked(name, media_type, bytes)
}

/// Every attachment of a request; 422 for malformed JSON, 400 for refused kinds,
/// names or sources, 413 for a file over the limit.
pub fn parse(fields: &Fields) -> Result<Vec<Attachment>, ApiError> {
    let mut attachments = Vec::new();
    for (field, default_type) in [("images", "image"), ("input_files", "application")] {
        let Some(value) = fields.json(field)? else {
            continue;
        };
        let Value::Array(items) = value else {
            return Err(ApiError::Unprocessable(format!(
                "'{field}' must be a JSON array. Upload binary content via 'files'"
            )));
        };
        for (index, item) in items.iter().enumerate() {
            attachments.push(media(field, index, item, default_type)?);
        }
    }
    for (name, media_type, bytes) in &fields.uploads {
        attachments.push(checked(name.clone(), media_type.clone(), bytes.clone())?);
    }
    let mut names = std::collections::HashSet::new();
    for attachment in &attachments {
        if !names.insert(attachment.name.as_str()) {
            return Err(ApiError::BadRequest(format!(
                "two attachments are named {:?}",
                attachment.name
            )));
        }
    }
    Ok(attachments)
}
