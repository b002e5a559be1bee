//! A deployable quantized model (dense or ELM) as ONE GGUF file, and its strict loader.
//!
//! Layout (GGUF v3, llama.cpp names and Q/K row order):
//! - metadata: `general.architecture` and the `{arch}.*` keys of the full model (so
//!   `block_count` is the original N), `elm.format = "elm-quant-v1"`, `elm.model_config`
//!   (the [`ModelConfig`] as JSON: the source of truth at load), `elm.config` (the
//!   [`ElmConfig`] as JSON, ELMs only), and the tokenizer as HF JSON (`elm.tokenizer.json`,
//!   `elm.tokenizer.config`, read back by [`Tokenizer::from_gguf`]).
//! - tensors: `token_embd.weight`, `output_norm.weight`, `output.weight` (untied heads), and
//!   the kept dense layers under their ORIGINAL indices `blk.{i}.*`; for an ELM the module's
//!   block under `elm.blk.*` (only its `ffn_*` tensors for a feed-forward-only block) and its
//!   input projection as `elm.proj_z.weight`,
//!   `elm.proj_h.weight`, `elm.proj.bias`.
//! - Q8_0/Q4_0/Q4_1 matrices are written byte-for-byte as held in memory (rows reordered into
//!   llama.cpp's interleaved-RoPE order for Llama Q/K, whole rows, so exact); anything kept f32
//!   (and every norm and bias) is F32.
//!
//! A dense file (no `elm.config`) is an ordinary Llama/Qwen2 GGUF that the dense loaders read
//! too; a file with `elm.config` is refused by them and read by [`load_quant_gguf`] (or
//! `ElmModel::load_with(_, Some(file), _)`, i.e. `--elm FILE.gguf` on the command line).

use std::path::Path;

use ndarray::{Array1, Axis};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::config::{BlockKind, ElmConfig};
use super::module::ModuleBlock;
use super::quant_module::{QuantElm, QuantModule, QuantProjection};
use crate::error::{ElmError, Result};
use crate::formats::gguf::{kv, write_gguf, GgmlType, GgufFile, GgufTensorData, GgufValue};
use crate::formats::gguf_model::{
    arch_metadata, permute_rope_qrows, permute_rope_rows, Taker, ELM_CONFIG_KEY,
};
use crate::formats::tokenizer::{Tokenizer, TOKENIZER_CONFIG_KEY, TOKENIZER_JSON_KEY};
use crate::model::ModelConfig;
use crate::model_data::{QLayer, QuantWeights};
use crate::quant::{Linear, WeightStorage, QK};

/// Value of [`FORMAT_KEY`] in the files this module writes.
pub const QUANT_FORMAT: &str = "elm-quant-v1";
/// Metadata key naming the layout version.
pub const FORMAT_KEY: &str = "elm.format";
/// Metadata key of the model config (JSON).
pub const MODEL_CONFIG_KEY: &str = "elm.model_config";
/// Metadata key of the ELM config (JSON); re-exported from the GGUF reader, which refuses
/// such files as dense models.
pub const ELM_KEY: &str = ELM_CONFIG_KEY;
/// Name prefix of the module's block tensors.
pub const MODULE_PREFIX: &str = "elm.blk.";
pub const PROJ_Z: &str = "elm.proj_z.weight";
pub const PROJ_H: &str = "elm.proj_h.weight";
pub const PROJ_BIAS: &str = "elm.proj.bias";

/// Whether `path` is a GGUF file carrying [`FORMAT_KEY`] (written by [`save_quant_gguf`]).
pub fn is_quant_gguf(path: &Path) -> bool {
    path.is_file() && GgufFile::open(path).is_ok_and(|g| g.get(FORMAT_KEY).is_some())
}

/// `Some(heads)` when the family's GGUFs store Q/K rows permuted (Llama).
fn rope(cfg: &ModelConfig, heads: usize) -> Option<usize> {
    cfg.family().gguf_permutes_qk_rows.then_some(heads)
}

