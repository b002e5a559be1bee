//! The implicit rule's backward linear solvers (GMRES, BiCGStab, truncated Neumann, and the
//! fixed-point adjoint they sit beside), its `on_failure` policy, and phantom gradients, in f64
//! against the exact IFT gradient from a dense solve of `(I − J)ᵀ u = g` per row
//! (ndarray-linalg), on two layers whose Jacobian is formed exactly: the linear layer
//! `z = W z + U x + b` with `W` the solver crate's canonical `A` of spectral radius ρ (so `J = W`),
//! and `z = tanh(W z + U x + b)` (`J = diag(1 − z²) W`, not symmetric).

use elm::autograd::Tape;
use elm::grad::{implicit_forward, BackwardFailure, DeqConfig, GradReport, GradientRule};
use elm::solver::problems::LinearProblem;
use elm::solver::{LinearSolverConfig, RowStatus, SolverConfig, StopCriteria};
use elm::ElmError;
use ndarray::{s, Array1, Array2, ArrayD, Axis};
use ndarray_linalg::{Eigh, Norm, Solve, SVD, UPLO};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

#[path = "../examples/support/linear_deq.rs"]
mod linear_deq;
use linear_deq::{LinearDeq, Params, TanhDeq};

const DX: usize = 4;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Linear,
    Tanh,
}

/// A seeded problem: the layer's W, U, b, inputs x and loss weights c (L = Σ c ⊙ z*).
#[derive(Clone)]
struct Problem {
    kind: Kind,
    w: Array2<f64>,
    u: Array2<f64>,
    b: Array1<f64>,
    x: Array2<f64>,
    c: Array2<f64>,
}

fn randn(rng: &mut StdRng, r: usize, c: usize) -> Array2<f64> {
    Array2::from_shape_fn((r, c), |_| StandardNormal.sample(rng))
}

fn rest(kind: Kind, w: Array2<f64>, batch: usize, seed: u64) -> Problem {
    let d = w.nrows();
    let mut rng = StdRng::seed_from_u64(seed);
    let u = randn(&mut rng, d, DX) * 0.5;
    let b = randn(&mut rng, 1, d).row(0).to_owned() * 0.3;
    let x = randn(&mut rng, batch, DX);
    let c = randn(&mut rng, batch, d);
    Problem {
        kind,
        w,
        u,
        b,
        x,
        c,
    }
}

/// The linear layer with W = the canonical symmetric A of spectral radius exactly ρ.
fn linear_problem(d: usize, rho: f64, batch: usize, seed: u64) -> Problem {
    let w = LinearProblem::new(d, rho, 1, seed).unwrap().a;
    rest(Kind::Linear, w, batch, seed + 1)
}

/// The tanh layer with a Gaussian W of spectral norm `w_norm`.
fn tanh_problem(d: usize, w_norm: f64, batch: usize, seed: u64) -> Problem {
    let mut rng = StdRng::seed_from_u64(seed);
    let w = randn(&mut rng, d, d);
    let (_, sv, _) = w.svd(false, false).unwrap();
    let w = w * (w_norm / sv[0]);
    rest(Kind::Tanh, w, batch, seed + 1)
}

