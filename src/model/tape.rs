//! Llama / Qwen2 / Gemma 3 decoder forward on the autograd tape (the training path).
//!
//! Weights are converted once into shared tensors ([`ModelTensors`] / [`BlockTensors`],
//! `Arc<ArrayD<T>>`), then registered on each step's fresh tape without copying, as params
//! (trainable) or constants (frozen). Gradients flow through frozen blocks into their
//! inputs without computing weight gradients for them.
//!
//! Shapes: `x: [B, T, C]`, `q: [B, T, H, D]`, `k, v: [B, T, KV, D]`, logits `[B, T, V]`.
//! RoPE uses the HF half-split layout (the layout of [`LayerWeights`]).
//!
//! A Gemma 3 block ([`GemmaParts`] present) adds, as the inference path does
//! ([`crate::model::block`]): RMSNorm of every q and k head before RoPE, its layer's RoPE base
//! and sliding window ([`BlockSpec::of_layer`]), an RMSNorm of each sublayer's output before the
//! residual add, and a GeGLU MLP; the model scales its embeddings by `√C`.

use std::ops::Range;
use std::sync::Arc;

use ndarray::{Array1, Array2, ArrayD, ArrayView1, ArrayViewD, Dimension};

use super::block_view::BlockRef;
use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};
use crate::model::{FfnWeights, LayerWeights, ModelConfig, ModelWeights};
use crate::model_data::config::{Activation, LayerAttention};
use crate::model_data::weights::{infallible, Block, BlockMapper, Ffn, GemmaParts};
use crate::nn::{self, RopeLayout};
use crate::quant::LinearRef;

/// Per-block hyper-parameters (copied from [`ModelConfig`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockSpec {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    /// `Some(w)`: each query sees only its last `w` keys (Gemma 3's local layers).
    pub window: Option<usize>,
    /// The MLP's gate nonlinearity.
    pub activation: Activation,
}

impl BlockSpec {
    /// The hyper-parameters of layer `layer` of `cfg` (its RoPE base and window may differ from
    /// the model's: Gemma 3's local layers).
    pub fn of_layer(cfg: &ModelConfig, layer: usize) -> Self {
        Self::with_attention(cfg, cfg.layer_attention(layer))
    }

    /// The hyper-parameters of a block of `cfg` that attends as `attention` says.
    pub fn with_attention(cfg: &ModelConfig, attention: LayerAttention) -> Self {
        BlockSpec {
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            rope_theta: attention.rope_theta as f64,
            rms_norm_eps: cfg.rms_norm_eps as f64,
            window: attention.window,
            activation: cfg.activation(),
        }
    }

    /// How this block attends (the inverse of [`Self::with_attention`]).
    pub fn attention(&self) -> LayerAttention {
        LayerAttention {
            window: self.window,
            // Exact: the value came from an f32.
            rope_theta: self.rope_theta as f32,
        }
    }
}

/// One block's parameters over any handle type: tape vars ([`BlockVars`]), shared tensors
/// ([`BlockTensors`]), shapes, or named arrays for checkpoints. The tensors are the block
/// description of every storage ([`Block`], with one handle type for projections and vectors,
/// names and order written once in [`Block::try_map_with`]); the spec is what the tape's forward
/// reads of the layer's hyper-parameters (its window and RoPE base included, also for a Gemma 3
/// block, whose [`GemmaParts::attention`] the constructors here keep equal to it).
#[derive(Clone, Debug)]
pub struct BlockParams<H> {
    pub spec: BlockSpec,
    pub tensors: Block<H, H>,
}

/// The tensors are read by name (`params.wq`, `params.gemma`): the spec only adds to them.
impl<H> std::ops::Deref for BlockParams<H> {
    type Target = Block<H, H>;
    fn deref(&self) -> &Block<H, H> {
        &self.tensors
    }
}

impl<H> std::ops::DerefMut for BlockParams<H> {
    fn deref_mut(&mut self) -> &mut Block<H, H> {
        &mut self.tensors
    }
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
        f: impl FnMut(&'static str, &'a H) -> std::result::Result<G, E>,
    ) -> std::result::Result<BlockParams<G>, E> {
        Ok(BlockParams {
            spec: self.spec,
            tensors: self.tensors.try_map(f)?,
        })
    }

    /// Infallible [`Self::try_map`].
    pub fn map<'a, G>(&'a self, f: impl FnMut(&'static str, &'a H) -> G) -> BlockParams<G> {
        BlockParams {
            spec: self.spec,
            tensors: self.tensors.map(f),
        }
    }
}

