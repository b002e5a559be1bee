//! Tests for `elm::grad`: gradient rules on the DEQ z = tanh(W z + U x + b) in f64 against the
//! exact implicit gradient from a dense solve of (I − J)ᵀ u = g (ndarray-linalg), itself checked
//! against central finite differences of the converged fixed point.

use elm::autograd::{Tape, Var};
use elm::grad::{implicit_forward, DeqConfig, GradientRule, ImplicitDriver, ImplicitLayer};
use elm::solver::{SolverConfig, StopCriteria};
use ndarray::{Array1, Array2, ArrayD, Axis};
use ndarray_linalg::{Norm, Solve, SVD};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

#[path = "../examples/support/adaptive_picard.rs"]
mod adaptive_picard;

elm::param_set! {
    /// W [D, D], U [D, Dx], b [D].
    struct TanhParams { w, u, b }
}

/// z = tanh(z·Wᵀ + x·Uᵀ + b).
#[derive(Clone)]
struct TanhDeq;

impl<T: elm::autograd::AdFloat> ImplicitLayer<T> for TanhDeq {
    type Params = TanhParams;
    fn forward(&self, t: &mut Tape<T>, z: Var, x: Var, p: &TanhParams) -> elm::Result<Var> {
        let wz = t.matmul_t(z, p.w, None)?;
        let ux = t.matmul_t(x, p.u, Some(p.b))?;
        let s = t.add(wz, ux)?;
        Ok(t.tanh(s))
    }
}

const B: usize = 3;
const D: usize = 10;
const DX: usize = 4;

/// A seeded problem: W with ‖W‖₂ = `w_norm`, U, b, x, and the loss weights c (L = Σ c ⊙ z*).
struct Problem {
    w: Array2<f64>,
    u: Array2<f64>,
    b: Array1<f64>,
    x: Array2<f64>,
    c: Array2<f64>,
}

fn randn(rng: &mut StdRng, r: usize, c: usize) -> Array2<f64> {
    Array2::from_shape_fn((r, c), |_| StandardNormal.sample(rng))
}

fn problem(seed: u64, w_norm: f64) -> Problem {
    let mut rng = StdRng::seed_from_u64(seed);
    let w = randn(&mut rng, D, D);
    let (_, s, _) = w.svd(false, false).unwrap();
    let w = w * (w_norm / s[0]);
    let u = randn(&mut rng, D, DX) * 0.5;
    let b = randn(&mut rng, 1, D).row(0).to_owned() * 0.3;
    let x = randn(&mut rng, B, DX);
    let c = randn(&mut rng, B, D);
    Problem { w, u, b, x, c }
}

/// Fixed point by plain iteration to machine precision (contraction, ‖W‖₂ < 1).
fn dense_fixed_point(p: &Problem) -> Array2<f64> {
    let pre_x = p.x.dot(&p.u.t()) + &p.b;
    let mut z = Array2::<f64>::zeros((B, D));
    for _ in 0..2000 {
        let zn = (z.dot(&p.w.t()) + &pre_x).mapv(f64::tanh);
        let diff = (&zn - &z).norm_l2();
        z = zn;
        if diff < 1e-16 {
            break;
        }
    }
    z
}

/// Exact IFT gradients of L = Σ c ⊙ z*: per row u = (I − Jᵀ)⁻¹ c, J = diag(1 − z²) W.
struct Exact {
    dw: Array2<f64>,
    du: Array2<f64>,
    db: Array1<f64>,
    dx: Array2<f64>,
}

fn exact_grads(p: &Problem) -> Exact {
    let z = dense_fixed_point(p);
    let mut ex = Exact {
        dw: Array2::zeros((D, D)),
        du: Array2::zeros((D, DX)),
        db: Array1::zeros(D),
        dx: Array2::zeros((B, DX)),
    };
    for r in 0..B {
        let s = z.row(r).mapv(|v| 1.0 - v * v);
        let j = Array2::from_shape_fn((D, D), |(i, k)| s[i] * p.w[[i, k]]);
        let a = Array2::<f64>::eye(D) - j.t();
        let u = a.solve(&p.c.row(r).to_owned()).unwrap();
        let su = &s * &u; // ∂L/∂(pre-activation)
        let col = su.view().insert_axis(Axis(1));
        ex.dw = ex.dw + col.dot(&z.row(r).insert_axis(Axis(0)));
        ex.du = ex.du + col.dot(&p.x.row(r).insert_axis(Axis(0)));
        ex.db += &su;
        ex.dx.row_mut(r).assign(&p.u.t().dot(&su));
    }
    ex
}

