//! Tests of the batched linear solvers (`LinearSolverConfig`) in f64 against references nobody
//! here tuned: the canonical problems' exact `(I − A)⁻¹ b` with the error bound `‖r‖ / (1 − ρ)`
//! of a symmetric `A` of spectral radius ρ, a non-symmetric contraction solved to machine
//! precision, and the same rows solved one at a time.

// Rows are indexed in lockstep across several arrays; explicit indices read clearer.
#![allow(clippy::needless_range_loop)]

use elm_solver::problems::{LinearProblem, TanhProblem};
use elm_solver::{
    FnOperator, LinearOperator, LinearSolution, LinearSolverConfig, MapError, MatrixOperator,
    RowStatus, SolverConfig, SolverError, StopCriteria,
};
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2, Axis};

#[path = "support/blas_threads.rs"]
mod blas_threads;
use blas_threads::setup;

/// Every method: three Krylov/series methods and two fixed-point solvers.
fn methods() -> Vec<LinearSolverConfig> {
    vec![
        LinearSolverConfig::gmres(30),
        LinearSolverConfig::bicgstab(),
        LinearSolverConfig::neumann(100_000),
        SolverConfig::picard().into(),
        SolverConfig::anderson().into(),
    ]
}

/// `I − a`.
fn i_minus(a: &Array2<f64>) -> Array2<f64> {
    Array2::eye(a.nrows()) - a
}

fn norm(v: ArrayView1<f64>) -> f64 {
    v.dot(&v).sqrt()
}

/// Per-row `‖b − M x‖₂`, computed here with plain loops (independent of the solvers).
fn true_residuals(m: &Array2<f64>, x: ArrayView2<f64>, b: ArrayView2<f64>) -> Vec<f64> {
    (0..x.nrows())
        .map(|r| {
            (0..m.nrows())
                .map(|i| {
                    let mx: f64 = (0..m.ncols()).map(|k| m[[i, k]] * x[[r, k]]).sum();
                    (b[[r, i]] - mx).powi(2)
                })
                .sum::<f64>()
                .sqrt()
        })
        .collect()
}

fn solve(
    cfg: &LinearSolverConfig,
    op: &mut dyn LinearOperator<f64>,
    b: ArrayView2<f64>,
    stop: &StopCriteria,
) -> LinearSolution<f64> {
    let x0 = Array2::zeros(b.dim());
    cfg.solve(op, b, x0.view(), stop).unwrap()
}

#[test]
fn every_method_reaches_the_exact_solution_of_the_canonical_problems() {
    setup();
    let stop = StopCriteria::relative(1e-10, 50_000);
    for rho in [0.5, 0.9, 0.99] {
        let p = LinearProblem::new(100, rho, 3, 11).unwrap();
        let m = i_minus(&p.a);
        // CGNR too: the matrix operator offers Aᵀ.
        for cfg in methods().into_iter().chain([LinearSolverConfig::cgnr()]) {
            let mut op = MatrixOperator::new(m.clone()).unwrap();
            let sol = solve(&cfg, &mut op, p.b.view(), &stop);
            let res = true_residuals(&m, sol.x.view(), p.b.view());
            for (r, row) in sol.rows.iter().enumerate() {
                let name = cfg.name();
                assert_eq!(row.status, RowStatus::Converged, "{name} ρ={rho}: {row:?}");
                let bn = norm(p.b.row(r));
                // Converged is decided on the true residual (fixed-point: relative to ‖f(x)‖ ≈ ‖x‖,
                // at most ‖b‖ / (1 − ρ)).
                let allowed = 1e-10
                    * bn
                    * if cfg.fixed_point().is_some() {
                        1.0 / (1.0 - rho)
                    } else {
                        1.0
                    };
                assert!(
                    res[r] <= allowed * 1.01,
                    "{name} ρ={rho} row {r}: ‖r‖ {:e} > {allowed:e}",
                    res[r]
                );
                let err = norm((&sol.x.row(r) - &p.exact.row(r)).view());
                // ‖x − x*‖ ≤ ‖(I − A)⁻¹‖ ‖r‖ = ‖r‖ / (1 − ρ) for symmetric A; slack for rounding.
                let bound = res[r] / (1.0 - rho) + 1e-13 * norm(p.exact.row(r));
                assert!(
                    err <= bound,
                    "{name} ρ={rho} row {r}: error {err:e} > bound {bound:e}"
                );
            }
        }
    }
}