impl Problem {
    fn batch(&self) -> usize {
        self.x.nrows()
    }
    fn dim(&self) -> usize {
        self.w.nrows()
    }
    /// The fixed point: a dense solve (linear) or the contraction iterated to machine precision.
    fn fixed_point(&self) -> Array2<f64> {
        let pre_x = self.x.dot(&self.u.t()) + &self.b;
        match self.kind {
            Kind::Linear => {
                let m = Array2::<f64>::eye(self.dim()) - &self.w;
                let mut z = Array2::zeros(pre_x.dim());
                for r in 0..self.batch() {
                    z.row_mut(r)
                        .assign(&m.solve(&pre_x.row(r).to_owned()).unwrap());
                }
                z
            }
            Kind::Tanh => {
                let mut z = Array2::<f64>::zeros(pre_x.dim());
                for _ in 0..5000 {
                    let zn = (z.dot(&self.w.t()) + &pre_x).mapv(f64::tanh);
                    let diff = (&zn - &z).norm_l2();
                    z = zn;
                    if diff < 1e-16 {
                        break;
                    }
                }
                z
            }
        }
    }
    /// `∂f/∂(pre-activation)` per row: 1 (linear) or 1 − z² (tanh).
    fn slope(&self, z: &Array2<f64>) -> Array2<f64> {
        match self.kind {
            Kind::Linear => Array2::ones(z.dim()),
            Kind::Tanh => z.mapv(|v| 1.0 - v * v),
        }
    }
    /// Gradients (W, U, b, x flattened) for adjoints `u` [B, D] at the fixed point `z`.
    fn grads_from_adjoint(&self, z: &Array2<f64>, u: &Array2<f64>) -> Vec<f64> {
        let su = &self.slope(z) * u; // ∂L/∂(pre-activation) [B, D]
        let dw = su.t().dot(z);
        let du = su.t().dot(&self.x);
        let db = su.sum_axis(Axis(0));
        let dx = su.dot(&self.u);
        dw.iter()
            .chain(du.iter())
            .chain(db.iter())
            .chain(dx.iter())
            .copied()
            .collect()
    }
    /// J = ∂f/∂z of row r at z.
    fn jacobian(&self, z: &Array2<f64>, r: usize) -> Array2<f64> {
        let s = self.slope(z);
        Array2::from_shape_fn(self.w.dim(), |(i, k)| s[[r, i]] * self.w[[i, k]])
    }
    /// Exact IFT gradients: per row u = (I − J)⁻ᵀ c, a dense solve.
    fn exact(&self) -> Vec<f64> {
        let z = self.fixed_point();
        let mut u = Array2::zeros(z.dim());
        for r in 0..self.batch() {
            let a = Array2::<f64>::eye(self.dim()) - self.jacobian(&z, r).t();
            u.row_mut(r)
                .assign(&a.solve(&self.c.row(r).to_owned()).unwrap());
        }
        self.grads_from_adjoint(&z, &u)
    }
}

/// Runs `rule` on the tape from the exact fixed point (so the forward solve stops at once and
/// only the gradient rule is measured); returns the gradients, or the backward's error, and
/// the rule's report.
fn run(p: &Problem, rule: &GradientRule) -> (elm::Result<Vec<f64>>, GradReport) {
    let deq = DeqConfig::new(rule.clone())
        .with_forward(SolverConfig::anderson(), StopCriteria::relative(1e-13, 500));
    let z0 = p.fixed_point().into_dyn();
    let mut tape = Tape::<f64>::new();
    let w = tape.param(p.w.clone().into_dyn());
    let u = tape.param(p.u.clone().into_dyn());
    let b = tape.param(p.b.clone().into_dyn());
    let x = tape.param(p.x.clone().into_dyn());
    let c = tape.constant(p.c.clone().into_dyn());
    let params = Params { w, u, b };
    let (z, report) = match p.kind {
        Kind::Linear => implicit_forward(&mut tape, &LinearDeq, x, &params, &z0, &deq),
        Kind::Tanh => implicit_forward(&mut tape, &TanhDeq, x, &params, &z0, &deq),
    }
    .unwrap();
    assert!(report.forward_converged());
    let zc = tape.mul(z, c).unwrap();
    let loss = tape.sum(zc);
    let grads = tape.backward(loss).map(|mut g| {
        [w, u, b, x]
            .iter()
            .flat_map(|&v| g.take(v).unwrap().into_iter())
            .collect()
    });
    (grads, report)
}

fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt();
    d / b.iter().map(|y| y * y).sum::<f64>().sqrt()
}

fn norm(a: &[f64]) -> f64 {
    a.iter().map(|v| v * v).sum::<f64>().sqrt()
}

fn implicit(solver: impl Into<LinearSolverConfig>, rel_tol: f64, max_iter: usize) -> GradientRule {
    GradientRule::implicit(solver, rel_tol, max_iter)
}

/// The backward solvers compared: four Krylov/series methods (CGNR's `J·v` by central
/// differences of the layer) and two fixed-point ones.
fn backward_solvers() -> Vec<LinearSolverConfig> {
    vec![
        LinearSolverConfig::gmres(30),
        LinearSolverConfig::bicgstab(),
        LinearSolverConfig::cgnr(),
        LinearSolverConfig::neumann(50_000),
        SolverConfig::picard().into(),
        SolverConfig::anderson().into(),
    ]
}

/// `tol`, or 1e-9 for CGNR: its `J·v` by central differences carries a relative error of about
/// 1e-11 in f64, below which the normal equations' residual stagnates.
fn tolerance(name: &str, tol: f64) -> f64 {
    if name == "cgnr" {
        tol.max(1e-9)
    } else {
        tol
    }
}

