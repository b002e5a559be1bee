//! Quantized weight matrices for inference: GGUF Q8_0 / Q4_0 / Q4_1 blocks kept as they are
//! in memory, and integer matrix products on them.
//!
//! Batch-1 decode is bound by the bytes of weights read per token, so the weights stay in
//! their 4.5–8.5-bit block formats. The activation rows are quantized to 8-bit blocks of 32
//! (`d = max|x| / 127`, `q = round(x / d)`, plus `s = d · Σq`), and each block product is an
//! integer dot product (AVX2 `maddubs`: u8 × i8 pairs summed to i16, then to i32) scaled by
//! the two block scales:
//!
//! - Q8_0 `x = d·q`:        `Σ w·x ≈ d_w·d_x·Σ q_w q_x`
//! - Q4_0 `x = d·(q − 8)`:  `Σ w·x ≈ d_w·d_x·Σ q_w q_x − 8·d_w·s_x`
//! - Q4_1 `x = d·q + m`:    `Σ w·x ≈ d_w·d_x·Σ q_w q_x + m_w·s_x`
//!
//! (the same scheme as ggml's `vec_dot_q4_1_q8_1`; code written here). Rows whose length is
//! not a multiple of 32 are zero-padded to whole blocks, in the weights and the activations.
//!
//! This module is plain data plus kernels, like [`super::weights`]: the GGUF reader fills a
//! [`QMatrix`] from a file's bytes, [`QMatrix::quantize`] makes one from f32 weights.

use half::f16;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use super::config::ModelConfig;
use super::weights::{FfnWeights, LayerWeights, ModelWeights};
use crate::error::{ElmError, Result};

/// Elements per quantization block (all supported formats).
pub const QK: usize = 32;

/// A block format of a [`QMatrix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QFormat {
    /// `d: f16 | q: i8[32]`, 34 bytes.
    Q8_0,
    /// `d: f16 | nibbles: u8[16]`, 18 bytes; element `j < 16` is the low nibble of byte `j`,
    /// element `j + 16` its high nibble.
    Q4_0,
    /// `d: f16 | m: f16 | nibbles: u8[16]`, 20 bytes; nibble order as Q4_0.
    Q4_1,
}

impl QFormat {
    /// Bytes of one block of [`QK`] elements.
    pub fn block_bytes(self) -> usize {
        match self {
            QFormat::Q8_0 => 34,
            QFormat::Q4_0 => 18,
            QFormat::Q4_1 => 20,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            QFormat::Q8_0 => "q8_0",
            QFormat::Q4_0 => "q4_0",
            QFormat::Q4_1 => "q4_1",
        }
    }
}

impl std::str::FromStr for QFormat {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(QFormat::Q8_0),
            "q4_0" => Ok(QFormat::Q4_0),
            "q4_1" => Ok(QFormat::Q4_1),
            _ => Err(ElmError::config(
                "weights",
                format!("`{s}`: expected q8_0, q4_0 or q4_1"),
            )),
        }
    }
}

/// How the inference path stores a model's matrices (`--weights`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightStorage {
    /// Dequantized to f32 at load (the reference path).
    F32,
    /// Each matrix in its file's type: quantized blocks stay quantized, f32/f16/bf16 go to f32.
    Auto,
    /// Every matrix in this block format (requantized or quantized on the fly if needed).
    Quant(QFormat),
}

impl std::str::FromStr for WeightStorage {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(WeightStorage::F32),
            "auto" => Ok(WeightStorage::Auto),
            other => other.parse().map(WeightStorage::Quant).map_err(|_| {
                ElmError::config(
                    "weights",
                    format!("`{s}`: expected f32, auto, q8_0, q4_0 or q4_1"),
                )
            }),
        }
    }
}

impl std::fmt::Display for WeightStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightStorage::F32 => write!(f, "f32"),
            WeightStorage::Auto => write!(f, "auto"),
            WeightStorage::Quant(q) => write!(f, "{}", q.name()),
        }
    }
}

