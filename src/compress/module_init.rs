//! How `elm compress` initialises the equilibrium module's block: a copy of the first replaced
//! layer (the paper), LaCo's merge of the whole window, or the window's mean (Relaxed Recursive
//! Transformers' shared-block init).

use serde::{Deserialize, Serialize};

use super::methods::rdsc_merge;
use crate::equilibrium::{ElmConfig, ElmModule, ModuleBlock};
use crate::error::{ElmError, Result};
use crate::model::{LayerWeights, ModelConfig, ModelWeights};
use ndarray::ArrayD;

/// How `elm compress` initialises the module's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockInit {
    /// A copy of the first replaced layer (the ELM paper's init).
    FirstLayer,
    /// LaCo's RDSC merge of the whole window (`θ_l + Σ_k (θ_{l+k} − θ_l)`): the window's
    /// layers collapsed into one as a zero-training starting point.
    LaCo,
    /// The mean of the window's layers, every tensor (Relaxed Recursive Transformers' "Average"
    /// init of a shared block).
    Average,
}

impl std::str::FromStr for BlockInit {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "first-layer" => Ok(BlockInit::FirstLayer),
            "la-co" => Ok(BlockInit::LaCo),
            "average" => Ok(BlockInit::Average),
            other => Err(ElmError::config(
                "block_init",
                format!("unknown block init `{other}` (expected first-layer, la-co or average)"),
            )),
        }
    }
}

/// The module of `cfg` initialised as `init` says ([`ElmModule::init`], then for
/// [`BlockInit::LaCo`] the block replaced by the RDSC merge of the window — its MLP half for
/// an FFN block).
pub fn init_module(dense: &ModelWeights, cfg: &ElmConfig, init: BlockInit) -> Result<ElmModule> {
    let mut module = ElmModule::init(dense, cfg)?;
    let window = &dense.layers[cfg.start_layer..cfg.end_layer()];
    match init {
        BlockInit::FirstLayer => {}
        BlockInit::LaCo => {
            let merged = rdsc_merge(window)?;
            module.block = ModuleBlock::of_layer(&merged, cfg.block);
        }
        BlockInit::Average => {
            let mean = average_layers(window, &dense.config)?;
            module.block = ModuleBlock::of_layer(&mean, cfg.block);
        }
    }
    Ok(module)
}

/// The element-wise mean of `layers`, every tensor (norms and biases too); the result attends
/// as the first layer does.
pub fn average_layers(layers: &[LayerWeights], cfg: &ModelConfig) -> Result<LayerWeights> {
    let first = layers
        .first()
        .ok_or_else(|| ElmError::InvalidArgument("average_layers: no layers".into()))?;
    let mut sum: Vec<ArrayD<f32>> = first
        .block_views(cfg)
        .named()
        .into_iter()
        .map(|(_, v)| v.to_owned())
        .collect();
    for layer in &layers[1..] {
        let views = layer.block_views(cfg);
        let named = views.named();
        if named.len() != sum.len() {
            return Err(ElmError::InvalidArgument(
                "average_layers: the layers hold different tensors".into(),
            ));
        }
        for (acc, (name, v)) in sum.iter_mut().zip(named) {
            if acc.shape() != v.shape() {
                return Err(ElmError::tensor(
                    name,
                    format!("shapes {:?} and {:?} differ", acc.shape(), v.shape()),
                ));
            }
            *acc += v;
        }
    }
    let n = layers.len() as f32;
    let mut it = sum.into_iter();
    let mean = first.block_views(cfg).try_map(|name, _| {
        it.next()
            .map(|a| a / n)
            .ok_or_else(|| ElmError::tensor(name, "average_layers: missing tensor"))
    })?;
    LayerWeights::from_block(&mean)
}
