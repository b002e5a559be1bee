//! Where to prune (table 6): GPPO, the enumeration it is checked against, and the report placing
//! every selector's choice in it, as stages.

use std::path::{Path, PathBuf};

use elm::lora::LoraReport;
use serde_json::{json, Value};

use super::{train_subset, Ctx};
use crate::elm_cli::{args, path_arg, Unread};
use crate::error::ReproError;
use crate::stage::Done;

/// GPPO on the tuned dense model, the enumeration of windows it is checked against, and the
/// report placing GPPO's and the metric selectors' choices in that enumeration (`elm search`).
/// Returns the report and the directory holding its plot.
pub fn where_to_prune(
    ctx: &mut Ctx<'_>,
    tuned: &Done<LoraReport>,
    m: usize,
) -> Result<(Done<elm::search::report::WhereToPrune>, PathBuf), ReproError> {
    let b = ctx.limits.search;
    let (elm, data_dir) = (ctx.elm, ctx.data_dir.clone());
    let model = PathBuf::from(&tuned.value.out);
    let base = json!({
        "tuned": tuned.key,
        "data": ctx.data_dir,
        "train_examples": ctx.limits.train_examples,
        "m": m,
        "seq_len": b.seq_len,
    });
    let data = |a: &mut Vec<String>, dir: &Path| -> Result<(), ReproError> {
        a.extend(args(&["--data-dir", &path_arg(&data_dir)]));
        if let Some(n) = ctx.limits.train_examples {
            let subset = train_subset(&data_dir, n, dir)?;
            a.extend(args(&["--data", &path_arg(&subset)]));
        }
        Ok(())
    };
    let common = |method: &str, out: &Path| {
        args(&[
            "search",
            "--model",
            &path_arg(&model),
            "--method",
            method,
            "--num-replaced",
            &m.to_string(),
            "--out",
            &path_arg(out),
        ])
    };
    // GPPO and the enumeration keep their state in the stage's `run` directory: a stage a kill
    // interrupted resumes from it, a new one starts with `fresh` (its budget).
    let resumable = |dir: &Path, method: &str, state_file: &str, what: &str, fresh: Vec<String>| {
        let run = dir.join("run");
        let mut a = common(method, &run);
        if run.join(state_file).exists() {
            eprintln!("  resuming {what} in {}", run.display());
            a.push("--resume".into());
        } else {
            a.extend(fresh);
        }
        a
    };
    let gppo_config = json!({"base": base, "steps": b.gppo_steps});
    let gppo = ctx.stages.run::<_, Value>(
        "gppo",
        &gppo_config,
        (b.gppo_steps * b.seq_len) as f64 / 100.0,
        |dir| {
            let fresh = args(&[
                "--steps",
                &b.gppo_steps.to_string(),
                "--seq-len",
                &b.seq_len.to_string(),
                "--force",
            ]);
            let mut a = resumable(
                dir,
                "gppo",
                elm::search::gppo::GPPO_STATE_FILE,
                "GPPO",
                fresh,
            );
            data(&mut a, dir)?;
            Ok(elm.run::<Unread>(&a)?.raw)
        },
    )?;
    let enum_config = json!({
        "base": base,
        "steps": b.enum_steps,
        "every": b.enum_every,
        "eval": b.enum_eval,
    });
    // Only for the ETA: the windows of a 30-layer model (SmolLM2); Qwen2.5-1.5B has two fewer.
    let starts = 30usize.saturating_sub(m) + 1;
    let enumeration = ctx.stages.run::<_, Value>(
        "enumerate",
        &enum_config,
        (starts * b.enum_steps * b.seq_len) as f64 / 100.0 / b.enum_every as f64,
        |dir| {
            let fresh = args(&[
                "--steps",
                &b.enum_steps.to_string(),
                "--every",
                &b.enum_every.to_string(),
                "--seq-len",
                &b.seq_len.to_string(),
                // No saved entry: whatever a killed run left in the directory is replaced.
                "--force",
            ]);
            let mut a = resumable(
                dir,
                "enumerate",
                elm::search::enumerate::ENUM_FILE,
                "the enumeration",
                fresh,
            );
            a.extend(args(&["--eval-examples", &b.enum_eval.to_string()]));
            data(&mut a, dir)?;
            Ok(elm.run::<Unread>(&a)?.raw)
        },
    )?;
    let tokens = ctx.limits.calibration_tokens;
    let report_config = json!({
        "gppo": gppo.key,
        "enumeration": enumeration.key,
        "calibration_tokens": tokens,
    });
    let (gppo_dir, enum_dir) = (gppo.dir.join("run"), enumeration.dir.join("run"));
    let report = ctx
        .stages
        .run("where", &report_config, tokens as f64 / 50.0, |dir| {
            let mut a = common("report", dir);
            a.extend(args(&[
                "--gppo",
                &path_arg(&gppo_dir),
                "--enumeration",
                &path_arg(&enum_dir),
                "--calibration-tokens",
                &tokens.to_string(),
                "--calibration-seq-len",
                &tokens.min(128).to_string(),
            ]));
            data(&mut a, dir)?;
            Ok(elm.run::<Unread>(&a)?.raw)
        })?;
    let dir = report.dir.clone();
    Ok((report, dir))
}
