//! Llama / Qwen2 decoder forward on the autograd tape (the training path).
//!
//! Weights are converted once into shared tensors ([`ModelTensors`] / [`BlockTensors`],
//! `Arc<ArrayD<T>>`), then registered on each step's fresh tape without copying, as params
//! (trainable) or constants (frozen). Gradients flow through frozen blocks into their
//! inputs without computing weight gradients for them.
//!
//! Shapes: `x: [B, T, C]`, `q: [B, T, H, D]`, `k, v: [B, T, KV, D]`, logits `[B, T, V]`.
//! RoPE uses the HF half-split layout (the layout of [`LayerWeights`]).

use std::ops::Range;
use std::sync::Arc;

use ndarray::{ArrayD, Dimension};

use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};
use crate::model::{LayerWeights, ModelConfig, ModelWeights};
use crate::nn::{self, RopeLayout};

/// Per-block hyper-parameters (copied from [`ModelConfig`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockSpec {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
}

impl BlockSpec {
    /// The block hyper-parameters of a model config.
    pub fn from_config(cfg: &ModelConfig) -> Self {
        BlockSpec {
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            rope_theta: cfg.rope_theta as f64,
            rms_norm_eps: cfg.rms_norm_eps as f64,
        }
    }
}

fn to_t<T: AdFloat, D: Dimension>(a: &ndarray::Array<f32, D>) -> Arc<ArrayD<T>> {
    Arc::new(a.mapv(T::of_f32).into_dyn())
}

/// One block's weights as shared tape-ready tensors (same names/shapes as [`LayerWeights`]).
#[derive(Clone, Debug)]
pub struct BlockTensors<T: AdFloat> {
    pub spec: BlockSpec,
    pub attn_norm: Arc<ArrayD<T>>,
    pub wq: Arc<ArrayD<T>>,
    pub wk: Arc<ArrayD<T>>,
    pub wv: Arc<ArrayD<T>>,
    pub wo: Arc<ArrayD<T>>,
    pub bq: Option<Arc<ArrayD<T>>>,
    pub bk: Option<Arc<ArrayD<T>>>,
    pub bv: Option<Arc<ArrayD<T>>>,
    pub mlp_norm: Arc<ArrayD<T>>,
    pub w_gate: Arc<ArrayD<T>>,
    pub w_up: Arc<ArrayD<T>>,
    pub w_down: Arc<ArrayD<T>>,
}

impl<T: AdFloat> BlockTensors<T> {
    /// Converts (and for `f64`, widens) one block's `f32` weights.
    pub fn from_weights(w: &LayerWeights, cfg: &ModelConfig) -> Self {
        BlockTensors {
            spec: BlockSpec::from_config(cfg),
            attn_norm: to_t(&w.attn_norm),
            wq: to_t(&w.wq),
            wk: to_t(&w.wk),
            wv: to_t(&w.wv),
            wo: to_t(&w.wo),
            bq: w.bq.as_ref().map(to_t),
            bk: w.bk.as_ref().map(to_t),
            bv: w.bv.as_ref().map(to_t),
            mlp_norm: to_t(&w.mlp_norm),
            w_gate: to_t(&w.w_gate),
            w_up: to_t(&w.w_up),
            w_down: to_t(&w.w_down),
        }
    }

    /// `(name, tensor)` pairs in a fixed order (names as in [`LayerWeights`]).
    pub fn named(&self) -> Vec<(&'static str, &Arc<ArrayD<T>>)> {
        let mut v = vec![
            ("attn_norm", &self.attn_norm),
            ("wq", &self.wq),
            ("wk", &self.wk),
            ("wv", &self.wv),
            ("wo", &self.wo),
        ];
        for (n, b) in [("bq", &self.bq), ("bk", &self.bk), ("bv", &self.bv)] {
            if let Some(b) = b {
                v.push((n, b));
            }
        }
        v.extend([
            ("mlp_norm", &self.mlp_norm),
            ("w_gate", &self.w_gate),
            ("w_up", &self.w_up),
            ("w_down", &self.w_down),
        ]);
        v
    }
}

