//! Tape-free f32 kernels of the inference path: linear (BLAS), RMSNorm, RoPE, SwiGLU.
//!
//! Every kernel writes into a caller-provided buffer so the decode loop allocates nothing.

use ndarray::linalg::{general_mat_mul, general_mat_vec_mul};
use ndarray::{ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2};

use crate::quant::{detected_kernel, qmatmul_rows, QActs};
use crate::quant::{LinearRef, QMatrix};
use crate::team::SpinTeam;

/// Rows from which a product is a prefill / training one rather than a decode batch.
const PREFILL_ROWS: usize = 32;

/// `y[N, out] = x[N, in] · wᵀ (+ bias)`, `w` is `[out, in]` (PyTorch layout).
///
/// One row goes through sgemv (memory-bound decode at batch 1), decode batches through BLAS
/// sgemm (single-threaded beside the decode's spin team), prefill-sized products through
/// [`crate::gemm`].
pub fn linear_into(
    x: ArrayView2<f32>,
    w: ArrayView2<f32>,
    bias: Option<ArrayView1<f32>>,
    mut y: ArrayViewMut2<f32>,
) {
    if x.nrows() == 1 {
        matvec_split(w, x.row(0), y.row_mut(0));
    } else if x.nrows() < PREFILL_ROWS {
        general_mat_mul(1.0, &x, &w.t(), 0.0, &mut y);
    } else {
        crate::gemm::sgemm(1.0, &x, &w.t(), 0.0, &mut y);
    }
    if let Some(b) = bias {
        for mut row in y.rows_mut() {
            row += &b;
        }
    }
}

pub use crate::gemm::{blas_threads, set_blas_threads};

/// `y = W · x` split over the cores: batch-1 decode is bound by streaming `W`, and
/// one core does not reach the machine's read bandwidth.
fn matvec_split(w: ArrayView2<f32>, x: ArrayView1<f32>, y: ArrayViewMut1<f32>) {
    matvecs_split(x, &mut [(w, y)]);
}

/// Several `y_i = W_i · x` sharing one input (q/k/v, gate/up) in one fork-join:
/// each thread of the [`SpinTeam`] streams its share of the rows of every matrix,
/// so small matrices (k/v) are split too and the group pays a single join.
pub fn matvecs_split(x: ArrayView1<f32>, jobs: &mut [(ArrayView2<f32>, ArrayViewMut1<f32>)]) {
    let Some(xs) = x.as_slice() else {
        for (w, y) in jobs.iter_mut() {
            general_mat_vec_mul(1.0, w, &x, 0.0, y);
        }
        return;
    };
    let team = SpinTeam::global();
    let total_rows: usize = jobs.iter().map(|(w, _)| w.nrows()).sum();
    // Below this, the join costs more than the other cores save. With a
    // multi-threaded OpenBLAS, its threads and ours would oversubscribe the cores.
    const MIN_SPLIT_ROWS: usize = 64;
    let contiguous = jobs.iter_mut().all(|(_, y)| y.as_slice_mut().is_some());
    if total_rows < MIN_SPLIT_ROWS || team.parts() < 2 || blas_threads() != 1 || !contiguous {
        for (w, y) in jobs.iter_mut() {
            matvec_rows(w.view(), xs, y.view_mut());
        }
        return;
    }
    // Fixed-size groups keep the per-call bookkeeping off the heap.
    const GROUP: usize = 4;
    for group in jobs.chunks_mut(GROUP) {
        let mut split: [Option<SplitJob>; GROUP] = Default::default();
        for (slot, (w, y)) in split.iter_mut().zip(group.iter_mut()) {
            let y = y.as_slice_mut().expect("checked contiguous");
            *slot = Some(SplitJob {
                w: w.view(),
                y: y.as_mut_ptr(),
            });
        }
        let parts = team.parts();
        let run_part = |p: usize| {
            for job in split.iter().flatten() {
                let rows = job.w.nrows();
                let (lo, hi) = (rows * p / parts, rows * (p + 1) / parts);
                // SAFETY: `y` has `rows` elements and part `p` alone writes `lo..hi`.
                let y = unsafe { std::slice::from_raw_parts_mut(job.y.add(lo), hi - lo) };
                matvec_rows(
                    job.w.slice(ndarray::s![lo..hi, ..]),
                    xs,
                    ArrayViewMut1::from(y),
                );
            }
        };
        team.run(&run_part);
    }
}