fn setup() {
    // The dense references call OpenBLAS from several test threads.
    elm::model::ops::set_blas_threads(1);
}

#[test]
fn every_backward_solver_gives_the_exact_ift_gradient_on_the_canonical_linear_problems() {
    setup();
    for rho in [0.5, 0.9, 0.99] {
        let p = linear_problem(40, rho, 3, 7);
        let exact = p.exact();
        let mut vjps = vec![];
        for solver in backward_solvers() {
            let name = solver.name();
            let (g, rep) = run(&p, &implicit(solver, tolerance(name, 1e-11), 50_000));
            let err = rel_err(&g.unwrap(), &exact);
            let back = rep.backward.get().unwrap();
            println!(
                "ρ={rho} {name:>9}: {:>5} VJPs (per row max {:>5}), gradient rel. error {err:.2e}",
                back.vjp_evals, back.iterations
            );
            assert!(back.converged(), "{name} ρ={rho}: {back:?}");
            assert_eq!(back.solver, name);
            assert!(back.replayed_graph);
            assert!(err < 1e-7, "{name} ρ={rho}: rel error {err:e}");
            vjps.push((name, back.iterations));
        }
        if rho == 0.99 {
            let get = |n: &str| vjps.iter().find(|(m, _)| *m == n).unwrap().1;
            // The fixed-point adjoint contracts by ρ per VJP: ln(1e-11)/ln(0.99) ≈ 2500.
            assert!(get("picard") > 1000, "{vjps:?}");
            assert!(get("gmres") * 5 < get("picard"), "{vjps:?}");
            assert!(get("bicgstab") * 5 < get("picard"), "{vjps:?}");
        }
    }
}

#[test]
fn krylov_backward_gives_the_exact_ift_gradient_on_a_tanh_layer() {
    setup();
    let p = tanh_problem(12, 0.9, 3, 2);
    let exact = p.exact();
    for solver in backward_solvers() {
        let name = solver.name();
        let (g, rep) = run(&p, &implicit(solver, tolerance(name, 1e-12), 5000));
        let err = rel_err(&g.unwrap(), &exact);
        let back = rep.backward.get().unwrap();
        println!("tanh {name}: {} VJPs, rel. error {err:.2e}", back.vjp_evals);
        assert!(back.converged(), "{name}: {back:?}");
        assert!(err < 1e-8, "{name}: rel error {err:e}");
    }
}

#[test]
fn f32_krylov_backward_is_close_to_the_f64_reference() {
    setup();
    let p = tanh_problem(12, 0.8, 3, 13);
    let exact = p.exact();
    for solver in [
        LinearSolverConfig::gmres(10),
        LinearSolverConfig::bicgstab(),
        LinearSolverConfig::cgnr(),
    ] {
        // CGNR's central-difference J·v carries ~eps^(2/3) ≈ 4e-5 relative error in f32.
        let (tol, allowed) = if solver.name() == "cgnr" {
            (1e-4, 1e-3)
        } else {
            (1e-6, 1e-4)
        };
        let mut tape = Tape::<f32>::new();
        let f = |a: &Array2<f64>| a.mapv(|v| v as f32).into_dyn();
        let w = tape.param(f(&p.w));
        let u = tape.param(f(&p.u));
        let b = tape.param(p.b.mapv(|v| v as f32).into_dyn());
        let x = tape.param(f(&p.x));
        let c = tape.constant(f(&p.c));
        let deq = DeqConfig::new(implicit(solver.clone(), tol, 200))
            .with_forward(SolverConfig::anderson(), StopCriteria::default());
        let z0 = ArrayD::zeros(vec![p.batch(), p.dim()]);
        let (z, rep) =
            implicit_forward(&mut tape, &TanhDeq, x, &Params { w, u, b }, &z0, &deq).unwrap();
        let zc = tape.mul(z, c).unwrap();
        let loss = tape.sum(zc);
        let mut g = tape.backward(loss).unwrap();
        let got: Vec<f64> = [w, u, b, x]
            .iter()
            .flat_map(|&v| g.take(v).unwrap().into_iter().map(|q| q as f64))
            .collect();
        let err = rel_err(&got, &exact);
        assert!(rep.backward.get().unwrap().converged());
        println!("f32 {}: rel. error {err:.2e}", solver.name());
        assert!(
            err < allowed,
            "{}: f32 vs f64 exact rel {err:e}",
            solver.name()
        );
    }
}