fn loss_at(p: &Problem) -> f64 {
    (dense_fixed_point(p) * &p.c).sum()
}

/// The rule with forward solver and stopping `fwd`.
fn deq(rule: &GradientRule, fwd: &(SolverConfig, StopCriteria)) -> DeqConfig {
    DeqConfig::new(rule.clone()).with_forward(fwd.0.clone(), fwd.1.clone())
}

struct Got {
    dw: ArrayD<f64>,
    du: ArrayD<f64>,
    db: ArrayD<f64>,
    dx: ArrayD<f64>,
    report: elm::grad::GradReport,
}

/// Runs `rule` on the tape (x is a param so dL/dx is checked too) and returns the gradients.
fn tape_grads(p: &Problem, rule: &GradientRule, driver: Option<&mut ImplicitDriver<f64>>) -> Got {
    tape_grads_with(p, rule, driver, SolverConfig::anderson())
}

/// [`tape_grads`] with `forward` as the forward solver.
fn tape_grads_with(
    p: &Problem,
    rule: &GradientRule,
    driver: Option<&mut ImplicitDriver<f64>>,
    forward: SolverConfig,
) -> Got {
    let mut tape = Tape::<f64>::new();
    let w = tape.param(p.w.clone().into_dyn());
    let u = tape.param(p.u.clone().into_dyn());
    let b = tape.param(p.b.clone().into_dyn());
    let x = tape.param(p.x.clone().into_dyn());
    let c = tape.constant(p.c.clone().into_dyn());
    let z0 = ArrayD::zeros(vec![B, D]);
    let fwd = (
        forward,
        elm::solver::StopCriteria {
            rel_tol: 1e-13,
            max_iter: 500,
            ..Default::default()
        },
    );
    let (z, report) = match driver {
        Some(d) => d
            .forward(&mut tape, &TanhDeq, x, &TanhParams { w, u, b }, &z0)
            .unwrap(),
        None => implicit_forward(
            &mut tape,
            &TanhDeq,
            x,
            &TanhParams { w, u, b },
            &z0,
            &deq(rule, &fwd),
        )
        .unwrap(),
    };
    let zc = tape.mul(z, c).unwrap();
    let loss = tape.sum(zc);
    let mut g = tape.backward(loss).unwrap();
    Got {
        dw: g.take(w).unwrap(),
        du: g.take(u).unwrap(),
        db: g.take(b).unwrap(),
        dx: g.take(x).unwrap(),
        report,
    }
}

fn flat(ex: &Exact) -> Vec<f64> {
    ex.dw
        .iter()
        .chain(ex.du.iter())
        .chain(ex.db.iter())
        .chain(ex.dx.iter())
        .copied()
        .collect()
}
fn flat_got(g: &Got) -> Vec<f64> {
    g.dw.iter()
        .chain(g.du.iter())
        .chain(g.db.iter())
        .chain(g.dx.iter())
        .copied()
        .collect()
}
fn rel_err(a: &[f64], b: &[f64]) -> (f64, f64) {
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    let max_abs = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    (diff / nb, max_abs)
}
fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn dense_reference_matches_finite_differences() {
    // The dense IFT formula itself is checked against f64 central differences of the solved fixed point.
    let p = problem(1, 0.8);
    let ex = exact_grads(&p);
    let h = 1e-6;
    let mut worst: f64 = 0.0;
    for (i, k) in [(0, 0), (3, 7), (9, 2)] {
        let mut pp = problem(1, 0.8);
        pp.w[[i, k]] += h;
        let lp = loss_at(&pp);
        pp.w[[i, k]] -= 2.0 * h;
        let lm = loss_at(&pp);
        let fd = (lp - lm) / (2.0 * h);
        worst = worst.max((fd - ex.dw[[i, k]]).abs() / ex.dw[[i, k]].abs().max(1e-3));
    }
    for i in [0, 5] {
        let mut pp = problem(1, 0.8);
        pp.b[i] += h;
        let lp = loss_at(&pp);
        pp.b[i] -= 2.0 * h;
        let fd = (lp - loss_at(&pp)) / (2.0 * h);
        worst = worst.max((fd - ex.db[i]).abs() / ex.db[i].abs().max(1e-3));
    }
    assert!(
        worst < 1e-6,
        "dense IFT vs finite differences: max rel diff {worst:e}"
    );
}

