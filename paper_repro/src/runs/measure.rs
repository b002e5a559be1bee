//! The training-free baselines (`elm prune`) and the measurements of a trained module: KV bytes
//! of a generation, its spectral radius, and the solvers' ρ sweep, as stages.

use std::path::{Path, PathBuf};

use elm::compress::PruneReport;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Ctx, Trained};
use crate::elm_cli::{args, path_arg, Unread};
use crate::error::ReproError;
use crate::stage::Done;

/// `elm prune --json`: the library's report and the pruned model's directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Pruned {
    pub out: PathBuf,
    #[serde(flatten)]
    pub report: PruneReport,
}

/// `elm prune --method METHOD --num-replaced M` into the stage's directory.
pub fn prune(ctx: &mut Ctx<'_>, method: &str, m: usize) -> Result<Done<Pruned>, ReproError> {
    let tokens = ctx.limits.calibration_tokens;
    let config = json!({
        "model": ctx.model_id,
        "data": ctx.data_dir,
        "method": method,
        "m": m,
        "calibration_tokens": tokens,
    });
    let (elm, model, data_dir) = (ctx.elm, ctx.model.clone(), ctx.data_dir.clone());
    ctx.stages
        .run("prune", &config, tokens as f64 / 50.0, |dir| {
            let out = dir.join("model");
            Ok(elm
                .run::<Unread>(&args(&[
                    "prune",
                    "--model",
                    &path_arg(&model),
                    "--method",
                    method,
                    "--num-replaced",
                    &m.to_string(),
                    "--calibration-tokens",
                    &tokens.to_string(),
                    "--seq-len",
                    &tokens.min(128).to_string(),
                    "--data-dir",
                    &path_arg(&data_dir),
                    "--out",
                    &path_arg(&out),
                    "--force",
                ]))?
                .raw)
        })
}

// ---------------------------------------------------------------------------------------------
// Measured KV bytes and the spectral radius

/// `elm generate --json`, the figures the KV table reads (keys the command composes itself:
/// there is no library report to decode).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KvMeasured {
    /// Bytes of K/V the decoding session allocated (dense layers + fixed-point caches).
    pub kv_bytes: usize,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
}

/// Decodes one GSM8K test question with the ELM in KV mode `kv` and reports the bytes of K/V
/// the session allocated for it (prompt + `max_new_tokens` + 1 positions).
pub fn kv_measure(
    ctx: &mut Ctx<'_>,
    t: &Done<Trained>,
    kv: &str,
    prompt: &str,
) -> Result<Done<KvMeasured>, ReproError> {
    let max_new = ctx.limits.max_new_tokens;
    let config = json!({"model": ctx.model_id, "elm": t.key, "kv": kv, "prompt": prompt, "max_new_tokens": max_new});
    let a = args(&[
        "generate",
        "--model",
        &path_arg(&ctx.model),
        "--elm",
        &path_arg(&t.value.checkpoint),
        "--kv",
        kv,
        "--solver",
        "anderson",
        "--prompt",
        prompt,
        "--chat",
        "--max-new-tokens",
        &max_new.to_string(),
    ]);
    let elm = ctx.elm;
    ctx.stages.run("kv", &config, max_new as f64 / 5.0, |_| {
        Ok(elm.run::<Unread>(&a)?.raw)
    })
}

/// `elm spectral --json`: the library's own report.
pub use elm::equilibrium::spectral::SpectralReport as Spectral;

/// ρ(∂φ/∂z) at z* of a trained ELM over the scale's GSM8K test sequences.
pub fn spectral(ctx: &mut Ctx<'_>, t: &Done<Trained>) -> Result<Done<Spectral>, ReproError> {
    let n = ctx.limits.spectral_sequences;
    let config = json!({"model": ctx.model_id, "data": ctx.data_dir, "elm": t.key, "limit": n, "iterations": 30});
    let a = args(&[
        "spectral",
        "--model",
        &path_arg(&ctx.model),
        "--elm",
        &path_arg(&t.value.checkpoint),
        "--limit",
        &n.to_string(),
        "--iterations",
        "30",
        "--data-dir",
        &path_arg(&ctx.data_dir),
    ]);
    let elm = ctx.elm;
    ctx.stages.run("spectral", &config, n as f64 * 10.0, |_| {
        Ok(elm.run::<Unread>(&a)?.raw)
    })
}

/// `elm sweep --json`: map evaluations of Picard, Anderson and Broyden against ρ on the
/// canonical linear problem, with the trained ELMs' measured ρ marked.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RhoSweep {
    pub config: elm::solver::rho_sweep::RhoSweepConfig,
    pub marks: Vec<(String, f64)>,
    pub rows: Vec<elm::solver::rho_sweep::RhoSweepRow>,
}

/// `elm sweep` with `marks` (name, measured ρ); its plot is copied to `plots/rho_sweep.svg`.
pub fn rho_sweep(
    ctx: &mut Ctx<'_>,
    marks: &[(String, f64)],
    plots: &Path,
) -> Result<Done<RhoSweep>, ReproError> {
    let config = json!({ "marks": marks });
    let elm = ctx.elm;
    let done = ctx.stages.run("rho_sweep", &config, 1.0, |dir| {
        let mut a = args(&["sweep", "--out", &path_arg(dir)]);
        for (name, rho) in marks {
            a.extend(args(&["--mark", &format!("{name}={rho}")]));
        }
        Ok(elm.run::<Unread>(&a)?.raw)
    })?;
    std::fs::create_dir_all(plots).map_err(|e| ReproError::io(plots, e))?;
    let (from, to) = (done.dir.join("rho_sweep.svg"), plots.join("rho_sweep.svg"));
    std::fs::copy(&from, &to).map_err(|e| ReproError::io(&from, e))?;
    Ok(done)
}