/// A `[rows, cols]` matrix (PyTorch `[out, in]` layout) stored as row-major quantized blocks;
/// each row holds `cols.div_ceil(32)` blocks (the last one zero-padded).
#[derive(Clone, Debug, PartialEq)]
pub struct QMatrix {
    format: QFormat,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl QMatrix {
    /// Wraps raw blocks (e.g. a GGUF tensor's bytes, rows in file order).
    pub fn from_blocks(format: QFormat, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self> {
        let want = rows * cols.div_ceil(QK) * format.block_bytes();
        if data.len() != want {
            return Err(ElmError::shape(
                "QMatrix::from_blocks",
                format!(
                    "{} bytes for a [{rows}, {cols}] {} matrix (want {want})",
                    data.len(),
                    format.name()
                ),
            ));
        }
        Ok(QMatrix {
            format,
            rows,
            cols,
            data,
        })
    }

    /// Quantizes f32 weights `[rows, cols]` with ggml's reference rounding.
    pub fn quantize(w: ArrayView2<f32>, format: QFormat) -> Self {
        let (rows, cols) = w.dim();
        let nb = cols.div_ceil(QK);
        let bb = format.block_bytes();
        let mut data = vec![0u8; rows * nb * bb];
        let mut padded = vec![0f32; nb * QK];
        for (r, row) in w.rows().into_iter().enumerate() {
            padded.iter_mut().for_each(|v| *v = 0.0);
            for (p, &v) in padded.iter_mut().zip(row.iter()) {
                *p = v;
            }
            let out = &mut data[r * nb * bb..(r + 1) * nb * bb];
            for (src, dst) in padded.chunks_exact(QK).zip(out.chunks_exact_mut(bb)) {
                quantize_block(format, src, dst);
            }
        }
        QMatrix {
            format,
            rows,
            cols,
            data,
        }
    }

    pub fn format(&self) -> QFormat {
        self.format
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn dim(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }
    /// Blocks per row.
    pub fn row_blocks(&self) -> usize {
        self.cols.div_ceil(QK)
    }
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_blocks() * self.format.block_bytes()
    }
    /// Bytes held (what a matrix product reads).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
    /// The raw blocks, row-major.
    pub fn data(&self) -> &[u8] {
        &self.data
    }
    fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Row `r` as f32 into `out` (`cols` long).
    pub fn dequantize_row_into(&self, r: usize, out: &mut [f32]) {
        let mut block = [0f32; QK];
        let bb = self.format.block_bytes();
        for (bi, src) in self.row(r).chunks_exact(bb).enumerate() {
            dequantize_block(self.format, src, &mut block);
            let lo = bi * QK;
            let hi = (lo + QK).min(self.cols);
            out[lo..hi].copy_from_slice(&block[..hi - lo]);
        }
    }

    /// The whole matrix as f32 `[rows, cols]` (the reference the kernels are tested against).
    pub fn dequantize(&self) -> Array2<f32> {
        let mut out = Array2::zeros((self.rows, self.cols));
        for (r, mut row) in out.rows_mut().into_iter().enumerate() {
            self.dequantize_row_into(r, row.as_slice_mut().expect("standard layout"));
        }
        out
    }

    /// The same rows in another order: row `i` of the result is row `order[i]` of `self`
    /// (blocks are per row, so this is exact).
    pub fn select_rows(&self, order: &[usize]) -> Result<Self> {
        let rb = self.row_bytes();
        let mut data = Vec::with_capacity(order.len() * rb);
        for &r in order {
            if r >= self.rows {
                return Err(ElmError::shape(
                    "QMatrix::select_rows",
                    format!("row {r} of {}", self.rows),
                ));
            }
            data.extend_from_slice(self.row(r));
        }
        QMatrix::from_blocks(self.format, order.len(), self.cols, data)
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn put_f16(b: &mut [u8], i: usize, v: f32) {
    b[i..i + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// Decodes one block (same arithmetic as `io::gguf::dequantize`).
fn dequantize_block(format: QFormat, b: &[u8], out: &mut [f32; QK]) {
    match format {
        QFormat::Q8_0 => {
            let d = f16_at(b, 0);
            for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                *o = (q as i8) as f32 * d;
            }
        }
        QFormat::Q4_0 => {
            let d = f16_at(b, 0);
            for (j, &q) in b[2..18].iter().enumerate() {
                out[j] = d * ((q & 0x0F) as i32 - 8) as f32;
                out[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
            }
        }
        QFormat::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for (j, &q) in b[4..20].iter().enumerate() {
                out[j] = d * (q & 0x0F) as f32 + m;
                out[j + 16] = d * (q >> 4) as f32 + m;
            }
        }
    }
}

/// Encodes one block of 32 values (ggml's `quantize_row_*_ref`).
fn quantize_block(format: QFormat, x: &[f32], out: &mut [u8]) {
    match format {
        QFormat::Q8_0 => {
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            put_f16(out, 0, d);
            for (o, &v) in out[2..34].iter_mut().zip(x) {
                *o = ((v * id).round() as i8) as u8;
            }
        }
        QFormat::Q4_0 => {
            // The value of largest magnitude maps to −8, so its sign is kept.
            let max = x
                .iter()
                .copied()
                .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            put_f16(out, 0, d);
            for j in 0..16 {
                let q = |v: f32| ((v * id + 8.5) as i8).clamp(0, 15) as u8;
                out[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
            }
        }
        QFormat::Q4_1 => {
            let min = x.iter().copied().fold(f32::INFINITY, f32::min);
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let d = (max - min) / 15.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            put_f16(out, 0, d);
            put_f16(out, 2, min);
            for j in 0..16 {
                let q = |v: f32| (((v - min) * id + 0.5) as i8).clamp(0, 15) as u8;
                out[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
            }
        }
    }
}

/// Activation rows quantized to 8-bit blocks: the right-hand side of the integer products.
/// Reused between calls (grown, never shrunk), so decode allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct QActs {
    rows: usize,
    blocks: usize,
    /// `[rows, blocks·32]`
    qs: Vec<i8>,
    /// `[rows, blocks]` block scales.
    d: Vec<f32>,
    /// `[rows, blocks]` `d · Σ q` of each block (the Q4_0 / Q4_1 offset terms).
    s: Vec<f32>,
}

impl QActs {
    /// Quantizes the rows of `x` `[N, K]` (each zero-padded to whole blocks).
    pub fn quantize(&mut self, x: ArrayView2<f32>) {
        let (n, k) = x.dim();
        let nb = k.div_ceil(QK);
        self.rows = n;
        self.blocks = nb;
        grow(&mut self.qs, n * nb * QK, 0);
        grow(&mut self.d, n * nb, 0.0);
        grow(&mut self.s, n * nb, 0.0);
        let mut padded = [0f32; QK];
        for (r, row) in x.rows().into_iter().enumerate() {
            let contiguous = row.as_slice();
            for b in 0..nb {
                let (lo, hi) = (b * QK, ((b + 1) * QK).min(k));
                let src: &[f32] = match contiguous {
                    Some(s) if hi - lo == QK => &s[lo..hi],
                    _ => {
                        padded.iter_mut().for_each(|v| *v = 0.0);
                        for (p, c) in padded.iter_mut().zip(lo..hi) {
                            *p = row[c];
                        }
                        &padded
                    }
                };
                let i = r * nb + b;
                let qs = &mut self.qs[i * QK..(i + 1) * QK];
                let (d, sum) = quantize_act_block(src, qs);
                self.d[i] = d;
                self.s[i] = d * sum as f32;
            }
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The quantized rows as f32 `[N, blocks·32]`: what the integer kernels multiply by
    /// (the exact reference for them).
    pub fn dequantize(&self) -> Array2<f32> {
        let (n, nb) = (self.rows, self.blocks);
        Array2::from_shape_fn((n, nb * QK), |(r, c)| {
            self.qs[r * nb * QK + c] as f32 * self.d[r * nb + c / QK]
        })
    }

    /// Bytes held by the buffers.
    pub fn bytes(&self) -> usize {
        self.qs.capacity() + 4 * (self.d.capacity() + self.s.capacity())
    }
}

fn grow<T: Copy>(v: &mut Vec<T>, n: usize, fill: T) {
    if v.len() < n {
        v.resize(n, fill);
    }
}

/// One activation block: `q = round(x / d)`, `d = max|x| / 127`; returns `(d, Σ q)`.
fn quantize_act_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        let qi = (v * id).round() as i8;
        *o = qi;
        sum += qi as i32;
    }
    (d, sum)
}

/// Which kernel [`qmatmul_rows`] uses; detected once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Avx2,
    Portable,
}

/// The fastest kernel this CPU supports.
pub fn detected_kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let ok = *AVX2.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        });
        if ok {
            return Kernel::Avx2;
        }
    }
    Kernel::Portable
}

/// `y[r, o] = Σ_k W[o, k] · x[r, k]` for weight rows `o ∈ lo..hi` and every activation row `r`
/// of `acts` (quantized from `x`), written to `y[r · y_stride + o]`.
///
/// # Safety
/// `y` must be valid for writes at `r · y_stride + o` for every `r < acts.rows()`, `o ∈ lo..hi`,
/// and no other thread may write those elements concurrently.
pub unsafe fn qmatmul_rows(
    w: &QMatrix,
    lo: usize,
    hi: usize,
    acts: &QActs,
    y: *mut f32,
    y_stride: usize,
    kernel: Kernel,
) {
    debug_assert_eq!(acts.blocks, w.row_blocks());
    let n = acts.rows;
    for o in lo..hi {
        let row = w.row(o);
        let mut r = 0;
        while r < n {
            let take = match n - r {
                8.. => 8,
                4.. => 4,
                2.. => 2,
                _ => 1,
            };
            let mut out = [0f32; 8];
            match take {
                8 => dot_group::<8>(w.format, row, acts, r, &mut out, kernel),
                4 => dot_group::<4>(w.format, row, acts, r, &mut out, kernel),
                2 => dot_group::<2>(w.format, row, acts, r, &mut out, kernel),
                _ => dot_group::<1>(w.format, row, acts, r, &mut out, kernel),
            }
            for (i, &v) in out[..take].iter().enumerate() {
                *y.add((r + i) * y_stride + o) = v;
            }
            r += take;
        }
    }
}

/// Dot products of one weight row with activation rows `r0..r0+R` into `out[..R]`.
fn dot_group<const R: usize>(
    format: QFormat,
    row: &[u8],
    acts: &QActs,
    r0: usize,
    out: &mut [f32; 8],
    kernel: Kernel,
) {
    let nb = acts.blocks;
    let xq: [&[i8]; R] = std::array::from_fn(|i| {
        let r = r0 + i;
        &acts.qs[r * nb * QK..(r + 1) * nb * QK]
    });
    let xd: [&[f32]; R] = std::array::from_fn(|i| &acts.d[(r0 + i) * nb..(r0 + i + 1) * nb]);
    let xs: [&[f32]; R] = std::array::from_fn(|i| &acts.s[(r0 + i) * nb..(r0 + i + 1) * nb]);
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx2 {
        // SAFETY: `Kernel::Avx2` is only returned when AVX2, FMA and F16C were detected;
        // `row` holds `nb` blocks and every `xq[i]` `nb · 32` values.
        let res = unsafe {
            match format {
                QFormat::Q4_1 => avx2::dot_q4::<R, true>(row, nb, &xq, &xd, &xs),
                QFormat::Q4_0 => avx2::dot_q4::<R, false>(row, nb, &xq, &xd, &xs),
                QFormat::Q8_0 => avx2::dot_q8_0::<R>(row, nb, &xq, &xd),
            }
        };
        out[..R].copy_from_slice(&res);
        return;
    }
    let _ = kernel;
    let res = portable_dot::<R>(format, row, nb, &xq, &xd, &xs);
    out[..R].copy_from_slice(&res);
}

/// Scalar integer kernel (any CPU); the same arithmetic as the AVX2 one up to the order of
/// the f32 additions.
fn portable_dot<const R: usize>(
    format: QFormat,
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
    xs: &[&[f32]; R],
) -> [f32; R] {
    let mut acc = [0f32; R];
    let bb = format.block_bytes();
    let mut wq = [0i32; QK];
    for (b, blk) in row.chunks_exact(bb).take(nb).enumerate() {
        let (d, offset) = match format {
            QFormat::Q8_0 => {
                for (w, &q) in wq.iter_mut().zip(&blk[2..34]) {
                    *w = (q as i8) as i32;
                }
                (f16_at(blk, 0), 0.0)
            }
            QFormat::Q4_0 | QFormat::Q4_1 => {
                let start = if format == QFormat::Q4_1 { 4 } else { 2 };
                for (j, &q) in blk[start..start + 16].iter().enumerate() {
                    wq[j] = (q & 0x0F) as i32;
                    wq[j + 16] = (q >> 4) as i32;
                }
                let d = f16_at(blk, 0);
                let off = if format == QFormat::Q4_1 {
                    f16_at(blk, 2)
                } else {
                    -8.0 * d
                };
                (d, off)
            }
        };
        for r in 0..R {
            let x = &xq[r][b * QK..(b + 1) * QK];
            let dot: i32 = wq.iter().zip(x).map(|(&w, &x)| w * x as i32).sum();
            acc[r] += d * xd[r][b] * dot as f32 + offset * xs[r][b];
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::QK;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// Q4_1 (`Q41 = true`) or Q4_0 weights against 8-bit activations.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4<const R: usize, const Q41: bool>(
        row: &[u8],
        nb: usize,
        xq: &[&[i8]; R],
        xd: &[&[f32]; R],
        xs: &[&[f32]; R],
    ) -> [f32; R] {
        let bb = if Q41 { 20 } else { 18 };
        let qoff = if Q41 { 4 } else { 2 };
        let mut acc = [_mm256_setzero_ps(); R];
        let mut off = [0f32; R];
        let low = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let p = row.as_ptr();
        for b in 0..nb {
            let blk = p.add(b * bb);
            // d (and m) from f16 with one F16C conversion.
            let scales = if Q41 {
                _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()))
            } else {
                _mm_cvtph_ps(_mm_cvtsi32_si128(
                    (blk as *const u16).read_unaligned() as i32
                ))
            };
            let d = _mm_cvtss_f32(scales);
            let o = if Q41 {
                _mm_cvtss_f32(_mm_movehdup_ps(scales))
            } else {
                -8.0 * d
            };
            // 16 bytes → 32 nibbles in element order: low nibbles are elements 0..16.
            let raw = _mm_loadu_si128(blk.add(qoff) as *const __m128i);
            let wq = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
            for r in 0..R {
                let x = _mm256_loadu_si256(xq[r].as_ptr().add(b * QK) as *const __m256i);
                // u8 (≤ 15) × i8 pairs: |sum| ≤ 2·15·127, no i16 saturation.
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, x), ones);
                let scale = _mm256_set1_ps(d * *xd[r].get_unchecked(b));
                acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[r]);
                off[r] += o * *xs[r].get_unchecked(b);
            }
        }
        std::array::from_fn(|r| hsum(acc[r]) + off[r])
    }

    /// Q8_0 weights against 8-bit activations (signed × signed via the sign trick:
    /// `|w| · (x · sign(w))`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q8_0<const R: usize>(
        row: &[u8],
        nb: usize,
        xq: &[&[i8]; R],
        xd: &[&[f32]; R],
    ) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        let ones = _mm256_set1_epi16(1);
        let p = row.as_ptr();
        for b in 0..nb {
            let blk = p.add(b * 34);
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                (blk as *const u16).read_unaligned() as i32,
            )));
            let w = _mm256_loadu_si256(blk.add(2) as *const __m256i);
            // |w| ≤ 128 as u8; x ∈ [−127, 127] (activations never hold −128): pairs sum to
            // at most 2·128·127 < 2^15.
            let aw = _mm256_sign_epi8(w, w);
            for r in 0..R {
                let x = _mm256_loadu_si256(xq[r].as_ptr().add(b * QK) as *const __m256i);
                let sx = _mm256_sign_epi8(x, w);
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                let scale = _mm256_set1_ps(d * *xd[r].get_unchecked(b));
                acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[r]);
            }
        }
        std::array::from_fn(|r| hsum(acc[r]))
    }
}