/// One block's weights registered on a tape.
#[derive(Clone, Debug)]
pub struct BlockVars {
    pub spec: BlockSpec,
    pub attn_norm: Var,
    pub wq: Var,
    pub wk: Var,
    pub wv: Var,
    pub wo: Var,
    pub bq: Option<Var>,
    pub bk: Option<Var>,
    pub bv: Option<Var>,
    pub mlp_norm: Var,
    pub w_gate: Var,
    pub w_up: Var,
    pub w_down: Var,
}

impl BlockVars {
    /// Registers a block's weights (copied and converted) as params (`trainable`) or constants.
    pub fn from_weights<T: AdFloat>(
        tape: &mut Tape<T>,
        w: &LayerWeights,
        cfg: &ModelConfig,
        trainable: bool,
    ) -> Self {
        Self::register(tape, &BlockTensors::from_weights(w, cfg), trainable)
    }

    /// Registers shared tensors without copying them.
    pub fn register<T: AdFloat>(tape: &mut Tape<T>, w: &BlockTensors<T>, trainable: bool) -> Self {
        let mut reg = |a: &Arc<ArrayD<T>>| {
            if trainable {
                tape.param_shared(a.clone())
            } else {
                tape.constant_shared(a.clone())
            }
        };
        BlockVars {
            spec: w.spec,
            attn_norm: reg(&w.attn_norm),
            wq: reg(&w.wq),
            wk: reg(&w.wk),
            wv: reg(&w.wv),
            wo: reg(&w.wo),
            bq: w.bq.as_ref().map(&mut reg),
            bk: w.bk.as_ref().map(&mut reg),
            bv: w.bv.as_ref().map(&mut reg),
            mlp_norm: reg(&w.mlp_norm),
            w_gate: reg(&w.w_gate),
            w_up: reg(&w.w_up),
            w_down: reg(&w.w_down),
        }
    }

    /// `(name, var)` pairs in the same order as [`BlockTensors::named`].
    pub fn named(&self) -> Vec<(&'static str, Var)> {
        let mut v = vec![
            ("attn_norm", self.attn_norm),
            ("wq", self.wq),
            ("wk", self.wk),
            ("wv", self.wv),
            ("wo", self.wo),
        ];
        for (n, b) in [("bq", self.bq), ("bk", self.bk), ("bv", self.bv)] {
            if let Some(b) = b {
                v.push((n, b));
            }
        }
        v.extend([
            ("mlp_norm", self.mlp_norm),
            ("w_gate", self.w_gate),
            ("w_up", self.w_up),
            ("w_down", self.w_down),
        ]);
        v
    }
}

/// Keys and values of one block at `x`'s tokens, after RoPE: each `[B, T, KV, D]`.
/// Use them as the KV prefix of a later call (e.g. a prompt cached for the next chunk).
pub fn block_kv<T: AdFloat>(
    tape: &mut Tape<T>,
    b: &BlockVars,
    x: Var,
    pos_offset: usize,
) -> Result<(Var, Var)> {
    let (bsz, t) = dims_btc(tape, x)?;
    let sp = b.spec;
    let h = nn::rms_norm(tape, x, b.attn_norm, T::of(sp.rms_norm_eps))?;
    let k = tape.matmul_t(h, b.wk, b.bk)?;
    let k = tape.reshape(k, &[bsz, t, sp.num_kv_heads, sp.head_dim])?;
    let k = nn::rope(tape, k, sp.rope_theta, pos_offset, RopeLayout::HalfSplit)?;
    let v = tape.matmul_t(h, b.wv, b.bv)?;
    let v = tape.reshape(v, &[bsz, t, sp.num_kv_heads, sp.head_dim])?;
    Ok((k, v))
}

fn dims_btc<T: AdFloat>(tape: &Tape<T>, x: Var) -> Result<(usize, usize)> {
    let s = tape.value(x).shape();
    if s.len() != 3 {
        return Err(ElmError::shape(
            "block_forward",
            format!("x must be [B, T, C], got {s:?}"),
        ));
    }
    Ok((s[0], s[1]))
}