/// One matrix of a [`matvecs_split`] call, shareable across the team's threads.
struct SplitJob<'a> {
    w: ArrayView2<'a, f32>,
    /// Start of the contiguous output `[rows]`; threads write disjoint row ranges.
    y: *mut f32,
}

// SAFETY: `w` is a shared view; `y` is written through disjoint ranges only.
unsafe impl Sync for SplitJob<'_> {}

/// One projection of a [`linears_into`] group: weight, optional bias, output `[N, out]`.
pub type LinearJob<'a, 'b> = (
    LinearRef<'a>,
    Option<ArrayView1<'a, f32>>,
    ArrayViewMut2<'b, f32>,
);

/// Several `y_i = x · W_iᵀ (+ b_i)` sharing one input `x` `[N, in]` (q/k/v, gate/up),
/// whatever each weight's storage.
///
/// f32 weights take exactly the f32 path ([`matvecs_split`] for one row, sgemm for more);
/// quantized weights share one quantization of `x` (into `qx`) and one fork-join over the
/// rows of every quantized matrix (see [`crate::quant::matrix`]).
pub fn linears_into(x: ArrayView2<f32>, jobs: &mut [LinearJob<'_, '_>], qx: &mut QActs) {
    let n = x.nrows();
    let all_f32 = jobs.iter().all(|(w, _, _)| matches!(w, LinearRef::F32(_)));
    if all_f32 && n == 1 && x.row(0).as_slice().is_some() {
        // Up to 4 matrices per fork-join, like `matvecs_split`, without a heap list.
        for group in jobs.chunks_mut(4) {
            let len = group.len();
            let mut views: [Option<(ArrayView2<f32>, ArrayViewMut1<f32>)>; 4] = Default::default();
            for (slot, (w, _, y)) in views.iter_mut().zip(group.iter_mut()) {
                if let LinearRef::F32(a) = w {
                    *slot = Some((a.view(), y.row_mut(0)));
                }
            }
            let mut list: [(ArrayView2<f32>, ArrayViewMut1<f32>); 4] =
                views.map(|v| v.unwrap_or_else(empty_job));
            matvecs_split(x.row(0), &mut list[..len]);
        }
        for (_, bias, y) in jobs.iter_mut() {
            if let Some(b) = bias {
                for mut row in y.rows_mut() {
                    row += &*b;
                }
            }
        }
        return;
    }
    let mut any_quant = false;
    for (w, bias, y) in jobs.iter_mut() {
        match w {
            LinearRef::F32(a) => linear_into(x, *a, *bias, y.view_mut()),
            LinearRef::Quant(_) => any_quant = true,
        }
    }
    if !any_quant {
        return;
    }
    qx.quantize(x);
    qmatmul_split(jobs, qx);
    for (w, bias, y) in jobs.iter_mut() {
        if let (LinearRef::Quant(_), Some(b)) = (w, bias) {
            for mut row in y.rows_mut() {
                row += &*b;
            }
        }
    }
}

/// `y[N, out] = x[N, in] · Wᵀ (+ bias)` for a weight in any storage (see [`linears_into`]).
pub fn linear_any_into<'a>(
    x: ArrayView2<f32>,
    w: LinearRef<'a>,
    bias: Option<ArrayView1<'a, f32>>,
    y: ArrayViewMut2<f32>,
    qx: &mut QActs,
) {
    match w {
        LinearRef::F32(a) => linear_into(x, a, bias, y),
        LinearRef::Quant(_) => linears_into(x, &mut [(w, bias, y)], qx),
    }
}

fn empty_job<'a>() -> (ArrayView2<'a, f32>, ArrayViewMut1<'a, f32>) {
    (
        ArrayView2::from_shape((0, 0), &[]).expect("empty"),
        ArrayViewMut1::from(&mut [][..]),
    )
}

