//! Tape-free f32 kernels of the inference path: linear (BLAS), RMSNorm, RoPE, SwiGLU.
//!
//! Every kernel writes into a caller-provided buffer so the decode loop allocates nothing.

use ndarray::linalg::{general_mat_mul, general_mat_vec_mul};
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2, Axis};

/// `y[N, out] = x[N, in] · wᵀ (+ bias)`, `w` is `[out, in]` (PyTorch layout).
///
/// One row goes through sgemv (memory-bound decode at batch 1), more rows through sgemm.
pub fn linear_into(
    x: ArrayView2<f32>,
    w: &Array2<f32>,
    bias: Option<&Array1<f32>>,
    mut y: ArrayViewMut2<f32>,
) {
    if x.nrows() == 1 {
        matvec_split(w.view(), x.row(0), y.row_mut(0));
    } else {
        general_mat_mul(1.0, &x, &w.t(), 0.0, &mut y);
    }
    if let Some(b) = bias {
        for mut row in y.rows_mut() {
            row += b;
        }
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
/// matvecs are then split over the rayon pool instead, and a 2-thread OpenBLAS
/// oversubscribes the cores when anything else runs.
pub fn set_blas_threads(n: usize) {
    // SAFETY: plain setter of the linked system OpenBLAS.
    unsafe { openblas_set_num_threads(n.max(1) as std::os::raw::c_int) }
}

/// `y = W · x` split over two rayon workers: batch-1 decode is bound by streaming `W`,
/// and one core does not reach the machine's read bandwidth.
fn matvec_split(w: ArrayView2<f32>, x: ArrayView1<f32>, y: ArrayViewMut1<f32>) {
    matvecs_split(x, &mut [(w, y)]);
}

/// Several `y_i = W_i · x` sharing one input (q/k/v, gate/up) in one fork-join:
/// each of the two workers streams half the rows of every matrix, so small matrices
/// (k/v) are split too and the pair pays a single join.
pub fn matvecs_split(x: ArrayView1<f32>, jobs: &mut [(ArrayView2<f32>, ArrayViewMut1<f32>)]) {
    let Some(xs) = x.as_slice() else {
        for (w, y) in jobs.iter_mut() {
            general_mat_vec_mul(1.0, w, &x, 0.0, y);
        }
        return;
    };
    let total_rows: usize = jobs.iter().map(|(w, _)| w.nrows()).sum();
    // Below this, the join costs more than the second core saves.
    const MIN_SPLIT_ROWS: usize = 64;
    if total_rows < MIN_SPLIT_ROWS || rayon::current_num_threads() < 2 {
        for (w, y) in jobs.iter_mut() {
            matvec_rows(w.view(), xs, y.view_mut());
        }
        return;
    }
    let mut first = Vec::with_capacity(jobs.len());
    let mut second = Vec::with_capacity(jobs.len());
    for (w, y) in jobs.iter_mut() {
        let mid = w.nrows() / 2;
        let (w1, w2) = w.view().split_at(Axis(0), mid);
        let (y1, y2) = y.view_mut().split_at(Axis(0), mid);
        first.push((w1, y1));
        second.push((w2, y2));
    }
    let run = |part: Vec<(ArrayView2<f32>, ArrayViewMut1<f32>)>| {
        for (w, y) in part {
            matvec_rows(w, xs, y);
        }
    };
    rayon::join(|| run(first), || run(second));
}

/// `y = W · x` on one thread: the hand-written AVX2/FMA kernel when the CPU has it
/// and `W` is row-contiguous, else sgemv.
fn matvec_rows(w: ArrayView2<f32>, x: &[f32], mut y: ArrayViewMut1<f32>) {
    let cols = w.ncols();
    #[cfg(target_arch = "x86_64")]
    {
        if let (Some(ws), Some(ys)) = (w.as_slice(), y.as_slice_mut()) {
            if cols > 0 && has_avx2_fma() {
                // SAFETY: the CPU supports AVX2 and FMA (checked above).
                unsafe { matvec_avx2(ws, cols, x, ys) };
                return;
            }
        }
    }
    let _ = cols;
    general_mat_vec_mul(1.0, &w, &ArrayView1::from(x), 0.0, &mut y);
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// Row-major `w` `[R, cols]`: four rows at a time, two 4-wide f64 accumulators per
/// row (8 independent FMA chains). Widening to f64 is free here (the loop is bound by
/// loading `w`) and keeps the batch-1 result within rounding of the sgemm path.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn matvec_avx2(w: &[f32], cols: usize, x: &[f32], y: &mut [f32]) {
    use std::arch::x86_64::*;
    #[inline(always)]
    unsafe fn hsum(v: __m256d) -> f64 {
        let s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
        _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
    }
    #[inline(always)]
    unsafe fn wide(p: *const f32) -> __m256d {
        _mm256_cvtps_pd(_mm_loadu_ps(p))
    }
    let rows = y.len();
    debug_assert_eq!(w.len(), rows * cols);
    debug_assert_eq!(x.len(), cols);
    let vec_cols = cols / 8 * 8;
    let xp = x.as_ptr();
    let tail = |r: usize| -> f64 {
        let row = &w[r * cols..(r + 1) * cols];
        row[vec_cols..]
            .iter()
            .zip(&x[vec_cols..])
            .map(|(&a, &b)| a as f64 * b as f64)
            .sum()
    };
    let mut r = 0;
    while r + 4 <= rows {
        let p = [
            w.as_ptr().add(r * cols),
            w.as_ptr().add((r + 1) * cols),
            w.as_ptr().add((r + 2) * cols),
            w.as_ptr().add((r + 3) * cols),
        ];
        let mut a = [_mm256_setzero_pd(); 8];
        let mut j = 0;
        while j < vec_cols {
            let x0 = wide(xp.add(j));
            let x1 = wide(xp.add(j + 4));
            for k in 0..4 {
                a[2 * k] = _mm256_fmadd_pd(wide(p[k].add(j)), x0, a[2 * k]);
                a[2 * k + 1] = _mm256_fmadd_pd(wide(p[k].add(j + 4)), x1, a[2 * k + 1]);
            }
            j += 8;
        }
        for k in 0..4 {
            y[r + k] = (hsum(_mm256_add_pd(a[2 * k], a[2 * k + 1])) + tail(r + k)) as f32;
        }
        r += 4;
    }
    while r < rows {
        let pr = w.as_ptr().add(r * cols);
        let mut a0 = _mm256_setzero_pd();
        let mut a1 = _mm256_setzero_pd();
        let mut j = 0;
        while j < vec_cols {
            a0 = _mm256_fmadd_pd(wide(pr.add(j)), wide(xp.add(j)), a0);
            a1 = _mm256_fmadd_pd(wide(pr.add(j + 4)), wide(xp.add(j + 4)), a1);
            j += 8;
        }
        y[r] = (hsum(_mm256_add_pd(a0, a1)) + tail(r)) as f32;
        r += 1;
    }
}

/// `out[n, :] = x[n, :] / sqrt(mean(x[n, :]²) + eps) * gain`, rows `[N, C]`.
pub fn rms_norm_into(
    x: ArrayView2<f32>,
    gain: &Array1<f32>,
    eps: f32,
    mut out: ArrayViewMut2<f32>,
) {
    let gain = gain.as_slice().expect("contiguous gain");
    for (xr, mut or) in x.rows().into_iter().zip(out.rows_mut()) {
        let xs = xr.as_slice().expect("contiguous rows");
        let os = or.as_slice_mut().expect("contiguous rows");
        let mean_sq = xs.iter().map(|v| v * v).sum::<f32>() / xs.len() as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for ((o, &v), &g) in os.iter_mut().zip(xs).zip(gain) {
            *o = v * inv * g;
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]` (SwiGLU), in place on `gate`.
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// In-place softmax of `row[..visible]`; `row[visible..]` is set to 0 (causal mask).
pub fn masked_softmax_inplace(row: &mut [f32], visible: usize) {
    let (live, dead) = row.split_at_mut(visible);
    let max = live.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in live.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    live.iter_mut().for_each(|v| *v *= inv);
    dead.iter_mut().for_each(|v| *v = 0.0);
}

/// cos/sin tables of half-split RoPE: `angle(p, i) = p · theta^(-2i/D)`, `i < D/2`.
///
/// Computed in f64 then rounded, so long positions do not accumulate f32 error.
#[derive(Clone, Debug, Default)]
pub struct RopeTable {
    half: usize,
    positions: usize,
    /// `[P, D/2]`
    cos: Vec<f32>,
    /// `[P, D/2]`
    sin: Vec<f32>,
}

impl RopeTable {
    /// Table for positions `0..positions` of a `head_dim`-wide head.
    pub fn new(head_dim: usize, theta: f32, positions: usize) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| (theta as f64).powf(-2.0 * i as f64 / head_dim as f64))
            .collect();
        for p in 0..positions {
            for f in &inv_freq {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        RopeTable {
            half,
            positions,
            cos,
            sin,
        }
    }

    /// Number of positions covered.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Bytes held by the tables.
    pub fn bytes(&self) -> usize {
        (self.cos.capacity() + self.sin.capacity()) * std::mem::size_of::<f32>()
    }

    /// Rotates every `D`-wide head in `row` (HF half-split pairs `(i, i + D/2)`) to position `pos`.
    pub fn apply(&self, row: &mut [f32], pos: usize) {
        let h = self.half;
        let cos = &self.cos[pos * h..(pos + 1) * h];
        let sin = &self.sin[pos * h..(pos + 1) * h];
        for head in row.chunks_exact_mut(2 * h) {
            let (x1, x2) = head.split_at_mut(h);
            for i in 0..h {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * cos[i] - b * sin[i];
                x2[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}
