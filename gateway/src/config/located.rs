//! Where a configuration error is: the line (and key) a user must fix, also for an
//! error inside an `[[agents]]` entry, which the TOML library reports at the entry's
//! header. It changes no message, only where it points.

/// A parse error told at the line it is about. An error inside an `[[agents]]` entry
/// (read through the harness table, which keeps no positions) is reported by the
/// library at the entry's header: the line of the key (or value) the message names,
/// from that header on, is the one a user must fix.
pub(super) fn located(text: &str, error: &toml::de::Error) -> String {
    let message = error.message();
    let named = message.split('`').nth(1).filter(|name| !name.is_empty());
    let (Some(span), Some(name)) = (error.span(), named) else {
        return error.to_string();
    };
    // Only an error the library put on a table's header is moved to its key's line.
    let header = text[..span.start.min(text.len())].matches('\n').count();
    if !text
        .lines()
        .nth(header)
        .is_some_and(|line| line.trim_start().starts_with('['))
    {
        return error.to_string();
    }
    let table = text
        .lines()
        .enumerate()
        .skip(header + 1)
        .take_while(|(_, line)| !line.trim_start().starts_with('['));
    let is_key = message.starts_with("unknown field") || message.starts_with("duplicate key");
    let found = table.clone().find(|(_, line)| {
        let line = line.trim_start();
        if is_key {
            line.split('=').next().is_some_and(|key| key.trim() == name)
        } else {
            line.split_once('=')
                .is_some_and(|(_, value)| value.trim().trim_matches('"') == name)
        }
    });
    match found {
        Some((index, line)) => {
            let key = line.split('=').next().unwrap_or_default().trim();
            format!(
                "line {}, key `{key}`: {message}\n  {}",
                index + 1,
                line.trim()
            )
        }
        None => error.to_string(),
    }
}