fn linear_tensor(name: &str, l: &Linear, rope_heads: Option<usize>) -> Result<GgufTensorData> {
    match l {
        Linear::F32(w) => {
            let w = match rope_heads {
                Some(h) => permute_rope_rows(w, h),
                None => w.as_standard_layout().into_owned(),
            };
            Ok(GgufTensorData::f32(
                name,
                w.shape(),
                w.as_slice().expect("standard layout"),
            ))
        }
        Linear::Quant(q) => {
            if !q.cols().is_multiple_of(QK) {
                return Err(ElmError::tensor(
                    name,
                    format!(
                        "{} columns: GGUF stores {} blocks only for rows of whole {QK}-blocks",
                        q.cols(),
                        q.format().name()
                    ),
                ));
            }
            let data = match rope_heads {
                Some(h) => permute_rope_qrows(q, h)?.gguf_blocks().into_owned(),
                None => q.gguf_blocks().into_owned(),
            };
            Ok(GgufTensorData {
                name: name.to_string(),
                shape: vec![q.rows(), q.cols()],
                ggml_type: GgmlType::Block(q.format()),
                data,
            })
        }
    }
}

fn vec_tensor(name: &str, v: &Array1<f32>, rope_heads: Option<usize>) -> GgufTensorData {
    let v = match rope_heads {
        Some(h) => permute_rope_rows(&v.clone().insert_axis(Axis(1)), h).remove_axis(Axis(1)),
        None => v.clone(),
    };
    GgufTensorData::f32(name, &[v.len()], &v.to_vec())
}

/// The tensors of one block under `prefix` (`blk.{i}.` or [`MODULE_PREFIX`]).
fn layer_tensors(
    prefix: &str,
    l: &QLayer,
    cfg: &ModelConfig,
    out: &mut Vec<GgufTensorData>,
) -> Result<()> {
    let n = |s: &str| format!("{prefix}{s}");
    let (h, kv) = (cfg.num_heads, cfg.num_kv_heads);
    out.push(vec_tensor(&n("attn_norm.weight"), &l.attn_norm, None));
    out.push(linear_tensor(&n("attn_q.weight"), &l.wq, rope(cfg, h))?);
    out.push(linear_tensor(&n("attn_k.weight"), &l.wk, rope(cfg, kv))?);
    out.push(linear_tensor(&n("attn_v.weight"), &l.wv, None)?);
    out.push(linear_tensor(&n("attn_output.weight"), &l.wo, None)?);
    if let Some(b) = &l.bq {
        out.push(vec_tensor(&n("attn_q.bias"), b, rope(cfg, h)));
    }
    if let Some(b) = &l.bk {
        out.push(vec_tensor(&n("attn_k.bias"), b, rope(cfg, kv)));
    }
    if let Some(b) = &l.bv {
        out.push(vec_tensor(&n("attn_v.bias"), b, None));
    }
    ffn_tensors(prefix, &l.mlp_norm, [&l.w_gate, &l.w_up, &l.w_down], out)
}

/// The MLP half's tensors under `prefix`: `[gate, up, down]` and the norm before them (all a
/// feed-forward-only block has).
fn ffn_tensors(
    prefix: &str,
    norm: &Array1<f32>,
    [gate, up, down]: [&Linear; 3],
    out: &mut Vec<GgufTensorData>,
) -> Result<()> {
    let n = |s: &str| format!("{prefix}{s}");
    out.push(vec_tensor(&n("ffn_norm.weight"), norm, None));
    out.push(linear_tensor(&n("ffn_gate.weight"), gate, None)?);
    out.push(linear_tensor(&n("ffn_up.weight"), up, None)?);
    out.push(linear_tensor(&n("ffn_down.weight"), down, None)?);
    Ok(())
}

fn json_string<T: Serialize>(what: &str, v: &T) -> Result<GgufValue> {
    serde_json::to_string(v)
        .map(GgufValue::String)
        .map_err(|e| ElmError::Json {
            what: what.into(),
            msg: e.to_string(),
        })
}

