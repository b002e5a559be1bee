//! Tests of `elm_solver` against references nobody here tuned: exact linear solves, the
//! Dottie number, the DST solution of the discrete Poisson problem, contraction error bounds and
//! analytically known spectral radii.

use elm_solver::problems::{
    max_row_error, CosProblem, LinearProblem, PoissonJacobi, Problem, TanhProblem, DOTTIE,
};
use elm_solver::SolverError;
use elm_solver::{
    FixedPointMap, FnMap, IterationInfo, OutputOptions, RowFnMap, RowStatus, Solution,
    SolverConfig, StopCriteria,
};
use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut2};

use elm_solver::BUILTIN_SOLVERS as SOLVERS;

#[path = "support/blas_threads.rs"]
mod blas_threads;
use blas_threads::setup;

/// A solver and the stop criteria its solves use.
struct Setup {
    solver: SolverConfig,
    stop: StopCriteria,
}

impl Setup {
    fn with_output(mut self, output: OutputOptions) -> Self {
        self.solver = self.solver.with_output(output);
        self
    }
}

fn config(name: &str, abs_tol: f64, max_iter: usize) -> Setup {
    Setup {
        solver: SolverConfig::by_name(name).unwrap(),
        stop: StopCriteria::absolute(abs_tol, max_iter),
    }
}

fn solve(cfg: &Setup, map: &mut dyn FixedPointMap<f64>, z0: ArrayView2<f64>) -> Solution<f64> {
    cfg.solver.build::<f64>().solve(map, z0, &cfg.stop).unwrap()
}

fn assert_all_converged(sol: &Solution<f64>, what: &str) {
    for (b, r) in sol.rows.iter().enumerate() {
        assert_eq!(
            r.status,
            RowStatus::Converged,
            "{what}: row {b} status {:?} after {} iterations, residual {:.3e}",
            r.status,
            r.iterations,
            r.residual
        );
    }
}

/// Every solver reaches abs_tol on z = Az + b (ρ < 1, so Picard must converge too) and lands
/// within the contraction bound of the exact solution `Q diag(1/(1−λ)) Qᵀ b`.
#[test]
fn linear_all_solvers_converge_to_exact_solution() {
    setup();
    for &rho in &[0.5, 0.9, 0.99] {
        let mut p = LinearProblem::canonical(rho, 7).unwrap();
        let z0 = Array2::zeros((1, 100));
        for name in SOLVERS {
            let tol = 1e-10;
            let sol = solve(&config(name, tol, 20_000), &mut p, z0.view());
            assert_all_converged(&sol, &format!("linear rho={rho} {name}"));
            let err = max_row_error(sol.z.view(), p.exact.view());
            // ‖z − z*‖ ≤ ‖f(z) − z‖ / (1 − ρ) for a contraction with ‖A‖₂ = ρ.
            let bound = sol.max_residual() / (1.0 - rho) * (1.0 + 1e-6) + 1e-12;
            println!(
                "linear rho={rho} {name}: evals={} residual={:.3e} err={err:.3e} bound={bound:.3e}",
                sol.map_evals,
                sol.max_residual()
            );
            assert!(sol.max_residual() <= tol);
            assert!(
                err <= bound,
                "rho={rho} {name}: err {err:.3e} > bound {bound:.3e}"
            );
        }
    }
}

fn evals(name: &str, problem: &mut dyn FixedPointMap<f64>, z0: ArrayView2<f64>, tol: f64) -> usize {
    let sol = solve(&config(name, tol, 50_000), problem, z0);
    assert_all_converged(&sol, name);
    sol.map_evals
}

/// Anderson and Broyden need strictly fewer map evaluations than Picard where Picard is slow.
#[test]
fn accelerated_solvers_beat_picard() {
    setup();
    let mut cases: Vec<(String, Problem, f64)> = vec![
        (
            "linear 0.9".into(),
            Problem::by_name("linear", 0.9, 3).unwrap(),
            1e-10,
        ),
        (
            "linear 0.99".into(),
            Problem::by_name("linear", 0.99, 3).unwrap(),
            1e-10,
        ),
        (
            "cos".into(),
            Problem::by_name("cos", 0.0, 0).unwrap(),
            1e-12,
        ),
        (
            "poisson".into(),
            Problem::by_name("poisson", 0.0, 0).unwrap(),
            1e-9,
        ),
    ];
    for (label, p, tol) in cases.iter_mut() {
        let z0 = p.z0();
        let picard = evals("picard", p.map(), z0.view(), *tol);
        let anderson = evals("anderson", p.map(), z0.view(), *tol);
        let broyden = evals("broyden", p.map(), z0.view(), *tol);
        println!("{label}: picard {picard}, anderson {anderson}, broyden {broyden} map evals");
        assert!(
            anderson < picard,
            "{label}: anderson {anderson} >= picard {picard}"
        );
        assert!(
            broyden < picard,
            "{label}: broyden {broyden} >= picard {picard}"
        );
    }
}

