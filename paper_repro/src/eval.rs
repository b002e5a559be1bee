//! ELM evaluation and solver comparison (`elm eval --task gsm8k`): the dense model, then the
//! trained ELM with every solver at each tolerance δ.

use std::path::Path;

use indicatif::ProgressBar;
use serde::Deserialize;
use serde_json::json;

use crate::elm_cli::{args, path_arg, ElmCli, SOLVERS};
use crate::error::ReproError;
use crate::markdown::{float, Table, NOT_APPLICABLE};
use crate::scale::Limits;
use crate::summary::Summary;

/// Per-token residual tolerances δ compared for every solver.
const TOLERANCES: [&str; 2] = ["0.1", "0.5"];

/// `elm eval` runs of the section: the dense model, then every solver × tolerance.
pub const RUNS: usize = 1 + SOLVERS.len() * TOLERANCES.len();

/// The keys of `elm eval --json` (`elm::eval::gsm8k::Gsm8kResult`) every row reads.
#[derive(Debug, Deserialize)]
struct Scores {
    accuracy: f64,
    /// Null only under `--no-perplexity`, which paper_repro never passes.
    answer_perplexity: f64,
    tok_s: f64,
}

/// An ELM row also reads the fixed-point statistics.
#[derive(Debug, Deserialize)]
struct ElmScores {
    #[serde(flatten)]
    scores: Scores,
    solver: SolverStats,
}

/// The fields of `elm::eval::gsm8k::SolverSummary` the table reads.
#[derive(Debug, Deserialize)]
struct SolverStats {
    mean_iterations: f64,
    max_iterations: usize,
    layer_evals_per_token: f64,
}

/// What the runs share.
pub struct EvalInputs<'a> {
    pub model: &'a Path,
    pub data_dir: &'a Path,
    /// The trained ELM checkpoint.
    pub trained: &'a Path,
    /// Decoder-block evaluations per token of the dense model.
    pub dense_layers: usize,
}

/// Evaluates the dense model and the ELM; returns the GSM8K table.
pub fn section(
    elm: &ElmCli,
    inputs: &EvalInputs<'_>,
    limits: &Limits,
    bar: &ProgressBar,
    summary: &mut Summary,
) -> Result<String, ReproError> {
    let mut table = Table::new(&[
        "model",
        "solver",
        "δ",
        "accuracy",
        "answer perplexity",
        "mean it/token",
        "max it",
        "layer evals/token",
        "tok/s",
    ]);
    let dense_args = args(&[
        "eval",
        "--model",
        &path_arg(inputs.model),
        "--task",
        "gsm8k",
        "--limit",
        &limits.gsm8k_eval.to_string(),
        "--max-new-tokens",
        &limits.max_new_tokens.to_string(),
        "--batch",
        "10",
        "--data-dir",
        &path_arg(inputs.data_dir),
    ]);
    let dense = elm.run::<Scores>(&dense_args)?;
    bar.inc(1);
    let na = || NOT_APPLICABLE.to_string();
    let dense_scores = &dense.typed;
    table.row(&[
        "dense".into(),
        na(),
        na(),
        float(dense_scores.accuracy),
        float(dense_scores.answer_perplexity),
        na(),
        na(),
        inputs.dense_layers.to_string(),
        float(dense_scores.tok_s),
    ]);
    summary.push("eval", &[("model", json!("dense"))], dense.raw);
    for solver in SOLVERS {
        for tol in TOLERANCES {
            let mut elm_args = dense_args.clone();
            elm_args.extend(args(&["--elm", &path_arg(inputs.trained)]));
            elm_args.extend(args(&["--solver", solver, "--tol", tol]));
            let step = elm.run::<ElmScores>(&elm_args)?;
            let ElmScores {
                scores,
                solver: fixed_point,
            } = &step.typed;
            table.row(&[
                "ELM".into(),
                solver.into(),
                tol.into(),
                float(scores.accuracy),
                float(scores.answer_perplexity),
                float(fixed_point.mean_iterations),
                fixed_point.max_iterations.to_string(),
                float(fixed_point.layer_evals_per_token),
                float(scores.tok_s),
            ]);
            summary.push(
                "eval",
                &[
                    ("model", json!("elm")),
                    ("solver", json!(solver)),
                    ("tol", json!(tol)),
                ],
                step.raw,
            );
            bar.inc(1);
        }
    }
    Ok(format!(
        "GSM8K: first {} test problems, greedy, {} new tokens; iterations include the commit pass.\n\n{}",
        limits.gsm8k_eval,
        limits.max_new_tokens,
        table.into_markdown()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elm_cli::decode;

    const ELM_EVAL: &str = r#"{"n": 2, "correct": 1, "accuracy": 0.5,
        "answer_perplexity": 3.2, "tok_s": 40.0, "seconds": 1.0,
        "solver": {"tokens": 10, "mean_iterations": 4.5, "max_iterations": 9,
                   "layer_evals_per_token": 27.5, "mean_residual": 0.1, "converged_frac": 1.0}}"#;

    #[test]
    fn elm_eval_decodes() {
        let step = decode::<ElmScores>("elm eval", ELM_EVAL.as_bytes()).unwrap();
        assert_eq!(step.typed.solver.max_iterations, 9);
        assert_eq!(step.typed.scores.accuracy, 0.5);
    }

    #[test]
    fn missing_solver_key_is_named() {
        let printed = ELM_EVAL.replace(r#""mean_iterations": 4.5, "#, "");
        let err = decode::<ElmScores>("elm eval --elm ck --solver picard", printed.as_bytes())
            .err()
            .expect("a missing solver statistic must be an error")
            .to_string();
        assert!(err.contains("missing field `mean_iterations`"), "{err}");
        assert!(err.contains("`elm eval --elm ck --solver picard`"), "{err}");
    }

    #[test]
    fn missing_top_level_key_is_named_through_flatten() {
        let printed = ELM_EVAL.replace(r#""tok_s": 40.0, "#, "");
        let err = decode::<ElmScores>("elm eval", printed.as_bytes())
            .err()
            .expect("a missing score must be an error")
            .to_string();
        assert!(err.contains("missing field `tok_s`"), "{err}");
    }

    /// The library's solver summary, as `elm eval --json` nests it, must decode.
    #[test]
    fn library_solver_summary_decodes() {
        let summary = elm::eval::gsm8k::SolverSummary::default();
        let value = serde_json::to_value(&summary).unwrap();
        assert!(SolverStats::deserialize(&value).is_ok(), "{value}");
    }
}
