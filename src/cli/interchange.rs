//! `elm export-official`: an ELM trained here written in the official code's integrated format
//! (`Qwen2ELMForCausalLM` loads it). The other direction needs no command: every `--elm` takes
//! an official integrated directory as it is.

use std::path::PathBuf;

use elm::equilibrium::infer::ElmModel;
use elm::error::Result;
use elm::model::default_model_path;

use super::output::print_json;

#[derive(clap::Args, Debug)]
pub struct ExportOfficialArgs {
    /// Dense model the ELM was cut from: a .gguf file or an HF directory (default: the SmolLM2 GGUF).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// ELM checkpoint directory (from `elm compress` / `elm train`).
    #[arg(long)]
    pub elm: PathBuf,
    /// Output directory (config.json, model.safetensors, tokenizer files).
    #[arg(long)]
    pub out: PathBuf,
    /// `fixed_point_exit_threshold` of the official decoding: a token stops once ‖f(z) − z‖₂
    /// is below it (its converter writes 1.0; 0 never stops early).
    #[arg(long, default_value_t = 1.0)]
    pub exit_threshold: f64,
    #[command(flatten)]
    pub write: super::output::WriteFlags,
}

pub fn run_export_official(a: ExportOfficialArgs) -> Result<()> {
    let _run = a.write.lock_dir(&a.out)?;
    let model_path = a.model.clone().unwrap_or_else(default_model_path);
    let (model, tok) = ElmModel::load(&model_path, Some(&a.elm))?;
    model.export_official(Some(&tok), a.exit_threshold, &a.out)?;
    let elm = model
        .elm_config()
        .expect("export_official refuses a dense model");
    if a.write.json {
        print_json(&serde_json::json!({
            "out": a.out,
            "fixed_point_layer_idx": elm.start_layer,
            "fixed_point_layer_interval_len": elm.num_replaced,
            "fixed_point_exit_threshold": a.exit_threshold,
        }))?;
    } else {
        say!(
            "wrote {} (official integrated ELM: layers {}..{} replaced, exit threshold {})",
            a.out.display(),
            elm.start_layer,
            elm.start_layer + elm.num_replaced,
            a.exit_threshold
        );
    }
    Ok(())
}
