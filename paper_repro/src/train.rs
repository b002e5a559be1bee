//! ELM training (`elm train`): trains the compressed checkpoint at the scale's size and reports
//! the held-out distillation loss before and after.

use std::path::Path;

use elm::elm::TrainConfig;
use serde::Deserialize;

use crate::elm_cli::{args, path_arg, ElmCli};
use crate::error::ReproError;
use crate::markdown::float;
use crate::scale::Limits;
use crate::summary::Summary;

/// The keys of `elm train --json` the section reads.
#[derive(Debug, Deserialize)]
struct TrainOutput {
    seconds: f64,
    /// The CLI prints null without held-out problems; paper_repro always asks for some, so a
    /// null is an error here.
    distill_before: f64,
    distill_after: f64,
}

/// Paths of one training run.
pub struct TrainPaths<'a> {
    pub model: &'a Path,
    pub data_dir: &'a Path,
    /// From `elm compress`.
    pub initial: &'a Path,
    pub trained: &'a Path,
    /// Where the run's `TrainConfig` is written.
    pub config: &'a Path,
}

/// Trains `paths.initial` into `paths.trained`; returns the training paragraph.
pub fn section(
    elm: &ElmCli,
    paths: &TrainPaths<'_>,
    limits: &Limits,
    summary: &mut Summary,
) -> Result<String, ReproError> {
    let config = TrainConfig {
        steps: limits.train_steps,
        batch_size: limits.batch_size,
        seq_len: limits.seq_len,
        seed: 0,
        ..TrainConfig::default()
    };
    let text = serde_json::to_string(&config)
        .map_err(|e| ReproError::io(paths.config, std::io::Error::other(e)))?;
    std::fs::write(paths.config, text).map_err(|e| ReproError::io(paths.config, e))?;
    let step = elm.run::<TrainOutput>(&args(&[
        "train",
        "--model",
        &path_arg(paths.model),
        "--elm",
        &path_arg(paths.initial),
        "--config",
        &path_arg(paths.config),
        "--out",
        &path_arg(paths.trained),
        // This run owns the directory: a rerun replaces it (elm refuses that without --force).
        "--force",
        "--data-dir",
        &path_arg(paths.data_dir),
        "--eval-examples",
        &limits.held_out.to_string(),
    ]))?;
    summary.push("elm_train", &[], step.raw);
    let trained = step.typed;
    Ok(format!(
        "Training: {} steps (batch {}, {} tokens, SJFB, CE+distillation schedule) in {} s; distillation MSE on {} \
         held-out GSM8K test problems: {} before → {} after.\n\n",
        limits.train_steps,
        limits.batch_size,
        limits.seq_len,
        float(trained.seconds),
        limits.held_out,
        float(trained.distill_before),
        float(trained.distill_after),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elm_cli::decode;

    #[test]
    fn null_distillation_loss_is_an_error() {
        let printed = r#"{"seconds": 1.0, "distill_before": null, "distill_after": 0.1}"#;
        let err = decode::<TrainOutput>("elm train", printed.as_bytes())
            .err()
            .expect("null loss must be an error")
            .to_string();
        assert!(err.contains("null"), "{err}");
    }

    #[test]
    fn written_config_is_accepted_by_the_library() {
        let config = TrainConfig {
            steps: 2,
            ..TrainConfig::default()
        };
        let text = serde_json::to_string(&config).unwrap();
        let parsed: TrainConfig = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed, config);
    }
}
