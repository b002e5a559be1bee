//! `OUT/summary.json`: every step's JSON exactly as `elm` printed it, tagged by section.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::error::ReproError;

#[derive(Default)]
pub struct Summary {
    steps: Vec<Value>,
}

impl Summary {
    /// Appends one step of `section`: `tags` tell it apart from the section's other steps
    /// (problem, solver, …); `result` is the step's verbatim output.
    pub fn push(&mut self, section: &str, tags: &[(&str, Value)], result: Value) {
        let mut entry = Map::new();
        entry.insert("section".into(), section.into());
        for (key, value) in tags {
            entry.insert(key.to_string(), value.clone());
        }
        entry.insert("result".into(), result);
        self.steps.push(Value::Object(entry));
    }

    pub fn write(self, path: &Path, scale: &str) -> Result<(), ReproError> {
        let text = serde_json::to_string_pretty(&json!({"scale": scale, "steps": self.steps}))
            .map_err(|e| ReproError::io(path, std::io::Error::other(e)))?;
        std::fs::write(path, text).map_err(|e| ReproError::io(path, e))
    }
}
