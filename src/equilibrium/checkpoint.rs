//! Named-tensor maps of ELM checkpoints, on top of the atomic safetensors I/O of
//! [`crate::io::tensor_file`] (shared with the optimiser state): a killed process leaves
//! either the old file or the new one, never a torn one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use ndarray::ArrayD;

use crate::error::{ElmError, Result};
use crate::io::tensor_file::{load_f32_tensors, save_f32_tensors};

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