#[test]
fn cos_converges_to_dottie_number() {
    setup();
    for name in SOLVERS {
        let sol = solve(
            &config(name, 1e-13, 1000),
            &mut CosProblem,
            Array2::zeros((1, 1)).view(),
        );
        assert_all_converged(&sol, name);
        let err = (sol.z[[0, 0]] - DOTTIE).abs();
        println!("cos {name}: {} evals, err {err:.3e}", sol.map_evals);
        // |z − z*| ≤ |cos z − z| / (1 − sin(1)) on [0, 1].
        assert!(err < 1e-12, "cos {name}: |z - dottie| = {err:.3e}");
    }
}

#[test]
fn poisson_matches_discrete_sine_transform_solution() {
    setup();
    let mut p = PoissonJacobi::canonical().unwrap();
    // The DST solution itself must satisfy −Δ_h u = f (independent of the solver).
    let lap = p.neg_laplacian(&p.exact);
    let lap_err = (&lap - &p.f).iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(
        lap_err < 1e-9,
        "DST solution: max |−Δu − f| = {lap_err:.3e}"
    );
    for name in SOLVERS {
        let sol = solve(
            &config(name, 1e-10, 50_000),
            &mut p,
            Array2::zeros((1, 2500)).view(),
        );
        assert_all_converged(&sol, name);
        let err = max_row_error(sol.z.view(), p.exact.view().insert_axis(ndarray::Axis(0)));
        let bound = sol.max_residual() / (1.0 - p.jacobi_spectral_radius()) + 1e-12;
        println!(
            "poisson {name}: {} evals, err {err:.3e}, bound {bound:.3e}",
            sol.map_evals
        );
        assert!(
            err <= bound,
            "poisson {name}: err {err:.3e} > bound {bound:.3e}"
        );
    }
}

/// 64 independent tanh systems, f64 and f32: all rows converge; f32 agrees with f64.
#[test]
fn tanh_batch_converges_in_f64_and_f32() {
    setup();
    let mut p64 = TanhProblem::<f64>::canonical(11).unwrap();
    let mut p32 = TanhProblem::<f32>::canonical(11).unwrap();
    for name in SOLVERS {
        let sol = solve(
            &config(name, 1e-10, 2000),
            &mut p64,
            Array2::zeros((64, 200)).view(),
        );
        assert_all_converged(&sol, name);
        let iters: Vec<usize> = sol.rows.iter().map(|r| r.iterations).collect();
        println!(
            "tanh f64 {name}: {} batched evals, per-row iterations {}..{}",
            sol.map_evals,
            iters.iter().min().unwrap(),
            iters.iter().max().unwrap()
        );
        let stop32 = StopCriteria {
            abs_tol: 0.0,
            rel_tol: 1e-5,
            max_iter: 2000,
            ..StopCriteria::default()
        };
        let sol32 = SolverConfig::by_name(name)
            .unwrap()
            .build::<f32>()
            .solve(&mut p32, Array2::zeros((64, 200)).view(), &stop32)
            .unwrap();
        assert!(
            sol32.all_converged(),
            "tanh f32 {name}: not all rows converged"
        );
        let diff = (&sol32.z.mapv(|v| v as f64) - &sol.z)
            .iter()
            .fold(0.0f64, |m, v| m.max(v.abs()));
        println!("tanh f32 {name}: max |z32 - z64| = {diff:.3e}");
        // Per row, both are within residual/(1 − 0.95) of the fixed point (contraction bound);
        // 1e-4 allows for W and the injection being rounded to f32.
        for b in 0..64 {
            let d = (&sol32.z.row(b).mapv(|v| v as f64) - &sol.z.row(b))
                .mapv(|v| v * v)
                .sum()
                .sqrt();
            let bound = (sol32.rows[b].residual + sol.rows[b].residual) / 0.05 + 1e-4;
            assert!(
                d <= bound,
                "tanh f32 vs f64 ({name}) row {b}: ‖diff‖ {d:.3e} > bound {bound:.3e}"
            );
        }
    }
}

