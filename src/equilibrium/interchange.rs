//! Interchange with the official ELM code (github.com/Jyk-122/ELM, read at commit `ea7a054`).
//!
//! Its deployable form is the integrated model that `hf_infer/convert_to_hf.py` writes and
//! `Qwen2ELMForCausalLM` (`hf_infer/modeling_qwen/`) runs: an HF directory whose `config.json`
//! is a Qwen2 config plus `fixed_point_layer_idx` (`l`), `fixed_point_layer_interval_len` (`M`)
//! and `fixed_point_exit_threshold`, and whose safetensors hold `N − M + 1` physical layers:
//! `model.layers.{0..l}` are the kept layers before the window, `model.layers.{l}` is the
//! fixed-point block with `model.layers.{l}.proj.{weight,bias}`, and `model.layers.{l+1..}` are
//! the kept layers from `l + M` on (renumbered: the converter pops the window out of the
//! module list). All matrices are in the HF (rotate-half RoPE) layout: the converter un-permutes
//! the Meta layout its LoRA and ELM stages train on, so nothing here permutes.
//!
//! The official iteration is `z ← block(proj([z; x]))` from `z⁰ = 0`, `proj([z; x]) = W_z z +
//! W_x x + b` with `proj.weight = [W_z | W_x]` (`[C, 2C]`, z's columns first): exactly our
//! `φ(z, h) = f*(W_z z + W_h h + b)`. Its inference runs `M` iterations and, when decoding, stops a
//! token once `‖f(z) − z‖₂ < fixed_point_exit_threshold` ([`OfficialSettings`] returns both, so
//! a caller can run the model as the official code does).
//!
//! Training checkpoints (`trainable_weights.pt` + `model_args.json` on a LoRA-merged base)
//! are Python pickles; `tests/fixtures/gen/ref_official_elm.py --convert` turns them into the integrated form
//! with the official converter itself, so only this one format is read here.

use std::path::Path;

use ndarray::{concatenate, s, Array1, Array2, Axis};
use serde_json::{json, Value};

use crate::error::{ElmError, Result};
use crate::formats::hf::{
    config_from_hf_json, config_to_hf_json, load_hf_model_with, save_hf_model_with,
};
use crate::formats::tokenizer::Tokenizer;
use crate::model::{LayerWeights, ModelConfig, ModelWeights};
use crate::model_data::config::Arch;
use crate::model_data::{QLayer, QuantWeights};
use crate::quant::WriteFormat;

use super::config::ElmConfig;
use super::module::{ElmModule, ModuleBlock, ProjectionWeights};
use super::quant_module::{QuantElm, QuantModule};

/// The `config.json` keys the official integrated format adds to a Qwen2 config.
const LAYER_IDX: &str = "fixed_point_layer_idx";
const INTERVAL_LEN: &str = "fixed_point_layer_interval_len";
const EXIT_THRESHOLD: &str = "fixed_point_exit_threshold";

/// How the official code runs an integrated model: at most `max_iters` iterations (= M), a
/// decoded token stopping once its residual is below `exit_threshold`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OfficialSettings {
    pub max_iters: usize,
    pub exit_threshold: f64,
}

fn read_config(dir: &Path) -> Result<Value> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ElmError::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| ElmError::format(&path, format!("invalid JSON: {e}")))
}

/// Whether `dir` holds an official integrated ELM (its config.json names the fixed-point layer).
pub fn is_official_dir(dir: &Path) -> bool {
    dir.is_dir()
        && read_config(dir)
            .ok()
            .is_some_and(|v| v.get(LAYER_IDX).is_some())
}

/// What an official integrated directory holds, as our types.
pub struct OfficialParts {
    pub elm: ElmConfig,
    /// The kept layers and the module in f32 (the replaced layers are not in the file: the
    /// model runs, it cannot be trained further against its teacher).
    pub weights: QuantElm,
    /// From `tokenizer.json`, when the directory has one.
    pub tokenizer: Option<Tokenizer>,
    pub settings: OfficialSettings,
}

