//! Integer matrix products of quantized weights ([`QMatrix`]) with quantized activations.
//!
//! The activation rows are quantized to 8-bit blocks of 32 (`d = max|x| / 127`,
//! `q = round(x / d)`, plus `s = d · Σq`), and each block product is an integer dot product
//! (AVX2 `maddubs`: u8 × i8 pairs summed to i16, then to i32) scaled by the two block scales:
//!
//! - Q8_0 `x = d·q`:        `Σ w·x ≈ d_w·d_x·Σ q_w q_x`
//! - Q4_0 `x = d·(q − 8)`:  `Σ w·x ≈ d_w·d_x·Σ q_w q_x − 8·d_w·s_x`
//! - Q4_1 `x = d·q + m`:    `Σ w·x ≈ d_w·d_x·Σ q_w q_x + m_w·s_x`
//!
//! (the same scheme as ggml's `vec_dot_q4_1_q8_1`; code written here). Rows whose length is
//! not a multiple of 32 are zero-padded to whole blocks, in the weights and the activations.
//!
//! Every other format (Q5_0, Q5_1 and the K-quants, whose 256-element super-blocks span eight
//! activation blocks) goes through one integer decode (`IntBlock`, each format's `decode_int`: `w = scale·q + offset` per
//! group of 16 or 32) and the same block products in the portable kernel; every format also has
//! an AVX2 kernel (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q2_K … Q6_K; those with 16-value
//! scale groups take each group's scale per i32 lane of the block product).
//!
//! With AVX-512 VNNI the 32-element formats, Q4_K and Q6_K are kept in tiles of eight rows
//! (`super::tiles`, chosen when a matrix is made): the tile kernels advance eight rows per
//! `vpdpbusd` and scale eight blocks per FMA, where a row kernel needs a horizontal reduction
//! and scalar scales per block. Rows outside whole tiles, and the other kernels on a tiled matrix, read rows' GGUF
//! blocks back ([`QMatrix::row`]).

use ndarray::{Array2, ArrayView2};

use super::blocks::{IntBlock, QK};
use super::format::{decode_int_block, QFormat};
pub use super::kernel::{detected_kernel, Kernel};
use super::matrix::QMatrix;
use super::tiles::{self, Layout, TILE_ROWS};

/// How [`QActs`] quantizes an activation block: what precision the integer products see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActQuant {
    /// One 8-bit block (`d = max|x| / 127`): ggml's scheme, the fastest.
    #[default]
    Q8,
    /// Two 8-bit blocks, the second quantizing what the first left (`x ≈ d₁·q₁ + d₂·q₂`, the
    /// error ≤ max|x| / 64 516). Each weight block is read once and multiplied by both, as two
    /// activation rows of one kernel call. A fixed-point iteration needs it: with one 8-bit
    /// block the map's output jumps whenever a rounding flips, and the residual
    /// `‖φ(z) − z‖` stalls at that jump's size (≈ 1.2 on SmolLM2's ELM at M = 14) instead of
    /// reaching δ.
    Q8x2,
}

impl ActQuant {
    pub const ALL: [ActQuant; 2] = [ActQuant::Q8, ActQuant::Q8x2];

    /// The name the CLI and configs take.
    pub fn name(self) -> &'static str {
        match self {
            ActQuant::Q8 => "q8",
            ActQuant::Q8x2 => "q8x2",
        }
    }

    /// Stored activation rows per logical row.
    fn parts(self) -> usize {
        match self {
            ActQuant::Q8 => 1,
            ActQuant::Q8x2 => 2,
        }
    }
}

impl std::fmt::Display for ActQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ActQuant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ActQuant::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("`{s}`: expected q8 or q8x2"))
    }
}

