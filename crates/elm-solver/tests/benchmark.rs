//! The benchmark problems: known roots, the fixed-point form, the registry, and that Anderson
//! solves every one of them (scripts/solver-benchmark.sh compares every solver with SciPy's).

use elm_solver::benchmark::{BenchmarkKind, BenchmarkProblem, BENCHMARK_PROBLEMS};
use elm_solver::{FixedPointMap, RowStatus, SolverConfig, StopCriteria};
use ndarray::{array, Array2};

fn root_at(name: &str, x: &[f64]) -> Vec<f64> {
    let p = BenchmarkProblem::by_name(name).unwrap();
    let x = Array2::from_shape_vec((1, x.len()), x.to_vec()).unwrap();
    p.root(x.view()).unwrap().row(0).to_vec()
}

#[test]
fn known_roots_are_roots() {
    // F3: A x = b with A = [[-2,1,0],[1,-2,1],[0,1,-2]], b = (1,2,3): x = (−2.5, −4, −3.5).
    for v in root_at("scipy-F3", &[-2.5, -4.0, -3.5]) {
        assert!(v.abs() < 1e-14, "{v}");
    }
    // F5: equal flows through four equal valves carry the total 4.
    assert_eq!(root_at("scipy-F5", &[1.0; 4]), vec![0.0; 4]);
    assert_eq!(root_at("scipy-F2", &[0.0; 6]), vec![0.0; 6]);
    assert_eq!(root_at("scipy-F", &[0.0; 5]), vec![0.0; 5]);
    // F4 (Powell): x0·x1 = 1e-4 and e^{−x0} + e^{−x1} = 1 + 1e-4 at (1.098159e-5, 9.106146).
    let f4 = root_at("scipy-F4-powell", &[1.098_159_3e-5, 9.106_146_7]);
    assert!(f4.iter().all(|v| v.abs() < 1e-6), "{f4:?}");
}

#[test]
fn the_map_is_x_plus_alpha_f_and_alpha_is_scipys_default() {
    let mut p = BenchmarkProblem::by_name("scipy-F").unwrap();
    // α = 0.5·max(‖x0‖, 1)/‖F(x0)‖ with x0 = 1: F(x0) = −(d + 0.05).
    let f0: f64 = [3.05f64, 2.05, 1.55, 1.05, 0.55]
        .iter()
        .map(|v| v * v)
        .sum::<f64>()
        .sqrt();
    assert!((p.alpha() - 0.5 * 5f64.sqrt() / f0).abs() < 1e-15);
    let x = array![[0.3, -0.1, 0.7, 0.2, -0.4]];
    let f = p.root(x.view()).unwrap();
    let mut g = Array2::zeros((1, 5));
    p.eval(x.view(), &[true], g.view_mut()).unwrap();
    assert_eq!(g, &x + &(f * p.alpha()));
    assert_eq!(
        BenchmarkProblem::by_name("scipy-F2-lucky").unwrap().alpha(),
        1.0
    );
}

#[test]
fn registry_round_trips_and_refuses_unknown_names() {
    for (kind, name) in BenchmarkKind::ALL.iter().zip(BENCHMARK_PROBLEMS) {
        assert_eq!(name.parse::<BenchmarkKind>().unwrap(), *kind);
        assert_eq!(BenchmarkProblem::new(*kind).unwrap().kind(), *kind);
    }
    let err = BenchmarkProblem::by_name("rosenbrock").err().unwrap();
    assert!(
        err.to_string().contains("unknown benchmark problem"),
        "{err}"
    );
}

#[test]
fn anderson_solves_every_benchmark_problem() {
    for name in BENCHMARK_PROBLEMS {
        let mut p = BenchmarkProblem::by_name(name).unwrap();
        let stop = StopCriteria::absolute(p.alpha() * 1e-6, 5000);
        let x0 = p.x0();
        let sol = SolverConfig::anderson()
            .build::<f64>()
            .solve(&mut p, x0.view(), &stop)
            .unwrap();
        assert!(
            sol.rows.iter().all(|r| r.status == RowStatus::Converged),
            "{name}: {:?}",
            sol.rows.iter().map(|r| r.status).collect::<Vec<_>>()
        );
        let worst = p
            .root(sol.z.view())
            .unwrap()
            .iter()
            .fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(worst <= 1e-6, "{name}: max|F| = {worst}");
    }
}
