//! Hot f64-accumulated reductions over f32/f64 rows. Every kernel sums in 8 lanes (lane `l` takes
//! elements `i ≡ l mod 8`, tail into lane 0) and then pairwise, with separate multiply and add (no
//! FMA), so the portable and the AVX2 build give bit-identical results. The AVX2 twins exist
//! because the crate is built for baseline x86-64 and the auto-vectoriser handles the f32 → f64
//! widening poorly.

use super::SolverFloat;

/// Pairwise sum of 8 lanes.
#[inline(always)]
pub(crate) fn lane_sum(x: &[f64; 8]) -> f64 {
    ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]))
}

/// `(a·b, a·c)` in f64. All slices have equal length.
#[inline(always)]
pub(crate) fn dot2_portable<T: SolverFloat>(a: &[T], b: &[T], c: &[T]) -> (f64, f64) {
    const L: usize = 8;
    let n = a.len();
    let (b, c) = (&b[..n], &c[..n]);
    let (mut s1, mut s2) = ([0.0f64; L], [0.0f64; L]);
    let n8 = n / L * L;
    for k in (0..n8).step_by(L) {
        for l in 0..L {
            let x = a[k + l].widen();
            s1[l] += x * b[k + l].widen();
            s2[l] += x * c[k + l].widen();
        }
    }
    for k in n8..n {
        let x = a[k].widen();
        s1[0] += x * b[k].widen();
        s2[0] += x * c[k].widen();
    }
    (lane_sum(&s1), lane_sum(&s2))
}

/// `(Σ (f − z)², Σ f²)` in f64. Both slices have equal length.
#[inline(always)]
pub(crate) fn residual_sums_portable<T: SolverFloat>(z: &[T], f: &[T]) -> (f64, f64) {
    const L: usize = 8;
    let n = z.len();
    let f = &f[..n];
    let (mut r2, mut f2) = ([0.0f64; L], [0.0f64; L]);
    let n8 = n / L * L;
    for k in (0..n8).step_by(L) {
        for l in 0..L {
            let fi = f[k + l].widen();
            let d = fi - z[k + l].widen();
            r2[l] += d * d;
            f2[l] += fi * fi;
        }
    }
    for k in n8..n {
        let fi = f[k].widen();
        let d = fi - z[k].widen();
        r2[0] += d * d;
        f2[0] += fi * fi;
    }
    (lane_sum(&r2), lane_sum(&f2))
}

/// `(a·b, a·c)` in f64 for a state row `a` and f64 rows `b`, `c` of equal length.
#[inline(always)]
pub(crate) fn dot2_mixed_portable<T: SolverFloat>(a: &[T], b: &[f64], c: &[f64]) -> (f64, f64) {
    const L: usize = 8;
    let n = a.len();
    let (b, c) = (&b[..n], &c[..n]);
    let (mut s1, mut s2) = ([0.0f64; L], [0.0f64; L]);
    let n8 = n / L * L;
    for k in (0..n8).step_by(L) {
        for l in 0..L {
            let x = a[k + l].widen();
            s1[l] += x * b[k + l];
            s2[l] += x * c[k + l];
        }
    }
    for k in n8..n {
        let x = a[k].widen();
        s1[0] += x * b[k];
        s2[0] += x * c[k];
    }
    (lane_sum(&s1), lane_sum(&s2))
}

