//! Named f32 tensors as safetensors, written atomically ([`super::write_atomic`]): the format of
//! the optimiser state, [`ParamStore`](crate::train::ParamStore) and the ELM checkpoints
//! (`crate::equilibrium::checkpoint`). Uses nothing above [`crate::error`].

use std::collections::HashMap;
use std::path::Path;

use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use super::atomic::write_atomic;
use crate::{ElmError, Result};

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
    // Mapped, each tensor's pages released once converted: loading a checkpoint holds its f32
    // tensors, not the file beside them (issue 42).
    let bytes = super::MappedFile::open(path)?;
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
        let mut data: Vec<f32> = Vec::with_capacity(view.data().len() / 4);
        bytes.convert_releasing(view.data(), 4, |_, src| {
            data.extend(
                src.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
            Ok(())
        })?;
        let arr = ArrayD::from_shape_vec(IxDyn(view.shape()), data)
            .map_err(|e| ElmError::tensor(name.clone(), format!("{}: {e}", path.display())))?;
        tensors.insert(name, arr);
    }
    bytes.release_all();
    Ok(TensorFile { tensors, metadata })
}
