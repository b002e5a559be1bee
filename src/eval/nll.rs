//! Teacher-forced negative log-likelihood of reference continuations (an answer given its
//! question, a canonical solution given its prompt), batched, for any [`ElmModel`].
//!
//! Sequences are sorted by length and cut into batches of neighbours, so padding is small;
//! each batch is one fresh [`ElmSession`] and one [`ElmSession::teacher_forced_hidden`] call
//! (dense layers over the padded batch, the fixed point per group of equal length — a row's
//! NLL does not depend on what else is in its batch). Logits are computed only at the
//! positions that predict a scored token, one sequence at a time (`[n_scored, V]`), and the
//! log-softmax is taken in f64. With a single-threaded BLAS, batches run concurrently on
//! rayon's pool (one per core); results do not depend on the schedule.

use std::time::Instant;

use ndarray::{s, Array2, ArrayView1};
use serde::Serialize;

use crate::data::encode_continuation;
use crate::equilibrium::infer::{ElmModel, ElmSession, FpStat, InferenceConfig};
use crate::error::{ElmError, Result};
use crate::model::ops::blas_threads;

use super::solver_summary::SolverSummary;
use super::stats::ItemScore;

/// One sequence to score: `tokens[first_scored..]` are the targets, each predicted from the
/// tokens before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScoredSequence {
    pub id: String,
    pub tokens: Vec<u32>,
    pub first_scored: usize,
}

impl ScoredSequence {
    /// `prompt ++ continuation`, scoring the continuation.
    pub fn new(id: impl Into<String>, prompt: &[u32], continuation: &[u32]) -> Result<Self> {
        let id = id.into();
        if prompt.is_empty() || continuation.is_empty() {
            return Err(ElmError::InvalidArgument(format!(
                "item {id}: prompt ({} tokens) and continuation ({} tokens) must be non-empty",
                prompt.len(),
                continuation.len()
            )));
        }
        let mut tokens = prompt.to_vec();
        tokens.extend_from_slice(continuation);
        Ok(ScoredSequence {
            id,
            tokens,
            first_scored: prompt.len(),
        })
    }
    /// `context ++ continuation` as text, split as lm-evaluation-harness splits it
    /// ([`crate::data::encode_continuation`]): the joint text is encoded once.
    pub fn from_text(
        id: impl Into<String>,
        context: &str,
        continuation: &str,
        encode: &dyn Fn(&str) -> Result<Vec<u32>>,
    ) -> Result<Self> {
        let id = id.into();
        let (tokens, first_scored) = encode_continuation(context, continuation, encode)
            .map_err(|e| ElmError::InvalidArgument(format!("item {id}: {e}")))?;
        Ok(ScoredSequence {
            id,
            tokens,
            first_scored,
        })
    }
    fn scored(&self) -> usize {
        self.tokens.len() - self.first_scored
    }
}

/// NLL of every sequence, in the input order.
#[derive(Clone, Debug, Serialize)]
pub struct NllRun {
    /// `value` = summed NLL (nats) of the item's scored tokens, `weight` = their count.
    pub items: Vec<ItemScore>,
    /// Tokens run through the model (prompts included, padding excluded).
    pub tokens_processed: usize,
    pub scored_tokens: usize,
    pub seconds: f64,
    /// `tokens_processed / seconds`.
    pub tok_s: f64,
    /// Fixed-point statistics of the solves (one per sequence; empty for a dense model).
    pub solver: SolverSummary,
}

/// One batch's `(sequence index, summed NLL)` pairs and its fixed-point statistics.
type ChunkNll = (Vec<(usize, f64)>, Vec<FpStat>);

/// `-log softmax(logits)[target]` in f64.
pub fn token_nll(logits: ArrayView1<f32>, target: u32) -> f64 {
    let max = logits.fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = logits
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    lse - logits[target as usize] as f64
}

