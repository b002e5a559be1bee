//! The K-quants: 256-element super-blocks of 16 or 8 sub-blocks, each with its own packed
//! scale (and min), under one or two f16 super-scales (what llama.cpp's `Q4_K_M` and friends
//! are made of).

use super::{f16_at, k3_scales, k4_scale_min, BlockFormat, IntBlock, QK, QK_K};

/// `scales: u8[16] | q: u8[64] | d: f16 | dmin: f16`, 84 bytes: 16 sub-blocks of 16 with a
/// 4-bit scale and a 4-bit min each, 2-bit values.
pub struct Q2K;

impl Q2K {
    /// One byte per sub-block: scale in the low nibble, min in the high one.
    pub const SCALES: usize = 0;
    /// The 2-bit codes, four to a byte.
    pub const CODES: usize = 16;
    pub const D: usize = 80;
    pub const DMIN: usize = 82;
}

/// `hmask: u8[32] | q: u8[64] | scales: u8[12] | d: f16`, 110 bytes: 16 sub-blocks of 16 with
/// 6-bit signed scales, 3-bit values (the high bit in `hmask`).
pub struct Q3K;

impl Q3K {
    /// The third bit of every value: bit `4·half + s` of byte `l`.
    pub const HIGH_MASK: usize = 0;
    /// The low 2 bits, four to a byte.
    pub const CODES: usize = 32;
    /// The 16 packed 6-bit scales ([`k3_scales`]).
    pub const SCALES: usize = 96;
    pub const D: usize = 108;
}

/// `d: f16 | dmin: f16 | scales: u8[12] | q: u8[128]`, 144 bytes: 8 sub-blocks of 32 with a
/// 6-bit scale and a 6-bit min each, 4-bit values.
pub struct Q4K;

impl Q4K {
    pub const D: usize = 0;
    pub const DMIN: usize = 2;
    /// The 8 packed 6-bit scales and mins ([`k4_scale_min`]).
    pub const SCALES: usize = 4;
    /// The 4-bit codes: sub-block `j` in the low (`j` even) or high nibbles of 32 bytes.
    pub const CODES: usize = 16;
}

/// `d: f16 | dmin: f16 | scales: u8[12] | qh: u8[32] | q: u8[128]`, 176 bytes: as Q4_K with a
/// fifth bit per value in `qh`.
pub struct Q5K;

impl Q5K {
    pub const D: usize = 0;
    pub const DMIN: usize = 2;
    pub const SCALES: usize = 4;
    /// The fifth bits: bit `j` of byte `l` for element `l` of sub-block `j`.
    pub const HIGH: usize = 16;
    pub const CODES: usize = 48;
}

/// `ql: u8[128] | qh: u8[64] | scales: i8[16] | d: f16`, 210 bytes: 16 sub-blocks of 16 with
/// 8-bit signed scales, 6-bit values.
pub struct Q6K;

impl Q6K {
    /// The low 4 bits of every value.
    pub const LOW: usize = 0;
    /// The high 2 bits, four to a byte.
    pub const HIGH: usize = 128;
    /// 16 signed 8-bit scales.
    pub const SCALES: usize = 192;
    pub const D: usize = 208;
}

// Each layout ends where its block does.
const _: () = assert!(Q2K::CODES + QK_K / 4 == Q2K::D && Q2K::DMIN + 2 == Q2K::BYTES);
const _: () = assert!(Q3K::CODES + QK_K / 4 == Q3K::SCALES && Q3K::D + 2 == Q3K::BYTES);
const _: () = assert!(Q4K::SCALES + 12 == Q4K::CODES && Q4K::CODES + QK_K / 2 == Q4K::BYTES);
const _: () = assert!(Q5K::HIGH + QK_K / 8 == Q5K::CODES && Q5K::CODES + QK_K / 2 == Q5K::BYTES);
const _: () = assert!(Q6K::HIGH + QK_K / 4 == Q6K::SCALES && Q6K::D + 2 == Q6K::BYTES);

impl BlockFormat for Q2K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 84;
    const INT_GROUP: usize = 16;

    fn decode(b: &[u8], out: &mut [f32]) {
        let scales = &b[Self::SCALES..Self::CODES];
        let qs = &b[Self::CODES..Self::D];
        let (d, dmin) = (f16_at(b, Self::D), f16_at(b, Self::DMIN));
        // Two halves of 128; in each, shift s ∈ {0,2,4,6} picks 32 values of 2 bits from the
        // half's 32 bytes, as two sub-blocks of 16 with their own scale and min.
        for (e, o) in out.iter_mut().enumerate() {
            let (half, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let sc = scales[e / 16];
            let dl = d * (sc & 0x0F) as f32;
            let ml = dmin * (sc >> 4) as f32;
            let q = (qs[half * 32 + l] >> (2 * s)) & 3;
            *o = dl * q as f32 - ml;
        }
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        let (d, dmin) = (f16_at(b, Self::D), f16_at(b, Self::DMIN));
        for (g, &sc) in b[Self::SCALES..Self::CODES].iter().enumerate() {
            out.set(g, d * (sc & 0x0F) as f32, -(dmin * (sc >> 4) as f32));
        }
        for (e, w) in out.q.iter_mut().enumerate() {
            let (half, s, l) = (e / 128, (e % 128) / 32, e % 32);
            *w = ((b[Self::CODES + half * 32 + l] >> (2 * s)) & 3) as i32;
        }
    }
}

