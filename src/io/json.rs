//! Reading the JSON files the library and its users write: one reader, whose errors name the
//! file and, where serde does not, the key whose value is wrong.

use std::path::Path;

use crate::error::{ElmError, Result};

/// `impl Default` for a config whose every field has a serde default: the default *is* what an
/// empty JSON object deserialises to, so `Default` and a config file that omits a key can never
/// disagree.
#[macro_export]
macro_rules! default_from_empty_json {
    ($($config:ty),+ $(,)?) => {$(
        impl Default for $config {
            fn default() -> Self {
                serde_json::from_str("{}").expect(concat!(
                    "every field of ",
                    stringify!($config),
                    " has a serde default"
                ))
            }
        }
    )+};
}

/// Reads a JSON file into a typed value, naming the file on error.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let raw = std::fs::read_to_string(path).map_err(|e| ElmError::io(path, e))?;
    serde_json::from_str(&raw).map_err(|e| {
        // serde names missing and unknown fields but not a wrong-typed one: find its key.
        match (e.classify(), key_at(&raw, e.line(), e.column())) {
            (serde_json::error::Category::Data, Some(key)) if !e.to_string().contains('`') => {
                ElmError::config(key, e.to_string()).in_file(path)
            }
            _ => ElmError::Json {
                what: path.display().to_string(),
                msg: e.to_string(),
            },
        }
    })
}

/// The key whose value sits at (`line`, `column`) (1-based, as serde_json reports them): the
/// last `"key":` before that position.
fn key_at(raw: &str, line: usize, column: usize) -> Option<String> {
    let line_start: usize = raw
        .split_inclusive('\n')
        .take(line.checked_sub(1)?)
        .map(str::len)
        .sum();
    let end = (line_start + column).min(raw.len());
    let prefix = raw.get(..end)?;
    let mut search = prefix;
    while let Some(colon) = search.rfind(':') {
        let before = search[..colon].trim_end();
        if let Some(body) = before.strip_suffix('"') {
            let open = body.rfind('"')?;
            return Some(body[open + 1..].to_string());
        }
        search = &search[..colon];
    }
    None
}