#[test]
fn too_few_backward_iterations_follow_the_policy_never_zeros() {
    setup();
    let p = tanh_problem(12, 0.9, 3, 10);
    let exact = p.exact();
    let rows: Vec<usize> = (0..p.batch()).collect();
    let (jfb, _) = run(&p, &GradientRule::Jfb);
    let jfb = jfb.unwrap();
    let jfb_err = rel_err(&jfb, &exact);
    for solver in [
        LinearSolverConfig::gmres(30),
        LinearSolverConfig::bicgstab(),
        LinearSolverConfig::neumann(100),
        SolverConfig::picard().into(),
    ] {
        let name = solver.name();
        let rule = implicit(solver, 1e-12, 2);
        // jfb (the default): every row falls back to u = g and is counted.
        let (g, rep) = run(&p, &rule);
        let g = g.unwrap();
        let back = rep.backward.get().unwrap();
        assert!(!back.converged(), "{name}");
        assert_eq!(back.on_failure, BackwardFailure::Jfb);
        assert_eq!(back.failed_rows, rows, "{name}");
        assert_eq!(back.fallback_rows, p.batch(), "{name}");
        assert!(back
            .rows
            .iter()
            .all(|r| r.status == RowStatus::MaxIter && r.iterations <= 2));
        assert!(rel_err(&g, &jfb) < 1e-12, "{name}: fallback must equal JFB");
        assert!(norm(&g) > 0.1 * norm(&exact), "{name}: not a zero gradient");
        // error: the tape's backward returns the typed error naming the rows; the report is kept.
        let (g, rep) = run(&p, &rule.clone().with_on_failure(BackwardFailure::Error));
        match g {
            Err(ElmError::BackwardSolve {
                method,
                rows: bad,
                detail,
            }) => {
                assert_eq!(method, name);
                assert_eq!(bad, rows);
                assert!(detail.contains("MaxIter"), "{detail}");
            }
            other => panic!("{name}: expected BackwardSolve, got {other:?}"),
        }
        let back = rep.backward.get().unwrap();
        assert_eq!((back.fallback_rows, back.kept_rows), (0, 0));
        assert_eq!(back.failed_rows, rows);
        // keep: the unconverged iterates are used (and counted): finite, not JFB, not zero.
        let (g, rep) = run(&p, &rule.with_on_failure(BackwardFailure::Keep));
        let g = g.unwrap();
        let back = rep.backward.get().unwrap();
        assert_eq!(
            (back.fallback_rows, back.kept_rows),
            (0, p.batch()),
            "{name}"
        );
        assert!(g.iter().all(|v| v.is_finite()));
        assert!(rel_err(&g, &jfb) > 1e-6, "{name}: kept iterate equals JFB");
        let err = rel_err(&g, &exact);
        println!("{name} after 2 VJPs: kept iterate error {err:.3e}, JFB error {jfb_err:.3e}");
        assert!(
            err < jfb_err,
            "{name}: 2 VJPs should beat u = g ({err:e} vs {jfb_err:e})"
        );
    }
    let e = ElmError::BackwardSolve {
        method: "gmres".into(),
        rows: vec![1],
        detail: String::new(),
    };
    assert_eq!(e.kind(), "backward_solve");
}

#[test]
fn truncated_neumann_kept_is_the_partial_series() {
    setup();
    // Linear layer (J = W): three terms kept give u = c + Wᵀc + (Wᵀ)²c exactly.
    let p = linear_problem(20, 0.9, 2, 3);
    let rule = implicit(LinearSolverConfig::neumann(3), 1e-12, 1000)
        .with_on_failure(BackwardFailure::Keep);
    let (g, rep) = run(&p, &rule);
    let back = rep.backward.get().unwrap();
    assert_eq!(back.kept_rows, 2);
    assert!(back
        .rows
        .iter()
        .all(|r| r.status == RowStatus::MaxIter && r.iterations == 3));
    let t1 = p.c.dot(&p.w);
    let t2 = t1.dot(&p.w);
    let u = &p.c + &t1 + &t2; // rows uᵀ = cᵀ + cᵀW + cᵀW², i.e. u = c + Wᵀc + (Wᵀ)²c
    let want = p.grads_from_adjoint(&p.fixed_point(), &u);
    let err = rel_err(&g.unwrap(), &want);
    assert!(err < 1e-12, "rel {err:e}");
}

