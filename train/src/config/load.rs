//! Reading a config: TOML text -> a table checked key by key against the defaults' table
//! (which holds every valid key with a value of its type), overrides applied and checked the
//! same way, then serde for the enums, then [`super::check`] for the values.

use super::error::{nearest, ConfigError};
use super::Config;
use std::path::Path;
use toml::{Table, Value};

pub fn load<S: AsRef<str>>(file: Option<&Path>, overrides: &[S]) -> Result<Config, ConfigError> {
    match file {
        None => from_str("", "the defaults", overrides),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::Io { path: path.to_path_buf(), source })?;
            from_str(&text, &path.display().to_string(), overrides)
        }
    }
}

pub fn from_str<S: AsRef<str>>(text: &str, origin: &str, overrides: &[S]) -> Result<Config, ConfigError> {
    let schema = schema();
    let mut table: Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Syntax {
        origin: origin.into(),
        message: e.to_string(),
    })?;
    check_table(&table, &schema, origin)?;
    for arg in overrides {
        apply_override(&mut table, &schema, arg.as_ref())?;
    }
    let config = deserialize(table)?;
    config.check()?;
    Ok(config)
}

/// Every valid key with its default: `Config::default()` as a TOML table.
fn schema() -> Table {
    match Value::try_from(Config::default()) {
        Ok(Value::Table(t)) => t,
        other => unreachable!("the default config serialises to a table, got {other:?}"),
    }
}

fn sections(schema: &Table) -> Vec<&str> {
    schema.keys().map(String::as_str).collect()
}

fn check_table(table: &Table, schema: &Table, origin: &str) -> Result<(), ConfigError> {
    for (section, body) in table {
        if !body.is_table() && !schema.contains_key(section) {
            return Err(ConfigError::KeyOutsideSection {
                key: section.clone(),
                origin: origin.into(),
                owners: owners(schema, section).into_iter().map(String::from).collect(),
            });
        }
        let Some(Value::Table(known)) = schema.get(section) else {
            return Err(unknown_section(section, schema, origin));
        };
        let Value::Table(body) = body else {
            return Err(ConfigError::WrongType {
                key: section.clone(),
                origin: origin.into(),
                expected: format!("a section ([{section}] with keys under it)"),
                got: describe(body),
            });
        };
        for (key, value) in body {
            let Some(default) = known.get(key) else {
                return Err(unknown_key(section, key, schema, origin));
            };
            check_type(&format!("{section}.{key}"), value, default, origin)?;
        }
    }
    Ok(())
}

/// The sections that have `key`.
fn owners<'a>(schema: &'a Table, key: &str) -> Vec<&'a str> {
    schema
        .iter()
        .filter(|(_, t)| t.as_table().is_some_and(|t| t.contains_key(key)))
        .map(|(s, _)| s.as_str())
        .collect()
}

fn unknown_section(section: &str, schema: &Table, origin: &str) -> ConfigError {
    ConfigError::UnknownSection {
        section: section.into(),
        origin: origin.into(),
        suggestion: nearest(section, sections(schema)),
        valid: sections(schema).iter().map(|s| format!("[{s}]")).collect(),
    }
}

fn unknown_key(section: &str, key: &str, schema: &Table, origin: &str) -> ConfigError {
    let Some(Value::Table(known)) = schema.get(section) else { unreachable!("section checked") };
    let valid: Vec<String> = known.keys().cloned().collect();
    // A key of another section is most likely in the wrong place: say where it belongs.
    let elsewhere = schema
        .iter()
        .find(|(s, t)| s.as_str() != section && t.as_table().is_some_and(|t| t.contains_key(key)))
        .map(|(s, _)| format!("{s}.{key} (it belongs in [{s}])"));
    ConfigError::UnknownKey {
        key: key.into(),
        section: section.into(),
        origin: origin.into(),
        suggestion: nearest(key, valid.iter().map(String::as_str)).or(elsewhere),
        valid,
    }
}

/// What a value is, in words, for "must be X, not Y".
fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("the string {s:?}"),
        Value::Integer(i) => format!("the integer {i}"),
        Value::Float(f) => format!("the number {f}"),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Datetime(d) => format!("the date {d}"),
        Value::Array(_) => "a list".into(),
        Value::Table(_) => "a table".into(),
    }
}

fn check_type(key: &str, value: &Value, default: &Value, origin: &str) -> Result<(), ConfigError> {
    let expected = match (default, value) {
        (Value::Integer(_), Value::Integer(i)) if *i < 0 => {
            return Err(ConfigError::invalid(key, i, "it counts something: use 0 or a positive integer"))
        }
        (Value::Integer(_), Value::Integer(_))
        | (Value::Float(_), Value::Float(_) | Value::Integer(_))
        | (Value::String(_), Value::String(_))
        | (Value::Boolean(_), Value::Boolean(_)) => return Ok(()),
        (Value::Array(_), Value::Array(a)) if a.iter().all(Value::is_str) => return Ok(()),
        (Value::Array(_), _) => "a list of strings ([\"a\", \"b\"])",
        (Value::Integer(_), _) => "a non-negative integer",
        (Value::Float(_), _) => "a number",
        (Value::String(_), _) => "a string (in quotes in a file)",
        (Value::Boolean(_), _) => "true or false",
        (d, _) => unreachable!("config key {key} has a default of unexpected type {d:?}"),
    };
    Err(ConfigError::WrongType {
        key: key.into(),
        origin: origin.into(),
        expected: expected.into(),
        got: describe(value),
    })
}