/// `a·b` in f64 for a state row `a` and an f64 row `b` of equal length.
#[inline(always)]
pub(crate) fn dot_mixed_portable<T: SolverFloat>(a: &[T], b: &[f64]) -> f64 {
    const L: usize = 8;
    let n = a.len();
    let b = &b[..n];
    let mut s = [0.0f64; L];
    let n8 = n / L * L;
    for k in (0..n8).step_by(L) {
        for l in 0..L {
            s[l] += a[k + l].widen() * b[k + l];
        }
    }
    for k in n8..n {
        s[0] += a[k].widen() * b[k];
    }
    lane_sum(&s)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Loads 8 f32 at `p` widened to two f64×4 (lanes 0–3, 4–7).
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> (__m256d, __m256d) {
        (
            _mm256_cvtps_pd(_mm_loadu_ps(p)),
            _mm256_cvtps_pd(_mm_loadu_ps(p.add(4))),
        )
    }

    #[inline(always)]
    unsafe fn lanes(lo: __m256d, hi: __m256d) -> [f64; 8] {
        let mut out = [0.0f64; 8];
        _mm256_storeu_pd(out.as_mut_ptr(), lo);
        _mm256_storeu_pd(out.as_mut_ptr().add(4), hi);
        out
    }

    /// See [`super::dot2_portable`]; same lanes, same rounding.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot2_f32(a: &[f32], b: &[f32], c: &[f32]) -> (f64, f64) {
        let n = a.len();
        assert!(b.len() >= n && c.len() >= n);
        let n8 = n / 8 * 8;
        let (pa, pb, pc) = (a.as_ptr(), b.as_ptr(), c.as_ptr());
        let z = _mm256_setzero_pd();
        let (mut s1l, mut s1h, mut s2l, mut s2h) = (z, z, z, z);
        let mut k = 0;
        while k < n8 {
            let (al, ah) = load8(pa.add(k));
            let (bl, bh) = load8(pb.add(k));
            let (cl, ch) = load8(pc.add(k));
            s1l = _mm256_add_pd(s1l, _mm256_mul_pd(al, bl));
            s1h = _mm256_add_pd(s1h, _mm256_mul_pd(ah, bh));
            s2l = _mm256_add_pd(s2l, _mm256_mul_pd(al, cl));
            s2h = _mm256_add_pd(s2h, _mm256_mul_pd(ah, ch));
            k += 8;
        }
        let (mut s1, mut s2) = (lanes(s1l, s1h), lanes(s2l, s2h));
        for k in n8..n {
            let x = a[k] as f64;
            s1[0] += x * b[k] as f64;
            s2[0] += x * c[k] as f64;
        }
        (super::lane_sum(&s1), super::lane_sum(&s2))
    }

    /// See [`super::dot2_mixed_portable`]; same lanes, same rounding.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot2_mixed_f32(a: &[f32], b: &[f64], c: &[f64]) -> (f64, f64) {
        let n = a.len();
        assert!(b.len() >= n && c.len() >= n);
        let n8 = n / 8 * 8;
        let (pa, pb, pc) = (a.as_ptr(), b.as_ptr(), c.as_ptr());
        let z = _mm256_setzero_pd();
        let (mut s1l, mut s1h, mut s2l, mut s2h) = (z, z, z, z);
        let mut k = 0;
        while k < n8 {
            let (al, ah) = load8(pa.add(k));
            let (bl, bh) = (_mm256_loadu_pd(pb.add(k)), _mm256_loadu_pd(pb.add(k + 4)));
            let (cl, ch) = (_mm256_loadu_pd(pc.add(k)), _mm256_loadu_pd(pc.add(k + 4)));
            s1l = _mm256_add_pd(s1l, _mm256_mul_pd(al, bl));
            s1h = _mm256_add_pd(s1h, _mm256_mul_pd(ah, bh));
            s2l = _mm256_add_pd(s2l, _mm256_mul_pd(al, cl));
            s2h = _mm256_add_pd(s2h, _mm256_mul_pd(ah, ch));
            k += 8;
        }
        let (mut s1, mut s2) = (lanes(s1l, s1h), lanes(s2l, s2h));
        for k in n8..n {
            let x = a[k] as f64;
            s1[0] += x * b[k];
            s2[0] += x * c[k];
        }
        (super::lane_sum(&s1), super::lane_sum(&s2))
    }

    /// See [`super::dot_mixed_portable`]; same lanes, same rounding.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot_mixed_f32(a: &[f32], b: &[f64]) -> f64 {
        let n = a.len();
        assert!(b.len() >= n);
        let n8 = n / 8 * 8;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (mut sl, mut sh) = (_mm256_setzero_pd(), _mm256_setzero_pd());
        let mut k = 0;
        while k < n8 {
            let (al, ah) = load8(pa.add(k));
            let (bl, bh) = (_mm256_loadu_pd(pb.add(k)), _mm256_loadu_pd(pb.add(k + 4)));
            sl = _mm256_add_pd(sl, _mm256_mul_pd(al, bl));
            sh = _mm256_add_pd(sh, _mm256_mul_pd(ah, bh));
            k += 8;
        }
        let mut s = lanes(sl, sh);
        for k in n8..n {
            s[0] += a[k] as f64 * b[k];
        }
        super::lane_sum(&s)
    }

    /// See [`super::dot_mixed_portable`] with f64 rows; same lanes, same rounding.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
        let n = a.len();
        assert!(b.len() >= n);
        let n8 = n / 8 * 8;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let (mut sl, mut sh) = (_mm256_setzero_pd(), _mm256_setzero_pd());
        let mut k = 0;
        while k < n8 {
            let (al, ah) = (_mm256_loadu_pd(pa.add(k)), _mm256_loadu_pd(pa.add(k + 4)));
            let (bl, bh) = (_mm256_loadu_pd(pb.add(k)), _mm256_loadu_pd(pb.add(k + 4)));
            sl = _mm256_add_pd(sl, _mm256_mul_pd(al, bl));
            sh = _mm256_add_pd(sh, _mm256_mul_pd(ah, bh));
            k += 8;
        }
        let mut s = lanes(sl, sh);
        for k in n8..n {
            s[0] += a[k] * b[k];
        }
        super::lane_sum(&s)
    }

    /// See [`super::residual_sums_portable`]; same lanes, same rounding.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn residual_sums_f32(z: &[f32], f: &[f32]) -> (f64, f64) {
        let n = z.len();
        assert!(f.len() >= n);
        let n8 = n / 8 * 8;
        let (pz, pf) = (z.as_ptr(), f.as_ptr());
        let zero = _mm256_setzero_pd();
        let (mut r2l, mut r2h, mut f2l, mut f2h) = (zero, zero, zero, zero);
        let mut k = 0;
        while k < n8 {
            let (zl, zh) = load8(pz.add(k));
            let (fl, fh) = load8(pf.add(k));
            let (dl, dh) = (_mm256_sub_pd(fl, zl), _mm256_sub_pd(fh, zh));
            r2l = _mm256_add_pd(r2l, _mm256_mul_pd(dl, dl));
            r2h = _mm256_add_pd(r2h, _mm256_mul_pd(dh, dh));
            f2l = _mm256_add_pd(f2l, _mm256_mul_pd(fl, fl));
            f2h = _mm256_add_pd(f2h, _mm256_mul_pd(fh, fh));
            k += 8;
        }
        let (mut r2, mut f2) = (lanes(r2l, r2h), lanes(f2l, f2h));
        for k in n8..n {
            let fi = f[k] as f64;
            let d = fi - z[k] as f64;
            r2[0] += d * d;
            f2[0] += fi * fi;
        }
        (super::lane_sum(&r2), super::lane_sum(&f2))
    }
}

