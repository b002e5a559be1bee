//! Small, dependency-free helpers to write/read named f32 tensors as safetensors, atomically.
//!
//! `io` (GGUF, model safetensors) sits *above* `train` in the layer order, so the optimiser,
//! [`ParamStore`](super::ParamStore) and the ELM checkpoints (`crate::elm::checkpoint`) share
//! this minimal reader/writer.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::{ElmError, Result};

/// Writes `bytes` to `path` through a temporary sibling file + fsync + `rename`, so a crash
/// mid-write never leaves a truncated file under the final name. Creates missing parent
/// directories.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let file_name = path
        .file_name()
        .ok_or_else(|| ElmError::InvalidArgument(format!("{}: not a file path", path.display())))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| ElmError::io(dir, e))?;
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp: PathBuf = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| ElmError::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| ElmError::io(&tmp, e))?;
        f.sync_all().map_err(|e| ElmError::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| ElmError::io(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Serialises named f32 tensors (+ string metadata) to safetensors bytes and writes them atomically.
pub fn save_f32_tensors(
    path: &Path,
    tensors: &[(String, &ArrayD<f32>)],
    metadata: HashMap<String, String>,
) -> Result<()> {
    // safetensors wants borrowed little-endian bytes; keep owned buffers alive for the views.
    let buffers: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, a)| a.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, a), buf) in tensors.iter().zip(&buffers) {
        let view = TensorView::new(Dtype::F32, a.shape().to_vec(), buf)
            .map_err(|e| ElmError::tensor(name.clone(), format!("cannot serialise: {e}")))?;
        views.push((name.clone(), view));
    }
    let bytes = safetensors::serialize(views, &Some(metadata))
        .map_err(|e| ElmError::format(path, format!("safetensors serialisation failed: {e}")))?;
    write_atomic(path, &bytes)
}

/// Named f32 tensors and the string metadata of a safetensors file.
pub struct TensorFile {
    /// Tensors by name (unordered; callers use metadata for order).
    pub tensors: HashMap<String, ArrayD<f32>>,
    /// The `__metadata__` map (empty when absent).
    pub metadata: HashMap<String, String>,
}

/// Reads every tensor of a safetensors file as f32. Missing file, corrupt header, truncated data,
/// or a non-f32 tensor → typed error naming the file/tensor.
pub fn load_f32_tensors(path: &Path) -> Result<TensorFile> {
    let bytes = std::fs::read(path).map_err(|e| ElmError::io(path, e))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| ElmError::format(path, format!("not a valid safetensors file: {e:?}")))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| ElmError::format(path, format!("not a valid safetensors file: {e:?}")))?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    let mut tensors = HashMap::new();
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
            .map_err(|e| ElmError::tensor(name.clone(), format!("{}: {e}", path.display())))?;
        tensors.insert(name, arr);
    }
    Ok(TensorFile { tensors, metadata })
}
