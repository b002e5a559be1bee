//! Dense f32 weights of a decoder, in HF layout, shared by every model path.
//!
//! Linear weights are stored `[out, in]` (PyTorch `nn.Linear` layout) so `y = x · Wᵀ`.
//! Q/K rows are in the HF *half-split* RoPE order; the GGUF loader converts from
//! GGUF's interleaved order at load time.

use ndarray::{Array1, Array2};

use super::config::ModelConfig;

/// Weights of one decoder block.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `[C]` RMSNorm gain before attention.
    pub attn_norm: Array1<f32>,
    /// `[H*D, C]`
    pub wq: Array2<f32>,
    /// `[KV*D, C]`
    pub wk: Array2<f32>,
    /// `[KV*D, C]`
    pub wv: Array2<f32>,
    /// `[C, H*D]`
    pub wo: Array2<f32>,
    /// `[H*D]` (Qwen2 only)
    pub bq: Option<Array1<f32>>,
    /// `[KV*D]` (Qwen2 only)
    pub bk: Option<Array1<f32>>,
    /// `[KV*D]` (Qwen2 only)
    pub bv: Option<Array1<f32>>,
    /// `[C]` RMSNorm gain before the MLP.
    pub mlp_norm: Array1<f32>,
    /// `[I, C]`
    pub w_gate: Array2<f32>,
    /// `[I, C]`
    pub w_up: Array2<f32>,
    /// `[C, I]`
    pub w_down: Array2<f32>,
}

/// All weights of a decoder-only model.
#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub config: ModelConfig,
    /// `[V, C]`
    pub embed: Array2<f32>,
    pub layers: Vec<LayerWeights>,
    /// `[C]`
    pub final_norm: Array1<f32>,
    /// `[V, C]`; `None` when tied to `embed`.
    pub lm_head: Option<Array2<f32>>,
}

impl ModelWeights {
    /// The LM head matrix `[V, C]` (the embedding when tied).
    pub fn lm_head(&self) -> &Array2<f32> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

impl LayerWeights {
    /// Number of scalar parameters in this block.
    pub fn num_params(&self) -> usize {
        let opt = |b: &Option<Array1<f32>>| b.as_ref().map_or(0, |b| b.len());
        self.attn_norm.len()
            + self.wq.len()
            + self.wk.len()
            + self.wv.len()
            + self.wo.len()
            + opt(&self.bq)
            + opt(&self.bk)
            + opt(&self.bv)
            + self.mlp_norm.len()
            + self.w_gate.len()
            + self.w_up.len()
            + self.w_down.len()
    }
}
