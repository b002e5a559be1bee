//! The one way the library writes a file: a unique temporary sibling, fsync, rename, then fsync
//! of the directory. A crash or kill leaves either the old file or the new one under the final
//! name, never a torn one, and a power loss after the call returns cannot undo the rename.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{ElmError, Result};

/// Writes `bytes` to `path` atomically (see the module doc). Creates missing parent directories.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| ElmError::InvalidArgument(format!("{}: not a file path", path.display())))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| ElmError::io(dir, e))?;
    // Unique per process and call, so concurrent writers never share a temporary file.
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp: PathBuf = dir.join(format!(
        ".{}.tmp{}-{n}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(ElmError::io(path, e));
    }
    // The rename is durable only once the directory entry is on disk.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ElmError::io(dir, e))
}

/// Serialises `value` as pretty JSON and writes it with [`write_atomic`].
pub fn write_json_atomic<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let s = serde_json::to_string_pretty(value).map_err(|e| ElmError::Json {
        what: path.display().to_string(),
        msg: e.to_string(),
    })?;
    write_atomic(path, s.as_bytes())
}
