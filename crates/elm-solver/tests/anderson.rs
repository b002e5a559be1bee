//! Anderson's safeguard, and which fixed point each solver reaches when there are two. References:
//! closed forms (the 1-D map `z − atan z`, whose steps are computed here by hand) and the exact
//! means of both solutions of the discrete Chandrasekhar H-equation.

use elm_solver::{
    AndersonConfig, OutputOptions, RowFnMap, RowStatus, SolverConfig, SolverError, StopCriteria,
};
use ndarray::{Array2, ArrayView1, ArrayViewMut1};

fn anderson(history: usize, safeguard: bool, output: OutputOptions) -> SolverConfig {
    SolverConfig::Anderson(AndersonConfig {
        history,
        safeguard,
        output,
        ..AndersonConfig::default()
    })
}

/// `f(z) = z − atan z`: the only fixed point is 0 and Picard reaches it from anywhere (f is
/// monotone with 0 ≤ f' < 1), but a secant step from far out overshoots to where the residual
/// `|atan z|` is larger, as Newton's method on `atan` does.
fn atan_map() -> RowFnMap<impl FnMut(ArrayView1<f64>, ArrayViewMut1<f64>)> {
    RowFnMap::new(1, |z: ArrayView1<f64>, mut out: ArrayViewMut1<f64>| {
        out[0] = z[0] - z[0].atan();
    })
}

#[test]
fn a_rejected_point_is_replaced_by_the_plain_step_from_the_last_accepted_one() {
    let output = OutputOptions {
        trace: true,
        ..OutputOptions::default()
    };
    let stop = StopCriteria::absolute(1e-12, 200);
    let mut map = atan_map();
    let z0 = Array2::from_elem((1, 1), 3.0);
    let sol = anderson(5, true, output)
        .build::<f64>()
        .solve(&mut map, z0.view(), &stop)
        .unwrap();
    let row = &sol.rows[0];
    assert_eq!(row.status, RowStatus::Converged, "{row:?}");
    assert!(row.rejections >= 1, "{row:?}");
    let trace = row.trace.as_ref().unwrap();
    // By hand: z0 = 3, z1 = z0 − atan z0 (the first, plain step); the secant step from
    // (z0, z1) lands at z2 with |atan z2| > |atan z1|: rejected; z3 = z1 − atan z1.
    let g = |z: f64| -z.atan();
    let z1 = 3.0 + g(3.0);
    let slope = (g(z1) - g(3.0)) / (z1 - 3.0);
    let z2 = z1 - g(z1) / slope;
    let z3 = z1 + g(z1);
    let close = |a: f64, b: f64, tol: f64| (a - b).abs() <= tol * b.abs().max(1.0);
    assert!(close(trace[1], g(z1).abs(), 1e-14), "{trace:?}");
    // Anderson's least squares carries a ridge (λ = 1e-10 relative): z2 is the secant point to
    // about that accuracy. z3 is a plain step, exact to rounding.
    assert!(close(trace[2], g(z2).abs(), 1e-8), "{trace:?} z2 {z2}");
    assert!(trace[2] > trace[1], "{trace:?}");
    assert!(close(trace[3], g(z3).abs(), 1e-14), "{trace:?} z3 {z3}");
}

/// On a contraction (|f'| < 1) the plain step never raises the residual, so with the safeguard
/// every accepted point's residual is at most the one before it: the residual trace rises
/// exactly at the rejected points, and nowhere else. Plain Anderson's trace rises unchecked.
#[test]
fn with_the_safeguard_residuals_rise_only_at_rejected_points() {
    let starts = [3.0, 10.0, 30.0, -20.0, 100.0];
    let z0 = Array2::from_shape_vec((starts.len(), 1), starts.to_vec()).unwrap();
    let stop = StopCriteria::absolute(1e-12, 500);
    let output = OutputOptions {
        trace: true,
        ..OutputOptions::default()
    };
    let run = |safeguard| {
        anderson(5, safeguard, output.clone())
            .build::<f64>()
            .solve(&mut atan_map(), z0.view(), &stop)
            .unwrap()
    };
    // Points whose residual exceeds the lowest one before them.
    let rises = |trace: &[f64]| {
        let mut best = f64::INFINITY;
        let mut n = 0;
        for &r in trace {
            if r > best {
                n += 1;
            }
            best = best.min(r);
        }
        n
    };
    let safe = run(true);
    for (row, start) in safe.rows.iter().zip(starts) {
        assert_eq!(row.status, RowStatus::Converged, "from {start}: {row:?}");
        assert!(row.rejections >= 1, "from {start}: {row:?}");
        assert_eq!(
            rises(row.trace.as_ref().unwrap()),
            row.rejections,
            "from {start}"
        );
    }
    let plain = run(false);
    let plain_rises: usize = plain
        .rows
        .iter()
        .map(|r| rises(r.trace.as_ref().unwrap()))
        .sum();
    assert!(plain_rises > 0);
    assert!(plain.rows.iter().all(|r| r.rejections == 0));
}