#[test]
fn implicit_gradient_matches_dense_solve_for_every_backward_solver() {
    let p = problem(2, 0.9);
    let ex = flat(&exact_grads(&p));
    // Every built-in, and a solver written outside the library (forward and backward).
    let custom = SolverConfig::custom(adaptive_picard::AdaptivePicard::default());
    let solvers = elm::solver::BUILTIN_SOLVERS
        .iter()
        .map(|n| SolverConfig::by_name(n).unwrap())
        .chain([custom.clone()]);
    for solver in solvers {
        let name = solver.name();
        let forward = if solver == custom {
            custom.clone()
        } else {
            SolverConfig::anderson()
        };
        let rule = GradientRule::implicit(solver, 1e-12, 500);
        let got = tape_grads_with(&p, &rule, None, forward);
        let (rel, max_abs) = rel_err(&flat_got(&got), &ex);
        let back = got.report.backward.get().expect("backward report filled");
        println!("implicit/{name}: rel err {rel:e}, max abs {max_abs:e}, backward iters {}, residual {:e}", back.iterations, back.residual);
        assert!(
            rel < 1e-6,
            "implicit/{name}: rel err {rel:e} (max abs diff {max_abs:e})"
        );
        assert!(
            back.converged() && back.fallback_rows == 0,
            "{name}: {back:?}"
        );
        assert!(got.report.forward_converged());
        assert_eq!(back.solver, name);
        assert!(
            back.replayed_graph,
            "built-in ops should allow recording f once"
        );
    }
}

#[test]
fn anderson_and_broyden_backward_need_fewer_vjps_than_picard() {
    // Not a tuned number: just the ordering the accelerated solvers must achieve on ‖J‖ ≈ 0.97.
    let p = problem(3, 0.97);
    let its: Vec<usize> = [
        SolverConfig::picard(),
        SolverConfig::anderson(),
        SolverConfig::broyden(),
    ]
    .into_iter()
    .map(|s| {
        tape_grads(&p, &GradientRule::implicit(s, 1e-10, 2000), None)
            .report
            .backward
            .get()
            .unwrap()
            .iterations
    })
    .collect();
    println!("backward iterations picard/anderson/broyden: {its:?}");
    assert!(its[1] < its[0] && its[2] < its[0], "{its:?}");
}

#[test]
fn unroll_converges_to_implicit_gradient() {
    let p = problem(4, 0.8);
    let ex = flat(&exact_grads(&p));
    let mut errs = vec![];
    for k in [1, 2, 4, 8, 16, 32, 64, 128] {
        let got = tape_grads(&p, &GradientRule::Unroll { k }, None);
        assert_eq!(got.report.tape_applications, k);
        errs.push(rel_err(&flat_got(&got), &ex).0);
    }
    println!("unroll rel errors k=1..128: {errs:?}");
    for w in errs.windows(2) {
        assert!(
            w[1] < w[0] * 1.05 || w[1] < 1e-10,
            "not decreasing: {errs:?}"
        );
    }
    assert!(
        errs[0] > 1e-2,
        "k = 1 should be far from the IFT gradient: {errs:?}"
    );
    assert!(
        *errs.last().unwrap() < 1e-8,
        "k = 128 should match the IFT gradient: {errs:?}"
    );
}

