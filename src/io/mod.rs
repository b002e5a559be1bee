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

/// What kind of file system object `meta` describes, for messages ("a FIFO", "a character
/// device", ...).
pub fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// The UTF-8 text of `path`, at most `cap` bytes: a longer input (or one without end, as
/// `/dev/zero`) is an error naming the file and the cap, after reading `cap + 1` bytes at most.
pub fn read_text_capped(path: &std::path::Path, cap: u64) -> crate::error::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| crate::error::ElmError::io(path, e))?;
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| crate::error::ElmError::io(path, e))?;
    if bytes.len() as u64 > cap {
        return Err(crate::error::ElmError::format(
            path,
            format!("longer than the cap of {cap} bytes for a text input"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| crate::error::ElmError::format(path, format!("not UTF-8 text: {e}")))
}
