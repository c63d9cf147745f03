//! The scripted harness's language: a message's lines parsed into a script of steps
//! (tool calls, sleeps, failures) and answers (`spec/scripted-harness.md`); an unknown
//! directive is refused naming those it knows. Parsing only: `mod.rs` plays a script.

use std::time::Duration;

use super::files::FileAction;
use crate::{ErrorKind, HarnessError};

/// One parsed directive.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    Tool {
        name: String,
        args: String,
        error: bool,
        parent: Option<String>,
        /// `/big BYTES` after it: its result is that long.
        result_bytes: Option<usize>,
        /// A file tool (`/write`, `/read`, `/rm`, `/ls`): done in the working
        /// directory, its result the tool's.
        file: Option<FileAction>,
    },
    Sleep(Duration),
    FailTransient(u32),
    FailPermanent(ErrorKind),
    /// `/fail usage_limit SECONDS`: the run's first attempt hits the usage limit,
    /// resetting then.
    FailUsageLimit(u64),
}

#[derive(Debug, Default)]
pub(super) struct Script {
    pub(super) steps: Vec<Step>,
    pub(super) reply: Option<String>,
    /// `/big BYTES`: the reply is that long.
    pub(super) big: Option<usize>,
    pub(super) json: Option<String>,
    pub(super) usage: Option<(u64, u64, u64, f64)>,
    pub(super) history: bool,
    pub(super) compact: bool,
    pub(super) lost_session: bool,
    pub(super) prose: Vec<String>,
    pub(super) has_directive: bool,
}

pub(super) fn invalid(message: String) -> HarnessError {
    HarnessError::Failed {
        kind: ErrorKind::InvalidRequest,
        message,
    }
}

/// Checks that `text` is JSON and returns it compactly.
pub(super) fn json_text(text: &str, directive: &str) -> Result<String, HarnessError> {
    let text = if text.trim().is_empty() {
        "{}"
    } else {
        text.trim()
    };
    serde_json::from_str::<serde_json::Value>(text)
        .map(|value| value.to_string())
        .map_err(|error| invalid(format!("{directive}: argument is not JSON: {error}")))
}

/// The marker before the current message in a prompt seeded with history.
pub(super) const CURRENT_MESSAGE: &str = "\n\nCurrent message:\n";

/// `/big BYTES`: a count of bytes, at most the journal's event ceiling.
pub(super) fn big_bytes(rest: &str) -> Result<usize, HarnessError> {
    let ceiling = turnstile_journal::limits::EVENT_BYTES_CEILING;
    rest.trim()
        .parse::<usize>()
        .ok()
        .filter(|bytes| *bytes <= ceiling)
        .ok_or_else(|| {
            invalid(format!(
                "/big needs a number of bytes up to {ceiling}, got {rest:?}"
            ))
        })
}

/// `bytes` bytes of plain text (a repeated phrase, cut to length).
pub(super) fn big_text(bytes: usize) -> String {
    const PHRASE: &str = "turnstile keeps every turn. ";
    let mut text = PHRASE.repeat(bytes / PHRASE.len() + 1);
    text.truncate(bytes);
    text
}

/// `/fail transient N`, `/fail permanent KIND` or `/fail usage_limit SECONDS`.
pub(super) fn fail_step(rest: &str) -> Result<Step, HarnessError> {
    let (mode, arg) = rest.split_once(' ').unwrap_or((rest, ""));
    match mode {
        "transient" => {
            let n = arg
                .trim()
                .parse()
                .map_err(|_| invalid(format!("/fail transient needs a count, got {arg:?}")))?;
            Ok(Step::FailTransient(n))
        }
        "permanent" => {
            let kind = ErrorKind::from_slug(arg.trim())
                .filter(|kind| !kind.is_retryable())
                .ok_or_else(|| invalid(format!("/fail permanent: unknown kind {arg:?}")))?;
            Ok(Step::FailPermanent(kind))
        }
        "usage_limit" => {
            let seconds = arg
                .trim()
                .parse()
                .map_err(|_| invalid(format!("/fail usage_limit needs seconds, got {arg:?}")))?;
            Ok(Step::FailUsageLimit(seconds))
        }
        _ => Err(invalid(format!(
            "/fail needs transient N, permanent KIND or usage_limit SECONDS, got {rest:?}"
        ))),
    }
}

/// `/usage IN OUT CACHE_READ COST`.
pub(super) fn usage_of(rest: &str) -> Result<(u64, u64, u64, f64), HarnessError> {
    let numbers: Vec<&str> = rest.split_whitespace().collect();
    let parsed = match numbers.as_slice() {
        [i, o, c, cost] => (|| {
            Some((
                i.parse().ok()?,
                o.parse().ok()?,
                c.parse().ok()?,
                cost.parse().ok()?,
            ))
        })(),
        _ => None,
    };
    parsed.ok_or_else(|| invalid(format!("/usage needs IN OUT CACHE_READ COST, got {rest:?}")))
}