impl BlockParams<Vec<usize>> {
    /// The shape of every parameter of layer `layer` of `cfg` (biases only with
    /// `attention_bias`, Gemma 3's norms only on Gemma 3), with that layer's [`BlockSpec`]: map
    /// it to build a block from named tensors.
    pub fn shapes(cfg: &ModelConfig, layer: usize) -> Self {
        let (c, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (q, kv) = (
            cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
        );
        let bias = |n: usize| cfg.attention_bias.then(|| vec![n]);
        BlockParams {
            spec: BlockSpec::of_layer(cfg, layer),
            tensors: Block {
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
                gemma: cfg.has_gemma_norms().then(|| GemmaParts {
                    q_norm: vec![cfg.head_dim],
                    k_norm: vec![cfg.head_dim],
                    post_attn_norm: vec![c],
                    post_mlp_norm: vec![c],
                    attention: cfg.layer_attention(layer),
                }),
            },
        }
    }
}

/// A feed-forward-only block's parameters over any handle type ([`FfnWeights`]' tape and
/// checkpoint forms): a decoder block's MLP half ([`Ffn`]), with the same names.
#[derive(Clone, Debug)]
pub struct FfnParams<H> {
    pub spec: BlockSpec,
    pub tensors: Ffn<H, H>,
}

/// As for [`BlockParams`]: the tensors by name, the spec beside them.
impl<H> std::ops::Deref for FfnParams<H> {
    type Target = Ffn<H, H>;
    fn deref(&self) -> &Ffn<H, H> {
        &self.tensors
    }
}

impl<H> FfnParams<H> {
    /// `f(name, handle)` for every parameter in the fixed order (names as in [`FfnWeights`]).
    pub fn try_map<'a, G, E>(
        &'a self,
        f: impl FnMut(&'static str, &'a H) -> std::result::Result<G, E>,
    ) -> std::result::Result<FfnParams<G>, E> {
        Ok(FfnParams {
            spec: self.spec,
            tensors: self.tensors.try_map(f)?,
        })
    }
}

impl FfnParams<Vec<usize>> {
    /// The shape of every parameter of a feed-forward-only block of `cfg` (a Llama-style MLP:
    /// Gemma 3's post-MLP norm has no place here, see `ElmConfig::validate`).
    pub fn shapes(cfg: &ModelConfig) -> Self {
        BlockParams::shapes(cfg, 0).ffn()
    }
}

impl<H: Clone> BlockParams<H> {
    /// The block's MLP half as a feed-forward-only block.
    pub fn ffn(&self) -> FfnParams<H> {
        FfnParams {
            spec: self.spec,
            tensors: self.tensors.ffn(),
        }
    }
}

/// Every tensor of an f32 block as a rank-free view (the tape's and the checkpoints' form).
struct DynViews;

impl<'a> BlockMapper<'a, Array2<f32>, Array1<f32>> for DynViews {
    type Weight = ArrayViewD<'a, f32>;
    type Vector = ArrayViewD<'a, f32>;
    type Error = std::convert::Infallible;
    fn weight(
        &mut self,
        _: &'static str,
        w: &'a Array2<f32>,
    ) -> std::result::Result<Self::Weight, Self::Error> {
        Ok(w.view().into_dyn())
    }
    fn vector(
        &mut self,
        _: &'static str,
        v: &'a Array1<f32>,
    ) -> std::result::Result<Self::Vector, Self::Error> {
        Ok(v.view().into_dyn())
    }
}

/// Every tensor of a handle block viewed as an f32 array of its storage's rank: projections as
/// f32 matrices for the kernels, vectors as vectors. Errors name the tensor whose rank is wrong.
struct RankedViews;

/// [`RankedViews`], copied into owned arrays.
struct RankedCopies;

impl<'a, H: AsArray + 'a> BlockMapper<'a, H, H> for RankedViews {
    type Weight = LinearRef<'a>;
    type Vector = ArrayView1<'a, f32>;
    type Error = ElmError;
    fn weight(&mut self, name: &'static str, w: &'a H) -> Result<Self::Weight> {
        view_rank(name, w).map(LinearRef::F32)
    }
    fn vector(&mut self, name: &'static str, v: &'a H) -> Result<Self::Vector> {
        view_rank(name, v)
    }
}

