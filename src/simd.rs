//! Elementwise f32 transcendental functions over slices, vectorised with AVX-512F where the
//! CPU has it (detected at run time) and scalar elsewhere: the softmaxes (attention, the
//! cross-entropy over the vocabulary) and SiLU take one `exp` per element, and glibc's scalar
//! `expf` was ~5% of a training step. Also sums over a row split into interleaved partial sums
//! ([`sum_of_squares`], [`dot3`]) so that they vectorise (RMSNorm). And the two halves of a
//! decode step's attention ([`scaled_row_dots`], [`weighted_row_sum`]): compiled for the
//! baseline x86-64 target, their plain loops ran 4 lanes wide and made attention about a
//! quarter of a quantized SmolLM2 decode step.
//!
//! `exp` here: `x = n·ln2 + r` with `n` the nearest integer to `x·log2(e)` and `|r| ≤ ln2/2`
//! (`ln2` split in two so `r` is exact to f32), `e^r` by its Taylor polynomial of degree 7
//! (truncation below 6e-9 relative, under half an f32 ulp), and `2^n` applied by `vscalefps`,
//! which overflows to `inf` and underflows through the subnormals to 0 like `expf`. Within
//! 2 ulp of the exact value (tested against f64); NaN stays NaN, `exp(-inf) = 0`,
//! `exp(inf) = inf`.

/// Independent partial sums of [`sum_of_squares`] and [`dot3`]: one running sum is a chain of
/// dependent additions (~4 cycles per element); sixteen let the compiler keep several
/// vector accumulators in flight. The order is fixed, so results are deterministic.
const LANES: usize = 16;

/// `Σ xᵢ²` accumulated in `A` (`T` itself, or wider: f32 elements summed in f64), in
/// [`LANES`] interleaved partial sums.
pub fn sum_of_squares<T: Copy, A: num_traits::Float + From<T>>(xs: &[T]) -> A {
    let sq = |x: T| {
        let x = <A as From<T>>::from(x);
        x * x
    };
    let mut acc = [A::zero(); LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = *a + sq(x);
        }
    }
    let tail = chunks.remainder().iter().fold(A::zero(), |s, &x| s + sq(x));
    acc.iter().fold(A::zero(), |s, &a| s + a) + tail
}

/// `Σ aᵢ·bᵢ·cᵢ` over equal-length slices, summed like [`sum_of_squares`].
pub fn dot3<T: num_traits::Float>(a: &[T], b: &[T], c: &[T]) -> T {
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
    let mut acc = [T::zero(); LANES];
    let full = n - n % LANES;
    for ((ca, cb), cc) in a[..full]
        .chunks_exact(LANES)
        .zip(b[..full].chunks_exact(LANES))
        .zip(c[..full].chunks_exact(LANES))
    {
        for (k, s) in acc.iter_mut().enumerate() {
            *s = *s + ca[k] * cb[k] * cc[k];
        }
    }
    let tail = (full..n).fold(T::zero(), |s, i| s + a[i] * b[i] * c[i]);
    acc.iter().fold(T::zero(), |s, &x| s + x) + tail
}

/// `x ← e^x` for every element.
pub fn exp_in_place(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above).
        unsafe { avx512::map(xs, |x| avx512::exp(x)) };
        return;
    }
    xs.iter_mut().for_each(|x| *x = x.exp());
}

/// `x ← 1 / (1 + e^-x)` for every element.
pub fn sigmoid_in_place(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above).
        unsafe { avx512::map(xs, |x| avx512::sigmoid(x)) };
        return;
    }
    xs.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp()));
}

/// `out[j] = scale · (q · rows[j])` for every row `j` of `rows` (`[out.len(), q.len()]`,
/// row-major): a query's attention scores over its keys.
pub fn scaled_row_dots(q: &[f32], rows: &[f32], scale: f32, out: &mut [f32]) {
    let d = q.len();
    assert_eq!(
        rows.len(),
        out.len() * d,
        "scaled_row_dots: rows must be [out.len(), q.len()]"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above); the lengths were checked.
        unsafe { avx512::scaled_row_dots(q, rows, scale, out) };
        return;
    }
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(d.max(1))) {
        let mut acc = [0.0f32; 8];
        let (qc, rc) = (q.chunks_exact(8), row.chunks_exact(8));
        let tail: f32 = qc
            .remainder()
            .iter()
            .zip(rc.remainder())
            .map(|(a, b)| a * b)
            .sum();
        for (a, b) in qc.zip(rc) {
            for i in 0..8 {
                acc[i] += a[i] * b[i];
            }
        }
        *o = (acc.iter().sum::<f32>() + tail) * scale;
    }
}

