//! The x86-64 kernels of [`super`]: the AVX2 row kernels of every block format and their
//! AVX-512 VNNI twins (the `twins!` lines), and the tile kernels. Kept in their own file, beside
//! the portable kernel and the dispatch in `mod.rs`.

use crate::quant::blocks::{
    k3_scales, k4_scale_min, BlockFormat, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0, QK,
};
use crate::quant::tiles::TileGeometry;
use std::arch::x86_64::*;

/// `$body` for each block `$b in 0..$nb`, with `$acc` / `$off` the accumulators of
/// `$sums` for its parity (a macro, not a closure: closures are not inlined into the
/// `target_feature` kernels, and a call per block costs more than the block).
macro_rules! over_blocks {
    ($nb:expr, $sums:ident, |$b:ident, $acc:ident, $off:ident| $body:block) => {{
        let nb = $nb;
        let mut $b = 0;
        while $b + 2 <= nb {
            {
                let ($acc, $off) = (&mut $sums.acc[0], &mut $sums.off[0]);
                $body
            }
            $b += 1;
            {
                let ($acc, $off) = (&mut $sums.acc[1], &mut $sums.off[1]);
                $body
            }
            $b += 1;
        }
        if $b < nb {
            let ($acc, $off) = (&mut $sums.acc[0], &mut $sums.off[0]);
            $body
        }
    }};
}

/// The block product of 32 unsigned weight codes with 32 signed activations, as eight i32
/// lanes (lane `k` sums values `4k..4k+4`): the one operation the two instruction sets do
/// differently. Every kernel below is written once over it and compiled twice.
pub(super) trait U8I8Dot {
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i;
}

/// AVX2: `maddubs` (u8 × i8 pairs to i16; the kernels keep pairs below 2^15) then `madd`
/// with ones.
pub(super) struct Maddubs;
impl U8I8Dot for Maddubs {
    #[inline(always)]
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
    }
}

/// AVX-512 VNNI (256-bit, `vpdpbusd`): u8 × i8 quads summed straight into i32, one
/// instruction, no intermediate saturation.
pub(super) struct Vnni;
impl U8I8Dot for Vnni {
    #[inline(always)]
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
    }
}

/// Each kernel's two entry points: the AVX2 one and the AVX-512 VNNI one (`vpdpbusd` for
/// the block products), both the same generic body.
macro_rules! twins {
    ($avx2:ident, $vnni:ident, $body:ident, [$($g:tt)*], [$($gu:tt)*], ($($arg:ident: $ty:ty),*), ($($call:ident),*)) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $avx2<$($g)*>($($arg: $ty),*) -> [f32; R] {
            $body::<Maddubs, $($gu)*>($($call),*)
        }
        #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
        pub(super) unsafe fn $vnni<$($g)*>($($arg: $ty),*) -> [f32; R] {
            $body::<Vnni, $($gu)*>($($call),*)
        }
    };
}

twins!(dot_q5, dot_q5_vnni, dot_q5_with, [const R: usize, const Q51: bool], [R, Q51], (row: &[u8], nb: usize, xq: &[&[i8]; R], xd: &[&[f32]; R], xs: &[&[f32]; R]), (row, nb, xq, xd, xs));
twins!(dot_q4k, dot_q4k_vnni, dot_q4k_with, [const R: usize], [R], (row: &[u8], nb: usize, xq: &[&[i8]; R], xd: &[&[f32]; R], xs: &[&[f32]; R]), (row, nb, xq, xd, xs));
twins!(dot_q5k, dot_q5k_vnni, dot_q5k_with, [const R: usize], [R], (row: &[u8], nb: usize, xq: &[&[i8]; R], xd: &[&[f32]; R], xs: &[&[f32]; R]), (row, nb, xq, xd, xs));
twins!(dot_q2k, dot_q2k_vnni, dot_q2k_with, [const R: usize], [R], (row: &[u8], nb: usize, xq: &[&[i8]; R], xd: &[&[f32]; R]), (row, nb, xq, xd));
twins!(dot_q3k, dot_q3k_vnni, dot_q3k_with, [const R: usize], [R], (row: &[u8], nb: usize, xq: &[&[i8]; R], xd: &[&[f32]; R]), (row, nb, xq, xd));
twins!(dot_q6k, dot_q6k_vnni, dot_q6k_with, [const R: usize], [R], (row: &[u8], nb: usize, xq: &[&[i8]; R], xd: &[&[f32]; R]), (row, nb, xq, xd));
twins!(dot_q4, dot_q4_vnni, dot_q4_with, [const R: usize, const Q41: bool], [R, Q41], (row: &[u8], nb: usize, xq: &[&[i8]; R], xd: &[&[f32]; R], xs: &[&[f32]; R]), (row, nb, xq, xd, xs));
twins!(dot_q8_0, dot_q8_0_vnni, dot_q8_0_with, [const R: usize], [R], (row: &[u8], nb: usize, xq: &[&[i8]; R], xd: &[&[f32]; R]), (row, nb, xq, xd));