/// A weight matrix of the inference path in any storage.
#[derive(Clone, Debug)]
pub enum Linear {
    F32(Array2<f32>),
    Quant(QMatrix),
}

/// A borrowed [`Linear`]: what the block kernels take.
#[derive(Clone, Copy, Debug)]
pub enum LinearRef<'a> {
    /// A view, so weights held elsewhere (the tape's shared values) are read in place.
    F32(ArrayView2<'a, f32>),
    Quant(&'a QMatrix),
}

impl Linear {
    /// `w` kept as f32 (`None`) or quantized to `format`.
    pub fn from_f32(w: &Array2<f32>, format: Option<QFormat>) -> Self {
        match format {
            None => Linear::F32(w.clone()),
            Some(f) => Linear::Quant(QMatrix::quantize(w.view(), f)),
        }
    }
    pub fn as_ref(&self) -> LinearRef<'_> {
        match self {
            Linear::F32(a) => LinearRef::F32(a.view()),
            Linear::Quant(q) => LinearRef::Quant(q),
        }
    }
    pub fn dim(&self) -> (usize, usize) {
        self.as_ref().dim()
    }
    /// Bytes of weights held.
    pub fn bytes(&self) -> usize {
        self.as_ref().bytes()
    }
    /// Row `r` as f32 (the embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        match self {
            Linear::F32(a) => out.copy_from_slice(a.row(r).as_slice().expect("standard layout")),
            Linear::Quant(q) => q.dequantize_row_into(r, out),
        }
    }
    /// The matrix as f32 (dequantized).
    pub fn to_f32(&self) -> Array2<f32> {
        match self {
            Linear::F32(a) => a.clone(),
            Linear::Quant(q) => q.dequantize(),
        }
    }

    /// The storage name: `f32` or the block format.
    pub fn format_name(&self) -> &'static str {
        match self {
            Linear::F32(_) => "f32",
            Linear::Quant(q) => q.format().name(),
        }
    }
}

