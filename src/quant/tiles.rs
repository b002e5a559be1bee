//! The second row layout of a [`super::QMatrix`]: rows in groups of [`TILE_ROWS`],
//! each group's blocks interleaved so that one 256-bit load holds four weight codes of each of
//! eight rows, and the eight rows' scales sit side by side.
//!
//! Why: in the GGUF layout a batch-1 product costs about ten instructions per 32-value block
//! (load, unpack, one `vpdpbusd`, a horizontal reduction, a scalar scale conversion and an
//! FMA), which keeps decode compute-bound at ~0.6 of the read bandwidth. With eight rows in
//! the eight i32 lanes of a register, one `vpdpbusd` against four broadcast activation bytes
//! advances all eight rows, no horizontal reduction is needed, and one F16C conversion and one
//! FMA scale eight blocks: about three instructions per block (llama.cpp repacks its Q4_0 the
//! same way at load; this layout is elm's own).
//!
//! A tile (rows `8g..8g+8`, block `b`) holds, in order:
//! - `d[8]`: the eight rows' f16 scales;
//! - `m[8]`: their f16 minimums (Q4_1, Q5_1);
//! - `h[8]`: Q5's fifth bits as one u32 per row, re-ordered so that bit `8i + k` is the fifth
//!   bit of element `4k + i` (then one 32-bit shift and a mask put the bits of group `k` at bit
//!   4 of every byte);
//! - the codes, as groups `k`: for Q8_0 eight groups (values `4k..4k+4`, stored as `q + 128`
//!   so they are unsigned as `vpdpbusd` wants: the `128·Σx` this adds is taken off with the
//!   activation block's sum); for the nibble formats four groups of the block's bytes
//!   `4k..4k+4` (low nibbles: values `4k..`, high nibbles: values `16 + 4k..`). Group `k` is
//!   32 bytes: row `r`'s four bytes at `4r`.
//!
//! The K-quants Q4_K and Q6_K have tiles of their own: one 256-value super-block of eight
//! rows, its parts laid out so that the same loads serve all eight rows (a pure permutation of
//! the blocks' bytes, [`k_quant_position`]):
//! - Q4_K: `d[8]`, `dmin[8]`, the 12 packed scale bytes as twelve runs of eight (byte `j` of
//!   the eight rows side by side, so one 8-byte load and a widening give sub-block scales of all
//!   eight rows), then the codes as groups `(c, k)`: bytes `4k..4k+4` of chunk `c` (the
//!   low nibbles are sub-block `2c`'s values `4k..`, the high ones sub-block `2c + 1`'s);
//! - Q6_K: `d[8]`, the 16 i8 scales as sixteen runs of eight, the low four bits `ql` as
//!   groups `(h, q, k)` (bytes `64h + 32q + 4k..`), the high two bits `qh` as groups `(h, k)`.
//!
//! A tile has exactly the bytes of the eight blocks it holds, so a matrix takes the same
//! memory in either layout, and [`unpack_row`] gives back a row's GGUF bytes exactly.

use super::blocks::{Q4K, Q4_0, Q4_1, Q5_0, Q5_1, Q6K, Q8_0, QK};
use super::format::QFormat;

/// Weight rows per tile (the i32 lanes of a 256-bit register).
pub const TILE_ROWS: usize = 8;

/// How a [`super::QMatrix`] stores its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// GGUF order: row after row, each row its blocks.
    Rows,
    /// Groups of [`TILE_ROWS`] rows, each group's blocks as tiles (this module's layout).
    Tiles,
}

/// Where a tile's parts start, for the formats that have a tiled layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileGeometry {
    /// Offset of `m[8]` (Q4_1, Q5_1; Q4_K's `dmin[8]`).
    pub min_at: Option<usize>,
    /// Offset of `h[8]` for Q5, of the `qh` groups for Q6_K.
    pub high_at: Option<usize>,
    /// Offset of the K-quants' sub-block scales (runs of eight, one per scale byte).
    pub scales_at: Option<usize>,
    /// Offset of the code groups.
    pub codes_at: usize,
    /// Bytes of a tile: `TILE_ROWS` blocks.
    pub bytes: usize,
}

