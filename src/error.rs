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
    /// A shape mismatch in an operation.
    pub fn shape(op: impl Into<String>, msg: impl Into<String>) -> Self {
        ElmError::Shape {
            op: op.into(),
            msg: msg.into(),
        }
    }
}