#[test]
fn rows_stop_on_their_own_and_match_solving_alone() {
    setup();
    // One J = W for every row, right-hand sides of different difficulty: zero (no VJP), an
    // eigenvector of Wᵀ (one Krylov step), a random vector.
    let mut p = linear_problem(30, 0.95, 3, 12);
    let (_, vecs) = p.w.eigh(UPLO::Lower).unwrap();
    p.c.row_mut(0).fill(0.0);
    p.c.row_mut(1).assign(&vecs.column(7));
    let exact = p.exact();
    for solver in [
        LinearSolverConfig::gmres(30),
        LinearSolverConfig::bicgstab(),
        LinearSolverConfig::neumann(10_000),
    ] {
        let name = solver.name();
        let rule = implicit(solver, 1e-11, 10_000);
        let (g, rep) = run(&p, &rule);
        let g = g.unwrap();
        let back = rep.backward.get().unwrap();
        let its: Vec<usize> = back.rows.iter().map(|r| r.iterations).collect();
        println!("{name}: VJPs per row {its:?}");
        assert!(back.converged(), "{name}: {back:?}");
        assert_eq!(its[0], 0, "{name}: a zero row needs no VJP");
        assert!(its[1] < its[2], "{name}: {its:?}");
        assert_eq!(
            back.vjp_evals, its[2],
            "{name}: the batch runs as long as its slowest row"
        );
        assert!(rel_err(&g, &exact) < 1e-8);
        // dL/dx of row r depends on u_r alone: equal to the same row solved as a batch of one.
        let n_x = p.batch() * DX;
        let dx = &g[g.len() - n_x..];
        for r in 0..p.batch() {
            let mut one = p.clone();
            one.x = p.x.slice(s![r..r + 1, ..]).to_owned();
            one.c = p.c.slice(s![r..r + 1, ..]).to_owned();
            let (g1, rep1) = run(&one, &rule);
            let g1 = g1.unwrap();
            let back1 = rep1.backward.get().unwrap();
            assert_eq!(back1.rows[0].iterations, its[r], "{name} row {r}");
            let (a, b) = (&dx[r * DX..(r + 1) * DX], &g1[g1.len() - DX..]);
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(
                d <= 1e-12 * (1.0 + norm(b)),
                "{name} row {r}: {a:?} vs {b:?}"
            );
        }
    }
}

#[test]
fn phantom_gradient_approaches_the_implicit_gradient_as_k_grows() {
    setup();
    let p = tanh_problem(12, 0.8, 3, 4);
    let exact = p.exact();
    // ρ((1−τ)I + τJ) ≤ (1 − τ) + τ‖W‖ = 0.84 for τ = 0.8; 0.9 for τ = 0.5.
    for (tau, last_max) in [(0.8, 1e-8), (0.5, 1e-4), (1.0, 1e-9)] {
        let mut errs = vec![];
        for k in [1, 2, 4, 8, 16, 32, 64, 128] {
            let (g, rep) = run(&p, &GradientRule::phantom(k, tau));
            assert_eq!(rep.rule, "phantom");
            assert_eq!(rep.tape_applications, k);
            assert!(rep.backward.get().is_none());
            errs.push(rel_err(&g.unwrap(), &exact));
        }
        println!("phantom τ={tau}: rel errors k=1..128 {errs:?}");
        for w in errs.windows(2) {
            assert!(
                w[1] < w[0] || w[1] < 1e-11,
                "τ={tau}: not decreasing: {errs:?}"
            );
        }
        assert!(
            errs[0] > 1e-2,
            "τ={tau}: k = 1 is far from the IFT gradient: {errs:?}"
        );
        assert!(*errs.last().unwrap() < last_max, "τ={tau}: {errs:?}");
    }
}

