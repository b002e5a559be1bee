//! The f32 AVX-512F micro-kernel: an `MR × NR` tile of `C` in 24 zmm registers (12 rows ×
//! 2 × 16 columns); one `k` step is two loads of `B`, twelve broadcasts of `A` and 24 FMAs.
//! Also the tile store both kernels end with, the blocked loop of one thread in f32, and the
//! peak FMA rate the benchmarks compare against.

use std::arch::x86_64::*;
use std::cell::RefCell;

use ndarray::ArrayView2;

use super::loop_nest::{blocked, by_rows, CPtr};
use super::pack::{pack_a, pack_b, prepacked, KC, MR, NC, NR};

thread_local! {
    /// Packing buffers of this thread (rayon's workers persist, so steps reuse them).
    static PACK: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The blocked loop on one thread; `packed`: `B`'s panels packed already (a frozen weight).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gemm_serial(
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: CPtr,
    packed: Option<(&[Vec<f32>], usize)>,
) {
    let ((m, k), n) = (a.dim(), b.ncols());
    PACK.with(|pack| {
        let mut pack = pack.borrow_mut();
        let (pa, pb) = &mut *pack;
        if packed.is_none() {
            pb.resize(NC.div_ceil(NR) * NR * KC, 0.0);
        }
        blocked(
            (m, n, k),
            c,
            beta,
            packed.is_some(),
            pa,
            pb,
            |kc| kc,
            |pc, kc, jc, nc, pb| match packed {
                Some(p) => prepacked(p, pc, jc, kc),
                None => {
                    pack_b(b, pc, kc, jc, nc, pb);
                    pb.as_ptr()
                }
            },
            |ic, mc, pc, kc, pa| pack_a(a, ic, mc, pc, kc, pa),
            |d, ap, bp, cij, mr, nr, bk| {
                by_rows!(mr, kernel, d, ap, bp, cij, c.rs, c.cs, mr, nr, alpha, bk)
            },
        );
    });
}

/// `C[mr × nr] = α · Â·B̂ + β · C` for one micro-tile from packed slivers, on the first `R`
/// rows of the `A` sliver (`by_rows!` picks `R`).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<const R: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
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
    for _ in 0..kc {
        let b0 = _mm512_loadu_ps(bp);
        let b1 = _mm512_loadu_ps(bp.add(16));
        for i in 0..R {
            let ai = _mm512_set1_ps(*ap.add(i));
            lo[i] = _mm512_fmadd_ps(ai, b0, lo[i]);
            hi[i] = _mm512_fmadd_ps(ai, b1, hi[i]);
        }
        ap = ap.add(MR);
        bp = bp.add(NR);
    }
    store_tile(&lo, &hi, c, rs, cs, mr, nr, alpha, beta);
}

/// `C[mr × nr] = α · acc + β · C` from the accumulators of a micro-tile.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
pub(super) unsafe fn store_tile<const R: usize>(
    lo: &[__m512; R],
    hi: &[__m512; R],
    c: *mut f32,
    rs: isize,
    cs: isize,
    mr: usize,
    nr: usize,
    alpha: f32,
    beta: f32,
) {
    let va = _mm512_set1_ps(alpha);
    if mr == R && nr == NR && cs == 1 {
        for i in 0..R {
            let row = c.offset(i as isize * rs);
            let (mut x0, mut x1) = (_mm512_mul_ps(va, lo[i]), _mm512_mul_ps(va, hi[i]));
            // β = 0 must not read C (it may hold NaN from a fresh buffer).
            if beta != 0.0 {
                let vb = _mm512_set1_ps(beta);
                x0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row), x0);
                x1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row.add(16)), x1);
            }
            _mm512_storeu_ps(row, x0);
            _mm512_storeu_ps(row.add(16), x1);
        }
        return;
    }
    let mut tile = [0.0f32; MR * NR];
    for i in 0..R {
        _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR), lo[i]);
        _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR + 16), hi[i]);
    }
    for i in 0..mr {
        for j in 0..nr {
            let p = c.offset(i as isize * rs + j as isize * cs);
            let v = alpha * tile[i * NR + j];
            // Fused, as in the full tiles: a row's result does not depend on its tile.
            *p = if beta == 0.0 { v } else { beta.mul_add(*p, v) };
        }
    }
}

/// Twelve independent chains of 512-bit FMAs (more than FMA latency × ports), long enough
/// to time.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn peak_fma() -> f64 {
    let mut acc = [_mm512_set1_ps(1.0); 12];
    let x = _mm512_set1_ps(0.999_999);
    let y = _mm512_set1_ps(1e-7);
    let reps = 20_000_000usize;
    let t = std::time::Instant::now();
    for _ in 0..reps {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, x, y);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    std::hint::black_box(&acc);
    (reps * 12 * 16 * 2) as f64 / secs / 1e9
}
