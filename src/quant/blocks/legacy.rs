//! The 32-element formats (ggml's first generation): a block is an f16 scale, perhaps an f16
//! min and a word of fifth bits, then the codes. Element `j < 16` is the low nibble of code byte
//! `j`, element `j + 16` its high nibble (Q8_0: one signed byte each).

use super::{f16_at, put_f16, BlockFormat, IntBlock, WritableBlock, QK};

/// `d: f16 | q: i8[32]`, 34 bytes: `x = d·q`.
pub struct Q8_0;

impl Q8_0 {
    /// The scale `d` (f16).
    pub const D: usize = 0;
    /// The 32 signed codes.
    pub const CODES: usize = 2;
}

/// `d: f16 | nibbles: u8[16]`, 18 bytes: `x = d·(q − 8)`.
pub struct Q4_0;

impl Q4_0 {
    pub const D: usize = 0;
    /// The 16 bytes of nibbles.
    pub const CODES: usize = 2;
}

/// `d: f16 | m: f16 | nibbles: u8[16]`, 20 bytes: `x = d·q + m`.
pub struct Q4_1;

impl Q4_1 {
    pub const D: usize = 0;
    /// The min `m` (f16).
    pub const MIN: usize = 2;
    pub const CODES: usize = 4;
}

/// `d: f16 | qh: u32 | nibbles: u8[16]`, 22 bytes: bit `j` of `qh` is bit 4 of element `j`;
/// `x = d·(q − 16)`.
pub struct Q5_0;

impl Q5_0 {
    pub const D: usize = 0;
    /// `qh`, the fifth bits (little-endian u32).
    pub const HIGH: usize = 2;
    pub const CODES: usize = 6;
}

/// `d: f16 | m: f16 | qh: u32 | nibbles: u8[16]`, 24 bytes: `x = d·q + m`.
pub struct Q5_1;

impl Q5_1 {
    pub const D: usize = 0;
    pub const MIN: usize = 2;
    pub const HIGH: usize = 4;
    pub const CODES: usize = 8;
}

// Each layout ends where its block does.
const _: () = assert!(Q8_0::CODES + QK == Q8_0::BYTES);
const _: () = assert!(Q4_0::CODES + QK / 2 == Q4_0::BYTES);
const _: () = assert!(Q4_1::CODES + QK / 2 == Q4_1::BYTES);
const _: () = assert!(Q5_0::CODES + QK / 2 == Q5_0::BYTES && Q5_0::HIGH + 4 == Q5_0::CODES);
const _: () = assert!(Q5_1::CODES + QK / 2 == Q5_1::BYTES && Q5_1::HIGH + 4 == Q5_1::CODES);

impl BlockFormat for Q8_0 {
    const ELEMS: usize = QK;
    const BYTES: usize = 34;
    const INT_GROUP: usize = QK;

    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, Self::D);
        for (o, &q) in out.iter_mut().zip(&b[Self::CODES..Self::BYTES]) {
            *o = (q as i8) as f32 * d;
        }
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        out.set(0, f16_at(b, Self::D), 0.0);
        for (w, &q) in out.q.iter_mut().zip(&b[Self::CODES..Self::BYTES]) {
            *w = (q as i8) as i32;
        }
    }
}

impl BlockFormat for Q4_0 {
    const ELEMS: usize = QK;
    const BYTES: usize = 18;
    const INT_GROUP: usize = QK;

    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, Self::D);
        for (j, &q) in b[Self::CODES..Self::BYTES].iter().enumerate() {
            out[j] = d * ((q & 0x0F) as i32 - 8) as f32;
            out[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
        }
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        // Centred at 8.
        let d = f16_at(b, Self::D);
        out.set(0, d, -8.0 * d);
        nibbles_int(&b[Self::CODES..Self::BYTES], out);
    }
}