/// Row 0 is an easy contraction (0.1), row 1 a hard one (0.99): row 0 stops early, its state
/// never changes afterwards and the map is never asked to evaluate it again.
#[test]
fn converged_rows_are_frozen_and_reported_inactive() {
    setup();
    for name in SOLVERS {
        let mut calls = [0usize; 2];
        // Row 0: z_i = 0.1 z_i + 1 + i. Row 1: coupled, nonlinear, contraction factor ~0.99.
        let mut map = FnMap::new(
            8,
            |z: ArrayView2<f64>, active: &[bool], mut out: ArrayViewMut2<f64>| {
                if active[0] {
                    calls[0] += 1;
                    for i in 0..8 {
                        out[[0, i]] = 0.1 * z[[0, i]] + 1.0 + i as f64;
                    }
                }
                if active[1] {
                    calls[1] += 1;
                    for i in 0..8 {
                        let rate = 0.99 - 0.1 * i as f64;
                        out[[1, i]] = rate * z[[1, i]] + 0.005 * z[[1, (i + 1) % 8]].sin() + 1.0;
                    }
                }
                Ok(())
            },
        );
        let mut history: Vec<(Vec<bool>, Array1<f64>)> = Vec::new();
        let mut observer = |info: &IterationInfo<'_, f64>| {
            history.push((info.active.to_vec(), info.z.row(0).to_owned()));
        };
        let mut cfg = config(name, 1e-9, 5000);
        cfg.solver.output_mut().unwrap().return_best = false;
        let sol = cfg
            .solver
            .build::<f64>()
            .solve_observed(
                &mut map,
                Array2::zeros((2, 8)).view(),
                &cfg.stop,
                &mut observer,
            )
            .unwrap();
        assert_all_converged(&sol, name);
        let (easy, hard) = (sol.rows[0].iterations, sol.rows[1].iterations);
        println!("{name}: easy row {easy} iterations, hard row {hard}");
        assert!(easy < hard, "{name}: easy {easy} vs hard {hard}");
        assert_eq!(calls[0], easy, "{name}: map evaluated the frozen row");
        assert_eq!(calls[1], hard);
        let stop = history.iter().position(|(a, _)| !a[0]).unwrap();
        for (a, z) in &history[stop..] {
            assert!(!a[0]);
            assert_eq!(z, &history[stop].1, "{name}: frozen row changed");
        }
        assert_eq!(sol.z.row(0), history[stop].1.view());
        for i in 0..8 {
            let exact = (1.0 + i as f64) / 0.9;
            assert!((sol.z[[0, i]] - exact).abs() < 1e-8);
        }
    }
}

/// NaN from the map in one row marks only that row NonFinite.
#[test]
fn nan_in_one_row_gives_nonfinite_for_that_row_only() {
    setup();
    for name in SOLVERS {
        let mut row1_calls = 0;
        let mut map = FnMap::new(
            2,
            |z: ArrayView2<f64>, active: &[bool], mut out: ArrayViewMut2<f64>| {
                for b in 0..z.nrows() {
                    if !active[b] {
                        continue;
                    }
                    out[[b, 0]] = z[[b, 1]].cos();
                    out[[b, 1]] = 0.5 * z[[b, 0]] + b as f64;
                    if b == 1 {
                        row1_calls += 1;
                        if row1_calls == 3 {
                            out[[b, 0]] = f64::NAN;
                        }
                    }
                }
                Ok(())
            },
        );
        let sol = solve(
            &config(name, 1e-10, 500),
            &mut map,
            Array2::zeros((3, 2)).view(),
        );
        let statuses: Vec<RowStatus> = sol.rows.iter().map(|r| r.status).collect();
        assert_eq!(
            statuses,
            vec![
                RowStatus::Converged,
                RowStatus::NonFinite,
                RowStatus::Converged
            ],
            "{name}"
        );
        assert_eq!(sol.rows[1].iterations, 3);
        assert!(
            sol.z.iter().all(|v| v.is_finite()),
            "{name}: NaN leaked into z"
        );
        for b in [0, 2] {
            let z = sol.z.row(b);
            assert!(
                (z[0] - z[1].cos()).abs() < 1e-9 && (z[1] - 0.5 * z[0] - b as f64).abs() < 1e-9
            );
        }
    }
}

