//! One writer per run directory: every command that writes a run directory (or paper_repro's
//! results) holds an exclusive lock on `DIR/.elm-lock` for its whole life. A second command on
//! the same directory is refused at once with the holder's PID and command line. The lock is a
//! `flock`, so the kernel releases it when its holder dies however it dies; the file keeps the
//! last holder's PID, which is how a later command knows that it took over from a dead one.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};

pub use crate::limits::RUN_LOCK_FILE as LOCK_FILE;

/// Who holds (or last held) a directory's lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    pub pid: u32,
    pub command: String,
}

/// An acquired lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct DirLock {
    file: File,
    path: PathBuf,
    /// The holder before us that died without releasing its claim (its PID was still written).
    pub took_over_from: Option<LockHolder>,
}

impl DirLock {
    /// Creates `dir` when missing and locks it for `command` (a description for the message
    /// another command gets, e.g. `elm train --out runs/a`).
    pub fn acquire(dir: &Path, command: &str) -> Result<DirLock> {
        std::fs::create_dir_all(dir).map_err(|e| ElmError::io(dir, e))?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| ElmError::io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = read_holder(&mut file);
                return Err(ElmError::DirectoryLocked {
                    dir: dir.to_path_buf(),
                    holder: holder.map_or_else(
                        || "another process (it has not written its PID yet)".to_string(),
                        |h| format!("process {} (`{}`)", h.pid, h.command),
                    ),
                });
            }
            Err(TryLockError::Error(e)) => return Err(ElmError::io(&path, e)),
        }
        let took_over_from = read_holder(&mut file).filter(|h| h.pid != std::process::id());
        let me = LockHolder {
            pid: std::process::id(),
            command: command.to_string(),
        };
        let text = serde_json::to_string(&me).map_err(|e| ElmError::Json {
            what: path.display().to_string(),
            msg: e.to_string(),
        })?;
        // Not fsynced: the flock is the lock; the PID is only for messages.
        (|| -> std::io::Result<()> {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            file.write_all(text.as_bytes())
        })()
        .map_err(|e| ElmError::io(&path, e))?;
        Ok(DirLock {
            file,
            path,
            took_over_from,
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What to tell the user when the lock was taken over from a dead holder.
    pub fn takeover_note(&self) -> Option<String> {
        self.took_over_from.as_ref().map(|h| {
            format!(
                "{}: took over the lock of process {} (`{}`), which is no longer running",
                self.path.display(),
                h.pid,
                h.command
            )
        })
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // A clean exit leaves an empty file: the next holder has nobody to report as dead. The
        // file itself stays (removing it would let two processes lock two different files).
        let _ = self.file.set_len(0);
        let _ = self.file.unlock();
    }
}

fn read_holder(file: &mut File) -> Option<LockHolder> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    serde_json::from_str(text.trim()).ok()
}