impl LinearRef<'_> {
    /// The same weight borrowed for `&self`'s lifetime (a view's lifetime is invariant).
    pub fn reborrow(&self) -> LinearRef<'_> {
        match self {
            LinearRef::F32(a) => LinearRef::F32(a.view()),
            LinearRef::Quant(q) => LinearRef::Quant(q),
        }
    }
    pub fn dim(&self) -> (usize, usize) {
        match self {
            LinearRef::F32(a) => a.dim(),
            LinearRef::Quant(q) => q.dim(),
        }
    }
    pub fn bytes(&self) -> usize {
        match self {
            LinearRef::F32(a) => a.len() * 4,
            LinearRef::Quant(q) => q.bytes(),
        }
    }
}

/// Borrowed weights of one block, whatever their storage: what [`super::block`] runs on.
/// A decoder block has both sublayers; a feed-forward-only block ([`FfnWeights`], [`QFfn`])
/// has no attention.
#[derive(Clone, Copy, Debug)]
pub struct BlockRef<'a> {
    /// The attention sublayer (`None`: the block is `x + MLP(RMSNorm(x))`).
    pub attn: Option<AttnRef<'a>>,
    pub mlp_norm: ArrayView1<'a, f32>,
    pub w_gate: LinearRef<'a>,
    pub w_up: LinearRef<'a>,
    pub w_down: LinearRef<'a>,
}