/// Writes a quantized model (`elm_cfg`: its ELM layout, `None` for a dense model) and its
/// tokenizer as one GGUF file at `path` (atomic; an existing file is replaced — callers
/// refuse it first if they must). Returns the bytes written. `ElmModel::save_quant_gguf` is
/// the model-level call.
pub fn write_quant_gguf(
    path: &Path,
    elm_cfg: Option<&ElmConfig>,
    q: &QuantElm,
    tokenizer: &Tokenizer,
) -> Result<u64> {
    let cfg = &q.dense.config;
    let mut meta = arch_metadata(cfg);
    meta.push(kv(FORMAT_KEY, GgufValue::String(QUANT_FORMAT.into())));
    meta.push(kv(MODEL_CONFIG_KEY, json_string("model config", cfg)?));
    if let Some(e) = elm_cfg {
        meta.push(kv(ELM_KEY, json_string("ELM config", e)?));
    }
    let (tok_json, tok_cfg) = tokenizer.to_json_parts(false)?;
    meta.push(kv(TOKENIZER_JSON_KEY, GgufValue::String(tok_json)));
    meta.push(kv(TOKENIZER_CONFIG_KEY, GgufValue::String(tok_cfg)));

    let mut tensors = vec![
        linear_tensor("token_embd.weight", &q.dense.embed, None)?,
        vec_tensor("output_norm.weight", &q.dense.final_norm, None),
    ];
    if let Some(head) = &q.dense.lm_head {
        tensors.push(linear_tensor("output.weight", head, None)?);
    }
    let kept = ElmConfig::kept_layers(elm_cfg, cfg.num_layers);
    if kept.len() != q.dense.layers.len() {
        return Err(ElmError::shape(
            "save_quant_gguf",
            format!(
                "{} dense layers held for {} kept layers",
                q.dense.layers.len(),
                kept.len()
            ),
        ));
    }
    for (i, layer) in kept.iter().zip(&q.dense.layers) {
        layer_tensors(&format!("blk.{i}."), layer, cfg, &mut tensors)?;
    }
    if let Some(m) = &q.module {
        match &m.block {
            ModuleBlock::Decoder(b) => layer_tensors(MODULE_PREFIX, b, cfg, &mut tensors)?,
            ModuleBlock::Ffn(f) => ffn_tensors(
                MODULE_PREFIX,
                &f.mlp_norm,
                [&f.w_gate, &f.w_up, &f.w_down],
                &mut tensors,
            )?,
        }
        if let Some(p) = &m.projection {
            tensors.push(linear_tensor(PROJ_Z, &p.w_z, None)?);
            tensors.push(linear_tensor(PROJ_H, &p.w_h, None)?);
            tensors.push(vec_tensor(PROJ_BIAS, &p.bias, None));
        }
    }
    write_gguf(path, &meta, &tensors)?;
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| ElmError::io(path, e))
}

fn json_key<T: DeserializeOwned>(gguf: &GgufFile, key: &str) -> Result<T> {
    let text = gguf.get_str(key)?;
    serde_json::from_str(text)
        .map_err(|e| ElmError::format(gguf.path(), format!("metadata `{key}`: {e}")))
}

/// One block read from `prefix` (inverse of [`layer_tensors`]), attending as layer `layer` of
/// the dense model does (the module: as the first layer it replaced).
fn read_layer(
    t: &mut Taker<'_>,
    prefix: &str,
    cfg: &ModelConfig,
    storage: WeightStorage,
    layer: usize,
) -> Result<QLayer> {
    let name = |s: &str| format!("{prefix}{s}");
    t.qlayer(cfg, name, storage, cfg.layer_attention(layer))
}

