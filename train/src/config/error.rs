//! What can be wrong with a config, each error saying where the value came from (the file or
//! the command line), what is wrong and what is allowed.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin} is not valid TOML: {message}")]
    Syntax { origin: String, message: String },
    #[error("unknown section [{section}] in {origin}{}; the sections are: {}", suggest(suggestion, "[", "]"), valid.join(", "))]
    UnknownSection { section: String, origin: String, suggestion: Option<String>, valid: Vec<String> },
    #[error("unknown key `{key}` in section [{section}] ({origin}){}; the keys of [{section}] are: {}", suggest(suggestion, "`", "`"), valid.join(", "))]
    UnknownKey {
        key: String,
        section: String,
        origin: String,
        suggestion: Option<String>,
        valid: Vec<String>,
    },
    /// A `key = value` line above every `[section]` header: TOML puts it in no section.
    #[error("`{key}` in {origin} is outside any section (above the first [section] line){}", match owners.as_slice() {
        [] => String::new(),
        [one] => format!("; it belongs in [{one}]: move it under the [{one}] line, or write {one}.{key}=... on the command line"),
        many => format!("; it is a key of {}: move it under the one you mean", many.iter().map(|s| format!("[{s}]")).collect::<Vec<_>>().join(", ")),
    })]
    KeyOutsideSection { key: String, origin: String, owners: Vec<String> },
    #[error("`{key}` ({origin}) must be {expected}, not {got}")]
    WrongType { key: String, origin: String, expected: String, got: String },
    #[error("`{key}` = {value} is not allowed: {allowed}")]
    Invalid { key: String, value: String, allowed: String },
    #[error("command-line override `{arg}`: {reason}")]
    BadOverride { arg: String, reason: String },
}

/// "; did you mean `x`?" or nothing.
fn suggest(s: &Option<String>, open: &str, close: &str) -> String {
    match s {
        Some(s) => format!("; did you mean {open}{s}{close}?"),
        None => String::new(),
    }
}

impl ConfigError {
    pub(crate) fn invalid(
        key: &str,
        value: impl std::fmt::Display,
        allowed: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid { key: key.into(), value: value.to_string(), allowed: allowed.into() }
    }
}

/// The valid name closest to `name` (by Damerau-Levenshtein distance), when it is close
/// enough to be a likely typo: at most a third of the name's length, at least 1 edit.
pub(crate) fn nearest<'a>(name: &str, valid: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let limit = (name.chars().count() / 3).max(2);
    valid
        .into_iter()
        .map(|v| (strsim::damerau_levenshtein(name, v), v))
        .filter(|(d, v)| *d <= limit || v.starts_with(name) || name.starts_with(v))
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v.to_string())
}
