//! The fixed-point module `f(z, h) = block(P·[z; h] + b)` and its checkpoint format.
//!
//! `P = [W_z | W_h]` maps `2C → C`; `block` is one pre-norm decoder block (attention +
//! SwiGLU). Initialisation makes the first iteration from `z⁰ = 0` reproduce layer `l`
//! exactly: `block` = layer `l`, `W_h = I`, `b = 0`, and `W_z` small and random.

use std::path::{Path, PathBuf};

use ndarray::{Array1, Array2, ArrayView2, Ix1, Ix2};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};
use crate::model::{LayerWeights, ModelConfig, ModelWeights};

use super::checkpoint::{
    expect_empty, load_tensors, save_tensors, take_tensor, write_json_atomic, TensorMap,
};
use super::config::{read_json, ElmConfig};

/// Trainable parameters of the fixed-point module.
#[derive(Clone, Debug)]
pub struct ElmModule {
    /// The weight-tied decoder block `f*`.
    pub block: LayerWeights,
    /// `[C, C]` state half of `P`.
    pub w_z: Array2<f32>,
    /// `[C, C]` injection half of `P`.
    pub w_h: Array2<f32>,
    /// `[C]`
    pub bias: Array1<f32>,
}

impl ElmModule {
    /// Paper initialisation from layer `cfg.start_layer` of `dense`.
    ///
    /// `W_z = wz_scale × U(−1/√(2C), 1/√(2C))` — PyTorch's default `nn.Linear(2C, C)` init —
    /// seeded by `cfg.init_seed`.
    pub fn init(dense: &ModelWeights, cfg: &ElmConfig) -> Result<Self> {
        cfg.validate(&dense.config)?;
        let c = dense.config.hidden_size;
        let bound = 1.0 / ((2 * c) as f32).sqrt();
        let mut rng = StdRng::seed_from_u64(cfg.init_seed);
        let w_z =
            Array2::from_shape_simple_fn((c, c), || cfg.wz_scale * rng.gen_range(-bound..bound));
        Ok(ElmModule {
            block: dense.layers[cfg.start_layer].clone(),
            w_z,
            w_h: Array2::eye(c),
            bias: Array1::zeros(c),
        })
    }

    /// Block input `u = z·W_zᵀ + h·W_hᵀ + b`. z, h: `[R, C]` → `[R, C]`.
    pub fn inject(&self, z: ArrayView2<f32>, h: ArrayView2<f32>) -> Array2<f32> {
        let mut u = h.dot(&self.w_h.t());
        ndarray::linalg::general_mat_mul(1.0, &z, &self.w_z.t(), 1.0, &mut u);
        u += &self.bias;
        u
    }

    /// Number of scalar parameters (block + P + b).
    pub fn num_params(&self) -> usize {
        self.block.num_params() + self.w_z.len() + self.w_h.len() + self.bias.len()
    }

    /// Named tensors: `block.<name>` (see [`layer_to_tensors`]), `p.w_z`, `p.w_h`, `p.bias`.
    pub fn to_tensors(&self) -> TensorMap {
        let mut m = layer_to_tensors(&self.block, "block.");
        m.insert("p.w_z".into(), self.w_z.clone().into_dyn());
        m.insert("p.w_h".into(), self.w_h.clone().into_dyn());
        m.insert("p.bias".into(), self.bias.clone().into_dyn());
        m
    }

    /// Inverse of [`Self::to_tensors`]; strict names and shapes checked against `cfg`.
    pub fn from_tensors(mut m: TensorMap, cfg: &ModelConfig, file: &Path) -> Result<Self> {
        let c = cfg.hidden_size;
        let block = layer_from_tensors(&mut m, "block.", cfg, file)?;
        let w_z = take2(&mut m, "p.w_z", (c, c), file)?;
        let w_h = take2(&mut m, "p.w_h", (c, c), file)?;
        let bias = take1(&mut m, "p.bias", c, file)?;
        expect_empty(&m, file)?;
        Ok(ElmModule {
            block,
            w_z,
            w_h,
            bias,
        })
    }
}

fn take2(m: &mut TensorMap, name: &str, s: (usize, usize), file: &Path) -> Result<Array2<f32>> {
    take_tensor(m, name, &[s.0, s.1], file)?
        .into_dimensionality::<Ix2>()
        .map_err(|e| ElmError::tensor(name, e.to_string()))
}