#[test]
fn jfb_has_positive_cosine_with_true_gradient() {
    for seed in [5, 6, 7] {
        let p = problem(seed, 0.6); // ‖J‖₂ ≤ ‖W‖₂ = 0.6 < 1
        let ex = flat(&exact_grads(&p));
        let got = tape_grads(&p, &GradientRule::Jfb, None);
        let cos = cosine(&flat_got(&got), &ex);
        println!("seed {seed}: cos(JFB, IFT) = {cos:.4}");
        assert!(cos > 0.0, "cosine {cos}");
        assert_eq!(got.report.tape_applications, 1);
        assert!(got.report.forward_converged());
        assert!(got.report.forward_residual < 1e-10);
        // JFB is not the true gradient (it drops (I − J)⁻ᵀ).
        assert!(rel_err(&flat_got(&got), &ex).0 > 1e-3);
    }
}

#[test]
fn stochastic_jfb_is_reproducible_and_seed_dependent() {
    let p = problem(8, 0.8);
    let rule = |seed| GradientRule::StochasticJfb {
        no_grad: [0, 4],
        grad: [1, 4],
        seed,
    };
    let fwd = SolverConfig::anderson();
    let run = |seed: u64| {
        let mut d = ImplicitDriver::<f64>::new(
            DeqConfig::new(rule(seed)).with_forward(fwd.clone(), StopCriteria::default()),
        )
        .unwrap();
        (0..6)
            .map(|_| tape_grads(&p, &rule(seed), Some(&mut d)))
            .collect::<Vec<_>>()
    };
    let a = run(11);
    let b = run(11);
    let c = run(12);
    let mn = |v: &Vec<Got>| {
        v.iter()
            .map(|g| g.report.sampled.unwrap())
            .collect::<Vec<_>>()
    };
    println!("seed 11 (m, n): {:?}; seed 12: {:?}", mn(&a), mn(&c));
    assert_eq!(mn(&a), mn(&b));
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            flat_got(x),
            flat_got(y),
            "same seed must give identical gradients"
        );
    }
    assert_ne!(mn(&a), mn(&c), "another seed should draw other (m, n)");
    assert!(a.iter().zip(&c).any(|(x, y)| flat_got(x) != flat_got(y)));
    for g in a.iter().chain(&c) {
        let (m, n) = g.report.sampled.unwrap();
        assert!(m <= 4 && (1..=4).contains(&n));
        assert_eq!(g.report.tape_applications, n);
        assert_eq!(g.report.nograd_evals, m);
        assert_eq!(g.report.forward_iterations, m + n);
    }
    // The draws vary across calls of one driver (a fresh stream per step would repeat them).
    assert!(mn(&a).windows(2).any(|w| w[0] != w[1]));
    // implicit_forward (no driver) draws the same (m, n) every call.
    let s1 = tape_grads(&p, &rule(11), None).report.sampled;
    let s2 = tape_grads(&p, &rule(11), None).report.sampled;
    assert_eq!(s1, s2);
}

#[test]
fn stochastic_jfb_equals_unrolling_n_steps_from_the_untaped_iterate() {
    // Independent composition check: SJFB(m, n) == Unroll{n} started at f^m(z0) computed by hand.
    let p = problem(9, 0.8);
    let rule = GradientRule::StochasticJfb {
        no_grad: [3, 3],
        grad: [2, 2],
        seed: 0,
    };
    let sj = tape_grads(&p, &rule, None);
    assert_eq!(sj.report.sampled, Some((3, 2)));
    let pre_x = p.x.dot(&p.u.t()) + &p.b;
    let mut zm = Array2::<f64>::zeros((B, D));
    for _ in 0..3 {
        zm = (zm.dot(&p.w.t()) + &pre_x).mapv(f64::tanh);
    }
    let mut tape = Tape::<f64>::new();
    let (w, u, b, x) = (
        tape.param(p.w.clone().into_dyn()),
        tape.param(p.u.clone().into_dyn()),
        tape.param(p.b.clone().into_dyn()),
        tape.param(p.x.clone().into_dyn()),
    );
    let mut z = tape.constant(zm.into_dyn());
    for _ in 0..2 {
        z = ImplicitLayer::<f64>::forward(&TanhDeq, &mut tape, z, x, &TanhParams { w, u, b })
            .unwrap();
    }
    let c = tape.constant(p.c.clone().into_dyn());
    let zc = tape.mul(z, c).unwrap();
    let loss = tape.sum(zc);
    let mut g = tape.backward(loss).unwrap();
    let manual: Vec<f64> = [w, u, b, x]
        .iter()
        .flat_map(|&v| g.take(v).unwrap().into_iter())
        .collect();
    let (rel, max_abs) = rel_err(&flat_got(&sj), &manual);
    assert!(rel < 1e-12, "rel {rel:e}, max abs {max_abs:e}");
}