/// The quantized jobs of a [`linears_into`] group against activations `acts` (quantized
/// from their shared input), split over the [`SpinTeam`] by weight rows: each thread
/// streams its share of every matrix once, for all activation rows.
fn qmatmul_split(jobs: &mut [LinearJob<'_, '_>], acts: &QActs) {
    let kernel = detected_kernel();
    let n = acts.rows();
    const GROUP: usize = 4;
    let mut split: [Option<QJob>; GROUP] = Default::default();
    let mut k = 0;
    let team = SpinTeam::global();
    let flush = |split: &mut [Option<QJob>; GROUP]| {
        let total: usize = split.iter().flatten().map(|j| j.w.rows() * n).sum();
        let parts = if total < 64 { 1 } else { team.parts() };
        let run_part = |p: usize| {
            for job in split.iter().flatten() {
                let rows = job.w.rows();
                // Whole tiles per thread where the matrix is tiled (its rows are then a
                // multiple of the tile's).
                let align = job.w.row_alignment();
                let units = rows / align;
                let (lo, hi) = (units * p / parts * align, units * (p + 1) / parts * align);
                // SAFETY: `y` is `[n, rows]` contiguous; part `p` alone writes columns `lo..hi`.
                unsafe { qmatmul_rows(job.w, lo, hi, acts, job.y, rows, kernel) };
            }
        };
        if parts == 1 {
            run_part(0);
        } else {
            team.run(&|p| {
                if p < parts {
                    run_part(p)
                }
            });
        }
        split.iter_mut().for_each(|s| *s = None);
    };
    for (w, _, y) in jobs.iter_mut() {
        let LinearRef::Quant(q) = w else { continue };
        let Some(ys) = y.as_slice_mut() else {
            // Not reached by the block (its buffers are contiguous); kept correct anyway.
            let mut tmp = ndarray::Array2::<f32>::zeros(y.dim());
            let ptr = tmp.as_mut_ptr();
            // SAFETY: `tmp` is a fresh contiguous `[n, rows]` buffer written on this thread.
            unsafe { qmatmul_rows(q, 0, q.rows(), acts, ptr, q.rows(), kernel) };
            y.assign(&tmp);
            continue;
        };
        split[k] = Some(QJob {
            w: q,
            y: ys.as_mut_ptr(),
        });
        k += 1;
        if k == GROUP {
            flush(&mut split);
            k = 0;
        }
    }
    if k > 0 {
        flush(&mut split);
    }
}

/// One quantized matrix of a [`qmatmul_split`] call, shareable across the team's threads.
struct QJob<'a> {
    w: &'a QMatrix,
    /// Start of the contiguous output `[n, rows]`; threads write disjoint column ranges.
    y: *mut f32,
}

// SAFETY: `w` is shared read-only; `y` is written through disjoint column ranges only.
unsafe impl Sync for QJob<'_> {}

/// `y = W · x` on one thread.
///
/// With AVX2+FMA and a contiguous `W`, one row at a time with eight independent
/// accumulators: `W` is then read strictly sequentially, which streams at the
/// machine's read bandwidth, whereas sgemv's 4-row blocking opens four interleaved
/// streams and reached ~0.85–0.9 of it here (`elm bench` shows the ratio).
fn matvec_rows(w: ArrayView2<f32>, x: &[f32], mut y: ArrayViewMut1<f32>) {
    #[cfg(target_arch = "x86_64")]
    if let (Some(ws), Some(ys)) = (w.as_slice(), y.as_slice_mut()) {
        let shapes_match = w.ncols() == x.len() && w.nrows() == ys.len() && !x.is_empty();
        if shapes_match && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA are present (checked above); `ws` holds
            // `ys.len()` rows of `x.len()` values (standard layout of `w`).
            unsafe { matvec_rows_avx2(ws, x, ys) };
            return;
        }
    }
    general_mat_vec_mul(1.0, &w, &ArrayView1::from(x), 0.0, &mut y);
}

/// Row-sequential `y = W · x` for a row-major `W` `[y.len(), x.len()]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn matvec_rows_avx2(w: &[f32], x: &[f32], y: &mut [f32]) {
    use std::arch::x86_64::*;
    let cols = x.len();
    debug_assert_eq!(w.len(), cols * y.len());
    let (full, vecs) = (cols / 64 * 64, cols / 8 * 8);
    let xp = x.as_ptr();
    for (row, out) in w.chunks_exact(cols).zip(y.iter_mut()) {
        let p = row.as_ptr();
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut c = 0;
        while c < full {
            for (k, a) in acc.iter_mut().enumerate() {
                let (wv, xv) = (
                    _mm256_loadu_ps(p.add(c + 8 * k)),
                    _mm256_loadu_ps(xp.add(c + 8 * k)),
                );
                *a = _mm256_fmadd_ps(wv, xv, *a);
            }
            c += 64;
        }
        // At most seven more full vectors: one per accumulator.
        for a in acc.iter_mut() {
            if c >= vecs {
                break;
            }
            *a = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(c)), _mm256_loadu_ps(xp.add(c)), *a);
            c += 8;
        }
        let pairs = [
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
            _mm256_add_ps(acc[4], acc[5]),
            _mm256_add_ps(acc[6], acc[7]),
        ];
        let sum = _mm256_add_ps(
            _mm256_add_ps(pairs[0], pairs[1]),
            _mm256_add_ps(pairs[2], pairs[3]),
        );
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
        let mut total: f32 = lanes.iter().sum();
        for (wv, xv) in row[vecs..].iter().zip(&x[vecs..]) {
            total += wv * xv;
        }
        *out = total;
    }
}