/// The tiled layout's products (`super::tiles`): eight weight rows in the eight i32 lanes,
/// so one `vpdpbusd` against four broadcast activation bytes advances all eight rows and
/// one FMA scales eight blocks. `Q8`: Q8_0, its codes stored as `q + 128` (unsigned);
/// otherwise the nibble formats Q4_0, Q4_1 (`MIN`), Q5_0 (`HIGH`) and Q5_1.
///
/// Per block and activation row `i`:
/// `acc[i] += d_w·(d_x·Σ c·x − offset·s_x)` with `c` the unsigned codes (`offset` 128 for
/// Q8_0, 8 for Q4_0, 16 for Q5_0), or `d_w·d_x·Σ c·x + m_w·s_x` for the formats with a
/// minimum (`s_x = d_x·Σ x`, the activation block's sum). Where the tile's parts lie is
/// `geometry` (`super::tiles::geometry` of the format).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(super) unsafe fn tile_vnni<
    const R: usize,
    const Q8: bool,
    const MIN: bool,
    const HIGH: bool,
>(
    geometry: &TileGeometry,
    tiles: *const u8,
    nb: usize,
    xq: &[*const i8; R],
    xd: &[*const f32; R],
    xs: &[*const f32; R],
) -> [[f32; 8]; R] {
    let (codes_at, tile_bytes) = (geometry.codes_at, geometry.bytes);
    let (min_at, high_at) = (geometry.min_at.unwrap_or(0), geometry.high_at.unwrap_or(0));
    let offset = match (Q8, MIN, HIGH) {
        (true, _, _) => 128.0,
        (false, true, _) => 0.0,
        (false, false, true) => 16.0,
        (false, false, false) => 8.0,
    };
    let (low, bit4) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let t = tiles.add(b * tile_bytes);
        let d = eight_f16(t);
        // Group k: values 4k..4k+4 of each row, unsigned.
        let mut w = [_mm256_setzero_si256(); 8];
        if Q8 {
            for (k, v) in w.iter_mut().enumerate() {
                *v = _mm256_loadu_si256(t.add(codes_at + 32 * k) as *const __m256i);
            }
        } else {
            for k in 0..4 {
                let raw = _mm256_loadu_si256(t.add(codes_at + 32 * k) as *const __m256i);
                w[k] = _mm256_and_si256(raw, low);
                w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            }
            if HIGH {
                // Bit 8i + k of a row's word is the fifth bit of its value 4k + i: move
                // bit k of every byte to bit 4.
                let h = _mm256_loadu_si256(t.add(high_at) as *const __m256i);
                for (k, v) in w.iter_mut().enumerate() {
                    let moved = if k < 4 {
                        _mm256_sllv_epi32(h, _mm256_set1_epi32(4 - k as i32))
                    } else {
                        _mm256_srlv_epi32(h, _mm256_set1_epi32(k as i32 - 4))
                    };
                    *v = _mm256_or_si256(*v, _mm256_and_si256(moved, bit4));
                }
            }
        }
        let m = if MIN {
            eight_f16(t.add(min_at))
        } else {
            _mm256_setzero_ps()
        };
        for i in 0..R {
            let dot = _mm256_cvtepi32_ps(dot_quads(&w, xq[i].add(b * QK) as *const i32));
            let (dx, sx) = (_mm256_set1_ps(*xd[i].add(b)), *xs[i].add(b));
            if MIN {
                acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), dot, acc[i]);
                acc[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx), acc[i]);
            } else {
                let inner = _mm256_fmsub_ps(dx, dot, _mm256_set1_ps(offset * sx));
                acc[i] = _mm256_fmadd_ps(d, inner, acc[i]);
            }
        }
    }
    lanes(&acc)
}

/// `Σ_k w[k]·x[k]` over the weight groups `w[k]` (four codes of each of eight rows) and
/// the activation quads `x[k]`, broadcast: in two chains, so that dependent `vpdpbusd`s
/// overlap (a loop, not a closure: closures would not inherit the target features).
#[inline(always)]
unsafe fn dot_quads<const K: usize>(w: &[__m256i; K], x: *const i32) -> __m256i {
    let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for k in (0..K).step_by(2) {
        let (xe, xo) = (x.add(k).read_unaligned(), x.add(k + 1).read_unaligned());
        even = _mm256_dpbusd_epi32(even, w[k], _mm256_set1_epi32(xe));
        odd = _mm256_dpbusd_epi32(odd, w[k + 1], _mm256_set1_epi32(xo));
    }
    _mm256_add_epi32(even, odd)
}

