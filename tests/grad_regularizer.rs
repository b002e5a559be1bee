//! The Hutchinson Jacobian regulariser: its mean equals `‖∂f/∂z‖²_F / D` computed exactly (f64)
//! within the confidence interval of its own variance, its gradient passes finite differences,
//! and bad settings are refused by name; the fixed-point correction loss over the taped iterates.

use elm::autograd::{gradcheck, Tape, Var};
use elm::grad::{jacobian_penalty, ImplicitLayer, JacobianPenalty};
use ndarray::{Array1, Array2, ArrayD, Axis, IxDyn};
use rand::{rngs::StdRng, Rng, SeedableRng};

elm::param_set! {
    /// θ of `f(z, x) = act(W z + U x + b)`.
    struct Params { w, u, b }
}

#[derive(Clone)]
struct Layer {
    tanh: bool,
}

impl ImplicitLayer<f64> for Layer {
    type Params = Params;
    fn forward(&self, t: &mut Tape<f64>, z: Var, x: Var, p: &Params) -> elm::Result<Var> {
        let wz = t.matmul_t(z, p.w, None)?; // [B, D]
        let ux = t.matmul_t(x, p.u, Some(p.b))?; // [B, D]
        let s = t.add(wz, ux)?;
        Ok(if self.tanh { t.tanh(s) } else { s })
    }
}

fn rand2(rng: &mut StdRng, r: usize, c: usize, scale: f64) -> Array2<f64> {
    Array2::from_shape_fn((r, c), |_| rng.gen_range(-1.0..1.0) * scale)
}

/// Exact per-row Jacobians `[B][D, D]` of the layer at `z`.
fn jacobians(
    layer: &Layer,
    w: &Array2<f64>,
    u: &Array2<f64>,
    b: &Array1<f64>,
    z: &Array2<f64>,
    x: &Array2<f64>,
) -> Vec<Array2<f64>> {
    let s = z.dot(&w.t()) + x.dot(&u.t()) + b;
    s.axis_iter(Axis(0))
        .map(|row| {
            let d: Array1<f64> = if layer.tanh {
                row.mapv(|v| 1.0 - v.tanh().powi(2))
            } else {
                Array1::ones(row.len())
            };
            // diag(d) · W
            w * &d.insert_axis(Axis(1))
        })
        .collect()
}

#[test]
fn hutchinson_mean_equals_the_exact_frobenius_norm() {
    let (bsz, d, nx) = (6, 5, 3);
    for tanh in [false, true] {
        let layer = Layer { tanh };
        let mut rng = StdRng::seed_from_u64(if tanh { 2 } else { 1 });
        let (w, u) = (rand2(&mut rng, d, d, 0.6), rand2(&mut rng, d, nx, 1.0));
        let b = Array1::from_shape_fn(d, |_| rng.gen_range(-0.5..0.5));
        let (z, x) = (rand2(&mut rng, bsz, d, 1.0), rand2(&mut rng, bsz, nx, 1.0));
        let js = jacobians(&layer, &w, &u, &b, &z, &x);
        // E‖J v‖² = ‖J‖²_F; Var‖J v‖² = 2 tr((JᵀJ)²) for v ~ N(0, I).
        let exact: f64 = js
            .iter()
            .map(|j| j.iter().map(|v| v * v).sum::<f64>())
            .sum::<f64>()
            / (bsz * d) as f64;
        let var_row: Vec<f64> = js
            .iter()
            .map(|j| {
                let g = j.t().dot(j);
                2.0 * g.iter().map(|v| v * v).sum::<f64>()
            })
            .collect();
        let cfg = JacobianPenalty {
            weight: 1.0,
            probes: 64,
            rel_step: 1e-4,
        };
        let reps = 8;
        let mut total = 0.0;
        for rep in 0..reps {
            let mut t = Tape::<f64>::new();
            let p = Params {
                w: t.param(w.clone().into_dyn()),
                u: t.param(u.clone().into_dyn()),
                b: t.param(b.clone().into_dyn()),
            };
            let xv = t.constant(x.clone().into_dyn());
            let mut prng = StdRng::seed_from_u64(100 + rep);
            let pen = jacobian_penalty(
                &mut t,
                &layer,
                &z.clone().into_dyn(),
                xv,
                &p,
                &cfg,
                &mut prng,
            )
            .unwrap();
            total += t.scalar(pen);
        }
        let estimate = total / reps as f64;
        // The estimate averages N = reps·probes draws per row: its variance is
        // Σ_r Var_r / (N (B·D)²).
        let n = (reps as usize * cfg.probes) as f64;
        let se = (var_row.iter().sum::<f64>() / n).sqrt() / (bsz * d) as f64;
        assert!(
            (estimate - exact).abs() < 4.0 * se + 1e-6 * exact,
            "tanh {tanh}: estimate {estimate} vs exact {exact} (SE {se})"
        );
        assert!(
            se < 0.1 * exact,
            "the interval must say something: SE {se} vs {exact}"
        );
    }
}

