//! Parameter and KV-cache accounting, computed from the config alone (tests cross-check
//! against the actual allocated arrays).

use serde::{Deserialize, Serialize};

use crate::model::ModelConfig;

use super::config::{BlockKind, ElmConfig};

/// Scalar parameters of one decoder block of `cfg`.
pub fn block_params(cfg: &ModelConfig) -> usize {
    let (c, q, kv, i) = (
        cfg.hidden_size,
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    );
    let bias = if cfg.attention_bias { q + 2 * kv } else { 0 };
    2 * c + c * q + 2 * c * kv + q * c + bias + 3 * c * i
}

/// Scalar parameters of a feed-forward-only block of `cfg` (a decoder block's MLP half).
pub fn ffn_params(cfg: &ModelConfig) -> usize {
    cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size
}

/// Token embedding plus the LM head when untied.
pub fn embedding_params(cfg: &ModelConfig) -> usize {
    let e = cfg.vocab_size * cfg.hidden_size;
    if cfg.tie_word_embeddings {
        e
    } else {
        2 * e
    }
}

/// Parameters of the dense model (blocks + final norm + embeddings).
pub fn dense_params(cfg: &ModelConfig) -> usize {
    cfg.num_layers * block_params(cfg) + cfg.hidden_size + embedding_params(cfg)
}

/// Parameters of the fixed-point module: one block of kind `block` plus, with injection,
/// `P = [W_z | W_h]` (2C → C) and `b`.
pub fn module_params(cfg: &ModelConfig, injection: bool, block: BlockKind) -> usize {
    let c = cfg.hidden_size;
    let block = match block {
        BlockKind::Decoder => block_params(cfg),
        BlockKind::Ffn => ffn_params(cfg),
    };
    block + if injection { 2 * c * c + c } else { 0 }
}

/// Dense vs ELM parameter counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamReport {
    pub num_layers: usize,
    pub start_layer: usize,
    pub num_replaced: usize,
    pub dense_total: usize,
    pub dense_non_embedding: usize,
    pub elm_total: usize,
    pub elm_non_embedding: usize,
    /// Parameters of the M removed blocks.
    pub removed: usize,
    /// Parameters added back (one block, + P + b with injection, + the loops' adapters of a
    /// relaxed recursive module).
    pub module: usize,
    /// `1 − elm_total / dense_total`.
    pub reduction_total: f64,
    /// `1 − elm_non_embedding / dense_non_embedding`.
    pub reduction_non_embedding: f64,
}

/// Parameter report for replacing layers `[l, l+M)` of `cfg`.
pub fn param_report(cfg: &ModelConfig, elm: &ElmConfig) -> ParamReport {
    let dense_total = dense_params(cfg);
    let dense_non_embedding = dense_total - embedding_params(cfg);
    let removed = elm.num_replaced * block_params(cfg);
    // A relaxed recursive module also stores its loops' adapters.
    let module =
        module_params(cfg, elm.injection, elm.block) + super::relaxed::loop_params(cfg, elm);
    let elm_total = dense_total - removed + module;
    let elm_non_embedding = dense_non_embedding - removed + module;
    ParamReport {
        num_layers: cfg.num_layers,
        start_layer: elm.start_layer,
        num_replaced: elm.num_replaced,
        dense_total,
        dense_non_embedding,
        elm_total,
        elm_non_embedding,
        removed,
        module,
        reduction_total: 1.0 - elm_total as f64 / dense_total as f64,
        reduction_non_embedding: 1.0 - elm_non_embedding as f64 / dense_non_embedding as f64,
    }
}

/// f32 K+V bytes of ONE layer's cache for `batch` sequences of `seq` tokens.
pub fn layer_kv_bytes(cfg: &ModelConfig, batch: usize, seq: usize) -> usize {
    2 * batch * seq * cfg.num_kv_heads * cfg.head_dim * std::mem::size_of::<f32>()
}

/// KV bytes of dense vs ELM at a context length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KvReport {
    pub batch: usize,
    pub context: usize,
    pub dense: usize,
    /// N − M + 1 layer caches (N − M for a feed-forward-only block, which attends to nothing).
    pub one_step: usize,
    /// N − M + K caches, K = per-iteration caches of the fixed-point block (N − M for a
    /// feed-forward-only block).
    pub multi_step: usize,
    pub multi_step_iterations: usize,
    /// `one_step / dense` = (N−M+1)/N.
    pub one_step_ratio: f64,
    pub multi_step_ratio: f64,
}

/// KV accounting; `iterations` = number of per-iteration caches in multi-step mode.
pub fn kv_report(
    cfg: &ModelConfig,
    elm: &ElmConfig,
    batch: usize,
    context: usize,
    iterations: usize,
) -> KvReport {
    let per = layer_kv_bytes(cfg, batch, context);
    let kept = cfg.num_layers - elm.num_replaced;
    let dense = cfg.num_layers * per;
    let attends = usize::from(elm.block.has_attention());
    // A relaxed recursive module runs as its merged layers, each with its own cache.
    let one_step_caches = if elm.is_relaxed() {
        elm.num_replaced
    } else {
        attends
    };
    let one_step = (kept + one_step_caches) * per;
    let multi_step = (kept + attends * iterations) * per;
    KvReport {
        batch,
        context,
        dense,
        one_step,
        multi_step,
        multi_step_iterations: iterations,
        one_step_ratio: one_step as f64 / dense as f64,
        multi_step_ratio: multi_step as f64 / dense as f64,
    }
}
