//! LoRA adapters on the seven linear maps of a decoder block (q, k, v, o, gate, up, down):
//! `y = x Wᵀ + b + (α/r) · B(A(dropout(x)))`, their tape forward, and the merge
//! `W ← W + (α/r) · B A` (with the scaling; the reference code's merge drops it).

use ndarray::{Array2, ArrayD, Ix2, IxDyn};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::autograd::{Tape, Var};
use crate::error::{ElmError, Result};
use crate::model::tape::{block_forward_using, BlockLinear, BlockParams, BlockVars, Linears};
use crate::model::{LayerWeights, ModelConfig, ModelWeights};
use crate::nn;
use crate::nn::lora::Dropout;
use crate::train::ParamStore;

/// The LoRA targets, in the order of [`BlockParams`]: q, k, v, o, gate, up, down.
pub const TARGETS: [&str; 7] = ["wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"];

/// Rank, scale and dropout of a LoRA (paper: r = 16, α = 16, dropout 0.05).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    #[serde(default = "d_rank")]
    pub rank: usize,
    #[serde(default = "d_alpha")]
    pub alpha: f32,
    /// Dropout probability on the LoRA input (training only).
    #[serde(default = "d_dropout")]
    pub dropout: f32,
}

fn d_rank() -> usize {
    16
}
fn d_alpha() -> f32 {
    16.0
}
fn d_dropout() -> f32 {
    0.05
}

impl Default for LoraSpec {
    fn default() -> Self {
        LoraSpec {
            rank: d_rank(),
            alpha: d_alpha(),
            dropout: d_dropout(),
        }
    }
}

impl LoraSpec {
    /// `α / r`, the factor on `B A` in the forward pass and in the merge.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }

    /// Rank ≥ 1 and no larger than the smaller side of every target of `cfg`; finite α;
    /// dropout in `[0, 1)`.
    pub fn validate(&self, cfg: &ModelConfig) -> Result<()> {
        if self.rank == 0 {
            return Err(ElmError::config("rank", "must be >= 1"));
        }
        for t in TARGETS {
            let (out, inp) = target_shape(cfg, t)?;
            if self.rank > out.min(inp) {
                return Err(ElmError::config(
                    "rank",
                    format!(
                        "LoRA rank {} exceeds the smaller side of `{t}` ([{out}, {inp}]): a low-rank update must have rank <= {}",
                        self.rank,
                        out.min(inp)
                    ),
                ));
            }
        }
        if !self.alpha.is_finite() {
            return Err(ElmError::config("alpha", "must be finite"));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ElmError::config(
                "dropout",
                format!("must be in [0, 1), got {}", self.dropout),
            ));
        }
        Ok(())
    }
}

/// `[out, in]` of target `t` in a block of `cfg`.
pub fn target_shape(cfg: &ModelConfig, t: &str) -> Result<(usize, usize)> {
    let shapes = BlockParams::shapes(cfg, 0);
    let s = shapes
        .named()
        .into_iter()
        .find(|(n, _)| *n == t)
        .map(|(_, s)| s.clone())
        .ok_or_else(|| ElmError::config("target", format!("unknown LoRA target `{t}`")))?;
    Ok((s[0], s[1]))
}

/// The projection LoRA target `t` names: the one at its place in [`TARGETS`], which lists the
/// names in [`BlockLinear::ALL`]'s order (an unknown name is an error naming it).
pub fn target_linear(t: &str) -> Result<BlockLinear> {
    TARGETS
        .iter()
        .position(|&name| name == t)
        .map(|i| BlockLinear::ALL[i])
        .ok_or_else(|| ElmError::config("target", format!("unknown LoRA target `{t}`")))
}

/// Store names of layer `layer`'s adapter on target `t`: `(A, B)`.
pub fn lora_names(prefix: &str, layer: usize, t: &str) -> (String, String) {
    (
        format!("{prefix}layers.{layer}.{t}.lora_a"),
        format!("{prefix}layers.{layer}.{t}.lora_b"),
    )
}