#[test]
fn nan_start_is_nonfinite_not_error() {
    setup();
    let mut z0 = Array2::zeros((2, 1));
    z0[[0, 0]] = f64::NAN;
    for name in SOLVERS {
        let sol = solve(&config(name, 1e-12, 100), &mut CosProblem, z0.view());
        assert_eq!(sol.rows[0].status, RowStatus::NonFinite);
        assert_eq!(sol.rows[1].status, RowStatus::Converged);
    }
}

#[test]
fn picard_diverges_on_expanding_map_and_returns_best_iterate() {
    setup();
    let mut p = LinearProblem::new(20, 1.5, 1, 5).unwrap();
    let mut cfg = config("picard", 1e-10, 10_000);
    cfg.stop.divergence_factor = 1e6;
    cfg.solver.output_mut().unwrap().trace = true;
    let sol = solve(&cfg, &mut p, Array2::zeros((1, 20)).view());
    let row = &sol.rows[0];
    assert_eq!(row.status, RowStatus::Diverged);
    let trace = row.trace.as_ref().unwrap();
    assert_eq!(trace.len(), row.iterations);
    let min = trace.iter().cloned().fold(f64::INFINITY, f64::min);
    assert_eq!(
        row.residual, min,
        "best iterate's residual must be the trace minimum"
    );
    // Recompute the residual of the returned state independently.
    let fz = p.a.dot(&sol.z.row(0)) + p.b.row(0);
    let r = (&fz - &sol.z.row(0)).mapv(|v| v * v).sum().sqrt();
    assert!(
        (r - row.residual).abs() <= 1e-9 * r.max(1.0),
        "{r} vs {}",
        row.residual
    );
    // Anderson solves the same (non-contractive but nonsingular) linear system.
    let sol = solve(
        &config("anderson", 1e-8, 2000),
        &mut p,
        Array2::zeros((1, 20)).view(),
    );
    assert_all_converged(&sol, "anderson on rho=1.5");
}

/// Anderson mixes after 2 map evaluations: on a scalar linear map the secant step is exact, so
/// the 3rd evaluation sees a zero residual.
#[test]
fn anderson_mixes_after_two_evaluations() {
    setup();
    let mut map = RowFnMap::new(
        1,
        |z: ndarray::ArrayView1<f64>, mut o: ndarray::ArrayViewMut1<f64>| o[0] = 0.9 * z[0] + 2.0,
    );
    let mut cfg = config("anderson", 1e-12, 100);
    if let SolverConfig::Anderson(a) = &mut cfg.solver {
        a.lambda = 0.0; // the ridge would perturb the exact secant step
    }
    let sol = solve(&cfg, &mut map, Array2::zeros((1, 1)).view());
    assert_all_converged(&sol, "anderson scalar");
    assert_eq!(sol.map_evals, 3);
    assert!((sol.z[[0, 0]] - 20.0).abs() < 1e-10);
}

/// Singular Anderson history (all residual differences parallel) with λ = 0 restarts the row
/// instead of producing NaN, and still converges.
#[test]
fn anderson_restarts_on_singular_history() {
    setup();
    let mut map = RowFnMap::new(
        3,
        |z: ndarray::ArrayView1<f64>, mut o: ndarray::ArrayViewMut1<f64>| {
            // Only the first coordinate moves; the others are fixed at 0 (= their start).
            o[0] = 0.5 * z[0].sin() + 1.0;
            o[1] = 0.0;
            o[2] = 0.0;
        },
    );
    let mut cfg = config("anderson", 1e-12, 200);
    if let SolverConfig::Anderson(a) = &mut cfg.solver {
        a.lambda = 0.0;
        a.history = 4;
    }
    let sol = solve(&cfg, &mut map, Array2::zeros((1, 3)).view());
    assert_all_converged(&sol, "anderson singular");
    // The restarts reach the row's report.
    assert!(sol.rows[0].restarts > 0, "{:?}", sol.rows[0]);
    let z = sol.z[[0, 0]];
    assert!((z - (0.5 * z.sin() + 1.0)).abs() < 1e-12);
}

