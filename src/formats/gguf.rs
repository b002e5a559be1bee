//! GGUF v2/v3 reader (memory-mapped) and a small writer for tests and tools.
//!
//! File layout (little-endian):
//! `magic "GGUF" | version u32 | n_tensors u64 | n_kv u64 | n_kv × (key, type u32, value)
//!  | n_tensors × (name, n_dims u32, ne[n_dims] u64, ggml_type u32, offset u64) | pad | data`.
//! The data section starts at the first multiple of `general.alignment` (default 32)
//! after the tensor table; each tensor's `offset` is relative to it.
//!
//! **Dimension order.** GGUF lists dims fastest-varying first: `ne[0]` is the
//! contiguous axis. A PyTorch/HF/numpy `[rows, cols]` matrix is stored with
//! `ne = [cols, rows]`. [`TensorInfo::ne`] keeps the GGUF order; [`TensorInfo::shape`]
//! and every `ndarray` this module returns use the reversed (numpy/HF) order.
//!
//! Dequantization matches `gguf.quants.dequantize` of the PyPI `gguf` package
//! bit-for-bit (same f16→f32 conversion, same operation order, no FMA).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ndarray::{Array2, ArrayD, IxDyn};
use rayon::prelude::*;

use crate::error::{ElmError, Result};
use crate::quant::blocks::{bf16_at, f16_at};
use crate::quant::format::{dequantize_block, QFormat};

/// The GGUF magic, `"GGUF"` read as a little-endian u32.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Tensor element encodings (`ggml_type`): the float types, the block formats elm reads
/// ([`QFormat`]: ids, names and layouts live there), and [`GgmlType::Other`] for the rest, kept
/// so that an error can name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Block(QFormat),
    /// Any other ggml type id (Q8_1, Q8_K, IQ*, integer types, ...): readable metadata,
    /// unsupported data.
    Other(u32),
}

impl GgmlType {
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            30 => GgmlType::BF16,
            other => QFormat::from_ggml_id(other).map_or(GgmlType::Other(other), GgmlType::Block),
        }
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::BF16 => 30,
            GgmlType::Block(f) => f.ggml_id(),
            GgmlType::Other(id) => id,
        }
    }

    /// ggml's name for the type (as in `gguf.GGMLQuantizationType`).
    pub fn name(self) -> String {
        match self {
            GgmlType::F32 => "F32".into(),
            GgmlType::F16 => "F16".into(),
            GgmlType::BF16 => "BF16".into(),
            GgmlType::Block(f) => f.name().to_ascii_uppercase(),
            GgmlType::Other(id) => match id {
                9 => "Q8_1".into(),
                15 => "Q8_K".into(),
                24 => "I8".into(),
                25 => "I16".into(),
                26 => "I32".into(),
                27 => "I64".into(),
                28 => "F64".into(),
                16..=23 | 29 | 31..=39 => format!("ggml type {id} (an IQ or ternary format)"),
                _ => format!("ggml type {id}"),
            },
        }
    }

    /// `(elements per block, bytes per block)`, or `None` for unsupported types.
    pub fn block_layout(self) -> Option<(usize, usize)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 | GgmlType::BF16 => Some((1, 2)),
            GgmlType::Block(f) => Some((f.block_elems(), f.block_bytes())),
            GgmlType::Other(_) => None,
        }
    }
}

