//! The quality table: the dense model, then the trained ELM with every solver at each
//! tolerance δ, all through `elm eval` (one code path for every variant). Each row gives the
//! teacher-forced answer NLL of GSM8K (the primary signal at 135M) and the strict/flexible
//! exact match, each with its 95% bootstrap interval; an ELM row adds ΔNLL and the
//! retention RP = ELM / dense exact match, paired over the same problems
//! (`elm::eval::stats::paired`, the library's own code on the decoded per-item scores).

use std::collections::BTreeMap;
use std::path::Path;

use elm::eval::stats::{paired, BootstrapConfig, Estimate, ItemScore, PairedComparison};
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

/// `elm eval` runs of the section: NLL and exact match for the dense model and for every
/// solver × tolerance.
pub const RUNS: usize = 2 * (1 + SOLVERS.len() * TOLERANCES.len());

/// One metric of `elm eval --json` (`elm::eval::task::MetricReport`).
#[derive(Debug, Deserialize)]
struct Metric {
    estimate: Estimate,
    items: Vec<ItemScore>,
}

/// The fixed-point statistics the table reads (`elm::eval::gsm8k::SolverSummary`).
#[derive(Debug, Deserialize)]
struct SolverStats {
    mean_iterations: f64,
    max_iterations: usize,
    layer_evals_per_token: f64,
}

/// The keys of `elm eval --json` (`elm::eval::task::TaskRun`) every row reads.
#[derive(Debug, Deserialize)]
struct Run {
    metrics: BTreeMap<String, Metric>,
    tok_s: f64,
    solver: SolverStats,
}