/// One decoder block: `x + Attn(RMSNorm(x))`, then `+ MLP(RMSNorm(·))`.
/// `x: [B, T, C]` at positions `pos_offset..pos_offset+T` → `[B, T, C]`.
pub fn block_forward<T: AdFloat>(
    tape: &mut Tape<T>,
    b: &BlockVars,
    x: Var,
    pos_offset: usize,
) -> Result<Var> {
    block_forward_with_prefix(tape, b, x, pos_offset, None)
}

/// [`block_forward`] with an optional KV prefix `(k, v): [B, P, KV, D]` (already rotated,
/// positions `pos_offset − P .. pos_offset`) that the current tokens also attend to.
pub fn block_forward_with_prefix<T: AdFloat>(
    tape: &mut Tape<T>,
    b: &BlockVars,
    x: Var,
    pos_offset: usize,
    kv_prefix: Option<(Var, Var)>,
) -> Result<Var> {
    let (bsz, t) = dims_btc(tape, x)?;
    let sp = b.spec;
    let eps = T::of(sp.rms_norm_eps);
    // Attention.
    let h = nn::rms_norm(tape, x, b.attn_norm, eps)?;
    let q = tape.matmul_t(h, b.wq, b.bq)?;
    let q = tape.reshape(q, &[bsz, t, sp.num_heads, sp.head_dim])?;
    let q = nn::rope(tape, q, sp.rope_theta, pos_offset, RopeLayout::HalfSplit)?;
    let k = tape.matmul_t(h, b.wk, b.bk)?;
    let k = tape.reshape(k, &[bsz, t, sp.num_kv_heads, sp.head_dim])?;
    let k = nn::rope(tape, k, sp.rope_theta, pos_offset, RopeLayout::HalfSplit)?;
    let v = tape.matmul_t(h, b.wv, b.bv)?;
    let v = tape.reshape(v, &[bsz, t, sp.num_kv_heads, sp.head_dim])?;
    let a = nn::attention(tape, q, k, v, kv_prefix)?;
    let a = tape.reshape(a, &[bsz, t, sp.num_heads * sp.head_dim])?;
    let o = tape.matmul_t(a, b.wo, None)?;
    let x = tape.add(x, o)?;
    // SwiGLU MLP.
    let h = nn::rms_norm(tape, x, b.mlp_norm, eps)?;
    let g = tape.matmul_t(h, b.w_gate, None)?;
    let u = tape.matmul_t(h, b.w_up, None)?;
    let s = nn::swiglu(tape, g, u)?;
    let d = tape.matmul_t(s, b.w_down, None)?;
    tape.add(x, d)
}

/// All weights as shared tape-ready tensors.
#[derive(Clone, Debug)]
pub struct ModelTensors<T: AdFloat> {
    pub config: ModelConfig,
    /// `[V, C]`
    pub embed: Arc<ArrayD<T>>,
    pub layers: Vec<BlockTensors<T>>,
    /// `[C]`
    pub final_norm: Arc<ArrayD<T>>,
    /// `[V, C]`; `None` when tied to `embed`.
    pub lm_head: Option<Arc<ArrayD<T>>>,
}

impl<T: AdFloat> ModelTensors<T> {
    /// Converts a model's `f32` weights once (reuse across steps).
    pub fn from_weights(w: &ModelWeights) -> Result<Self> {
        w.config.validate()?;
        if w.layers.len() != w.config.num_layers {
            return Err(ElmError::config(
                "num_layers",
                format!(
                    "config says {} but weights have {}",
                    w.config.num_layers,
                    w.layers.len()
                ),
            ));
        }
        Ok(ModelTensors {
            config: w.config.clone(),
            embed: to_t(&w.embed),
            layers: w
                .layers
                .iter()
                .map(|l| BlockTensors::from_weights(l, &w.config))
                .collect(),
            final_norm: to_t(&w.final_norm),
            lm_head: w.lm_head.as_ref().map(to_t),
        })
    }
}

