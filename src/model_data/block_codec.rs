//! GGUF block (de)quantisation, written once: the block formats Q8_0 / Q4_0 / Q4_1 and their
//! f16 scales. Both the GGUF reader (`formats::gguf`, dequantizing a whole tensor) and the
//! in-memory quantized matrices ([`super::quant::QMatrix`], a row at a time) decode blocks
//! here, so a tensor read either way gives bit-identical values.

use half::{bf16, f16};

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

/// Decodes one block of `format` into its [`QK`] values (`x = d·q`, `d·(q − 8)` or
/// `d·q + m`: two roundings, never contracted into an FMA, as numpy and ggml do).
pub fn dequantize_block(format: QFormat, b: &[u8], out: &mut [f32; QK]) {
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
pub fn quantize_block(format: QFormat, x: &[f32], out: &mut [u8]) {
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
