//! The tensors of a training checkpoint: the parameters and the optimiser state, as two
//! safetensors files in the step directory that the run-directory protocol
//! ([`crate::io::run_dir`]) commits. Every trainer (ELM, LoRA, GPPO's candidates) saves and
//! loads them here.

use std::path::Path;

use super::adamw::AdamW;
use super::params::ParamStore;
use crate::error::{ElmError, Result};

/// File of the parameters inside a step directory.
pub const PARAMS_FILE: &str = "params.safetensors";
/// File of the optimiser state inside a step directory.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// Writes `store` and `opt` into `step_dir` (each atomically).
pub fn save_params_and_optimizer(step_dir: &Path, store: &ParamStore, opt: &AdamW) -> Result<()> {
    store.save(step_dir.join(PARAMS_FILE))?;
    opt.save(step_dir.join(OPTIMIZER_FILE))
}

/// Reads the parameters and the optimiser state of `step_dir`. The parameter names must be
/// `expected`, in order (`what` names them in the error: "LoRA parameter", …), and the
/// optimiser's moments must match the parameters.
pub fn load_params_and_optimizer(
    step_dir: &Path,
    expected: &[String],
    what: &str,
) -> Result<(ParamStore, AdamW)> {
    let params = step_dir.join(PARAMS_FILE);
    let store = ParamStore::load(&params)?;
    if store.names() != expected {
        return Err(ElmError::format(params, format!("unexpected {what} names")));
    }
    let opt = AdamW::load(step_dir.join(OPTIMIZER_FILE))?;
    opt.check_against(&store)?;
    Ok((store, opt))
}