/// The tile geometry of `format`, `None` where it has no tiled layout (Q2_K, Q3_K and Q5_K,
/// which the models here do not use).
pub fn geometry(format: QFormat) -> Option<TileGeometry> {
    let scales = 2 * TILE_ROWS;
    let bytes = TILE_ROWS * format.block_bytes();
    let (min_at, high_at) = match format {
        QFormat::Q8_0 | QFormat::Q4_0 => (None, None),
        QFormat::Q4_1 => (Some(scales), None),
        QFormat::Q5_0 => (None, Some(scales)),
        QFormat::Q5_1 => (Some(scales), Some(2 * scales)),
        QFormat::Q4K => {
            return Some(TileGeometry {
                min_at: Some(scales),
                high_at: None,
                scales_at: Some(2 * scales),
                codes_at: 2 * scales + (Q4K::CODES - Q4K::SCALES) * TILE_ROWS,
                bytes,
            })
        }
        QFormat::Q6K => {
            let codes_at = scales + (Q6K::D - Q6K::SCALES) * TILE_ROWS;
            return Some(TileGeometry {
                min_at: None,
                high_at: Some(codes_at + (Q6K::HIGH - Q6K::LOW) * TILE_ROWS),
                scales_at: Some(scales),
                codes_at,
                bytes,
            });
        }
        QFormat::Q2K | QFormat::Q3K | QFormat::Q5K => return None,
    };
    let codes_at = match (min_at, high_at) {
        (_, Some(h)) => h + 4 * TILE_ROWS,
        (Some(m), None) => m + scales,
        (None, None) => scales,
    };
    Some(TileGeometry {
        min_at,
        high_at,
        scales_at: None,
        codes_at,
        bytes,
    })
}

/// Where byte `i` of row `r`'s Q4_K or Q6_K super-block lies in its tile (see the module's
/// documentation; every other format is not a byte permutation: Q8_0 flips a bit, Q5 reorders
/// bits).
fn k_quant_position(format: QFormat, g: &TileGeometry, r: usize, i: usize) -> usize {
    // Byte `e` of group `n` of four bytes per row.
    let group = |at: usize, n: usize, e: usize| at + 32 * n + 4 * r + e;
    match format {
        QFormat::Q4K => match i {
            Q4K::D..Q4K::DMIN => 2 * r + i - Q4K::D,
            Q4K::DMIN..Q4K::SCALES => g.min_at.expect("Q4_K has dmin") + 2 * r + i - Q4K::DMIN,
            Q4K::SCALES..Q4K::CODES => {
                g.scales_at.expect("Q4_K has scales") + TILE_ROWS * (i - Q4K::SCALES) + r
            }
            _ => group(g.codes_at, (i - Q4K::CODES) / 4, (i - Q4K::CODES) % 4),
        },
        QFormat::Q6K => match i {
            // `ql`: groups (h, q, k) are simply its 4-byte runs in order.
            Q6K::LOW..Q6K::HIGH => group(g.codes_at, (i - Q6K::LOW) / 4, (i - Q6K::LOW) % 4),
            Q6K::HIGH..Q6K::SCALES => group(
                g.high_at.expect("Q6_K has qh"),
                (i - Q6K::HIGH) / 4,
                (i - Q6K::HIGH) % 4,
            ),
            Q6K::SCALES..Q6K::D => {
                g.scales_at.expect("Q6_K has scales") + TILE_ROWS * (i - Q6K::SCALES) + r
            }
            _ => 2 * r + i - Q6K::D,
        },
        QFormat::Q8_0
        | QFormat::Q4_0
        | QFormat::Q4_1
        | QFormat::Q5_0
        | QFormat::Q5_1
        | QFormat::Q2K
        | QFormat::Q3K
        | QFormat::Q5K => unreachable!("{} is not a byte permutation", format.name()),
    }
}

// Every tiled 32-element format starts with its f16 scale `d`, which `pack_group` and
// `unpack_row` move as the block's first two bytes.
const _: () = assert!(Q8_0::D == 0 && Q4_0::D == 0 && Q4_1::D == 0 && Q5_0::D == 0 && Q5_1::D == 0);

