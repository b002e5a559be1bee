//! Named-tensor maps of ELM checkpoints, on top of the atomic safetensors I/O of
//! [`crate::io::tensor_file`] (shared with the optimiser state): a killed process leaves
//! either the old file or the new one, never a torn one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use ndarray::ArrayD;

use crate::error::{ElmError, Result};
use crate::io::tensor_file::{load_f32_tensors, save_f32_tensors};
use crate::io::write_json_atomic;

/// Named f32 tensors in a stable (sorted) order.
pub type TensorMap = BTreeMap<String, ArrayD<f32>>;

/// Writes named f32 tensors as safetensors, atomically. `metadata` goes in the header.
pub fn save_tensors(
    path: &Path,
    tensors: &TensorMap,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let named: Vec<(String, &ArrayD<f32>)> = tensors.iter().map(|(k, v)| (k.clone(), v)).collect();
    save_f32_tensors(path, &named, metadata.unwrap_or_default())
}

/// Reads every tensor of a safetensors file as f32 (only F32 is accepted).
pub fn load_tensors(path: &Path) -> Result<TensorMap> {
    Ok(load_f32_tensors(path)?.tensors.into_iter().collect())
}
/// Removes and returns tensor `name`, checking its shape.
pub fn take_tensor(
    map: &mut TensorMap,
    name: &str,
    shape: &[usize],
    file: &Path,
) -> Result<ArrayD<f32>> {
    let t = map
        .remove(name)
        .ok_or_else(|| ElmError::tensor(name, format!("missing from {}", file.display())))?;
    if t.shape() != shape {
        return Err(ElmError::tensor(
            name,
            format!(
                "{}: shape {:?}, expected {:?}",
                file.display(),
                t.shape(),
                shape
            ),
        ));
    }
    if t.iter().any(|x| !x.is_finite()) {
        return Err(ElmError::NonFinite(format!(
            "tensor `{name}` in {}",
            file.display()
        )));
    }
    Ok(t)
}

/// Errors if any tensor was not consumed (strict name matching).
pub fn expect_empty(map: &TensorMap, file: &Path) -> Result<()> {
    if let Some(k) = map.keys().next() {
        return Err(ElmError::tensor(
            k.clone(),
            format!("unexpected tensor in {}", file.display()),
        ));
    }
    Ok(())
}

/// File of a resumable run's request: what a fresh run was asked to do, written before its
/// first checkpoint.
pub const RUN_REQUEST_FILE: &str = "run_request.json";

/// A fresh run's request, so that a run stopped before even its starting point was saved (a
/// disk full from the start) can still be continued by `--resume` once space is freed: it
/// starts that run again exactly as asked, since nothing of it was trained.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest<T> {
    /// The command that wrote it (`train`, `lora`, `gppo`).
    pub command: String,
    /// The model the run was started on.
    pub model_config: crate::model::ModelConfig,
    /// The command's settings as the fresh run resolved them.
    pub request: T,
}

/// Writes `request` of `command` into run directory `dir` (atomically).
pub fn write_run_request<T: serde::Serialize>(
    dir: &Path,
    command: &str,
    model_config: &crate::model::ModelConfig,
    request: &T,
) -> Result<()> {
    let r = RunRequest {
        command: command.to_string(),
        model_config: model_config.clone(),
        request,
    };
    write_json_atomic(&dir.join(RUN_REQUEST_FILE), &r)
}

/// The request of `command` saved in `dir`, `None` when there is none; one written by another
/// command or for another model is refused naming the file.
pub fn read_run_request<T: serde::de::DeserializeOwned>(
    dir: &Path,
    command: &str,
    model_config: &crate::model::ModelConfig,
) -> Result<Option<T>> {
    let path = dir.join(RUN_REQUEST_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let r: RunRequest<T> = crate::io::read_json(&path)?;
    if r.command != command {
        return Err(ElmError::format(
            &path,
            format!("a request of `{}`, not `{command}`", r.command),
        ));
    }
    if &r.model_config != model_config {
        return Err(ElmError::config(
            "model",
            format!(
                "{}: the run was started on a different model",
                path.display()
            ),
        ));
    }
    Ok(Some(r.request))
}