/// `out = Σ_j weights[j] · rows[j]` over the rows of `rows` (`[weights.len(), out.len()]`,
/// row-major): attention's probability-weighted sum of the values.
pub fn weighted_row_sum(weights: &[f32], rows: &[f32], out: &mut [f32]) {
    let d = out.len();
    assert_eq!(
        rows.len(),
        weights.len() * d,
        "weighted_row_sum: rows must be [weights.len(), out.len()]"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above); the lengths were checked.
        unsafe { avx512::weighted_row_sum(weights, rows, out) };
        return;
    }
    out.iter_mut().for_each(|x| *x = 0.0);
    for (&w, row) in weights.iter().zip(rows.chunks_exact(d.max(1))) {
        for (x, &v) in out.iter_mut().zip(row) {
            *x += w * v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Applies `f` 16 lanes at a time; the tail through masked loads and stores.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn map(xs: &mut [f32], f: impl Fn(__m512) -> __m512) {
        let mut chunks = xs.chunks_exact_mut(16);
        for c in &mut chunks {
            let p = c.as_mut_ptr();
            _mm512_storeu_ps(p, f(_mm512_loadu_ps(p)));
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let mask: __mmask16 = (1u16 << tail.len()) - 1;
            let p = tail.as_mut_ptr();
            _mm512_mask_storeu_ps(p, mask, f(_mm512_maskz_loadu_ps(mask, p)));
        }
    }

    /// Lanes `0..n` of a 16-lane mask (`n ≤ 16`).
    fn first_lanes(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    /// See [`super::scaled_row_dots`]. Four rows at a time, so four independent FMA chains
    /// are in flight; the columns in 16-lane chunks, the last one masked.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scaled_row_dots(q: &[f32], rows: &[f32], scale: f32, out: &mut [f32]) {
        let d = q.len();
        let full = d / 16;
        let tail = first_lanes(d % 16);
        let qp = q.as_ptr();
        let dot = |acc: __m512, r: *const f32, c: usize| {
            _mm512_fmadd_ps(
                _mm512_loadu_ps(qp.add(c * 16)),
                _mm512_loadu_ps(r.add(c * 16)),
                acc,
            )
        };
        let dot_tail = |acc: __m512, r: *const f32| {
            let o = full * 16;
            _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(tail, qp.add(o)),
                _mm512_maskz_loadu_ps(tail, r.add(o)),
                acc,
            )
        };
        let n = out.len();
        let mut j = 0;
        while j + 4 <= n {
            let r = rows.as_ptr().add(j * d);
            let (r0, r1, r2, r3) = (r, r.add(d), r.add(2 * d), r.add(3 * d));
            let mut a = [_mm512_setzero_ps(); 4];
            for c in 0..full {
                a[0] = dot(a[0], r0, c);
                a[1] = dot(a[1], r1, c);
                a[2] = dot(a[2], r2, c);
                a[3] = dot(a[3], r3, c);
            }
            if tail != 0 {
                a[0] = dot_tail(a[0], r0);
                a[1] = dot_tail(a[1], r1);
                a[2] = dot_tail(a[2], r2);
                a[3] = dot_tail(a[3], r3);
            }
            _mm_storeu_ps(
                out.as_mut_ptr().add(j),
                _mm_mul_ps(sum_each_of_four(a), _mm_set1_ps(scale)),
            );
            j += 4;
        }
        while j < n {
            let r = rows.as_ptr().add(j * d);
            let mut acc = _mm512_setzero_ps();
            for c in 0..full {
                acc = dot(acc, r, c);
            }
            if tail != 0 {
                acc = dot_tail(acc, r);
            }
            out[j] = _mm512_reduce_add_ps(acc) * scale;
            j += 1;
        }
    }

    /// The lane sums of four vectors `[Σa₀, Σa₁, Σa₂, Σa₃]`, in 6 shuffles and 4 adds where
    /// four separate reductions take ~24 instructions (at a SmolLM2 head's 64 columns, as
    /// many as the dot products themselves).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn sum_each_of_four(a: [__m512; 4]) -> __m128 {
        // 128-bit quarters: [a0.q0 + a0.q2, a0.q1 + a0.q3, a1.q0 + a1.q2, a1.q1 + a1.q3].
        let half = |x: __m512, y: __m512| {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
            )
        };
        let (s01, s23) = (half(a[0], a[1]), half(a[2], a[3]));
        // Quarter k now holds four partial sums of vector k.
        let s = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(s01, s23),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(s01, s23),
        );
        // Within each quarter: [x0 + x1, x0 + x1, x2 + x3, x2 + x3], then the total everywhere.
        let s = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
        let s = _mm512_add_ps(s, _mm512_permute_ps::<0b01_00_11_10>(s));
        // Element 0 of each quarter.
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, s))
    }

    /// See [`super::weighted_row_sum`]. The output in blocks of up to 64 columns (four
    /// registers), each summed over all rows while it stays in registers; two rows per
    /// iteration into separate accumulators, so eight FMA chains are in flight. No branch
    /// in the loop: a block's masks cover its width, and a masked-off load reads no memory
    /// (AVX-512 suppresses its faults) and gives zeros.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn weighted_row_sum(weights: &[f32], rows: &[f32], out: &mut [f32]) {
        let d = out.len();
        let n = weights.len();
        let mut c0 = 0;
        while c0 < d {
            let width = (d - c0).min(64);
            let masks: [__mmask16; 4] =
                std::array::from_fn(|k| first_lanes(width.saturating_sub(16 * k).min(16)));
            let load = |j: usize, k: usize| {
                // `wrapping_add`: past a narrow block's width the address may lie beyond the
                // slice; its mask is empty, so nothing is read there.
                _mm512_maskz_loadu_ps(masks[k], rows.as_ptr().wrapping_add(j * d + c0 + 16 * k))
            };
            let mut even = [_mm512_setzero_ps(); 4];
            let mut odd = [_mm512_setzero_ps(); 4];
            let mut j = 0;
            while j + 2 <= n {
                let (w0, w1) = (_mm512_set1_ps(weights[j]), _mm512_set1_ps(weights[j + 1]));
                for k in 0..4 {
                    even[k] = _mm512_fmadd_ps(w0, load(j, k), even[k]);
                    odd[k] = _mm512_fmadd_ps(w1, load(j + 1, k), odd[k]);
                }
                j += 2;
            }
            if j < n {
                let w0 = _mm512_set1_ps(weights[j]);
                for (k, acc) in even.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(w0, load(j, k), *acc);
                }
            }
            for k in 0..4 {
                // An empty mask stores nothing (and its loads read nothing and gave zeros).
                let sum = _mm512_add_ps(even[k], odd[k]);
                _mm512_mask_storeu_ps(out.as_mut_ptr().wrapping_add(c0 + 16 * k), masks[k], sum);
            }
            c0 += width;
        }
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn exp(x: __m512) -> __m512 {
        // Past these e^x is inf or 0 in f32; clamping keeps n·ln2 finite (scalef still
        // yields inf / 0). NaN lanes are put back at the end (min/max would drop them).
        let xc = _mm512_max_ps(
            _mm512_min_ps(x, _mm512_set1_ps(89.0)),
            _mm512_set1_ps(-104.0),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        // ln2 = 0.693359375 (exact in 9 bits, so n·hi is exact) − 2.121944400e-4.
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let c = |v: f32| _mm512_set1_ps(v);
        let mut p = c(1.0 / 5040.0);
        for k in [
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ] {
            p = _mm512_fmadd_ps(p, r, c(k));
        }
        let y = _mm512_scalef_ps(p, n);
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_mov_ps(y, nan, x)
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn sigmoid(x: __m512) -> __m512 {
        let one = _mm512_set1_ps(1.0);
        let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_div_ps(one, _mm512_add_ps(one, e))
    }
}