impl<'a, H: AsArray + 'a> BlockMapper<'a, H, H> for RankedCopies {
    type Weight = Array2<f32>;
    type Vector = Array1<f32>;
    type Error = ElmError;
    fn weight(&mut self, name: &'static str, w: &'a H) -> Result<Self::Weight> {
        to_rank(name, w)
    }
    fn vector(&mut self, name: &'static str, v: &'a H) -> Result<Self::Vector> {
        to_rank(name, v)
    }
}

impl FfnWeights {
    /// Views of every weight, with the names and order of [`FfnParams`].
    pub fn views(&self, cfg: &ModelConfig) -> FfnParams<ArrayViewD<'_, f32>> {
        FfnParams {
            // Attention settings do not reach a block without attention.
            spec: BlockSpec::of_layer(cfg, 0),
            tensors: infallible(self.try_map_with(&mut DynViews)),
        }
    }

    /// The inverse of [`Self::views`] from any handle holding an f32 array; errors name the
    /// tensor whose rank is wrong.
    pub fn from_params<H: AsArray>(p: &FfnParams<H>) -> Result<Self> {
        p.tensors.try_map_with(&mut RankedCopies)
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
        let mut views = self.tensors.try_map_with(&mut RankedViews)?;
        // The spec is the tape's word on how the block attends.
        if let Some(g) = &mut views.gemma {
            g.attention = self.spec.attention();
        }
        Ok(BlockRef::of_block(views))
    }
}

impl<H: AsArray> FfnParams<H> {
    /// The feed-forward-only block read in place (see [`BlockParams::borrowed`]).
    pub fn borrowed(&self) -> Result<BlockRef<'_>> {
        Ok(BlockRef::of_ffn(
            self.tensors.try_map_with(&mut RankedViews)?,
        ))
    }
}

/// An owned copy of `h`'s array as rank `D`, naming the tensor `name` when the rank differs.
fn to_rank<H: AsArray, D: Dimension>(name: &str, h: &H) -> Result<ndarray::Array<f32, D>> {
    view_rank(name, h).map(|v| v.to_owned())
}

impl LayerWeights {
    /// Views of every weight, with the names and order of [`BlockParams`]; the spec attends as
    /// the block's own layer does (a Gemma 3 block carries its window and RoPE base).
    pub fn block_views(&self, cfg: &ModelConfig) -> BlockParams<ArrayViewD<'_, f32>> {
        let attention = match &self.gemma {
            Some(g) => g.attention,
            None => cfg.layer_attention(0),
        };
        BlockParams {
            spec: BlockSpec::with_attention(cfg, attention),
            tensors: infallible(self.try_map_with(&mut DynViews)),
        }
    }

    /// The inverse of [`Self::block_views`]: any handle that gives an f32 array (owned tensors
    /// of a checkpoint, shared tape values). Errors name the tensor whose rank is wrong.
    pub fn from_block<H: AsArray>(p: &BlockParams<H>) -> Result<Self> {
        let mut w = p.tensors.try_map_with(&mut RankedCopies)?;
        if let Some(g) = &mut w.gemma {
            g.attention = p.spec.attention();
        }
        Ok(w)
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

/// Which of a block's seven projections a linear layer is (the order of the LoRA targets,
/// [`crate::model::lora_adapter::TARGETS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockLinear {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl BlockLinear {
    /// Position in the fixed order `wq, wk, wv, wo, w_gate, w_up, w_down`.
    pub fn index(self) -> usize {
        match self {
            BlockLinear::Q => 0,
            BlockLinear::K => 1,
            BlockLinear::V => 2,
            BlockLinear::O => 3,
            BlockLinear::Gate => 4,
            BlockLinear::Up => 5,
            BlockLinear::Down => 6,
        }
    }
    /// Every projection, at its [`Self::index`].
    pub const ALL: [BlockLinear; 7] = [
        BlockLinear::Q,
        BlockLinear::K,
        BlockLinear::V,
        BlockLinear::O,
        BlockLinear::Gate,
        BlockLinear::Up,
        BlockLinear::Down,
    ];
    /// Its weight in `layer` (in any storage).
    pub fn weight<W, V>(self, layer: &Block<W, V>) -> &W {
        match self {
            BlockLinear::Q => &layer.wq,
            BlockLinear::K => &layer.wk,
            BlockLinear::V => &layer.wv,
            BlockLinear::O => &layer.wo,
            BlockLinear::Gate => &layer.w_gate,
            BlockLinear::Up => &layer.w_up,
            BlockLinear::Down => &layer.w_down,
        }
    }
    /// Its weight in `layer` (in any storage), to change.
    pub fn weight_mut<W, V>(self, layer: &mut Block<W, V>) -> &mut W {
        match self {
            BlockLinear::Q => &mut layer.wq,
            BlockLinear::K => &mut layer.wk,
            BlockLinear::V => &mut layer.wv,
            BlockLinear::O => &mut layer.wo,
            BlockLinear::Gate => &mut layer.w_gate,
            BlockLinear::Up => &mut layer.w_up,
            BlockLinear::Down => &mut layer.w_down,
        }
    }
}

