//! A quantized matrix as plain data: [`QMatrix`] (GGUF blocks of any [`QFormat`], K-quants
//! included, kept as they are in memory), [`Linear`] (a matrix in f32 or blocks) and the
//! storage a user asks for ([`WeightStorage`]). The blocks and whole decoders built from them
//! are `model_data::quant_weights`.
//!
//! Batch-1 decode is bound by the bytes of weights read per token, so the weights stay in
//! their 2.6–8.5-bit block formats; the integer products on them are in [`super::matmul`].
//! Rows whose length is not a multiple of the block are zero-padded to whole blocks (only elm's
//! own 32-element writers do that: a GGUF stores whole blocks).
//!
//! The GGUF reader fills a [`QMatrix`] from a file's bytes, [`QMatrix::quantize`] makes one
//! from f32 weights; the block views the model's kernels run on (`model::block_view`) borrow
//! these types.

use std::borrow::Cow;

use ndarray::{Array2, ArrayView2};

use super::blocks::{QK, QK_K};
use super::format::{dequantize_block, quantize_block, QFormat, WriteFormat};
use super::kernel::{detected_kernel, Kernel};
use super::tiles::{self, Layout, TILE_ROWS};
use crate::error::{ElmError, Result};

/// How the inference path stores a model's matrices (`--weights`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightStorage {
    /// Dequantized to f32 at load (the reference path).
    F32,
    /// Each matrix in its file's type: quantized blocks stay quantized, f32/f16/bf16 go to f32.
    Auto,
    /// Every matrix in this block format (requantized or quantized on the fly if needed).
    Quant(WriteFormat),
}

impl WeightStorage {
    /// The block format every matrix is requantized to, `None` for f32 and for `auto` (which
    /// keeps each matrix's own).
    pub fn forced_format(self) -> Option<WriteFormat> {
        match self {
            WeightStorage::Quant(format) => Some(format),
            WeightStorage::F32 | WeightStorage::Auto => None,
        }
    }
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
                    format!(
                        "`{s}`: expected f32, auto or {}",
                        crate::registry::names_or::<WriteFormat>()
                    ),
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

/// A `[rows, cols]` matrix (PyTorch `[out, in]` layout) stored as quantized blocks; each row
/// holds `cols.div_ceil(format.block_elems())` blocks (the last one zero-padded). The blocks
/// are kept in GGUF order ([`Layout::Rows`]) or, when the VNNI kernel runs the products and the
/// format has one, in the tiled layout of `super::tiles` ([`Layout::Tiles`]), chosen when the
/// matrix is made; both hold the same bytes, and [`QMatrix::row`] reads a row's GGUF blocks
/// from either.
#[derive(Clone, Debug)]
pub struct QMatrix {
    format: QFormat,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    layout: Layout,
}

/// Equal when they hold the same values: the layout is how they are kept, not what they are.
impl PartialEq for QMatrix {
    fn eq(&self, other: &Self) -> bool {
        (self.format, self.rows, self.cols) == (other.format, other.rows, other.cols)
            && if self.layout == other.layout {
                self.data == other.data
            } else {
                self.gguf_blocks() == other.gguf_blocks()
            }
    }
}

impl QMatrix {
    /// Wraps raw blocks (e.g. a GGUF tensor's bytes, rows in file order).
    pub fn from_blocks(format: QFormat, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self> {
        // Padding is only ever written for 32-element blocks (elm's writers); a super-block
        // format must cover its rows exactly, as GGUF stores them.
        if format.block_elems() > QK && !cols.is_multiple_of(format.block_elems()) {
            return Err(ElmError::shape(
                "QMatrix::from_blocks",
                format!(
                    "a {} matrix needs rows of whole {}-element blocks, not {cols} columns",
                    format.name(),
                    format.block_elems()
                ),
            ));
        }
        let want = rows * cols.div_ceil(format.block_elems()) * format.block_bytes();
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
            layout: Layout::Rows,
        }
        .with_layout(Self::preferred_layout(format, rows)))
    }

    /// The layout a matrix gets when it is made: tiles for the VNNI kernel where the format and
    /// row count allow them (`ELM_QKERNEL=avx2|portable` keeps GGUF rows).
    fn preferred_layout(format: QFormat, rows: usize) -> Layout {
        tiles::preferred(format, rows, detected_kernel() == Kernel::Avx512Vnni)
    }