/// Reads an official integrated ELM directory (`ElmModel::import_official` builds the model),
/// with the transformer layers' and the module's matrices in `layer_format` (`None`: f32; the
/// embedding and head stay f32).
pub fn read_official(dir: &Path, layer_format: Option<WriteFormat>) -> Result<OfficialParts> {
    let config_path = dir.join("config.json");
    let in_config = |e: ElmError| e.in_file(&config_path);
    let mut value = read_config(dir)?;
    let obj = value
        .as_object_mut()
        .ok_or_else(|| in_config(ElmError::config("config.json", "not a JSON object")))?;
    let mut take_usize = |key: &str| -> Result<usize> {
        let v = obj.remove(key).ok_or_else(|| {
            ElmError::config(key, "missing: not an official integrated ELM config")
        })?;
        v.as_u64().map(|x| x as usize).ok_or_else(|| {
            ElmError::config(key, format!("expected a non-negative integer, found {v}"))
        })
    };
    let start = take_usize(LAYER_IDX).map_err(in_config)?;
    let m = take_usize(INTERVAL_LEN).map_err(in_config)?;
    let exit_threshold = match obj.remove(EXIT_THRESHOLD) {
        None => 0.0,
        Some(v) => v
            .as_f64()
            .filter(|t| t.is_finite() && *t >= 0.0)
            .ok_or_else(|| {
                in_config(ElmError::config(
                    EXIT_THRESHOLD,
                    format!("expected a finite number >= 0, found {v}"),
                ))
            })?,
    };
    let config = config_from_hf_json(&value).map_err(in_config)?;
    if config.arch != Arch::Qwen2 {
        return Err(in_config(ElmError::config(
            "model_type",
            "the official integrated format is Qwen2 (Qwen2ELMForCausalLM)",
        )));
    }
    let elm = ElmConfig::new(start, m);
    elm.validate(&config).map_err(in_config)?;
    // The file holds the physical layers: N − M + 1, the fixed-point block at `start`.
    let physical = ModelConfig {
        num_layers: config.num_layers - m + 1,
        ..config.clone()
    };
    let c = config.hidden_size;
    let proj_w = format!("model.layers.{start}.proj.weight");
    let proj_b = format!("model.layers.{start}.proj.bias");
    let extra = [(proj_w.clone(), vec![c, 2 * c]), (proj_b.clone(), vec![c])];
    let (mut weights, mut extras) = load_hf_model_with(dir, physical, &extra)?;
    let block = weights.layers.remove(start);
    let proj = Array2::from_shape_vec((c, 2 * c), extras.remove(&proj_w).expect("loaded"))
        .expect("shape checked");
    let module = ElmModule {
        block: ModuleBlock::Decoder(block),
        projection: Some(ProjectionWeights {
            w_z: proj.slice(s![.., ..c]).to_owned(),
            w_h: proj.slice(s![.., c..]).to_owned(),
            bias: Array1::from_vec(extras.remove(&proj_b).expect("loaded")),
        }),
    };
    // The kept layers (the block removed above) under the dense model's own config (N layers).
    let kept = std::mem::take(&mut weights.layers);
    let mut dense = QuantWeights::from_f32(&weights, None);
    dense.config = config;
    dense.layers = kept
        .iter()
        .map(|l| QLayer::from_f32(l, layer_format))
        .collect();
    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer = if tokenizer_path.is_file() {
        Some(Tokenizer::from_file(&tokenizer_path)?)
    } else {
        None
    };
    Ok(OfficialParts {
        elm,
        weights: QuantElm {
            dense,
            module: Some(QuantModule::from_f32(&module, layer_format)),
        },
        tokenizer,
        settings: OfficialSettings {
            max_iters: m,
            exit_threshold,
        },
    })
}

/// The f32 tensors of an ELM to export (`ElmModel::export_official` gathers them).
pub struct ExportParts {
    /// The dense model's config (all N layers).
    pub config: ModelConfig,
    pub elm: ElmConfig,
    /// The kept layers in running order.
    pub kept: Vec<LayerWeights>,
    pub module: ElmModule,
    pub embed: Array2<f32>,
    pub final_norm: Array1<f32>,
    pub lm_head: Option<Array2<f32>>,
}

