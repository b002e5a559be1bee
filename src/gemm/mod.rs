//! f32 matrix multiply `C = α·A·B + β·C` for the training and prefill shapes, with an AVX-512
//! kernel of our own and the BLAS path kept.
//!
//! Why our own: Debian's OpenBLAS 0.3.21 predates its Zen 4 kernels and runs its AVX2 (Haswell)
//! kernel on this AVX-512 machine; the profile of an ELM training step spends ~70% of its time
//! in that kernel. And OpenBLAS's own thread pool competes with rayon's for the same two
//! cores, while this one runs on rayon's.
//!
//! The layout is the usual one of BLIS/GotoBLAS: `B` is packed in `KC × NR` column slivers
//! (kept in L1 while a sliver of `A` streams past), `A` in `MR × KC` row slivers (an `MC × KC`
//! block stays in L2), and a register-blocked micro-kernel keeps an `MR × NR` tile of `C` in
//! 24 zmm registers (12 rows × 2 × 16 columns): one `k` step is two loads of `B`, twelve
//! broadcasts of `A` and 24 FMAs. Edges are zero-padded in the packed panels and written back
//! through a bounds-checked tile. Work is split over rayon's threads along the longer of `M`
//! and `N`, each thread running the whole blocked loop on its part.
//!
//! [`sgemm`] picks the kernel at run time: AVX-512F when the CPU has it and the product is
//! large enough to pay for packing, else `ndarray`'s `general_mat_mul` (BLAS). `ELM_GEMM=blas`
//! forces the BLAS path (to measure one against the other).
//!
//! Files, each importing only those above it in this list: `settings` (kernel choice,
//! precision, OpenBLAS threads), `frozen` (the frozen-pack registry), `pack` (operand packing
//! and block sizes), `loop_nest` (the blocked loop both kernels share), `kernel_f32`,
//! `kernel_bf16`, `driver` (the entry points and the thread split). This file only gathers.

mod driver;
mod frozen;
#[cfg(target_arch = "x86_64")]
mod kernel_bf16;
#[cfg(target_arch = "x86_64")]
mod kernel_f32;
#[cfg(target_arch = "x86_64")]
mod loop_nest;
#[cfg(target_arch = "x86_64")]
mod pack;
mod settings;

pub use driver::{matmul, matmul_f32, peak_fma_gflops_per_core, sgemm, sgemm_with};
pub use frozen::{frozen_packed_bytes, FrozenWeights};
pub use settings::{
    blas_threads, detected_kernel, has_avx512_bf16, precision, prefer_own_threads,
    set_blas_threads, set_precision, with_f32_products, GemmKernel, Precision,
};