/// A tile's eight f16 values at `p` (the rows' scales or minimums), widened.
#[inline(always)]
unsafe fn eight_f16(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// A tile kernel's accumulators as the eight rows' results per activation row.
#[inline(always)]
unsafe fn lanes<const R: usize>(acc: &[__m256; R]) -> [[f32; 8]; R] {
    let mut out = [[0f32; 8]; R];
    for (o, a) in out.iter_mut().zip(acc) {
        _mm256_storeu_ps(o.as_mut_ptr(), *a);
    }
    out
}

/// The eight rows' byte at `p`, `p + 1`, … `p + 7` (a run of a K-quant tile's scale bytes),
/// as i32 lanes: zero-extended (`SIGNED = false`) or sign-extended.
#[inline(always)]
unsafe fn run_of_eight<const SIGNED: bool>(p: *const u8) -> __m256i {
    let v = _mm_loadl_epi64(p as *const __m128i);
    if SIGNED {
        _mm256_cvtepi8_epi32(v)
    } else {
        _mm256_cvtepu8_epi32(v)
    }
}

/// Tiled Q4_K (`super::tiles`): per super-block, the eight sub-blocks' 6-bit scales and
/// minimums of the eight rows are unpacked from the scale runs as vectors (the same bit
/// layout as `k4_scale_min`, lane by lane), then each sub-block is one activation block:
/// `acc[i] += d·sc·d_x·Σ q·x − dmin·m·s_x`.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(super) unsafe fn tile_q4k_vnni<const R: usize>(
    geometry: &TileGeometry,
    tiles: *const u8,
    nb: usize,
    xq: &[*const i8; R],
    xd: &[*const f32; R],
    xs: &[*const f32; R],
) -> [[f32; 8]; R] {
    let (codes_at, tile_bytes) = (geometry.codes_at, geometry.bytes);
    let min_at = geometry.min_at.expect("Q4_K tiles have dmin");
    let scales_at = geometry.scales_at.expect("Q4_K tiles have scales");
    let (low, six) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi32(63));
    let mut acc = [_mm256_setzero_ps(); R];
    for t in 0..nb / 8 {
        let p = tiles.add(t * tile_bytes);
        let d = eight_f16(p);
        let dmin = eight_f16(p.add(min_at));
        let mut byte = [_mm256_setzero_si256(); 12];
        for (j, v) in byte.iter_mut().enumerate() {
            *v = run_of_eight::<false>(p.add(scales_at + 8 * j));
        }
        let mut scale = [_mm256_setzero_ps(); 8];
        let mut minimum = [_mm256_setzero_ps(); 8];
        for j in 0..8 {
            let (sc, m) = if j < 4 {
                (
                    _mm256_and_si256(byte[j], six),
                    _mm256_and_si256(byte[j + 4], six),
                )
            } else {
                // Bits 6..8 of bytes j − 4 and j, as bits 4..6.
                let top_a = _mm256_slli_epi32(_mm256_srli_epi32(byte[j - 4], 6), 4);
                let top_b = _mm256_slli_epi32(_mm256_srli_epi32(byte[j], 6), 4);
                let lo = byte[j + 4];
                (
                    _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(15)), top_a),
                    _mm256_or_si256(_mm256_srli_epi32(lo, 4), top_b),
                )
            };
            scale[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
            minimum[j] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(m));
        }
        for c in 0..4 {
            let mut lo = [_mm256_setzero_si256(); 8];
            let mut hi = [_mm256_setzero_si256(); 8];
            for k in 0..8 {
                let raw = _mm256_loadu_si256(p.add(codes_at + 32 * (8 * c + k)) as *const __m256i);
                lo[k] = _mm256_and_si256(raw, low);
                hi[k] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            }
            for (j, w) in [(2 * c, &lo), (2 * c + 1, &hi)] {
                let b = 8 * t + j;
                for i in 0..R {
                    let dot = dot_quads(w, xq[i].add(b * QK) as *const i32);
                    let (dx, sx) = (*xd[i].add(b), *xs[i].add(b));
                    let sd = _mm256_mul_ps(scale[j], _mm256_set1_ps(dx));
                    acc[i] = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(dot), acc[i]);
                    acc[i] = _mm256_fnmadd_ps(minimum[j], _mm256_set1_ps(sx), acc[i]);
                }
            }
        }
    }
    lanes(&acc)
}

