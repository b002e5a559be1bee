//! The crate's one error type. Every fallible public function returns [`Result`].
//!
//! Variants name *what* was wrong and *where* (file, tensor, config field), so a
//! user never has to guess which input to fix.

use std::path::PathBuf;

/// Every error the `elm` crate can return.
#[derive(Debug, thiserror::Error)]
pub enum ElmError {
    /// An OS-level I/O failure on a named file.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file exists but its bytes are not what the format requires
    /// (bad magic, truncated, corrupt header, unsupported version...).
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    /// A named tensor is missing, unexpected, or has the wrong shape/dtype.
    #[error("tensor `{name}`: {msg}")]
    Tensor { name: String, msg: String },
    /// A configuration value (file field or CLI option) is invalid or unknown.
    #[error("config `{field}`: {msg}")]
    Config { field: String, msg: String },
    /// Array shapes disagree.
    #[error("shape mismatch in {op}: {msg}")]
    Shape { op: String, msg: String },
    /// A NaN or infinity where a finite value is required.
    #[error("non-finite value in {0}")]
    NonFinite(String),
    /// A requested feature, dtype or mode that this build does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Caller passed an argument outside its domain.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Tokenizer construction or encoding failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Dense linear algebra (LAPACK) failed.
    #[error("linear algebra: {0}")]
    Linalg(String),
    /// GPU backend errors, including "no CUDA driver found".
    #[error("cuda: {0}")]
    Cuda(String),
    /// JSON (de)serialisation of a named file or value.
    #[error("json {what}: {msg}")]
    Json { what: String, msg: String },
    /// An allocation driven by `field` would need more memory than the budget
    /// ([`crate::limits::mem_budget`]).
    #[error("`{field}`: needs {needed} bytes ({}), only {available} bytes ({}) available", gib(*needed), gib(*available))]
    Budget {
        field: String,
        needed: u128,
        available: u128,
    },
    /// A fixed-point map's own error that is not an `ElmError` (a user's map).
    #[error("fixed-point map: {0}")]
    Map(String),
    /// The implicit rule's backward (adjoint) solve did not converge on these rows of the batch
    /// and its `on_failure` policy refuses to substitute a gradient for them.
    #[error("implicit backward solve ({method}) did not converge on rows {rows:?}: {detail}")]
    BackwardSolve {
        method: String,
        rows: Vec<usize>,
        detail: String,
    },
    /// An error found in a named file (e.g. a config field of a model file or checkpoint).
    /// Another live process holds the directory's lock ([`crate::io::DirLock`]).
    #[error("{}: in use by {holder}; wait for it to finish or stop it (one command per directory)", dir.display())]
    DirectoryLocked { dir: PathBuf, holder: String },

    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<ElmError>,
    },
}

fn gib(bytes: u128) -> String {
    format!("{:.3} GiB", bytes as f64 / (1u128 << 30) as f64)
}

/// The solver crate's errors as this crate's, variant for variant; a map's own `ElmError`
/// comes back unchanged out of the solve that carried it.
impl From<crate::solver::SolverError> for ElmError {
    fn from(e: crate::solver::SolverError) -> Self {
        use crate::solver::SolverError as S;
        match e {
            S::Config { field, msg } => ElmError::Config { field, msg },
            S::Shape { op, msg } => ElmError::Shape { op, msg },
            S::InvalidArgument(msg) => ElmError::InvalidArgument(msg),
            S::Budget {
                field,
                needed,
                available,
            } => ElmError::Budget {
                field,
                needed,
                available,
            },
            S::Json { what, msg } => ElmError::Json { what, msg },
            S::Map(inner) => match inner.downcast::<ElmError>() {
                Ok(own) => *own,
                Err(other) => match other.downcast::<S>() {
                    Ok(solver) => ElmError::from(*solver),
                    Err(other) => ElmError::Map(other.to_string()),
                },
            },
        }
    }
}

/// A map's error (see [`crate::solver::MapError`]): an `ElmError` inside comes back as itself.
impl From<crate::solver::MapError> for ElmError {
    fn from(e: crate::solver::MapError) -> Self {
        ElmError::from(crate::solver::SolverError::Map(e))
    }
}

/// Crate-wide result alias.
pub type Result<T> = std::result::Result<T, ElmError>;

impl ElmError {
    /// Wraps an `io::Error` with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ElmError::Io {
            path: path.into(),
            source,
        }
    }
    /// A format error for a file.
    pub fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        ElmError::Format {
            path: path.into(),
            msg: msg.into(),
        }
    }
    /// An error about one config field.
    pub fn config(field: impl Into<String>, msg: impl Into<String>) -> Self {
        ElmError::Config {
            field: field.into(),
            msg: msg.into(),
        }
    }
    /// An error about one tensor.
    pub fn tensor(name: impl Into<String>, msg: impl Into<String>) -> Self {
        ElmError::Tensor {
            name: name.into(),
            msg: msg.into(),
        }
    }
    /// Names the file this error was found in (a no-op when it already names one).
    pub fn in_file(self, path: impl Into<PathBuf>) -> Self {
        match self {
            e @ (ElmError::Io { .. } | ElmError::Format { .. } | ElmError::InFile { .. }) => e,
            e => ElmError::InFile {
                path: path.into(),
                source: Box::new(e),
            },
        }
    }
    /// A short machine-readable name of the variant (`config`, `io`, `budget`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            ElmError::Io { .. } => "io",
            ElmError::Format { .. } => "format",
            ElmError::Tensor { .. } => "tensor",
            ElmError::Config { .. } => "config",
            ElmError::Shape { .. } => "shape",
            ElmError::NonFinite(_) => "non_finite",
            ElmError::Unsupported(_) => "unsupported",
            ElmError::InvalidArgument(_) => "invalid_argument",
            ElmError::Tokenizer(_) => "tokenizer",
            ElmError::Linalg(_) => "linalg",
            ElmError::Cuda(_) => "cuda",
            ElmError::Json { .. } => "json",
            ElmError::Budget { .. } => "budget",
            ElmError::Map(_) => "map",
            ElmError::BackwardSolve { .. } => "backward_solve",
            ElmError::DirectoryLocked { .. } => "locked",
            ElmError::InFile { source, .. } => source.kind(),
        }
    }
    /// The file the error concerns, when it names one.
    pub fn file(&self) -> Option<PathBuf> {
        match self {
            ElmError::Io { path, .. } | ElmError::Format { path, .. } => Some(path.clone()),
            ElmError::InFile { path, .. } => Some(path.clone()),
            ElmError::DirectoryLocked { dir, .. } => Some(dir.clone()),
            // `what` is a path when the JSON came from a file.
            ElmError::Json { what, .. } if std::path::Path::new(what).exists() => {
                Some(PathBuf::from(what))
            }
            _ => None,
        }
    }
    /// The config field, argument or tensor the error concerns, when it names one.
    pub fn field(&self) -> Option<String> {
        match self {
            ElmError::Config { field, .. } | ElmError::Budget { field, .. } => Some(field.clone()),
            ElmError::Tensor { name, .. } => Some(name.clone()),
            ElmError::InFile { source, .. } => source.field(),
            _ => None,
        }
    }
    /// `{"error": {"kind", "message", "file", "field"}}`: what `--json` prints on failure.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "kind": self.kind(),
                "message": self.to_string(),
                "file": self.file().map(|p| p.display().to_string()),
                "field": self.field(),
            }
        })
    }
    /// A shape mismatch in an operation.
    pub fn shape(op: impl Into<String>, msg: impl Into<String>) -> Self {
        ElmError::Shape {
            op: op.into(),
            msg: msg.into(),
        }
    }
}
