//! Packing of the AVX-512 kernels' operands, in the BLIS/GotoBLAS layout: `B` into `KC × NR`
//! column slivers, `A` into `MR × KC` row slivers, `k`-major and zero-padded at the edges; as
//! f32, or as bf16 k-pairs (two bf16 along k in one u32) for the bf16 kernel. Also the whole
//! of a frozen weight packed once ([`pack_whole_b`]) and where its panels are found again
//! ([`prepacked`]). The block sizes live here because they are the packed layout.

use std::arch::x86_64::*;

use ndarray::ArrayView2;
use rayon::prelude::*;

use super::frozen::Panels;

pub(super) const MR: usize = 12;
pub(super) const NR: usize = 32;
pub(super) const KC: usize = 256;
pub(super) const MC: usize = 120;
pub(super) const NC: usize = 2048;

/// Where a `K`-block's panel of a pre-packed `B` starts for columns from `jc`: the
/// K-blocks' panels of the whole `B` and the first column of this part of it.
#[inline(always)]
pub(super) fn prepacked<P>(
    (panels, col0): (&[Vec<P>], usize),
    pc: usize,
    jc: usize,
    d: usize,
) -> *const P {
    // SAFETY (of the caller's reads): the panel holds every NR-sliver of the whole B.
    panels[pc / KC][(col0 + jc) / NR * NR * d..].as_ptr()
}

/// `A[ic.., pc..]` (`mc × kc`) into `MR`-row slivers, `k`-major, zero-padded rows.
pub(super) fn pack_a(
    a: &ArrayView2<f32>,
    ic: usize,
    mc: usize,
    pc: usize,
    kc: usize,
    out: &mut [f32],
) {
    let (rs, cs) = (a.strides()[0], a.strides()[1]);
    let base = a.as_ptr();
    for (sl, i0) in (0..mc).step_by(MR).enumerate() {
        let rows = MR.min(mc - i0);
        let dst = &mut out[sl * MR * kc..(sl + 1) * MR * kc];
        if cs == 1 {
            // SAFETY: rows ic+i0 .. +rows, columns pc .. pc+kc are inside A, each row
            // contiguous; packing runs only where AVX-512F was detected.
            unsafe {
                pack_transposed(rows, kc, MR, dst, |i| {
                    base.offset((ic + i0 + i) as isize * rs + pc as isize)
                })
            };
            continue;
        }
        for p in 0..kc {
            let d = &mut dst[p * MR..(p + 1) * MR];
            for (i, x) in d.iter_mut().enumerate() {
                *x = if i < rows {
                    // SAFETY: (ic+i0+i, pc+p) is inside A.
                    unsafe { *base.offset((ic + i0 + i) as isize * rs + (pc + p) as isize * cs) }
                } else {
                    0.0
                };
            }
        }
    }
}

/// `dst[p · w + r] = row(r)[p]` for `p < kc`, `r < w` (zero for `r ≥ n`): `n` source rows
/// contiguous along `p` into a `w`-wide sliver, 16 × 16 blocks transposed in registers.
#[target_feature(enable = "avx512f")]
unsafe fn pack_transposed(
    n: usize,
    kc: usize,
    w: usize,
    dst: &mut [f32],
    row: impl Fn(usize) -> *const f32,
) {
    let chunks = kc / 16;
    transpose_into(n, chunks, w, dst.as_mut_ptr() as *mut u32, |i, c| {
        // SAFETY: 16 values from 16·c are inside row i (c < kc / 16).
        unsafe { _mm512_castps_si512(_mm512_loadu_ps(row(i).add(16 * c))) }
    });
    for p in 16 * chunks..kc {
        for r in 0..w {
            dst[p * w + r] = if r < n { *row(r).add(p) } else { 0.0 };
        }
    }
}