#[test]
fn spectral_radius_estimate_matches_known_values() {
    setup();
    for &rho in &[0.5, 0.9] {
        let mut p = LinearProblem::new(50, rho, 2, 1).unwrap();
        let mut cfg = config("anderson", 1e-10, 1000);
        cfg.solver.output_mut().unwrap().spectral_radius_iters = 200;
        let sol = solve(&cfg, &mut p, Array2::zeros((2, 50)).view());
        for r in &sol.rows {
            let est = r.spectral_radius.unwrap();
            println!("linear rho={rho}: estimate {est:.5}");
            assert!((est - rho).abs() < 0.02 * rho, "rho {rho}: estimate {est}");
        }
        assert_eq!(sol.spectral_map_evals, 201);
    }
    let mut cfg = config("broyden", 1e-12, 100);
    cfg.solver.output_mut().unwrap().spectral_radius_iters = 5;
    let sol = solve(&cfg, &mut CosProblem, Array2::zeros((1, 1)).view());
    let est = sol.rows[0].spectral_radius.unwrap();
    let exact = DOTTIE.sin(); // |d cos z / dz| at the fixed point
    assert!(
        (est - exact).abs() < 1e-6,
        "cos: estimate {est} vs sin(z*) = {exact}"
    );
    // tanh: ρ(J) ≤ ‖diag(1 − z²) W‖₂ ≤ 0.95.
    let mut p = TanhProblem::<f64>::new(40, 8, 4, 0.95, 2).unwrap();
    let mut cfg = config("anderson", 1e-10, 1000);
    cfg.solver.output_mut().unwrap().spectral_radius_iters = 100;
    let sol = solve(&cfg, &mut p, Array2::zeros((4, 40)).view());
    for r in &sol.rows {
        let est = r.spectral_radius.unwrap();
        assert!(
            est > 0.0 && est <= 0.95 * 1.02,
            "tanh spectral estimate {est}"
        );
    }
}