#[test]
fn penalty_gradient_passes_finite_differences() {
    let mut rng = StdRng::seed_from_u64(3);
    let (bsz, d, nx) = (3, 4, 2);
    let w = rand2(&mut rng, d, d, 0.5).into_dyn();
    let u = rand2(&mut rng, d, nx, 1.0).into_dyn();
    let b = ArrayD::from_shape_fn(IxDyn(&[d]), |_| rng.gen_range(-0.5..0.5));
    let z = rand2(&mut rng, bsz, d, 1.0).into_dyn();
    let x = rand2(&mut rng, bsz, nx, 1.0).into_dyn();
    let cfg = JacobianPenalty {
        weight: 1.0,
        probes: 2,
        rel_step: 1e-3,
    };
    let layer = Layer { tanh: true };
    let r = gradcheck(
        |t, v| {
            let p = Params {
                w: v[0],
                u: v[1],
                b: v[2],
            };
            let xv = t.constant(x.clone());
            // The same probes at every evaluation: the estimate is a function of θ.
            let mut prng = StdRng::seed_from_u64(7);
            jacobian_penalty(t, &layer, &z, xv, &p, &cfg, &mut prng)
        },
        &[w, u, b],
        1e-6,
    )
    .unwrap();
    assert!(r.max_abs_grad > 1e-3, "{r}");
    assert!(r.max_rel_err < 1e-5, "{r}");
}

