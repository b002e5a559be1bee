//! The registries of built-in solvers: every fixed-point solver ([`SolverKind::ALL`]) and every
//! linear method ([`LinearSolverKind::ALL`]) round-trips through its name and through JSON. The
//! tests iterate the one list, so a new variant is covered without touching them.

use elm_solver::{
    LinearSolverConfig, LinearSolverKind, SolverConfig, SolverKind, BUILTIN_LINEAR_SOLVERS,
    BUILTIN_SOLVERS,
};

#[test]
fn builtin_solver_names_are_the_kinds_names_in_order() {
    let names: Vec<&str> = SolverKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(names, BUILTIN_SOLVERS);
    assert_eq!(SolverKind::NAMES, BUILTIN_SOLVERS);
    let linear: Vec<&str> = LinearSolverKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(linear, BUILTIN_LINEAR_SOLVERS);
    assert_eq!(LinearSolverKind::NAMES, BUILTIN_LINEAR_SOLVERS);
    // A name means one solver: no linear method shares a fixed-point solver's name.
    for name in BUILTIN_LINEAR_SOLVERS {
        assert!(!BUILTIN_SOLVERS.contains(&name), "{name} names two solvers");
    }
}

#[test]
fn every_fixed_point_solver_round_trips_through_its_name() {
    for kind in SolverKind::ALL {
        let name = kind.name();
        assert_eq!(name.parse::<SolverKind>().unwrap(), kind);
        let cfg = SolverConfig::by_name(name).unwrap();
        assert_eq!(cfg, kind.default_config());
        assert_eq!(cfg.kind(), Some(kind));
        assert_eq!(cfg.name(), name);
        assert_eq!(cfg.build::<f64>().name(), name);
        assert_eq!(cfg.build::<f32>().name(), name);
        assert_eq!(name.parse::<SolverConfig>().unwrap(), cfg);
        cfg.validate().unwrap();
    }
    assert!("newton".parse::<SolverKind>().is_err());
    assert!(SolverConfig::by_name("custom").is_err());
}

#[test]
fn every_linear_solver_round_trips_through_its_name() {
    for kind in LinearSolverKind::ALL {
        let name = kind.name();
        assert_eq!(name.parse::<LinearSolverKind>().unwrap(), kind);
        let cfg = LinearSolverConfig::by_name(name).unwrap();
        assert_eq!(cfg, kind.default_config());
        assert_eq!(cfg.kind(), Some(kind));
        assert_eq!(cfg.name(), name);
        assert_eq!(cfg.fixed_point(), None);
        assert_eq!(name.parse::<LinearSolverConfig>().unwrap(), cfg);
        cfg.validate().unwrap();
    }
    // Every fixed-point solver is also a linear solver, by the same name.
    for kind in SolverKind::ALL {
        let cfg = LinearSolverConfig::by_name(kind.name()).unwrap();
        assert_eq!(cfg.kind(), None);
        assert_eq!(cfg.name(), kind.name());
        assert_eq!(cfg.fixed_point(), Some(&kind.default_config()));
    }
    assert!("newton".parse::<LinearSolverKind>().is_err());
    assert!(LinearSolverConfig::by_name("newton").is_err());
}

#[cfg(feature = "serde")]
mod json {
    use super::*;

    /// The JSON form's `kind` is the solver's name.
    fn kind_of(json: &serde_json::Value) -> &str {
        json["kind"].as_str().expect("a string `kind`")
    }

    #[test]
    fn every_fixed_point_solver_round_trips_through_json() {
        for kind in SolverKind::ALL {
            let cfg = kind.default_config();
            let json = serde_json::to_value(&cfg).unwrap();
            assert_eq!(kind_of(&json), kind.name());
            let back: SolverConfig = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(back, cfg);
            assert_eq!(SolverConfig::from_json(&json.to_string()).unwrap(), cfg);
            // As the fixed-point variant of a linear solver it reads and writes the same.
            let linear = LinearSolverConfig::FixedPoint(cfg.clone());
            assert_eq!(serde_json::to_value(&linear).unwrap(), json);
            assert_eq!(
                LinearSolverConfig::from_json(&json.to_string()).unwrap(),
                linear
            );
        }
    }

    #[test]
    fn every_linear_solver_round_trips_through_json() {
        for kind in LinearSolverKind::ALL {
            let cfg = kind.default_config();
            let json = serde_json::to_value(&cfg).unwrap();
            assert_eq!(kind_of(&json), kind.name());
            let back: LinearSolverConfig = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(back, cfg);
            assert_eq!(
                LinearSolverConfig::from_json(&json.to_string()).unwrap(),
                cfg
            );
            // `{"kind": name}` alone is the default config.
            let bare = format!(r#"{{"kind": "{}"}}"#, kind.name());
            assert_eq!(LinearSolverConfig::from_json(&bare).unwrap(), cfg);
        }
    }
}

/// Every canonical problem round-trips through its name, and an unknown name lists the list.
#[test]
fn every_problem_kind_round_trips_through_its_name() {
    use elm_solver::problems::{Problem, ProblemKind, PROBLEM_NAMES};
    let names: Vec<&str> = ProblemKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(names, PROBLEM_NAMES);
    for kind in ProblemKind::ALL {
        assert_eq!(kind.name().parse::<ProblemKind>().unwrap(), kind);
        let p = Problem::by_name(kind.name(), 0.5, 0).unwrap();
        assert_eq!((p.kind(), p.name()), (kind, kind.name()));
    }
    let e = Problem::by_name("nope", 0.5, 0).err().unwrap().to_string();
    assert!(
        e.contains("nope") && e.contains(&PROBLEM_NAMES.join("|")),
        "{e}"
    );
}
