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

use ndarray::{ArrayD, ArrayViewD, Dimension};

use super::block_view::{AttnRef, BlockRef};
use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};
use crate::model::{FfnWeights, LayerWeights, ModelConfig, ModelWeights};
use crate::model_data::quant::LinearRef;
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

/// One block's parameters over any handle type: tape vars ([`BlockVars`]), shared tensors
/// ([`BlockTensors`]), or named arrays for checkpoints. Names and order are written once, in
/// [`BlockParams::try_map`]; everything that lists a block's parameters goes through it.
#[derive(Clone, Debug)]
pub struct BlockParams<H> {
    pub spec: BlockSpec,
    pub attn_norm: H,
    pub wq: H,
    pub wk: H,
    pub wv: H,
    pub wo: H,
    /// Q/K/V biases (Qwen2 only).
    pub bq: Option<H>,
    pub bk: Option<H>,
    pub bv: Option<H>,
    pub mlp_norm: H,
    pub w_gate: H,
    pub w_up: H,
    pub w_down: H,
}

/// One block's weights as shared tape-ready tensors (same names/shapes as [`LayerWeights`]).
pub type BlockTensors<T> = BlockParams<Arc<ArrayD<T>>>;

/// One block's weights registered on a tape.
pub type BlockVars = BlockParams<Var>;

impl<H> BlockParams<H> {
    /// `f(name, handle)` for every parameter in the block's one fixed order (names as in
    /// [`LayerWeights`]); the first error stops the walk.
    pub fn try_map<'a, G, E>(
        &'a self,
        mut f: impl FnMut(&'static str, &'a H) -> std::result::Result<G, E>,
    ) -> std::result::Result<BlockParams<G>, E> {
        // Struct fields are evaluated in the order written: this is the order.
        Ok(BlockParams {
            spec: self.spec,
            attn_norm: f("attn_norm", &self.attn_norm)?,
            wq: f("wq", &self.wq)?,
            wk: f("wk", &self.wk)?,
            wv: f("wv", &self.wv)?,
            wo: f("wo", &self.wo)?,
            bq: self.bq.as_ref().map(|h| f("bq", h)).transpose()?,
            bk: self.bk.as_ref().map(|h| f("bk", h)).transpose()?,
            bv: self.bv.as_ref().map(|h| f("bv", h)).transpose()?,
            mlp_norm: f("mlp_norm", &self.mlp_norm)?,
            w_gate: f("w_gate", &self.w_gate)?,
            w_up: f("w_up", &self.w_up)?,
            w_down: f("w_down", &self.w_down)?,
        })
    }

    /// Infallible [`Self::try_map`].
    pub fn map<'a, G>(&'a self, mut f: impl FnMut(&'static str, &'a H) -> G) -> BlockParams<G> {
        match self.try_map(|n, h| Ok::<G, std::convert::Infallible>(f(n, h))) {
            Ok(p) => p,
            Err(never) => match never {},
        }
    }

    /// `(name, handle)` pairs in the fixed order.
    pub fn named(&self) -> Vec<(&'static str, &H)> {
        let mut v = Vec::with_capacity(12);
        self.map(|n, h| v.push((n, h)));
        v
    }
}

