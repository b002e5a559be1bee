//! `elm prune`: a training-free depth-compression baseline → an HF model directory.

use std::path::PathBuf;

use elm::compress::{prune, BoundaryStates, Calibration, PruneMethod, PruneOptions};
use elm::data::{gsm8k_path, resolve_data_dir, Split};
use elm::error::{ElmError, Result};
use elm::formats::save_hf_model;
use elm::io::write_json_atomic;
use elm::model::load_pretrained;

use super::output::{print_json, to_json};

#[derive(clap::Args, Debug)]
pub struct PruneArgs {
    /// Dense model: a .gguf file or an HF directory.
    #[arg(long)]
    pub model: PathBuf,
    /// The compression method.
    #[arg(long, value_parser = super::registry::named::<PruneMethod>())]
    pub method: PruneMethod,
    /// Layers removed, M.
    #[arg(long = "num-replaced", alias = "m", default_value_t = 8)]
    pub num_replaced: usize,
    /// Window start for the window methods (default: chosen by the method's metric).
    #[arg(long)]
    pub start: Option<usize>,
    /// Calibration text: .jsonl (question/answer or text) or plain text. Default: GSM8K train.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Data directory holding gsm8k/ (default: $ELM_DATA_DIR or ../shared/data).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Calibration tokens (whole chunks of --seq-len).
    #[arg(long, default_value_t = 2048)]
    pub calibration_tokens: usize,
    /// Calibration chunk length.
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,
    /// Chunks per forward batch (for shortened-taylor: per forward and backward on the tape).
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Output HF model directory (config.json, model.safetensors, tokenizer files, prune.json).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub write: super::output::WriteFlags,
}

/// `elm prune`.
pub fn run_prune(a: PruneArgs) -> Result<()> {
    let method = a.method;
    if a.batch == 0 {
        return Err(ElmError::config("batch", "must be >= 1"));
    }
    let _run = a.write.lock_dir(&a.out)?;
    let (weights, tok) = load_pretrained(&a.model)?;
    let (calib, calib_path) = match &a.calibration {
        Some(p) => (
            Calibration::from_file(&tok, p, a.seq_len, a.calibration_tokens)?,
            p.clone(),
        ),
        None => {
            let dir = resolve_data_dir(a.data_dir.as_deref())?;
            (
                Calibration::from_gsm8k_train(&tok, &dir, a.seq_len, a.calibration_tokens)?,
                gsm8k_path(&dir, Split::Train),
            )
        }
    };
    let states = BoundaryStates::collect(&weights, &calib, a.batch)?;
    let opts = PruneOptions {
        method,
        num_replaced: a.num_replaced,
        start: a.start,
        batch: a.batch,
    };
    let pruned = prune(&weights, &calib, &states, &opts)?;
    save_hf_model(&pruned.weights, &a.out)?;
    tok.save_dir(&a.out)?;
    write_json_atomic(&a.out.join("prune.json"), &pruned.report)?;
    let r = &pruned.report;
    if a.write.json {
        let mut v = to_json(r)?;
        v["out"] = a.out.display().to_string().into();
        v["calibration"] = calib_path.display().to_string().into();
        print_json(&v)?;
    } else {
        say!(
            "{}: removed layers {:?} ({} by {}), {} -> {} parameters ({} -> {} non-embedding), KV at 1k tokens {} -> {} bytes; wrote {}",
            method.name(),
            r.removed_layers,
            r.start.map_or("selected".to_string(), |s| format!("window at {s}")),
            r.metric,
            r.dense_params,
            r.params,
            r.dense_non_embedding_params,
            r.non_embedding_params,
            r.dense_kv_bytes_1k,
            r.kv_bytes_1k,
            a.out.display()
        );
    }
    Ok(())
}