/// Activation rows quantized to 8-bit blocks: the right-hand side of the integer products.
/// Reused between calls (grown, never shrunk), so decode allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct QActs {
    mode: ActQuant,
    /// Logical rows (the rows of the quantized `x`).
    rows: usize,
    blocks: usize,
    /// `[rows·parts, blocks·32]`: the `parts` stored rows of logical row `r` are
    /// `r·parts ..`, their sum is the row.
    qs: Vec<i8>,
    /// `[rows·parts, blocks]` block scales.
    d: Vec<f32>,
    /// `[rows·parts, blocks]` `d · Σ q` of each block (the Q4_0 / Q4_1 offset terms).
    s: Vec<f32>,
    /// `[rows·parts, blocks, 2]` `Σ q` of each block's two halves of 16 (the tiled Q6_K
    /// kernel's offset terms: its scales cover 16 values).
    halves: Vec<i16>,
}

impl QActs {
    /// Empty buffers that quantize with `mode`.
    pub fn new(mode: ActQuant) -> Self {
        QActs {
            mode,
            ..QActs::default()
        }
    }

    /// Quantizes the rows of `x` `[N, K]` (each zero-padded to whole blocks).
    pub fn quantize(&mut self, x: ArrayView2<f32>) {
        let (n, k) = x.dim();
        let nb = k.div_ceil(QK);
        let parts = self.mode.parts();
        self.rows = n;
        self.blocks = nb;
        grow(&mut self.qs, parts * n * nb * QK, 0);
        grow(&mut self.d, parts * n * nb, 0.0);
        grow(&mut self.s, parts * n * nb, 0.0);
        grow(&mut self.halves, 2 * parts * n * nb, 0);
        let mut padded = [0f32; QK];
        let mut rest = [0f32; QK];
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
                let i = r * parts * nb + b;
                let (d, halves) = quantize_act_block(src, &mut self.qs[i * QK..(i + 1) * QK]);
                self.d[i] = d;
                self.s[i] = d * (halves[0] + halves[1]) as f32;
                self.halves[2 * i..2 * i + 2].copy_from_slice(&halves.map(|h| h as i16));
                if parts == 2 {
                    for ((e, &v), &q) in rest.iter_mut().zip(src).zip(&self.qs[i * QK..]) {
                        *e = v - d * q as f32;
                    }
                    let j = i + nb;
                    let (d, halves) = quantize_act_block(&rest, &mut self.qs[j * QK..(j + 1) * QK]);
                    self.d[j] = d;
                    self.s[j] = d * (halves[0] + halves[1]) as f32;
                    self.halves[2 * j..2 * j + 2].copy_from_slice(&halves.map(|h| h as i16));
                }
            }
        }
    }

    /// Logical rows (the rows of the last quantized `x`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The quantized rows as f32 `[N, blocks·32]`: what the integer kernels multiply by
    /// (the exact reference for them).
    pub fn dequantize(&self) -> Array2<f32> {
        let (n, nb, parts) = (self.rows, self.blocks, self.mode.parts());
        Array2::from_shape_fn((n, nb * QK), |(r, c)| {
            (0..parts)
                .map(|p| {
                    let sr = r * parts + p;
                    self.qs[sr * nb * QK + c] as f32 * self.d[sr * nb + c / QK]
                })
                .sum()
        })
    }

    /// Bytes held by the buffers.
    pub fn bytes(&self) -> usize {
        self.qs.capacity()
            + 4 * (self.d.capacity() + self.s.capacity())
            + 2 * self.halves.capacity()
    }
}

fn grow<T: Copy>(v: &mut Vec<T>, n: usize, fill: T) {
    if v.len() < n {
        v.resize(n, fill);
    }
}

