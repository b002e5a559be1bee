//! `elm quantize`: a dense model or an ELM saved as one deployable quantized GGUF.

use std::path::PathBuf;

use elm::equilibrium::infer::ElmModel;
use elm::error::{ElmError, Result};
use elm::model::{default_model_path, WeightStorage};

use super::output::print_json;

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// Dense model: a .gguf file or an HF directory (default: the SmolLM2 GGUF).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// ELM checkpoint directory (from `elm compress` / `elm train`) cut from --model; omit
    /// to save the dense model.
    #[arg(long)]
    pub elm: Option<PathBuf>,
    /// Block format of every matrix: q8_0 | q4_0 | q4_1, or auto (a GGUF's blocks kept as
    /// they are, the module in its replaced layer's format; f32 sources stay f32).
    #[arg(long)]
    pub format: WeightStorage,
    /// Output .gguf file.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub write: super::output::WriteFlags,
}

pub fn run_quantize(a: QuantizeArgs) -> Result<()> {
    let storage = a.format;
    if storage == WeightStorage::F32 {
        return Err(ElmError::config(
            "format",
            "f32 is not a quantized format: expected q8_0, q4_0, q4_1 or auto",
        ));
    }
    elm::limits::check_output_file("out", &a.out, a.write.force)?;
    let model_path = a.model.clone().unwrap_or_else(default_model_path);
    let (model, tok) = ElmModel::load_with(&model_path, a.elm.as_deref(), storage)?;
    let bytes = model.save_quant_gguf(&a.out, &tok)?;
    let formats = model.storage_summary();
    if a.write.json {
        let value = serde_json::json!({
            "out": a.out,
            "bytes": bytes,
            "format": storage.to_string(),
            "model": model_path,
            "elm": a.elm,
            "weight_bytes": model.weight_bytes(),
            "matrices": formats.iter().map(|(f, n)| (f.clone(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
        });
        print_json(&value)?;
    } else {
        let formats: Vec<String> = formats.iter().map(|(f, n)| format!("{n} {f}")).collect();
        say!(
            "wrote {} ({bytes} bytes; matrices: {})",
            a.out.display(),
            formats.join(", ")
        );
    }
    Ok(())
}
