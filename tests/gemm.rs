//! The AVX-512 GEMM against an f64 reference computed here: random shapes including odd sizes
//! and sizes that are not multiples of the micro-tile, every transpose of A and B, α/β, strided
//! C, and extreme values (NaN/inf propagate as in the reference, β = 0 never reads C).

mod common;

use elm::gemm::{detected_kernel, sgemm_with, GemmKernel};
use ndarray::{s, Array2, ArrayView2};
use rand::{rngs::StdRng, Rng, SeedableRng};

// Every test of this file runs alone (`common::one_at_a_time`):
// `precision_switch_selects_the_kernel` flips the process-wide precision that `sgemm` and the
// frozen-weight packer read, so no sibling test may multiply meanwhile.

/// Whether this CPU runs the AVX-512 f32 kernel (without it `sgemm_with` runs BLAS in its
/// place); if not, the skip policy of tests/common/skip.rs: a test that claims the kernel fails
/// under CI or `ELM_REQUIRE_REAL_MODEL=1`, elsewhere it skips (its AVX-512 part).
fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    let has = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let has = false;
    common::require(
        "AVX-512",
        has,
        "this CPU has no AVX-512F (the AVX-512 kernel would run as BLAS)",
    )
}

/// [`avx512`] for the bf16 kernel (AVX-512 BF16).
fn avx512_bf16() -> bool {
    common::require(
        "AVX-512 BF16",
        elm::gemm::has_avx512_bf16(),
        "this CPU has no AVX-512 BF16",
    )
}

/// BLAS, and the AVX-512 kernel where [`avx512`] has it.
fn kernels_to_check() -> Vec<GemmKernel> {
    let mut k = vec![GemmKernel::Blas];
    if avx512() {
        k.push(GemmKernel::Avx512);
    }
    k
}

fn reference(
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &Array2<f32>,
) -> Array2<f64> {
    let (m, k) = a.dim();
    let n = b.ncols();
    Array2::from_shape_fn((m, n), |(i, j)| {
        let dot: f64 = (0..k).map(|p| a[[i, p]] as f64 * b[[p, j]] as f64).sum();
        let prior = if beta == 0.0 {
            0.0
        } else {
            beta as f64 * c[[i, j]] as f64
        };
        alpha as f64 * dot + prior
    })
}

/// Both kernels on one problem, each within f32 rounding of the f64 reference:
/// |err| ≤ 4·K·ε·(|α|·Σ|a||b| + |β c|).
#[allow(clippy::too_many_arguments)]
fn check(
    kernels: &[GemmKernel],
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
    alpha: f32,
    beta: f32,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rand =
        |r: usize, c: usize| Array2::from_shape_fn((r, c), |_| rng.gen_range(-2.0f32..2.0));
    let a_store = if ta { rand(k, m) } else { rand(m, k) };
    let b_store = if tb { rand(n, k) } else { rand(k, n) };
    let c0 = rand(m, n);
    let a = if ta { a_store.t() } else { a_store.view() };
    let b = if tb { b_store.t() } else { b_store.view() };
    let want = reference(alpha, &a, &b, beta, &c0);
    let abs = reference(
        alpha.abs(),
        &a.mapv(f32::abs).view(),
        &b.mapv(f32::abs).view(),
        beta.abs(),
        &c0.mapv(f32::abs),
    );
    for &kernel in kernels {
        let mut c = c0.clone();
        sgemm_with(kernel, alpha, &a, &b, beta, &mut c.view_mut());
        for ((i, j), &got) in c.indexed_iter() {
            let tol = 4.0 * (k as f64 + 2.0) * f32::EPSILON as f64 * abs[[i, j]] + 1e-30;
            assert!(
                (got as f64 - want[[i, j]]).abs() <= tol,
                "{kernel:?} [{m},{k}]x[{k},{n}] ta={ta} tb={tb} α={alpha} β={beta} at ({i},{j}): {got} vs {}",
                want[[i, j]]
            );
        }
    }
}

#[test]
fn random_shapes_transposes_alpha_beta_match_the_f64_reference() {
    let _alone = common::one_at_a_time();
    let mut rng = StdRng::seed_from_u64(7);
    println!("kernel on this machine: {:?}", detected_kernel());
    let kernels = kernels_to_check();
    // Tile edges (12 x 32), K-block edges (256) and sizes that only just pass the size cut.
    let fixed = [
        (12, 256, 32),
        (13, 257, 33),
        (1, 700, 1000),
        (300, 5, 70),
        (97, 513, 129),
        (256, 576, 576),
    ];
    for (t, &(m, k, n)) in fixed.iter().enumerate() {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            check(&kernels, m, k, n, ta, tb, 1.0, 0.0, t as u64);
        }
    }
    for t in 0..24 {
        let (m, k, n) = (
            rng.gen_range(1..200),
            rng.gen_range(1..600),
            rng.gen_range(1..300),
        );
        let (alpha, beta) = [(1.0, 0.0), (0.5, 1.0), (-1.5, 0.25), (2.0, -1.0)][t % 4];
        check(
            &kernels,
            m,
            k,
            n,
            rng.gen(),
            rng.gen(),
            alpha,
            beta,
            100 + t as u64,
        );
    }
}

