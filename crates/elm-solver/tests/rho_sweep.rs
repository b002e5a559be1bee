//! The ρ-sweep: Picard's evaluation counts equal a plain f64 iteration written here (and stay
//! under the analytic bound `ln(tol·‖z‖/‖b‖) / ln ρ`), and Anderson's saving grows with ρ.

use elm_solver::problems::LinearProblem;
use elm_solver::rho_sweep::{rho_sweep, RhoSweepConfig};
use elm_solver::{SolverConfig, BUILTIN_SOLVERS};
use ndarray::{Array1, Axis};

fn solvers() -> Vec<SolverConfig> {
    BUILTIN_SOLVERS
        .iter()
        .map(|n| SolverConfig::by_name(n).unwrap())
        .collect()
}

/// Map evaluations until `‖f(z) − z‖ ≤ tol·(‖f(z)‖ + 1e-12)`, counting the one at `z0 = 0`.
fn picard_reference(p: &LinearProblem, row: usize, tol: f64) -> usize {
    let b = p.b.index_axis(Axis(0), row);
    let mut z = Array1::<f64>::zeros(b.len());
    for k in 1.. {
        let fz = p.a.dot(&z) + b;
        let res = (&fz - &z).mapv(|v| v * v).sum().sqrt();
        let norm = fz.mapv(|v| v * v).sum().sqrt();
        if res <= tol * (norm + 1e-12) {
            return k;
        }
        z = fz;
    }
    unreachable!()
}

#[test]
fn picard_counts_match_a_plain_iteration_and_the_bound() {
    let cfg = RhoSweepConfig {
        rhos: vec![0.29, 0.9, 0.99],
        rel_tols: vec![1e-2, 1e-6],
        max_iter: 100_000,
        dim: 40,
        batch: 3,
        seed: 5,
    };
    let rows = rho_sweep(&cfg, &solvers()).unwrap();
    assert_eq!(rows.len(), 3 * 2 * BUILTIN_SOLVERS.len());
    for &rho in &cfg.rhos {
        let p = LinearProblem::new(cfg.dim, rho, cfg.batch, cfg.seed).unwrap();
        for &tol in &cfg.rel_tols {
            let r = rows
                .iter()
                .find(|r| r.rho == rho && r.rel_tol == tol && r.solver == "picard")
                .unwrap();
            assert_eq!(r.rows_converged, cfg.batch);
            let counts: Vec<usize> = (0..cfg.batch)
                .map(|row| picard_reference(&p, row, tol))
                .collect();
            let mean = counts.iter().sum::<usize>() as f64 / cfg.batch as f64;
            assert_eq!(r.mean_evaluations, mean, "ρ {rho} tol {tol}");
            // ‖z_{k+1} − z_k‖ = ‖A^k b‖ ≤ ρ^k ‖b‖ and ‖z_{k+1}‖ ≥ ‖z*‖ − ρ^{k+1}‖z*‖: a bound
            // nobody tuned on the count (loose by design).
            for (row, &count) in counts.iter().enumerate() {
                let b = p.b.row(row).mapv(|v| v * v).sum().sqrt();
                let zs = p.exact.row(row).mapv(|v| v * v).sum().sqrt();
                let bound = ((tol * zs * 0.5) / b).ln() / rho.ln() + 2.0;
                assert!(
                    (count as f64) <= bound.max(2.0),
                    "ρ {rho} tol {tol}: {count} evaluations > bound {bound}"
                );
            }
        }
    }
}

#[test]
fn anderson_saves_little_at_small_rho_and_much_near_one() {
    let cfg = RhoSweepConfig {
        rhos: vec![0.29, 0.99],
        rel_tols: vec![1e-4],
        ..RhoSweepConfig::default()
    };
    let rows = rho_sweep(&cfg, &solvers()).unwrap();
    let saving = |rho: f64| {
        rows.iter()
            .find(|r| r.rho == rho && r.solver == "anderson")
            .unwrap()
            .saving_vs_picard
    };
    assert!(saving(0.99) > 0.5, "{rows:#?}");
    assert!(saving(0.99) > saving(0.29) + 0.3, "{rows:#?}");
}

#[test]
fn bad_sweeps_are_refused_naming_the_field() {
    for (cfg, field) in [
        (
            RhoSweepConfig {
                rhos: vec![1.0],
                ..RhoSweepConfig::default()
            },
            "rhos",
        ),
        (
            RhoSweepConfig {
                rel_tols: vec![0.0],
                ..RhoSweepConfig::default()
            },
            "rel_tols",
        ),
        (
            RhoSweepConfig {
                batch: 0,
                ..RhoSweepConfig::default()
            },
            "dim",
        ),
    ] {
        let e = rho_sweep(&cfg, &solvers()).unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
    }
    let e = rho_sweep(&RhoSweepConfig::default(), &[SolverConfig::anderson()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("picard"), "{e}");
}