/// The tensor types elm reads, from the format registry ([`QFormat::ALL`]): "F32, F16, BF16,
/// Q8_0, ..." for messages.
pub fn supported_types() -> String {
    [GgmlType::F32, GgmlType::F16, GgmlType::BF16]
        .into_iter()
        .chain(QFormat::ALL.into_iter().map(GgmlType::Block))
        .map(GgmlType::name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The block format of a quantized ggml type (`None` for F32/F16/BF16 and unsupported ones).
pub fn qformat_of(t: GgmlType) -> Option<QFormat> {
    match t {
        GgmlType::Block(f) => Some(f),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Other(_) => None,
    }
}

/// A metadata value. Arrays hold values of a single element type: [`GgufValue::Array`] as
/// built in code (and for arrays of arrays), [`GgufValue::Packed`] as the reader keeps an array
/// of numbers, bools or strings, in its on-disk bytes. The two compare equal when their
/// elements do.
#[derive(Clone, Debug)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
    /// An array as the file stores it (see [`GgufArray`]).
    Packed(GgufArray),
}

/// An array of scalars or strings as the file stores it: its element type, its length and
/// its elements' bytes (little-endian scalars; strings as `u64 length | UTF-8 bytes`, checked
/// when read). Its memory is its size on disk: a value per element (32 bytes each, whatever
/// the element) would let a file of N bytes of `u8` array take 32·N bytes of memory.
#[derive(Clone, Debug)]
pub struct GgufArray {
    elem_type: u32,
    len: usize,
    bytes: Vec<u8>,
}

impl GgufArray {
    /// The element type id (`gguf.GGUFValueType`).
    pub fn elem_type(&self) -> u32 {
        self.elem_type
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The elements' bytes as stored.
    pub fn raw_bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// The elements as strings, borrowed; `None` unless the elements are strings.
    pub fn strs(&self) -> Option<impl Iterator<Item = &str> + '_> {
        (self.elem_type == 8).then(|| {
            let mut pos = 0usize;
            (0..self.len).map(move |_| {
                let n = u64::from_le_bytes(self.bytes[pos..pos + 8].try_into().unwrap()) as usize;
                let text = &self.bytes[pos + 8..pos + 8 + n];
                pos += 8 + n;
                // Checked to be UTF-8 when the array was read.
                std::str::from_utf8(text).unwrap_or_default()
            })
        })
    }
    /// The elements as values (strings copied).
    pub fn values(&self) -> impl Iterator<Item = GgufValue> + '_ {
        let mut cur = Cursor {
            bytes: &self.bytes,
            pos: 0,
            path: Path::new(""),
        };
        (0..self.len).map(move |_| {
            cur.value(self.elem_type, "array element", 0)
                .expect("checked when the array was read")
        })
    }
}

impl PartialEq for GgufValue {
    fn eq(&self, other: &Self) -> bool {
        use GgufValue as V;
        match (self, other) {
            (V::U8(a), V::U8(b)) => a == b,
            (V::I8(a), V::I8(b)) => a == b,
            (V::U16(a), V::U16(b)) => a == b,
            (V::I16(a), V::I16(b)) => a == b,
            (V::U32(a), V::U32(b)) => a == b,
            (V::I32(a), V::I32(b)) => a == b,
            (V::F32(a), V::F32(b)) => a == b,
            (V::Bool(a), V::Bool(b)) => a == b,
            (V::String(a), V::String(b)) => a == b,
            (V::U64(a), V::U64(b)) => a == b,
            (V::I64(a), V::I64(b)) => a == b,
            (V::F64(a), V::F64(b)) => a == b,
            (V::Array(a), V::Array(b)) => a == b,
            (V::Packed(a), V::Packed(b)) => a.values().eq(b.values()),
            (V::Packed(p), V::Array(a)) | (V::Array(a), V::Packed(p)) => {
                p.len() == a.len() && p.values().zip(a).all(|(x, y)| &x == y)
            }
            _ => false,
        }
    }
}

