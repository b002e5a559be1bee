//! Cache-free (whole-sequence) dense passes used by training and evaluation: token embeddings of
//! a rectangular batch and hidden states at layer boundaries.
//!
//! Right padding is harmless here: attention is causal, so real tokens never see pads.

use ndarray::{Array2, Array3, ArrayView2};

use crate::error::{ElmError, Result};
use crate::model::{block_forward_inplace, embed_tokens, LayerWeights, ModelConfig, ModelWeights};

use crate::model::{LayerKv, Scratch};

/// Token embeddings `[B, T, C]` of a rectangular batch.
pub fn embed(weights: &ModelWeights, tokens: &[Vec<u32>]) -> Result<Array3<f32>> {
    let (x, lens) = embed_tokens(weights, tokens)?;
    if lens.iter().any(|&l| l != x.dim().1) {
        return Err(ElmError::shape(
            "embed",
            "ragged batch: pad sequences to one length",
        ));
    }
    Ok(x)
}

/// Runs dense layers `range` on `x [B, T, C]` (positions from 0).
pub fn run_dense_layers(
    weights: &ModelWeights,
    x: Array3<f32>,
    range: std::ops::Range<usize>,
) -> Result<Array3<f32>> {
    run_layers(&weights.config, weights.layers[range].iter(), x)
}

/// Runs `layers` in order on `x [B, T, C]` (positions from 0); they need not be one model's
/// (e.g. a merged candidate followed by a model's upper layers).
pub fn run_layers<'a>(
    cfg: &ModelConfig,
    layers: impl Iterator<Item = &'a LayerWeights>,
    mut x: Array3<f32>,
) -> Result<Array3<f32>> {
    let (b, t, _) = x.dim();
    let (mut kv, mut scratch) = fresh_cache(cfg, b, t)?;
    // commit = false: every layer sees an empty history, so one cache serves them all.
    let lens = vec![t; b];
    for w in layers {
        block_forward_inplace(w, cfg, x.view_mut(), &lens, &mut kv, false, &mut scratch)?;
    }
    Ok(x)
}

/// The dense model's logits `[N, V]` of final hidden states `[N, C]`: the final norm, then the
/// LM head (the scoring step every whole-sequence NLL shares).
pub fn head_logits(weights: &ModelWeights, hidden: ArrayView2<f32>) -> Array2<f32> {
    let mut normed = Array2::zeros(hidden.raw_dim());
    crate::model::ops::rms_norm_into(
        hidden,
        weights.final_norm.view(),
        weights.config.rms_norm_eps,
        normed.view_mut(),
    );
    let mut logits = Array2::zeros((hidden.nrows(), weights.config.vocab_size));
    crate::model::ops::linear_into(
        normed.view(),
        weights.lm_head().view(),
        None,
        logits.view_mut(),
    );
    logits
}

/// An empty single-layer cache and scratch for a whole-sequence pass of `[B, T]` tokens.
pub fn fresh_cache(cfg: &ModelConfig, b: usize, t: usize) -> Result<(LayerKv, Scratch)> {
    let (b, t) = (b.max(1), t.max(1));
    Ok((LayerKv::new(cfg, b, t)?, Scratch::new(cfg, t)))
}
