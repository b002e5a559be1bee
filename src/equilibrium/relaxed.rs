//! Relaxed Recursive Transformers (Bae et al., ICLR 2025) in the ELM's window form: the `M`
//! replaced layers become one shared block looped `M` times, loop `k` adding its own LoRA to
//! each of the block's seven linear maps (`W + B_k A_k`, unscaled: the paper's α = r).
//!
//! Initialisation follows the paper's "relaxed" conversion: each loop's adapter is the rank-`r`
//! truncated SVD of the difference between the layer it stands for and the shared block,
//! `W_{l+k} − W_shared ≈ (U_r Σ_r)(V_rᵀ)`, so `B_k = U_r Σ_r` and `A_k = V_rᵀ`. At full rank the
//! looped stack is exactly the window it replaces; at small rank it is the closest rank-`r`
//! correction to the shared block.
//!
//! The adapters live beside the module, in [`LOOPS_FILE`] (names `loops.layers.{k}.{t}.lora_{a,b}`
//! as [`crate::model::lora_adapter::lora_names`] spells them), the shared block in the module's
//! own file. Since loop `k` is a fixed layer of its own, the module runs at inference as the
//! dense model whose window holds the `M` merged layers ([`merged_model`]): exact, with the
//! dense model's KV cache (one cache per loop), and no solver.

use std::path::Path;

use ndarray::{s, Array2};
use ndarray_linalg::{JobSvd, SVDDC};

use crate::error::{ElmError, Result};
use crate::model::lora_adapter::{
    lora_names, merge_layer, target_linear, target_shape, LoraSpec, TARGETS,
};
use crate::model::{LayerWeights, ModelConfig, ModelWeights};
use crate::train::ParamStore;

use super::checkpoint::{expect_empty, load_tensors, save_tensors, take_tensor, TensorMap};
use super::config::{ElmConfig, RelaxedLoops};

/// The adapters' file in a module checkpoint directory.
pub const LOOPS_FILE: &str = "loops.safetensors";
/// Name prefix of the loop adapters (in the training store and in [`LOOPS_FILE`]).
pub const LOOPS_PREFIX: &str = "loops.";

/// The LoRA of every loop: rank `r`, α = r (so `B A` enters unscaled), no dropout.
pub fn loop_spec(relaxed: &RelaxedLoops) -> LoraSpec {
    LoraSpec {
        rank: relaxed.rank,
        alpha: relaxed.rank as f32,
        dropout: 0.0,
    }
}

/// The relaxed settings of `elm`, an error when it has none.
fn relaxed_of(elm: &ElmConfig) -> Result<&RelaxedLoops> {
    elm.relaxed
        .as_ref()
        .ok_or_else(|| ElmError::InvalidArgument("the module has no relaxed loops".into()))
}

/// Name and shape of every adapter tensor of `elm`'s loops, in a fixed order (loop, target,
/// A then B): `A` is `[r, in]`, `B` `[out, r]`.
pub fn loop_shapes(cfg: &ModelConfig, elm: &ElmConfig) -> Result<Vec<(String, [usize; 2])>> {
    let r = relaxed_of(elm)?.rank;
    let mut out = Vec::with_capacity(elm.num_replaced * TARGETS.len() * 2);
    for k in 0..elm.num_replaced {
        for t in TARGETS {
            let (o, i) = target_shape(cfg, t)?;
            let (na, nb) = lora_names(LOOPS_PREFIX, k, t);
            out.push((na, [r, i]));
            out.push((nb, [o, r]));
        }
    }
    Ok(out)
}

/// Scalar parameters of the loop adapters (0 for a module without them).
pub fn loop_params(cfg: &ModelConfig, elm: &ElmConfig) -> usize {
    match elm.relaxed {
        None => 0,
        Some(_) => loop_shapes(cfg, elm)
            .map(|v| v.iter().map(|(_, s)| s[0] * s[1]).sum())
            .unwrap_or(0),
    }
}

