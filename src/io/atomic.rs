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
    // Each failure names its operation: a failing fsync or rename is a different story for the
    // user (and for a fault-injection test) than a failing write.
    let op = |what: &'static str| move |e: std::io::Error| (what, e);
    let written = (|| {
        let mut f = fs::File::create(&tmp).map_err(op("create temporary file"))?;
        f.write_all(bytes).map_err(op("write"))?;
        f.sync_all().map_err(op("fsync"))?;
        fs::rename(&tmp, path).map_err(op("rename temporary file into place"))
    })();
    if let Err((what, e)) = written {
        let _ = fs::remove_file(&tmp);
        return Err(ElmError::io(path, with_operation(what, e)));
    }
    // The rename is durable only once the directory entry is on disk.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ElmError::io(dir, with_operation("fsync directory", e)))
}

/// `e` with the failed operation in front of its message (same kind).
fn with_operation(what: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what} failed: {e}"))
}

/// Serialises `value` as pretty JSON and writes it with [`write_atomic`].
pub fn write_json_atomic<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let s = serde_json::to_string_pretty(value).map_err(|e| ElmError::Json {
        what: path.display().to_string(),
        msg: e.to_string(),
    })?;
    write_atomic(path, s.as_bytes())
}

/// Whether `name` is a temporary file of [`write_atomic`] (`.<name>.tmp<pid>-<n>`).
fn is_atomic_temp(name: &str) -> bool {
    name.starts_with('.')
        && name.rsplit_once(".tmp").is_some_and(|(_, tail)| {
            tail.split_once('-').is_some_and(|(pid, n)| {
                !pid.is_empty()
                    && !n.is_empty()
                    && pid.bytes().all(|b| b.is_ascii_digit())
                    && n.bytes().all(|b| b.is_ascii_digit())
            })
        })
}

/// Removes the temporary files a killed writer left in `dir` and its immediate
/// subdirectories (they are never referenced: the rename had not happened). Returns how many.
/// Call only when no other process writes into `dir` (e.g. on resume of a run).
pub fn remove_stale_temps(dir: &Path) -> Result<usize> {
    let mut removed = 0;
    let mut dirs = vec![dir.to_path_buf()];
    if let Ok(rd) = fs::read_dir(dir) {
        dirs.extend(
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    for d in dirs {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file())
                && is_atomic_temp(&e.file_name().to_string_lossy())
            {
                fs::remove_file(e.path()).map_err(|err| ElmError::io(e.path(), err))?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// Removes the `step-*` checkpoint directories of run directory `dir` except `keep`, the one
/// its state file now names (written before this is called, so a crash in between leaves an
/// extra directory, never a missing one). Best effort: a directory that cannot be removed only
/// costs disk.
pub fn remove_old_step_dirs(dir: &Path, keep: &str) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with("step-") && name != keep {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Fsyncs directory `dir`, so entries created or renamed in it survive a power loss.
pub fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ElmError::io(dir, with_operation("fsync directory", e)))
}