/// How a block's projections are computed: plainly ([`PlainLinears`]) or with adapters
/// (`crate::model::lora_adapter`). One block forward serves both, so a new block feature
/// reaches LoRA training without a second copy.
pub trait Linears<T: AdFloat> {
    /// `x · wᵀ (+ bias)` for projection `which`.
    fn linear(
        &mut self,
        tape: &mut Tape<T>,
        which: BlockLinear,
        x: Var,
        w: Var,
        bias: Option<Var>,
    ) -> Result<Var>;
}

/// `x · wᵀ (+ bias)`, nothing added.
pub struct PlainLinears;

impl<T: AdFloat> Linears<T> for PlainLinears {
    fn linear(
        &mut self,
        tape: &mut Tape<T>,
        _: BlockLinear,
        x: Var,
        w: Var,
        bias: Option<Var>,
    ) -> Result<Var> {
        tape.matmul_t(x, w, bias)
    }
}

/// `[B, T, heads·D]` → `[B, T, heads, D]`, each head RMS-normalised by `norm` when given
/// (Gemma 3's q/k norm), then rotated at positions `pos_offset..`.
fn heads_with_rope<T: AdFloat>(
    tape: &mut Tape<T>,
    sp: &BlockSpec,
    proj: Var,
    heads: usize,
    norm: Option<Var>,
    pos_offset: usize,
) -> Result<Var> {
    let (bsz, t) = dims_btc(tape, proj)?;
    let x = tape.reshape(proj, &[bsz, t, heads, sp.head_dim])?;
    let x = match norm {
        Some(g) => nn::rms_norm(tape, x, g, T::of(sp.rms_norm_eps))?,
        None => x,
    };
    nn::rope(tape, x, sp.rope_theta, pos_offset, RopeLayout::HalfSplit)
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
    let k_norm = b.gemma.as_ref().map(|g| g.k_norm);
    let k = heads_with_rope(tape, &sp, k, sp.num_kv_heads, k_norm, pos_offset)?;
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
    block_forward_using(tape, b, x, pos_offset, None, &mut PlainLinears)
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
    block_forward_using(tape, b, x, pos_offset, kv_prefix, &mut PlainLinears)
}

/// [`block_forward_with_prefix`] with the projections computed by `linears`.
pub fn block_forward_using<T: AdFloat>(
    tape: &mut Tape<T>,
    b: &BlockVars,
    x: Var,
    pos_offset: usize,
    kv_prefix: Option<(Var, Var)>,
    linears: &mut impl Linears<T>,
) -> Result<Var> {
    let o = attention_branch_using(tape, b, x, pos_offset, kv_prefix, linears)?;
    let x = tape.add(x, o)?;
    let d = mlp_branch_using(tape, b, x, linears)?;
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
    attention_branch_using(tape, b, x, pos_offset, kv_prefix, &mut PlainLinears)
}

