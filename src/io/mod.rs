//! The files the library itself writes and reads back, at the bottom of the crate (they use only
//! `error`, `limits` and the heap counters): the one atomic writer, named-tensor files, the one
//! JSON reader, the run-directory lock, a stable content hash, a file mapping that releases what
//! was read, and the process's resident memory. Model formats
//! (GGUF, HF safetensors, tokenizers) sit higher, in `formats`.

pub mod atomic;
pub mod dir_lock;
pub mod fingerprint;
pub mod json;
pub mod mapped;
pub mod process;
pub mod run_dir;
pub mod tensor_file;

pub use atomic::{write_atomic, write_json_atomic};
pub use dir_lock::{DirLock, LockHolder};
pub use fingerprint::{sha256_file, Fnv64, Sha256};
pub use json::read_json;
pub use mapped::MappedFile;
pub use process::{
    peak_rss_bytes, reset_peak_rss, resident_set, rss_bytes, BeforeLoad, ProcessMemory,
    ResidentReport, ResidentSet,
};
pub use run_dir::{OpenMode, RunDir, RunKind, RunStart};