/// Where a GGUF block of `format` keeps its parts: `(min, qh, codes)` offsets.
fn block_parts(format: QFormat) -> (Option<usize>, Option<usize>, usize) {
    match format {
        QFormat::Q8_0 => (None, None, Q8_0::CODES),
        QFormat::Q4_0 => (None, None, Q4_0::CODES),
        QFormat::Q4_1 => (Some(Q4_1::MIN), None, Q4_1::CODES),
        QFormat::Q5_0 => (None, Some(Q5_0::HIGH), Q5_0::CODES),
        QFormat::Q5_1 => (Some(Q5_1::MIN), Some(Q5_1::HIGH), Q5_1::CODES),
        QFormat::Q2K | QFormat::Q3K | QFormat::Q4K | QFormat::Q5K | QFormat::Q6K => {
            unreachable!("{} has no 32-value tile", format.name())
        }
    }
}

/// The layout a matrix of `format` with `rows` rows gets when the integer kernel in use is the
/// VNNI one (`tiles_wanted`): tiles where the format has them and the rows fill whole tiles.
pub fn preferred(format: QFormat, rows: usize, tiles_wanted: bool) -> Layout {
    if tiles_wanted && geometry(format).is_some() && rows.is_multiple_of(TILE_ROWS) && rows > 0 {
        Layout::Tiles
    } else {
        Layout::Rows
    }
}

/// Bytes of the Q8_0 code groups (eight groups of 32) or the nibble ones (four).
fn code_groups(format: QFormat) -> usize {
    match format {
        QFormat::Q8_0 => QK / 4,
        QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0 | QFormat::Q5_1 => QK / 8,
        QFormat::Q2K | QFormat::Q3K | QFormat::Q4K | QFormat::Q5K | QFormat::Q6K => {
            unreachable!("{} has no 32-value tile", format.name())
        }
    }
}

/// `qh` (bit `j`: fifth bit of element `j`) → the tile's order (bit `8i + k`: element `4k + i`).
fn high_to_tile(qh: u32) -> u32 {
    let mut h = 0;
    for k in 0..8 {
        for i in 0..4 {
            h |= ((qh >> (4 * k + i)) & 1) << (8 * i + k);
        }
    }
    h
}

/// The inverse of [`high_to_tile`].
fn high_from_tile(h: u32) -> u32 {
    let mut qh = 0;
    for k in 0..8 {
        for i in 0..4 {
            qh |= ((h >> (8 * i + k)) & 1) << (4 * k + i);
        }
    }
    qh
}

