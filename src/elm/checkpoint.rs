//! Atomic file writing and named-f32-tensor safetensors I/O used by ELM checkpoints.
//!
//! Every file is written to a temp file in the same directory, fsynced, then renamed over
//! the target: a killed process leaves either the old file or the new one, never a torn one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{ElmError, Result};

/// Named f32 tensors in a stable (sorted) order.
pub type TensorMap = BTreeMap<String, ArrayD<f32>>;

/// Writes `bytes` to `path` atomically (temp file + fsync + rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| ElmError::io(dir, e))?;
    let name = path
        .file_name()
        .ok_or_else(|| ElmError::InvalidArgument(format!("{}: not a file path", path.display())))?;
    let tmp: PathBuf = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    {
        let mut f = std::fs::File::create(&tmp).map_err(|e| ElmError::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| ElmError::io(&tmp, e))?;
        f.sync_all().map_err(|e| ElmError::io(&tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| ElmError::io(path, e))
}

/// Serialises a value as pretty JSON, atomically.
pub fn write_json_atomic<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let s = serde_json::to_string_pretty(value).map_err(|e| ElmError::Json {
        what: path.display().to_string(),
        msg: e.to_string(),
    })?;
    write_atomic(path, s.as_bytes())
}

/// Writes named f32 tensors as safetensors, atomically. `metadata` goes in the header.
pub fn save_tensors(
    path: &Path,
    tensors: &TensorMap,
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<()> {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(k, v)| {
            let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (k.clone(), data, v.shape().to_vec())
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(k, d, s)| {
            TensorView::new(Dtype::F32, s.clone(), d)
                .map(|v| (k.clone(), v))
                .map_err(|e| ElmError::tensor(k.clone(), e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let out = safetensors::serialize(views, &metadata)
        .map_err(|e| ElmError::format(path, e.to_string()))?;
    write_atomic(path, &out)
}

/// Reads every tensor of a safetensors file as f32 (only F32 is accepted).
pub fn load_tensors(path: &Path) -> Result<TensorMap> {
    let raw = std::fs::read(path).map_err(|e| ElmError::io(path, e))?;
    let st = SafeTensors::deserialize(&raw)
        .map_err(|e| ElmError::format(path, format!("invalid safetensors: {e}")))?;
    let mut out = TensorMap::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(ElmError::tensor(
                name,
                format!("{}: dtype {:?}, expected F32", path.display(), view.dtype()),
            ));
        }
        let data: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let arr = ArrayD::from_shape_vec(IxDyn(view.shape()), data)
            .map_err(|e| ElmError::tensor(name.clone(), e.to_string()))?;
        out.insert(name, arr);
    }
    Ok(out)
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