fn take1(m: &mut TensorMap, name: &str, n: usize, file: &Path) -> Result<Array1<f32>> {
    take_tensor(m, name, &[n], file)?
        .into_dimensionality::<Ix1>()
        .map_err(|e| ElmError::tensor(name, e.to_string()))
}

/// A decoder block as named tensors `<prefix>{attn_norm,wq,wk,wv,wo,bq,bk,bv,mlp_norm,w_gate,w_up,w_down}`.
pub fn layer_to_tensors(l: &LayerWeights, prefix: &str) -> TensorMap {
    let mut m = TensorMap::new();
    let mut put = |n: &str, a: ndarray::ArrayD<f32>| {
        m.insert(format!("{prefix}{n}"), a);
    };
    put("attn_norm", l.attn_norm.clone().into_dyn());
    put("wq", l.wq.clone().into_dyn());
    put("wk", l.wk.clone().into_dyn());
    put("wv", l.wv.clone().into_dyn());
    put("wo", l.wo.clone().into_dyn());
    if let Some(b) = &l.bq {
        put("bq", b.clone().into_dyn());
    }
    if let Some(b) = &l.bk {
        put("bk", b.clone().into_dyn());
    }
    if let Some(b) = &l.bv {
        put("bv", b.clone().into_dyn());
    }
    put("mlp_norm", l.mlp_norm.clone().into_dyn());
    put("w_gate", l.w_gate.clone().into_dyn());
    put("w_up", l.w_up.clone().into_dyn());
    put("w_down", l.w_down.clone().into_dyn());
    m
}

/// Inverse of [`layer_to_tensors`] with shapes from `cfg`.
pub fn layer_from_tensors(
    m: &mut TensorMap,
    prefix: &str,
    cfg: &ModelConfig,
    file: &Path,
) -> Result<LayerWeights> {
    let (c, i) = (cfg.hidden_size, cfg.intermediate_size);
    let (q, kv) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let n = |s: &str| format!("{prefix}{s}");
    let bias = |m: &mut TensorMap, s: &str, len: usize| -> Result<Option<Array1<f32>>> {
        if cfg.attention_bias {
            take1(m, &n(s), len, file).map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(LayerWeights {
        attn_norm: take1(m, &n("attn_norm"), c, file)?,
        wq: take2(m, &n("wq"), (q, c), file)?,
        wk: take2(m, &n("wk"), (kv, c), file)?,
        wv: take2(m, &n("wv"), (kv, c), file)?,
        wo: take2(m, &n("wo"), (c, q), file)?,
        bq: bias(m, "bq", q)?,
        bk: bias(m, "bk", kv)?,
        bv: bias(m, "bv", kv)?,
        mlp_norm: take1(m, &n("mlp_norm"), c, file)?,
        w_gate: take2(m, &n("w_gate"), (i, c), file)?,
        w_up: take2(m, &n("w_up"), (i, c), file)?,
        w_down: take2(m, &n("w_down"), (c, i), file)?,
    })
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
}

/// Format tag written into `elm.json`.
pub const MODULE_FORMAT: &str = "elm-module-v1";
/// File names inside a checkpoint directory.
pub const META_FILE: &str = "elm.json";
pub const MODULE_FILE: &str = "module.safetensors";

/// Writes `dir/module.safetensors` then `dir/elm.json` (each atomically).
pub fn save_module(dir: &Path, module: &ElmModule, meta: &ModuleMeta) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ElmError::io(dir, e))?;
    save_tensors(&dir.join(MODULE_FILE), &module.to_tensors(), None)?;
    write_json_atomic(&dir.join(META_FILE), meta)
}

/// Reads a checkpoint directory written by [`save_module`] (or a training output dir).
pub fn load_module(dir: &Path) -> Result<(ElmModule, ModuleMeta)> {
    let meta_path: PathBuf = dir.join(META_FILE);
    let meta: ModuleMeta = read_json(&meta_path)?;
    if meta.format != MODULE_FORMAT {
        return Err(ElmError::format(
            &meta_path,
            format!("format `{}`, expected `{MODULE_FORMAT}`", meta.format),
        ));
    }
    meta.elm.validate(&meta.model_config)?;
    let file = dir.join(MODULE_FILE);
    let module = ElmModule::from_tensors(load_tensors(&file)?, &meta.model_config, &file)?;
    Ok((module, meta))
}
