//! `elm compress`, `elm train`, `elm eval`: the ELM method's command line.

use std::path::PathBuf;

use crate::elm::accounting::{kv_report, param_report};
use crate::elm::module::{save_module, ElmModule, ModuleMeta, MODULE_FORMAT};
use crate::elm::{load_dense_model, ElmConfig};
use crate::error::{ElmError, Result};

/// Prints `value` as one JSON line (for `--json`).
fn print_json(value: &serde_json::Value) -> Result<()> {
    let s = serde_json::to_string(value).map_err(|e| ElmError::Json {
        what: "output".into(),
        msg: e.to_string(),
    })?;
    println!("{s}");
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct CompressArgs {
    /// Dense model: a .gguf file or an HF directory.
    #[arg(long)]
    pub model: PathBuf,
    /// First replaced layer l.
    #[arg(long)]
    pub start: usize,
    /// Number of replaced layers M.
    #[arg(long)]
    pub m: usize,
    /// Seed of W_z's init.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output checkpoint directory (elm.json + module.safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Context length for the KV-bytes report.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    #[arg(long)]
    pub json: bool,
}

/// Initialises the fixed-point module from layer `l` and reports parameter/KV accounting.
pub fn run_compress(a: CompressArgs) -> Result<()> {
    let dense = load_dense_model(&a.model)?;
    let ec = ElmConfig {
        init_seed: a.seed,
        ..ElmConfig::new(a.start, a.m)
    };
    let module = ElmModule::init(&dense, &ec)?;
    let meta = ModuleMeta {
        format: MODULE_FORMAT.into(),
        elm: ec.clone(),
        model_config: dense.config.clone(),
        base_model: a.model.display().to_string(),
    };
    save_module(&a.out, &module, &meta)?;
    let params = param_report(&dense.config, &ec);
    let kv = kv_report(&dense.config, &ec, 1, a.context, a.m);
    if a.json {
        print_json(&serde_json::json!({
            "out": a.out.display().to_string(),
            "params": params,
            "kv": kv,
        }))?;
    } else {
        println!("wrote {}", a.out.display());
        println!(
            "parameters: dense {} ({} non-embedding) -> ELM {} ({} non-embedding); reduction {:.1}% total, {:.1}% non-embedding",
            params.dense_total,
            params.dense_non_embedding,
            params.elm_total,
            params.elm_non_embedding,
            100.0 * params.reduction_total,
            100.0 * params.reduction_non_embedding
        );
        println!(
            "KV bytes at {} tokens: dense {}, one-step {} ({:.3}), multi-step(M iterations) {}",
            a.context, kv.dense, kv.one_step, kv.one_step_ratio, kv.multi_step
        );
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {}
pub fn run_train(_: TrainArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {}
pub fn run_eval(_: EvalArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}