#[test]
fn gmres_needs_far_fewer_applications_than_the_fixed_point_at_rho_099() {
    setup();
    let p = LinearProblem::new(100, 0.99, 2, 3).unwrap();
    let stop = StopCriteria::relative(1e-10, 50_000);
    let apps = |cfg: LinearSolverConfig| {
        let mut op = MatrixOperator::new(i_minus(&p.a)).unwrap();
        let sol = solve(&cfg, &mut op, p.b.view(), &stop);
        assert!(sol.all_converged(), "{}: {:?}", cfg.name(), sol.rows);
        sol.max_iterations()
    };
    let picard = apps(SolverConfig::picard().into());
    let neumann = apps(LinearSolverConfig::neumann(100_000));
    let gmres = apps(LinearSolverConfig::gmres(30));
    let bicgstab = apps(LinearSolverConfig::bicgstab());
    println!("ρ = 0.99 applications: picard {picard}, neumann {neumann}, gmres {gmres}, bicgstab {bicgstab}");
    // Picard contracts by ρ per application: ln(1e-10)/ln(0.99) ≈ 2300.
    assert!(picard > 1000, "picard {picard}");
    assert!(neumann > 1000, "neumann {neumann}");
    assert!(gmres * 5 < picard, "gmres {gmres} vs picard {picard}");
    assert!(
        bicgstab * 5 < picard,
        "bicgstab {bicgstab} vs picard {picard}"
    );
}

#[test]
fn gmres_bicgstab_and_cgnr_solve_a_non_symmetric_system() {
    setup();
    // (I − W) x = c with ‖W‖₂ = 0.95, W Gaussian (non-normal); reference: the fixed-point
    // iteration x ← W x + c run to machine precision (contraction, error ≤ step / (1 − 0.95)).
    let p = TanhProblem::<f64>::new(60, 8, 4, 0.95, 5).unwrap();
    let (w, c) = (p.w.clone(), p.injection.clone());
    let mut exact = Array2::<f64>::zeros(c.dim());
    for _ in 0..2000 {
        exact = exact.dot(&w.t()) + &c;
    }
    let m = i_minus(&w);
    let stop = StopCriteria::relative(1e-12, 5000);
    for cfg in [
        LinearSolverConfig::gmres(10),
        LinearSolverConfig::bicgstab(),
        LinearSolverConfig::cgnr(),
    ] {
        let mut op = MatrixOperator::new(m.clone()).unwrap();
        let sol = solve(&cfg, &mut op, c.view(), &stop);
        assert!(sol.all_converged(), "{}: {:?}", cfg.name(), sol.rows);
        let res = true_residuals(&m, sol.x.view(), c.view());
        for r in 0..c.nrows() {
            let err = norm((&sol.x.row(r) - &exact.row(r)).view());
            let bound = res[r] / (1.0 - 0.95) + 1e-12 * norm(exact.row(r));
            assert!(err <= bound, "{} row {r}: {err:e} > {bound:e}", cfg.name());
        }
    }
}