impl GgufValue {
    /// The GGUF value-type id (`gguf.GGUFValueType`).
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => 8,
            GgufValue::Array(_) | GgufValue::Packed(_) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }

    /// Any integer type as i128 (so u64 and i64 both fit); `None` otherwise.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v as i128,
            GgufValue::I8(v) => v as i128,
            GgufValue::U16(v) => v as i128,
            GgufValue::I16(v) => v as i128,
            GgufValue::U32(v) => v as i128,
            GgufValue::I32(v) => v as i128,
            GgufValue::U64(v) => v as i128,
            GgufValue::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// Any float or integer type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements of an array built in code or an array of arrays; `None` for a packed
    /// array as read from a file ([`GgufValue::as_packed`]) and for scalars.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A packed array as read from a file.
    pub fn as_packed(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Packed(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dims in GGUF order: `ne[0]` is the contiguous (fastest) axis.
    pub ne: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Dims in numpy/HF order (`ne` reversed): a `[rows, cols]` matrix has `ne = [cols, rows]`.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    /// `Π ne`, or `None` when the product overflows u64.
    fn checked_elements(&self) -> Option<u64> {
        self.ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Elements, `Π ne`; `u64::MAX` when the product overflows (which [`GgufFile::open`]
    /// refuses, so a tensor of an opened file never does).
    pub fn num_elements(&self) -> u64 {
        self.checked_elements().unwrap_or(u64::MAX)
    }

    /// Size of the tensor's data in bytes, or `None` if the type is unsupported or the size
    /// overflows u64 (refused by [`GgufFile::open`]).
    pub fn num_bytes(&self) -> Option<u64> {
        let (block, bytes) = self.ggml_type.block_layout()?;
        (self.checked_elements()? / block as u64).checked_mul(bytes as u64)
    }

    /// Why this tensor's dims and type cannot be read, or `None` when they can: the element
    /// count and byte size must fit in u64 and in this machine's `usize`, and a block format's
    /// rows (`ne[0]`) must be a whole number of blocks, as ggml requires (a row that ends
    /// inside a block would be read with its neighbour's values).
    pub fn layout_error(&self) -> Option<String> {
        let Some(n) = self.checked_elements() else {
            return Some(format!("dims {:?} overflow u64", self.ne));
        };
        if usize::try_from(n).is_err() {
            return Some(format!("{n} elements do not fit in memory addresses"));
        }
        let (block, _) = self.ggml_type.block_layout()?;
        let row = self.ne.first().copied().unwrap_or(1);
        if row % block as u64 != 0 {
            return Some(format!(
                "rows of {row} elements are not a whole number of {} blocks of {block}",
                self.ggml_type.name()
            ));
        }
        match self.num_bytes() {
            Some(b) if usize::try_from(b).is_ok() => None,
            _ => Some(format!(
                "{n} elements of {} overflow its byte size",
                self.ggml_type.name()
            )),
        }
    }
}

/// An opened, validated GGUF file. Tensor data stays memory-mapped until requested.
pub struct GgufFile {
    path: PathBuf,
    mmap: crate::io::MappedFile,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

/// Bounds-checked little-endian cursor over the mapped bytes; every read failure is a
/// `Format` error naming the file, so a truncated or corrupt file never panics.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, msg: impl Into<String>) -> ElmError {
        ElmError::format(self.path, msg)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.err(format!(
                "truncated: needs {n} bytes for {what} at offset {}, file has {}",
                self.pos,
                self.bytes.len()
            ))),
        }
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    /// Checks that `count` items of at least `min_size` bytes can fit in what is left,
    /// so a corrupt count cannot trigger a huge allocation.
    fn check_count(&self, count: u64, min_size: usize, what: &str) -> Result<usize> {
        let left = (self.bytes.len() - self.pos) as u64;
        if count.saturating_mul(min_size as u64) > left {
            return Err(self.err(format!(
                "truncated or corrupt {what}: count {count} cannot fit in the {left} bytes left"
            )));
        }
        Ok(count as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        let len = self.check_count(len, 1, what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.err(format!("{what} is not valid UTF-8")))
    }

    fn value(&mut self, type_id: u32, what: &str, depth: usize) -> Result<GgufValue> {
        Ok(match type_id {
            0 => GgufValue::U8(self.u8(what)?),
            1 => GgufValue::I8(self.u8(what)? as i8),
            2 => GgufValue::U16(self.u16(what)?),
            3 => GgufValue::I16(self.u16(what)? as i16),
            4 => GgufValue::U32(self.u32(what)?),
            5 => GgufValue::I32(self.u32(what)? as i32),
            6 => GgufValue::F32(f32::from_bits(self.u32(what)?)),
            7 => match self.u8(what)? {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.err(format!("{what}: bool byte {b} is not 0 or 1"))),
            },
            8 => GgufValue::String(self.string(what)?),
            9 => {
                // Nested arrays are legal GGUF but unused by any model we load; a
                // depth cap keeps corrupt files from recursing without bound.
                if depth > 4 {
                    return Err(self.err(format!("{what}: arrays nested too deeply")));
                }
                let elem_type = self.u32(what)?;
                let count = self.u64(what)?;
                let min_size = match elem_type {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8..=12 => 8,
                    t => return Err(self.err(format!("{what}: unknown array element type {t}"))),
                };
                let count = self.check_count(count, min_size, what)?;
                if elem_type == 9 {
                    // Arrays of arrays: each element is at least 12 bytes on disk, so a value
                    // per element keeps memory within a small multiple of the file.
                    let mut items = Vec::with_capacity(count);
                    for _ in 0..count {
                        items.push(self.value(elem_type, what, depth + 1)?);
                    }
                    return Ok(GgufValue::Array(items));
                }
                let start = self.pos;
                if elem_type == 8 {
                    for _ in 0..count {
                        let len = self.u64(what)?;
                        let len = self.check_count(len, 1, what)?;
                        let text = self.take(len, what)?;
                        if std::str::from_utf8(text).is_err() {
                            return Err(self.err(format!("{what}: a string is not valid UTF-8")));
                        }
                    }
                } else {
                    self.take(count * min_size, what)?;
                }
                GgufValue::Packed(GgufArray {
                    elem_type,
                    len: count,
                    bytes: self.bytes[start..self.pos].to_vec(),
                })
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(self.u64(what)? as i64),
            12 => GgufValue::F64(f64::from_bits(self.u64(what)?)),
            t => return Err(self.err(format!("{what}: unknown value type {t}"))),
        })
    }
}

impl GgufFile {
    /// Memory-maps and parses a GGUF v2/v3 file: header, metadata, tensor table.
    /// Checks every tensor's data range lies inside the file; no tensor data is read.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let mmap = crate::io::MappedFile::open(&path)?;

        let mut cur = Cursor {
            bytes: &mmap,
            pos: 0,
            path: &path,
        };
        let magic = cur.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(ElmError::format(
                &path,
                format!("wrong magic {magic:02x?}: not a GGUF file (expected \"GGUF\")"),
            ));
        }
        let version = cur.u32("version")?;
        if !(version == 2 || version == 3) {
            return Err(ElmError::format(
                &path,
                format!("unsupported GGUF version {version} (supported: 2, 3)"),
            ));
        }
        let n_tensors = cur.u64("tensor count")?;
        let n_kv = cur.u64("metadata count")?;
        // A key is >= 8 bytes (length) + 4 (type) + 1; a tensor entry >= 8+4+4+8.
        let n_kv = cur.check_count(n_kv, 13, "metadata count")?;
        let n_tensors = cur.check_count(n_tensors, 24, "tensor count")?;

        let mut metadata = Vec::with_capacity(n_kv);
        let mut metadata_index = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = cur.string(&format!("metadata key #{i}"))?;
            let type_id = cur.u32(&format!("type of metadata `{key}`"))?;
            let value = cur.value(type_id, &format!("metadata `{key}`"), 0)?;
            if metadata_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(ElmError::format(
                    &path,
                    format!("duplicate metadata key `{key}`"),
                ));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => match metadata[i].1.as_int() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
                _ => {
                    return Err(ElmError::format(
                        &path,
                        format!(
                            "general.alignment {:?} is not a positive power of two",
                            metadata[i].1
                        ),
                    ))
                }
            },
        };

        let mut tensors = Vec::with_capacity(n_tensors);
        let mut tensor_index = HashMap::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = cur.string(&format!("tensor name #{i}"))?;
            let n_dims = cur.u32(&format!("n_dims of tensor `{name}`"))?;
            if n_dims == 0 || n_dims > 4 {
                return Err(ElmError::format(
                    &path,
                    format!("tensor `{name}` has {n_dims} dims (GGUF allows 1..=4)"),
                ));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(cur.u64(&format!("dims of tensor `{name}`"))?);
            }
            let ggml_type = GgmlType::from_id(cur.u32(&format!("type of tensor `{name}`"))?);
            let offset = cur.u64(&format!("offset of tensor `{name}`"))?;
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(ElmError::format(
                    &path,
                    format!("duplicate tensor `{name}`"),
                ));
            }
            tensors.push(TensorInfo {
                name,
                ne,
                ggml_type,
                offset,
            });
        }
        let data_start = (cur.pos as u64).div_ceil(alignment) * alignment;
        let file_len = mmap.len() as u64;

        for t in &tensors {
            if let Some(why) = t.layout_error() {
                return Err(ElmError::format(
                    &path,
                    format!("tensor `{}`: {why}", t.name),
                ));
            }
            if t.offset % alignment != 0 {
                return Err(ElmError::format(
                    &path,
                    format!(
                        "tensor `{}`: offset {} not aligned to {alignment}",
                        t.name, t.offset
                    ),
                ));
            }
            // Unsupported types are reported when their data is requested, not here, so
            // that metadata of any GGUF can still be inspected.
            if let Some(size) = t.num_bytes() {
                let end = data_start
                    .checked_add(t.offset)
                    .and_then(|s| s.checked_add(size));
                if end.is_none_or(|end| end > file_len) {
                    return Err(ElmError::format(
                        &path,
                        format!(
                            "truncated: tensor `{}` needs bytes {}..{} but the file has {file_len}",
                            t.name,
                            data_start.saturating_add(t.offset),
                            data_start.saturating_add(t.offset).saturating_add(size)
                        ),
                    ));
                }
            }
        }

        let file = GgufFile {
            path,
            mmap,
            version,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            alignment,
            data_start,
        };
        // The header and metadata were copied out while parsing (a 262k-token vocabulary is
        // megabytes of strings): their pages need not stay in the process's resident set.
        file.mmap.release(0, file.data_start as usize);
        Ok(file)
    }

    /// Takes every page of the file out of the resident set (see
    /// [`crate::io::MappedFile::release`]): what a loader calls after its last tensor.
    pub fn release_all(&self) {
        self.mmap.release_all();
    }

    /// Frees the parsed metadata (a 262k-token vocabulary is tens of megabytes of strings)
    /// once the caller has read what it needs: afterwards [`Self::metadata`] is empty and every
    /// lookup finds nothing. The tensor table stays.
    pub fn release_metadata(&mut self) {
        self.metadata = Vec::new();
        self.metadata_index = HashMap::new();
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn version(&self) -> u32 {
        self.version
    }
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// Absolute byte offset of the data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&GgufValue> {
        self.get(key)
            .ok_or_else(|| ElmError::format(&self.path, format!("missing metadata key `{key}`")))
    }

    fn wrong_type(&self, key: &str, want: &str, got: &GgufValue) -> ElmError {
        ElmError::format(
            &self.path,
            format!(
                "metadata `{key}` should be {want}, found value type {}",
                got.type_id()
            ),
        )
    }

    /// A non-negative integer value (any integer type).
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        let v = self.require(key)?;
        match v.as_int() {
            Some(i) if i >= 0 && i <= usize::MAX as i128 => Ok(i as usize),
            Some(i) => Err(ElmError::format(
                &self.path,
                format!("metadata `{key}` = {i} is out of range"),
            )),
            None => Err(self.wrong_type(key, "an integer", v)),
        }
    }

    /// A float value (f32/f64, or an integer).
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64()
            .ok_or_else(|| self.wrong_type(key, "a number", v))
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str()
            .ok_or_else(|| self.wrong_type(key, "a string", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| self.wrong_type(key, "a bool", v))
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`), borrowed from the file's metadata.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let v = self.require(key)?;
        match v {
            // An empty array has no element to be of the wrong type (writers store it as u8).
            GgufValue::Packed(a) if a.is_empty() => Ok(Vec::new()),
            GgufValue::Packed(a) => a
                .strs()
                .map(Iterator::collect)
                .ok_or_else(|| self.wrong_elements(key, "an array of strings", a)),
            GgufValue::Array(items) => items
                .iter()
                .map(|x| {
                    x.as_str()
                        .ok_or_else(|| self.wrong_type(key, "an array of strings", x))
                })
                .collect(),
            _ => Err(self.wrong_type(key, "an array", v)),
        }
    }

    /// An array of integers (e.g. `tokenizer.ggml.token_type`).
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i64>> {
        self.get_array_of(key, "an array of integers", |x| {
            x.as_int().map(|i| i as i64)
        })
    }

    /// An array of numbers as f32 (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.get_array_of(key, "an array of numbers", |x| x.as_f64().map(|v| v as f32))
    }

    fn wrong_elements(&self, key: &str, want: &str, a: &GgufArray) -> ElmError {
        ElmError::format(
            &self.path,
            format!(
                "metadata `{key}` should be {want}, found an array of value type {}",
                a.elem_type()
            ),
        )
    }

    /// The array at `key` with every element read by `item`; an element it refuses is a
    /// type error saying the array should be `what`.
    fn get_array_of<T>(
        &self,
        key: &str,
        what: &str,
        item: impl Fn(&GgufValue) -> Option<T>,
    ) -> Result<Vec<T>> {
        let v = self.require(key)?;
        match v {
            GgufValue::Packed(a) => a
                .values()
                .map(|x| item(&x).ok_or_else(|| self.wrong_elements(key, what, a)))
                .collect(),
            GgufValue::Array(items) => items
                .iter()
                .map(|x| item(x).ok_or_else(|| self.wrong_type(key, what, x)))
                .collect(),
            _ => Err(self.wrong_type(key, "an array", v)),
        }
    }

    /// Tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    fn info_or_missing(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor_info(name)
            .ok_or_else(|| ElmError::tensor(name, format!("missing from {}", self.path.display())))
    }

    /// Raw (still quantized) bytes of a tensor.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.info_or_missing(name)?;
        let size = info.num_bytes().ok_or_else(|| self.unsupported(info))?;
        let start = (self.data_start + info.offset) as usize;
        Ok(&self.mmap[start..start + size as usize])
    }

    /// Every tensor as writable data (name, shape, type, raw bytes), in file order: what
    /// [`write_gguf`] takes to rewrite the file, e.g. with edited metadata.
    pub fn tensor_data(&self) -> Result<Vec<GgufTensorData>> {
        self.tensors()
            .iter()
            .map(|t| {
                Ok(GgufTensorData {
                    name: t.name.clone(),
                    shape: t.shape(),
                    ggml_type: t.ggml_type,
                    data: self.tensor_bytes(&t.name)?.to_vec(),
                })
            })
            .collect()
    }

    fn unsupported(&self, info: &TensorInfo) -> ElmError {
        ElmError::Unsupported(format!(
            "tensor `{}` in {} has type {} (supported: {})",
            info.name,
            self.path.display(),
            info.ggml_type.name(),
            supported_types()
        ))
    }

    /// Dequantizes a tensor to f32 in numpy/HF dim order (`ne` reversed).
    pub fn tensor_f32(&self, name: &str) -> Result<ArrayD<f32>> {
        let info = self.info_or_missing(name)?;
        let bytes = self.tensor_bytes(name)?;
        let data = dequantize(info.ggml_type, bytes, info.num_elements() as usize)
            .map_err(|_| self.unsupported(info))?;
        Ok(ArrayD::from_shape_vec(IxDyn(&info.shape()), data).expect("size checked at open"))
    }

    /// [`Self::tensor_f32`] for a loader that reads each tensor once: the file's pages are
    /// released as each slice of the tensor is converted, so a large tensor (an embedding of
    /// 170 MB in Q8_0) is never resident twice, as file and as f32 (issue 42).
    pub fn take_tensor_f32(&self, name: &str) -> Result<ArrayD<f32>> {
        let info = self.info_or_missing(name)?;
        let (block, block_bytes) = info
            .ggml_type
            .block_layout()
            .ok_or_else(|| self.unsupported(info))?;
        let mut data = vec![0f32; info.num_elements() as usize];
        let elems_per_slice = crate::io::mapped::RELEASE_SLICE_BYTES / block_bytes * block;
        let mut dst = data.chunks_mut(elems_per_slice.max(block));
        self.mmap
            .convert_releasing(self.tensor_bytes(name)?, block_bytes, |_, src| {
                let out = dst.next().expect("as many slices of elements as of bytes");
                dequantize_into(info.ggml_type, src, out).map_err(|_| self.unsupported(info))
            })?;
        Ok(ArrayD::from_shape_vec(IxDyn(&info.shape()), data).expect("size checked at open"))
    }

    /// Every tensor's every element decoded and checked finite, as llama.cpp's
    /// `--check-tensors`: a NaN or infinite scale inside a quantized block (which a loader that
    /// keeps blocks never decodes up front) is found before it turns logits into NaN. Slice by
    /// slice, with the file's pages released behind, so memory stays at one slice of f32.
    /// Errors name the file, the tensor and the first bad element (row-major index).
    pub fn check_tensors(&self) -> Result<()> {
        for info in &self.tensors {
            let (block, block_bytes) = info
                .ggml_type
                .block_layout()
                .ok_or_else(|| self.unsupported(info))?;
            let mut scratch = Vec::new();
            let mut first = 0usize;
            self.mmap.convert_releasing(
                self.tensor_bytes(&info.name)?,
                block_bytes,
                |_, src| {
                    scratch.resize(src.len() / block_bytes * block, 0.0);
                    dequantize_into(info.ggml_type, src, &mut scratch)
                        .map_err(|_| self.unsupported(info))?;
                    if let Some(i) = scratch.iter().position(|v| !v.is_finite()) {
                        return Err(ElmError::tensor(
                            &info.name,
                            format!(
                                "element {} is {} (non-finite weights; --check-tensors)",
                                first + i,
                                scratch[i]
                            ),
                        )
                        .in_file(&self.path));
                    }
                    first += scratch.len();
                    Ok(())
                },
            )?;
        }
        Ok(())
    }

    /// The raw bytes of a tensor, copied out slice by slice with each slice's pages released
    /// once copied (see [`Self::take_tensor_f32`]).
    pub fn take_tensor_bytes(&self, name: &str) -> Result<Vec<u8>> {
        let bytes = self.tensor_bytes(name)?;
        let mut out = Vec::with_capacity(bytes.len());
        self.mmap.convert_releasing(bytes, 1, |_, src| {
            out.extend_from_slice(src);
            Ok(())
        })?;
        Ok(out)
    }

    /// A 2-D tensor as `[rows, cols]` = `[ne[1], ne[0]]`.
    pub fn tensor_f32_2d(&self, name: &str) -> Result<Array2<f32>> {
        let info = self.info_or_missing(name)?;
        if info.ne.len() != 2 {
            return Err(ElmError::tensor(
                name,
                format!("expected 2 dims, found shape {:?}", info.shape()),
            ));
        }
        Ok(self
            .tensor_f32(name)?
            .into_dimensionality()
            .expect("2 dims checked"))
    }
}

/// Blocks dequantized per rayon task: large enough to amortise scheduling.
const BLOCKS_PER_TASK: usize = 1024;

/// Dequantizes `n` elements of type `ty` from `bytes` (exactly `n / block * block_bytes`
/// long). Errors with `Unsupported` for types without a dequantizer.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; n];
    dequantize_into(ty, bytes, &mut out)?;
    Ok(out)
}

/// [`dequantize`] into `out` (`out.len()` elements from exactly as many blocks of `bytes`).
fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let (block, block_bytes) = ty
        .block_layout()
        .ok_or_else(|| ElmError::Unsupported(format!("dequantize {}", ty.name())))?;
    let n = out.len();
    if !n.is_multiple_of(block) || bytes.len() != n / block * block_bytes {
        return Err(ElmError::InvalidArgument(format!(
            "dequantize {}: {} bytes for {n} elements",
            ty.name(),
            bytes.len()
        )));
    }
    let elems_per_task = block * BLOCKS_PER_TASK;
    out.par_chunks_mut(elems_per_task)
        .zip(bytes.par_chunks(block_bytes * BLOCKS_PER_TASK))
        .for_each(|(dst, src)| match ty {
            GgmlType::F32 => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes(s.try_into().unwrap());
                }
            }
            GgmlType::F16 => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = f16_at(s, 0);
                }
            }
            GgmlType::BF16 => {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = bf16_at(s, 0);
                }
            }
            GgmlType::Block(format) => {
                for (d, s) in dst
                    .chunks_exact_mut(block)
                    .zip(src.chunks_exact(block_bytes))
                {
                    dequantize_block(format, s, d);
                }
            }
            GgmlType::Other(_) => unreachable!("rejected above"),
        });
    Ok(())
}

// ---------------------------------------------------------------------------------
// Writer (for tests, fixtures and tools; writes GGUF v3).
// ---------------------------------------------------------------------------------

/// A tensor to write: name, dims in **numpy/HF order** (reversed into `ne` on disk),
/// type, and its raw encoded bytes.
#[derive(Clone, Debug)]
pub struct GgufTensorData {
    pub name: String,
    pub shape: Vec<usize>,
    pub ggml_type: GgmlType,
    pub data: Vec<u8>,
}

impl GgufTensorData {
    /// An F32 tensor from values in row-major (numpy) order.
    pub fn f32(name: &str, shape: &[usize], values: &[f32]) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            values.len(),
            "tensor {name}"
        );
        GgufTensorData {
            name: name.to_string(),
            shape: shape.to_vec(),
            ggml_type: GgmlType::F32,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => write_str(out, s),
        GgufValue::Packed(a) => {
            out.extend_from_slice(&a.elem_type.to_le_bytes());
            out.extend_from_slice(&(a.len as u64).to_le_bytes());
            out.extend_from_slice(&a.bytes);
        }
        GgufValue::Array(items) => {
            // An empty array is written as an array of u8.
            let elem = items.first().map_or(0, |x| x.type_id());
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for x in items {
                write_value(out, x);
            }
        }
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Serializes a GGUF v3 file to bytes with the given alignment (`general.alignment`
/// is written into the metadata only if the caller includes it).
pub fn gguf_to_bytes(
    metadata: &[(String, GgufValue)],
    tensors: &[GgufTensorData],
    alignment: u64,
) -> Vec<u8> {
    let align = |x: u64| x.div_ceil(alignment) * alignment;
    let mut out = Vec::new();
    out.extend_from_slice(&GGUF_MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        write_str(&mut out, k);
        out.extend_from_slice(&v.type_id().to_le_bytes());
        write_value(&mut out, v);
    }
    let mut offset = 0u64;
    for t in tensors {
        write_str(&mut out, &t.name);
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset = align(offset + t.data.len() as u64);
    }
    out.resize(align(out.len() as u64) as usize, 0);
    for t in tensors {
        out.extend_from_slice(&t.data);
        out.resize(align(out.len() as u64) as usize, 0);
    }
    out
}

/// Writes a GGUF v3 file atomically (temp file in the same directory, then rename).
pub fn write_gguf(
    path: impl AsRef<Path>,
    metadata: &[(String, GgufValue)],
    tensors: &[GgufTensorData],
) -> Result<()> {
    let path = path.as_ref();
    // Refuse what the reader would refuse, before anything is written.
    for t in tensors {
        let info = TensorInfo {
            name: t.name.clone(),
            ne: t.shape.iter().rev().map(|&d| d as u64).collect(),
            ggml_type: t.ggml_type,
            offset: 0,
        };
        let why = if t.shape.is_empty() || t.shape.len() > 4 {
            Some(format!("{} dims (GGUF allows 1..=4)", t.shape.len()))
        } else {
            info.layout_error().or_else(|| match info.num_bytes() {
                Some(b) if b != t.data.len() as u64 => Some(format!(
                    "{} bytes of data, its dims and type need {b}",
                    t.data.len()
                )),
                _ => None,
            })
        };
        if let Some(why) = why {
            return Err(ElmError::format(
                path,
                format!("tensor `{}`: {why}", t.name),
            ));
        }
    }
    let alignment = metadata
        .iter()
        .find(|(k, _)| k == "general.alignment")
        .and_then(|(_, v)| v.as_int())
        .map_or(DEFAULT_ALIGNMENT, |a| a as u64);
    let bytes = gguf_to_bytes(metadata, tensors, alignment);
    crate::io::write_atomic(path, &bytes)
}

/// Convenience: `(key, value)` pair for [`write_gguf`] metadata.
pub fn kv(key: &str, value: GgufValue) -> (String, GgufValue) {
    (key.to_string(), value)
}
