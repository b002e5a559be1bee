//! Locating and loading a pretrained model + its tokenizer from a GGUF file or an HF directory.

use std::path::{Path, PathBuf};

use crate::error::{ElmError, Result};
use crate::formats::tokenizer::Tokenizer;
use crate::formats::{
    load_gguf_quant_layers, load_gguf_weights, load_hf_model, stored_linear_format, GgufFile,
};
use crate::model_data::weights::ModelWeights;
use crate::model_data::QuantWeights;
use crate::quant::{WeightStorage, WriteFormat};

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

/// Every weight of a `.gguf` file or an HF directory checked finite (`--check-tensors`; see
/// [`GgufFile::check_tensors`]). An HF directory's weights are decoded to f32 and checked as
/// they load, so its check is that load; a GGUF's quantized blocks, which a loader keeping
/// blocks never decodes up front, are decoded slice by slice.
pub fn check_tensors(path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    if path.is_dir() {
        load_hf_model(path).map(drop)
    } else if path.is_file() {
        GgufFile::open(path)?.check_tensors()
    } else {
        Err(not_found(path))
    }
}

/// The scan `--check-tensors` adds before a model loads: [`check_tensors`] for a `.gguf` file,
/// whose quantized blocks a loader keeping blocks never decodes up front; nothing for an HF
/// directory, whose load decodes every weight to f32 and refuses a non-finite one as it goes
/// (scanning it first would load it twice).
pub fn check_tensors_before_load(path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    if path.is_dir() {
        Ok(())
    } else {
        check_tensors(path)
    }
}

/// Neither a model file nor a model directory: missing, or something that exists but is not a
/// regular file (a FIFO, a device such as `/dev/zero`), which is said so.
fn not_found(path: &Path) -> ElmError {
    match std::fs::metadata(path) {
        Ok(meta) => ElmError::format(
            path,
            format!(
                "is not a regular file or a directory ({}): a model is a .gguf file or an HF \
                 directory",
                crate::io::file_kind(&meta)
            ),
        ),
        Err(_) => ElmError::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such model file or directory (fetch one with `elm fetch`)",
            ),
        ),
    }
}

/// The tokenizer of a `.gguf` file or an HF directory, without its weights (checked against
/// the model's vocabulary size as [`load_pretrained`] checks it).
pub fn load_tokenizer(path: impl AsRef<Path>) -> Result<Tokenizer> {
    let path = path.as_ref();
    if path.is_dir() {
        Ok(hf_tokenizer(path)?.0)
    } else if path.is_file() {
        Ok(gguf_tokenizer(&GgufFile::open(path)?)?.0)
    } else {
        Err(not_found(path))
    }
}

/// An HF directory's tokenizer and config, the tokenizer checked against the embedding's rows.
fn hf_tokenizer(dir: &Path) -> Result<(Tokenizer, crate::model_data::ModelConfig)> {
    let file = dir.join("tokenizer.json");
    let tokenizer = Tokenizer::from_file(&file)?;
    let config = crate::formats::hf::read_hf_config(dir)?;
    tokenizer.check_embedding_rows(config.vocab_size, &file)?;
    Ok((tokenizer, config))
}

/// A GGUF's tokenizer and config, the tokenizer checked against the embedding's rows.
fn gguf_tokenizer(gguf: &GgufFile) -> Result<(Tokenizer, crate::model_data::ModelConfig)> {
    let tokenizer = Tokenizer::from_gguf(gguf)?;
    let config = crate::formats::config_from_gguf(gguf)?;
    tokenizer.check_embedding_rows(config.vocab_size, gguf.path())?;
    Ok((tokenizer, config))
}

/// Loads weights and tokenizer from a `.gguf` file or an HF directory
/// (`config.json`, safetensors, `tokenizer.json`).
pub fn load_pretrained(path: impl AsRef<Path>) -> Result<(ModelWeights, Tokenizer)> {
    load_pretrained_checked(path, &|_, _| Ok(()))
}