impl BlockParams<Vec<usize>> {
    /// The shape of every parameter of a block of `cfg` (biases only with `attention_bias`):
    /// map it to build a block from named tensors.
    pub fn shapes(cfg: &ModelConfig) -> Self {
        let (c, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (q, kv) = (
            cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
        );
        let bias = |n: usize| cfg.attention_bias.then(|| vec![n]);
        BlockParams {
            spec: BlockSpec::from_config(cfg),
            attn_norm: vec![c],
            wq: vec![q, c],
            wk: vec![kv, c],
            wv: vec![kv, c],
            wo: vec![c, q],
            bq: bias(q),
            bk: bias(kv),
            bv: bias(kv),
            mlp_norm: vec![c],
            w_gate: vec![i, c],
            w_up: vec![i, c],
            w_down: vec![c, i],
        }
    }
}

/// A feed-forward-only block's parameters over any handle type ([`FfnWeights`]' tape and
/// checkpoint forms): a decoder block's MLP half, with the same names.
#[derive(Clone, Debug)]
pub struct FfnParams<H> {
    pub spec: BlockSpec,
    pub mlp_norm: H,
    pub w_gate: H,
    pub w_up: H,
    pub w_down: H,
}

impl<H> FfnParams<H> {
    /// `f(name, handle)` for every parameter in the fixed order (names as in [`FfnWeights`]).
    pub fn try_map<'a, G, E>(
        &'a self,
        mut f: impl FnMut(&'static str, &'a H) -> std::result::Result<G, E>,
    ) -> std::result::Result<FfnParams<G>, E> {
        Ok(FfnParams {
            spec: self.spec,
            mlp_norm: f("mlp_norm", &self.mlp_norm)?,
            w_gate: f("w_gate", &self.w_gate)?,
            w_up: f("w_up", &self.w_up)?,
            w_down: f("w_down", &self.w_down)?,
        })
    }
}

impl FfnParams<Vec<usize>> {
    /// The shape of every parameter of a feed-forward-only block of `cfg`.
    pub fn shapes(cfg: &ModelConfig) -> Self {
        BlockParams::shapes(cfg).ffn()
    }
}

impl<H: Clone> BlockParams<H> {
    /// The block's MLP half as a feed-forward-only block.
    pub fn ffn(&self) -> FfnParams<H> {
        FfnParams {
            spec: self.spec,
            mlp_norm: self.mlp_norm.clone(),
            w_gate: self.w_gate.clone(),
            w_up: self.w_up.clone(),
            w_down: self.w_down.clone(),
        }
    }
}

impl FfnWeights {
    /// Views of every weight, with the names and order of [`FfnParams`].
    pub fn views(&self, cfg: &ModelConfig) -> FfnParams<ArrayViewD<'_, f32>> {
        FfnParams {
            spec: BlockSpec::from_config(cfg),
            mlp_norm: self.mlp_norm.view().into_dyn(),
            w_gate: self.w_gate.view().into_dyn(),
            w_up: self.w_up.view().into_dyn(),
            w_down: self.w_down.view().into_dyn(),
        }
    }

    /// The inverse of [`Self::views`] from any handle holding an f32 array; errors name the
    /// tensor whose rank is wrong.
    pub fn from_params<H: AsArray>(p: &FfnParams<H>) -> Result<Self> {
        Ok(FfnWeights {
            mlp_norm: to_rank("mlp_norm", &p.mlp_norm)?,
            w_gate: to_rank("w_gate", &p.w_gate)?,
            w_up: to_rank("w_up", &p.w_up)?,
            w_down: to_rank("w_down", &p.w_down)?,
        })
    }
}

/// `h`'s array viewed as rank `D`, naming the tensor `name` when the rank differs.
pub(crate) fn view_rank<'a, H: AsArray, D: Dimension>(
    name: &str,
    h: &'a H,
) -> Result<ndarray::ArrayView<'a, f32, D>> {
    h.as_array()
        .into_dimensionality()
        .map_err(|e| ElmError::tensor(name, e.to_string()))
}

impl<H: AsArray> BlockParams<H> {
    /// The block's weights read in place from its handles (shared tape values, checkpoint
    /// tensors): what the no-tape kernels run on, without the copy of [`LayerWeights::from_block`].
    /// Errors name the tensor whose rank is wrong.
    pub fn borrowed<'a>(&'a self) -> Result<BlockRef<'a>> {
        let bias =
            |name: &str, h: &'a Option<H>| h.as_ref().map(|h| view_rank(name, h)).transpose();
        Ok(BlockRef {
            attn: Some(AttnRef {
                attn_norm: view_rank("attn_norm", &self.attn_norm)?,
                wq: LinearRef::F32(view_rank("wq", &self.wq)?),
                wk: LinearRef::F32(view_rank("wk", &self.wk)?),
                wv: LinearRef::F32(view_rank("wv", &self.wv)?),
                wo: LinearRef::F32(view_rank("wo", &self.wo)?),
                bq: bias("bq", &self.bq)?,
                bk: bias("bk", &self.bk)?,
                bv: bias("bv", &self.bv)?,
            }),
            mlp_norm: view_rank("mlp_norm", &self.mlp_norm)?,
            w_gate: LinearRef::F32(view_rank("w_gate", &self.w_gate)?),
            w_up: LinearRef::F32(view_rank("w_up", &self.w_up)?),
            w_down: LinearRef::F32(view_rank("w_down", &self.w_down)?),
            gemma: None,
        })
    }
}

