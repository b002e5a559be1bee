//! GGUF block (de)quantisation, written once. Both the GGUF reader (`formats::gguf`,
//! dequantizing a whole tensor) and the in-memory quantized matrices ([`super::quant::QMatrix`],
//! a row at a time) decode blocks here, so a tensor read either way gives bit-identical values.
//!
//! Readable ([`QFormat`]): the 32-element formats Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the
//! 256-element K-quants Q2_K … Q6_K (what llama.cpp's `Q4_K_M` and friends are made of).
//! Writable ([`WriteFormat`]): Q8_0, Q4_0 and Q4_1, with ggml's reference rounding. Layouts and
//! the order of every f32 operation follow ggml's `dequantize_row_*` and the `gguf` Python
//! package, whose output the tests hold these decoders to bit for bit.

use half::{bf16, f16};

use crate::error::{ElmError, Result};

/// Elements per block of the 32-element formats (and of the activation blocks the integer
/// kernels quantize to).
pub const QK: usize = 32;

/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;

crate::registry::variant_list! {
    /// A block format a [`super::quant::QMatrix`] holds (and a GGUF tensor may be stored in).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum QFormat("block format") {
        /// `d: f16 | q: i8[32]`, 34 bytes: `x = d·q`.
        Q8_0,
        /// `d: f16 | nibbles: u8[16]`, 18 bytes; element `j < 16` is the low nibble of byte `j`,
        /// element `j + 16` its high nibble: `x = d·(q − 8)`.
        Q4_0,
        /// `d: f16 | m: f16 | nibbles: u8[16]`, 20 bytes; nibble order as Q4_0: `x = d·q + m`.
        Q4_1,
        /// `d: f16 | qh: u32 | nibbles: u8[16]`, 22 bytes: bit `j` of `qh` is bit 4 of element
        /// `j`; `x = d·(q − 16)`.
        Q5_0,
        /// `d: f16 | m: f16 | qh: u32 | nibbles: u8[16]`, 24 bytes: `x = d·q + m`.
        Q5_1,
        /// `scales: u8[16] | q: u8[64] | d: f16 | dmin: f16`, 84 bytes: 16 sub-blocks of 16 with
        /// a 4-bit scale and a 4-bit min each, 2-bit values.
        Q2K,
        /// `hmask: u8[32] | q: u8[64] | scales: u8[12] | d: f16`, 110 bytes: 16 sub-blocks of 16
        /// with 6-bit signed scales, 3-bit values (the high bit in `hmask`).
        Q3K,
        /// `d: f16 | dmin: f16 | scales: u8[12] | q: u8[128]`, 144 bytes: 8 sub-blocks of 32
        /// with a 6-bit scale and a 6-bit min each, 4-bit values.
        Q4K,
        /// `d: f16 | dmin: f16 | scales: u8[12] | qh: u8[32] | q: u8[128]`, 176 bytes: as Q4_K
        /// with a fifth bit per value in `qh`.
        Q5K,
        /// `ql: u8[128] | qh: u8[64] | scales: i8[16] | d: f16`, 210 bytes: 16 sub-blocks of 16
        /// with 8-bit signed scales, 6-bit values.
        Q6K,
    }
}

crate::registry::variant_list! {
    /// A block format elm can write (quantize f32 weights to): `--weights`, `elm quantize
    /// --format`. The other [`QFormat`]s are read and computed with as stored.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum WriteFormat("writable block format") {
        Q8_0,
        Q4_0,
        Q4_1,
    }
}

