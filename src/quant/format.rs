//! The lists of block formats: [`QFormat`] (what elm reads and computes with) and
//! [`WriteFormat`] (what it writes), their names and ggml ids, and the one dispatch from a
//! format to its block type in `super::blocks`. Both the GGUF reader (`formats::gguf`,
//! dequantizing a whole tensor) and the in-memory matrices ([`super::QMatrix`], a row at a
//! time) decode through [`dequantize_block`], so a tensor read either way gives bit-identical
//! values.
//!
//! Readable: the 32-element formats Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the 256-element K-quants
//! Q2_K … Q6_K. Writable: Q8_0, Q4_0 and Q4_1, with ggml's reference rounding.

use super::blocks::{
    BlockFormat, IntBlock, WritableBlock, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0,
};
use crate::error::{ElmError, Result};

crate::registry::variant_list! {
    /// A block format a [`super::QMatrix`] holds (and a GGUF tensor may be stored in).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum QFormat("block format") {
        /// [`super::blocks::Q8_0`], 8-bit.
        Q8_0,
        /// [`super::blocks::Q4_0`], 4-bit, symmetric.
        Q4_0,
        /// [`super::blocks::Q4_1`], 4-bit with a min.
        Q4_1,
        /// [`super::blocks::Q5_0`], 5-bit, symmetric.
        Q5_0,
        /// [`super::blocks::Q5_1`], 5-bit with a min.
        Q5_1,
        /// [`super::blocks::Q2K`], 2-bit super-blocks.
        Q2K,
        /// [`super::blocks::Q3K`], 3-bit super-blocks.
        Q3K,
        /// [`super::blocks::Q4K`], 4-bit super-blocks.
        Q4K,
        /// [`super::blocks::Q5K`], 5-bit super-blocks.
        Q5K,
        /// [`super::blocks::Q6K`], 6-bit super-blocks.
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
    /// Elements of one block: `QK`, or `QK_K` for the K-quants.
    pub fn block_elems(self) -> usize {
        match self {
            QFormat::Q8_0 => Q8_0::ELEMS,
            QFormat::Q4_0 => Q4_0::ELEMS,
            QFormat::Q4_1 => Q4_1::ELEMS,
            QFormat::Q5_0 => Q5_0::ELEMS,
            QFormat::Q5_1 => Q5_1::ELEMS,
            QFormat::Q2K => Q2K::ELEMS,
            QFormat::Q3K => Q3K::ELEMS,
            QFormat::Q4K => Q4K::ELEMS,
            QFormat::Q5K => Q5K::ELEMS,
            QFormat::Q6K => Q6K::ELEMS,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            QFormat::Q8_0 => Q8_0::BYTES,
            QFormat::Q4_0 => Q4_0::BYTES,
            QFormat::Q4_1 => Q4_1::BYTES,
            QFormat::Q5_0 => Q5_0::BYTES,
            QFormat::Q5_1 => Q5_1::BYTES,
            QFormat::Q2K => Q2K::BYTES,
            QFormat::Q3K => Q3K::BYTES,
            QFormat::Q4K => Q4K::BYTES,
            QFormat::Q5K => Q5K::BYTES,
            QFormat::Q6K => Q6K::BYTES,
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

/// Decodes one block of `format` into its [`QFormat::block_elems`] values (`out` exactly that
/// long), bit-identical to ggml's and numpy's decoders.
pub fn dequantize_block(format: QFormat, b: &[u8], out: &mut [f32]) {
    debug_assert_eq!(b.len(), format.block_bytes());
    debug_assert_eq!(out.len(), format.block_elems());
    match format {
        QFormat::Q8_0 => Q8_0::decode(b, out),
        QFormat::Q4_0 => Q4_0::decode(b, out),
        QFormat::Q4_1 => Q4_1::decode(b, out),
        QFormat::Q5_0 => Q5_0::decode(b, out),
        QFormat::Q5_1 => Q5_1::decode(b, out),
        QFormat::Q2K => Q2K::decode(b, out),
        QFormat::Q3K => Q3K::decode(b, out),
        QFormat::Q4K => Q4K::decode(b, out),
        QFormat::Q5K => Q5K::decode(b, out),
        QFormat::Q6K => Q6K::decode(b, out),
    }
}

/// Block `b` of `format` in its integer form (what the portable integer kernel reads).
pub fn decode_int_block(format: QFormat, b: &[u8], out: &mut IntBlock) {
    fn with<T: BlockFormat>(b: &[u8], out: &mut IntBlock) {
        T::decode_int(b, out);
        out.group = T::INT_GROUP;
    }
    match format {
        QFormat::Q8_0 => with::<Q8_0>(b, out),
        QFormat::Q4_0 => with::<Q4_0>(b, out),
        QFormat::Q4_1 => with::<Q4_1>(b, out),
        QFormat::Q5_0 => with::<Q5_0>(b, out),
        QFormat::Q5_1 => with::<Q5_1>(b, out),
        QFormat::Q2K => with::<Q2K>(b, out),
        QFormat::Q3K => with::<Q3K>(b, out),
        QFormat::Q4K => with::<Q4K>(b, out),
        QFormat::Q5K => with::<Q5K>(b, out),
        QFormat::Q6K => with::<Q6K>(b, out),
    }
}

/// Encodes one block of 32 values (ggml's `quantize_row_*_ref`).
pub fn quantize_block(format: WriteFormat, x: &[f32], out: &mut [u8]) {
    match format {
        WriteFormat::Q8_0 => Q8_0::encode(x, out),
        WriteFormat::Q4_0 => Q4_0::encode(x, out),
        WriteFormat::Q4_1 => Q4_1::encode(x, out),
    }
}
