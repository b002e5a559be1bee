//! Keep freed memory in the process for the next training step.
//!
//! A training step allocates and frees the same large buffers every time (activations, the
//! tape's saved tensors, logits of `[B·T, V]`). glibc serves blocks above its mmap threshold
//! with a fresh `mmap` and returns them with `munmap` on free, and trims the heap top back to
//! the kernel, so every step faults all those pages in again: issue 25 measured 760k minor
//! faults and half of the wall time in the kernel over 12 steps. [`retain_freed_memory`]
//! tells glibc to serve every block from its heaps and never give memory back, so steady-state
//! steps reuse warm pages. The cost is that the process keeps its peak footprint until exit,
//! which is what a training or evaluation run holds anyway.
//!
//! A process-wide setting, so the library never applies it by itself: the `elm` binary, the
//! examples and benchmarks call it first thing. No-op (returns `false`) outside glibc.
//!
//! Also here: the heap counters ([`CountingAlloc`]) and [`back_with_huge_pages`], which puts
//! the weights a decode step streams on transparent huge pages (a per-buffer request, which
//! the model constructors make, unlike the process-wide setting above).

/// Applies the setting; `true` when the allocator accepted it. Call before the first large
/// allocation (blocks already mapped are not affected). `ELM_KEEP_HEAP=0` leaves glibc's
/// defaults, so the effect can be measured.
pub fn retain_freed_memory() -> bool {
    if std::env::var("ELM_KEEP_HEAP").is_ok_and(|v| v == "0") {
        return false;
    }
    imp::retain()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    use std::os::raw::c_int;

    // glibc's <malloc.h> parameter numbers.
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_MMAP_MAX: c_int = -4;

    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }

    pub fn retain() -> bool {
        // SAFETY: mallopt only changes allocator parameters; both values are in range
        // (M_MMAP_MAX = 0 disables mmap'd blocks, the trim threshold is a byte count).
        unsafe { mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, c_int::MAX) == 1 }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    pub fn retain() -> bool {
        false
    }
}

/// A global allocator that forwards to the system's and counts: live bytes, their high-water
/// mark and the number of allocations. The `elm` binary installs it, so a command can measure
/// the heap a probe step takes (`crate::memory`) and tests can bound allocations per step:
///
/// ```ignore
/// #[global_allocator]
/// static HEAP: elm::heap::CountingAlloc = elm::heap::CountingAlloc;
/// ```
///
/// Four relaxed atomic updates per allocation: nothing next to the allocation itself.
pub struct CountingAlloc;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Counts a fresh block of `size` bytes at `p` (nothing when the allocation failed).
fn allocated(p: *mut u8, size: usize) -> *mut u8 {
    if !p.is_null() {
        INSTALLED.store(true, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        grew(size);
    }
    p
}

fn grew(bytes: usize) {
    ALLOCATED.fetch_add(bytes, Ordering::Relaxed);
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call forwards to `System` with the caller's arguments; the counters never
// touch the memory handed out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        allocated(System.alloc(layout), layout.size())
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        allocated(System.alloc_zeroed(layout), layout.size())
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = System.realloc(p, layout, new_size);
        if !q.is_null() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        q
    }
}

/// What [`CountingAlloc`] has counted so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapCounters {
    /// Bytes allocated and not yet freed.
    pub live_bytes: usize,
    /// Highest `live_bytes` since the start or the last [`reset_peak`].
    pub peak_bytes: usize,
    /// Allocations (and reallocations) since the start.
    pub allocations: usize,
    /// Bytes ever allocated since the start (a reallocation counts what it grew by).
    pub allocated_bytes: usize,
}

/// The counters, or `None` where [`CountingAlloc`] is not the global allocator.
pub fn counters() -> Option<HeapCounters> {
    INSTALLED.load(Ordering::Relaxed).then(|| HeapCounters {
        live_bytes: LIVE.load(Ordering::Relaxed),
        peak_bytes: PEAK.load(Ordering::Relaxed),
        allocations: ALLOCATIONS.load(Ordering::Relaxed),
        allocated_bytes: ALLOCATED.load(Ordering::Relaxed),
    })
}

