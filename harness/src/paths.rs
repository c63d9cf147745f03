//! Paths in a harness's configuration: a CLI given as a path (not a bare name looked up
//! in `PATH`) and any other configured path are taken from where turnstile was started,
//! not from the CLI's own working directory.
//! Nothing here names a harness; every adapter's options use it.

use std::path::PathBuf;

use serde::Deserialize;

/// Reads a CLI path as [`resolve_bin`] resolves it.
pub(crate) fn deserialize_bin<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<PathBuf, D::Error> {
    String::deserialize(deserializer).map(|bin| resolve_bin(&bin))
}

/// Reads an optional path, taken from where turnstile was started when relative.
pub(crate) fn deserialize_path<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<PathBuf>, D::Error> {
    let path = Option::<PathBuf>::deserialize(deserializer)?;
    Ok(path.map(|path| std::path::absolute(&path).unwrap_or(path)))
}

/// A CLI path as configured: a path (not a bare name looked up in `PATH`) is taken
/// from where turnstile was started, not from the CLI's own cwd.
pub fn resolve_bin(bin: &str) -> PathBuf {
    if bin.contains('/') {
        std::path::absolute(bin).unwrap_or_else(|_| PathBuf::from(bin))
    } else {
        PathBuf::from(bin)
    }
}