impl<H: AsArray> FfnParams<H> {
    /// The feed-forward-only block read in place (see [`BlockParams::borrowed`]).
    pub fn borrowed(&self) -> Result<BlockRef<'_>> {
        Ok(BlockRef {
            attn: None,
            mlp_norm: view_rank("mlp_norm", &self.mlp_norm)?,
            w_gate: LinearRef::F32(view_rank("w_gate", &self.w_gate)?),
            w_up: LinearRef::F32(view_rank("w_up", &self.w_up)?),
            w_down: LinearRef::F32(view_rank("w_down", &self.w_down)?),
            gemma: None,
        })
    }
}

/// An owned copy of `h`'s array as rank `D`, naming the tensor `name` when the rank differs.
fn to_rank<H: AsArray, D: Dimension>(name: &str, h: &H) -> Result<ndarray::Array<f32, D>> {
    view_rank(name, h).map(|v| v.to_owned())
}

impl LayerWeights {
    /// Views of every weight, with the names and order of [`BlockParams`].
    pub fn block_views(&self, cfg: &ModelConfig) -> BlockParams<ArrayViewD<'_, f32>> {
        BlockParams {
            spec: BlockSpec::from_config(cfg),
            attn_norm: self.attn_norm.view().into_dyn(),
            wq: self.wq.view().into_dyn(),
            wk: self.wk.view().into_dyn(),
            wv: self.wv.view().into_dyn(),
            wo: self.wo.view().into_dyn(),
            bq: self.bq.as_ref().map(|b| b.view().into_dyn()),
            bk: self.bk.as_ref().map(|b| b.view().into_dyn()),
            bv: self.bv.as_ref().map(|b| b.view().into_dyn()),
            mlp_norm: self.mlp_norm.view().into_dyn(),
            w_gate: self.w_gate.view().into_dyn(),
            w_up: self.w_up.view().into_dyn(),
            w_down: self.w_down.view().into_dyn(),
        }
    }

    /// The inverse of [`Self::block_views`]: any handle that gives an f32 array (owned tensors
    /// of a checkpoint, shared tape values). Errors name the tensor whose rank is wrong.
    pub fn from_block<H: AsArray>(p: &BlockParams<H>) -> Result<Self> {
        let bias = |name: &str, h: &Option<H>| h.as_ref().map(|h| to_rank(name, h)).transpose();
        Ok(LayerWeights {
            attn_norm: to_rank("attn_norm", &p.attn_norm)?,
            wq: to_rank("wq", &p.wq)?,
            wk: to_rank("wk", &p.wk)?,
            wv: to_rank("wv", &p.wv)?,
            wo: to_rank("wo", &p.wo)?,
            bq: bias("bq", &p.bq)?,
            bk: bias("bk", &p.bk)?,
            bv: bias("bv", &p.bv)?,
            mlp_norm: to_rank("mlp_norm", &p.mlp_norm)?,
            w_gate: to_rank("w_gate", &p.w_gate)?,
            w_up: to_rank("w_up", &p.w_up)?,
            w_down: to_rank("w_down", &p.w_down)?,
            // The tape's blocks are Llama-style (a Gemma 3 model is refused before it
            // reaches the tape: `ModelConfig::require_tape`).
            gemma: None,
        })
    }
}

/// A handle that holds an f32 array.
pub trait AsArray {
    fn as_array(&self) -> ArrayViewD<'_, f32>;
}
impl AsArray for ArrayD<f32> {
    fn as_array(&self) -> ArrayViewD<'_, f32> {
        self.view()
    }
}
impl<A: AsArray + ?Sized> AsArray for &A {
    fn as_array(&self) -> ArrayViewD<'_, f32> {
        (**self).as_array()
    }
}
impl AsArray for Arc<ArrayD<f32>> {
    fn as_array(&self) -> ArrayViewD<'_, f32> {
        self.view()
    }
}