/// The paper's initialisation of every loop's adapters (module doc): the rank-`r` truncated SVD
/// of `W_{l+k} − W_shared` per target, computed in f64. The thin divide-and-conquer SVD (the
/// full `V` of a 1536-wide matrix is most of a full SVD's cost), one matrix per core.
pub fn svd_init(dense: &ModelWeights, elm: &ElmConfig, shared: &LayerWeights) -> Result<TensorMap> {
    use rayon::prelude::*;
    elm.validate(&dense.config)?;
    let r = relaxed_of(elm)?.rank;
    let jobs: Vec<(usize, &str)> = (0..elm.num_replaced)
        .flat_map(|k| TARGETS.iter().map(move |&t| (k, t)))
        .collect();
    let adapters = jobs
        .par_iter()
        .map(|&(k, t)| {
            let layer = &dense.layers[elm.start_layer + k];
            let linear = target_linear(t)?;
            let diff: Array2<f64> =
                linear.weight(layer).mapv(f64::from) - linear.weight(shared).mapv(f64::from);
            let (u, sigma, vt) = diff
                .svddc(JobSvd::Some)
                .map_err(|e| ElmError::Linalg(format!("SVD of loop {k}'s `{t}`: {e}")))?;
            let (u, vt) = u.zip(vt).ok_or_else(|| {
                ElmError::Linalg(format!("SVD of loop {k}'s `{t}`: no singular vectors"))
            })?;
            // B = U_r Σ_r  [out, r];  A = V_rᵀ  [r, in].
            let b = &u.slice(s![.., ..r]) * &sigma.slice(s![..r]);
            let a = vt.slice(s![..r, ..]).to_owned();
            Ok((lora_names(LOOPS_PREFIX, k, t), a, b))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = TensorMap::new();
    for ((na, nb), a, b) in adapters {
        out.insert(na, a.mapv(|x| x as f32).into_dyn());
        out.insert(nb, b.mapv(|x| x as f32).into_dyn());
    }
    Ok(out)
}

/// Writes the adapters to `dir/`[`LOOPS_FILE`] (atomically).
pub fn save_loops(dir: &Path, loops: &TensorMap) -> Result<()> {
    save_tensors(&dir.join(LOOPS_FILE), loops, None)
}

/// Reads `dir/`[`LOOPS_FILE`] strictly: every adapter of `elm`'s loops with its shape, finite,
/// and nothing else (errors name the file and the tensor).
pub fn load_loops(dir: &Path, cfg: &ModelConfig, elm: &ElmConfig) -> Result<TensorMap> {
    let file = dir.join(LOOPS_FILE);
    let mut map = load_tensors(&file)?;
    let mut out = TensorMap::new();
    for (name, shape) in loop_shapes(cfg, elm)? {
        let v = take_tensor(&mut map, &name, &shape, &file)?;
        if v.iter().any(|x| !x.is_finite()) {
            return Err(ElmError::format(
                &file,
                format!("{name}: non-finite values"),
            ));
        }
        out.insert(name, v);
    }
    expect_empty(&map, &file)?;
    Ok(out)
}

/// Loop `k`'s layer: the shared block with loop `k`'s adapters merged (`W + B_k A_k`).
pub fn merged_loop(
    shared: &LayerWeights,
    loops: &TensorMap,
    elm: &ElmConfig,
    k: usize,
) -> Result<LayerWeights> {
    let spec = loop_spec(relaxed_of(elm)?);
    let mut store = ParamStore::new();
    for t in TARGETS {
        let (na, nb) = lora_names(LOOPS_PREFIX, k, t);
        for n in [na, nb] {
            let v = loops
                .get(&n)
                .ok_or_else(|| ElmError::tensor(&n, "missing loop adapter"))?;
            store.insert(n, v.clone(), false)?;
        }
    }
    merge_layer(shared, &store, &spec, LOOPS_PREFIX, k)
}

/// The dense model a relaxed module runs as: `dense` with layer `l + k` replaced by loop `k`'s
/// merged layer, for every `k < M`.
pub fn merged_model(
    mut dense: ModelWeights,
    elm: &ElmConfig,
    shared: &LayerWeights,
    loops: &TensorMap,
) -> Result<ModelWeights> {
    elm.validate(&dense.config)?;
    for k in 0..elm.num_replaced {
        let mut layer = merged_loop(shared, loops, elm, k)?;
        // The loop attends as the layer it stands in for (Gemma 3's sliding or global window).
        if let (Some(g), Some(own)) = (&mut layer.gemma, &dense.layers[elm.start_layer + k].gemma) {
            g.attention = own.attention;
        }
        dense.layers[elm.start_layer + k] = layer;
    }
    Ok(dense)
}