/// What a command checks with the tokenizer and the config in hand and before any weight is
/// read (a prompt against the context, say), so that a refusal costs no load and the
/// tokenizer is built once.
pub type BeforeWeights<'a> = &'a dyn Fn(&Tokenizer, &crate::model_data::ModelConfig) -> Result<()>;

/// [`load_pretrained`] with `check` run once the tokenizer and config are read and before the
/// weights load.
pub fn load_pretrained_checked(
    path: impl AsRef<Path>,
    check: BeforeWeights,
) -> Result<(ModelWeights, Tokenizer)> {
    let path = path.as_ref();
    if path.is_dir() {
        // The tokenizer first: an invalid one is refused before the weights load.
        let (tokenizer, config) = hf_tokenizer(path)?;
        check(&tokenizer, &config)?;
        let weights = load_hf_model(path)?;
        Ok((weights, tokenizer))
    } else if path.is_file() {
        let gguf = GgufFile::open(path)?;
        let (tokenizer, config) = gguf_tokenizer(&gguf)?;
        check(&tokenizer, &config)?;
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
    load_inference_layers(path, storage, &|_| true)
}

/// [`load_inference`] keeping only the layers `keep` accepts (`layers` holds those alone, in
/// order). From a GGUF the others are never read, so they never become resident; an HF
/// directory is read whole in f32 first (its loader has no per-layer path).
pub fn load_inference_layers(
    path: impl AsRef<Path>,
    storage: WeightStorage,
    keep: &dyn Fn(usize) -> bool,
) -> Result<(QuantWeights, Tokenizer)> {
    load_inference_checked(path, storage, keep, &|_, _| Ok(()))
}

/// [`load_inference_layers`] with `check` run once the tokenizer and config are read and
/// before the weights load ([`BeforeWeights`]).
pub fn load_inference_checked(
    path: impl AsRef<Path>,
    storage: WeightStorage,
    keep: &dyn Fn(usize) -> bool,
    check: BeforeWeights,
) -> Result<(QuantWeights, Tokenizer)> {
    let path = path.as_ref();
    if path.is_file() {
        let mut gguf = GgufFile::open(path)?;
        let (tokenizer, config) = gguf_tokenizer(&gguf)?;
        check(&tokenizer, &config)?;
        // The parsed vocabulary is not needed while the weights load (issue 42).
        gguf.release_metadata();
        Ok((
            load_gguf_quant_layers(&gguf, config, storage, keep)?,
            tokenizer,
        ))
    } else {
        let (mut w, tokenizer) = load_pretrained_checked(path, check)?;
        let format = storage.forced_format();
        w.layers = std::mem::take(&mut w.layers)
            .into_iter()
            .enumerate()
            .filter_map(|(l, layer)| keep(l).then_some(layer))
            .collect();
        Ok((QuantWeights::from_f32(&w, format), tokenizer))
    }
}

/// The config of the model at `path` and the block format layer `layer`'s query projection
/// gets when it is loaded for inference under `storage` (`None`: f32), in one reading of the
/// file's metadata and without reading any tensor data: what an ELM checks its module against
/// and quantizes the module to by default, when the layer it replaces is not loaded.
pub fn config_and_layer_format(
    path: impl AsRef<Path>,
    layer: usize,
    storage: WeightStorage,
) -> Result<(crate::model_data::ModelConfig, Option<WriteFormat>)> {
    let path = path.as_ref();
    if !path.is_file() {
        // An HF directory's matrices are f32: `auto` keeps them so.
        let format = storage.forced_format();
        return Ok((load_config(path)?, format));
    }
    let gguf = GgufFile::open(path)?;
    let config = crate::formats::config_from_gguf(&gguf)?;
    let name = format!("blk.{layer}.attn_q.weight");
    let format = stored_linear_format(&gguf, &name, config.hidden_size, storage);
    Ok((config, format))
}
