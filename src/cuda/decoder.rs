//! [`GpuDecoder`]: any [`GpuModel`] behind the shared sampling loop ([`Decoder`]), so GPU
//! generation is the same `generate` call as the CPU's. Shared by the real backend and the stub.

use std::marker::PhantomData;

use ndarray::Array2;

use super::backend::GpuModel;
use crate::error::{ElmError, Result};
use crate::model::generate::Decoder;
use crate::model::ModelWeights;

/// Uploads `weights` to device `ordinal` when a generation starts; the state is the GPU model
/// itself, sized for the batch. Finished sequences are still decoded (their rows are ignored);
/// the cache is large enough for that.
pub struct GpuDecoder<'a, M: GpuModel> {
    weights: &'a ModelWeights,
    ordinal: usize,
    model: PhantomData<M>,
}

impl<'a, M: GpuModel> GpuDecoder<'a, M> {
    pub fn new(weights: &'a ModelWeights, ordinal: usize) -> Self {
        GpuDecoder {
            weights,
            ordinal,
            model: PhantomData,
        }
    }
}

impl<M: GpuModel> Decoder for GpuDecoder<'_, M> {
    type State = M;
    fn vocab_size(&self) -> usize {
        self.weights.config.vocab_size
    }
    fn context_len(&self) -> Option<usize> {
        Some(self.weights.config.max_position_embeddings)
    }
    fn new_state(&self, batch: usize, max_seq: usize) -> Result<M> {
        M::new(self.weights, self.ordinal, batch, max_seq)
    }
    fn prefill(&self, tokens: &[Vec<u32>], state: &mut M) -> Result<Array2<f32>> {
        state.prefill(tokens)
    }
    fn decode_step(
        &self,
        tokens: &[u32],
        _active: &[bool],
        state: &mut M,
        logits: &mut Array2<f32>,
    ) -> Result<()> {
        let next = state.decode(tokens)?;
        if next.dim() != logits.dim() {
            return Err(ElmError::shape(
                "gpu decode",
                format!("logits {:?}, expected {:?}", next.dim(), logits.dim()),
            ));
        }
        logits.assign(&next);
        Ok(())
    }
}