#[test]
fn strided_output_and_extreme_values() {
    let _alone = common::one_at_a_time();
    if !avx512() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(3);
    let (m, k, n) = (40, 300, 70);
    let a = Array2::from_shape_fn((m, k), |_| rng.gen_range(-1.0f32..1.0));
    let b = Array2::from_shape_fn((k, n), |_| rng.gen_range(-1.0f32..1.0));
    // C as every other column of a wider buffer, and as a transposed view.
    let mut wide = Array2::<f32>::from_elem((m, 2 * n), 7.0);
    let mut want = Array2::<f32>::zeros((m, n));
    sgemm_with(
        GemmKernel::Blas,
        1.0,
        &a.view(),
        &b.view(),
        0.0,
        &mut want.view_mut(),
    );
    sgemm_with(
        GemmKernel::Avx512,
        1.0,
        &a.view(),
        &b.view(),
        0.0,
        &mut wide.slice_mut(s![.., ..;2]),
    );
    let got = wide.slice(s![.., ..;2]);
    assert!(got
        .iter()
        .zip(want.iter())
        .all(|(g, w)| (g - w).abs() <= 1e-4 * (1.0 + w.abs())));
    assert!(
        wide.slice(s![.., 1..;2]).iter().all(|&x| x == 7.0),
        "columns in between untouched"
    );
    let mut ct = Array2::<f32>::zeros((n, m));
    sgemm_with(
        GemmKernel::Avx512,
        1.0,
        &a.view(),
        &b.view(),
        0.0,
        &mut ct.view_mut().reversed_axes(),
    );
    assert!(ct
        .t()
        .iter()
        .zip(want.iter())
        .all(|(g, w)| (g - w).abs() <= 1e-4 * (1.0 + w.abs())));

    // β = 0 overwrites a NaN-filled C; NaN and inf in A reach exactly the rows they touch.
    let mut c = Array2::<f32>::from_elem((m, n), f32::NAN);
    let mut a2 = a.clone();
    a2[[3, 10]] = f32::NAN;
    a2[[5, 0]] = f32::INFINITY;
    sgemm_with(
        GemmKernel::Avx512,
        1.0,
        &a2.view(),
        &b.view(),
        0.0,
        &mut c.view_mut(),
    );
    for i in 0..m {
        let row = c.row(i);
        match i {
            3 => assert!(row.iter().all(|x| x.is_nan())),
            5 => assert!(row.iter().all(|x| x.is_infinite() || x.is_nan())),
            _ => assert!(row.iter().all(|x| x.is_finite()), "row {i}"),
        }
    }
    // Large magnitudes: no overflow where the reference has none.
    let big = a.mapv(|x| x * 1e18);
    let mut c = Array2::<f32>::zeros((m, n));
    sgemm_with(
        GemmKernel::Avx512,
        1.0,
        &big.view(),
        &b.view(),
        0.0,
        &mut c.view_mut(),
    );
    assert!(c
        .iter()
        .zip(want.iter())
        .all(|(g, w)| (g / 1e18 - w).abs() <= 1e-3 * (1.0 + w.abs())));
}