impl BlockFormat for Q4_1 {
    const ELEMS: usize = QK;
    const BYTES: usize = 20;
    const INT_GROUP: usize = QK;

    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(b, Self::D), f16_at(b, Self::MIN));
        for (j, &q) in b[Self::CODES..Self::BYTES].iter().enumerate() {
            out[j] = d * (q & 0x0F) as f32 + m;
            out[j + 16] = d * (q >> 4) as f32 + m;
        }
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        out.set(0, f16_at(b, Self::D), f16_at(b, Self::MIN));
        nibbles_int(&b[Self::CODES..Self::BYTES], out);
    }
}

/// 16 bytes of nibbles as the integer codes of elements `j` (low) and `j + 16` (high).
fn nibbles_int(codes: &[u8], out: &mut IntBlock) {
    for (j, &q) in codes.iter().enumerate() {
        out.q[j] = (q & 0x0F) as i32;
        out.q[j + 16] = (q >> 4) as i32;
    }
}

/// The 5-bit codes of a Q5 block: element `j` and `j + 16` from code byte `j` and `qh`.
fn q5_codes(
    b: &[u8],
    high_at: usize,
    codes_at: usize,
) -> impl Iterator<Item = (usize, i32, i32)> + '_ {
    let qh = u32::from_le_bytes(b[high_at..high_at + 4].try_into().expect("4 bytes"));
    b[codes_at..codes_at + QK / 2]
        .iter()
        .enumerate()
        .map(move |(j, &q)| {
            let lo = (q & 0x0F) as i32 | ((((qh >> j) & 1) as i32) << 4);
            let hi = (q >> 4) as i32 | ((((qh >> (j + 16)) & 1) as i32) << 4);
            (j, lo, hi)
        })
}

impl BlockFormat for Q5_0 {
    const ELEMS: usize = QK;
    const BYTES: usize = 22;
    const INT_GROUP: usize = QK;

    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, Self::D);
        for (j, lo, hi) in q5_codes(b, Self::HIGH, Self::CODES) {
            out[j] = d * (lo - 16) as f32;
            out[j + 16] = d * (hi - 16) as f32;
        }
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        // Centred at 16.
        let d = f16_at(b, Self::D);
        out.set(0, d, -16.0 * d);
        for (j, lo, hi) in q5_codes(b, Self::HIGH, Self::CODES) {
            (out.q[j], out.q[j + 16]) = (lo, hi);
        }
    }
}

impl BlockFormat for Q5_1 {
    const ELEMS: usize = QK;
    const BYTES: usize = 24;
    const INT_GROUP: usize = QK;

    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(b, Self::D), f16_at(b, Self::MIN));
        for (j, lo, hi) in q5_codes(b, Self::HIGH, Self::CODES) {
            out[j] = d * lo as f32 + m;
            out[j + 16] = d * hi as f32 + m;
        }
    }

    fn decode_int(b: &[u8], out: &mut IntBlock) {
        out.set(0, f16_at(b, Self::D), f16_at(b, Self::MIN));
        for (j, lo, hi) in q5_codes(b, Self::HIGH, Self::CODES) {
            (out.q[j], out.q[j + 16]) = (lo, hi);
        }
    }
}

impl WritableBlock for Q8_0 {
    fn encode(x: &[f32], out: &mut [u8]) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(out, Self::D, d);
        for (o, &v) in out[Self::CODES..Self::BYTES].iter_mut().zip(x) {
            *o = ((v * id).round() as i8) as u8;
        }
    }
}

impl WritableBlock for Q4_0 {
    fn encode(x: &[f32], out: &mut [u8]) {
        // The value of largest magnitude maps to −8, so its sign is kept.
        let max = x
            .iter()
            .copied()
            .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(out, Self::D, d);
        for j in 0..QK / 2 {
            let q = |v: f32| ((v * id + 8.5) as i8).clamp(0, 15) as u8;
            out[Self::CODES + j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}

impl WritableBlock for Q4_1 {
    fn encode(x: &[f32], out: &mut [u8]) {
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(out, Self::D, d);
        put_f16(out, Self::MIN, min);
        for j in 0..QK / 2 {
            let q = |v: f32| (((v - min) * id + 0.5) as i8).clamp(0, 15) as u8;
            out[Self::CODES + j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}