impl<T: AdFloat> BlockTensors<T> {
    /// Converts (and for `f64`, widens) one block's `f32` weights.
    pub fn from_weights(w: &LayerWeights, cfg: &ModelConfig) -> Self {
        w.block_views(cfg).map(|_, a| Arc::new(a.mapv(T::of_f32)))
    }
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
        w.map(|_, a| {
            if trainable {
                tape.param_shared(a.clone())
            } else {
                tape.constant_shared(a.clone())
            }
        })
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
    let o = attention_branch(tape, b, x, pos_offset, kv_prefix)?;
    let x = tape.add(x, o)?;
    let d = mlp_branch(tape, b, x)?;
    tape.add(x, d)
}

/// The attention branch `Attn(RMSNorm(x))` a block adds to its residual stream `x` `[B, T, C]`
/// (see [`block_forward_with_prefix`] for the positions and the KV prefix) → `[B, T, C]`.
pub fn attention_branch<T: AdFloat>(
    tape: &mut Tape<T>,
    b: &BlockVars,
    x: Var,
    pos_offset: usize,
    kv_prefix: Option<(Var, Var)>,
) -> Result<Var> {
    let (bsz, t) = dims_btc(tape, x)?;
    let sp = b.spec;
    let eps = T::of(sp.rms_norm_eps);
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
    tape.matmul_t(a, b.wo, None)
}

/// The SwiGLU MLP branch `W_down·(silu(W_gate·n) ⊙ W_up·n)`, `n = RMSNorm(x)`, that a block adds
/// to `x` `[B, T, C]` after attention → `[B, T, C]`.
pub fn mlp_branch<T: AdFloat>(tape: &mut Tape<T>, b: &BlockVars, x: Var) -> Result<Var> {
    ffn_branch(tape, &b.ffn(), x)
}

/// [`mlp_branch`] of a feed-forward-only block's parameters.
pub fn ffn_branch<T: AdFloat>(tape: &mut Tape<T>, f: &FfnParams<Var>, x: Var) -> Result<Var> {
    let h = nn::rms_norm(tape, x, f.mlp_norm, T::of(f.spec.rms_norm_eps))?;
    let g = tape.matmul_t(h, f.w_gate, None)?;
    let u = tape.matmul_t(h, f.w_up, None)?;
    let s = nn::swiglu(tape, g, u)?;
    tape.matmul_t(s, f.w_down, None)
}

/// A feed-forward-only block `x + MLP(RMSNorm(x))`, `x` `[B, T, C]` → `[B, T, C]` (position
/// independent: it has no attention).
pub fn ffn_forward<T: AdFloat>(tape: &mut Tape<T>, f: &FfnParams<Var>, x: Var) -> Result<Var> {
    let d = ffn_branch(tape, f, x)?;
    tape.add(x, d)
}

fn to_t<T: AdFloat, D: Dimension>(a: &ndarray::Array<f32, D>) -> Arc<ArrayD<T>> {
    Arc::new(a.mapv(T::of_f32).into_dyn())
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

impl ModelTensors<f32> {
    /// Every matrix registered as unchanging while the returned value lives (it keeps them
    /// alive): large products pack each once (see [`crate::gemm::FrozenWeights`]).
    pub fn frozen(&self) -> crate::gemm::FrozenWeights<'static> {
        let mut f = crate::gemm::FrozenWeights::new();
        f.share(&self.embed);
        if let Some(head) = &self.lm_head {
            f.share(head);
        }
        for l in &self.layers {
            l.map(|_, w| {
                if w.ndim() == 2 {
                    f.share(w);
                }
            });
        }
        f
    }
}

impl<T: AdFloat> ModelTensors<T> {
    /// Converts a model's `f32` weights once (reuse across steps).
    pub fn from_weights(w: &ModelWeights) -> Result<Self> {
        w.config.validate()?;
        w.config
            .require_llama_style("the tape (training, LoRA, healing, gradient metrics)")?;
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