pub(super) fn parse(message: &str) -> Result<Script, HarnessError> {
    let mut script = Script::default();
    // In a fresh session seeded with history, earlier messages are quoted: only the
    // current message's directives act.
    let acting_from = message
        .find(CURRENT_MESSAGE)
        .map_or(0, |at| at + CURRENT_MESSAGE.len());
    script
        .prose
        .extend(message[..acting_from].lines().map(str::to_owned));
    let before = message[..acting_from].lines().count();
    for (offset, line) in message[acting_from..].lines().enumerate() {
        let Some(directive) = line.strip_prefix('/') else {
            script.prose.push(line.to_owned());
            continue;
        };
        script.has_directive = true;
        let (name, rest) = directive.split_once(' ').unwrap_or((directive, ""));
        apply_directive(&mut script, name, rest.trim()).map_err(|error| match error {
            HarnessError::Failed { kind, message } => HarnessError::Failed {
                kind,
                message: format!("line {}: {message}", before + offset + 1),
            },
            other => other,
        })?;
    }
    Ok(script)
}

/// Every directive the scripted harness knows (`docs/CONFIG.md` documents each; an
/// unknown one is refused naming these).
pub const DIRECTIVES: [&str; 16] = [
    "reply",
    "tool",
    "tool-error",
    "subagent",
    "sleep",
    "fail",
    "json",
    "usage",
    "history",
    "lost-session",
    "big",
    "compact",
    "write",
    "read",
    "rm",
    "ls",
];

/// `/write PATH TEXT`, `/read PATH`, `/rm PATH` or `/ls`: a tool call on a file.
fn file_step(name: &str, rest: &str) -> Result<Step, HarnessError> {
    let path = rest.split(' ').next().unwrap_or_default().to_owned();
    if name != "ls" && path.is_empty() {
        return Err(invalid(format!("/{name} needs a path")));
    }
    let action = match name {
        "write" => FileAction::Write {
            text: rest
                .split_once(' ')
                .map(|(_, text)| text)
                .unwrap_or("")
                .to_owned(),
            path,
        },
        "read" => FileAction::Read { path },
        "rm" => FileAction::Remove { path },
        _ => FileAction::List,
    };
    let (tool, args) = action.tool();
    Ok(Step::Tool {
        name: tool.to_owned(),
        args,
        error: false,
        parent: None,
        result_bytes: None,
        file: Some(action),
    })
}

/// One directive of a message: what it adds to the script.
pub(super) fn apply_directive(
    script: &mut Script,
    name: &str,
    rest: &str,
) -> Result<(), HarnessError> {
    match name {
        "reply" => script.reply = Some(rest.to_owned()),
        "big" => {
            let bytes = big_bytes(rest)?;
            script.big = Some(bytes);
            if let Some(Step::Tool { result_bytes, .. }) = script.steps.last_mut() {
                *result_bytes = Some(bytes);
            }
        }
        "tool" | "tool-error" => {
            let (tool, args) = rest.split_once(' ').unwrap_or((rest, "{}"));
            if tool.is_empty() {
                return Err(invalid(format!("/{name} needs a tool name")));
            }
            script.steps.push(Step::Tool {
                name: tool.to_owned(),
                args: json_text(args, name)?,
                error: name == "tool-error",
                parent: None,
                result_bytes: None,
                file: None,
            });
        }
        "write" | "read" | "rm" | "ls" => script.steps.push(file_step(name, rest)?),
        "subagent" => {
            let mut parts = rest.splitn(3, ' ');
            let (Some(parent), Some(tool)) = (parts.next(), parts.next()) else {
                return Err(invalid("/subagent needs PARENT_ID NAME JSON".into()));
            };
            script.steps.push(Step::Tool {
                name: tool.to_owned(),
                args: json_text(parts.next().unwrap_or("{}"), name)?,
                error: false,
                parent: Some(parent.to_owned()),
                result_bytes: None,
                file: None,
            });
        }
        "sleep" => {
            let ms: u64 = rest
                .parse()
                .map_err(|_| invalid(format!("/sleep needs milliseconds, got {rest:?}")))?;
            script.steps.push(Step::Sleep(Duration::from_millis(ms)));
        }
        "fail" => script.steps.push(fail_step(rest)?),
        "json" => script.json = Some(rest.to_owned()),
        "usage" => script.usage = Some(usage_of(rest)?),
        "history" => script.history = true,
        "compact" => script.compact = true,
        "lost-session" => script.lost_session = true,
        other => {
            return Err(invalid(format!(
                "unknown directive /{other} (the scripted harness knows /{})",
                DIRECTIVES.join(", /")
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_directive_is_one_the_parser_knows() {
        for name in DIRECTIVES {
            let outcome = apply_directive(&mut Script::default(), name, "");
            if let Err(HarnessError::Failed { message, .. }) = outcome {
                assert!(!message.contains("unknown directive"), "/{name}: {message}");
            }
        }
        let Err(HarnessError::Failed { message, .. }) =
            apply_directive(&mut Script::default(), "nosuch", "")
        else {
            panic!("/nosuch was taken");
        };
        assert!(message.contains("/reply, /tool"), "{message}");
    }
}