impl Run {
    fn metric(&self, name: &str, command: &str) -> Result<&Metric, ReproError> {
        self.metrics.get(name).ok_or_else(|| ReproError::Schema {
            command: command.to_string(),
            source: serde::de::Error::custom(format!("missing metric `{name}`")),
        })
    }
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

/// `value [lo, hi]`.
fn interval(e: &Estimate) -> String {
    format!("{} [{}, {}]", float(e.value), float(e.lo), float(e.hi))
}

/// `Δ [lo, hi]` with the verdict when the interval excludes 0.
fn delta(p: &PairedComparison) -> String {
    let sign = |x: f64| format!("{}{}", if x >= 0.0 { "+" } else { "" }, float(x));
    let mark = match p.verdict.as_str() {
        "higher" => " ↑",
        "lower" => " ↓",
        _ => "",
    };
    format!(
        "{} [{}, {}]{mark}",
        sign(p.delta.value),
        sign(p.delta.lo),
        sign(p.delta.hi)
    )
}

/// The two runs of one model variant.
struct Variant {
    nll: Run,
    em: Run,
}

fn pair(model: &Metric, dense: &Metric, what: &str) -> Result<PairedComparison, ReproError> {
    paired(&model.items, &dense.items, &BootstrapConfig::default()).map_err(|source| {
        ReproError::Elm {
            what: what.to_string(),
            source,
        }
    })
}

/// Evaluates the dense model and the ELM; returns the quality table.
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
        "answer NLL (nats/token)",
        "ΔNLL vs dense",
        "flexible EM",
        "RP (flexible)",
        "strict EM",
        "mean it/token",
        "layer evals/token",
        "NLL tok/s",
    ]);
    let common = |task: &str, limit: usize| {
        args(&[
            "eval",
            "--model",
            &path_arg(inputs.model),
            "--task",
            task,
            "--limit",
            &limit.to_string(),
            "--max-new-tokens",
            &limits.max_new_tokens.to_string(),
            "--batch",
            "8",
            "--data-dir",
            &path_arg(inputs.data_dir),
        ])
    };
    let mut run_variant = |extra: &[String], tags: &[(&str, serde_json::Value)]| {
        let mut out = vec![];
        for (task, limit) in [("gsm8k-nll", limits.nll_eval), ("gsm8k", limits.gsm8k_eval)] {
            let mut a = common(task, limit);
            a.extend(extra.iter().cloned());
            let step = elm.run::<Run>(&a)?;
            let mut t = tags.to_vec();
            t.push(("task", json!(task)));
            summary.push("eval", &t, step.raw);
            bar.inc(1);
            out.push(step.typed);
        }
        let em = out.pop().expect("two runs");
        let nll = out.pop().expect("two runs");
        Ok::<_, ReproError>(Variant { nll, em })
    };
    let dense = run_variant(&[], &[("model", json!("dense"))])?;
    let cmd = "elm eval (dense)";
    let dense_nll = dense.nll.metric("answer_nll", cmd)?;
    let dense_flex = dense.em.metric("flexible_extract", cmd)?;
    let na = || NOT_APPLICABLE.to_string();
    table.row(&[
        "dense".into(),
        na(),
        na(),
        interval(&dense_nll.estimate),
        na(),
        interval(&dense_flex.estimate),
        na(),
        interval(&dense.em.metric("strict_match", cmd)?.estimate),
        na(),
        inputs.dense_layers.to_string(),
        float(dense.nll.tok_s),
    ]);
    for solver in SOLVERS {
        for tol in TOLERANCES {
            let extra = args(&[
                "--elm",
                &path_arg(inputs.trained),
                "--solver",
                solver,
                "--tol",
                tol,
            ]);
            let v = run_variant(
                &extra,
                &[
                    ("model", json!("elm")),
                    ("solver", json!(solver)),
                    ("tol", json!(tol)),
                ],
            )?;
            let cmd = format!("elm eval --elm --solver {solver} --tol {tol}");
            let nll = v.nll.metric("answer_nll", &cmd)?;
            let flex = v.em.metric("flexible_extract", &cmd)?;
            let d_nll = pair(nll, dense_nll, &format!("{cmd}: ΔNLL"))?;
            let rp = pair(flex, dense_flex, &format!("{cmd}: RP"))?;
            table.row(&[
                "ELM".into(),
                solver.into(),
                tol.into(),
                interval(&nll.estimate),
                delta(&d_nll),
                interval(&flex.estimate),
                rp.ratio.as_ref().map_or_else(na, interval),
                interval(&v.em.metric("strict_match", &cmd)?.estimate),
                float(v.em.solver.mean_iterations),
                format!(
                    "{} (max it {})",
                    float(v.em.solver.layer_evals_per_token),
                    v.em.solver.max_iterations
                ),
                float(v.nll.tok_s),
            ]);
        }
    }
    Ok(format!(
        "GSM8K test: answer NLL = teacher-forced mean NLL per token of the reference solution \
         (chat template, first {} problems); exact match = greedy, {} new tokens, first {} \
         problems, strict (`#### N`) and flexible (last number) extraction as in \
         lm-evaluation-harness. Brackets: 95% bootstrap intervals over problems (2000 \
         resamples, seed 0); Δ and RP are paired over the same problems (↑/↓: the interval \
         excludes 0; RP n/a when the dense score is 0). Iterations (per decoded token) \
         include the commit pass.\n\n{}",
        limits.nll_eval,
        limits.max_new_tokens,
        limits.gsm8k_eval,
        table.into_markdown()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elm_cli::decode;

    const NLL_RUN: &str = r#"{"task": "gsm8k-nll", "n": 2, "tok_s": 400.0, "seconds": 1.0,
        "metrics": {"answer_nll": {"higher_is_better": false, "paired": null,
            "estimate": {"value": 1.5, "lo": 1.2, "hi": 1.8, "n": 2, "level": 0.95},
            "items": [{"id": "0", "value": 10.0, "weight": 8.0},
                      {"id": "1", "value": 20.0, "weight": 12.0}]}},
        "solver": {"tokens": 2, "mean_iterations": 4.5, "max_iterations": 9,
                   "layer_evals_per_token": 27.5, "mean_residual": 0.1, "converged_frac": 1.0}}"#;

    #[test]
    fn eval_run_decodes() {
        let step = decode::<Run>("elm eval", NLL_RUN.as_bytes()).unwrap();
        let m = step.typed.metric("answer_nll", "elm eval").unwrap();
        assert_eq!(m.items.len(), 2);
        assert_eq!(step.typed.solver.max_iterations, 9);
        assert!(step.typed.metric("pass_at_1", "elm eval").is_err());
    }

    #[test]
    fn missing_keys_are_named() {
        let printed = NLL_RUN.replace(r#""mean_iterations": 4.5, "#, "");
        let err = decode::<Run>("elm eval --elm ck --solver picard", printed.as_bytes())
            .err()
            .expect("a missing solver statistic must be an error")
            .to_string();
        assert!(err.contains("missing field `mean_iterations`"), "{err}");
        assert!(err.contains("`elm eval --elm ck --solver picard`"), "{err}");
        let printed = NLL_RUN.replace(r#""tok_s": 400.0, "#, "");
        let err = decode::<Run>("elm eval", printed.as_bytes())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("missing field `tok_s`"), "{err}");
    }

    /// The library's own report types, as `elm eval --json` prints them, must decode.
    #[test]
    fn library_types_decode() {
        let summary = elm::eval::gsm8k::SolverSummary::default();
        let value = serde_json::to_value(&summary).unwrap();
        assert!(SolverStats::deserialize(&value).is_ok(), "{value}");
        let items = vec![ItemScore {
            id: "0".into(),
            value: 1.0,
            weight: 1.0,
        }];
        let est = elm::eval::stats::estimate(&items, &BootstrapConfig::default()).unwrap();
        let value = serde_json::to_value(&est).unwrap();
        assert!(Estimate::deserialize(&value).is_ok(), "{value}");
    }

    #[test]
    fn delta_cell_marks_a_sure_difference() {
        let e = |v: f64, lo: f64, hi: f64| Estimate {
            value: v,
            lo,
            hi,
            n: 3,
            level: 0.95,
        };
        let p = PairedComparison {
            model: e(1.0, 0.9, 1.1),
            reference: e(0.8, 0.7, 0.9),
            delta: e(0.2, 0.1, 0.3),
            ratio: None,
            verdict: "higher".into(),
        };
        assert_eq!(delta(&p), "+0.200 [+0.100, +0.300] ↑");
    }
}
