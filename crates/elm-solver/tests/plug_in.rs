//! The crate's open doors: a solver written outside it stands wherever a `SolverConfig` does, a
//! map's own error comes back unchanged, and the built-in names come from one list.

use elm_solver::problems::{CosProblem, LinearProblem, DOTTIE};
use elm_solver::{
    FixedPointMap, FixedPointSolver, FnMap, MapError, Observer, RowOutcome, RowStatus, Solution,
    SolverConfig, SolverError, SolverFloat, StopCriteria, BUILTIN_SOLVERS,
};
use ndarray::{Array2, ArrayView2, ArrayViewMut2};

/// Plain Picard written against the public trait only (no engine): what a user would write first.
#[derive(Clone)]
struct MyPicard;

impl<T: SolverFloat> FixedPointSolver<T> for MyPicard {
    fn name(&self) -> &'static str {
        "my-picard"
    }
    fn solve_observed(
        &self,
        map: &mut dyn FixedPointMap<T>,
        z0: ArrayView2<T>,
        stop: &StopCriteria,
        _observer: &mut dyn Observer<T>,
    ) -> elm_solver::Result<Solution<T>> {
        stop.validate()?;
        let (b, d) = z0.dim();
        let mut z = z0.to_owned();
        let mut fz = Array2::<T>::zeros((b, d));
        let active = vec![true; b];
        let mut evals = 0;
        loop {
            map.eval(z.view(), &active, fz.view_mut())?;
            evals += 1;
            let res = (&fz - &z).mapv(|v| v.widen() * v.widen()).sum().sqrt();
            std::mem::swap(&mut z, &mut fz);
            if res <= stop.abs_tol || evals >= stop.max_iter {
                let status = if res <= stop.abs_tol {
                    RowStatus::Converged
                } else {
                    RowStatus::MaxIter
                };
                let row = RowOutcome {
                    status,
                    iterations: evals,
                    residual: res,
                    rel_residual: 0.0,
                    trace: None,
                    spectral_radius: None,
                    restarts: 0,
                    backtracks: 0,
                    rejections: 0,
                };
                return Ok(Solution {
                    z,
                    rows: vec![row; b],
                    map_evals: evals,
                    spectral_map_evals: 0,
                });
            }
        }
    }
}

#[test]
fn a_custom_solver_builds_for_both_float_types_and_keeps_its_name() {
    let cfg = SolverConfig::custom(MyPicard);
    assert_eq!(cfg.name(), "my-picard");
    assert!(cfg.validate().is_ok());
    assert_eq!(cfg, cfg.clone(), "a clone is the same solver");
    assert_ne!(
        cfg,
        SolverConfig::custom(MyPicard),
        "another instance is another solver"
    );
    let stop = StopCriteria::absolute(1e-10, 500);
    let sol64 = cfg
        .build::<f64>()
        .solve(&mut CosProblem, Array2::zeros((2, 1)).view(), &stop)
        .unwrap();
    assert!((sol64.z[[1, 0]] - DOTTIE).abs() < 1e-9);
    let sol32 = cfg
        .build::<f32>()
        .solve(
            &mut CosProblem,
            Array2::zeros((1, 1)).view(),
            &StopCriteria::absolute(1e-6, 500),
        )
        .unwrap();
    assert!((sol32.z[[0, 0]] as f64 - DOTTIE).abs() < 1e-5);
    // solve_in falls back to a fresh solve and leaves the result in the workspace.
    let mut ws = elm_solver::SolveWorkspace::<f64>::new();
    let mut lin = LinearProblem::canonical(0.5, 1).unwrap();
    cfg.build::<f64>()
        .solve_in(&mut ws, &mut lin, Array2::zeros((1, 100)).view(), &stop)
        .unwrap();
    let err = (&ws.z().row(0) - &lin.exact.row(0))
        .mapv(|v| v * v)
        .sum()
        .sqrt();
    assert!(err < 1e-9, "error {err}");
}

#[cfg(feature = "serde")]
#[test]
fn a_custom_solver_is_written_by_name_and_never_read_back() {
    let cfg = SolverConfig::custom(MyPicard);
    let text = serde_json::to_string(&cfg).unwrap();
    assert_eq!(text, r#"{"kind":"custom","name":"my-picard"}"#);
    let err = SolverConfig::from_json(&text).unwrap_err();
    assert!(matches!(err, SolverError::Json { .. }));
    assert!(err.to_string().contains("supplied in code"), "{err}");
    assert!(cfg
        .clone()
        .with_param("beta", serde_json::json!(0.5))
        .is_err());
}

#[cfg(feature = "serde")]
#[test]
fn with_param_sets_a_known_key_and_names_the_owners_of_others() {
    let c = SolverConfig::anderson()
        .with_param("history", serde_json::json!(3))
        .unwrap();
    match c {
        SolverConfig::Anderson(a) => assert_eq!(a.history, 3),
        other => panic!("{other:?}"),
    }
    let err = SolverConfig::picard()
        .with_param("memory", serde_json::json!(4))
        .unwrap_err();
    match err {
        SolverError::Config { field, msg } => {
            assert_eq!(field, "memory");
            assert!(msg.contains("broyden"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // Out of range after the set: validated.
    let err = SolverConfig::picard()
        .with_param("beta", serde_json::json!(0))
        .unwrap_err();
    assert!(matches!(err, SolverError::Config { ref field, .. } if field == "beta"));
    assert!(SolverConfig::picard()
        .with_param("kind", serde_json::json!("broyden"))
        .is_err());
}

#[test]
fn builtin_names_build_their_own_solvers() {
    for name in BUILTIN_SOLVERS {
        let cfg = SolverConfig::by_name(name).unwrap();
        assert_eq!(cfg.name(), name);
        assert_eq!(cfg.build::<f64>().name(), name);
    }
    match SolverConfig::by_name("newton") {
        Err(SolverError::Config { field, msg }) => {
            assert_eq!(field, "kind");
            for name in BUILTIN_SOLVERS {
                assert!(msg.contains(name), "{msg}");
            }
        }
        other => panic!("{other:?}"),
    }
}

#[derive(Debug, PartialEq)]
struct MyMapError(u32);
impl std::fmt::Display for MyMapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "my map failed at call {}", self.0)
    }
}
impl std::error::Error for MyMapError {}

#[test]
fn a_maps_own_error_comes_back_unchanged_from_every_solver() {
    for name in BUILTIN_SOLVERS.iter().copied().chain(["custom"]) {
        let cfg = if name == "custom" {
            SolverConfig::custom(MyPicard)
        } else {
            SolverConfig::by_name(name).unwrap()
        };
        let mut calls = 0u32;
        let mut map = FnMap::new(
            1,
            |z: ArrayView2<f64>, _: &[bool], mut out: ArrayViewMut2<f64>| {
                calls += 1;
                if calls == 3 {
                    return Err(Box::new(MyMapError(calls)) as MapError);
                }
                out[[0, 0]] = z[[0, 0]].cos();
                Ok(())
            },
        );
        let err = cfg
            .build::<f64>()
            .solve(
                &mut map,
                Array2::zeros((1, 1)).view(),
                &StopCriteria::default(),
            )
            .unwrap_err();
        match err {
            SolverError::Map(inner) => {
                assert_eq!(
                    inner.downcast_ref::<MyMapError>(),
                    Some(&MyMapError(3)),
                    "{name}"
                )
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}