#[test]
fn failed_backward_solve_falls_back_to_jfb() {
    let p = problem(10, 0.9);
    // Two adjoint iterations cannot reach 1e-12: every row falls back to u = g, i.e. JFB.
    let rule = GradientRule::implicit(SolverConfig::picard(), 1e-12, 2);
    let got = tape_grads(&p, &rule, None);
    let back = got.report.backward.get().unwrap();
    assert_eq!(back.fallback_rows, B);
    assert!(!back.converged());
    let jfb = tape_grads(&p, &GradientRule::Jfb, None);
    let (rel, _) = rel_err(&flat_got(&got), &flat_got(&jfb));
    assert!(rel < 1e-9, "fallback should equal JFB: rel {rel:e}");
}

#[test]
fn f32_implicit_gradient_close_to_f64_reference() {
    let p = problem(13, 0.8);
    let ex = flat(&exact_grads(&p));
    let mut tape = Tape::<f32>::new();
    let f = |a: &Array2<f64>| a.mapv(|v| v as f32).into_dyn();
    let w = tape.param(f(&p.w));
    let u = tape.param(f(&p.u));
    let b = tape.param(p.b.mapv(|v| v as f32).into_dyn());
    let x = tape.param(f(&p.x));
    let c = tape.constant(f(&p.c));
    let rule = GradientRule::implicit(SolverConfig::anderson(), 1e-6, 200);
    let fwd = (SolverConfig::anderson(), StopCriteria::default());
    let (z, _) = implicit_forward(
        &mut tape,
        &TanhDeq,
        x,
        &TanhParams { w, u, b },
        &ArrayD::zeros(vec![B, D]),
        &deq(&rule, &fwd),
    )
    .unwrap();
    let zc = tape.mul(z, c).unwrap();
    let loss = tape.sum(zc);
    let mut g = tape.backward(loss).unwrap();
    let got: Vec<f64> = [w, u, b, x]
        .iter()
        .flat_map(|&v| g.take(v).unwrap().into_iter().map(|q| q as f64))
        .collect();
    let (rel, max_abs) = rel_err(&got, &ex);
    assert!(
        rel < 1e-4,
        "f32 IFT vs f64 exact: rel {rel:e}, max abs {max_abs:e}"
    );
}

#[test]
fn frozen_params_get_no_gradient_but_input_does() {
    let p = problem(14, 0.8);
    let mut tape = Tape::<f64>::new();
    let w = tape.constant(p.w.clone().into_dyn());
    let u = tape.param(p.u.clone().into_dyn());
    let b = tape.constant(p.b.clone().into_dyn());
    let x = tape.param(p.x.clone().into_dyn());
    let rule = GradientRule::implicit(SolverConfig::anderson(), 1e-12, 200);
    let fwd = (SolverConfig::anderson(), StopCriteria::default());
    let (z, _) = implicit_forward(
        &mut tape,
        &TanhDeq,
        x,
        &TanhParams { w, u, b },
        &ArrayD::zeros(vec![B, D]),
        &deq(&rule, &fwd),
    )
    .unwrap();
    let c = tape.constant(p.c.clone().into_dyn());
    let zc = tape.mul(z, c).unwrap();
    let loss = tape.sum(zc);
    let g = tape.backward(loss).unwrap();
    assert!(g.get(w).is_none() && g.get(b).is_none());
    let ex = exact_grads(&p);
    let (rel_u, _) = rel_err(
        g.get(u).unwrap().as_slice().unwrap(),
        ex.du.as_slice().unwrap(),
    );
    let (rel_x, _) = rel_err(
        g.get(x).unwrap().as_slice().unwrap(),
        ex.dx.as_slice().unwrap(),
    );
    assert!(
        rel_u < 1e-6 && rel_x < 1e-6,
        "du rel {rel_u:e}, dx rel {rel_x:e}"
    );
}

