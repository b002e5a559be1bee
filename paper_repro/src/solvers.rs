//! Canonical solver study: every fixed-point solver on the canonical problems (no model), one
//! table row per `elm solve` and one residual plot per `elm study`.

use std::path::Path;

use serde::Deserialize;
use serde_json::json;

use crate::elm_cli::{args, path_arg, ElmCli, Unread, SOLVERS};
use crate::error::ReproError;
use crate::markdown::{float, Table, NOT_APPLICABLE};
use crate::summary::Summary;

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

impl SolveOutput {
    fn cells(&self, problem: &str, solver: &str) -> Vec<String> {
        vec![
            problem.to_string(),
            solver.to_string(),
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

/// Runs the study; returns its Markdown section. Plots go to `out_dir/study_*.svg`.
pub fn section(elm: &ElmCli, out_dir: &Path, summary: &mut Summary) -> Result<String, ReproError> {
    let mut table = Table::new(&[
        "problem",
        "solver",
        "converged",
        "iterations",
        "map evals",
        "residual",
        "error vs exact",
        "seconds",
    ]);
    let bar = indicatif::ProgressBar::new((PROBLEMS.len() * (SOLVERS.len() + 1)) as u64);
    for (problem, rho) in PROBLEMS {
        let label = match rho {
            Some(r) => format!("{problem} ρ={r}"),
            None => problem.to_string(),
        };
        let rho_args = rho.map(|r| args(&["--rho", r])).unwrap_or_default();
        for solver in SOLVERS {
            let mut solve = args(&["solve", "--problem", problem, "--solver", solver]);
            solve.extend(rho_args.iter().cloned());
            let step = elm.run::<SolveOutput>(&solve)?;
            table.row(&step.typed.cells(&label, solver));
            summary.push("solvers", &[("problem", json!(label))], step.raw);
            bar.inc(1);
        }
        let plot = out_dir.join(format!(
            "study_{}.svg",
            label.replace('ρ', "rho").replace([' ', '='], "_")
        ));
        let mut study = args(&["study", "--problem", problem, "--plot"]);
        study.push(path_arg(&plot));
        study.extend(rho_args);
        let step = elm.run::<Unread>(&study)?;
        summary.push(
            "study",
            &[("problem", json!(label)), ("plot", json!(plot))],
            step.raw,
        );
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(format!(
        "## Fixed-point solvers on canonical problems (tol 1e-8 absolute)\n\n{}",
        table.into_markdown()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elm_cli::decode;

    const SOLVED: &str = r#"{"converged": true, "iterations": 12, "map_evals": 12,
        "residual": 3e-9, "error_vs_exact": null, "seconds": 0.002, "solver": "anderson"}"#;

    #[test]
    fn null_error_is_not_applicable() {
        let step = decode::<SolveOutput>("elm solve", SOLVED.as_bytes()).unwrap();
        let cells = step.typed.cells("tanh", "anderson");
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