/// The bf16 kernel equals the f64 product of the inputs rounded to bf16 by `half` (an
/// independent round-to-nearest-even), within f32 accumulation error: so it rounds each input
/// exactly once and sums in f32. And it stays within bf16's own error of the f32 product.
#[test]
fn bf16_kernel_is_the_exact_product_of_bf16_rounded_inputs() {
    let _alone = common::one_at_a_time();
    if !avx512_bf16() {
        return;
    }
    let round = |x: f32| half::bf16::from_f32(x).to_f32();
    let mut rng = StdRng::seed_from_u64(11);
    for t in 0..16 {
        // Products of at least 16·64·64 multiply-adds: smaller ones stay on the f32 path.
        let (m, k, n) = (
            rng.gen_range(16..150),
            rng.gen_range(64..600),
            rng.gen_range(64..200),
        );
        let (m, k, n) = if t == 0 { (13, 257, 33) } else { (m, k, n) };
        let (ta, tb): (bool, bool) = (rng.gen(), rng.gen());
        let (alpha, beta) = [(1.0, 0.0), (0.5, 1.0), (-1.5, 0.25)][t % 3];
        let a_store = Array2::from_shape_fn(if ta { (k, m) } else { (m, k) }, |_| {
            rng.gen_range(-3.0f32..3.0)
        });
        let b_store = Array2::from_shape_fn(if tb { (n, k) } else { (k, n) }, |_| {
            rng.gen_range(-3.0f32..3.0)
        });
        let c0 = Array2::from_shape_fn((m, n), |_| rng.gen_range(-1.0f32..1.0));
        let a = if ta { a_store.t() } else { a_store.view() };
        let b = if tb { b_store.t() } else { b_store.view() };
        let (ar, br) = (a.mapv(round), b.mapv(round));
        let want = reference(alpha, &ar.view(), &br.view(), beta, &c0);
        let abs = reference(
            alpha.abs(),
            &ar.mapv(f32::abs).view(),
            &br.mapv(f32::abs).view(),
            beta.abs(),
            &c0.mapv(f32::abs),
        );
        let exact = reference(alpha, &a, &b, beta, &c0);
        let mut c = c0.clone();
        sgemm_with(
            GemmKernel::Avx512Bf16,
            alpha,
            &a,
            &b,
            beta,
            &mut c.view_mut(),
        );
        for ((i, j), &got) in c.indexed_iter() {
            let tol = 4.0 * (k as f64 + 2.0) * f32::EPSILON as f64 * abs[[i, j]] + 1e-30;
            let err = (got as f64 - want[[i, j]]).abs();
            assert!(
                err <= tol,
                "[{m},{k}]x[{k},{n}] ({i},{j}): {got} vs {} (tol {tol})",
                want[[i, j]]
            );
            // Two roundings of relative 2^-9 per product term.
            let bf = 2.0 * 2f64.powi(-8) * abs[[i, j]] + tol;
            assert!((got as f64 - exact[[i, j]]).abs() <= bf);
        }
    }
    // NaN stays NaN through the rounding, inf stays inf; values past bf16's range round to inf.
    let mut a = Array2::<f32>::from_elem((40, 64), 1.0);
    a[[0, 0]] = f32::NAN;
    a[[1, 0]] = f32::INFINITY;
    a[[2, 0]] = f32::MAX;
    let b = Array2::<f32>::from_elem((64, 40), 1.0);
    let mut c = Array2::<f32>::zeros((40, 40));
    sgemm_with(
        GemmKernel::Avx512Bf16,
        1.0,
        &a.view(),
        &b.view(),
        0.0,
        &mut c.view_mut(),
    );
    assert!(c.row(0).iter().all(|x| x.is_nan()));
    assert!(c.row(1).iter().all(|&x| x == f32::INFINITY));
    assert!(c.row(2).iter().all(|&x| x == f32::INFINITY));
    assert!(c.row(3).iter().all(|&x| x == 64.0));
}

/// `--precision bf16` is a process-wide switch that `sgemm` follows, and `f32` turns it off.
#[test]
fn precision_switch_selects_the_kernel() {
    let _alone = common::one_at_a_time();
    use elm::gemm::{precision, set_precision, sgemm, Precision};
    assert_eq!("bf16".parse::<Precision>().unwrap(), Precision::Bf16);
    assert!("fp8"
        .parse::<Precision>()
        .unwrap_err()
        .to_string()
        .contains("precision"));
    if !elm::gemm::has_avx512_bf16() {
        let e = set_precision(Precision::Bf16).unwrap_err();
        assert!(e.to_string().contains("avx512_bf16"), "{e}");
        return;
    }
    // 1 + 2^-9 is not a bf16 value (it rounds to 1): the bf16 product shows it, f32 does not.
    let a = Array2::<f32>::from_elem((64, 64), 1.0 + 2f32.powi(-9));
    let b = Array2::<f32>::from_elem((64, 64), 1.0);
    let run = || {
        let mut c = Array2::<f32>::zeros((64, 64));
        sgemm(1.0, &a.view(), &b.view(), 0.0, &mut c.view_mut());
        c[[0, 0]]
    };
    let exact = 64.0 * (1.0 + 2f32.powi(-9));
    set_precision(Precision::Bf16).unwrap();
    assert_eq!(precision(), Precision::Bf16);
    assert_eq!(run(), 64.0);
    // The scoped override (central differences) computes in f32 and restores bf16 after,
    // also when its closure panics.
    assert!((elm::gemm::with_f32_products(run) - exact).abs() < 1e-4);
    assert_eq!(precision(), Precision::Bf16);
    let unwound = std::panic::catch_unwind(|| elm::gemm::with_f32_products(|| panic!("inside")));
    assert!(unwound.is_err());
    assert_eq!(precision(), Precision::Bf16);
    set_precision(Precision::F32).unwrap();
    assert!((run() - exact).abs() < 1e-4);
}

