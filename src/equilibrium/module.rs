//! The fixed-point module's parameters ([`ElmParams`] handles, [`ElmModule`] arrays) and its
//! checkpoint format. The map itself is in [`super::map`].
//!
//! `P = [W_z | W_h]` maps `2C → C`; `block` is one pre-norm decoder block (attention +
//! SwiGLU), or its MLP half alone ([`BlockKind::Ffn`]). Initialisation makes the first
//! iteration from `z⁰ = 0` reproduce layer `l` exactly: `block` = layer `l` (its MLP half for
//! an FFN block), `W_h = I`, `b = 0`, and `W_z` small and random.

use std::path::{Path, PathBuf};

use ndarray::{Array1, Array2, ArrayViewD, Ix1, Ix2};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::autograd::Var;
use crate::error::{ElmError, Result};
use crate::grad::{check_param_count, ParamSet};
use crate::model::block_view::{BlockRef, BlockWeights};
use crate::model::tape::{AsArray, BlockParams, FfnParams};
use crate::model::{FfnWeights, LayerWeights, ModelConfig, ModelWeights};

use super::checkpoint::{expect_empty, load_tensors, save_tensors, take_tensor, TensorMap};
use super::config::{BlockKind, ElmConfig};
use crate::io::{read_json, write_json_atomic};

/// The input injection `u = z·W_zᵀ + h·W_hᵀ + b` over any handle type.
#[derive(Clone, Debug)]
pub struct Projection<H> {
    /// `[C, C]` state half of `P = [W_z | W_h]`.
    pub w_z: H,
    /// `[C, C]` injection half of `P`.
    pub w_h: H,
    /// `[C]`
    pub bias: H,
}

/// The module's weight-tied block in any representation: `D` a decoder block's, `F` a
/// feed-forward-only block's (parameter handles, f32 weights, quantized weights).
#[derive(Clone, Debug)]
pub enum ModuleBlock<D, F> {
    Decoder(D),
    Ffn(F),
}

impl<D, F> ModuleBlock<D, F> {
    /// Which kind of block this is.
    pub fn kind(&self) -> BlockKind {
        match self {
            ModuleBlock::Decoder(_) => BlockKind::Decoder,
            ModuleBlock::Ffn(_) => BlockKind::Ffn,
        }
    }
    /// The decoder block, if it is one.
    pub fn decoder(&self) -> Option<&D> {
        match self {
            ModuleBlock::Decoder(d) => Some(d),
            ModuleBlock::Ffn(_) => None,
        }
    }
    /// The feed-forward-only block, if it is one.
    pub fn ffn(&self) -> Option<&F> {
        match self {
            ModuleBlock::Decoder(_) => None,
            ModuleBlock::Ffn(f) => Some(f),
        }
    }
}

impl<D: BlockWeights, F: BlockWeights> BlockWeights for ModuleBlock<D, F> {
    fn block_ref(&self) -> BlockRef<'_> {
        match self {
            ModuleBlock::Decoder(d) => d.block_ref(),
            ModuleBlock::Ffn(f) => f.block_ref(),
        }
    }
}

/// The module's block parameters over a handle type.
pub type BlockParamsOf<H> = ModuleBlock<BlockParams<H>, FfnParams<H>>;

/// The module's parameters over any handle type: tape vars while training, shared tensors,
/// named arrays in a checkpoint. Names (= checkpoint keys) and order are written once, in
/// [`ElmParams::try_map`] (the block's part in [`BlockParams::try_map`]).
#[derive(Clone, Debug)]
pub struct ElmParams<H> {
    /// `P` and `b`; `None` for a module without injection (`u = z`).
    pub projection: Option<Projection<H>>,
    /// The weight-tied block `f*`.
    pub block: BlockParamsOf<H>,
}

