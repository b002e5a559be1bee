//! `elm::simd` against f64 references: `exp` and `sigmoid` over a dense sweep of their f32
//! range (each tail length of the 16-lane loop included) and at the special values; the
//! lane-split sums against f64 sums; attention's row dots and weighted row sums against f64 at
//! every column tail and row remainder of their blocking.

use elm::simd::{
    dot3, exp_in_place, scaled_row_dots, sigmoid_in_place, sum_of_squares, weighted_row_sum,
};
use rand::{Rng, SeedableRng};

/// Error in units of the f32 spacing at the reference value (subnormal results: of the
/// smallest subnormal).
fn ulps(got: f32, want: f64) -> f64 {
    let spacing = if want.abs() < f32::MIN_POSITIVE as f64 {
        f32::from_bits(1) as f64
    } else {
        // The spacing of f32 values next to `want`.
        let w = want as f32;
        (f32::from_bits(w.to_bits() + 1) as f64 - w as f64).abs()
    };
    (got as f64 - want).abs() / spacing
}

#[test]
fn exp_is_within_two_ulp_of_f64_and_keeps_special_values() {
    let xs: Vec<f32> = (0..400_001)
        .map(|i| -104.0 + i as f32 * (193.0 / 400_000.0))
        .collect();
    for len in [xs.len(), 1, 15, 16, 17, 33] {
        let mut got = xs[..len].to_vec();
        exp_in_place(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = (x as f64).exp();
            if want > f32::MAX as f64 {
                assert_eq!(g, f32::INFINITY, "exp({x})");
                continue;
            }
            assert!(
                ulps(g, want) <= 2.0,
                "exp({x}) = {g}, want {want} ({} ulp)",
                ulps(g, want)
            );
        }
    }
    let mut special = vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-30,
        89.0,
        -150.0,
    ];
    exp_in_place(&mut special);
    assert!(special[0].is_nan());
    assert_eq!(
        &special[1..],
        &[f32::INFINITY, 0.0, 1.0, 1.0, 1.0, f32::INFINITY, 0.0]
    );
}

#[test]
fn sigmoid_is_within_three_ulp_of_f64_and_saturates() {
    let xs: Vec<f32> = (0..200_001)
        .map(|i| -60.0 + i as f32 * (120.0 / 200_000.0))
        .collect();
    let mut got = xs.clone();
    sigmoid_in_place(&mut got);
    for (&x, &g) in xs.iter().zip(&got) {
        let want = 1.0 / (1.0 + (-(x as f64)).exp());
        assert!(ulps(g, want) <= 3.0, "sigmoid({x}) = {g}, want {want}");
    }
    let mut special = vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        200.0,
        -200.0,
        0.0,
    ];
    sigmoid_in_place(&mut special);
    assert!(special[0].is_nan());
    assert_eq!(&special[1..], &[1.0, 0.0, 1.0, 0.0, 0.5]);
}

#[test]
fn lane_split_sums_match_f64_sums_at_every_tail_length() {
    let v = |n: usize, k: f32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.37 + k).sin()) * 3.0)
            .collect()
    };
    for n in [0, 1, 15, 16, 17, 31, 576, 1537] {
        let (a, b, c) = (v(n, 0.1), v(n, 1.3), v(n, 2.9));
        let sq: f64 = a.iter().map(|&x| (x as f64) * (x as f64)).sum();
        let got = sum_of_squares::<f32, f32>(&a) as f64;
        // f32 sums of n positive terms: relative error below n·2⁻²⁴.
        assert!(
            (got - sq).abs() <= sq * (n.max(1) as f64) * 6e-8,
            "n = {n}: {got} vs {sq}"
        );
        let d: f64 = (0..n)
            .map(|i| a[i] as f64 * b[i] as f64 * c[i] as f64)
            .sum();
        let scale: f64 = (0..n)
            .map(|i| (a[i] as f64 * b[i] as f64 * c[i] as f64).abs())
            .sum();
        let got = dot3(&a, &b, &c) as f64;
        assert!(
            (got - d).abs() <= scale * (n.max(1) as f64 + 2.0) * 6e-8,
            "n = {n}: {got} vs {d}"
        );
        // In f64 the same sums are exact to f64 rounding.
        let a64: Vec<f64> = a.iter().map(|&x| x as f64).collect();
        assert!((sum_of_squares::<f64, f64>(&a64) - sq).abs() <= sq * 1e-14);
        // f32 elements summed in f64 (the gradient norm's use).
        assert!((sum_of_squares::<f32, f64>(&a) - sq).abs() <= sq * 1e-14);
    }
}

/// Head widths covering every 16-lane tail and the 64-column blocks (SmolLM2: 64, Gemma 3:
/// 256), row counts covering the four-row and two-row remainders.
const WIDTHS: [usize; 8] = [1, 7, 16, 17, 63, 64, 100, 256];
const ROW_COUNTS: [usize; 7] = [0, 1, 2, 3, 4, 5, 37];

fn uniform(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
}

#[test]
fn attention_row_dots_and_weighted_sums_match_f64() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for d in WIDTHS {
        for n in ROW_COUNTS {
            let q = uniform(&mut rng, d);
            let rows = uniform(&mut rng, n * d);
            let scale = 0.125;
            let mut dots = vec![f32::NAN; n];
            scaled_row_dots(&q, &rows, scale, &mut dots);
            for (j, &got) in dots.iter().enumerate() {
                let row = &rows[j * d..(j + 1) * d];
                let want: f64 = q
                    .iter()
                    .zip(row)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * scale as f64;
                let magnitude: f64 = q
                    .iter()
                    .zip(row)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum::<f64>();
                // Worst-case rounding of summing d products in lanes of 8 or 16 and then
                // across the lanes (≤ d/8 + 8 roundings), relative to the sum of magnitudes.
                let tol = (d as f64 / 8.0 + 8.0) * f32::EPSILON as f64 * magnitude * scale as f64;
                assert!(
                    (got as f64 - want).abs() <= tol,
                    "d={d} n={n} row {j}: {got} vs {want}"
                );
            }
            let weights = uniform(&mut rng, n);
            let mut sum = vec![f32::NAN; d];
            weighted_row_sum(&weights, &rows, &mut sum);
            for (c, &got) in sum.iter().enumerate() {
                let terms = || {
                    weights
                        .iter()
                        .enumerate()
                        .map(|(j, &w)| w as f64 * rows[j * d + c] as f64)
                };
                let want: f64 = terms().sum();
                let magnitude: f64 = terms().map(f64::abs).sum();
                // At most n + 2 roundings along any column's sum.
                let tol = (n as f64 + 2.0) * f32::EPSILON as f64 * magnitude;
                assert!(
                    (got as f64 - want).abs() <= tol,
                    "d={d} n={n} column {c}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
#[should_panic(expected = "scaled_row_dots")]
fn row_dots_refuse_rows_of_the_wrong_length() {
    scaled_row_dots(&[1.0; 4], &[1.0; 7], 1.0, &mut [0.0; 2]);
}
