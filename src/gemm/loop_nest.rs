//! The GotoBLAS loop nest both AVX-512 kernels share ([`blocked`]): which panels of `A` and
//! `B` are packed when, and which micro-tile of `C` each kernel call writes. The kernels pass
//! in their packers and micro-kernel; this file knows neither.

use super::pack::{KC, MC, MR, NC, NR};

/// A raw view of `C` a thread may write (its own disjoint part).
#[derive(Clone, Copy)]
pub(super) struct CPtr {
    pub(super) ptr: *mut f32,
    pub(super) rs: isize,
    pub(super) cs: isize,
}
// SAFETY: each thread writes a disjoint range of rows or columns of C.
unsafe impl Send for CPtr {}
unsafe impl Sync for CPtr {}

/// A micro-kernel `$kernel::<R>(args)` with the fewest rows `R` of 4, 8 and `MR` that cover
/// `mr`: a short last tile of rows (m not a multiple of `MR`) no longer pays for twelve (the
/// LM head's 75 rows: 7 tiles of work instead of 6⅓). Each row's sums are those of the full
/// kernel.
macro_rules! by_rows {
    ($mr:expr, $kernel:ident, $($arg:expr),*) => {
        match $mr {
            0..=4 => $kernel::<4>($($arg),*),
            5..=8 => $kernel::<8>($($arg),*),
            _ => $kernel::<MR>($($arg),*),
        }
    };
}
pub(super) use by_rows;

/// Largest all-of-`K` packed `A` the few-rows order keeps (in bytes): it is reread for every
/// `NR`-sliver of `B`, so it must stay in the 1 MB L2 beside `B`'s slivers.
const WHOLE_A_BYTES: usize = 512 << 10;

/// The GotoBLAS loop nest both kernels share: a `B` panel per (jc, pc) (packed into `pb`,
/// or found already packed: `pack_b` returns where it is), an `A` block per ic, the
/// micro-kernel over the tiles. `depth(kc)` is a packed sliver's depth (k values, or
/// k-pairs for bf16); `tile(depth, a, b, c_ij, mr, nr, β)` one micro-tile.
///
/// A pre-packed `B` (`b_prepacked`: `pack_b` only finds panels) with few rows in `A` (all
/// of it, every `K` block, packed within [`WHOLE_A_BYTES`]) takes another order: all of
/// `A` packed once, then per `NR`-sliver of `B` every `K` block. Goto's order passes over
/// `C` once per `K` block, and with few rows and many columns (the LM head: 75 × 49152,
/// 14.7 MB) each pass goes to memory: `C` was read and written 3 times for k = 576 beside
/// one read of `B`. Here a sliver's `C` strip (m × NR) stays in L1 across the `K` blocks.
/// Every element still sums its `K` blocks in the same order, so the result is the same
/// bit for bit.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn blocked<P: Copy + Default>(
    (m, n, k): (usize, usize, usize),
    c: CPtr,
    beta: f32,
    b_prepacked: bool,
    pa: &mut Vec<P>,
    pb: &mut [P],
    depth: impl Fn(usize) -> usize,
    mut pack_b: impl FnMut(usize, usize, usize, usize, &mut [P]) -> *const P,
    mut pack_a: impl FnMut(usize, usize, usize, usize, &mut [P]),
    tile: impl Fn(usize, *const P, *const P, *mut f32, usize, usize, f32),
) {
    let whole_a = m.div_ceil(MR) * MR * depth(KC) * k.div_ceil(KC);
    if b_prepacked && whole_a * std::mem::size_of::<P>() <= WHOLE_A_BYTES {
        let block = m.div_ceil(MR) * MR * depth(KC);
        pa.resize(whole_a, P::default());
        for (bi, pc) in (0..k).step_by(KC).enumerate() {
            pack_a(
                0,
                m,
                pc,
                KC.min(k - pc),
                &mut pa[bi * block..(bi + 1) * block],
            );
        }
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for jr in (0..nc).step_by(NR) {
                let nr = NR.min(nc - jr);
                for (bi, pc) in (0..k).step_by(KC).enumerate() {
                    let d = depth(KC.min(k - pc));
                    let bp = pack_b(pc, KC.min(k - pc), jc, nc, pb).add(jr / NR * NR * d);
                    let beta_k = if pc == 0 { beta } else { 1.0 };
                    for ir in (0..m).step_by(MR) {
                        let ap = pa.as_ptr().add(bi * block + ir / MR * MR * d);
                        let cij = c.ptr.offset(ir as isize * c.rs + (jc + jr) as isize * c.cs);
                        tile(d, ap, bp, cij, MR.min(m - ir), nr, beta_k);
                    }
                }
            }
        }
        return;
    }
    pa.resize(MC.div_ceil(MR) * MR * depth(KC), P::default());
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let d = depth(kc);
            let panel = pack_b(pc, kc, jc, nc, pb);
            // β applies once: on the first K block; later blocks accumulate.
            let beta_k = if pc == 0 { beta } else { 1.0 };
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                pack_a(ic, mc, pc, kc, pa);
                for jr in (0..nc).step_by(NR) {
                    let nr = NR.min(nc - jr);
                    let bp = panel.add(jr / NR * NR * d);
                    for ir in (0..mc).step_by(MR) {
                        let mr = MR.min(mc - ir);
                        let ap = pa.as_ptr().add(ir / MR * MR * d);
                        let cij = c
                            .ptr
                            .offset((ic + ir) as isize * c.rs + (jc + jr) as isize * c.cs);
                        tile(d, ap, bp, cij, mr, nr, beta_k);
                    }
                }
            }
        }
    }
}