impl<H> ElmParams<H> {
    /// `f(name, handle)` for every parameter in the fixed order: `p.w_z`, `p.w_h`, `p.bias`
    /// (with injection), then `block.<name>` in the block's order.
    pub fn try_map<'a, G, E>(
        &'a self,
        mut f: impl FnMut(&str, &'a H) -> std::result::Result<G, E>,
    ) -> std::result::Result<ElmParams<G>, E> {
        let projection = match &self.projection {
            Some(p) => Some(Projection {
                w_z: f("p.w_z", &p.w_z)?,
                w_h: f("p.w_h", &p.w_h)?,
                bias: f("p.bias", &p.bias)?,
            }),
            None => None,
        };
        let mut named = |n: &str, h| f(&format!("block.{n}"), h);
        let block = match &self.block {
            ModuleBlock::Decoder(b) => ModuleBlock::Decoder(b.try_map(&mut named)?),
            ModuleBlock::Ffn(b) => ModuleBlock::Ffn(b.try_map(&mut named)?),
        };
        Ok(ElmParams { projection, block })
    }

    /// Infallible [`Self::try_map`].
    pub fn map<'a, G>(&'a self, mut f: impl FnMut(&str, &'a H) -> G) -> ElmParams<G> {
        match self.try_map(|n, h| Ok::<G, std::convert::Infallible>(f(n, h))) {
            Ok(p) => p,
            Err(never) => match never {},
        }
    }

    /// `(name, handle)` pairs in the fixed order.
    pub fn named(&self) -> Vec<(String, &H)> {
        let mut v = Vec::with_capacity(16);
        self.map(|n, h| v.push((n.to_string(), h)));
        v
    }
}

impl ElmParams<Vec<usize>> {
    /// The shape of every parameter of the module `elm` lays out for model `cfg`: `P` and `b`
    /// with injection, and a block of `elm.block`'s kind that attends as the layer it was cut
    /// from (`elm.start_layer`) does.
    pub fn shapes(cfg: &ModelConfig, elm: &ElmConfig) -> Self {
        let c = cfg.hidden_size;
        ElmParams {
            projection: elm.injection.then(|| Projection {
                w_z: vec![c, c],
                w_h: vec![c, c],
                bias: vec![c],
            }),
            block: match elm.block {
                BlockKind::Decoder => {
                    ModuleBlock::Decoder(BlockParams::shapes(cfg, elm.start_layer))
                }
                BlockKind::Ffn => ModuleBlock::Ffn(FfnParams::shapes(cfg)),
            },
        }
    }
}

/// The tape handles of the module are the [`ParamSet`] the gradient rules move between tapes.
impl ParamSet for ElmParams<Var> {
    fn vars(&self) -> Vec<Var> {
        self.named().into_iter().map(|(_, &v)| v).collect()
    }
    fn with_vars(&self, vars: &[Var]) -> Result<Self> {
        check_param_count(vars.len(), self.vars().len())?;
        let mut it = vars.iter().copied();
        Ok(self.map(|_, &own| it.next().unwrap_or(own)))
    }
}

impl ModuleBlock<LayerWeights, FfnWeights> {
    /// A block of kind `kind` from decoder layer `layer` (its MLP half for an FFN block).
    pub fn of_layer(layer: &LayerWeights, kind: BlockKind) -> Self {
        match kind {
            BlockKind::Decoder => ModuleBlock::Decoder(layer.clone()),
            BlockKind::Ffn => ModuleBlock::Ffn(FfnWeights::from_layer(layer)),
        }
    }
}

/// `P` and `b` as f32 arrays.
#[derive(Clone, Debug, PartialEq)]
pub struct ProjectionWeights {
    /// `[C, C]`
    pub w_z: Array2<f32>,
    /// `[C, C]`
    pub w_h: Array2<f32>,
    /// `[C]`
    pub bias: Array1<f32>,
}

/// Parameters of the fixed-point module as f32 arrays (what inference runs on).
#[derive(Clone, Debug)]
pub struct ElmModule {
    /// The weight-tied block `f*`.
    pub block: ModuleBlock<LayerWeights, FfnWeights>,
    /// The input injection; `None`: `u = z`, iterated from `z⁰ = h` (no-injection ablation,
    /// looped layer, LLM-Streamline's replacement layer).
    pub projection: Option<ProjectionWeights>,
}