/// `B[pc.., jc..]` (`kc × nc`) into `NR`-column slivers, `k`-major, zero-padded columns.
pub(super) fn pack_b(
    b: &ArrayView2<f32>,
    pc: usize,
    kc: usize,
    jc: usize,
    nc: usize,
    out: &mut [f32],
) {
    let (rs, cs) = (b.strides()[0], b.strides()[1]);
    let base = b.as_ptr();
    for (sl, j0) in (0..nc).step_by(NR).enumerate() {
        let cols = NR.min(nc - j0);
        let dst = &mut out[sl * NR * kc..(sl + 1) * NR * kc];
        if cs == 1 {
            for p in 0..kc {
                let d = &mut dst[p * NR..(p + 1) * NR];
                // SAFETY: row pc+p, columns jc+j0 .. +cols are inside B and contiguous.
                let src = unsafe {
                    std::slice::from_raw_parts(
                        base.offset((pc + p) as isize * rs + (jc + j0) as isize),
                        cols,
                    )
                };
                d[..cols].copy_from_slice(src);
                d[cols..].fill(0.0);
            }
        } else if rs == 1 {
            // Transposed B (`Wᵀ` of a PyTorch-layout weight): each column contiguous
            // along k.
            // SAFETY: columns jc+j0 .. +cols, rows pc .. pc+kc are inside B; packing runs
            // only where AVX-512F was detected.
            unsafe {
                pack_transposed(cols, kc, NR, dst, |j| {
                    base.offset(pc as isize + (jc + j0 + j) as isize * cs)
                })
            };
        } else {
            for j in 0..NR {
                for p in 0..kc {
                    dst[p * NR + j] = if j < cols {
                        // SAFETY: (pc+p, jc+j0+j) is inside B.
                        unsafe {
                            *base.offset((pc + p) as isize * rs + (jc + j0 + j) as isize * cs)
                        }
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// f32 → bf16 bits, round to nearest even; NaN stays a (quiet) NaN.
#[inline(always)]
fn bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if x.is_nan() {
        return (b >> 16) | 0x40;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1))) >> 16
}

/// Two consecutive-k values as one packed pair (low half: the even k).
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | (bf16_bits(hi) << 16)
}

/// Walks the `w`-row slivers of a `rows × kc` panel packed as k-pairs,
/// `out[(sliver · kp + p2) · w + r]`: rows past the end are zero, every real row is filled
/// by `fill(sliver, r, row)`.
fn for_each_pair_row(
    rows: usize,
    kc: usize,
    w: usize,
    out: &mut [u32],
    mut fill: impl FnMut(&mut [u32], usize, usize),
) {
    let kp = kc.div_ceil(2);
    for (sl, r0) in (0..rows).step_by(w).enumerate() {
        let n = w.min(rows - r0);
        let dst = &mut out[sl * w * kp..(sl + 1) * w * kp];
        for r in 0..w {
            if r < n {
                fill(dst, r, r0 + r);
            } else {
                for p2 in 0..kp {
                    dst[p2 * w + r] = 0;
                }
            }
        }
    }
}

/// Pairs `from..` of row `r` of a sliver, `(x[2p2], x[2p2 + 1])` from `get(p)`, the odd
/// tail padded with zero.
fn fill_pairs_scalar(
    dst: &mut [u32],
    w: usize,
    r: usize,
    from: usize,
    kc: usize,
    get: impl Fn(usize) -> f32,
) {
    for p2 in from..kc.div_ceil(2) {
        let hi = if 2 * p2 + 1 < kc {
            get(2 * p2 + 1)
        } else {
            0.0
        };
        dst[p2 * w + r] = pair(get(2 * p2), hi);
    }
}

/// `get(r, p)` for `r < rows`, `p < kc` of a `kc`-deep panel of `w`-wide slivers into
/// k-pairs: `out[(sliver · kp + p2) · w + r] = (x[r, 2p2], x[r, 2p2 + 1])`, zero-padded.
pub(super) fn pack_pairs(
    rows: usize,
    kc: usize,
    w: usize,
    out: &mut [u32],
    get: impl Fn(usize, usize) -> f32,
) {
    for_each_pair_row(rows, kc, w, out, |dst, r, row| {
        fill_pairs_scalar(dst, w, r, 0, kc, |p| get(row, p))
    });
}

/// The first `min(n, 16)` lanes.
#[inline(always)]
fn lane_mask(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        (1u16 << n) - 1
    }
}

/// The block transpose the contiguous packers share: for each 16-row group of a `w`-wide
/// sliver and each chunk `c < chunks`, `load(r, c)` gives row `r`'s 16 lanes of that
/// chunk (rows `≥ n` stay zero); the 16 × 16 block is transposed in registers and output
/// `t`'s lane for row `r` lands at `out[(16c + t) · w + r]`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn transpose_into(
    n: usize,
    chunks: usize,
    w: usize,
    out: *mut u32,
    load: impl Fn(usize, usize) -> __m512i,
) {
    for g0 in (0..w).step_by(16) {
        let lanes = 16.min(w - g0);
        let mask = lane_mask(lanes);
        for c in 0..chunks {
            let mut r = [_mm512_setzero_si512(); 16];
            for (i, ri) in r
                .iter_mut()
                .enumerate()
                .take(lanes.min(n.saturating_sub(g0)))
            {
                *ri = load(g0 + i, c);
            }
            transpose16(&mut r);
            for (t, rt) in r.iter().enumerate() {
                // SAFETY (caller): 16c + t is below the sliver's depth, lanes g0 .. g0 +
                // lanes ≤ w.
                _mm512_mask_storeu_epi32(out.add((16 * c + t) * w + g0) as *mut _, mask, *rt);
            }
        }
    }
}