/// `out[n, :] = x[n, :] / sqrt(mean(x[n, :]²) + eps) * gain`, rows `[N, C]`.
pub fn rms_norm_into(
    x: ArrayView2<f32>,
    gain: ArrayView1<f32>,
    eps: f32,
    mut out: ArrayViewMut2<f32>,
) {
    let gain = gain.as_slice().expect("contiguous gain");
    for (xr, mut or) in x.rows().into_iter().zip(out.rows_mut()) {
        let xs = xr.as_slice().expect("contiguous rows");
        let os = or.as_slice_mut().expect("contiguous rows");
        let inv = inv_rms(xs, eps);
        for ((o, &v), &g) in os.iter_mut().zip(xs).zip(gain) {
            *o = v * inv * g;
        }
    }
}

/// `1 / sqrt(mean(x²) + eps)` of one row.
fn inv_rms(xs: &[f32], eps: f32) -> f32 {
    let mean_sq = crate::simd::sum_of_squares::<f32, f32>(xs) / xs.len() as f32;
    1.0 / (mean_sq + eps).sqrt()
}

/// RMSNorm of every `width`-wide chunk of `rows` in place, each times `gain` (`[width]`):
/// Gemma 3's per-head norm of q and k (width `D`), and its norm of a sublayer's output
/// (width `C`).
pub fn rms_norm_chunks_inplace(rows: &mut [f32], gain: &[f32], eps: f32) {
    for chunk in rows.chunks_exact_mut(gain.len()) {
        let inv = inv_rms(chunk, eps);
        for (v, &g) in chunk.iter_mut().zip(gain) {
            *v = *v * inv * g;
        }
    }
}

/// `gate[i] = gelu_tanh(gate[i]) * up[i]` (GeGLU, Gemma 3; [`crate::nn::geglu::gelu_weights`],
/// the training path's definition), in place on `gate`.
pub fn geglu_tanh_inplace(gate: &mut [f32], up: &[f32]) {
    // GELU's weights σ(2u) a block at a time (vectorised), then g·σ(2u)·u.
    let mut s = [0.0f32; 256];
    for (g, u) in gate.chunks_mut(256).zip(up.chunks(256)) {
        let s = &mut s[..g.len()];
        crate::nn::geglu::gelu_weights(g.iter().copied(), s);
        for ((g, &u), &s) in g.iter_mut().zip(u).zip(s.iter()) {
            *g = *g * s * u;
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]` (SwiGLU), in place on `gate`.
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    // σ(g) a block at a time (vectorised), then g·σ(g)·u.
    let mut s = [0.0f32; 256];
    for (g, u) in gate.chunks_mut(256).zip(up.chunks(256)) {
        let s = &mut s[..g.len()];
        s.copy_from_slice(g);
        crate::simd::sigmoid_in_place(s);
        for ((g, &u), &s) in g.iter_mut().zip(u).zip(s.iter()) {
            *g = *g * s * u;
        }
    }
}

/// [`masked_softmax_inplace`] over the keys `first..visible` only (a sliding window):
/// `row[..first]` is set to 0 too.
pub fn windowed_softmax_inplace(row: &mut [f32], first: usize, visible: usize) {
    masked_softmax_inplace(&mut row[first..], visible - first);
    row[..first].iter_mut().for_each(|v| *v = 0.0);
}

/// In-place softmax of `row[..visible]`; `row[visible..]` is set to 0 (causal mask).
pub fn masked_softmax_inplace(row: &mut [f32], visible: usize) {
    let (live, dead) = row.split_at_mut(visible);
    let max = live.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    live.iter_mut().for_each(|v| *v -= max);
    crate::simd::exp_in_place(live);
    let sum: f32 = live.iter().sum();
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
    /// The base the table was built for.
    theta: f32,
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
            theta,
            cos,
            sin,
        }
    }

    /// The RoPE base the table was built for.
    pub fn theta(&self) -> f32 {
        self.theta
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
