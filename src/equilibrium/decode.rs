//! Greedy and sampled generation of an [`ElmModel`] through the shared sampling loop.

use std::cell::RefCell;

use ndarray::Array2;

use crate::error::{ElmError, Result};
use crate::model::generate::{generate, Decoder, Detokenize, SamplingConfig};

use super::inference_config::InferenceConfig;
use super::model::ElmModel;
use super::session::{ElmSession, FpStat};

/// Greedy batched generation on an existing session through the shared sampling loop
/// ([`crate::model::generate::generate`]): prefill every prompt, then decode until each
/// sequence emitted a token in `stop_ids` (kept in the output) or `max_new` tokens. Finished
/// sequences are not evaluated any more; the session keeps its caches and statistics. Returns
/// the new tokens per sequence.
pub fn generate_greedy(
    session: &mut ElmSession<'_>,
    prompts: &[Vec<u32>],
    max_new: usize,
    stop_ids: &[u32],
) -> Result<Vec<Vec<u32>>> {
    generate_greedy_until(session, prompts, max_new, stop_ids, &[], None)
}

/// [`generate_greedy`] that also stops a sequence once its decoded new text contains one of
/// `stop_strings` (`detokenize` is then required); the text is kept, the caller cuts it.
pub fn generate_greedy_until(
    session: &mut ElmSession<'_>,
    prompts: &[Vec<u32>],
    max_new: usize,
    stop_ids: &[u32],
    stop_strings: &[&str],
    detokenize: Option<Detokenize<'_>>,
) -> Result<Vec<Vec<u32>>> {
    if max_new == 0 {
        return Ok(vec![Vec::new(); prompts.len()]);
    }
    let config = SamplingConfig {
        max_new_tokens: max_new,
        stop_token_ids: stop_ids.to_vec(),
        stop_strings: stop_strings.iter().map(|s| s.to_string()).collect(),
        ..SamplingConfig::default()
    };
    let vocab_size = session.model.config().vocab_size;
    let lent = SessionDecoder {
        session: RefCell::new(Some(session)),
        vocab_size,
    };
    Ok(generate(&lent, prompts, &config, detokenize, |_, _| {})?.tokens)
}

/// Lends one existing session to the sampling loop as its state.
pub(crate) struct SessionDecoder<'s, 'm> {
    pub(crate) session: RefCell<Option<&'s mut ElmSession<'m>>>,
    pub(crate) vocab_size: usize,
}

impl<'s, 'm> Decoder for SessionDecoder<'s, 'm> {
    type State = &'s mut ElmSession<'m>;

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn new_state(&self, batch: usize, _max_seq: usize) -> Result<Self::State> {
        let session = self.session.borrow_mut().take().ok_or_else(|| {
            ElmError::InvalidArgument("the lent session serves one generation".into())
        })?;
        if session.batch() != batch {
            return Err(ElmError::InvalidArgument(format!(
                "{batch} prompts for a session of batch {}",
                session.batch()
            )));
        }
        Ok(session)
    }

    fn prefill(&self, tokens: &[Vec<u32>], state: &mut Self::State) -> Result<Array2<f32>> {
        state.prefill(tokens)
    }

    fn decode_step(
        &self,
        tokens: &[u32],
        active: &[bool],
        state: &mut Self::State,
        logits: &mut Array2<f32>,
    ) -> Result<()> {
        *logits = state.decode_step_masked(tokens, active)?;
        Ok(())
    }
}

/// An [`ElmModel`] behind the shared sampling loop ([`crate::model::generate::generate`]):
/// temperature / top-k / top-p, stop strings and batches work as for the dense model.
/// Every session it creates hands its solver statistics over to [`ElmDecoder::record`].
pub struct ElmDecoder<'m> {
    pub(crate) model: &'m ElmModel,
    pub(crate) cfg: InferenceConfig,
    pub(crate) record: RefCell<SessionRecord>,
}

/// What the sessions of an [`ElmDecoder`] recorded.
#[derive(Clone, Debug, Default)]
pub struct SessionRecord {
    /// One entry per prompt, in order.
    pub prefill_stats: Vec<FpStat>,
    /// One entry per decoded token of every active sequence, in order.
    pub decode_stats: Vec<FpStat>,
    /// K/V bytes allocated by the latest session.
    pub kv_bytes: usize,
}

impl<'m> ElmDecoder<'m> {
    pub fn new(model: &'m ElmModel, cfg: InferenceConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(ElmDecoder {
            model,
            cfg,
            record: RefCell::new(SessionRecord::default()),
        })
    }

    /// Statistics recorded so far.
    pub fn record(&self) -> SessionRecord {
        self.record.borrow().clone()
    }

    pub(crate) fn take_stats(&self, session: &mut ElmSession<'m>) {
        let mut r = self.record.borrow_mut();
        // Multi-step caches are allocated as iterations reach them: the bytes grow.
        r.kv_bytes = session.kv_bytes();
        r.prefill_stats.append(&mut session.prefill_stats);
        r.decode_stats.append(&mut session.decode_stats);
    }
}

impl<'m> Decoder for ElmDecoder<'m> {
    type State = ElmSession<'m>;

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }
    fn context_len(&self) -> Option<usize> {
        Some(self.model.config().max_position_embeddings)
    }

    fn new_state(&self, batch: usize, max_seq: usize) -> Result<ElmSession<'m>> {
        let session = ElmSession::new(self.model, self.cfg.clone(), batch, max_seq)?;
        self.record.borrow_mut().kv_bytes = session.kv_bytes();
        Ok(session)
    }

    fn prefill(&self, tokens: &[Vec<u32>], state: &mut ElmSession<'m>) -> Result<Array2<f32>> {
        let logits = state.prefill(tokens)?;
        self.take_stats(state);
        Ok(logits)
    }

    fn decode_step(
        &self,
        tokens: &[u32],
        active: &[bool],
        state: &mut ElmSession<'m>,
        logits: &mut Array2<f32>,
    ) -> Result<()> {
        let out = state.decode_step_masked(tokens, active)?;
        if out.dim() != logits.dim() {
            return Err(ElmError::shape(
                "ElmDecoder::decode_step",
                format!("logits {:?}, session gives {:?}", logits.dim(), out.dim()),
            ));
        }
        logits.assign(&out);
        self.take_stats(state);
        Ok(())
    }
}