    /// The same matrix with its blocks in `layout` (unchanged where `layout` is
    /// [`Layout::Tiles`] and the format or row count has none). Rearranges in place, one
    /// group of rows at a time, so it needs no second copy of the matrix.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        let to = match layout {
            Layout::Tiles => tiles::preferred(self.format, self.rows, true),
            Layout::Rows => Layout::Rows,
        };
        if to == self.layout {
            return self;
        }
        let (nb, rb) = (self.row_blocks(), self.row_bytes());
        let mut scratch = vec![0u8; TILE_ROWS * rb];
        for group in self.data.chunks_exact_mut(TILE_ROWS * rb) {
            scratch.copy_from_slice(group);
            match to {
                Layout::Tiles => tiles::pack_group(self.format, &scratch, nb, group),
                Layout::Rows => {
                    for (r, row) in group.chunks_exact_mut(rb).enumerate() {
                        tiles::unpack_row(self.format, &scratch, r, nb, row);
                    }
                }
            }
        }
        self.layout = to;
        self
    }

    /// Quantizes f32 weights `[rows, cols]` with ggml's reference rounding.
    pub fn quantize(w: ArrayView2<f32>, format: WriteFormat) -> Self {
        let (rows, cols) = w.dim();
        let nb = cols.div_ceil(QK);
        let bb = QFormat::from(format).block_bytes();
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
        let format = QFormat::from(format);
        QMatrix {
            format,
            rows,
            cols,
            data,
            layout: Layout::Rows,
        }
        .with_layout(Self::preferred_layout(format, rows))
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
        self.cols.div_ceil(self.format.block_elems())
    }
    /// Columns including the zero padding of the last block: what the kernels' activation rows
    /// (32-element blocks) must cover.
    pub fn padded_cols(&self) -> usize {
        self.row_blocks() * self.format.block_elems()
    }
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_blocks() * self.format.block_bytes()
    }
    /// Bytes held (what a matrix product reads).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
    /// How the blocks are kept.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// Rows a split of the products should keep together: a tile's, or one.
    pub fn row_alignment(&self) -> usize {
        match self.layout {
            Layout::Tiles => TILE_ROWS,
            Layout::Rows => 1,
        }
    }
    /// The blocks as kept, in [`QMatrix::layout`] (what the integer kernels read).
    pub fn stored(&self) -> &[u8] {
        &self.data
    }
    /// The blocks in GGUF order, row-major (what a GGUF file stores).
    pub fn gguf_blocks(&self) -> Cow<'_, [u8]> {
        match self.layout {
            Layout::Rows => Cow::Borrowed(&self.data),
            Layout::Tiles => Cow::Owned(self.clone().with_layout(Layout::Rows).data),
        }
    }
    /// The GGUF blocks of row `r` (borrowed in the GGUF layout, unpacked from tiles).
    pub fn row(&self, r: usize) -> Cow<'_, [u8]> {
        let rb = self.row_bytes();
        match self.layout {
            Layout::Rows => Cow::Borrowed(&self.data[r * rb..(r + 1) * rb]),
            Layout::Tiles => {
                let (group, nb) = (r / TILE_ROWS, self.row_blocks());
                let tiles = &self.data[group * TILE_ROWS * rb..(group + 1) * TILE_ROWS * rb];
                let mut out = vec![0u8; rb];
                tiles::unpack_row(self.format, tiles, r % TILE_ROWS, nb, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// Row `r` as f32 into `out` (`cols` long).
    pub fn dequantize_row_into(&self, r: usize, out: &mut [f32]) {
        let (be, bb) = (self.format.block_elems(), self.format.block_bytes());
        let mut block = [0f32; QK_K];
        let block = &mut block[..be];
        for (bi, src) in self.row(r).chunks_exact(bb).enumerate() {
            dequantize_block(self.format, src, block);
            let lo = bi * be;
            let hi = (lo + be).min(self.cols);
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
            data.extend_from_slice(&self.row(r));
        }
        QMatrix::from_blocks(self.format, order.len(), self.cols, data)
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
    pub fn from_f32(w: &Array2<f32>, format: Option<WriteFormat>) -> Self {
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

/// A weight that lends itself as a [`LinearRef`]: an f32 matrix or a [`Linear`] (what a block
/// generic over its storage, `model_data::Block<W>`, needs of `W` to be run by the kernels).
pub trait AsLinearRef {
    fn linear_ref(&self) -> LinearRef<'_>;
}

impl AsLinearRef for Array2<f32> {
    fn linear_ref(&self) -> LinearRef<'_> {
        LinearRef::F32(self.view())
    }
}

impl AsLinearRef for Linear {
    fn linear_ref(&self) -> LinearRef<'_> {
        self.as_ref()
    }
}

impl<'a> LinearRef<'a> {
    /// The memory a product with this weight streams (`None`: an f32 view that is not
    /// one contiguous slice).
    pub fn memory(&self) -> Option<&'a [u8]> {
        match self {
            LinearRef::F32(a) => a.to_slice().map(crate::heap::f32_bytes),
            LinearRef::Quant(q) => Some(q.stored()),
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
