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
