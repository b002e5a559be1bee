//! Process-wide settings of the products: which kernel runs (detected once, `ELM_GEMM=blas`
//! forces BLAS), the precision of the large products (`--precision`), and the threads of the
//! linked OpenBLAS (its FFI). Everything else in `gemm` reads these; they read nothing of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::error::{ElmError, Result};

/// Which kernel [`sgemm`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKernel {
    /// The linked BLAS through `ndarray`.
    Blas,
    /// This module's AVX-512F kernel.
    Avx512,
    /// This module's AVX-512 BF16 kernel: inputs rounded to bf16 (nearest even) as they are
    /// packed, products summed in f32 (`vdpbf16ps`), output f32.
    Avx512Bf16,
}

impl GemmKernel {
    pub fn name(self) -> &'static str {
        match self {
            GemmKernel::Blas => "blas",
            GemmKernel::Avx512 => "avx512",
            GemmKernel::Avx512Bf16 => "avx512-bf16",
        }
    }
}

/// The kernel large products use on this machine (`ELM_GEMM=blas` forces BLAS).
pub fn detected_kernel() -> GemmKernel {
    static KERNEL: OnceLock<GemmKernel> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        if std::env::var("ELM_GEMM").is_ok_and(|v| v == "blas") {
            return GemmKernel::Blas;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            return GemmKernel::Avx512;
        }
        GemmKernel::Blas
    })
}

/// The number format the large products read their inputs in; accumulation and outputs stay
/// f32, and so do the weights, gradients and optimiser state they come from (bf16 is only
/// the packed copy a product reads), as in mixed-precision training. Products smaller than
/// `MIN_WORK` multiply-adds (and the attention's per-head products, which go through BLAS)
/// stay f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    Bf16,
}

impl std::str::FromStr for Precision {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(ElmError::config(
                "precision",
                format!("`{s}`: expected f32 or bf16"),
            )),
        }
    }
}

static BF16: AtomicBool = AtomicBool::new(false);

/// Whether this CPU has AVX-512 BF16 dot products.
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Sets the precision of every large product from now on (process-wide: the CLI's
/// `--precision`). `bf16` is refused on a CPU without AVX-512 BF16: emulating it would be
/// slower than f32 and defeat its purpose.
pub fn set_precision(p: Precision) -> Result<()> {
    if p == Precision::Bf16 && !has_avx512_bf16() {
        return Err(ElmError::config(
            "precision",
            "bf16 needs a CPU with AVX-512 BF16 (avx512_bf16); this one lacks it: use f32",
        ));
    }
    BF16.store(p == Precision::Bf16, Ordering::Relaxed);
    Ok(())
}

/// Runs `f` with every product in f32, then restores the precision set before (also when `f`
/// panics). For computations that bf16 rounding would swamp, such as central differences; the
/// setting is process-wide, so nothing else may run products meanwhile (the callers run
/// between training steps or alone in a command).
pub fn with_f32_products<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BF16.store(self.0, Ordering::Relaxed);
        }
    }
    let _restore = Restore(BF16.swap(false, Ordering::Relaxed));
    f()
}

/// The precision set by [`set_precision`] (f32 unless changed).
pub fn precision() -> Precision {
    if BF16.load(Ordering::Relaxed) {
        Precision::Bf16
    } else {
        Precision::F32
    }
}

/// The kernel [`precision`] selects for large products.
pub(super) fn precision_kernel() -> GemmKernel {
    match precision() {
        Precision::Bf16 => GemmKernel::Avx512Bf16,
        Precision::F32 => detected_kernel(),
    }
}

extern "C" {
    fn openblas_get_num_threads() -> std::os::raw::c_int;
    fn openblas_set_num_threads(n: std::os::raw::c_int);
}

/// Threads OpenBLAS uses per call.
pub fn blas_threads() -> usize {
    // SAFETY: plain getter of the linked system OpenBLAS, no arguments.
    unsafe { openblas_get_num_threads() as usize }
}

/// Sets OpenBLAS's threads per call (process-wide).
///
/// `1` is fastest for inference on small machines (measured by `elm bench`): batch-1
/// matvecs are then split over the decode's spin team instead, and a 2-thread OpenBLAS
/// oversubscribes the cores when anything else runs.
pub fn set_blas_threads(n: usize) {
    // SAFETY: plain setter of the linked system OpenBLAS.
    unsafe { openblas_set_num_threads(n.max(1) as std::os::raw::c_int) }
}

/// When this module's kernel carries the large products, OpenBLAS is left with small ones
/// (attention heads, decode batches) that run inside rayon's parallel loops: its own thread
/// pool then only spins against rayon's threads (a training step lost half its time to
/// `sched_yield` that way), so it is made single-threaded, unless `OPENBLAS_NUM_THREADS`
/// says otherwise. Process-wide: the binaries call it at startup. Returns the kernel.
pub fn prefer_own_threads() -> GemmKernel {
    let kernel = detected_kernel();
    if kernel != GemmKernel::Blas && std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        set_blas_threads(1);
    }
    kernel
}