impl ElmModule {
    /// Paper initialisation from layer `cfg.start_layer` of `dense`.
    ///
    /// `W_z = wz_scale × U(−1/√(2C), 1/√(2C))` — PyTorch's default `nn.Linear(2C, C)` init —
    /// seeded by `cfg.init_seed`; `W_h = I`, `b = 0`. Without injection only the block is copied
    /// (for an FFN block, the layer's MLP half).
    pub fn init(dense: &ModelWeights, cfg: &ElmConfig) -> Result<Self> {
        cfg.validate(&dense.config)?;
        let c = dense.config.hidden_size;
        let bound = 1.0 / ((2 * c) as f32).sqrt();
        let mut rng = StdRng::seed_from_u64(cfg.init_seed);
        let projection = cfg.injection.then(|| ProjectionWeights {
            w_z: Array2::from_shape_simple_fn((c, c), || {
                cfg.wz_scale * rng.gen_range(-bound..bound)
            }),
            w_h: Array2::eye(c),
            bias: Array1::zeros(c),
        });
        let layer = &dense.layers[cfg.start_layer];
        Ok(ElmModule {
            block: ModuleBlock::of_layer(layer, cfg.block),
            projection,
        })
    }

    /// The projection, which a module with injection has.
    pub fn projection(&self) -> Result<&ProjectionWeights> {
        self.projection
            .as_ref()
            .ok_or_else(|| ElmError::InvalidArgument("the module has no input injection".into()))
    }

    /// Number of scalar parameters (block + P + b).
    pub fn num_params(&self) -> usize {
        let p = self
            .projection
            .as_ref()
            .map_or(0, |p| p.w_z.len() + p.w_h.len() + p.bias.len());
        let block = match &self.block {
            ModuleBlock::Decoder(b) => b.num_params(),
            ModuleBlock::Ffn(b) => b.num_params(),
        };
        block + p
    }

    /// Views of every parameter, with the names and order of [`ElmParams`].
    pub fn params(&self, cfg: &ModelConfig) -> ElmParams<ArrayViewD<'_, f32>> {
        ElmParams {
            projection: self.projection.as_ref().map(|p| Projection {
                w_z: p.w_z.view().into_dyn(),
                w_h: p.w_h.view().into_dyn(),
                bias: p.bias.view().into_dyn(),
            }),
            block: match &self.block {
                ModuleBlock::Decoder(b) => ModuleBlock::Decoder(b.block_views(cfg)),
                ModuleBlock::Ffn(b) => ModuleBlock::Ffn(b.views(cfg)),
            },
        }
    }

    /// The inverse of [`Self::params`] from any handles holding f32 arrays (checkpoint
    /// tensors, tape values). Ranks are checked here, shapes by the caller.
    pub fn from_params<H: AsArray>(p: &ElmParams<H>) -> Result<Self> {
        let two = |name: &str, h: &H| {
            h.as_array()
                .to_owned()
                .into_dimensionality::<Ix2>()
                .map_err(|e| ElmError::tensor(name, e.to_string()))
        };
        let projection = match &p.projection {
            Some(pr) => Some(ProjectionWeights {
                w_z: two("p.w_z", &pr.w_z)?,
                w_h: two("p.w_h", &pr.w_h)?,
                bias: pr
                    .bias
                    .as_array()
                    .to_owned()
                    .into_dimensionality::<Ix1>()
                    .map_err(|e| ElmError::tensor("p.bias", e.to_string()))?,
            }),
            None => None,
        };
        let block = match &p.block {
            ModuleBlock::Decoder(b) => ModuleBlock::Decoder(LayerWeights::from_block(b)?),
            ModuleBlock::Ffn(b) => ModuleBlock::Ffn(FfnWeights::from_params(b)?),
        };
        Ok(ElmModule { block, projection })
    }

    /// Named tensors (checkpoint keys of [`ElmParams`]).
    pub fn to_tensors(&self, cfg: &ModelConfig) -> TensorMap {
        self.params(cfg)
            .named()
            .into_iter()
            .map(|(n, a)| (n, a.to_owned()))
            .collect()
    }

    /// Inverse of [`Self::to_tensors`]; strict names and shapes checked against `cfg` and the
    /// module layout of `elm` (`P` and `b` with injection, the block's kind).
    pub fn from_tensors(
        mut m: TensorMap,
        cfg: &ModelConfig,
        elm: &ElmConfig,
        file: &Path,
    ) -> Result<Self> {
        let p = ElmParams::shapes(cfg, elm)
            .try_map(|name, shape| take_tensor(&mut m, name, shape, file))?;
        expect_empty(&m, file)?;
        Self::from_params(&p)
    }
}