impl QFormat {
    /// Elements of one block: [`QK`], or [`QK_K`] for the K-quants.
    pub fn block_elems(self) -> usize {
        match self {
            QFormat::Q8_0 | QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0 | QFormat::Q5_1 => QK,
            QFormat::Q2K | QFormat::Q3K | QFormat::Q4K | QFormat::Q5K | QFormat::Q6K => QK_K,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            QFormat::Q8_0 => 34,
            QFormat::Q4_0 => 18,
            QFormat::Q4_1 => 20,
            QFormat::Q5_0 => 22,
            QFormat::Q5_1 => 24,
            QFormat::Q2K => 84,
            QFormat::Q3K => 110,
            QFormat::Q4K => 144,
            QFormat::Q5K => 176,
            QFormat::Q6K => 210,
        }
    }

    /// The lower-case name (`q4_k`), as `--weights` and the reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            QFormat::Q8_0 => "q8_0",
            QFormat::Q4_0 => "q4_0",
            QFormat::Q4_1 => "q4_1",
            QFormat::Q5_0 => "q5_0",
            QFormat::Q5_1 => "q5_1",
            QFormat::Q2K => "q2_k",
            QFormat::Q3K => "q3_k",
            QFormat::Q4K => "q4_k",
            QFormat::Q5K => "q5_k",
            QFormat::Q6K => "q6_k",
        }
    }

    /// ggml's type id (`enum ggml_type`).
    pub fn ggml_id(self) -> u32 {
        match self {
            QFormat::Q4_0 => 2,
            QFormat::Q4_1 => 3,
            QFormat::Q5_0 => 6,
            QFormat::Q5_1 => 7,
            QFormat::Q8_0 => 8,
            QFormat::Q2K => 10,
            QFormat::Q3K => 11,
            QFormat::Q4K => 12,
            QFormat::Q5K => 13,
            QFormat::Q6K => 14,
        }
    }

    /// The format of ggml type `id`, if it is one of ours.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        QFormat::ALL.into_iter().find(|f| f.ggml_id() == id)
    }

    /// The format a matrix first stored in `self` is written in when it must be quantized
    /// anew (an ELM module that replaces a layer of this format, say): itself where elm has an
    /// encoder, else Q8_0, which holds at least the bits of every readable format.
    pub fn write_format(self) -> WriteFormat {
        match self {
            QFormat::Q4_0 => WriteFormat::Q4_0,
            QFormat::Q4_1 => WriteFormat::Q4_1,
            QFormat::Q8_0
            | QFormat::Q5_0
            | QFormat::Q5_1
            | QFormat::Q2K
            | QFormat::Q3K
            | QFormat::Q4K
            | QFormat::Q5K
            | QFormat::Q6K => WriteFormat::Q8_0,
        }
    }
}

impl WriteFormat {
    pub fn name(self) -> &'static str {
        QFormat::from(self).name()
    }
}

impl From<WriteFormat> for QFormat {
    fn from(f: WriteFormat) -> Self {
        match f {
            WriteFormat::Q8_0 => QFormat::Q8_0,
            WriteFormat::Q4_0 => QFormat::Q4_0,
            WriteFormat::Q4_1 => QFormat::Q4_1,
        }
    }
}

impl std::str::FromStr for WriteFormat {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        WriteFormat::ALL
            .into_iter()
            .find(|f| f.name() == lower)
            .ok_or_else(|| {
                let read_only = QFormat::ALL.iter().any(|f| f.name() == lower);
                ElmError::config(
                    "weights",
                    format!(
                        "`{s}`: expected {}{}",
                        crate::registry::names_or::<WriteFormat>(),
                        if read_only {
                            " (elm reads and computes with this format as a file stores it, \
                             `--weights auto`, but does not quantize to it)"
                        } else {
                            ""
                        }
                    ),
                )
            })
    }
}