/// Borrowed weights of a block's attention sublayer.
#[derive(Clone, Copy, Debug)]
pub struct AttnRef<'a> {
    pub attn_norm: ArrayView1<'a, f32>,
    pub wq: LinearRef<'a>,
    pub wk: LinearRef<'a>,
    pub wv: LinearRef<'a>,
    pub wo: LinearRef<'a>,
    pub bq: Option<ArrayView1<'a, f32>>,
    pub bk: Option<ArrayView1<'a, f32>>,
    pub bv: Option<ArrayView1<'a, f32>>,
}

impl<'a> BlockRef<'a> {
    /// The block's matrices: attention's (when it has it), then the MLP's.
    pub fn linears(&self) -> Vec<LinearRef<'a>> {
        let mut v = Vec::with_capacity(7);
        if let Some(a) = &self.attn {
            v.extend([a.wq, a.wk, a.wv, a.wo]);
        }
        v.extend([self.w_gate, self.w_up, self.w_down]);
        v
    }

    /// Bytes of every tensor of the block.
    pub fn bytes(&self) -> usize {
        let vec = |v: Option<ArrayView1<f32>>| v.map_or(0, |v| v.len() * 4);
        let attn_vectors = self.attn.as_ref().map_or(0, |a| {
            vec(Some(a.attn_norm)) + vec(a.bq) + vec(a.bk) + vec(a.bv)
        });
        self.linears().iter().map(|l| l.bytes()).sum::<usize>()
            + vec(Some(self.mlp_norm))
            + attn_vectors
    }
}