/// Writes an ELM (an f32 decoder module with input injection, solved rather than unrolled) as
/// an official integrated directory that `Qwen2ELMForCausalLM.from_pretrained` loads:
/// `config.json`, `model.safetensors` and, with `tokenizer`, its files. A Llama-family model is
/// written as the Qwen2 it equals with zero q/k/v biases (the official port is Qwen2-only).
/// `exit_threshold` is the official decoding's per-token stopping residual.
pub fn write_official(
    parts: ExportParts,
    tokenizer: Option<&Tokenizer>,
    exit_threshold: f64,
    dir: &Path,
) -> Result<()> {
    let refuse =
        |msg: String| ElmError::Unsupported(format!("export to the official format: {msg}"));
    let ExportParts {
        config,
        elm,
        kept,
        module,
        embed,
        final_norm,
        lm_head,
    } = parts;
    if elm.fixed_iterations.is_some() {
        return Err(refuse(
            "an unrolled module (fixed iterations) is not the official solved layer".into(),
        ));
    }
    if !(exit_threshold.is_finite() && exit_threshold >= 0.0) {
        return Err(ElmError::config(
            EXIT_THRESHOLD,
            format!("must be finite and >= 0, got {exit_threshold}"),
        ));
    }
    if config.head_dim * config.num_heads != config.hidden_size {
        return Err(refuse(format!(
            "head_dim {} × {} heads ≠ hidden size {} (Qwen2 derives head_dim from them)",
            config.head_dim, config.num_heads, config.hidden_size
        )));
    }
    let (block, projection) = match (&module.block, &module.projection) {
        (ModuleBlock::Decoder(b), Some(p)) => (b, p),
        (_, None) => return Err(refuse("a module without input injection".into())),
        (ModuleBlock::Ffn(_), _) => return Err(refuse("an FFN-only block".into())),
    };
    let start = elm.start_layer;
    // The physical model the official file holds: kept layers before the window, the block,
    // the kept layers after it, as a Qwen2 model (q/k/v biases zero where ours has none).
    let qwen2 = ModelConfig {
        arch: Arch::Qwen2,
        attention_bias: true,
        ..config.clone()
    };
    let with_biases = |mut l: LayerWeights| {
        if l.bq.is_none() {
            l.bq = Some(Array1::zeros(l.wq.nrows()));
        }
        if l.bk.is_none() {
            l.bk = Some(Array1::zeros(l.wk.nrows()));
        }
        if l.bv.is_none() {
            l.bv = Some(Array1::zeros(l.wv.nrows()));
        }
        l
    };
    let mut layers = kept;
    layers.insert(start, block.clone());
    let physical = ModelWeights {
        config: ModelConfig {
            num_layers: layers.len(),
            ..qwen2.clone()
        },
        embed,
        layers: layers.into_iter().map(with_biases).collect(),
        final_norm,
        lm_head,
    };
    let proj = concatenate(Axis(1), &[projection.w_z.view(), projection.w_h.view()])
        .map_err(|e| ElmError::shape("export_official proj", e.to_string()))?;
    let extra = [
        (format!("model.layers.{start}.proj.weight"), proj.into_dyn()),
        (
            format!("model.layers.{start}.proj.bias"),
            projection.bias.clone().into_dyn(),
        ),
    ];
    let mut cfg = config_to_hf_json(&qwen2);
    cfg["architectures"] = json!(["Qwen2ELMForCausalLM"]);
    cfg["use_sliding_window"] = json!(false);
    cfg["attention_dropout"] = json!(0.0);
    cfg[LAYER_IDX] = json!(start);
    cfg[INTERVAL_LEN] = json!(elm.num_replaced);
    cfg[EXIT_THRESHOLD] = json!(exit_threshold);
    save_hf_model_with(&physical, dir, &extra, &cfg)?;
    if let Some(t) = tokenizer {
        t.save_dir(dir)?;
    }
    Ok(())
}
