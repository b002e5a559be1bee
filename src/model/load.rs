//! Locating and loading a pretrained model + its tokenizer from a GGUF file or an HF directory.

use std::path::{Path, PathBuf};

use crate::error::{ElmError, Result};
use crate::formats::tokenizer::Tokenizer;
use crate::formats::{load_gguf_quant, load_gguf_weights, load_hf_model, GgufFile};
use crate::model_data::quant::{QuantWeights, WeightStorage};
use crate::model_data::weights::ModelWeights;

/// File name of the default real model.
pub const DEFAULT_MODEL_FILE: &str = crate::formats::SMOLLM2_GGUF;

/// Directory holding model files (one definition, in `io`).
pub use crate::formats::models_dir;

/// Path of the default SmolLM2 GGUF (may not exist; see `scripts/fetch-smollm2.sh`).
pub fn default_model_path() -> PathBuf {
    models_dir().join(DEFAULT_MODEL_FILE)
}

/// Reads only the config of a `.gguf` file or an HF directory (no tensor is read).
pub fn load_config(path: impl AsRef<Path>) -> Result<crate::model_data::ModelConfig> {
    let path = path.as_ref();
    if path.is_dir() {
        crate::formats::read_hf_config(path)
    } else {
        crate::formats::config_from_gguf(&GgufFile::open(path)?)
    }
}

/// Loads only the weights from a `.gguf` file or an HF directory (no tokenizer needed).
pub fn load_weights(path: impl AsRef<Path>) -> Result<ModelWeights> {
    let path = path.as_ref();
    if path.is_dir() {
        load_hf_model(path)
    } else if path.is_file() {
        load_gguf_weights(&GgufFile::open(path)?)
    } else {
        Err(not_found(path))
    }
}

fn not_found(path: &Path) -> ElmError {
    ElmError::io(
        path,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such model file or directory (fetch one with `elm fetch`)",
        ),
    )
}

/// Loads weights and tokenizer from a `.gguf` file or an HF directory
/// (`config.json`, safetensors, `tokenizer.json`).
pub fn load_pretrained(path: impl AsRef<Path>) -> Result<(ModelWeights, Tokenizer)> {
    let path = path.as_ref();
    if path.is_dir() {
        let weights = load_hf_model(path)?;
        let tokenizer = Tokenizer::from_file(path.join("tokenizer.json"))?;
        Ok((weights, tokenizer))
    } else if path.is_file() {
        let gguf = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        Ok((load_gguf_weights(&gguf)?, tokenizer))
    } else {
        Err(not_found(path))
    }
}

/// Loads weights for the inference path, each matrix stored as `storage` says (`Auto` keeps
/// a GGUF's quantized blocks as they are; an HF directory is read in f32 and quantized on the
/// fly when a block format is asked for), plus the tokenizer.
pub fn load_inference(
    path: impl AsRef<Path>,
    storage: WeightStorage,
) -> Result<(QuantWeights, Tokenizer)> {
    let path = path.as_ref();
    if path.is_file() {
        let gguf = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        Ok((load_gguf_quant(&gguf, storage)?, tokenizer))
    } else {
        let (w, tokenizer) = load_pretrained(path)?;
        let format = match storage {
            WeightStorage::Quant(f) => Some(f),
            WeightStorage::F32 | WeightStorage::Auto => None,
        };
        Ok((QuantWeights::from_f32(&w, format), tokenizer))
    }
}