/// Weights of a block in any storage (f32 [`LayerWeights`] or [`QLayer`], and their
/// feed-forward-only twins [`FfnWeights`] and [`QFfn`]).
pub trait BlockWeights: Sync {
    fn block_ref(&self) -> BlockRef<'_>;
}

/// Borrowed weights are block weights too (e.g. a block read in place from tape values).
impl BlockWeights for BlockRef<'_> {
    fn block_ref(&self) -> BlockRef<'_> {
        // Views are invariant in their lifetime: each is re-borrowed for `&self`'s.
        let attn = self.attn.as_ref().map(|a| AttnRef {
            attn_norm: a.attn_norm.view(),
            wq: a.wq.reborrow(),
            wk: a.wk.reborrow(),
            wv: a.wv.reborrow(),
            wo: a.wo.reborrow(),
            bq: a.bq.as_ref().map(ArrayView1::view),
            bk: a.bk.as_ref().map(ArrayView1::view),
            bv: a.bv.as_ref().map(ArrayView1::view),
        });
        BlockRef {
            attn,
            mlp_norm: self.mlp_norm.view(),
            w_gate: self.w_gate.reborrow(),
            w_up: self.w_up.reborrow(),
            w_down: self.w_down.reborrow(),
        }
    }
}

impl BlockWeights for LayerWeights {
    fn block_ref(&self) -> BlockRef<'_> {
        BlockRef {
            attn: Some(AttnRef {
                attn_norm: self.attn_norm.view(),
                wq: LinearRef::F32(self.wq.view()),
                wk: LinearRef::F32(self.wk.view()),
                wv: LinearRef::F32(self.wv.view()),
                wo: LinearRef::F32(self.wo.view()),
                bq: self.bq.as_ref().map(Array1::view),
                bk: self.bk.as_ref().map(Array1::view),
                bv: self.bv.as_ref().map(Array1::view),
            }),
            mlp_norm: self.mlp_norm.view(),
            w_gate: LinearRef::F32(self.w_gate.view()),
            w_up: LinearRef::F32(self.w_up.view()),
            w_down: LinearRef::F32(self.w_down.view()),
        }
    }
}