/// Tiled Q6_K (`super::tiles`): values `q − 32` (`q` ∈ 0..64: four bits in `ql`, two in
/// `qh`) with an i8 scale per 16. Per activation block (two scale groups) and row `i`:
/// the groups' integer products `Σ q·x − 32·Σ x` (the halves' sums `xh`) weighted by their
/// scales in i32, then `acc[i] += d·d_x·that`.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(super) unsafe fn tile_q6k_vnni<const R: usize>(
    geometry: &TileGeometry,
    tiles: *const u8,
    nb: usize,
    xq: &[*const i8; R],
    xd: &[*const f32; R],
    xh: &[*const i16; R],
) -> [[f32; 8]; R] {
    let (codes_at, tile_bytes) = (geometry.codes_at, geometry.bytes);
    let high_at = geometry.high_at.expect("Q6_K tiles have qh");
    let scales_at = geometry.scales_at.expect("Q6_K tiles have scales");
    let (low, two_bits) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let mut acc = [_mm256_setzero_ps(); R];
    for t in 0..nb / 8 {
        let p = tiles.add(t * tile_bytes);
        let d = eight_f16(p);
        for h in 0..2 {
            let mut qh = [_mm256_setzero_si256(); 8];
            for (k, v) in qh.iter_mut().enumerate() {
                *v = _mm256_loadu_si256(p.add(high_at + 32 * (8 * h + k)) as *const __m256i);
            }
            // Sub-block `g` of the half: the low (g < 2) or high nibbles of `ql`'s group
            // run `g % 2` (reloaded from L1 rather than held, to spare registers), and
            // bits 2g..2g+2 of `qh` moved to bits 4..6.
            for g in 0..4 {
                let mut w = [_mm256_setzero_si256(); 8];
                for k in 0..8 {
                    let at = codes_at + 32 * (16 * h + 8 * (g % 2) + k);
                    let ql = _mm256_loadu_si256(p.add(at) as *const __m256i);
                    let nibble = if g < 2 {
                        _mm256_and_si256(ql, low)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16(ql, 4), low)
                    };
                    let top = match g {
                        0 => _mm256_slli_epi32(qh[k], 4),
                        1 => _mm256_slli_epi32(qh[k], 2),
                        2 => qh[k],
                        _ => _mm256_srli_epi32(qh[k], 2),
                    };
                    w[k] = _mm256_or_si256(nibble, _mm256_and_si256(top, two_bits));
                }
                let a = 4 * h + g;
                let sc_lo = run_of_eight::<true>(p.add(scales_at + 8 * (2 * a)));
                let sc_hi = run_of_eight::<true>(p.add(scales_at + 8 * (2 * a + 1)));
                let b = 8 * t + a;
                let (w_lo, w_hi) = ([w[0], w[1], w[2], w[3]], [w[4], w[5], w[6], w[7]]);
                for i in 0..R {
                    let x = xq[i].add(b * QK) as *const i32;
                    let (s_lo, s_hi) = (*xh[i].add(2 * b), *xh[i].add(2 * b + 1));
                    let lo =
                        _mm256_sub_epi32(dot_quads(&w_lo, x), _mm256_set1_epi32(32 * s_lo as i32));
                    let hi = _mm256_sub_epi32(
                        dot_quads(&w_hi, x.add(4)),
                        _mm256_set1_epi32(32 * s_hi as i32),
                    );
                    // |q·x| sums: 16·63·127 per group, times |sc| ≤ 128: within i32.
                    let sum = _mm256_add_epi32(
                        _mm256_mullo_epi32(sc_lo, lo),
                        _mm256_mullo_epi32(sc_hi, hi),
                    );
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(*xd[i].add(b)));
                    acc[i] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum), acc[i]);
                }
            }
        }
    }
    lanes(&acc)
}

/// The f16 at `p`, widened (F16C).
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
        (p as *const u16).read_unaligned() as i32,
    )))
}

/// Byte `j` of the result is `0xFF` where bit `j` of `bits` is set, else 0.
#[inline(always)]
unsafe fn bytes_from_bits(bits: u32) -> __m256i {
    // Broadcast, then give byte j the source byte j / 8 ...
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    // ... and set every bit but bit j % 8: all ones exactly where that bit was set.
    let others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1))
}

/// Q5_1 (`Q51 = true`) or Q5_0 weights: Q4's nibbles plus a fifth bit from `qh`
/// (`x = d·q + m`, or `d·(q − 16)`).
#[inline(always)]
unsafe fn dot_q5_with<D: U8I8Dot, const R: usize, const Q51: bool>(
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
    xs: &[&[f32]; R],
) -> [f32; R] {
    let (bb, qh_at) = if Q51 {
        (Q5_1::BYTES, Q5_1::HIGH)
    } else {
        (Q5_0::BYTES, Q5_0::HIGH)
    };
    // Both keep their codes right after `qh`, and Q5_1 its min at Q4_1's place.
    const _: () = assert!(Q5_1::CODES == Q5_1::HIGH + 4 && Q5_0::CODES == Q5_0::HIGH + 4);
    let mut sums = Sums::<R>::new();
    let (low, bit4) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let p = row.as_ptr();
    over_blocks!(nb, sums, |b, acc, off| {
        let blk = p.add(b * bb);
        let d = f16_at(blk.add(Q5_0::D));
        let o = if Q51 {
            f16_at(blk.add(Q5_1::MIN))
        } else {
            -16.0 * d
        };
        let raw = _mm_loadu_si128(blk.add(qh_at + 4) as *const __m128i);
        let nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
        let qh = (blk.add(qh_at) as *const u32).read_unaligned();
        let wq = _mm256_or_si256(nibbles, _mm256_and_si256(bytes_from_bits(qh), bit4));
        // Codes ≤ 31.
        add_unsigned_block::<D, R>(wq, d, o, b, xq, xd, xs, acc, off);
    });
    sums.total()
}