impl BlockFormat for Q3K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 110;
    const INT_GROUP: usize = 16;

    fn decode(b: &[u8], out: &mut [f32]) {
        let hmask = &b[Self::HIGH_MASK..Self::CODES];
        let qs = &b[Self::CODES..Self::SCALES];
        let scales = k3_scales(&b[Self::SCALES..Self::D]);
        let d = f16_at(b, Self::D);
        for (e, o) in out.iter_mut().enumerate() {
            let (half, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let dl = d * scales[e / 16] as f32;
            let low = ((qs[half * 32 + l] >> (2 * s)) & 3) as i8;
            // The high bit *set* means no offset: the value is `low`, else `low − 4`.
            let high_set = (hmask[l] >> (half * 4 + s)) & 1 == 1;
            let q = if high_set { low } else { low - 4 };
            *o = dl * q as f32;
        }
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        let d = f16_at(b, Self::D);
        for (g, sc) in k3_scales(&b[Self::SCALES..Self::D]).into_iter().enumerate() {
            out.set(g, d * sc as f32, 0.0);
        }
        for (e, w) in out.q.iter_mut().enumerate() {
            let (half, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = ((b[Self::CODES + half * 32 + l] >> (2 * s)) & 3) as i32;
            let high_set = (b[Self::HIGH_MASK + l] >> (half * 4 + s)) & 1 == 1;
            *w = if high_set { low } else { low - 4 };
        }
    }
}

/// Q4_K and Q5_K (`qh`: Q5_K's fifth bits). Sub-block `j` (of 32): the low (`j` even) or high
/// (`j` odd) nibbles of bytes `32·(j/2)..32·(j/2)+32`; Q5_K's fifth bit is bit `j` of `qh[l]`.
fn decode_k4(b: &[u8], scales: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, Q4K::D), f16_at(b, Q4K::DMIN));
    for j in 0..8 {
        let (sc, m) = k4_scale_min(scales, j);
        let dl = d * sc as f32;
        let ml = dmin * m as f32;
        for l in 0..32 {
            let byte = qs[32 * (j / 2) + l];
            let mut q = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            if let Some(qh) = qh {
                q |= ((qh[l] >> j) & 1) << 4;
            }
            out[32 * j + l] = dl * q as f32 - ml;
        }
    }
}

/// [`decode_k4`]'s integer form.
fn decode_k4_int(b: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut IntBlock) {
    let (d, dmin) = (f16_at(b, Q4K::D), f16_at(b, Q4K::DMIN));
    for j in 0..8 {
        let (sc, m) = k4_scale_min(&b[Q4K::SCALES..Q4K::SCALES + 12], j);
        out.set(j, d * sc as f32, -(dmin * m as f32));
        for l in 0..32 {
            let byte = qs[32 * (j / 2) + l];
            let mut q = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            if let Some(qh) = qh {
                q |= ((qh[l] >> j) & 1) << 4;
            }
            out.q[32 * j + l] = q as i32;
        }
    }
}

// Q5_K's scales sit where Q4_K's do, so one reader serves both.
const _: () = assert!(Q4K::D == Q5K::D && Q4K::DMIN == Q5K::DMIN && Q4K::SCALES == Q5K::SCALES);

impl BlockFormat for Q4K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 144;
    const INT_GROUP: usize = QK;

    fn decode(b: &[u8], out: &mut [f32]) {
        let scales = &b[Self::SCALES..Self::CODES];
        decode_k4(b, scales, None, &b[Self::CODES..Self::BYTES], out);
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        decode_k4_int(b, None, &b[Self::CODES..Self::BYTES], out);
    }
}

impl BlockFormat for Q5K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 176;
    const INT_GROUP: usize = QK;

    fn decode(b: &[u8], out: &mut [f32]) {
        let scales = &b[Self::SCALES..Self::HIGH];
        let qh = &b[Self::HIGH..Self::CODES];
        decode_k4(b, scales, Some(qh), &b[Self::CODES..Self::BYTES], out);
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        let qh = &b[Self::HIGH..Self::CODES];
        decode_k4_int(b, Some(qh), &b[Self::CODES..Self::BYTES], out);
    }
}

impl BlockFormat for Q6K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 210;
    const INT_GROUP: usize = 16;

    fn decode(b: &[u8], out: &mut [f32]) {
        let ql = &b[Self::LOW..Self::HIGH];
        let qh = &b[Self::HIGH..Self::SCALES];
        let scales = &b[Self::SCALES..Self::D];
        let d = f16_at(b, Self::D);
        // Two halves of 128; in each, four groups of 32: group g takes the low (g < 2) or high
        // nibble of ql[64·half + 32·(g % 2) + l] and bits 2g..2g+2 of qh[32·half + l].
        for (e, o) in out.iter_mut().enumerate() {
            let (half, g, l) = (e / 128, (e % 128) / 32, e % 32);
            let lbyte = ql[64 * half + 32 * (g % 2) + l];
            let low = if g < 2 { lbyte & 0x0F } else { lbyte >> 4 };
            let high = (qh[32 * half + l] >> (2 * g)) & 3;
            let q = (low | (high << 4)) as i8 - 32;
            let dl = d * (scales[e / 16] as i8) as f32;
            *o = dl * q as f32;
        }
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        let d = f16_at(b, Self::D);
        for (g, &sc) in b[Self::SCALES..Self::D].iter().enumerate() {
            out.set(g, d * (sc as i8) as f32, 0.0);
        }
        for (e, w) in out.q.iter_mut().enumerate() {
            let (half, g, l) = (e / 128, (e % 128) / 32, e % 32);
            let lbyte = b[Self::LOW + 64 * half + 32 * (g % 2) + l];
            let low = if g < 2 { lbyte & 0x0F } else { lbyte >> 4 };
            let high = (b[Self::HIGH + 32 * half + l] >> (2 * g)) & 3;
            *w = (low | (high << 4)) as i32 - 32;
        }
    }
}