/// Which parts of the model get gradients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trainable {
    /// Token embedding (and the LM head when tied).
    pub embed: bool,
    /// Blocks whose weights are params.
    pub layers: Range<usize>,
    /// Final norm and an untied LM head.
    pub head: bool,
}

impl Trainable {
    /// Everything trainable.
    pub fn all(num_layers: usize) -> Self {
        Trainable {
            embed: true,
            layers: 0..num_layers,
            head: true,
        }
    }
    /// Everything frozen.
    pub fn none() -> Self {
        Trainable {
            embed: false,
            layers: 0..0,
            head: false,
        }
    }
}

/// A model's weights registered on a tape.
#[derive(Clone, Debug)]
pub struct ModelVars {
    pub config: ModelConfig,
    pub embed: Var,
    pub layers: Vec<BlockVars>,
    pub final_norm: Var,
    /// Same var as `embed` when tied.
    pub lm_head: Var,
}

impl ModelVars {
    /// Registers shared tensors (no copies); `trainable` picks params vs constants.
    pub fn register<T: AdFloat>(
        tape: &mut Tape<T>,
        w: &ModelTensors<T>,
        trainable: &Trainable,
    ) -> Self {
        let reg = |tape: &mut Tape<T>, a: &Arc<ArrayD<T>>, train: bool| {
            if train {
                tape.param_shared(a.clone())
            } else {
                tape.constant_shared(a.clone())
            }
        };
        let embed = reg(tape, &w.embed, trainable.embed);
        let layers = w
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| BlockVars::register(tape, l, trainable.layers.contains(&i)))
            .collect();
        let final_norm = reg(tape, &w.final_norm, trainable.head);
        let lm_head = match &w.lm_head {
            Some(h) => reg(tape, h, trainable.head),
            None => embed,
        };
        ModelVars {
            config: w.config.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
        }
    }

    /// Converts and registers in one go (copies the weights; prefer [`ModelTensors`] + `register` per step).
    pub fn from_weights<T: AdFloat>(
        tape: &mut Tape<T>,
        w: &ModelWeights,
        trainable: &Trainable,
    ) -> Result<Self> {
        Ok(Self::register(
            tape,
            &ModelTensors::from_weights(w)?,
            trainable,
        ))
    }

    /// Token embedding: `ids` row-major `[B, T]` → `[B, T, C]`.
    pub fn embed<T: AdFloat>(
        &self,
        tape: &mut Tape<T>,
        ids: &[usize],
        batch: usize,
        seq: usize,
    ) -> Result<Var> {
        nn::embedding(tape, self.embed, ids, &[batch, seq])
    }

    /// Runs blocks `range` on `x: [B, T, C]` at positions from `pos_offset`.
    pub fn run_layers<T: AdFloat>(
        &self,
        tape: &mut Tape<T>,
        range: Range<usize>,
        x: Var,
        pos_offset: usize,
    ) -> Result<Var> {
        if range.end > self.layers.len() || range.start > range.end {
            return Err(ElmError::InvalidArgument(format!(
                "layer range {range:?} outside 0..{}",
                self.layers.len()
            )));
        }
        let mut h = x;
        for l in range {
            h = block_forward(tape, &self.layers[l], h, pos_offset)?;
        }
        Ok(h)
    }

    /// Final RMSNorm and LM head: `[B, T, C]` → logits `[B, T, V]`.
    pub fn head<T: AdFloat>(&self, tape: &mut Tape<T>, h: Var) -> Result<Var> {
        let n = nn::rms_norm(
            tape,
            h,
            self.final_norm,
            T::of(self.config.rms_norm_eps as f64),
        )?;
        tape.matmul_t(n, self.lm_head, None)
    }

    /// Hidden states `[h_0 = embeddings, h_1 = after block 0, ..., h_L]`, each `[B, T, C]`.
    pub fn hidden_states<T: AdFloat>(
        &self,
        tape: &mut Tape<T>,
        ids: &[usize],
        batch: usize,
        seq: usize,
    ) -> Result<Vec<Var>> {
        let mut hs = vec![self.embed(tape, ids, batch, seq)?];
        for l in 0..self.layers.len() {
            let h = block_forward(tape, &self.layers[l], *hs.last().unwrap(), 0)?;
            hs.push(h);
        }
        Ok(hs)
    }

    /// Full forward: `ids` `[B, T]` → logits `[B, T, V]`.
    pub fn forward_logits<T: AdFloat>(
        &self,
        tape: &mut Tape<T>,
        ids: &[usize],
        batch: usize,
        seq: usize,
    ) -> Result<Var> {
        let x = self.embed(tape, ids, batch, seq)?;
        let h = self.run_layers(tape, 0..self.layers.len(), x, 0)?;
        self.head(tape, h)
    }
}