/// The little-endian f16 at byte `i` of `b`, widened to f32.
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The little-endian bf16 at byte `i` of `b`, widened to f32.
pub fn bf16_at(b: &[u8], i: usize) -> f32 {
    bf16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Writes `v` rounded to f16 as the little-endian f16 at byte `i` of `b` (a block scale).
fn put_f16(b: &mut [u8], i: usize, v: f32) {
    b[i..i + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block, from its 12 packed
/// bytes: bytes 0..4 hold scales 0..4 (low 6 bits) and the top 2 bits of scales 4..8; bytes
/// 4..8 the same for the mins; bytes 8..12 the low 4 bits of scales and mins 4..8.
pub fn k4_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The 16 signed 6-bit scales of a Q3_K block (already less their offset 32) from its 12
/// packed bytes: low 4 bits in bytes 0..8 (scale `i < 8` the low nibble of byte `i`, scale
/// `i ≥ 8` the high nibble of byte `i − 8`), high 2 bits in bytes 8..12 (byte `8 + i % 4`, bits
/// `2·(i / 4)`).
pub fn k3_scales(packed: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 {
            packed[i] & 0x0F
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// Decodes one block of `format` into its [`QFormat::block_elems`] values (`out` exactly that
/// long). Each value is computed in the order ggml and numpy compute it (`(d·sc)·q − dmin·m`,
/// …), never contracted into an FMA, so the result is bit-identical to theirs.
pub fn dequantize_block(format: QFormat, b: &[u8], out: &mut [f32]) {
    debug_assert_eq!(b.len(), format.block_bytes());
    debug_assert_eq!(out.len(), format.block_elems());
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
        QFormat::Q5_0 | QFormat::Q5_1 => {
            let q5_1 = format == QFormat::Q5_1;
            let d = f16_at(b, 0);
            let m = if q5_1 { f16_at(b, 2) } else { 0.0 };
            let at = if q5_1 { 4 } else { 2 };
            let qh = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
            for (j, &q) in b[at + 4..at + 20].iter().enumerate() {
                let lo = (q & 0x0F) as i32 | ((((qh >> j) & 1) as i32) << 4);
                let hi = (q >> 4) as i32 | ((((qh >> (j + 16)) & 1) as i32) << 4);
                if q5_1 {
                    out[j] = d * lo as f32 + m;
                    out[j + 16] = d * hi as f32 + m;
                } else {
                    out[j] = d * (lo - 16) as f32;
                    out[j + 16] = d * (hi - 16) as f32;
                }
            }
        }
        QFormat::Q2K => {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
            // Two halves of 128; in each, shift s ∈ {0,2,4,6} picks 32 values of 2 bits from
            // the half's 32 bytes, as two sub-blocks of 16 with their own scale and min.
            for (e, o) in out.iter_mut().enumerate() {
                let (half, s, l) = (e / 128, (e % 128) / 32, e % 32);
                let sc = scales[e / 16];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let q = (qs[half * 32 + l] >> (2 * s)) & 3;
                *o = dl * q as f32 - ml;
            }
        }
        QFormat::Q3K => {
            let (hmask, qs) = (&b[0..32], &b[32..96]);
            let scales = k3_scales(&b[96..108]);
            let d = f16_at(b, 108);
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
        QFormat::Q4K | QFormat::Q5K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = if format == QFormat::Q5K {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            // Sub-block j (of 32): the low (j even) or high (j odd) nibbles of bytes
            // 32·(j/2)..32·(j/2)+32; Q5_K's fifth bit is bit j of qh[l].
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
        QFormat::Q6K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = f16_at(b, 208);
            // Two halves of 128; in each, four groups of 32: group g takes the low (g < 2) or
            // high nibble of ql[64·half + 32·(g % 2) + l] and bits 2g..2g+2 of qh[32·half + l].
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
    }
}

/// Encodes one block of 32 values (ggml's `quantize_row_*_ref`).
pub fn quantize_block(format: WriteFormat, x: &[f32], out: &mut [u8]) {
    match format {
        WriteFormat::Q8_0 => {
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            put_f16(out, 0, d);
            for (o, &v) in out[2..34].iter_mut().zip(x) {
                *o = ((v * id).round() as i8) as u8;
            }
        }
        WriteFormat::Q4_0 => {
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
        WriteFormat::Q4_1 => {
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