/// Views `&[T]` as `&[f32]` when `T` is `f32`.
#[inline(always)]
fn as_f32<T: SolverFloat>(x: &[T]) -> Option<&[f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32 (same type, so same size, alignment and validity).
        Some(unsafe { std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len()) })
    } else {
        None
    }
}

/// Views `&[T]` as `&[f64]` when `T` is `f64`.
#[inline(always)]
fn as_f64<T: SolverFloat>(x: &[T]) -> Option<&[f64]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f64>() {
        // SAFETY: T is f64 (same type, so same size, alignment and validity).
        Some(unsafe { std::slice::from_raw_parts(x.as_ptr() as *const f64, x.len()) })
    } else {
        None
    }
}

/// `(a·b, a·c)` accumulated in f64. `b`, `c` at least as long as `a`.
#[inline]
pub(crate) fn dot2_f64<T: SolverFloat>(a: &[T], b: &[T], c: &[T]) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if let (Some(a), Some(b), Some(c)) = (as_f32(a), as_f32(b), as_f32(c)) {
        if super::has_avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2::dot2_f32(a, &b[..a.len()], &c[..a.len()]) };
        }
    }
    dot2_portable(a, b, c)
}

/// `(Σ (f − z)², Σ f²)` accumulated in f64. `f` at least as long as `z`.
#[inline]
pub(crate) fn residual_sums<T: SolverFloat>(z: &[T], f: &[T]) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if let (Some(z), Some(f)) = (as_f32(z), as_f32(f)) {
        if super::has_avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2::residual_sums_f32(z, &f[..z.len()]) };
        }
    }
    residual_sums_portable(z, f)
}

