//! How `elm compress` initialises the equilibrium module's block: a copy of the first replaced
//! layer (the paper), or LaCo's merge of the whole window.

use serde::{Deserialize, Serialize};

use super::methods::rdsc_merge;
use crate::equilibrium::{ElmConfig, ElmModule, ModuleBlock};
use crate::error::{ElmError, Result};
use crate::model::ModelWeights;

/// How `elm compress` initialises the module's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockInit {
    /// A copy of the first replaced layer (the ELM paper's init).
    FirstLayer,
    /// LaCo's RDSC merge of the whole window (`θ_l + Σ_k (θ_{l+k} − θ_l)`): the window's
    /// layers collapsed into one as a zero-training starting point.
    LaCo,
}

impl std::str::FromStr for BlockInit {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "first-layer" => Ok(BlockInit::FirstLayer),
            "la-co" => Ok(BlockInit::LaCo),
            other => Err(ElmError::config(
                "block_init",
                format!("unknown block init `{other}` (expected first-layer or la-co)"),
            )),
        }
    }
}

/// The module of `cfg` initialised as `init` says ([`ElmModule::init`], then for
/// [`BlockInit::LaCo`] the block replaced by the RDSC merge of the window — its MLP half for
/// an FFN block).
pub fn init_module(dense: &ModelWeights, cfg: &ElmConfig, init: BlockInit) -> Result<ElmModule> {
    let mut module = ElmModule::init(dense, cfg)?;
    if init == BlockInit::LaCo {
        let merged = rdsc_merge(&dense.layers[cfg.start_layer..cfg.end_layer()])?;
        module.block = ModuleBlock::of_layer(&merged, cfg.block);
    }
    Ok(module)
}