#[test]
fn the_safeguard_factor_is_validated() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let cfg = AndersonConfig {
            safeguard: true,
            safeguard_factor: bad,
            ..AndersonConfig::default()
        };
        match cfg.validate() {
            Err(SolverError::Config { field, .. }) => assert_eq!(field, "safeguard_factor"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

/// The Chandrasekhar H-equation `H(μ) = 1 / (1 − (c/2) ∫₀¹ μ H(ν)/(μ + ν) dν)`, midpoint rule
/// on `n` nodes (Kelley, *Iterative Methods for Linear and Nonlinear Equations*, SIAM 1995,
/// §5.6). For 0 < c < 1 it has two solutions; their means are exactly
/// `(2/c)(1 ∓ √(1 − c))` (integrate the equation times `H(μ)` and symmetrise: the identity holds
/// for the discrete sums too). Picard from `H = 1` rises monotonically to the smaller one, the
/// physical one; the larger one repels Picard (ρ(G') > 1 there).
fn h_equation(n: usize, c: f64) -> RowFnMap<impl FnMut(ArrayView1<f64>, ArrayViewMut1<f64>)> {
    let mu: Vec<f64> = (0..n).map(|i| (i as f64 + 0.5) / n as f64).collect();
    RowFnMap::new(n, move |h: ArrayView1<f64>, mut out: ArrayViewMut1<f64>| {
        for i in 0..n {
            let s: f64 = (0..n).map(|j| mu[i] * h[j] / (mu[i] + mu[j])).sum();
            out[i] = 1.0 / (1.0 - c / (2.0 * n as f64) * s);
        }
    })
}

#[derive(Debug, PartialEq)]
enum Branch {
    Physical,
    Other,
}

/// Near the fold (c → 1) default Anderson leaves the start's branch and lands on the solution
/// that repels Picard, with a residual that shrank all the way, as does the safeguarded one;
/// Picard, Broyden and Anderson(1) stay. The spectral-radius estimate tells the two apart.
#[test]
fn near_a_fold_anderson_can_leave_the_branch_and_the_spectral_radius_says_so() {
    let (n, c): (usize, f64) = (100, 0.9999);
    let physical = 2.0 / c * (1.0 - (1.0 - c).sqrt());
    let other = 2.0 / c * (1.0 + (1.0 - c).sqrt());
    let output = OutputOptions {
        spectral_radius_iters: 400,
        ..OutputOptions::default()
    };
    let stop = StopCriteria::absolute(1e-11, 5000);
    let cases = [
        (
            "picard",
            SolverConfig::picard().with_output(output.clone()),
            Some(Branch::Physical),
        ),
        (
            "broyden",
            SolverConfig::broyden().with_output(output.clone()),
            Some(Branch::Physical),
        ),
        (
            "anderson(1)",
            anderson(1, false, output.clone()),
            Some(Branch::Physical),
        ),
        (
            "anderson(5)",
            anderson(5, false, output.clone()),
            Some(Branch::Other),
        ),
        (
            "anderson(5) safeguarded",
            anderson(5, true, output.clone()),
            None,
        ),
    ];
    for (name, cfg, expected) in cases {
        let mut map = h_equation(n, c);
        let sol = cfg
            .build::<f64>()
            .solve(&mut map, Array2::ones((1, n)).view(), &stop)
            .unwrap();
        let row = &sol.rows[0];
        assert_eq!(row.status, RowStatus::Converged, "{name}: {row:?}");
        let mean = sol.z.mean().unwrap();
        let branch = if (mean - physical).abs() < 1e-7 {
            Branch::Physical
        } else if (mean - other).abs() < 1e-7 {
            Branch::Other
        } else {
            panic!("{name}: mean {mean} is neither {physical} nor {other}");
        };
        if let Some(want) = expected {
            assert_eq!(branch, want, "{name}");
        }
        let rho = row.spectral_radius.unwrap();
        match branch {
            Branch::Physical => assert!(rho < 1.0, "{name}: ρ {rho}"),
            Branch::Other => assert!(rho > 1.0, "{name}: ρ {rho}"),
        }
        eprintln!(
            "{name}: {branch:?}, ρ {rho:.5}, {} evaluations",
            row.iterations
        );
    }
}