#[test]
fn rules_serde_round_trip_and_validation() {
    let rules = vec![
        GradientRule::Unroll { k: 5 },
        GradientRule::Jfb,
        GradientRule::sjfb_default(8, 3),
        GradientRule::implicit(SolverConfig::broyden(), 1e-6, 50),
    ];
    for r in &rules {
        let s = serde_json::to_string(r).unwrap();
        assert_eq!(&GradientRule::from_json(&s).unwrap(), r, "{s}");
    }
    assert_eq!(
        GradientRule::sjfb_default(8, 0),
        GradientRule::StochasticJfb {
            no_grad: [0, 4],
            grad: [1, 4],
            seed: 0
        }
    );
    let parsed = GradientRule::from_json(
        r#"{"kind":"implicit","solver":{"kind":"anderson","history":3},"stop":{"rel_tol":1e-8,"max_iter":40}}"#,
    )
    .unwrap();
    assert_eq!(parsed.name(), "implicit");
    // One config for the whole layer: forward solver + its stopping + rule (with its backward).
    let deq = DeqConfig::from_json(
        r#"{"forward_solver":{"kind":"broyden"},"forward_stop":{"abs_tol":1e-9,"rel_tol":0,"max_iter":60},"gradient":{"kind":"jfb"}}"#,
    )
    .unwrap();
    assert_eq!(deq.forward_solver.name(), "broyden");
    assert_eq!(deq.forward_stop, StopCriteria::absolute(1e-9, 60));
    assert_eq!(deq.gradient, GradientRule::Jfb);
    for bad in [
        r#"{"gradient":{"kind":"jfb"},"bogus":1}"#,
        r#"{"forward_solver":{"kind":"anderson","stop":{"max_iter":3}},"gradient":{"kind":"jfb"}}"#,
        r#"{"forward_stop":{"max_iter":0},"gradient":{"kind":"jfb"}}"#,
        r#"{"forward_solver":{"kind":"anderson"}}"#,
    ] {
        let e = DeqConfig::from_json(bad);
        assert!(
            matches!(
                e,
                Err(elm::ElmError::Json { .. }) | Err(elm::ElmError::Config { .. })
            ),
            "{bad} → {e:?}"
        );
    }
    for bad in [
        r#"{"kind":"jfb","k":3}"#,
        r#"{"kind":"unroll","k":0}"#,
        r#"{"kind":"unroll"}"#,
        r#"{"kind":"stochastic_jfb","no_grad":[3,1],"grad":[1,4],"seed":0}"#,
        r#"{"kind":"stochastic_jfb","no_grad":[0,4],"grad":[0,4],"seed":0}"#,
        r#"{"kind":"implicit","solver":{"kind":"anderson"},"stop":{"rel_tol":0,"max_iter":40}}"#,
        r#"{"kind":"implicit","solver":{"kind":"anderson","bogus":1},"stop":{"rel_tol":1e-6}}"#,
        r#"{"kind":"implicit","solver":{"kind":"anderson"},"tol":1e-8,"max_iter":40}"#,
        r#"{"kind":"newton"}"#,
    ] {
        let e = GradientRule::from_json(bad);
        assert!(
            matches!(
                e,
                Err(elm::ElmError::Json { .. }) | Err(elm::ElmError::Config { .. })
            ),
            "{bad} → {e:?}"
        );
    }
}