#[test]
fn bad_settings_are_refused_by_name() {
    for (cfg, field) in [
        (
            JacobianPenalty {
                weight: -1.0,
                ..Default::default()
            },
            "weight",
        ),
        (
            JacobianPenalty {
                probes: 0,
                ..Default::default()
            },
            "probes",
        ),
        (
            JacobianPenalty {
                rel_step: f64::NAN,
                ..Default::default()
            },
            "rel_step",
        ),
    ] {
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
    }
    let e = serde_json::from_str::<JacobianPenalty>(r#"{"weight": 1, "probs": 2}"#).unwrap_err();
    assert!(e.to_string().contains("probs"), "{e}");
    let cfg: elm::equilibrium::TrainConfig =
        serde_json::from_str(r#"{"jacobian_penalty": {"weight": 0.5}, "spectral_every": 10}"#)
            .unwrap();
    assert_eq!(cfg.jacobian_penalty.probes, 1);
    // Off by default and absent from the serialised config then (stage keys unchanged).
    let plain = serde_json::to_string(&elm::equilibrium::TrainConfig::default()).unwrap();
    assert!(
        !plain.contains("jacobian") && !plain.contains("spectral_every"),
        "{plain}"
    );
}

/// Spectral normalisation: σ̂ converges to the largest singular value (LAPACK SVD) as the kept
/// power-iteration vectors warm up over calls, the normalised matrix then has spectral norm
/// `target`, and its gradient (u, v held) passes finite differences.
#[test]
fn spectral_norm_tracks_sigma_and_normalises() {
    use elm::grad::SpectralNorm;
    use ndarray_linalg::SVD;
    let mut rng = StdRng::seed_from_u64(11);
    let w = rand2(&mut rng, 6, 4, 1.0);
    let (_, s, _) = w.svd(false, false).unwrap();
    let (s1, s2) = (s[0], s[1]);
    let mut sn = SpectralNorm::new(6, 4, 0.9, 5).unwrap();
    let mut err = vec![];
    for _ in 0..60 {
        let mut t = Tape::<f64>::new();
        let wv = t.param(w.clone().into_dyn());
        let out = sn.apply(&mut t, wv).unwrap();
        err.push((sn.sigma().unwrap() - s1).abs() / s1);
        if err.len() == 60 {
            let o = t
                .value(out)
                .clone()
                .into_dimensionality::<ndarray::Ix2>()
                .unwrap();
            let (_, so, _) = o.svd(false, false).unwrap();
            assert!((so[0] - 0.9).abs() < 1e-9, "‖W_sn‖₂ = {}", so[0]);
        }
    }
    // Power iteration converges at rate (σ₂/σ₁)² per call: not slower.
    assert!(err[59] < 1e-10, "{err:?}");
    assert!(
        err[59] <= err[0] * (s2 / s1).powi(2 * 50) + 1e-12,
        "{err:?}"
    );
    // The gradient through σ̂ with u, v held fixed (no further iterations).
    sn.iterations = 0;
    let r = gradcheck(
        |t, v| {
            let mut s = sn.clone();
            let out = s.apply(t, v[0])?;
            let c = t.constant(ArrayD::from_shape_fn(IxDyn(&[6, 4]), |i| {
                (i[0] + 2 * i[1]) as f64 - 3.0
            }));
            let p = t.mul(out, c)?;
            Ok(t.sum(p))
        },
        &[w.clone().into_dyn()],
        1e-6,
    )
    .unwrap();
    assert!(r.max_abs_grad > 1e-3 && r.max_rel_err < 1e-6, "{r}");
    assert!(SpectralNorm::new(0, 4, 1.0, 0).is_err());
    assert!(SpectralNorm::new(3, 4, -1.0, 0)
        .unwrap_err()
        .to_string()
        .contains("target"));
    let mut t = Tape::<f64>::new();
    let z = t.param(ArrayD::zeros(IxDyn(&[6, 4])));
    assert!(
        SpectralNorm::new(6, 4, 1.0, 0)
            .unwrap()
            .apply(&mut t, z)
            .is_err(),
        "zero matrix"
    );
}

#[test]
fn gradcheck_recip() {
    let mut rng = StdRng::seed_from_u64(12);
    let a = ArrayD::from_shape_fn(IxDyn(&[3, 2]), |_| rng.gen_range(0.5..2.0));
    let r = gradcheck(|t, v| Ok(t.recip(v[0])), &[a], 1e-6).unwrap();
    assert!(r.max_abs_grad > 1e-3 && r.max_rel_err < 1e-6, "{r}");
}

/// The fixed-point correction loss is the weighted mean `Σ γ^(n−1−i) L(z_i) / Σ γ^(n−1−i)` over
/// the taped iterates (checked against iterates recomputed here without the tape), its gradient
/// through the unrolled iterates passes finite differences, the iterated rules report one taped
/// iterate per taped step with the output last, and a bad γ is refused by name.
#[test]
fn fixed_point_correction_weighs_every_taped_iterate() {
    use elm::grad::{
        fixed_point_correction, implicit_forward, DeqConfig, FixedPointCorrection, GradientRule,
    };
    let mut rng = StdRng::seed_from_u64(5);
    let (bsz, d, nx, k) = (3, 4, 2, 4);
    let w = rand2(&mut rng, d, d, 0.5);
    let u = rand2(&mut rng, d, nx, 1.0);
    let b = Array1::from_shape_fn(d, |_| rng.gen_range(-0.5..0.5));
    let x = rand2(&mut rng, bsz, nx, 1.0);
    let target = rand2(&mut rng, bsz, d, 0.5);
    let z0 = ArrayD::<f64>::zeros(IxDyn(&[bsz, d]));
    let cfg = FixedPointCorrection { gamma: 0.5 };
    let layer = Layer { tanh: true };
    let deq = DeqConfig::new(GradientRule::Unroll { k });
    let sq_err = |t: &mut Tape<f64>, z: Var| -> elm::Result<Var> {
        let tv = t.constant(target.clone().into_dyn());
        let e = t.sub(z, tv)?;
        let e2 = t.mul(e, e)?;
        Ok(t.sum(e2))
    };
    let run = |t: &mut Tape<f64>, v: &[Var]| -> elm::Result<Var> {
        let p = Params {
            w: v[0],
            u: v[1],
            b: v[2],
        };
        let xv = t.constant(x.clone().into_dyn());
        let (z, rep) = implicit_forward(t, &layer, xv, &p, &z0, &deq)?;
        assert_eq!(rep.taped_iterates.len(), k);
        assert_eq!(rep.taped_iterates.last(), Some(&z));
        fixed_point_correction(t, &rep.taped_iterates, &cfg, sq_err)
    };
    let inputs = [
        w.clone().into_dyn(),
        u.clone().into_dyn(),
        b.clone().into_dyn(),
    ];
    let mut tape = Tape::<f64>::new();
    let vars: Vec<Var> = inputs.iter().map(|a| tape.param(a.clone())).collect();
    let out = run(&mut tape, &vars).unwrap();
    // By hand: z_{i+1} = tanh(W z_i + U x + b), weights γ^(k−1−i).
    let (mut z, mut num, mut den) = (Array2::<f64>::zeros((bsz, d)), 0.0, 0.0);
    for i in 0..k {
        z = (z.dot(&w.t()) + x.dot(&u.t()) + &b).mapv(f64::tanh);
        let wt = 0.5f64.powi((k - 1 - i) as i32);
        num += wt * (&z - &target).mapv(|e| e * e).sum();
        den += wt;
    }
    let got = tape.scalar(out);
    assert!(
        (got - num / den).abs() < 1e-12 * (1.0 + got.abs()),
        "{got} vs {}",
        num / den
    );

    let r = gradcheck(run, &inputs, 1e-6).unwrap();
    assert!(r.max_abs_grad > 1e-3, "{r}");
    assert!(r.max_rel_err < 1e-6, "{r}");

    // Stochastic JFB: one iterate per drawn taped step.
    let sjfb = DeqConfig::new(GradientRule::StochasticJfb {
        no_grad: [0, 2],
        grad: [1, 3],
        seed: 9,
    });
    let mut t = Tape::<f64>::new();
    let v: Vec<Var> = inputs.iter().map(|a| t.param(a.clone())).collect();
    let p = Params {
        w: v[0],
        u: v[1],
        b: v[2],
    };
    let xv = t.constant(x.clone().into_dyn());
    let (_, rep) = implicit_forward(&mut t, &layer, xv, &p, &z0, &sjfb).unwrap();
    assert_eq!(rep.taped_iterates.len(), rep.sampled.unwrap().1);

    let bad = FixedPointCorrection { gamma: 1.5 };
    let e = fixed_point_correction(&mut t, &rep.taped_iterates, &bad, sq_err).unwrap_err();
    assert!(
        e.to_string().contains("fixed_point_correction.gamma"),
        "{e}"
    );
    let e = fixed_point_correction(&mut t, &[], &cfg, sq_err).unwrap_err();
    assert!(e.to_string().contains("no taped iterates"), "{e}");
}