impl BlockWeights for FfnWeights {
    fn block_ref(&self) -> BlockRef<'_> {
        BlockRef {
            attn: None,
            mlp_norm: self.mlp_norm.view(),
            w_gate: LinearRef::F32(self.w_gate.view()),
            w_up: LinearRef::F32(self.w_up.view()),
            w_down: LinearRef::F32(self.w_down.view()),
        }
    }
}

/// A feed-forward-only block ([`FfnWeights`]) with its matrices in any storage.
#[derive(Clone, Debug)]
pub struct QFfn {
    pub mlp_norm: Array1<f32>,
    pub w_gate: Linear,
    pub w_up: Linear,
    pub w_down: Linear,
}

impl QFfn {
    /// Every matrix of `f` quantized to `format` (`None`: kept f32).
    pub fn from_f32(f: &FfnWeights, format: Option<QFormat>) -> Self {
        let q = |w: &Array2<f32>| Linear::from_f32(w, format);
        QFfn {
            mlp_norm: f.mlp_norm.clone(),
            w_gate: q(&f.w_gate),
            w_up: q(&f.w_up),
            w_down: q(&f.w_down),
        }
    }

    /// The block's f32 weights (dequantized).
    pub fn to_f32(&self) -> FfnWeights {
        FfnWeights {
            mlp_norm: self.mlp_norm.clone(),
            w_gate: self.w_gate.to_f32(),
            w_up: self.w_up.to_f32(),
            w_down: self.w_down.to_f32(),
        }
    }

    /// Bytes of weights held.
    pub fn bytes(&self) -> usize {
        self.block_ref().bytes()
    }
}

impl BlockWeights for QFfn {
    fn block_ref(&self) -> BlockRef<'_> {
        BlockRef {
            attn: None,
            mlp_norm: self.mlp_norm.view(),
            w_gate: self.w_gate.as_ref(),
            w_up: self.w_up.as_ref(),
            w_down: self.w_down.as_ref(),
        }
    }
}

/// One decoder block for inference with each projection in any storage (norms and biases
/// stay f32: they are tiny).
#[derive(Clone, Debug)]
pub struct QLayer {
    pub attn_norm: Array1<f32>,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub wo: Linear,
    pub bq: Option<Array1<f32>>,
    pub bk: Option<Array1<f32>>,
    pub bv: Option<Array1<f32>>,
    pub mlp_norm: Array1<f32>,
    pub w_gate: Linear,
    pub w_up: Linear,
    pub w_down: Linear,
}