/// `section.key=value`, or `key=value` when exactly one section has that key. The value is
/// read as TOML (numbers, booleans, lists; negative numbers too) and as a string otherwise.
fn apply_override(table: &mut Table, schema: &Table, arg: &str) -> Result<(), ConfigError> {
    let bad = |reason: String| ConfigError::BadOverride { arg: arg.into(), reason };
    let Some((path, raw)) = arg.split_once('=') else {
        return Err(bad("expected key=value, for example optim.lr=0.1 or train.epochs=3".into()));
    };
    let path = path.trim();
    let origin = format!("the command line `{arg}`");
    let (section, key) = match path.split_once('.') {
        Some((s, k)) => (s.to_string(), k.to_string()),
        None => match owners(schema, path).as_slice() {
            [one] => (one.to_string(), path.to_string()),
            [] => {
                let all: Vec<(&str, String)> = schema
                    .iter()
                    .filter_map(|(s, t)| Some((s, t.as_table()?)))
                    .flat_map(|(s, t)| t.keys().map(move |k| (k.as_str(), format!("{s}.{k}"))))
                    .collect();
                let hint = nearest(path, all.iter().map(|(k, _)| *k))
                    .and_then(|near| all.iter().find(|(k, _)| *k == near))
                    .map(|(_, full)| format!("; did you mean `{full}`?"))
                    .unwrap_or_default();
                return Err(bad(format!("no section has a key `{path}`{hint} (write section.key=value)")));
            }
            many => {
                let full: Vec<String> = many.iter().map(|s| format!("{s}.{path}")).collect();
                return Err(bad(format!(
                    "`{path}` is in several sections; write one of {}",
                    full.join(", ")
                )));
            }
        },
    };
    let Some(Value::Table(known)) = schema.get(&section) else {
        return Err(unknown_section(&section, schema, &origin));
    };
    let Some(default) = known.get(&key) else {
        return Err(unknown_key(&section, &key, schema, &origin));
    };
    let value = parse_value(raw.trim(), default);
    check_type(&format!("{section}.{key}"), &value, default, &origin)?;
    let entry = table.entry(section.clone()).or_insert_with(|| Value::Table(Table::new()));
    match entry {
        Value::Table(t) => {
            t.insert(key, value);
            Ok(())
        }
        other => Err(bad(format!("[{section}] in the file is {}, not a section", describe(other)))),
    }
}

/// A TOML literal when the text is one (`3`, `-1e-3`, `true`, `nan`); else the text as a
/// string, so `model.name=resnet50` needs no quotes. Where the key holds a string, the text is
/// the string, even when it reads as a number (`log.dir=2024`).
fn parse_value(raw: &str, default: &Value) -> Value {
    if default.is_str() {
        let unquoted = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')).unwrap_or(raw);
        return Value::String(unquoted.to_string());
    }
    match format!("v = {raw}").parse::<Table>() {
        Ok(mut t) => t.remove("v").unwrap_or_else(|| Value::String(raw.into())),
        Err(_) => Value::String(raw.into()),
    }
}

/// The checked table into the typed config. Only enum names can still be wrong here.
fn deserialize(table: Table) -> Result<Config, ConfigError> {
    let value = Value::Table(table);
    serde_path_to_error::deserialize::<_, Config>(value).map_err(|e| {
        let key = e.path().to_string();
        let message = e.inner().to_string();
        // The message ends by naming the key in backticks too: not one of the variants.
        let mut quoted = backticked(&message);
        quoted.retain(|q| *q != key);
        match quoted.as_slice() {
            [got, allowed @ ..] if message.starts_with("unknown variant") => {
                let hint = nearest(got, allowed.iter().map(String::as_str))
                    .map(|s| format!(" (did you mean \"{s}\"?)"))
                    .unwrap_or_default();
                let allowed: Vec<String> = allowed.iter().map(|a| format!("\"{a}\"")).collect();
                ConfigError::invalid(
                    &key,
                    format!("\"{got}\""),
                    format!("use one of {}{hint}", allowed.join(", ")),
                )
            }
            _ => ConfigError::invalid(&key, "this value", message),
        }
    })
}

/// The `quoted` words of a serde message ("unknown variant `x`, expected one of `a`, `b`").
fn backticked(message: &str) -> Vec<String> {
    message.split('`').skip(1).step_by(2).map(str::to_string).collect()
}