/// Q4_K weights: super-blocks of 8 sub-blocks of 32, each one activation block, with
/// scale `d·sc` and offset `−dmin·m` (sub-block `j`: the low (even `j`) or high nibbles of
/// bytes `32·(j/2)..`).
#[inline(always)]
unsafe fn dot_q4k_with<D: U8I8Dot, const R: usize>(
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
    xs: &[&[f32]; R],
) -> [f32; R] {
    let mut sums = Sums::<R>::new();
    let low = _mm256_set1_epi8(0x0F);
    let p = row.as_ptr();
    for sb in 0..nb / 8 {
        let blk = p.add(sb * Q4K::BYTES);
        let (d, dmin) = (f16_at(blk.add(Q4K::D)), f16_at(blk.add(Q4K::DMIN)));
        let scales = std::slice::from_raw_parts(blk.add(Q4K::SCALES), Q4K::CODES - Q4K::SCALES);
        // Sub-blocks 2i and 2i + 1 are the low and high nibbles of the same 32 bytes; each
        // goes to its own accumulators (see `Sums`).
        for i in 0..4 {
            let (b, j) = (sb * 8 + 2 * i, 2 * i);
            let bytes = _mm256_loadu_si256(blk.add(Q4K::CODES + 32 * i) as *const __m256i);
            // Codes ≤ 15; a sub-block's offset is `−dmin·m`.
            let (sc, m) = k4_scale_min(scales, j);
            let wq = _mm256_and_si256(bytes, low);
            let [acc0, acc1] = &mut sums.acc;
            let [off0, off1] = &mut sums.off;
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            add_unsigned_block::<D, R>(wq, dl, -ml, b, xq, xd, xs, acc0, off0);
            let (sc, m) = k4_scale_min(scales, j + 1);
            let wq = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            add_unsigned_block::<D, R>(wq, dl, -ml, b + 1, xq, xd, xs, acc1, off1);
        }
    }
    sums.total()
}

/// Q5_K weights: Q4_K's sub-blocks (a 6-bit scale and min per 32 values) with a fifth bit
/// per value: bit `j` of `qh[l]` is the high bit of value `l` of sub-block `j`. Layout (176
/// bytes): d, dmin (f16), scales[12], qh[32], qs[128].
#[inline(always)]
unsafe fn dot_q5k_with<D: U8I8Dot, const R: usize>(
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
    xs: &[&[f32]; R],
) -> [f32; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let mut off = [0f32; R];
    let (low, one) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x01));
    let p = row.as_ptr();
    for sb in 0..nb / 8 {
        let blk = p.add(sb * Q5K::BYTES);
        let (d, dmin) = (f16_at(blk.add(Q5K::D)), f16_at(blk.add(Q5K::DMIN)));
        let scales = std::slice::from_raw_parts(blk.add(Q5K::SCALES), Q5K::HIGH - Q5K::SCALES);
        let hbytes = _mm256_loadu_si256(blk.add(Q5K::HIGH) as *const __m256i);
        for j in 0..8 {
            let b = sb * 8 + j;
            let (sc, m) = k4_scale_min(scales, j);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            let bytes = _mm256_loadu_si256(blk.add(Q5K::CODES + 32 * (j / 2)) as *const __m256i);
            let lo = if j % 2 == 0 {
                _mm256_and_si256(bytes, low)
            } else {
                _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low)
            };
            // Bit j of each qh byte, as 0 or 16 (the 16-bit shifts keep it inside its byte
            // once masked to one bit).
            let hi = _mm256_and_si256(_mm256_srl_epi16(hbytes, _mm_cvtsi32_si128(j as i32)), one);
            let wq = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            // Codes ≤ 31; the sub-block's offset is `−dmin·m`.
            add_unsigned_block::<D, R>(wq, dl, -ml, b, xq, xd, xs, &mut acc, &mut off);
        }
    }
    finish(&acc, &off)
}

/// `Σ w·x` and `Σ x` of one 32-value block as i32 lanes: lanes 0–3 cover values 0..16 and
/// lanes 4–7 values 16..32 (the two 16-value scale groups of the K-quants that have them).
/// `wq` holds unsigned codes < 64 (a `maddubs` pair sums to at most 2·63·127 < 2^15).
#[inline(always)]
unsafe fn group_dot_and_sum<D: U8I8Dot>(wq: __m256i, x: __m256i) -> (__m256i, __m256i) {
    (D::dot(wq, x), D::dot(_mm256_set1_epi8(1), x))
}

/// Block `b` of 32 unsigned codes `wq` (< 64) whose two 16-value halves each have a scale
/// and an offset (lanes 0–3 of `scale`/`offset` for values 0..16, lanes 4–7 for 16..32):
/// adds `xd · (scale·Σ w·x − offset·Σ x)` for every activation row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn add_grouped_block<D: U8I8Dot, const R: usize>(
    wq: __m256i,
    scale: __m256,
    offset: __m256,
    b: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
    acc: &mut [__m256; R],
) {
    for r in 0..R {
        let x = _mm256_loadu_si256(xq[r].as_ptr().add(b * QK) as *const __m256i);
        let (dot, sum) = group_dot_and_sum::<D>(wq, x);
        let t = _mm256_fmsub_ps(
            scale,
            _mm256_cvtepi32_ps(dot),
            _mm256_mul_ps(offset, _mm256_cvtepi32_ps(sum)),
        );
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(*xd[r].get_unchecked(b)), t, acc[r]);
    }
}

