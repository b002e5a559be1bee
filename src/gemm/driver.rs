//! The entry points ([`sgemm`], [`matmul`]): the choice between BLAS and the AVX-512 kernels
//! for each product, and the split of a large product over the threads, each running the
//! blocked loop of its kernel on its part.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};
#[cfg(target_arch = "x86_64")]
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::frozen::{lookup, Panels};
#[cfg(target_arch = "x86_64")]
use super::kernel_bf16::gemm_serial_bf16;
#[cfg(target_arch = "x86_64")]
use super::kernel_f32::gemm_serial;
#[cfg(target_arch = "x86_64")]
use super::loop_nest::CPtr;
#[cfg(target_arch = "x86_64")]
use super::pack::{pack_whole_b, MR, NR};
use super::settings::{detected_kernel, has_avx512_bf16, precision_kernel, GemmKernel};
#[cfg(target_arch = "x86_64")]
use ndarray::s;

/// Below this many multiply-adds packing costs more than it saves: BLAS (or its small-matrix
/// path) is used.
const MIN_WORK: usize = 32 * 32 * 64;

/// `c = alpha · a · b + beta · c` with `a: [M, K]`, `b: [K, N]`, `c: [M, N]`, any strides
/// (transposed views included). Panics on mismatched shapes, like `general_mat_mul`.
pub fn sgemm(
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    sgemm_with(precision_kernel(), alpha, a, b, beta, c)
}

/// [`sgemm`] with the kernel chosen by the caller (tests and benchmarks compare them); a kernel
/// the CPU lacks falls back to BLAS.
pub fn sgemm_with(
    kernel: GemmKernel,
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    assert!(
        k == k2 && c.dim() == (m, n),
        "sgemm: [{m}, {k}] · [{k2}, {n}] into {:?}",
        c.dim()
    );
    let negative = [a.strides(), b.strides(), c.strides()]
        .iter()
        .any(|s| s.iter().any(|&x| x < 0));
    #[cfg(target_arch = "x86_64")]
    if !negative && m * n * k >= MIN_WORK {
        if kernel == GemmKernel::Avx512 && std::arch::is_x86_feature_detected!("avx512f") {
            parallel_gemm(false, alpha, a, b, beta, c);
            return;
        }
        if kernel == GemmKernel::Avx512Bf16 && has_avx512_bf16() {
            parallel_gemm(true, alpha, a, b, beta, c);
            return;
        }
    }
    let _ = (kernel, negative);
    general_mat_mul(alpha, a, b, beta, c);
}

/// `a · b` into a new array (the `dot` of the training paths).
pub fn matmul(a: &ArrayView2<f32>, b: &ArrayView2<f32>) -> ndarray::Array2<f32> {
    matmul_with(precision_kernel(), a, b)
}

/// [`matmul`] in f32 whatever [`precision`] says.
pub fn matmul_f32(a: &ArrayView2<f32>, b: &ArrayView2<f32>) -> ndarray::Array2<f32> {
    matmul_with(detected_kernel(), a, b)
}

fn matmul_with(
    kernel: GemmKernel,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
) -> ndarray::Array2<f32> {
    let mut c = ndarray::Array2::<f32>::zeros((a.nrows(), b.ncols()));
    sgemm_with(kernel, 1.0, a, b, 0.0, &mut c.view_mut());
    c
}

/// Peak f32 multiply-add rate of one core in GFLOP/s (2 flops per FMA lane), measured with
/// independent FMA chains in registers: what "fraction of peak" is a fraction of. Multiply by
/// the threads for the machine.
pub fn peak_fma_gflops_per_core() -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above).
        return unsafe { super::kernel_f32::peak_fma() };
    }
    // Portable estimate: the compiler's vectorised FMA loop.
    let mut acc = [1.0f32; 64];
    let t = std::time::Instant::now();
    let reps = 2_000_000usize;
    for _ in 0..reps {
        for a in acc.iter_mut() {
            *a = a.mul_add(0.999_999, 1e-7);
        }
    }
    std::hint::black_box(&acc);
    (reps * 64 * 2) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// A large product on the AVX-512 kernels (`bf16`: the bf16 one), split over the threads.
#[cfg(target_arch = "x86_64")]
pub(super) fn parallel_gemm(
    bf16: bool,
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    let ((m, k), n) = (a.dim(), b.ncols());
    if k == 0 {
        c.map_inplace(|x| *x = if beta == 0.0 { 0.0 } else { beta * *x });
        return;
    }
    // A frozen weight as B: its panels packed once (the Arc keeps them alive through
    // this call even if the registration ends meanwhile).
    let frozen = lookup(bf16, b);
    if let Some(slot) = &frozen {
        slot.get_or_init(|| pack_whole_b(bf16, b));
    }
    let threads = rayon::current_num_threads().max(1);
    let cp = CPtr {
        ptr: c.as_mut_ptr(),
        rs: c.strides()[0],
        cs: c.strides()[1],
    };
    // Split the longer side so each part still fills whole micro-tiles.
    let split_n = n >= m;
    let (len, unit) = if split_n { (n, NR) } else { (m, MR) };
    let parts = threads.min(len.div_ceil(unit)).max(1);
    let per = len.div_ceil(parts).div_ceil(unit) * unit;
    let shared = &cp;
    let run = |i: usize| {
        // The whole (Send + Sync) struct, not its raw-pointer field, goes to the threads.
        let cp = *shared;
        let (lo, hi) = (i * per, ((i + 1) * per).min(len));
        if lo >= hi {
            return;
        }
        let (a_p, b_p, off) = if split_n {
            (a.view(), b.slice(s![.., lo..hi]), lo as isize * cp.cs)
        } else {
            (a.slice(s![lo..hi, ..]), b.view(), lo as isize * cp.rs)
        };
        // The part's first column in the whole packed B (a multiple of NR).
        let col0 = if split_n { lo } else { 0 };
        let packed = frozen
            .as_ref()
            .and_then(|slot| slot.get())
            .map(|p| (p, col0));
        let c_p = CPtr {
            // SAFETY: `off` is inside C (lo < the split dimension).
            ptr: unsafe { cp.ptr.offset(off) },
            ..cp
        };
        // SAFETY: the caller detected AVX-512F (and BF16 for `bf16`); c_p covers the
        // part's rows/columns.
        unsafe {
            match packed {
                Some((Panels::Bf16(p), col0)) => {
                    gemm_serial_bf16(alpha, &a_p, &b_p, beta, c_p, Some((p, col0)))
                }
                Some((Panels::F32(p), col0)) => {
                    gemm_serial(alpha, &a_p, &b_p, beta, c_p, Some((p, col0)))
                }
                None if bf16 => gemm_serial_bf16(alpha, &a_p, &b_p, beta, c_p, None),
                None => gemm_serial(alpha, &a_p, &b_p, beta, c_p, None),
            }
        };
    };
    // From outside rayon's pool (the training and prefill steps' main thread) the parts
    // go to the spinning team, whose helpers are still awake from the previous product:
    // a rayon join parks the caller and wakes a sleeping worker every time, which cost
    // ~10% of a training step on this VM. Inside rayon's pool (per-head attention,
    // batches scored in parallel), or while another thread holds the team, rayon.
    let team = crate::team::SpinTeam::global();
    let on_team = parts > 1
        && parts == team.parts()
        && rayon::current_thread_index().is_none()
        && team.try_run(&run).is_some();
    if parts == 1 {
        run(0);
    } else if !on_team {
        (0..parts).into_par_iter().for_each(run);
    }
}
