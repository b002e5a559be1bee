//! Where user-controlled sizes are checked: checked size arithmetic, the memory budget, the
//! iteration cap and output directories. Every size, count or index from a CLI argument, a
//! JSON config, checkpoint metadata or a model file goes through these before it is used, so
//! an impossible request is refused with an error naming the field instead of panicking,
//! aborting on allocation failure or running without end.

use std::path::Path;

use crate::error::{ElmError, Result};

pub use crate::solver::error::{bytes_of, mem_available, mem_budget, MAX_ITER_CAP, MEM_BUDGET_ENV};

/// `a + b`, or an error naming `field` when it overflows.
pub fn checked_add(field: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_add(b)
        .ok_or_else(|| ElmError::config(field, format!("{a} + {b} overflows")))
}

/// Product of `factors`, or an error naming `field` when it overflows `usize`.
pub fn checked_product(field: &str, factors: &[usize]) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| ElmError::config(field, format!("size {factors:?} overflows usize")))
}

/// Refuses an allocation of `bytes` driven by `field` that exceeds [`mem_budget`], with the
/// bytes it would need and the bytes available (one rule for the solvers and the rest).
pub fn check_alloc(field: &str, bytes: u128) -> Result<()> {
    crate::solver::error::check_alloc(field, bytes).map_err(Into::into)
}

/// Refuses `max_iter` of 0 or above [`MAX_ITER_CAP`].
pub fn check_max_iter(field: &str, max_iter: usize) -> Result<()> {
    crate::solver::error::check_max_iter(field, max_iter).map_err(Into::into)
}

/// Name of the lock file a command holds inside the directory it writes (`io::DirLock`); it
/// is not earlier work, so [`check_output_dir`] does not count it.
pub const RUN_LOCK_FILE: &str = ".elm-lock";

/// Refuses writing a run into `dir` when that would replace existing work: `dir` is a file,
/// or a non-empty directory and `force` is off.
pub fn check_output_dir(field: &str, dir: &Path, force: bool) -> Result<()> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ElmError::io(dir, e)),
        Ok(m) if !m.is_dir() => Err(ElmError::InFile {
            path: dir.to_path_buf(),
            source: Box::new(ElmError::config(
                field,
                "exists and is not a directory; give a directory path",
            )),
        }),
        Ok(_) => {
            // The command's own lock file is not earlier work.
            let non_empty = std::fs::read_dir(dir)
                .map_err(|e| ElmError::io(dir, e))?
                .filter_map(|e| e.ok())
                .any(|e| e.file_name() != RUN_LOCK_FILE);
            if non_empty && !force {
                return Err(ElmError::InFile {
                    path: dir.to_path_buf(),
                    source: Box::new(ElmError::config(
                        field,
                        "directory exists and is not empty; pass --force to overwrite \
                         (or --resume to continue a training run)",
                    )),
                });
            }
            Ok(())
        }
    }
}

/// Refuses writing an output FILE at `path` when that would replace existing work: `path`
/// is a directory, or an existing file and `force` is off.
pub fn check_output_file(field: &str, path: &Path, force: bool) -> Result<()> {
    let refuse = |msg: &str| ElmError::InFile {
        path: path.to_path_buf(),
        source: Box::new(ElmError::config(field, msg)),
    };
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ElmError::io(path, e)),
        Ok(m) if m.is_dir() => Err(refuse("is a directory; give a file path")),
        Ok(_) if !force => Err(refuse("file exists; pass --force to overwrite")),
        Ok(_) => Ok(()),
    }
}

/// Largest text file (`--file`, a data set) read into memory: a FIFO or `/dev/zero` given as a
/// text file stops here with an error instead of reading without bound.
pub const MAX_TEXT_FILE_BYTES: u64 = 256 << 20;