/// The 2-bit codes of sub-block `a` (32 values) of a Q2_K/Q3_K super-block whose packed
/// `qs` start at `qs`: value `l` is bits `2·(a % 4)` of `qs[32·(a / 4) + l]`.
#[inline(always)]
unsafe fn two_bit_codes(qs: *const u8, a: usize) -> __m256i {
    let bytes = _mm256_loadu_si256(qs.add(32 * (a / 4)) as *const __m256i);
    _mm256_and_si256(
        _mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * (a % 4) as i32)),
        _mm256_set1_epi8(0x03),
    )
}

/// Q2_K weights: 2-bit codes, per 16 values a 4-bit scale (low nibble) and 4-bit min (high
/// nibble), value `d·sc·q − dmin·m`. Layout (84 bytes): scales[16], qs[64], d, dmin (f16);
/// value `l` of sub-block `a` is bits `2·(a % 4)` of `qs[32·(a / 4) + l]`.
#[inline(always)]
unsafe fn dot_q2k_with<D: U8I8Dot, const R: usize>(
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
) -> [f32; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let p = row.as_ptr();
    for sb in 0..nb / 8 {
        let blk = p.add(sb * Q2K::BYTES);
        let (d, dmin) = (f16_at(blk.add(Q2K::D)), f16_at(blk.add(Q2K::DMIN)));
        for a in 0..8 {
            let b = sb * 8 + a;
            let wq = two_bit_codes(blk.add(Q2K::CODES), a);
            let scales = blk.add(Q2K::SCALES);
            let (sc_lo, sc_hi) = (*scales.add(2 * a), *scales.add(2 * a + 1));
            let scale = _mm256_set_m128(
                _mm_set1_ps(d * (sc_hi & 0x0F) as f32),
                _mm_set1_ps(d * (sc_lo & 0x0F) as f32),
            );
            let min = _mm256_set_m128(
                _mm_set1_ps(dmin * (sc_hi >> 4) as f32),
                _mm_set1_ps(dmin * (sc_lo >> 4) as f32),
            );
            add_grouped_block::<D, R>(wq, scale, min, b, xq, xd, &mut acc);
        }
    }
    finish(&acc, &[0.0; R])
}

/// Q3_K weights: 3-bit values `q − 4` (two low bits in `qs`, the high bit in `hmask`, set
/// meaning +4), a signed 6-bit scale per 16 values. Layout (110 bytes): hmask[32], qs[64],
/// scales[12], d (f16); value `l` of sub-block `a` takes bits `2·(a % 4)` of
/// `qs[32·(a / 4) + l]` and bit `a` of `hmask[l]`. Codes `q ∈ 0..8` are dotted unsigned and
/// `4·scale·Σx` removed per group.
#[inline(always)]
unsafe fn dot_q3k_with<D: U8I8Dot, const R: usize>(
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
) -> [f32; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let one = _mm256_set1_epi8(0x01);
    let p = row.as_ptr();
    for sb in 0..nb / 8 {
        let blk = p.add(sb * Q3K::BYTES);
        let d = f16_at(blk.add(Q3K::D));
        let scales = k3_scales(std::slice::from_raw_parts(
            blk.add(Q3K::SCALES),
            Q3K::D - Q3K::SCALES,
        ));
        let hbytes = _mm256_loadu_si256(blk.add(Q3K::HIGH_MASK) as *const __m256i);
        for a in 0..8 {
            let b = sb * 8 + a;
            let lo = two_bit_codes(blk.add(Q3K::CODES), a);
            let hi = _mm256_and_si256(_mm256_srl_epi16(hbytes, _mm_cvtsi32_si128(a as i32)), one);
            // hi ≤ 1: shifting 16-bit lanes by 2 keeps it inside its byte.
            let wq = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
            let (s_lo, s_hi) = (d * scales[2 * a] as f32, d * scales[2 * a + 1] as f32);
            let scale = _mm256_set_m128(_mm_set1_ps(s_hi), _mm_set1_ps(s_lo));
            // value = scale·(code − 4): the offset per unit of Σx is 4·scale.
            let bias = _mm256_set_m128(_mm_set1_ps(4.0 * s_hi), _mm_set1_ps(4.0 * s_lo));
            add_grouped_block::<D, R>(wq, scale, bias, b, xq, xd, &mut acc);
        }
    }
    finish(&acc, &[0.0; R])
}

/// Q6_K weights: 6-bit values `q` stored biased (`q + 32` ∈ 0..64, four bits in `ql`, two
/// in `qh`), an i8 scale per 16. Each activation block holds two scale groups: the i32 lanes
/// of `madd` are 0–3 for its first 16 values and 4–7 for the next, so the lanes take
/// their group's scale, and `Σ(q + 32)·x − 32·Σx` removes the bias per group.
#[inline(always)]
unsafe fn dot_q6k_with<D: U8I8Dot, const R: usize>(
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
) -> [f32; R] {
    let mut sums = Sums::<R>::new();
    let p = row.as_ptr();
    for sb in 0..nb / 8 {
        let blk = p.add(sb * Q6K::BYTES);
        let d = f16_at(blk.add(Q6K::D));
        // Even and odd sub-blocks into their own accumulators (see `Sums`).
        for pair in 0..4 {
            let [acc0, acc1] = &mut sums.acc;
            q6k_sub_block::<D, R>(blk, d, 2 * pair, sb * 8, xq, xd, acc0);
            q6k_sub_block::<D, R>(blk, d, 2 * pair + 1, sb * 8, xq, xd, acc1);
        }
    }
    sums.total()
}