/// `elm.json` of a module checkpoint directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleMeta {
    /// Always [`MODULE_FORMAT`].
    pub format: String,
    pub elm: ElmConfig,
    /// Config of the dense model the module was cut from (checked on load).
    pub model_config: ModelConfig,
    /// Path of the dense model, as given at compression time.
    pub base_model: String,
    /// The LoRA heal of the layers after the window trained with the module (see
    /// `TrainConfig::heal`): its adapters are in [`HEAL_FILE`], merged into those layers on load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heal: Option<crate::model::lora_adapter::LoraSpec>,
}

/// Format tag written into `elm.json`.
pub const MODULE_FORMAT: &str = "elm-module-v1";
/// File names inside a checkpoint directory.
pub const META_FILE: &str = "elm.json";
pub const MODULE_FILE: &str = "module.safetensors";
/// The heal's adapters (names `heal.layers.{l}.{target}.lora_{a,b}`) when `elm.json` has `heal`.
pub const HEAL_FILE: &str = "heal.safetensors";
/// Name prefix of the heal's adapters in the training store and in [`HEAL_FILE`].
pub const HEAL_PREFIX: &str = "heal.";

/// Writes `dir/module.safetensors` then `dir/elm.json` (each atomically).
pub fn save_module(dir: &Path, module: &ElmModule, meta: &ModuleMeta) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ElmError::io(dir, e))?;
    save_tensors(
        &dir.join(MODULE_FILE),
        &module.to_tensors(&meta.model_config),
        None,
    )?;
    write_json_atomic(&dir.join(META_FILE), meta)
}

/// Reads a checkpoint directory written by [`save_module`] (or a training output dir).
pub fn load_module(dir: &Path) -> Result<(ElmModule, ModuleMeta)> {
    let meta = read_module_meta(dir)?;
    refuse_relaxed(dir, &meta)?;
    load_module_tensors(dir, meta)
}

/// Reads a checkpoint directory for the dense model `model` (config `expected`): a checkpoint
/// cut from another model, or an `elm.json` whose `model_config` was edited, is refused naming
/// `elm.json` and the first differing field, before any tensor is read.
pub fn load_module_for(
    dir: &Path,
    expected: &ModelConfig,
    model: &Path,
) -> Result<(ElmModule, ModuleMeta)> {
    let meta = read_module_meta_for(dir, expected, model)?;
    refuse_relaxed(dir, &meta)?;
    load_module_tensors(dir, meta)
}

/// A relaxed recursive checkpoint (see [`super::relaxed`]) for the dense model `model`: its
/// shared block, `elm.json` and its loops' adapters, checked as [`load_module_for`] checks.
pub fn load_relaxed_for(
    dir: &Path,
    expected: &ModelConfig,
    model: &Path,
) -> Result<(ElmModule, ModuleMeta, TensorMap)> {
    let meta = read_module_meta_for(dir, expected, model)?;
    if !meta.elm.is_relaxed() {
        return Err(ElmError::config(
            "elm.relaxed",
            "absent: this checkpoint is not a relaxed recursive module",
        )
        .in_file(dir.join(META_FILE)));
    }
    let loops = super::relaxed::load_loops(dir, &meta.model_config, &meta.elm)?;
    let (module, meta) = load_module_tensors(dir, meta)?;
    Ok((module, meta, loops))
}

/// A relaxed recursive module is refused where only its shared block would be read: run
/// alone, the block is not the model (its loops' adapters are in their own file).
fn refuse_relaxed(dir: &Path, meta: &ModuleMeta) -> Result<()> {
    if meta.elm.is_relaxed() {
        return Err(ElmError::Unsupported(format!(
            "{}: a relaxed recursive module (shared block + per-loop adapters) runs as the dense \
             model its loops merge into: evaluate or generate with it (`--elm`), or continue its \
             training with `--resume`; solver, spectral, quantization and export commands need a \
             fixed-point module",
            dir.display()
        )));
    }
    Ok(())
}