#[test]
fn too_few_applications_are_reported_as_not_converged() {
    setup();
    let p = LinearProblem::new(50, 0.9, 2, 4).unwrap();
    let m = i_minus(&p.a);
    let stop = StopCriteria::relative(1e-12, 5);
    for cfg in methods() {
        let mut op = MatrixOperator::new(m.clone()).unwrap();
        let sol = solve(&cfg, &mut op, p.b.view(), &stop);
        let res = true_residuals(&m, sol.x.view(), p.b.view());
        for (r, row) in sol.rows.iter().enumerate() {
            assert_eq!(row.status, RowStatus::MaxIter, "{}: {row:?}", cfg.name());
            assert!(row.iterations <= 5, "{}: {row:?}", cfg.name());
            assert!(row.rel_residual > 1e-12 && res[r] > 1e-12 * norm(p.b.row(r)));
            assert!(sol.x.row(r).iter().all(|v| v.is_finite()));
        }
    }
    // A series cut after 3 terms is truncated (MaxIter) and is exactly b + M b + M² b.
    let mut op = MatrixOperator::new(m.clone()).unwrap();
    let sol = solve(
        &LinearSolverConfig::neumann(3),
        &mut op,
        p.b.view(),
        &StopCriteria::relative(1e-12, 1000),
    );
    let t1 = p.b.dot(&p.a.t());
    let t2 = t1.dot(&p.a.t());
    let want = &p.b + &t1 + &t2;
    for (r, row) in sol.rows.iter().enumerate() {
        assert_eq!(row.status, RowStatus::MaxIter);
        assert_eq!(
            row.iterations, 3,
            "three terms, each known with its residual after one application"
        );
        let d = norm((&sol.x.row(r) - &want.row(r)).view());
        assert!(d <= 1e-12 * norm(want.row(r)), "row {r}: {d:e}");
        // The reported residual is that of the returned sum: the fourth term M³ b.
        let res = true_residuals(&m, sol.x.view(), p.b.view())[r];
        assert!(
            (row.residual - res).abs() <= 1e-10 * res,
            "{} vs {res}",
            row.residual
        );
    }
}

/// Applies `I − A_r` to row r (one matrix per row, so rows have different difficulty) and checks
/// that a row, once inactive, stays inactive with a zero input.
struct PerRow {
    m: Vec<Array2<f64>>,
    /// Row indices into `m` (the whole batch, or one row solved alone).
    which: Vec<usize>,
    stopped: Vec<bool>,
    /// The Krylov driver zeroes a frozen row's input (the fixed-point engine keeps its state).
    zero_frozen: bool,
}

impl LinearOperator<f64> for PerRow {
    fn dim(&self) -> usize {
        self.m[0].nrows()
    }
    fn apply(
        &mut self,
        x: ArrayView2<f64>,
        active: &[bool],
        mut out: ArrayViewMut2<f64>,
    ) -> Result<(), MapError> {
        for (b, &a) in active.iter().enumerate() {
            if !a {
                assert!(
                    !self.zero_frozen || x.row(b).iter().all(|&v| v == 0.0),
                    "frozen row {b} fed a non-zero input"
                );
                self.stopped[b] = true;
                continue;
            }
            assert!(!self.stopped[b], "row {b} became active again");
            let m = &self.m[self.which[b]];
            let mut op = MatrixOperator::new(m.clone())?;
            let xr = x.row(b).insert_axis(Axis(0));
            let mut o = Array2::zeros((1, m.nrows()));
            op.apply(xr, &[true], o.view_mut())?;
            out.row_mut(b).assign(&o.row(0));
        }
        Ok(())
    }
}

