//! Why a reproduction run stopped; every variant names the `elm` command or file concerned.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ReproError {
    #[error("cannot run {}: {source}", bin.display())]
    Spawn {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    CommandFailed { command: String, stderr: String },
    #[error("`{command}` printed no JSON object: {source}")]
    NotJson {
        command: String,
        source: serde_json::Error,
    },
    /// The output parsed as JSON but lacks (or mistypes) a key a table reads: the CLI and
    /// paper_repro disagree, so no table is written rather than one with blank cells.
    #[error("`{command}` printed JSON without what paper_repro reads: {source}")]
    Schema {
        command: String,
        source: serde_json::Error,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A library computation on decoded outputs (e.g. a paired comparison) failed.
    #[error("{what}: {source}")]
    Elm { what: String, source: elm::ElmError },
    /// Missing inputs (binary, model, data) detected before any step runs.
    #[error("{0}")]
    Setup(String),
}

impl ReproError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ReproError::Io {
            path: path.into(),
            source,
        }
    }

    /// The library's atomic writer failed to write `path`.
    pub fn writing(path: &Path, source: elm::ElmError) -> Self {
        ReproError::Elm {
            what: format!("writing {}", path.display()),
            source,
        }
    }
}
