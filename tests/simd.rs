//! `elm::simd` against f64 references: `exp` and `sigmoid` over a dense sweep of their f32
//! range (each tail length of the 16-lane loop included) and at the special values.

use elm::simd::{exp_in_place, sigmoid_in_place};

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