/// `run(chunk)` for every chunk, in order, each a batch of its own session: with a
/// single-threaded BLAS every product of a batch runs on one core, so batches run concurrently,
/// one per core (rayon's pool); with a multi-threaded BLAS, one after another. A batch's result
/// does not depend on the schedule. `on_progress(items done)` after each batch.
pub(super) fn each_batch<C: Sync, T: Send>(
    chunks: &[&[C]],
    on_progress: &mut (impl FnMut(usize) + Send),
    run: impl Fn(&[C]) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let progress = std::sync::Mutex::new((0usize, on_progress));
    let run_one = |chunk: &[C]| {
        let out = run(chunk);
        if let Ok(mut p) = progress.lock() {
            p.0 += chunk.len();
            let done = p.0;
            (p.1)(done);
        }
        out
    };
    if blas_threads() == 1 && rayon::current_num_threads() > 1 && chunks.len() > 1 {
        use rayon::prelude::*;
        chunks.par_iter().map(|c| run_one(c)).collect()
    } else {
        chunks.iter().map(|c| run_one(c)).collect()
    }
}

/// Scores `seqs` with `model` in batches of at most `batch` sequences; `on_progress(done)`
/// after each batch.
pub fn teacher_forced_nll(
    model: &ElmModel,
    inference: &InferenceConfig,
    seqs: &[ScoredSequence],
    batch: usize,
    mut on_progress: impl FnMut(usize) + Send,
) -> Result<NllRun> {
    if batch == 0 {
        return Err(ElmError::config("batch", "must be >= 1"));
    }
    if seqs.is_empty() {
        return Err(ElmError::InvalidArgument("no sequences to score".into()));
    }
    let vocab = model.config().vocab_size;
    for s in seqs {
        if s.first_scored == 0 || s.first_scored >= s.tokens.len() {
            return Err(ElmError::InvalidArgument(format!(
                "item {}: first scored token {} of {} (need 1 ≤ first < len)",
                s.id,
                s.first_scored,
                s.tokens.len()
            )));
        }
        if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ElmError::InvalidArgument(format!(
                "item {}: token id {t} out of range for vocab size {vocab}",
                s.id
            )));
        }
    }
    let start = Instant::now();
    // Every batch reads the same weights: those worth it are packed once for all of them.
    let _frozen = model.frozen_for_scoring();
    // Longest first: the largest session is allocated first, and batches hold neighbours.
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].tokens.len()));
    let chunks: Vec<&[usize]> = order.chunks(batch).collect();
    let run_chunk = |chunk: &[usize]| -> Result<ChunkNll> {
        let tokens: Vec<Vec<u32>> = chunk.iter().map(|&i| seqs[i].tokens.clone()).collect();
        let t_max = tokens.iter().map(Vec::len).max().unwrap_or(1);
        let mut session = ElmSession::new(model, inference.clone(), tokens.len(), t_max)?;
        let hidden = session.teacher_forced_hidden(&tokens)?; // [B, T, C]
        let mut out = Vec::with_capacity(chunk.len());
        for (row, &i) in chunk.iter().enumerate() {
            let s = &seqs[i];
            // Position p predicts token p + 1.
            let h = hidden.slice(s![row, s.first_scored - 1..s.tokens.len() - 1, ..]);
            let logits: Array2<f32> = session.logits_of_hidden(h); // [n_scored, V]
            let nll = s.tokens[s.first_scored..]
                .iter()
                .enumerate()
                .map(|(k, &target)| token_nll(logits.row(k), target))
                .sum();
            out.push((i, nll));
        }
        Ok((out, std::mem::take(&mut session.prefill_stats)))
    };
    let results = each_batch(&chunks, &mut on_progress, run_chunk);
    let mut nll = vec![0.0f64; seqs.len()];
    let mut stats: Vec<FpStat> = Vec::new();
    for r in results {
        let (out, mut st) = r?;
        for (i, v) in out {
            nll[i] = v;
        }
        stats.append(&mut st);
    }
    let seconds = start.elapsed().as_secs_f64();
    let tokens_processed: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    let items = seqs
        .iter()
        .zip(&nll)
        .map(|(s, &v)| ItemScore {
            id: s.id.clone(),
            value: v,
            weight: s.scored() as f64,
        })
        .collect();
    Ok(NllRun {
        items,
        tokens_processed,
        scored_tokens: seqs.iter().map(ScoredSequence::scored).sum(),
        seconds,
        tok_s: tokens_processed as f64 / seconds.max(1e-9),
        solver: SolverSummary::from_stats(&stats, model.kept_layers().len()),
    })
}