/// Transposes a 16 × 16 block of u32 held as 16 rows: `r[j][i]` becomes `r[i][j]`
/// (interleaves of 32 then 64 bits within 128-bit lanes, then two rounds of lane shuffles).
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn transpose16(r: &mut [__m512i; 16]) {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // u[4j + e] holds, in 128-bit lane L, element 4L + e of rows 4j .. 4j + 3.
    let mut u = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        u[4 * j] = _mm512_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
        u[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
    }
    let mut v = [_mm512_setzero_si512(); 16];
    for g in 0..2 {
        for e in 0..4 {
            let (a, b) = (u[8 * g + e], u[8 * g + 4 + e]);
            v[8 * g + e] = _mm512_shuffle_i32x4::<0x88>(a, b);
            v[8 * g + 4 + e] = _mm512_shuffle_i32x4::<0xdd>(a, b);
        }
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_i32x4::<0x88>(v[i], v[8 + i]);
        r[8 + i] = _mm512_shuffle_i32x4::<0xdd>(v[i], v[8 + i]);
    }
}

/// [`pack_pairs`] for a source contiguous along k (`row(r)` points at `x[r, 0]`): per 16
/// rows and 32 values of k, each row rounded by `vcvtne2ps2bf16` (nearest even; like the
/// hardware's dot products it flushes f32 subnormals, below 1.2e-38, to zero) into 16
/// pairs, the 16 × 16 block transposed in registers and stored a pair index at a time;
/// the odd tail of k scalar.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn pack_pairs_contiguous(
    rows: usize,
    kc: usize,
    w: usize,
    out: &mut [u32],
    row: impl Fn(usize) -> *const f32,
) {
    let kp = kc.div_ceil(2);
    let chunks = kc / 32;
    for (sl, r0) in (0..rows).step_by(w).enumerate() {
        let n = w.min(rows - r0);
        let dst = out[sl * w * kp..(sl + 1) * w * kp].as_mut_ptr();
        transpose_into(n, chunks, w, dst, |i, c| {
            // SAFETY: 32 values from 32·c are inside the row (c < kc / 32).
            unsafe {
                let src = row(r0 + i).add(32 * c);
                let (lo, hi) = (_mm512_loadu_ps(src), _mm512_loadu_ps(src.add(16)));
                std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
            }
        });
        let dst = &mut out[sl * w * kp..(sl + 1) * w * kp];
        for r in 0..w {
            if r < n {
                let src = row(r0 + r);
                // SAFETY: p < kc is inside the row.
                fill_pairs_scalar(dst, w, r, 16 * chunks, kc, |p| unsafe { *src.add(p) });
            } else {
                for p2 in 16 * chunks..kp {
                    dst[p2 * w + r] = 0;
                }
            }
        }
    }
}