fn attention_branch_using<T: AdFloat>(
    tape: &mut Tape<T>,
    b: &BlockVars,
    x: Var,
    pos_offset: usize,
    kv_prefix: Option<(Var, Var)>,
    lin: &mut impl Linears<T>,
) -> Result<Var> {
    let (bsz, t) = dims_btc(tape, x)?;
    let sp = b.spec;
    let eps = T::of(sp.rms_norm_eps);
    let gemma = b.gemma.as_ref();
    let h = nn::rms_norm(tape, x, b.attn_norm, eps)?;
    let q = lin.linear(tape, BlockLinear::Q, h, b.wq, b.bq)?;
    let q = heads_with_rope(
        tape,
        &sp,
        q,
        sp.num_heads,
        gemma.map(|g| g.q_norm),
        pos_offset,
    )?;
    let k = lin.linear(tape, BlockLinear::K, h, b.wk, b.bk)?;
    let k_norm = gemma.map(|g| g.k_norm);
    let k = heads_with_rope(tape, &sp, k, sp.num_kv_heads, k_norm, pos_offset)?;
    let v = lin.linear(tape, BlockLinear::V, h, b.wv, b.bv)?;
    let v = tape.reshape(v, &[bsz, t, sp.num_kv_heads, sp.head_dim])?;
    let a = nn::attention(tape, q, k, v, kv_prefix, sp.window)?;
    let a = tape.reshape(a, &[bsz, t, sp.num_heads * sp.head_dim])?;
    let o = lin.linear(tape, BlockLinear::O, a, b.wo, None)?;
    match gemma {
        Some(g) => nn::rms_norm(tape, o, g.post_attn_norm, eps),
        None => Ok(o),
    }
}

/// The MLP branch `W_down·(act(W_gate·n) ⊙ W_up·n)`, `n = RMSNorm(x)` (then Gemma 3's post-MLP
/// norm), that a block adds to `x` `[B, T, C]` after attention → `[B, T, C]`.
pub fn mlp_branch<T: AdFloat>(tape: &mut Tape<T>, b: &BlockVars, x: Var) -> Result<Var> {
    mlp_branch_using(tape, b, x, &mut PlainLinears)
}

fn mlp_branch_using<T: AdFloat>(
    tape: &mut Tape<T>,
    b: &BlockVars,
    x: Var,
    lin: &mut impl Linears<T>,
) -> Result<Var> {
    let d = ffn_branch_using(tape, &b.ffn(), x, lin)?;
    match &b.gemma {
        Some(g) => nn::rms_norm(tape, d, g.post_mlp_norm, T::of(b.spec.rms_norm_eps)),
        None => Ok(d),
    }
}

/// The gated MLP of a feed-forward-only block's parameters (see [`mlp_branch`]).
pub fn ffn_branch<T: AdFloat>(tape: &mut Tape<T>, f: &FfnParams<Var>, x: Var) -> Result<Var> {
    ffn_branch_using(tape, f, x, &mut PlainLinears)
}

fn ffn_branch_using<T: AdFloat>(
    tape: &mut Tape<T>,
    f: &FfnParams<Var>,
    x: Var,
    lin: &mut impl Linears<T>,
) -> Result<Var> {
    let h = nn::rms_norm(tape, x, f.mlp_norm, T::of(f.spec.rms_norm_eps))?;
    let g = lin.linear(tape, BlockLinear::Gate, h, f.w_gate, None)?;
    let u = lin.linear(tape, BlockLinear::Up, h, f.w_up, None)?;
    let s = match f.spec.activation {
        Activation::SwiGlu => nn::swiglu(tape, g, u)?,
        Activation::GeGluTanh => nn::geglu(tape, g, u)?,
    };
    lin.linear(tape, BlockLinear::Down, s, f.w_down, None)
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
        let x = nn::embedding(tape, self.embed, ids, &[batch, seq])?;
        Ok(match self.config.embedding_scale() {
            // Gemma 3: `√C`, rounded to f32 as the inference path and llama.cpp use it.
            Some(s) => tape.scale(x, T::of_f32(s)),
            None => x,
        })
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

/// Forward of one block without gradients (the math of [`block_forward`], run on a throwaway
/// no-grad tape) for work such as fixed-point iterations or frozen layers: nothing outlives the
/// call but the output. `x: [B, T, C]` at positions `pos_offset..` → `[B, T, C]`.
pub fn block_forward_plain<T: AdFloat>(
    w: &BlockTensors<T>,
    x: &ArrayD<T>,
    pos_offset: usize,
) -> Result<ArrayD<T>> {
    let mut tape = Tape::new();
    tape.no_grad(|t| {
        let b = BlockVars::register(t, w, false);
        let xv = t.constant(x.clone());
        let y = block_forward(t, &b, xv, pos_offset)?;
        Ok(t.value(y).clone())
    })
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