/// Sub-block `a` of the Q6_K super-block at `blk` (scale `d`, first activation block
/// `b0`) against every activation row, into `acc`.
#[inline(always)]
unsafe fn q6k_sub_block<D: U8I8Dot, const R: usize>(
    blk: *const u8,
    d: f32,
    a: usize,
    b0: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
    acc: &mut [__m256; R],
) {
    let (low, two) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x03));
    let scales = blk.add(Q6K::SCALES) as *const i8;
    let b = b0 + a;
    let (half, g) = (a / 4, a % 4);
    let lbytes = _mm256_loadu_si256(blk.add(Q6K::LOW + 64 * half + 32 * (g % 2)) as *const __m256i);
    let lo = if g < 2 {
        _mm256_and_si256(lbytes, low)
    } else {
        _mm256_and_si256(_mm256_srli_epi16(lbytes, 4), low)
    };
    let hbytes = _mm256_loadu_si256(blk.add(Q6K::HIGH + 32 * half) as *const __m256i);
    let hi = _mm256_and_si256(
        _mm256_srl_epi16(hbytes, _mm_cvtsi32_si128(2 * g as i32)),
        two,
    );
    // hi ≤ 3: shifting 16-bit lanes by 4 keeps it inside its byte.
    let wq = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    let s_lo = d * *scales.add(2 * a) as f32;
    let s_hi = d * *scales.add(2 * a + 1) as f32;
    let group_scale = _mm256_set_m128(_mm_set1_ps(s_hi), _mm_set1_ps(s_lo));
    for r in 0..R {
        let x = _mm256_loadu_si256(xq[r].as_ptr().add(b * QK) as *const __m256i);
        // u8 (≤ 63) × i8 pairs: |sum| ≤ 2·63·127 < 2^15.
        let (dot, sum) = group_dot_and_sum::<D>(wq, x);
        let unbiased = _mm256_sub_epi32(dot, _mm256_slli_epi32(sum, 5));
        let scale = _mm256_mul_ps(group_scale, _mm256_set1_ps(*xd[r].get_unchecked(b)));
        acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(unbiased), acc[r]);
    }
}

/// Block `b` of 32 unsigned weight codes `wq` (each < 64: a `maddubs` pair sums to at most
/// 2·63·127 < 2^15, no i16 saturation) against block `b` of every activation row:
/// `acc[r] += (w_scale · xd[r][b]) · Σ wq·x[r]`, and the weights' offset through the rows'
/// block sums, `off[r] += w_offset · xs[r][b]`. The inner loop of the Q4_0/Q4_1, Q5_0/Q5_1
/// and Q4_K kernels, which differ only in how they unpack `wq` and its scale and offset.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn add_unsigned_block<D: U8I8Dot, const R: usize>(
    wq: __m256i,
    w_scale: f32,
    w_offset: f32,
    b: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
    xs: &[&[f32]; R],
    acc: &mut [__m256; R],
    off: &mut [f32; R],
) {
    for r in 0..R {
        let x = _mm256_loadu_si256(xq[r].as_ptr().add(b * QK) as *const __m256i);
        let dot = D::dot(wq, x);
        let scale = _mm256_set1_ps(w_scale * *xd[r].get_unchecked(b));
        acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[r]);
        off[r] += w_offset * *xs[r].get_unchecked(b);
    }
}

/// Two sets of accumulators (vector products and scalar offsets), for even and odd
/// blocks: with one set, each block's FMA waits for the previous block's (4 cycles of
/// latency), which at batch 1 bounds a kernel to one block per 4 cycles.
struct Sums<const R: usize> {
    acc: [[__m256; R]; 2],
    off: [[f32; R]; 2],
}

impl<const R: usize> Sums<R> {
    #[inline(always)]
    unsafe fn new() -> Self {
        Sums {
            acc: [[_mm256_setzero_ps(); R]; 2],
            off: [[0.0; R]; 2],
        }
    }

    #[inline(always)]
    unsafe fn total(&self) -> [f32; R] {
        let mut acc = self.acc[0];
        let mut off = self.off[0];
        for r in 0..R {
            acc[r] = _mm256_add_ps(acc[r], self.acc[1][r]);
            off[r] += self.off[1][r];
        }
        finish(&acc, &off)
    }
}