#[test]
fn bad_inputs_give_typed_errors() {
    let mut tape = Tape::<f64>::new();
    let x = tape.constant(ArrayD::zeros(vec![2, DX]));
    let w = tape.param(ArrayD::zeros(vec![D, D]));
    let u = tape.param(ArrayD::zeros(vec![D, DX]));
    let b = tape.param(ArrayD::zeros(vec![D]));
    let fwd = (SolverConfig::picard(), StopCriteria::default());
    // 1-D state.
    let r = implicit_forward(
        &mut tape,
        &TanhDeq,
        x,
        &TanhParams { w, u, b },
        &ArrayD::zeros(vec![D]),
        &deq(&GradientRule::Jfb, &fwd),
    );
    assert!(
        matches!(r, Err(elm::ElmError::Shape { .. })),
        "{:?}",
        r.err()
    );
    // NaN start.
    let mut z0 = ArrayD::zeros(vec![2, D]);
    z0[[1, 3]] = f64::NAN;
    let r = implicit_forward(
        &mut tape,
        &TanhDeq,
        x,
        &TanhParams { w, u, b },
        &z0,
        &deq(&GradientRule::Jfb, &fwd),
    );
    assert!(matches!(r, Err(elm::ElmError::NonFinite(_))));
    // Wrong state width for the layer.
    let r = implicit_forward(
        &mut tape,
        &TanhDeq,
        x,
        &TanhParams { w, u, b },
        &ArrayD::zeros(vec![2, D + 1]),
        &deq(&GradientRule::Unroll { k: 2 }, &fwd),
    );
    assert!(r.is_err());
}

#[test]
fn token_shaped_state_matches_row_problem() {
    // State [1, T=3, D] (one sequence of 3 tokens): the solver sees one row of width 3·D; the
    // gradient must equal the dense exact one of the same 3 tokens treated as rows.
    let p = problem(15, 0.85);
    let ex = flat(&exact_grads(&p));
    let mut tape = Tape::<f64>::new();
    let w = tape.param(p.w.clone().into_dyn());
    let u = tape.param(p.u.clone().into_dyn());
    let b = tape.param(p.b.clone().into_dyn());
    let x = tape.param(
        p.x.clone()
            .into_shape_with_order((1, B, DX))
            .unwrap()
            .into_dyn(),
    );
    let c = tape.constant(
        p.c.clone()
            .into_shape_with_order((1, B, D))
            .unwrap()
            .into_dyn(),
    );
    for solver in [SolverConfig::picard(), SolverConfig::broyden()] {
        let rule = GradientRule::implicit(solver, 1e-12, 500);
        let fwd = (
            SolverConfig::anderson(),
            elm::solver::StopCriteria {
                rel_tol: 1e-13,
                max_iter: 500,
                ..Default::default()
            },
        );
        let mut t2 = Tape::<f64>::new();
        let (w2, u2, b2, x2, c2) = (
            t2.param(tape.value(w).clone()),
            t2.param(tape.value(u).clone()),
            t2.param(tape.value(b).clone()),
            t2.param(tape.value(x).clone()),
            t2.constant(tape.value(c).clone()),
        );
        let (z, rep) = implicit_forward(
            &mut t2,
            &TanhDeq,
            x2,
            &TanhParams {
                w: w2,
                u: u2,
                b: b2,
            },
            &ArrayD::zeros(vec![1, B, D]),
            &deq(&rule, &fwd),
        )
        .unwrap();
        assert_eq!(t2.value(z).shape(), &[1, B, D]);
        assert_eq!(rep.forward_rows.as_ref().unwrap().len(), 1);
        let zc = t2.mul(z, c2).unwrap();
        let loss = t2.sum(zc);
        let mut g = t2.backward(loss).unwrap();
        let got: Vec<f64> = [w2, u2, b2, x2]
            .iter()
            .flat_map(|&v| g.take(v).unwrap().into_iter())
            .collect();
        let (rel, max_abs) = rel_err(&got, &ex);
        assert!(
            rel < 1e-6,
            "[1, T, D] state: rel {rel:e}, max abs {max_abs:e}"
        );
    }
}

/// Same map with tanh as a run-once custom op: its graph cannot be replayed by `vjp_retain`,
/// so the implicit backward must fall back to one scratch forward per VJP.
#[derive(Clone)]
struct TanhDeqCustomOp;

impl ImplicitLayer<f64> for TanhDeqCustomOp {
    type Params = TanhParams;
    fn forward(&self, t: &mut Tape<f64>, z: Var, x: Var, p: &TanhParams) -> elm::Result<Var> {
        let wz = t.matmul_t(z, p.w, None)?;
        let ux = t.matmul_t(x, p.u, Some(p.b))?;
        let s = t.add(wz, ux)?;
        let y = t.value(s).mapv(f64::tanh);
        let dy = y.mapv(|v| 1.0 - v * v);
        Ok(t.custom(
            &[s],
            y,
            Box::new(move |g: &ArrayD<f64>| Ok(vec![Some(g * &dy)])),
        ))
    }
}

