//! The files the library itself writes and reads back, at the bottom of the crate (they use only
//! `error` and `limits`): the one atomic writer, named-tensor files, the one JSON reader, the
//! run-directory lock, a stable content hash and the process's peak memory. Model formats
//! (GGUF, HF safetensors, tokenizers) sit higher, in `formats`.

pub mod atomic;
pub mod dir_lock;
pub mod fingerprint;
pub mod json;
pub mod process;
pub mod run_dir;
pub mod tensor_file;

pub use atomic::{write_atomic, write_json_atomic};
pub use dir_lock::{DirLock, LockHolder};
pub use fingerprint::Fnv64;
pub use json::read_json;
pub use process::peak_rss_bytes;
pub use run_dir::{OpenMode, RunDir, RunKind, RunStart};
