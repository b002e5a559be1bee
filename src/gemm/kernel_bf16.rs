//! The bf16 AVX-512 micro-kernel: inputs rounded to bf16 (nearest even) as they are packed,
//! two products per lane summed in f32 by `vdpbf16ps`, output f32; and the blocked loop of
//! one thread in bf16. The tile store is the f32 kernel's.

use std::arch::x86_64::*;
use std::cell::RefCell;

use ndarray::ArrayView2;

use super::kernel_f32::store_tile;
use super::loop_nest::{blocked, by_rows, CPtr};
use super::pack::{
    pack_b_bf16, pack_pairs, pack_pairs_contiguous, pack_pairs_rows, prepacked, KC, MR, NC, NR,
};

thread_local! {
    /// Packing buffers of this thread for the bf16 kernel: packed pairs (two bf16 along k in one u32).
    static PACK_BF16: RefCell<(Vec<u32>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The blocked loop on one thread, bf16 inputs; `packed` as for the f32 one (`kernel_f32::gemm_serial`).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn gemm_serial_bf16(
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: CPtr,
    packed: Option<(&[Vec<u32>], usize)>,
) {
    let ((m, k), n) = (a.dim(), b.ncols());
    let (ars, acs, abase) = (a.strides()[0], a.strides()[1], a.as_ptr());
    PACK_BF16.with(|pack| {
        let mut pack = pack.borrow_mut();
        let (pa, pb) = &mut *pack;
        if packed.is_none() {
            pb.resize(NC.div_ceil(NR) * NR * KC / 2, 0);
        }
        let pack_b = |pc: usize, kc: usize, jc: usize, nc: usize, pb: &mut [u32]| match packed {
            Some(p) => prepacked(p, pc, jc, kc.div_ceil(2)),
            None => {
                // SAFETY: inside this AVX-512 BF16 function.
                unsafe { pack_b_bf16(b, pc, kc, jc, nc, pb) };
                pb.as_ptr()
            }
        };
        // SAFETY (the packer): (ic+i, pc+p) is inside A.
        let pack_a = |ic: usize, mc: usize, pc: usize, kc: usize, pa: &mut [u32]| unsafe {
            if acs == 1 {
                pack_pairs_contiguous(mc, kc, MR, pa, |i| {
                    abase.offset((ic + i) as isize * ars + pc as isize)
                });
            } else if ars == 1 {
                // A = gᵀ (the weight gradient's product).
                pack_pairs_rows(mc, kc, MR, pa, |p| {
                    abase.offset((pc + p) as isize * acs + ic as isize)
                });
            } else {
                pack_pairs(mc, kc, MR, pa, |i, p| {
                    *abase.offset((ic + i) as isize * ars + (pc + p) as isize * acs)
                });
            }
        };
        blocked(
            (m, n, k),
            c,
            beta,
            packed.is_some(),
            pa,
            pb,
            |kc| kc.div_ceil(2),
            pack_b,
            pack_a,
            |d, ap, bp, cij, mr, nr, bk| {
                by_rows!(
                    mr,
                    kernel_bf16,
                    d,
                    ap,
                    bp,
                    cij,
                    c.rs,
                    c.cs,
                    mr,
                    nr,
                    alpha,
                    bk
                )
            },
        );
    });
}

/// The bf16 micro-tile: per k-pair two loads of `B`, `R` broadcasts of an `A` pair and
/// `2R` `vdpbf16ps` (each two multiply-adds per lane, summed in f32); `R` as in the f32 kernel.
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_bf16<const R: usize>(
    kp: usize,
    a: *const u32,
    b: *const u32,
    c: *mut f32,
    rs: isize,
    cs: isize,
    mr: usize,
    nr: usize,
    alpha: f32,
    beta: f32,
) {
    let mut lo = [_mm512_setzero_ps(); R];
    let mut hi = [_mm512_setzero_ps(); R];
    let (mut ap, mut bp) = (a, b);
    for _ in 0..kp {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp as *const _));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(16) as *const _));
        for i in 0..R {
            let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ap.add(i) as i32));
            lo[i] = _mm512_dpbf16_ps(lo[i], ai, b0);
            hi[i] = _mm512_dpbf16_ps(hi[i], ai, b1);
        }
        ap = ap.add(MR);
        bp = bp.add(NR);
    }
    store_tile(&lo, &hi, c, rs, cs, mr, nr, alpha, beta);
}