/// A weight registered as frozen is packed once, on its first product, and every product
/// reading it (first and later, either layout, parts of it split over threads by rows or by
/// columns, several K and N blocks) equals the one that packs it each time, bit for bit; once
/// the registration is dropped products pack again and still agree.
#[test]
fn frozen_weights_are_packed_once_and_give_the_same_product() {
    let _alone = common::one_at_a_time();
    use elm::gemm::FrozenWeights;
    let mut kernels = vec![];
    if detected_kernel() == GemmKernel::Avx512 {
        kernels.push(GemmKernel::Avx512);
    }
    if elm::gemm::has_avx512_bf16() {
        kernels.push(GemmKernel::Avx512Bf16);
    }
    if !common::require(
        "AVX-512",
        !kernels.is_empty(),
        "this CPU has no AVX-512 (frozen weights only serve its kernels)",
    ) {
        return;
    }
    let mut rng = StdRng::seed_from_u64(21);
    // (M, K, N): split over N; split over M; two K blocks and two N blocks (KC 256, NC 2048);
    // all of A packed at once (the few-rows order) in the first three, not in the last (too
    // long a K for it).
    for (m, k, n) in [
        (13, 300, 70),
        (300, 70, 45),
        (75, 577, 2100),
        (20, 12000, 40),
    ] {
        for tb in [false, true] {
            let w = Array2::from_shape_fn(if tb { (n, k) } else { (k, n) }, |_| {
                rng.gen_range(-2.0f32..2.0)
            });
            let a = Array2::from_shape_fn((m, k), |_| rng.gen_range(-2.0f32..2.0));
            let b = if tb { w.t() } else { w.view() };
            for &kernel in &kernels {
                // β ≠ 0 on a C of its own values: the first K block scales it, later ones add.
                let c0 =
                    |cols| Array2::from_shape_fn((m, cols), |(i, j)| (i * 7 + j) as f32 * 0.01);
                let product = || {
                    let mut c = c0(n);
                    sgemm_with(kernel, 1.5, &a.view(), &b, -0.5, &mut c.view_mut());
                    c
                };
                let plain = product();
                let mut frozen = FrozenWeights::new();
                frozen.borrow(&w);
                assert_eq!(
                    frozen.packed_bytes(),
                    0,
                    "nothing is packed before a product"
                );
                assert_eq!(
                    product(),
                    plain,
                    "{kernel:?} [{m},{k}]x[{k},{n}] tb={tb}, first"
                );
                let packed = frozen.packed_bytes();
                let padded_n = n.div_ceil(32) * 32;
                let depth = match kernel {
                    GemmKernel::Avx512Bf16 => (0..k)
                        .step_by(256)
                        .map(|p| (k - p).min(256).div_ceil(2))
                        .sum(),
                    _ => k,
                };
                assert_eq!(
                    packed,
                    (4 * padded_n * depth) as u64,
                    "{kernel:?}: one packed form"
                );
                assert_eq!(
                    product(),
                    plain,
                    "{kernel:?} [{m},{k}]x[{k},{n}] tb={tb}, reused"
                );
                assert_eq!(frozen.packed_bytes(), packed, "reuse packs nothing more");
                // A part of the weight (its first columns of B) is a view of its own.
                let part = b.slice(s![.., ..n / 2]);
                let mut c = c0(n / 2);
                sgemm_with(kernel, 1.5, &a.view(), &part, -0.5, &mut c.view_mut());
                assert_eq!(
                    c,
                    plain.slice(s![.., ..n / 2]),
                    "{kernel:?}: a part of a frozen weight"
                );
                drop(frozen);
                assert_eq!(product(), plain, "{kernel:?}: after the registration ends");
            }
        }
    }
    // Shared through an Arc: kept alive by the registration.
    let w = std::sync::Arc::new(
        Array2::from_shape_fn((64, 96), |(i, j)| (i * 3 + j) as f32 * 0.01).into_dyn(),
    );
    let a = Array2::from_shape_fn((40, 96), |(i, j)| (i + j) as f32 * 0.02);
    let w2 = w.view().into_dimensionality::<ndarray::Ix2>().unwrap();
    let mut plain = Array2::<f32>::zeros((40, 64));
    sgemm_with(
        kernels[0],
        1.0,
        &a.view(),
        &w2.t(),
        0.0,
        &mut plain.view_mut(),
    );
    let mut frozen = FrozenWeights::new();
    frozen.share(&w);
    let mut c = Array2::<f32>::zeros((40, 64));
    sgemm_with(kernels[0], 1.0, &a.view(), &w2.t(), 0.0, &mut c.view_mut());
    assert_eq!(c, plain);
    assert!(frozen.packed_bytes() > 0);
}