/// `dir/elm.json` checked against the dense model `model` (config `expected`).
fn read_module_meta_for(dir: &Path, expected: &ModelConfig, model: &Path) -> Result<ModuleMeta> {
    let meta = read_module_meta(dir)?;
    if &meta.model_config != expected {
        let field = first_difference(&meta.model_config, expected);
        let (ours, theirs) = field.as_ref().map_or((String::new(), String::new()), |f| {
            (field_value(&meta.model_config, f), field_value(expected, f))
        });
        let field = field.unwrap_or_else(|| "model_config".into());
        return Err(ElmError::config(
            format!("model_config.{field}"),
            format!(
                "{ours} in the checkpoint, {theirs} in {}: module was built for a different \
                 model (or elm.json was edited)",
                model.display()
            ),
        )
        .in_file(dir.join(META_FILE)));
    }
    Ok(meta)
}

fn config_json(c: &ModelConfig) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(c) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => Default::default(),
    }
}

/// The first field (in declaration order) where two model configs differ.
fn first_difference(a: &ModelConfig, b: &ModelConfig) -> Option<String> {
    let (a, b) = (config_json(a), config_json(b));
    a.iter()
        .find(|(k, v)| b.get(k.as_str()) != Some(v))
        .map(|(k, _)| k.clone())
}

fn field_value(c: &ModelConfig, field: &str) -> String {
    config_json(c)
        .get(field)
        .map_or_else(|| "?".into(), |v| v.to_string())
}

/// `dir/elm.json`, checked: format, the model config and the layer range (errors name the file).
pub fn read_module_meta(dir: &Path) -> Result<ModuleMeta> {
    let meta_path: PathBuf = dir.join(META_FILE);
    let meta: ModuleMeta = read_json(&meta_path)?;
    if meta.format != MODULE_FORMAT {
        return Err(ElmError::format(
            &meta_path,
            format!("format `{}`, expected `{MODULE_FORMAT}`", meta.format),
        ));
    }
    meta.model_config
        .validate()
        .and_then(|()| meta.elm.validate(&meta.model_config))
        .map_err(|e| e.in_file(&meta_path))?;
    Ok(meta)
}

/// Merges the heal of checkpoint `dir` (when its `elm.json` names one) into the layers after
/// the window of `dense`, the model the module was cut from: `W + (α/r)·B A` per adapter.
/// Every adapter of every healed layer must be in [`HEAL_FILE`] with its shape, and nothing
/// else; anything else is refused naming the file and the tensor.
pub fn merge_heal(dense: &mut ModelWeights, dir: &Path, meta: &ModuleMeta) -> Result<()> {
    use crate::model::lora_adapter::{lora_names, merge_layer, target_shape, TARGETS};
    let Some(spec) = &meta.heal else {
        return Ok(());
    };
    let file = dir.join(HEAL_FILE);
    let cfg = dense.config.clone();
    spec.validate(&cfg)
        .map_err(|e| e.in_file(dir.join(META_FILE)))?;
    let mut map = load_tensors(&file)?;
    let mut store = crate::train::ParamStore::new();
    for l in meta.elm.end_layer()..cfg.num_layers {
        for t in TARGETS {
            let (out, inp) = target_shape(&cfg, t)?;
            let (na, nb) = lora_names(HEAL_PREFIX, l, t);
            for (name, shape) in [(na, [spec.rank, inp]), (nb, [out, spec.rank])] {
                let v = take_tensor(&mut map, &name, &shape, &file)?;
                if v.iter().any(|x| !x.is_finite()) {
                    return Err(ElmError::format(
                        &file,
                        format!("{name}: non-finite values"),
                    ));
                }
                store.insert(name, v, false)?;
            }
        }
    }
    expect_empty(&map, &file)?;
    for l in meta.elm.end_layer()..cfg.num_layers {
        dense.layers[l] = merge_layer(&dense.layers[l], &store, spec, HEAL_PREFIX, l)?;
    }
    Ok(())
}

fn load_module_tensors(dir: &Path, meta: ModuleMeta) -> Result<(ElmModule, ModuleMeta)> {
    let file = dir.join(MODULE_FILE);
    let module =
        ElmModule::from_tensors(load_tensors(&file)?, &meta.model_config, &meta.elm, &file)?;
    Ok((module, meta))
}