#[test]
fn rows_stop_on_their_own_and_match_solving_alone() {
    setup();
    let n = 40;
    let rhos = [0.3, 0.9, 0.99];
    let m: Vec<Array2<f64>> = rhos
        .iter()
        .map(|&rho| i_minus(&LinearProblem::new(n, rho, 1, 21).unwrap().a))
        .collect();
    // Rows 0..3 of increasing ρ, then a zero right-hand side (converged at once, x = 0).
    let mut b = LinearProblem::new(n, 0.5, 4, 22).unwrap().b;
    b.row_mut(3).fill(0.0);
    let which = vec![0, 1, 2, 0];
    let stop = StopCriteria::relative(1e-10, 20_000);
    for cfg in methods() {
        let name = cfg.name();
        let zero_frozen = cfg.fixed_point().is_none();
        let mut op = PerRow {
            m: m.clone(),
            which: which.clone(),
            stopped: vec![false; 4],
            zero_frozen,
        };
        let sol = solve(&cfg, &mut op, b.view(), &stop);
        assert!(sol.all_converged(), "{name}: {:?}", sol.rows);
        let its: Vec<usize> = sol.rows.iter().map(|r| r.iterations).collect();
        println!("{name}: applications per row {its:?}");
        assert!(its[0] < its[1] && its[1] < its[2], "{name}: {its:?}");
        assert_eq!(
            sol.applications, its[2],
            "{name}: the batch runs as long as its slowest row"
        );
        if cfg.fixed_point().is_none() {
            assert_eq!(its[3], 0, "{name}: b = 0 needs no application");
        }
        assert!(sol.x.row(3).iter().all(|&v| v == 0.0));
        for r in 0..4 {
            let mut alone = PerRow {
                m: m.clone(),
                which: vec![which[r]],
                stopped: vec![false],
                zero_frozen,
            };
            let one = solve(&cfg, &mut alone, b.slice(ndarray::s![r..r + 1, ..]), &stop);
            assert_eq!(one.x.row(0), sol.x.row(r), "{name} row {r}: batch vs alone");
            assert_eq!(
                one.rows[0].iterations, sol.rows[r].iterations,
                "{name} row {r}"
            );
            assert_eq!(
                one.rows[0].residual.to_bits(),
                sol.rows[r].residual.to_bits(),
                "{name} row {r}"
            );
        }
    }
}

#[test]
fn bad_rows_stop_without_failing_the_batch() {
    setup();
    let p = LinearProblem::new(30, 0.5, 3, 8).unwrap();
    let mut b = p.b.clone();
    b[[1, 4]] = f64::NAN;
    let stop = StopCriteria::relative(1e-10, 1000);
    for cfg in methods() {
        let mut op = MatrixOperator::new(i_minus(&p.a)).unwrap();
        let sol = solve(&cfg, &mut op, b.view(), &stop);
        assert_eq!(sol.rows[1].status, RowStatus::NonFinite, "{}", cfg.name());
        assert_eq!(sol.rows[0].status, RowStatus::Converged, "{}", cfg.name());
        assert_eq!(sol.rows[2].status, RowStatus::Converged, "{}", cfg.name());
    }
    // The Neumann series of ρ(I − A) = 1.5 diverges: the row says so.
    let a = Array2::from_diag(&Array1::linspace(-1.5, 0.2, 30));
    let mut op = MatrixOperator::new(i_minus(&a)).unwrap();
    let sol = solve(
        &LinearSolverConfig::neumann(10_000),
        &mut op,
        p.b.view(),
        &StopCriteria {
            divergence_factor: 1e6,
            ..StopCriteria::relative(1e-10, 10_000)
        },
    );
    assert!(
        sol.rows.iter().all(|r| r.status == RowStatus::Diverged),
        "{:?}",
        sol.rows
    );
    // GMRES has no trouble with it (I − A is non-singular).
    let sol = solve(&LinearSolverConfig::gmres(30), &mut op, p.b.view(), &stop);
    assert!(sol.all_converged(), "{:?}", sol.rows);
}