#[test]
fn rules_read_and_write_json_and_old_configs_are_unchanged() {
    // A config written before the linear solvers: same parse, same JSON out.
    let old = r#"{"kind":"implicit","solver":{"kind":"anderson","history":3},"stop":{"rel_tol":1e-8,"max_iter":40}}"#;
    let rule = GradientRule::from_json(old).unwrap();
    match &rule {
        GradientRule::Implicit {
            solver, on_failure, ..
        } => {
            assert_eq!(solver.fixed_point().unwrap().name(), "anderson");
            assert_eq!(*on_failure, BackwardFailure::Jfb);
        }
        other => panic!("{other:?}"),
    }
    let v = serde_json::to_value(&rule).unwrap();
    assert!(v.get("on_failure").is_none(), "{v}");
    let built = GradientRule::implicit(SolverConfig::picard(), 1e-6, 50);
    assert_eq!(
        serde_json::to_value(&built).unwrap(),
        serde_json::json!({
            "kind": "implicit",
            "solver": serde_json::to_value(SolverConfig::picard()).unwrap(),
            "stop": serde_json::to_value(StopCriteria::relative(1e-6, 50)).unwrap(),
        })
    );
    let deq = DeqConfig::from_json(
        r#"{"forward_solver":{"kind":"anderson"},"gradient":{"kind":"implicit","solver":{"kind":"broyden"},"stop":{"rel_tol":1e-6}}}"#,
    )
    .unwrap();
    assert_eq!(deq.gradient, implicit(SolverConfig::broyden(), 1e-6, 1000));
    // New forms round-trip.
    for rule in [
        implicit(LinearSolverConfig::gmres(20), 1e-8, 300).with_on_failure(BackwardFailure::Error),
        implicit(LinearSolverConfig::bicgstab(), 1e-8, 300),
        implicit(LinearSolverConfig::neumann(8), 1e-8, 300).with_on_failure(BackwardFailure::Keep),
        GradientRule::phantom(5, 0.5),
    ] {
        let text = serde_json::to_string(&rule).unwrap();
        assert_eq!(GradientRule::from_json(&text).unwrap(), rule, "{text}");
    }
    let parsed = GradientRule::from_json(
        r#"{"kind":"implicit","solver":{"kind":"gmres"},"stop":{"rel_tol":1e-8,"max_iter":300},"on_failure":"error"}"#,
    )
    .unwrap();
    assert_eq!(
        parsed,
        implicit(LinearSolverConfig::gmres(30), 1e-8, 300).with_on_failure(BackwardFailure::Error)
    );
    assert_eq!(GradientRule::phantom(2, 0.5).name(), "phantom");
    assert!(GradientRule::phantom(2, 0.5).uses_forward_solver());
    for bad in [
        r#"{"kind":"implicit","solver":{"kind":"gmres"},"stop":{"rel_tol":1e-8},"on_failure":"zero"}"#,
        r#"{"kind":"implicit","solver":{"kind":"gmres","restart":0},"stop":{"rel_tol":1e-8}}"#,
        r#"{"kind":"implicit","solver":{"kind":"gmres","bogus":1},"stop":{"rel_tol":1e-8}}"#,
        r#"{"kind":"implicit","solver":{"kind":"bicgstab","restart":3},"stop":{"rel_tol":1e-8}}"#,
        r#"{"kind":"implicit","solver":{"kind":"neumann","terms":0},"stop":{"rel_tol":1e-8}}"#,
        r#"{"kind":"implicit","solver":{"kind":"cgne"},"stop":{"rel_tol":1e-8}}"#,
        r#"{"kind":"phantom","k":0,"tau":0.5}"#,
        r#"{"kind":"phantom","k":3,"tau":0}"#,
        r#"{"kind":"phantom","k":3,"tau":1.5}"#,
        r#"{"kind":"phantom","k":3}"#,
        r#"{"kind":"phantom","k":3,"tau":0.5,"damping":1}"#,
    ] {
        let e = GradientRule::from_json(bad);
        assert!(
            matches!(e, Err(ElmError::Json { .. }) | Err(ElmError::Config { .. })),
            "{bad} → {e:?}"
        );
    }
    for tau in [f64::NAN, f64::INFINITY, -0.1] {
        let e = GradientRule::phantom(3, tau).validate();
        assert!(
            matches!(e, Err(ElmError::Config { ref field, .. }) if field == "gradient_rule.tau"),
            "{e:?}"
        );
    }
    // A bad rule built in code is refused before anything runs.
    let mut tape = Tape::<f64>::new();
    let x = tape.constant(ArrayD::zeros(vec![1, DX]));
    let w = tape.param(ArrayD::zeros(vec![3, 3]));
    let u = tape.param(ArrayD::zeros(vec![3, DX]));
    let b = tape.param(ArrayD::zeros(vec![3]));
    let r = implicit_forward(
        &mut tape,
        &TanhDeq,
        x,
        &Params { w, u, b },
        &ArrayD::zeros(vec![1, 3]),
        &DeqConfig::new(GradientRule::phantom(0, 0.5)),
    );
    assert!(matches!(r, Err(ElmError::Config { .. })));
}