/// Inserts fresh adapters for `layers` into `store` (names prefixed by `prefix`): `A` from
/// PyTorch's Kaiming-uniform(a = √5) init, i.e. `U(−1/√in, 1/√in)`, seeded; `B = 0`.
pub fn insert_adapters(
    store: &mut ParamStore,
    cfg: &ModelConfig,
    spec: &LoraSpec,
    prefix: &str,
    layers: impl IntoIterator<Item = usize>,
    seed: u64,
) -> Result<()> {
    spec.validate(cfg)?;
    for l in layers {
        for (ti, t) in TARGETS.iter().enumerate() {
            let (out, inp) = target_shape(cfg, t)?;
            let mut rng = StdRng::seed_from_u64(
                seed ^ ((l as u64) << 8 | ti as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
            let bound = 1.0 / (inp as f32).sqrt();
            let a = ArrayD::from_shape_simple_fn(IxDyn(&[spec.rank, inp]), || {
                rng.gen_range(-bound..bound)
            });
            let b = ArrayD::zeros(IxDyn(&[out, spec.rank]));
            let (na, nb) = lora_names(prefix, l, t);
            store.insert(na, a, true)?;
            store.insert(nb, b, true)?;
        }
    }
    Ok(())
}

/// `(A, B)` of one target on the tape.
#[derive(Clone, Copy, Debug)]
pub struct LoraVars {
    pub a: Var,
    pub b: Var,
}

/// A block's adapters on the tape, indexed like [`TARGETS`] (`None`: no adapter).
pub type BlockLora = [Option<LoraVars>; 7];

/// A block's adapters found in a store's registered vars (`vars[i]` = var of store entry `i`,
/// `None` for entries not registered).
pub fn block_lora(
    store: &ParamStore,
    vars: &[Option<Var>],
    prefix: &str,
    layer: usize,
) -> BlockLora {
    let mut out: BlockLora = [None; 7];
    for (ti, t) in TARGETS.iter().enumerate() {
        let (na, nb) = lora_names(prefix, layer, t);
        if let (Some(ia), Some(ib)) = (store.index_of(&na), store.index_of(&nb)) {
            if let (Some(Some(a)), Some(Some(b))) = (vars.get(ia), vars.get(ib)) {
                out[ti] = Some(LoraVars { a: *a, b: *b });
            }
        }
    }
    out
}

/// How the LoRA path runs on one forward: scale `α/r`, and dropout masks drawn from `rng`
/// (`None` or `p = 0`: no dropout, evaluation).
pub struct LoraRun<'r> {
    pub scale: f32,
    pub dropout: f32,
    pub rng: Option<&'r mut StdRng>,
}

/// A block's adapters applied by one [`LoraRun`]: the [`Linears`] of an adapted block.
struct LoraLinears<'a, 'r> {
    lora: &'a BlockLora,
    run: &'a mut LoraRun<'r>,
}

impl Linears<f32> for LoraLinears<'_, '_> {
    fn linear(
        &mut self,
        tape: &mut Tape<f32>,
        which: BlockLinear,
        x: Var,
        w: Var,
        bias: Option<Var>,
    ) -> Result<Var> {
        let Some(lv) = self.lora[which.index()] else {
            return tape.matmul_t(x, w, bias);
        };
        let dropout = match self.run.rng.as_deref_mut() {
            Some(rng) if self.run.dropout > 0.0 => {
                Some(Dropout::draw(rng, tape.value(x).len(), self.run.dropout))
            }
            _ => None,
        };
        nn::lora::lora_linear(tape, x, w, bias, lv.a, lv.b, self.run.scale, dropout)
    }
}

/// One decoder block with adapters (the math of [`crate::model::tape::block_forward`], which
/// it is when every adapter is `None` or `B = 0`): `x: [B, T, C]` at positions `0..T`.
pub fn lora_block_forward(
    tape: &mut Tape<f32>,
    b: &BlockVars,
    lora: &BlockLora,
    x: Var,
    run: &mut LoraRun<'_>,
) -> Result<Var> {
    block_forward_using(tape, b, x, 0, None, &mut LoraLinears { lora, run })
}

fn as2(store: &ParamStore, name: &str) -> Result<Array2<f32>> {
    store
        .get(name)
        .ok_or_else(|| ElmError::tensor(name, "missing LoRA tensor"))?
        .clone()
        .into_dimensionality::<Ix2>()
        .map_err(|e| ElmError::tensor(name, e.to_string()))
}

/// Layer `layer` with its adapters (names with `prefix`) merged: `W + (α/r)·B A` for every
/// target that has one.
pub fn merge_layer(
    w: &LayerWeights,
    store: &ParamStore,
    spec: &LoraSpec,
    prefix: &str,
    layer: usize,
) -> Result<LayerWeights> {
    let mut out = w.clone();
    let scale = spec.scale();
    for t in TARGETS {
        let (na, nb) = lora_names(prefix, layer, t);
        if store.index_of(&na).is_none() {
            continue;
        }
        let (a, b) = (as2(store, &na)?, as2(store, &nb)?);
        let delta = b.dot(&a) * scale;
        let target = target_linear(t)?.weight_mut(&mut out);
        if target.dim() != delta.dim() {
            return Err(ElmError::tensor(
                &na,
                format!("B·A is {:?} but `{t}` is {:?}", delta.dim(), target.dim()),
            ));
        }
        *target += &delta;
    }
    Ok(out)
}

/// The model with every adapter in `store` merged into its layer (`W + (α/r)·B A`).
pub fn merge_model(
    dense: &ModelWeights,
    store: &ParamStore,
    spec: &LoraSpec,
    prefix: &str,
) -> Result<ModelWeights> {
    let mut out = dense.clone();
    for (l, layer) in out.layers.iter_mut().enumerate() {
        *layer = merge_layer(&dense.layers[l], store, spec, prefix, l)?;
    }
    Ok(out)
}