impl QLayer {
    /// Every projection of `l` quantized to `format` (`None`: kept f32).
    pub fn from_f32(l: &LayerWeights, format: Option<QFormat>) -> Self {
        let q = |w: &Array2<f32>| Linear::from_f32(w, format);
        QLayer {
            attn_norm: l.attn_norm.clone(),
            wq: q(&l.wq),
            wk: q(&l.wk),
            wv: q(&l.wv),
            wo: q(&l.wo),
            bq: l.bq.clone(),
            bk: l.bk.clone(),
            bv: l.bv.clone(),
            mlp_norm: l.mlp_norm.clone(),
            w_gate: q(&l.w_gate),
            w_up: q(&l.w_up),
            w_down: q(&l.w_down),
        }
    }

    /// The block's f32 weights (dequantized): the training / reference representation.
    pub fn to_f32(&self) -> LayerWeights {
        let f = Linear::to_f32;
        LayerWeights {
            attn_norm: self.attn_norm.clone(),
            wq: f(&self.wq),
            wk: f(&self.wk),
            wv: f(&self.wv),
            wo: f(&self.wo),
            bq: self.bq.clone(),
            bk: self.bk.clone(),
            bv: self.bv.clone(),
            mlp_norm: self.mlp_norm.clone(),
            w_gate: f(&self.w_gate),
            w_up: f(&self.w_up),
            w_down: f(&self.w_down),
        }
    }

    /// Bytes of weights held.
    pub fn bytes(&self) -> usize {
        self.block_ref().bytes()
    }
}

impl BlockWeights for QLayer {
    fn block_ref(&self) -> BlockRef<'_> {
        BlockRef {
            attn: Some(AttnRef {
                attn_norm: self.attn_norm.view(),
                wq: self.wq.as_ref(),
                wk: self.wk.as_ref(),
                wv: self.wv.as_ref(),
                wo: self.wo.as_ref(),
                bq: self.bq.as_ref().map(Array1::view),
                bk: self.bk.as_ref().map(Array1::view),
                bv: self.bv.as_ref().map(Array1::view),
            }),
            mlp_norm: self.mlp_norm.view(),
            w_gate: self.w_gate.as_ref(),
            w_up: self.w_up.as_ref(),
            w_down: self.w_down.as_ref(),
        }
    }
}

/// A whole decoder for inference with quantized (or f32) projections, embedding and LM head.
#[derive(Clone, Debug)]
pub struct QuantWeights {
    pub config: ModelConfig,
    /// `[V, C]` (also the LM head when tied).
    pub embed: Linear,
    pub layers: Vec<QLayer>,
    /// `[C]`
    pub final_norm: Array1<f32>,
    /// `[V, C]`; `None` when tied to `embed`.
    pub lm_head: Option<Linear>,
}

impl QuantWeights {
    /// Quantizes every matrix of `w` (embedding and LM head included) to `format`.
    pub fn quantize(w: &ModelWeights, format: QFormat) -> Self {
        Self::from_f32(w, Some(format))
    }

    /// Every matrix of `w` quantized to `format`, or kept f32 (`None`).
    pub fn from_f32(w: &ModelWeights, format: Option<QFormat>) -> Self {
        QuantWeights {
            config: w.config.clone(),
            embed: Linear::from_f32(&w.embed, format),
            layers: w
                .layers
                .iter()
                .map(|l| QLayer::from_f32(l, format))
                .collect(),
            final_norm: w.final_norm.clone(),
            lm_head: w.lm_head.as_ref().map(|h| Linear::from_f32(h, format)),
        }
    }

    /// The same model with every matrix dequantized to f32 (the reference of the
    /// quantized kernels).
    pub fn to_f32(&self) -> ModelWeights {
        ModelWeights {
            config: self.config.clone(),
            embed: self.embed.to_f32(),
            layers: self.layers.iter().map(QLayer::to_f32).collect(),
            final_norm: self.final_norm.clone(),
            lm_head: self.lm_head.as_ref().map(Linear::to_f32),
        }
    }

    /// The LM head (the embedding when tied).
    pub fn lm_head(&self) -> &Linear {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of every weight held.
    pub fn bytes(&self) -> usize {
        self.embed.bytes()
            + self.layers.iter().map(|l| l.bytes()).sum::<usize>()
            + self.final_norm.len() * 4
            + self.lm_head.as_ref().map_or(0, |h| h.bytes())
    }
}