#[test]
fn bad_inputs_are_typed_errors() {
    setup();
    let mut op = MatrixOperator::new(Array2::<f64>::eye(4)).unwrap();
    let b = Array2::<f64>::ones((2, 4));
    let stop = StopCriteria::default();
    let r =
        LinearSolverConfig::gmres(5).solve(&mut op, b.view(), Array2::zeros((2, 3)).view(), &stop);
    assert!(matches!(r, Err(SolverError::Shape { .. })), "{r:?}");
    let r = LinearSolverConfig::gmres(5).solve(
        &mut op,
        Array2::<f64>::ones((2, 5)).view(),
        Array2::zeros((2, 5)).view(),
        &stop,
    );
    assert!(matches!(r, Err(SolverError::Shape { .. })), "{r:?}");
    for bad in [LinearSolverConfig::gmres(0), LinearSolverConfig::neumann(0)] {
        let r = bad.solve(&mut op, b.view(), Array2::zeros((2, 4)).view(), &stop);
        assert!(matches!(r, Err(SolverError::Config { .. })), "{r:?}");
    }
    let r = LinearSolverConfig::bicgstab().solve(
        &mut op,
        b.view(),
        Array2::zeros((2, 4)).view(),
        &StopCriteria {
            max_iter: 0,
            ..stop.clone()
        },
    );
    assert!(matches!(r, Err(SolverError::Config { .. })), "{r:?}");
    assert!(MatrixOperator::new(Array2::<f64>::zeros((2, 3))).is_err());
    // The operator's own error comes back unchanged.
    #[derive(Debug)]
    struct Mine;
    impl std::fmt::Display for Mine {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "mine")
        }
    }
    impl std::error::Error for Mine {}
    for cfg in methods() {
        let mut failing = FnOperator::new(
            4,
            |_: ArrayView2<f64>, _: &[bool], _: ArrayViewMut2<f64>| Err(Box::new(Mine) as MapError),
        );
        match cfg.solve(&mut failing, b.view(), Array2::zeros((2, 4)).view(), &stop) {
            Err(SolverError::Map(e)) => assert!(e.downcast_ref::<Mine>().is_some()),
            other => panic!("{}: {other:?}", cfg.name()),
        }
    }
    assert!("gmres".parse::<LinearSolverConfig>().is_ok());
    assert_eq!(
        "anderson".parse::<LinearSolverConfig>().unwrap(),
        SolverConfig::anderson().into()
    );
    assert!(matches!(
        "cg".parse::<LinearSolverConfig>(),
        Err(SolverError::Config { .. })
    ));
}

#[test]
fn f32_states_reach_f32_accuracy() {
    setup();
    let p = LinearProblem::new(60, 0.9, 2, 9).unwrap();
    let m32 = i_minus(&p.a).mapv(|v| v as f32);
    let b32 = p.b.mapv(|v| v as f32);
    for cfg in [
        LinearSolverConfig::gmres(20),
        LinearSolverConfig::bicgstab(),
        LinearSolverConfig::neumann(10_000),
    ] {
        let mut op = MatrixOperator::new(m32.clone()).unwrap();
        let sol = cfg
            .solve(
                &mut op,
                b32.view(),
                Array2::zeros(b32.dim()).view(),
                &StopCriteria::relative(1e-5, 5000),
            )
            .unwrap();
        assert!(sol.all_converged(), "{}: {:?}", cfg.name(), sol.rows);
        for r in 0..2 {
            let x = sol.x.row(r).mapv(|v| v as f64);
            let rel = norm((&x - &p.exact.row(r)).view()) / norm(p.exact.row(r));
            assert!(rel < 1e-3, "{} row {r}: {rel:e}", cfg.name());
        }
    }
}