#[test]
fn implicit_gradient_with_non_replayable_layer() {
    let p = problem(16, 0.9);
    let ex = flat(&exact_grads(&p));
    let mut tape = Tape::<f64>::new();
    let w = tape.param(p.w.clone().into_dyn());
    let u = tape.param(p.u.clone().into_dyn());
    let b = tape.param(p.b.clone().into_dyn());
    let x = tape.param(p.x.clone().into_dyn());
    let c = tape.constant(p.c.clone().into_dyn());
    let rule = GradientRule::implicit(SolverConfig::anderson(), 1e-12, 500);
    let fwd = (
        SolverConfig::anderson(),
        elm::solver::StopCriteria {
            rel_tol: 1e-13,
            max_iter: 500,
            ..Default::default()
        },
    );
    let (z, rep) = implicit_forward(
        &mut tape,
        &TanhDeqCustomOp,
        x,
        &TanhParams { w, u, b },
        &ArrayD::zeros(vec![B, D]),
        &deq(&rule, &fwd),
    )
    .unwrap();
    let zc = tape.mul(z, c).unwrap();
    let loss = tape.sum(zc);
    let mut g = tape.backward(loss).unwrap();
    let got: Vec<f64> = [w, u, b, x]
        .iter()
        .flat_map(|&v| g.take(v).unwrap().into_iter())
        .collect();
    let (rel, max_abs) = rel_err(&got, &ex);
    assert!(
        rel < 1e-6,
        "custom-op layer: rel {rel:e}, max abs {max_abs:e}"
    );
    let back = rep.backward.get().unwrap();
    assert!(back.converged());
    assert!(
        !back.replayed_graph,
        "a run-once custom op cannot be replayed"
    );
}

/// A rule of each kind; the match is exhaustive, so a new kind does not compile until it has one.
fn example_rule(kind: elm::grad::GradientRuleKind) -> GradientRule {
    use elm::grad::GradientRuleKind as K;
    match kind {
        K::Unroll => GradientRule::Unroll { k: 3 },
        K::Jfb => GradientRule::Jfb,
        K::StochasticJfb => GradientRule::sjfb_default(8, 1),
        K::Implicit => GradientRule::implicit(SolverConfig::anderson(), 1e-6, 40),
        K::Phantom => GradientRule::phantom(4, 0.5),
    }
}

/// Every gradient rule kind round-trips through its name (`FromStr`, `Display`) and its JSON
/// form, and a rule of that kind through JSON with that name as its `kind` tag, iterating the
/// library's one list (`GradientRuleKind::ALL`).
#[test]
fn every_gradient_rule_round_trips_through_its_name_and_json() {
    use elm::grad::GradientRuleKind;
    use elm::registry::Registry;
    for kind in GradientRuleKind::ALL {
        let name = kind.name();
        assert_eq!(name.parse::<GradientRuleKind>().unwrap(), kind, "{name}");
        assert_eq!(kind.to_string(), name);
        let json = serde_json::to_string(&kind).unwrap();
        assert_eq!(json, format!("\"{name}\""));
        assert_eq!(
            serde_json::from_str::<GradientRuleKind>(&json).unwrap(),
            kind
        );
        let rule = example_rule(kind);
        assert_eq!(rule.kind(), kind);
        assert_eq!(rule.name(), name);
        let v = serde_json::to_value(&rule).unwrap();
        assert_eq!(v["kind"], name, "{v}");
        assert_eq!(GradientRule::from_json(&v.to_string()).unwrap(), rule);
    }
    let names = GradientRuleKind::names();
    let unique: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(unique.len(), names.len());
    let e = "nope".parse::<GradientRuleKind>().unwrap_err().to_string();
    assert!(
        e.contains("unroll, jfb, stochastic_jfb, implicit or phantom"),
        "{e}"
    );
}