/// Reads a file written by [`write_quant_gguf`]: the ELM layout (`None` for a dense model), the
/// quantized weights and the tokenizer (`ElmModel::load_quant_gguf_with` builds the model). `Auto` keeps every matrix as stored (blocks
/// byte-for-byte); `Quant(f)` re-quantizes matrices of another format; `F32` dequantizes.
///
/// Strict: a wrong `elm.format`, missing or invalid config metadata, or a missing,
/// mis-shaped or unexpected tensor is an error naming the file and the key or tensor.
pub fn read_quant_gguf_with(
    path: &Path,
    storage: WeightStorage,
) -> Result<(Option<ElmConfig>, QuantElm, Tokenizer)> {
    let gguf = GgufFile::open(path)?;
    let format = gguf.get_str(FORMAT_KEY)?;
    if format != QUANT_FORMAT {
        return Err(ElmError::format(
            path,
            format!("metadata `{FORMAT_KEY}` = `{format}`, expected `{QUANT_FORMAT}`"),
        ));
    }
    let cfg: ModelConfig = json_key(&gguf, MODEL_CONFIG_KEY)?;
    cfg.validate().map_err(|e| e.in_file(path))?;
    let elm: Option<ElmConfig> = match gguf.get(ELM_KEY) {
        None => None,
        Some(_) => {
            let e: ElmConfig = json_key(&gguf, ELM_KEY)?;
            e.validate(&cfg).map_err(|e| e.in_file(path))?;
            Some(e)
        }
    };
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    tokenizer.check_embedding_rows(cfg.vocab_size, path)?;
    let (c, v) = (cfg.hidden_size, cfg.vocab_size);
    let mut t = Taker::new(&gguf);
    let embed = t.linear("token_embd.weight", v, c, storage, None)?;
    let final_norm = t.vector("output_norm.weight", c)?;
    let lm_head = if cfg.tie_word_embeddings {
        None
    } else {
        Some(t.linear("output.weight", v, c, storage, None)?)
    };
    let kept = ElmConfig::kept_layers(elm.as_ref(), cfg.num_layers);
    let layers = kept
        .iter()
        .map(|&i| read_layer(&mut t, &format!("blk.{i}."), &cfg, storage, i))
        .collect::<Result<Vec<_>>>()?;
    let module = match &elm {
        None => None,
        Some(e) => Some(QuantModule {
            block: match e.block {
                BlockKind::Decoder => {
                    let first = e.start_layer;
                    ModuleBlock::Decoder(read_layer(&mut t, MODULE_PREFIX, &cfg, storage, first)?)
                }
                BlockKind::Ffn => ModuleBlock::Ffn(t.qffn(
                    &cfg,
                    |s: &str| format!("{MODULE_PREFIX}{s}"),
                    storage,
                )?),
            },
            projection: if e.injection {
                Some(QuantProjection {
                    w_z: t.linear(PROJ_Z, c, c, storage, None)?,
                    w_h: t.linear(PROJ_H, c, c, storage, None)?,
                    bias: t.vector(PROJ_BIAS, c)?,
                })
            } else {
                None
            },
        }),
    };
    t.finish()?;
    let quant = QuantElm {
        dense: QuantWeights {
            config: cfg,
            embed,
            layers,
            final_norm,
            lm_head,
        },
        module,
    };
    Ok((elm, quant, tokenizer))
}

fn layer_linears(l: &QLayer) -> [&Linear; 7] {
    [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
}

/// Storage names of the matrices a quantized model holds, with their counts (for reports).
pub fn storage_summary(quant: Option<&QuantElm>) -> Vec<(String, usize)> {
    let mut all: Vec<&Linear> = vec![];
    if let Some(q) = quant {
        all.push(&q.dense.embed);
        all.extend(q.dense.lm_head.as_ref());
        for l in &q.dense.layers {
            all.extend(layer_linears(l));
        }
        if let Some(m) = &q.module {
            match &m.block {
                ModuleBlock::Decoder(b) => all.extend(layer_linears(b)),
                ModuleBlock::Ffn(f) => all.extend([&f.w_gate, &f.w_up, &f.w_down]),
            }
            if let Some(p) = &m.projection {
                all.extend([&p.w_z, &p.w_h]);
            }
        }
    }
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for l in all {
        *counts.entry(l.format_name().to_string()).or_default() += 1;
    }
    counts.into_iter().collect()
}