/// Tape-free forward of one block (same math as [`block_forward`]) for no-grad work such as
/// fixed-point iterations or frozen layers: no node values or caches are kept.
/// `x: [B, T, C]` at positions `pos_offset..` → `[B, T, C]`.
pub fn block_forward_plain<T: AdFloat>(
    w: &BlockTensors<T>,
    x: &ArrayD<T>,
    pos_offset: usize,
) -> Result<ArrayD<T>> {
    use crate::autograd::ops::linear_forward;
    let s = x.shape();
    if s.len() != 3 {
        return Err(ElmError::shape(
            "block_forward_plain",
            format!("x must be [B, T, C], got {s:?}"),
        ));
    }
    let (bsz, t) = (s[0], s[1]);
    let sp = w.spec;
    let eps = T::of(sp.rms_norm_eps);
    let heads = |a: ArrayD<T>, n: usize| -> Result<ArrayD<T>> {
        a.into_shape_with_order(ndarray::IxDyn(&[bsz, t, n, sp.head_dim]))
            .map_err(|e| ElmError::shape("block_forward_plain", e.to_string()))
    };
    let (h, _) = nn::rmsnorm::forward(x, &w.attn_norm, eps)?;
    let q = heads(linear_forward(&h, &w.wq, w.bq.as_deref())?, sp.num_heads)?;
    let q = nn::rope::rotate(&q, sp.rope_theta, pos_offset, RopeLayout::HalfSplit, false)?;
    let k = heads(linear_forward(&h, &w.wk, w.bk.as_deref())?, sp.num_kv_heads)?;
    let k = nn::rope::rotate(&k, sp.rope_theta, pos_offset, RopeLayout::HalfSplit, false)?;
    let v = heads(linear_forward(&h, &w.wv, w.bv.as_deref())?, sp.num_kv_heads)?;
    let (a, _) = nn::attention::forward(&q, &k, &v)?;
    let a = a
        .into_shape_with_order(ndarray::IxDyn(&[bsz, t, sp.num_heads * sp.head_dim]))
        .map_err(|e| ElmError::shape("block_forward_plain", e.to_string()))?;
    let x = x + &linear_forward(&a, &w.wo, None)?;
    let (h, _) = nn::rmsnorm::forward(&x, &w.mlp_norm, eps)?;
    let g = linear_forward(&h, &w.w_gate, None)?;
    let u = linear_forward(&h, &w.w_up, None)?;
    let m = nn::swiglu::forward(&g, &u)?;
    Ok(x + &linear_forward(&m, &w.w_down, None)?)
}

impl<T: AdFloat> ModelTensors<T> {
    /// Tape-free run of blocks `range` on `x: [B, T, C]` (see [`block_forward_plain`]).
    pub fn run_layers_plain(
        &self,
        range: Range<usize>,
        x: &ArrayD<T>,
        pos_offset: usize,
    ) -> Result<ArrayD<T>> {
        if range.end > self.layers.len() || range.start > range.end {
            return Err(ElmError::InvalidArgument(format!(
                "layer range {range:?} outside 0..{}",
                self.layers.len()
            )));
        }
        let mut h = x.clone();
        for l in range {
            h = block_forward_plain(&self.layers[l], &h, pos_offset)?;
        }
        Ok(h)
    }
}