#[cfg(feature = "serde")]
#[test]
fn configs_roundtrip_and_reject_unknown_keys() {
    setup();
    for cfg in [
        SolverConfig::picard(),
        SolverConfig::anderson(),
        SolverConfig::broyden(),
    ] {
        let text = serde_json::to_string(&cfg).unwrap();
        assert_eq!(SolverConfig::from_json(&text).unwrap(), cfg);
    }
    let ok = SolverConfig::from_json(r#"{"kind":"anderson","history":3}"#).unwrap();
    match ok {
        SolverConfig::Anderson(a) => {
            assert_eq!(a.history, 3);
            assert_eq!(a.lambda, elm_solver::AndersonConfig::default().lambda);
        }
        other => panic!("wrong variant {other:?}"),
    }
    for bad in [
        r#"{"kind":"anderson","mm":3}"#,
        r#"{"kind":"picard","beta":0.5,"stop":{"maxiter":7}}"#,
        // Stopping is passed with each solve, never part of a solver config.
        r#"{"kind":"anderson","m":3,"stop":{"max_iter":7}}"#,
        r#"{"kind":"broyden","output":{"traces":true}}"#,
        r#"{"kind":"newton"}"#,
        r#"{"m":3}"#,
    ] {
        let err = SolverConfig::from_json(bad).unwrap_err();
        assert!(matches!(err, SolverError::Json { .. }), "{bad}: {err}");
        println!("{bad} -> {err}");
    }
    for (bad, field) in [
        (r#"{"kind":"picard","beta":0}"#, "beta"),
        (r#"{"kind":"anderson","history":0}"#, "history"),
        (r#"{"kind":"anderson","lambda":-1}"#, "lambda"),
        (r#"{"kind":"broyden","memory":0}"#, "memory"),
    ] {
        match SolverConfig::from_json(bad) {
            Err(SolverError::Config { field: f, .. }) => assert_eq!(f, field, "{bad}"),
            other => panic!("{bad}: expected config error, got {other:?}"),
        }
    }
}

/// Stop criteria and configs built in code are validated at solve time, naming the field.
#[test]
fn invalid_stop_and_config_are_refused_at_solve_time() {
    setup();
    // Stop criteria are validated at solve time with the field named.
    let zero_iter = StopCriteria {
        max_iter: 0,
        ..StopCriteria::default()
    };
    match SolverConfig::picard().build::<f64>().solve(
        &mut CosProblem,
        Array2::zeros((1, 1)).view(),
        &zero_iter,
    ) {
        Err(SolverError::Config { field, .. }) => assert_eq!(field, "stop.max_iter"),
        other => panic!("expected config error, got {other:?}"),
    }
    // An invalid config built directly is rejected at solve time, not by a panic.
    let mut cfg = SolverConfig::anderson();
    if let SolverConfig::Anderson(a) = &mut cfg {
        a.beta = 2.0;
    }
    let err = cfg.build::<f64>().solve(
        &mut CosProblem,
        Array2::zeros((1, 1)).view(),
        &StopCriteria::default(),
    );
    assert!(matches!(err, Err(SolverError::Config { .. })));
}

#[test]
fn shape_mismatch_is_an_error() {
    setup();
    let mut p = LinearProblem::new(10, 0.5, 1, 0).unwrap();
    let err = SolverConfig::picard().build::<f64>().solve(
        &mut p,
        Array2::zeros((1, 9)).view(),
        &StopCriteria::default(),
    );
    assert!(matches!(err, Err(SolverError::Shape { .. })));
}

#[test]
fn traces_and_best_iterate_options() {
    setup();
    let mut p = LinearProblem::new(30, 0.9, 1, 4).unwrap();
    let out = OutputOptions {
        trace: true,
        ..OutputOptions::default()
    };
    for name in SOLVERS {
        let cfg = config(name, 1e-9, 5000).with_output(out.clone());
        let sol = solve(&cfg, &mut p, Array2::zeros((1, 30)).view());
        let row = &sol.rows[0];
        let trace = row.trace.as_ref().unwrap();
        assert_eq!(trace.len(), row.iterations);
        assert_eq!(*trace.last().unwrap(), row.residual, "{name}");
        assert!(trace[0] > 1e-9 && row.residual <= 1e-9);
    }
}

#[test]
fn problem_registry() {
    setup();
    for name in ["linear", "tanh", "cos", "poisson"] {
        let p = Problem::by_name(name, 0.9, 0).unwrap();
        assert_eq!(p.name(), name);
        assert_eq!(p.z0().nrows(), p.batch());
    }
    assert!(matches!(
        Problem::by_name("bogus", 0.9, 0),
        Err(SolverError::Config { .. })
    ));
}

/// Broyden's step halvings and history restarts reach each row's report: with backtracking on any
/// growth of the residual (growth factor 1), a non-monotone solve backtracks; with it off, never.
#[test]
fn broyden_backtracks_and_restarts_reach_the_row_report() {
    setup();
    let mut p = LinearProblem::new(50, 0.99, 2, 3).unwrap();
    let mut cfg = config("broyden", 1e-8, 5000);
    let plain = solve(&cfg, &mut p, Array2::zeros((2, 50)).view());
    assert!(plain.rows.iter().all(|r| r.backtracks == 0));
    // Memory 10 on a 50-dim problem that takes more than 10 steps: the memory fills and restarts.
    assert!(
        plain.rows.iter().all(|r| r.restarts > 0),
        "{:?}",
        plain.rows
    );
    if let SolverConfig::Broyden(b) = &mut cfg.solver {
        b.backtrack = true;
        b.backtrack_growth = 1.0;
    }
    let sol = solve(&cfg, &mut p, Array2::zeros((2, 50)).view());
    let backtracks: usize = sol.rows.iter().map(|r| r.backtracks).sum();
    println!(
        "broyden with backtracking: {backtracks} backtracks, rows {:?}",
        sol.rows
            .iter()
            .map(|r| (r.status, r.iterations, r.restarts, r.backtracks))
            .collect::<Vec<_>>()
    );
    assert!(backtracks > 0);
}

/// `solve_in` (buffers and per-row state reused from the previous solve) gives exactly what a
/// fresh `solve` gives, across repeated solves, a change of batch shape, and a change of
/// solver sharing one workspace.
#[test]
fn workspace_solves_equal_fresh_solves() {
    setup();
    let mut ws = elm_solver::SolveWorkspace::<f64>::new();
    for (i, name) in ["anderson", "anderson", "broyden", "picard", "anderson"]
        .into_iter()
        .enumerate()
    {
        let batch = 1 + i % 3;
        let mut p = LinearProblem::new(40, 0.9, batch, 3 + i as u64).unwrap();
        let z0 = Array2::from_shape_fn((batch, 40), |(b, j)| ((b * 40 + j) as f64).sin());
        let cfg = config(name, 1e-9, 5_000);
        let fresh = solve(&cfg, &mut p, z0.view());
        cfg.solver
            .build::<f64>()
            .solve_in(&mut ws, &mut p, z0.view(), &cfg.stop)
            .unwrap();
        assert_eq!(ws.z(), fresh.z.view(), "{name} solve {i}");
        assert_eq!(ws.map_evals(), fresh.map_evals, "{name} solve {i}");
        for (a, b) in ws.rows().iter().zip(&fresh.rows) {
            assert_eq!(
                (a.status, a.iterations, a.residual, a.restarts),
                (b.status, b.iterations, b.residual, b.restarts),
                "{name} solve {i}"
            );
        }
        assert_all_converged(&ws.to_solution(), name);
    }
}