/// Packs `TILE_ROWS` consecutive GGUF rows (`rows`, each `nb` blocks) into their `nb` tiles
/// (`out`, the same length).
pub fn pack_group(format: QFormat, rows: &[u8], nb: usize, out: &mut [u8]) {
    let g = geometry(format).expect("a tiled format");
    let bb = format.block_bytes();
    if matches!(format, QFormat::Q4K | QFormat::Q6K) {
        for b in 0..nb {
            let tile = &mut out[b * g.bytes..(b + 1) * g.bytes];
            for r in 0..TILE_ROWS {
                let blk = &rows[(r * nb + b) * bb..(r * nb + b + 1) * bb];
                for (i, &v) in blk.iter().enumerate() {
                    tile[k_quant_position(format, &g, r, i)] = v;
                }
            }
        }
        return;
    }
    let (min, qh, codes) = block_parts(format);
    debug_assert_eq!(rows.len(), TILE_ROWS * nb * bb);
    debug_assert_eq!(out.len(), rows.len());
    let flip = if format == QFormat::Q8_0 { 0x80 } else { 0 };
    for b in 0..nb {
        let tile = &mut out[b * g.bytes..(b + 1) * g.bytes];
        for r in 0..TILE_ROWS {
            let blk = &rows[(r * nb + b) * bb..(r * nb + b + 1) * bb];
            tile[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
            if let (Some(at), Some(src)) = (g.min_at, min) {
                tile[at + 2 * r..at + 2 * r + 2].copy_from_slice(&blk[src..src + 2]);
            }
            if let (Some(at), Some(src)) = (g.high_at, qh) {
                let bits = u32::from_le_bytes(blk[src..src + 4].try_into().expect("4 bytes"));
                tile[at + 4 * r..at + 4 * r + 4].copy_from_slice(&high_to_tile(bits).to_le_bytes());
            }
            for k in 0..code_groups(format) {
                let dst = g.codes_at + 32 * k + 4 * r;
                for i in 0..4 {
                    tile[dst + i] = blk[codes + 4 * k + i] ^ flip;
                }
            }
        }
    }
}

/// Row `r` (`< TILE_ROWS`) of a group's tiles (`tiles`, `nb` of them) as its GGUF blocks
/// (`out`, `nb` blocks).
pub fn unpack_row(format: QFormat, tiles: &[u8], r: usize, nb: usize, out: &mut [u8]) {
    let g = geometry(format).expect("a tiled format");
    let bb = format.block_bytes();
    if matches!(format, QFormat::Q4K | QFormat::Q6K) {
        for b in 0..nb {
            let tile = &tiles[b * g.bytes..(b + 1) * g.bytes];
            for (i, v) in out[b * bb..(b + 1) * bb].iter_mut().enumerate() {
                *v = tile[k_quant_position(format, &g, r, i)];
            }
        }
        return;
    }
    let (min, qh, codes) = block_parts(format);
    let flip = if format == QFormat::Q8_0 { 0x80 } else { 0 };
    for b in 0..nb {
        let tile = &tiles[b * g.bytes..(b + 1) * g.bytes];
        let blk = &mut out[b * bb..(b + 1) * bb];
        blk[..2].copy_from_slice(&tile[2 * r..2 * r + 2]);
        if let (Some(at), Some(dst)) = (g.min_at, min) {
            blk[dst..dst + 2].copy_from_slice(&tile[at + 2 * r..at + 2 * r + 2]);
        }
        if let (Some(at), Some(dst)) = (g.high_at, qh) {
            let h = u32::from_le_bytes(tile[at + 4 * r..at + 4 * r + 4].try_into().expect("4"));
            blk[dst..dst + 4].copy_from_slice(&high_from_tile(h).to_le_bytes());
        }
        for k in 0..code_groups(format) {
            let src = g.codes_at + 32 * k + 4 * r;
            for i in 0..4 {
                blk[codes + 4 * k + i] = tile[src + i] ^ flip;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifth_bit_order_round_trips() {
        for qh in [0u32, 1, 0x8000_0001, 0xdead_beef, u32::MAX, 0x0123_4567] {
            assert_eq!(high_from_tile(high_to_tile(qh)), qh);
        }
        // Element 4k + i lands at bit 8i + k.
        assert_eq!(high_to_tile(1 << 6), 1 << (8 * 2 + 1));
    }

    /// A K-quant tile is a permutation of its eight super-blocks' bytes.
    #[test]
    fn k_quant_tiles_permute_the_blocks_bytes() {
        for f in [QFormat::Q4K, QFormat::Q6K] {
            let g = geometry(f).unwrap();
            assert_eq!(g.bytes, TILE_ROWS * f.block_bytes());
            let mut seen = vec![false; g.bytes];
            for r in 0..TILE_ROWS {
                for i in 0..f.block_bytes() {
                    let at = k_quant_position(f, &g, r, i);
                    assert!(
                        !seen[at],
                        "{}: byte {i} of row {r} lands on a taken {at}",
                        f.name()
                    );
                    seen[at] = true;
                }
            }
            assert!(seen.iter().all(|&s| s), "{}", f.name());
        }
    }

    #[test]
    fn every_tiled_format_has_the_bytes_of_its_blocks() {
        for f in QFormat::ALL.into_iter().filter(|f| f.block_elems() == QK) {
            if let Some(g) = geometry(f) {
                let codes = code_groups(f) * 4;
                assert_eq!(g.codes_at + TILE_ROWS * codes, g.bytes, "{}", f.name());
            }
        }
    }
}
