//! [`AnyTransformer`]: the dense model for inference in the storage the user chose, f32 or
//! block-quantized, behind one type, so a command serves both paths without asking which.

use std::path::Path;

use ndarray::Array2;

use super::bench::storage_label;
use super::generate::Decoder;
use super::kv_cache::KvCache;
use super::load::{load_inference_checked, load_pretrained_checked, BeforeWeights};
use super::transformer::{DecoderWeights, Transformer};
use crate::error::Result;
use crate::formats::tokenizer::Tokenizer;
use crate::model_data::config::ModelConfig;
use crate::model_data::QuantWeights;
use crate::quant::WeightStorage;

/// A dense transformer with f32 or quantized matrices.
pub enum AnyTransformer {
    F32(Transformer),
    Quant(Transformer<QuantWeights>),
}

/// Runs `$body` with `$m` bound to the [`Transformer`] inside an [`AnyTransformer`].
macro_rules! each {
    ($any:expr, $m:ident => $body:expr) => {
        match $any {
            AnyTransformer::F32($m) => $body,
            AnyTransformer::Quant($m) => $body,
        }
    };
}

impl AnyTransformer {
    /// Loads `path` (GGUF file or HF directory) with its matrices stored as `storage` says.
    pub fn load(path: &Path, storage: WeightStorage) -> Result<(Self, Tokenizer)> {
        Self::load_checked(path, storage, &|_, _| Ok(()))
    }
    /// [`Self::load`] with `check` run before any weight is read ([`BeforeWeights`]).
    pub fn load_checked(
        path: &Path,
        storage: WeightStorage,
        check: BeforeWeights,
    ) -> Result<(Self, Tokenizer)> {
        Ok(match storage {
            WeightStorage::F32 => {
                let (w, tok) = load_pretrained_checked(path, check)?;
                (AnyTransformer::F32(Transformer::new(w)?), tok)
            }
            WeightStorage::Auto | WeightStorage::Quant(_) => {
                let (w, tok) = load_inference_checked(path, storage, &|_| true, check)?;
                (AnyTransformer::Quant(Transformer::new(w)?), tok)
            }
        })
    }
    pub fn config(&self) -> &ModelConfig {
        each!(self, m => m.config())
    }
    /// Bytes of the weights held (see [`DecoderWeights::weight_bytes`]).
    pub fn weight_bytes(&self) -> usize {
        each!(self, m => m.weights.weight_bytes())
    }
    /// Logits `[B, V]` at each prompt's last position, from a fresh cache.
    pub fn prompt_logits(&self, prompts: &[Vec<u32>]) -> Result<Array2<f32>> {
        let max = prompts.iter().map(Vec::len).max().unwrap_or(0);
        each!(self, m => {
            let mut cache = m.new_cache(prompts.len(), max)?;
            m.prefill(prompts, &mut cache)
        })
    }
    /// `storage` with the block formats actually held (see [`storage_label`]).
    pub fn storage_label(&self, storage: &WeightStorage) -> String {
        each!(self, m => storage_label(storage, &m.weights))
    }
}

impl Decoder for AnyTransformer {
    type State = KvCache;
    fn vocab_size(&self) -> usize {
        each!(self, m => m.vocab_size())
    }
    fn context_len(&self) -> Option<usize> {
        each!(self, m => m.context_len())
    }
    fn new_state(&self, batch: usize, max_seq: usize) -> Result<KvCache> {
        each!(self, m => m.new_state(batch, max_seq))
    }
    fn prefill(&self, tokens: &[Vec<u32>], state: &mut KvCache) -> Result<Array2<f32>> {
        each!(self, m => Decoder::prefill(m, tokens, state))
    }
    fn decode_step(
        &self,
        tokens: &[u32],
        active: &[bool],
        state: &mut KvCache,
        logits: &mut Array2<f32>,
    ) -> Result<()> {
        each!(self, m => Decoder::decode_step(m, tokens, active, state, logits))
    }
}
