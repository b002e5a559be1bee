//! One type per GGUF block format: where each part of a block lies (named byte offsets, never a
//! bare number in a kernel), how many values and bytes a block holds, and its decoder (and, for
//! the formats elm writes, its encoder). [`super::QFormat`] dispatches to these types by an
//! exhaustive match, so a new format does not compile until every fact of it is given here.
//!
//! Layouts and the order of every f32 operation follow ggml's `dequantize_row_*` /
//! `quantize_row_*_ref` and the `gguf` Python package, whose output the tests hold these
//! decoders to bit for bit.

mod k_quants;
mod legacy;

pub use k_quants::{Q2K, Q3K, Q4K, Q5K, Q6K};
pub use legacy::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

use half::{bf16, f16};

/// Elements per block of the 32-element formats (and of the activation blocks the integer
/// kernels quantize to).
pub const QK: usize = 32;

/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;

/// What every block format states about itself (`super::format` maps each `QFormat` to its
/// type; the types do not name the list, so that the list is the one place that gathers them).
pub trait BlockFormat {
    /// Values one block holds: [`QK`] or [`QK_K`].
    const ELEMS: usize;
    /// Bytes of one block.
    const BYTES: usize;
    /// Values that share one scale and offset in the block's integer form: 32, or 16 for the
    /// K-quants whose scales cover 16 values.
    const INT_GROUP: usize;

    /// Decodes block `b` ([`Self::BYTES`] long) into `out` ([`Self::ELEMS`] long). Each value
    /// is computed in the order ggml and numpy compute it (`(d·sc)·q − dmin·m`, …), never
    /// contracted into an FMA, so the result is bit-identical to theirs.
    fn decode(b: &[u8], out: &mut [f32]);

    /// Block `b` as integers (what the portable integer kernel reads). The scales are formed
    /// as [`Self::decode`] forms them (`d·sc`, `dmin·m`), so `scale·q + offset` is its value up
    /// to the one rounding of the final sum.
    fn decode_int(b: &[u8], out: &mut IntBlock);
}

/// A block format elm can also write (with ggml's reference rounding).
pub trait WritableBlock: BlockFormat {
    /// Encodes 32 values `x` into block `out` ([`BlockFormat::BYTES`] long).
    fn encode(x: &[f32], out: &mut [u8]);
}

/// One weight block as integers: element `e` is `scale[g]·q[e] + offset[g]` with
/// `g = e / group`.
pub struct IntBlock {
    pub q: [i32; QK_K],
    pub scale: [f32; QK_K / 16],
    pub offset: [f32; QK_K / 16],
    pub group: usize,
}

impl Default for IntBlock {
    fn default() -> Self {
        IntBlock {
            q: [0; QK_K],
            scale: [0.0; QK_K / 16],
            offset: [0.0; QK_K / 16],
            group: QK,
        }
    }
}

impl IntBlock {
    /// Group `g`'s scale and offset.
    fn set(&mut self, g: usize, scale: f32, offset: f32) {
        self.scale[g] = scale;
        self.offset[g] = offset;
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