/// [`pack_pairs`] for a source whose rows along k are contiguous across the sliver's
/// width (`B[p, j]` of a row-major `B`, or `A = gᵀ`): per k-pair, 16 entries of `k` and
/// `k + 1` rounded together by `vcvtne2ps2bf16` and interleaved into (k, k+1) pairs by one
/// 16-bit permute; `row(p)` points at entry 0 of the panel's row `p`; `w` (≤ 32) is the
/// sliver width.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_pairs_rows(
    cols: usize,
    kc: usize,
    w: usize,
    out: &mut [u32],
    row: impl Fn(usize) -> *const f32,
) {
    let kp = kc.div_ceil(2);
    // Output 16-bit element 2j takes row k's entry j (input j), 2j+1 row k+1's (16 + j).
    let idx: [i16; 32] = std::array::from_fn(|e| ((e / 2) + 16 * (e % 2)) as i16);
    let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
    for (sl, j0) in (0..cols).step_by(w).enumerate() {
        let dst = &mut out[sl * w * kp..(sl + 1) * w * kp];
        for jb in (0..w).step_by(16) {
            let load = lane_mask(cols.saturating_sub(j0 + jb));
            let store = lane_mask(w - jb);
            for p2 in 0..kp {
                let lo = _mm512_maskz_loadu_ps(load, row(2 * p2).add(j0 + jb));
                let hi = if 2 * p2 + 1 < kc {
                    _mm512_maskz_loadu_ps(load, row(2 * p2 + 1).add(j0 + jb))
                } else {
                    _mm512_setzero_ps()
                };
                let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                let v = _mm512_permutexvar_epi16(idx, v);
                _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(p2 * w + jb) as *mut _, store, v);
            }
        }
    }
}

/// `B[pc.., jc..]` (`kc × nc`) into `NR`-column slivers of k-pairs, zero-padded.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_b_bf16(
    b: &ArrayView2<f32>,
    pc: usize,
    kc: usize,
    jc: usize,
    nc: usize,
    pb: &mut [u32],
) {
    let (brs, bcs, bbase) = (b.strides()[0], b.strides()[1], b.as_ptr());
    // SAFETY (all packers): (pc+p, jc+j) is inside B.
    if brs == 1 {
        pack_pairs_contiguous(nc, kc, NR, pb, |j| {
            bbase.offset(pc as isize + (jc + j) as isize * bcs)
        });
    } else if bcs == 1 {
        pack_pairs_rows(nc, kc, NR, pb, |p| {
            bbase.offset((pc + p) as isize * brs + jc as isize)
        });
    } else {
        pack_pairs(nc, kc, NR, pb, |j, p| {
            *bbase.offset((pc + p) as isize * brs + (jc + j) as isize * bcs)
        });
    }
}

/// The whole of `B` packed, one panel (every `NR`-sliver of its columns) per `KC`-block of
/// its rows: what a frozen weight keeps. The slivers are packed on all threads (a weight
/// that is frozen for one training step only is packed once per step).
pub(super) fn pack_whole_b(bf16: bool, b: &ArrayView2<f32>) -> Panels {
    let (k, n) = b.dim();
    let slivers = n.div_ceil(NR);
    let per_thread = slivers.div_ceil(rayon::current_num_threads().max(1)).max(1);
    fn blocks<P: Copy + Default + Send>(
        k: usize,
        n: usize,
        slivers: usize,
        per_thread: usize,
        depth: impl Fn(usize) -> usize + Sync,
        pack: impl Fn(usize, usize, usize, usize, &mut [P]) + Sync,
    ) -> Vec<Vec<P>> {
        (0..k)
            .step_by(KC)
            .map(|pc| {
                let kc = KC.min(k - pc);
                let part = per_thread * NR * depth(kc);
                let mut out = vec![P::default(); slivers * NR * depth(kc)];
                out.par_chunks_mut(part).enumerate().for_each(|(i, chunk)| {
                    let jc = i * per_thread * NR;
                    pack(pc, kc, jc, (n - jc).min(per_thread * NR), chunk);
                });
                out
            })
            .collect()
    }
    if bf16 {
        // SAFETY: bf16 products run only where the CPU has AVX-512 BF16.
        let pack = |pc, kc, jc, nc, out: &mut [u32]| unsafe { pack_b_bf16(b, pc, kc, jc, nc, out) };
        Panels::Bf16(blocks(k, n, slivers, per_thread, |kc| kc.div_ceil(2), pack))
    } else {
        let pack = |pc, kc, jc, nc, out: &mut [f32]| pack_b(b, pc, kc, jc, nc, out);
        Panels::F32(blocks(k, n, slivers, per_thread, |kc| kc, pack))
    }
}