/// Starts a new high-water mark at the bytes live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The most heap `f` held at once beyond what was live when it started (its peak), or `None`
/// without [`CountingAlloc`]. Resets the high-water mark; other threads' allocations in the
/// meantime count too.
pub fn peak_during<R>(f: impl FnOnce() -> R) -> (R, Option<usize>) {
    let before = counters().map(|c| c.live_bytes);
    reset_peak();
    let r = f();
    let peak = match (before, counters()) {
        (Some(b), Some(c)) => Some(c.peak_bytes.saturating_sub(b)),
        _ => None,
    };
    (r, peak)
}

/// Asks the kernel to back the memory of `buffers` (weights that every decode step streams)
/// with transparent huge pages, and returns the bytes it moved onto them.
///
/// Batch-1 decode reads every weight once per token: ~100 MB for SmolLM2 in Q4_1, 24 000
/// pages of 4 KiB, each a TLB miss (a two-level walk under a hypervisor). On huge pages the
/// same step ran 13% faster (issue 42, `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` against the
/// default, eight alternations), but this machine's kernel grants them only on request
/// (`/sys/kernel/mm/transparent_hugepage/enabled` = `madvise`), and glibc's tunable backs the
/// whole heap, which raised a generating process's RSS by a quarter. So only each 2 MiB
/// stretch that the buffers cover to at least 7/8 is advised (`MADV_HUGEPAGE`) and collapsed
/// in place (`MADV_COLLAPSE`, Linux 6.1+: the contents stay, at most 1/8 of a stretch that
/// no buffer holds becomes resident). Best effort: a kernel without either, a memory that
/// is not anonymous, or another system returns fewer bytes, and nothing else changes.
pub fn back_with_huge_pages(buffers: &[&[u8]]) -> usize {
    if std::env::var("ELM_HUGE_PAGES").is_ok_and(|v| v == "0") {
        return 0;
    }
    huge_stretches(buffers)
        .into_iter()
        .filter(|&start| imp_huge::collapse(start, HUGE_PAGE))
        .count()
        * HUGE_PAGE
}

/// The bytes of `values`, borrowed (what [`back_with_huge_pages`] takes for f32 weights).
pub fn f32_bytes(values: &[f32]) -> &[u8] {
    // SAFETY: initialised f32 memory may be read as bytes, for as long as `values` is borrowed.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

/// The size of a transparent huge page on x86-64 and of the stretches advised.
pub const HUGE_PAGE: usize = 2 << 20;

/// Start addresses of the [`HUGE_PAGE`]-aligned stretches `buffers` cover to at least 7/8,
/// ascending (overlapping buffers count once per byte they share with no other).
pub fn huge_stretches(buffers: &[&[u8]]) -> Vec<usize> {
    let mut ranges: Vec<(usize, usize)> = buffers
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| (b.as_ptr() as usize, b.as_ptr() as usize + b.len()))
        .collect();
    ranges.sort_unstable();
    let mut covered: std::collections::BTreeMap<usize, usize> = Default::default();
    let mut reached = 0usize;
    for (lo, hi) in ranges {
        let lo = lo.max(reached);
        if lo >= hi {
            continue;
        }
        reached = hi;
        let mut at = lo;
        while at < hi {
            let stretch = at - at % HUGE_PAGE;
            let end = hi.min(stretch + HUGE_PAGE);
            *covered.entry(stretch).or_default() += end - at;
            at = end;
        }
    }
    covered
        .into_iter()
        .filter(|&(_, bytes)| bytes * 8 >= HUGE_PAGE * 7)
        .map(|(stretch, _)| stretch)
        .collect()
}

#[cfg(target_os = "linux")]
mod imp_huge {
    use std::os::raw::{c_int, c_void};

    // <linux/mman.h>, the same on every architecture Linux has.
    const MADV_HUGEPAGE: c_int = 14;
    const MADV_COLLAPSE: c_int = 25;

    extern "C" {
        fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    }

    /// Advises and collapses `len` bytes at `start` (page-aligned); `true` when collapsed.
    pub fn collapse(start: usize, len: usize) -> bool {
        // SAFETY: both advices keep the memory's contents and its mapping (the caller's
        // buffers stay valid); on a range that is not one mapping they fail, changing nothing.
        unsafe {
            madvise(start as *mut c_void, len, MADV_HUGEPAGE) == 0
                && madvise(start as *mut c_void, len, MADV_COLLAPSE) == 0
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp_huge {
    pub fn collapse(_start: usize, _len: usize) -> bool {
        false
    }
}