#[cfg(feature = "serde")]
#[test]
fn configs_read_and_write_json() {
    let cases = [
        (
            r#"{"kind":"gmres","restart":20}"#,
            LinearSolverConfig::gmres(20),
        ),
        (r#"{"kind":"gmres"}"#, LinearSolverConfig::gmres(30)),
        (r#"{"kind":"bicgstab"}"#, LinearSolverConfig::bicgstab()),
        (r#"{"kind":"cgnr"}"#, LinearSolverConfig::cgnr()),
        (
            r#"{"kind":"neumann","terms":7}"#,
            LinearSolverConfig::neumann(7),
        ),
        (
            r#"{"kind":"anderson","history":3}"#,
            SolverConfig::from_json(r#"{"kind":"anderson","history":3}"#)
                .unwrap()
                .into(),
        ),
        (r#"{"kind":"picard"}"#, SolverConfig::picard().into()),
    ];
    for (text, want) in cases {
        let got = LinearSolverConfig::from_json(text).unwrap();
        assert_eq!(got, want, "{text}");
        let back = serde_json::to_string(&got).unwrap();
        assert_eq!(
            LinearSolverConfig::from_json(&back).unwrap(),
            want,
            "{back}"
        );
    }
    // The fixed-point variant writes exactly its SolverConfig.
    let a = SolverConfig::anderson();
    assert_eq!(
        serde_json::to_value(LinearSolverConfig::from(a.clone())).unwrap(),
        serde_json::to_value(a).unwrap()
    );
    for bad in [
        r#"{"kind":"gmres","bogus":1}"#,
        r#"{"kind":"cgnr","restart":3}"#,
        r#"{"kind":"bicgstab","restart":3}"#,
        r#"{"kind":"neumann","terms":0}"#,
        r#"{"kind":"gmres","restart":0}"#,
        r#"{"kind":"anderson","bogus":1}"#,
        r#"{"kind":"cgne"}"#,
        r#"{"restart":3}"#,
    ] {
        let e = LinearSolverConfig::from_json(bad);
        assert!(
            matches!(
                e,
                Err(SolverError::Json { .. }) | Err(SolverError::Config { .. })
            ),
            "{bad} → {e:?}"
        );
    }
    let e = LinearSolverConfig::from_json(r#"{"kind":"cgne"}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gmres") && e.contains("anderson"), "{e}");
}

#[test]
fn cgnr_refuses_an_operator_without_transpose_and_reports_a_short_budget() {
    setup();
    let b = Array2::<f64>::ones((2, 4));
    let mut plain = FnOperator::new(
        4,
        |x: ArrayView2<f64>, _: &[bool], mut out: ArrayViewMut2<f64>| -> Result<(), MapError> {
            out.assign(&x);
            Ok(())
        },
    );
    let r = LinearSolverConfig::cgnr().solve(
        &mut plain,
        b.view(),
        Array2::zeros((2, 4)).view(),
        &StopCriteria::default(),
    );
    match r {
        Err(SolverError::Config { field, msg }) => {
            assert_eq!(field, "kind");
            assert!(msg.contains("Aᵀ"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // The pair form: A and Aᵀ from two closures, same answers as the matrix.
    let p = LinearProblem::new(40, 0.9, 2, 4).unwrap();
    let m = i_minus(&p.a);
    let (m1, m2) = (m.clone(), m.t().to_owned());
    let mut pair = elm_solver::FnOperatorPair::new(
        40,
        move |x: ArrayView2<f64>,
              _: &[bool],
              mut out: ArrayViewMut2<f64>|
              -> Result<(), MapError> {
            out.assign(&x.dot(&m1.t()));
            Ok(())
        },
        move |x: ArrayView2<f64>,
              _: &[bool],
              mut out: ArrayViewMut2<f64>|
              -> Result<(), MapError> {
            out.assign(&x.dot(&m2.t()));
            Ok(())
        },
    );
    let sol = solve(
        &LinearSolverConfig::cgnr(),
        &mut pair,
        p.b.view(),
        &StopCriteria::relative(1e-10, 10_000),
    );
    assert!(sol.all_converged(), "{:?}", sol.rows);
    // Too few products: every row stops as MaxIter within its budget, never Converged.
    let mut op = MatrixOperator::new(m.clone()).unwrap();
    let sol = solve(
        &LinearSolverConfig::cgnr(),
        &mut op,
        p.b.view(),
        &StopCriteria::relative(1e-12, 9),
    );
    for row in &sol.rows {
        assert_eq!(row.status, RowStatus::MaxIter, "{row:?}");
        assert!(row.iterations <= 9, "{row:?}");
    }
}
