//! Canonical solver study (table 7a): every fixed-point solver on the canonical problems (no
//! model), one row per `elm solve` and one residual plot per `elm study`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::elm_cli::{args, path_arg, ElmCli, Unread, SOLVERS};
use crate::error::ReproError;
use crate::markdown::{float, NOT_APPLICABLE};

/// Problems and, for `linear`, the spectral radius ρ of A.
const PROBLEMS: [(&str, Option<&str>); 6] = [
    ("linear", Some("0.5")),
    ("linear", Some("0.9")),
    ("linear", Some("0.99")),
    ("tanh", None),
    ("cos", None),
    ("poisson", None),
];

/// The keys of `elm solve --json` the table reads.
#[derive(Debug, Deserialize)]
struct SolveOutput {
    converged: bool,
    iterations: usize,
    map_evals: usize,
    /// Required key; null when the final residual is not finite.
    #[serde(deserialize_with = "Option::deserialize")]
    residual: Option<f64>,
    /// Required key; null when the problem has no closed-form solution (tanh) or the error is
    /// not finite.
    #[serde(deserialize_with = "Option::deserialize")]
    error_vs_exact: Option<f64>,
    seconds: f64,
}

/// One row of the canonical-solver table.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanonicalRow {
    pub problem: String,
    pub solver: String,
    pub converged: bool,
    pub iterations: usize,
    pub map_evals: usize,
    #[serde(deserialize_with = "Option::deserialize")]
    pub residual: Option<f64>,
    #[serde(deserialize_with = "Option::deserialize")]
    pub error_vs_exact: Option<f64>,
    pub seconds: f64,
}

impl CanonicalRow {
    /// The row of one `elm solve` of `problem` (its label) by `solver`.
    fn solved(problem: &str, solver: &str, o: SolveOutput) -> Self {
        CanonicalRow {
            problem: problem.into(),
            solver: solver.into(),
            converged: o.converged,
            iterations: o.iterations,
            map_evals: o.map_evals,
            residual: o.residual,
            error_vs_exact: o.error_vs_exact,
            seconds: o.seconds,
        }
    }

    pub fn cells(&self) -> Vec<String> {
        vec![
            self.problem.clone(),
            self.solver.clone(),
            self.converged.to_string(),
            self.iterations.to_string(),
            self.map_evals.to_string(),
            self.residual.map_or_else(|| "non-finite".into(), float),
            self.error_vs_exact
                .map_or_else(|| NOT_APPLICABLE.into(), float),
            float(self.seconds),
        ]
    }
}

/// The study's rows and residual plots.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Canonical {
    pub rows: Vec<CanonicalRow>,
    pub plots: Vec<PathBuf>,
}

/// Runs the study; plots go to `out_dir/study_*.svg`.
pub fn run(elm: &ElmCli, out_dir: &Path) -> Result<Canonical, ReproError> {
    let mut rows = vec![];
    let mut plots = vec![];
    for (problem, rho) in PROBLEMS {
        let label = match rho {
            Some(r) => format!("{problem} ρ={r}"),
            None => problem.to_string(),
        };
        let rho_args = rho.map(|r| args(&["--rho", r])).unwrap_or_default();
        for solver in SOLVERS {
            let mut solve = args(&["solve", "--problem", problem, "--solver", solver]);
            solve.extend(rho_args.iter().cloned());
            let o = elm.run::<SolveOutput>(&solve)?.typed;
            rows.push(CanonicalRow::solved(&label, solver, o));
        }
        let plot = out_dir.join(format!(
            "study_{}.svg",
            label.replace('ρ', "rho").replace([' ', '='], "_")
        ));
        let mut study = args(&["study", "--problem", problem, "--plot"]);
        study.push(path_arg(&plot));
        study.extend(rho_args);
        elm.run::<Unread>(&study)?;
        plots.push(plot);
    }
    Ok(Canonical { rows, plots })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elm_cli::decode;

    const SOLVED: &str = r#"{"converged": true, "iterations": 12, "map_evals": 12,
        "residual": 3e-9, "error_vs_exact": null, "seconds": 0.002, "solver": "anderson"}"#;

    #[test]
    fn null_error_is_not_applicable() {
        let o = decode::<SolveOutput>("elm solve", SOLVED.as_bytes())
            .unwrap()
            .typed;
        let row = CanonicalRow::solved("tanh", "anderson", o);
        let cells = row.cells();
        assert_eq!(cells[5], "3.000e-9");
        assert_eq!(cells[6], NOT_APPLICABLE);
    }

    #[test]
    fn missing_nullable_key_is_still_an_error() {
        let text = SOLVED.replace(r#""error_vs_exact": null, "#, "");
        let err = decode::<SolveOutput>("elm solve --problem tanh", text.as_bytes())
            .err()
            .expect("error_vs_exact is required")
            .to_string();
        assert!(err.contains("missing field `error_vs_exact`"), "{err}");
        assert!(err.contains("elm solve --problem tanh"), "{err}");
    }
}
