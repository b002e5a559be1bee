//! A read-only file mapping whose pages a loader hands back as it goes (issue 42): loading
//! copies or converts each tensor out of the map, then releases the pages it read, so that the
//! process never holds the file and what it made of it resident together. One home for the
//! GGUF reader (`formats::gguf`) and the checkpoint reader ([`super::tensor_file`]).

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use crate::{ElmError, Result};

/// How far back of a released range fault-around may have mapped pages again: a read fault
/// also maps the neighbouring pages already in the page cache (the kernel's
/// `fault_around_bytes`, 64 KiB by default), which can bring back the tail of the range
/// released just before; doubled for the window's alignment.
const FAULT_AROUND_MARGIN: usize = 128 << 10;

/// File bytes a loader converts before releasing their pages: small against any model, large
/// enough that the `madvise` calls cost nothing next to the copy.
pub const RELEASE_SLICE_BYTES: usize = 4 << 20;

/// A file mapped read-only and shared; derefs to its bytes.
pub struct MappedFile {
    mmap: Mmap,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ElmError::io(path, e))?;
        // A FIFO or a device (`/dev/zero`) maps as nothing or without end: refuse it by name.
        let meta = file.metadata().map_err(|e| ElmError::io(path, e))?;
        if !meta.is_file() {
            return Err(ElmError::format(
                path,
                format!("is not a regular file ({})", crate::io::file_kind(&meta)),
            ));
        }
        // SAFETY: the map is read-only; we never hand out references that outlive it. A
        // concurrent writer truncating the file is outside our contract (as for any mmap reader).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ElmError::io(path, e))?;
        Ok(MappedFile { mmap })
    }

    /// Takes the pages of `[start, start + len)` (and [`FAULT_AROUND_MARGIN`] before it) out of
    /// this process's resident set (`MADV_DONTNEED`). The map is a read-only shared file
    /// mapping, so a later read faults the same bytes back in from the page cache: no slice
    /// handed out sees a change. Best effort: a refused advice only costs memory.
    pub fn release(&self, start: usize, len: usize) {
        let from = start.saturating_sub(FAULT_AROUND_MARGIN);
        let len = (len + (start - from)).min(self.mmap.len().saturating_sub(from));
        if len == 0 {
            return;
        }
        #[cfg(unix)]
        // SAFETY: MADV_DONTNEED on a shared, read-only file mapping only drops page-table
        // entries; the contents seen through the map stay those of the file (see above).
        let _ = unsafe {
            self.mmap
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, len)
        };
    }

    /// Every page of the file out of the resident set: what a loader calls after its last read.
    pub fn release_all(&self) {
        self.release(0, self.mmap.len());
    }

    /// Offset of `part` (a slice of this map) from the map's start.
    pub fn offset_of(&self, part: &[u8]) -> usize {
        part.as_ptr() as usize - self.mmap.as_ptr() as usize
    }

    /// Copies `part` (a slice of this map) out slice by slice through `convert`, releasing each
    /// slice's pages once converted: `convert(slice_index, bytes)`; slices are
    /// [`RELEASE_SLICE_BYTES`] long, rounded down to a multiple of `unit` bytes.
    pub fn convert_releasing(
        &self,
        part: &[u8],
        unit: usize,
        mut convert: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let start = self.offset_of(part);
        let step = (RELEASE_SLICE_BYTES / unit).max(1) * unit;
        for (i, src) in part.chunks(step).enumerate() {
            convert(i, src)?;
            self.release(start + i * step, src.len());
        }
        Ok(())
    }
}

impl Deref for MappedFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.mmap
    }
}
