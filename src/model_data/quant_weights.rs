//! The blocks and whole decoders of the inference path with each matrix in any storage
//! ([`QFfn`], [`QLayer`], [`QuantWeights`]): the model's parts as `crate::quant`'s
//! [`Linear`]s, next to their f32 twins in `super::weights`.

use ndarray::Array1;

use super::config::ModelConfig;
use super::weights::{Block, Ffn, FfnWeights, LayerWeights, ModelWeights};
use crate::quant::{Linear, WriteFormat};

/// A feed-forward-only block with its matrices in any storage.
pub type QFfn = Ffn<Linear>;

impl QFfn {
    /// Every matrix of `f` quantized to `format` (`None`: kept f32).
    pub fn from_f32(f: &FfnWeights, format: Option<WriteFormat>) -> Self {
        f.map_projections(|w| Linear::from_f32(w, format))
    }

    /// The block's f32 weights (dequantized).
    pub fn to_f32(&self) -> FfnWeights {
        self.map_projections(Linear::to_f32)
    }

    /// Bytes of weights held (the same count as the block's view, `BlockRef::bytes`).
    pub fn bytes(&self) -> usize {
        linear_bytes(&[&self.w_gate, &self.w_up, &self.w_down]) + 4 * self.mlp_norm.len()
    }
}

/// One decoder block for inference with each projection in any storage.
pub type QLayer = Block<Linear>;

impl QLayer {
    /// Every projection of `l` quantized to `format` (`None`: kept f32).
    pub fn from_f32(l: &LayerWeights, format: Option<WriteFormat>) -> Self {
        l.map_projections(|w| Linear::from_f32(w, format))
    }

    /// The block's f32 weights (dequantized): the training / reference representation.
    pub fn to_f32(&self) -> LayerWeights {
        self.map_projections(Linear::to_f32)
    }

    /// Bytes of weights held (the same count as the block's view, `BlockRef::bytes`).
    pub fn bytes(&self) -> usize {
        linear_bytes(&self.projections()) + 4 * self.vector_params()
    }
}

fn linear_bytes(matrices: &[&Linear]) -> usize {
    matrices.iter().map(|l| l.bytes()).sum()
}

/// A whole decoder for inference with quantized (or f32) projections, embedding and LM head.
#[derive(Clone, Debug)]
pub struct QuantWeights {
    pub config: ModelConfig,
    /// `[V, C]` (also the LM head when tied).
    pub embed: Linear,
    pub layers: Vec<QLayer>,
    /// `[C]`
    pub final_norm: Array1<f32>,
    /// `[V, C]`; `None` when tied to `embed`.
    pub lm_head: Option<Linear>,
}

impl QuantWeights {
    /// Quantizes every matrix of `w` (embedding and LM head included) to `format`.
    pub fn quantize(w: &ModelWeights, format: WriteFormat) -> Self {
        Self::from_f32(w, Some(format))
    }

    /// Every matrix of `w` quantized to `format`, or kept f32 (`None`).
    pub fn from_f32(w: &ModelWeights, format: Option<WriteFormat>) -> Self {
        QuantWeights {
            config: w.config.clone(),
            embed: Linear::from_f32(&w.embed, format),
            layers: w
                .layers
                .iter()
                .map(|l| QLayer::from_f32(l, format))
                .collect(),
            final_norm: w.final_norm.clone(),
            lm_head: w.lm_head.as_ref().map(|h| Linear::from_f32(h, format)),
        }
    }

    /// The same model with every matrix dequantized to f32 (the reference of the
    /// quantized kernels).
    pub fn to_f32(&self) -> ModelWeights {
        ModelWeights {
            config: self.config.clone(),
            embed: self.embed.to_f32(),
            layers: self.layers.iter().map(QLayer::to_f32).collect(),
            final_norm: self.final_norm.clone(),
            lm_head: self.lm_head.as_ref().map(Linear::to_f32),
        }
    }

    /// The LM head (the embedding when tied).
    pub fn lm_head(&self) -> &Linear {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of every weight held.
    pub fn bytes(&self) -> usize {
        self.embed.bytes()
            + self.layers.iter().map(|l| l.bytes()).sum::<usize>()
            + self.final_norm.len() * 4
            + self.lm_head.as_ref().map_or(0, |h| h.bytes())
    }
}