/// `(a·b, a·c)` in f64 for a state row `a`; `b`, `c` at least as long as `a`.
#[inline]
pub(crate) fn dot2_mixed<T: SolverFloat>(a: &[T], b: &[f64], c: &[f64]) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if let Some(a) = as_f32(a) {
        if super::has_avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2::dot2_mixed_f32(a, &b[..a.len()], &c[..a.len()]) };
        }
    }
    dot2_mixed_portable(a, b, c)
}

/// `a·b` in f64 for a state row `a`; `b` at least as long as `a`.
#[inline]
pub(crate) fn dot_mixed<T: SolverFloat>(a: &[T], b: &[f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if let Some(a) = as_f32(a) {
        if super::has_avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2::dot_mixed_f32(a, &b[..a.len()]) };
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(a) = as_f64(a) {
        if super::has_avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2::dot_f64(a, &b[..a.len()]) };
        }
    }
    dot_mixed_portable(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn row(rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    }

    /// The dispatched kernels (AVX2 where available) equal the portable lanes bit for bit, and a
    /// plain sequential f64 sum to rounding, including a tail that is not a multiple of 8.
    #[test]
    fn kernels_match_portable_and_naive_sums() {
        let mut rng = StdRng::seed_from_u64(7);
        for n in [1usize, 8, 13, 579] {
            let (a, b, c) = (row(&mut rng, n), row(&mut rng, n), row(&mut rng, n));
            let b64: Vec<f64> = b.iter().map(|&x| x as f64).collect();
            let c64: Vec<f64> = c.iter().map(|&x| x as f64).collect();
            let a64: Vec<f64> = a.iter().map(|&x| x as f64).collect();
            let naive = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f64>();
            let close = |x: f64, y: f64| (x - y).abs() <= 1e-12 * (1.0 + y.abs());

            let got = dot2_f64(&a, &b, &c);
            assert_eq!(got, dot2_portable(&a, &b, &c), "dot2 n={n}");
            assert!(close(got.0, naive(&a64, &b64)) && close(got.1, naive(&a64, &c64)));

            let got = dot2_mixed(&a, &b64, &c64);
            assert_eq!(got, dot2_mixed_portable(&a, &b64, &c64), "dot2_mixed n={n}");
            assert!(close(got.0, naive(&a64, &b64)) && close(got.1, naive(&a64, &c64)));

            let got = dot_mixed(&a, &b64);
            assert_eq!(got, dot_mixed_portable(&a, &b64), "dot_mixed n={n}");
            let got64 = dot_mixed(&a64, &b64);
            assert_eq!(got64, dot_mixed_portable(&a64, &b64), "dot f64 n={n}");
            assert!(close(got, naive(&a64, &b64)) && close(got64, naive(&a64, &b64)));

            let (r2, f2) = residual_sums(&a, &b);
            assert_eq!((r2, f2), residual_sums_portable(&a, &b), "residual n={n}");
            let d: Vec<f64> = b64.iter().zip(&a64).map(|(f, z)| f - z).collect();
            assert!(close(r2, naive(&d, &d)) && close(f2, naive(&b64, &b64)));
        }
    }
}