/// `hsum(acc[r]) + off[r]` per row, in a loop: `std::array::from_fn`'s closure would
/// not inherit the kernel's target features, and its intrinsics would become calls.
#[inline(always)]
unsafe fn finish<const R: usize>(acc: &[__m256; R], off: &[f32; R]) -> [f32; R] {
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = hsum(acc[r]) + off[r];
    }
    out
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Q4_1 (`Q41 = true`) or Q4_0 weights against 8-bit activations.
#[inline(always)]
unsafe fn dot_q4_with<D: U8I8Dot, const R: usize, const Q41: bool>(
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
    xs: &[&[f32]; R],
) -> [f32; R] {
    let bb = if Q41 { Q4_1::BYTES } else { Q4_0::BYTES };
    let qoff = if Q41 { Q4_1::CODES } else { Q4_0::CODES };
    // d (and Q4_1's m right after it) are read as one word at the block's start.
    const _: () = assert!(Q4_0::D == 0 && Q4_1::D == 0 && Q4_1::MIN == 2);
    let mut sums = Sums::<R>::new();
    let low = _mm256_set1_epi8(0x0F);
    let p = row.as_ptr();
    over_blocks!(nb, sums, |b, acc, off| {
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
        // Codes ≤ 15.
        add_unsigned_block::<D, R>(wq, d, o, b, xq, xd, xs, acc, off);
    });
    sums.total()
}

/// The f16 scale bits of the Q8_0 block at `blk`.
#[inline(always)]
unsafe fn q8_0_scale_bits(blk: *const u8) -> i16 {
    (blk.add(Q8_0::D) as *const u16).read_unaligned() as i16
}

/// The Q8_0 block at `blk` as `(|w|, w)`: |w| ≤ 128 as u8; with x ∈ [−127, 127]
/// (activations never hold −128) a pair sums to at most 2·128·127 < 2^15.
#[inline(always)]
unsafe fn q8_0_weights(blk: *const u8) -> (__m256i, __m256i) {
    let w = _mm256_loadu_si256(blk.add(Q8_0::CODES) as *const __m256i);
    (_mm256_sign_epi8(w, w), w)
}

/// `Σ w·x` of one block (the sign trick: `|w| · (x · sign(w))`), as f32 lanes.
#[inline(always)]
unsafe fn q8_0_block_dot<D: U8I8Dot>((aw, w): (__m256i, __m256i), x: *const i8) -> __m256 {
    let x = _mm256_loadu_si256(x as *const __m256i);
    _mm256_cvtepi32_ps(D::dot(aw, _mm256_sign_epi8(x, w)))
}

/// Q8_0 weights against 8-bit activations (signed × signed via the sign trick:
/// `|w| · (x · sign(w))`).
///
/// Four blocks at a time share their scale work: one F16C conversion of the four weight
/// scales and one product with the activations' four, each block's scale then a lane
/// permute. Per block that leaves the integer product, its conversion and one FMA: this
/// kernel reads the LM heads (Gemma 3's is 168 M Q8_0 weights, most of a decode step), and
/// there the per-block scalar scale work was a quarter of the instructions.
#[inline(always)]
unsafe fn dot_q8_0_with<D: U8I8Dot, const R: usize>(
    row: &[u8],
    nb: usize,
    xq: &[&[i8]; R],
    xd: &[&[f32]; R],
) -> [f32; R] {
    let mut sums = Sums::<R>::new();
    let p = row.as_ptr();
    let mut b = 0;
    while b + 4 <= nb {
        let blk = p.add(b * Q8_0::BYTES);
        let dw = _mm_cvtph_ps(_mm_setr_epi16(
            q8_0_scale_bits(blk),
            q8_0_scale_bits(blk.add(Q8_0::BYTES)),
            q8_0_scale_bits(blk.add(2 * Q8_0::BYTES)),
            q8_0_scale_bits(blk.add(3 * Q8_0::BYTES)),
            0,
            0,
            0,
            0,
        ));
        let mut s8 = [_mm256_setzero_ps(); R];
        for r in 0..R {
            let s4 = _mm_mul_ps(dw, _mm_loadu_ps(xd[r].as_ptr().add(b)));
            s8[r] = _mm256_set_m128(s4, s4);
        }
        for i in 0..4 {
            let w = q8_0_weights(blk.add(i * Q8_0::BYTES));
            let lane = _mm256_set1_epi32(i as i32);
            let acc = &mut sums.acc[i % 2];
            for r in 0..R {
                let scale = _mm256_permutevar8x32_ps(s8[r], lane);
                let dot = q8_0_block_dot::<D>(w, xq[r].as_ptr().add((b + i) * QK));
                acc[r] = _mm256_fmadd_ps(scale, dot, acc[r]);
            }
        }
        b += 4;
    }
    for b in b..nb {
        let blk = p.add(b * Q8_0::BYTES);
        let d = f16_at(blk.add(Q8_0::D));
        let w = q8_0_weights(blk);
        let acc = &mut sums.acc[0];
        for r in 0..R {
            let scale = _mm256_set1_ps(d * *xd[r].get_unchecked(b));
            let dot = q8_0_block_dot::<D>(w, xq[r].as_ptr().add(b * QK));
            acc[r] = _mm256_fmadd_ps(scale, dot, acc[r]);
        }
    }
    sums.total()
}