/// One activation block: `q = round(x / d)`, `d = max|x| / 127`; returns `d` and the sums of
/// `q` over the block's two halves of 16 (each within ±2032, an i16).
/// `round` is C's (ties away from zero), as ggml's; with AVX2 the same body compiles to
/// vector code (LLVM lowers that rounding exactly, with a truncation of `x ± 0.49999997`),
/// where the baseline target calls `roundf` per value: 3% of a decode step, on the one thread
/// the others wait for.
fn quantize_act_block(x: &[f32], q: &mut [i8]) -> (f32, [i32; 2]) {
    // The CPU's AVX2, not the kernel chosen: the codes are the same either way.
    #[cfg(target_arch = "x86_64")]
    if Kernel::Avx2.is_available() {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { quantize_act_block_avx2(x, q) };
    }
    quantize_act_block_with(x, q)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_act_block_avx2(x: &[f32], q: &mut [i8]) -> (f32, [i32; 2]) {
    quantize_act_block_with(x, q)
}

#[inline(always)]
fn quantize_act_block_with(x: &[f32], q: &mut [i8]) -> (f32, [i32; 2]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sums = [0i32; 2];
    for (half, (q, x)) in q
        .chunks_exact_mut(QK / 2)
        .zip(x.chunks_exact(QK / 2))
        .enumerate()
    {
        for (o, &v) in q.iter_mut().zip(x) {
            let qi = (v * id).round() as i8;
            *o = qi;
            sums[half] += qi as i32;
        }
    }
    (d, sums)
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
    debug_assert_eq!(acts.blocks * QK, w.padded_cols());
    // Stored rows; with two parts per row the groups below stay even, so both parts of a
    // row are in one kernel call (the weight block is read once for both).
    let parts = acts.mode.parts();
    let n = acts.rows * parts;
    // The whole tiles inside `lo..hi` go to the tile kernel; rows outside them (the edges of
    // a split not on a tile boundary) and every other kernel read rows' GGUF blocks.
    let tiled =
        cfg!(target_arch = "x86_64") && w.layout() == Layout::Tiles && kernel == Kernel::Avx512Vnni;
    let (tlo, thi) = match tiled {
        true if lo.div_ceil(TILE_ROWS) < hi / TILE_ROWS => (
            lo.div_ceil(TILE_ROWS) * TILE_ROWS,
            hi / TILE_ROWS * TILE_ROWS,
        ),
        _ => (lo, lo),
    };
    #[cfg(target_arch = "x86_64")]
    if thi > tlo {
        tiled_rows(w, tlo / TILE_ROWS..thi / TILE_ROWS, acts, y, y_stride);
    }
    for o in (lo..tlo).chain(thi..hi) {
        let row = w.row(o);
        let mut r = 0;
        while r < n {
            let take = group_size(n - r);
            let mut out = [0f32; 8];
            match take {
                8 => dot_group::<8>(w.format(), &row, acts, r, &mut out, kernel),
                4 => dot_group::<4>(w.format(), &row, acts, r, &mut out, kernel),
                2 => dot_group::<2>(w.format(), &row, acts, r, &mut out, kernel),
                _ => dot_group::<1>(w.format(), &row, acts, r, &mut out, kernel),
            }
            for (i, v) in out[..take].chunks_exact(parts).enumerate() {
                *y.add((r / parts + i) * y_stride + o) = v.iter().sum();
            }
            r += take;
        }
    }
}

/// Stored activation rows one kernel call takes when `left` remain (8, 4, 2 or 1: with two
/// parts per row `left` is even, so a call never splits a row's parts).
fn group_size(left: usize) -> usize {
    match left {
        8.. => 8,
        4.. => 4,
        2.. => 2,
        _ => 1,
    }
}

/// [`qmatmul_rows`] for the tile groups `groups` of a tiled `w` (rows `8g..8g+8` for each
/// `g`) on the VNNI kernel.
///
/// # Safety
/// As [`qmatmul_rows`]; the CPU has the VNNI kernel's instruction sets.
#[cfg(target_arch = "x86_64")]
unsafe fn tiled_rows(
    w: &QMatrix,
    groups: std::ops::Range<usize>,
    acts: &QActs,
    y: *mut f32,
    y_stride: usize,
) {
    let geometry = tiles::geometry(w.format()).expect("a tiled matrix has a tiled format");
    let (parts, nb) = (acts.mode.parts(), acts.blocks);
    let n = acts.rows * parts;
    // A tile spans one block of the format: one activation block, or eight (a K-quant's
    // super-block).
    let group_bytes = nb * QK / w.format().block_elems() * geometry.bytes;
    let stored = w.stored();
    for g in groups {
        let tiles = &stored[g * group_bytes..(g + 1) * group_bytes];
        let mut r = 0;
        while r < n {
            let take = group_size(n - r);
            let mut out = [[0f32; TILE_ROWS]; 8];
            match take {
                8 => tile_group::<8>(w.format(), &geometry, tiles, acts, r, &mut out),
                4 => tile_group::<4>(w.format(), &geometry, tiles, acts, r, &mut out),
                2 => tile_group::<2>(w.format(), &geometry, tiles, acts, r, &mut out),
                _ => tile_group::<1>(w.format(), &geometry, tiles, acts, r, &mut out),
            }
            for (i, v) in out[..take].chunks_exact(parts).enumerate() {
                let dst = y.add((r / parts + i) * y_stride + g * TILE_ROWS);
                for lane in 0..TILE_ROWS {
                    *dst.add(lane) = v.iter().map(|p| p[lane]).sum();
                }
            }
            r += take;
        }
    }
}

/// One tile group's eight rows against activation rows `r0..r0+R` into `out[..R]`.
///
/// # Safety
/// The CPU has the VNNI kernel's instruction sets; `tiles` holds `acts.blocks` tiles.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_group<const R: usize>(
    format: QFormat,
    geometry: &tiles::TileGeometry,
    tiles: &[u8],
    acts: &QActs,
    r0: usize,
    out: &mut [[f32; TILE_ROWS]; 8],
) {
    let nb = acts.blocks;
    let xq: [*const i8; R] = std::array::from_fn(|i| acts.qs[(r0 + i) * nb * QK..].as_ptr());
    let xd: [*const f32; R] = std::array::from_fn(|i| acts.d[(r0 + i) * nb..].as_ptr());
    let xs: [*const f32; R] = std::array::from_fn(|i| acts.s[(r0 + i) * nb..].as_ptr());
    let xh: [*const i16; R] = std::array::from_fn(|i| acts.halves[2 * (r0 + i) * nb..].as_ptr());
    let p = tiles.as_ptr();
    let res = match format {
        QFormat::Q8_0 => avx2::tile_vnni::<R, true, false, false>(geometry, p, nb, &xq, &xd, &xs),
        QFormat::Q4_0 => avx2::tile_vnni::<R, false, false, false>(geometry, p, nb, &xq, &xd, &xs),
        QFormat::Q4_1 => avx2::tile_vnni::<R, false, true, false>(geometry, p, nb, &xq, &xd, &xs),
        QFormat::Q5_0 => avx2::tile_vnni::<R, false, false, true>(geometry, p, nb, &xq, &xd, &xs),
        QFormat::Q5_1 => avx2::tile_vnni::<R, false, true, true>(geometry, p, nb, &xq, &xd, &xs),
        QFormat::Q4K => avx2::tile_q4k_vnni::<R>(geometry, p, nb, &xq, &xd, &xs),
        QFormat::Q6K => avx2::tile_q6k_vnni::<R>(geometry, p, nb, &xq, &xd, &xh),
        QFormat::Q2K | QFormat::Q3K | QFormat::Q5K => {
            unreachable!("{} has no tiled layout", format.name())
        }
    };
    out[..R].copy_from_slice(&res);
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
    {
        // SAFETY: a kernel is only chosen when `Kernel::is_available` detected its instruction
        // sets; `row` holds `nb` blocks and every `xq[i]` `nb · 32` values.
        let res = unsafe {
            match (kernel, format) {
                (Kernel::Portable, _) => None,
                (Kernel::Avx2, QFormat::Q4_1) => {
                    Some(avx2::dot_q4::<R, true>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx2, QFormat::Q4_0) => {
                    Some(avx2::dot_q4::<R, false>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx2, QFormat::Q8_0) => Some(avx2::dot_q8_0::<R>(row, nb, &xq, &xd)),
                (Kernel::Avx2, QFormat::Q5_0) => {
                    Some(avx2::dot_q5::<R, false>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx2, QFormat::Q5_1) => {
                    Some(avx2::dot_q5::<R, true>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx2, QFormat::Q4K) => Some(avx2::dot_q4k::<R>(row, nb, &xq, &xd, &xs)),
                (Kernel::Avx2, QFormat::Q5K) => Some(avx2::dot_q5k::<R>(row, nb, &xq, &xd, &xs)),
                (Kernel::Avx2, QFormat::Q6K) => Some(avx2::dot_q6k::<R>(row, nb, &xq, &xd)),
                (Kernel::Avx2, QFormat::Q2K) => Some(avx2::dot_q2k::<R>(row, nb, &xq, &xd)),
                (Kernel::Avx2, QFormat::Q3K) => Some(avx2::dot_q3k::<R>(row, nb, &xq, &xd)),
                (Kernel::Avx512Vnni, QFormat::Q4_1) => {
                    Some(avx2::dot_q4_vnni::<R, true>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx512Vnni, QFormat::Q4_0) => {
                    Some(avx2::dot_q4_vnni::<R, false>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx512Vnni, QFormat::Q8_0) => {
                    Some(avx2::dot_q8_0_vnni::<R>(row, nb, &xq, &xd))
                }
                (Kernel::Avx512Vnni, QFormat::Q5_0) => {
                    Some(avx2::dot_q5_vnni::<R, false>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx512Vnni, QFormat::Q5_1) => {
                    Some(avx2::dot_q5_vnni::<R, true>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx512Vnni, QFormat::Q4K) => {
                    Some(avx2::dot_q4k_vnni::<R>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx512Vnni, QFormat::Q5K) => {
                    Some(avx2::dot_q5k_vnni::<R>(row, nb, &xq, &xd, &xs))
                }
                (Kernel::Avx512Vnni, QFormat::Q6K) => {
                    Some(avx2::dot_q6k_vnni::<R>(row, nb, &xq, &xd))
                }
                (Kernel::Avx512Vnni, QFormat::Q2K) => {
                    Some(avx2::dot_q2k_vnni::<R>(row, nb, &xq, &xd))
                }
                (Kernel::Avx512Vnni, QFormat::Q3K) => {
                    Some(avx2::dot_q3k_vnni::<R>(row, nb, &xq, &xd))
                }
            }
        };
        if let Some(res) = res {
            out[..R].copy_from_slice(&res);
            return;
        }
    }
    let _ = kernel;
    let res = portable_dot::<R>(format, row, nb, &xq, &xd, &xs);
    out[..R].copy_from_slice(&res);
}

/// Scalar integer kernel (any CPU, every format); for Q8_0 / Q4_0 / Q4_1 the same arithmetic
/// as the AVX2 kernels up to the order of the f32 additions. `nb` counts activation blocks.
fn portable_dot<const R: usize>(
    format: QFormat,
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
    xs: &[&[f32]; R],
) -> [f32; R] {
    let mut acc = [0f32; R];
    let (bb, per) = (format.block_bytes(), format.block_elems() / QK);
    let mut w = IntBlock::default();
    for (wb, blk) in row.chunks_exact(bb).take(nb / per).enumerate() {
        decode_int_block(format, blk, &mut w);
        for a in 0..per {
            let b = wb * per + a;
            let wq = &w.q[a * QK..(a + 1) * QK];
            for r in 0..R {
                let x = &xq[r][b * QK..(b + 1) * QK];
                if w.group == QK {
                    let dot: i32 = wq.iter().zip(x).map(|(&w, &x)| w * x as i32).sum();
                    acc[r] += w.scale[a] * xd[r][b] * dot as f32 + w.offset[a] * xs[r][b];
                } else {
                    // Two groups of 16 in this activation block, each with its scale and offset
                    // (the offset needs the group's own activation sum).
                    for h in 0..2 {
                        let (wh, xh) = (&wq[16 * h..16 * h + 16], &x[16 * h..16 * h + 16]);
                        let dot: i32 = wh.iter().zip(xh).map(|(&w, &x)| w * x as i32).sum();
                        let sum: i32 = xh.iter().map(|&x| x as i32).sum();
                        let g = 2 * a + h;
                        acc[r] += xd[r][b] * (w.scale[g] * dot as f32 + w.offset[g] * sum as f32);
                    }
                }
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod avx2;
