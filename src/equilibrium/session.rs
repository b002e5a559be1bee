//! ELM inference: dense front layers → fixed-point module solved per token by any
//! [`FixedPointSolver`] → dense back layers, with a one-step or multi-step KV cache.
//!
//! The solver sees one row per sequence: in decode a row is one token's state `[C]`, in
//! prefill a whole prompt `[T·C]` (its tokens attend to each other, so they form one system).
//! Converged rows are frozen by the solver and are not evaluated again.
//!
//! KV modes of the fixed-point block:
//! - `one-step`: one cache holding, per token, the K/V of its FINAL iterate; every iteration
//!   of later tokens attends to those. Memory: N − M + 1 layer caches.
//! - `multi-step`: cache j holds the K/V of iteration j of every earlier token (the last one
//!   when a token stopped earlier); iteration j of a new token attends to cache j — what a naive
//!   unrolled implementation stores. Caches are allocated lazily, one per iteration index reached.
//!
//! Stopping: `stop.abs_tol` = δ bounds the per-token ℓ2 residual `‖f(z) − z‖₂`; a prefill row of
//! T tokens uses `δ·√T` (same per-token RMS); `stop.max_iter` caps the evaluations per token.
//! After the solve, one more evaluation `f(z*)` commits the K/V of the final iterate and is the
//! module output; it is counted in the iterations.

use ndarray::{s, Array2, Array3, ArrayView2, Axis};
use serde::Serialize;

use crate::error::{ElmError, Result};
use crate::model::ops::{linear_any_into, rms_norm_into};
use crate::model::{block_forward_rows, check_context, KvCache, LayerKv};
use crate::quant::QActs;
use crate::solver::{FixedPointMap, RowStatus};

use super::fixed_point::{reshape2, FpMap, FpWork};
use super::inference_config::{InferenceConfig, InitialState, KvMode};
use super::model::ElmModel;

/// Solver statistics of one token (decode) or one prompt (prefill) of one sequence.
#[derive(Clone, Debug, Serialize)]
pub struct FpStat {
    pub sequence: usize,
    /// Prompt tokens for a prefill row, 1 for decode.
    pub tokens: usize,
    /// Fixed-point block evaluations, including the final commit evaluation.
    pub iterations: usize,
    /// `‖f(z*) − z*‖₂` per token (prefill: divided by √T).
    pub residual: f64,
    pub status: RowStatus,
}

/// Per-generation inference state: KV caches for the kept dense layers and the fixed-point
/// block, and the recorded solver statistics.
pub struct ElmSession<'m> {
    pub(crate) model: &'m ElmModel,
    pub(crate) cfg: InferenceConfig,
    /// Caches of the kept dense layers, and the scratch (RoPE table) every block uses.
    pub(crate) dense_kv: KvCache,
    /// Caches of the fixed-point block: one (one-step) or one per iteration (multi-step).
    pub(crate) fp_kv: Vec<LayerKv>,
    /// The fixed-point solves' buffers, kept across tokens.
    pub(crate) fp_work: FpWork,
    pub(crate) batch: usize,
    pub(crate) max_seq: usize,
    /// Decode-step statistics, in order.
    pub decode_stats: Vec<FpStat>,
    /// Prefill statistics, one per sequence.
    pub prefill_stats: Vec<FpStat>,
}

impl<'m> ElmSession<'m> {
    /// Allocates caches for `batch` sequences of at most `max_seq` tokens.
    pub fn new(
        model: &'m ElmModel,
        cfg: InferenceConfig,
        batch: usize,
        max_seq: usize,
    ) -> Result<Self> {
        cfg.validate()?;
        if batch == 0 || max_seq == 0 {
            return Err(ElmError::InvalidArgument(
                "session needs batch > 0 and max_seq > 0".into(),
            ));
        }
        let mc = model.config();
        // Room for a full context plus the slot generation commits its last token into.
        if max_seq > mc.max_position_embeddings.saturating_add(1) {
            return Err(ElmError::config(
                "max_seq",
                format!(
                    "{max_seq} positions exceed the model's context of {} tokens \
                     (max_position_embeddings)",
                    mc.max_position_embeddings
                ),
            ));
        }
        let dense_kv = KvCache::with_layers(mc, model.kept_layers().len(), batch, max_seq)?;
        let fp_kv = match model.elm_config() {
            Some(e) if e.block.has_attention() => vec![LayerKv::new(mc, batch, max_seq)?],
            // The FFN block attends to nothing: its cache only counts tokens.
            Some(_) => vec![LayerKv::without_kv(mc, batch, max_seq)?],
            None => vec![],
        };
        Ok(ElmSession {
            model,
            fp_work: FpWork::new(&cfg),
            cfg,
            dense_kv,
            fp_kv,
            batch,
            max_seq,
            decode_stats: vec![],
            prefill_stats: vec![],
        })
    }

    pub fn batch(&self) -> usize {
        self.batch
    }
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }
    /// Committed tokens per sequence.
    pub fn lens(&self) -> Vec<usize> {
        self.dense_kv
            .layers
            .first()
            .or(self.fp_kv.first())
            .map(|k| k.lens().to_vec())
            .unwrap_or_else(|| vec![0; self.batch])
    }
    /// Exact bytes allocated for K/V (dense layers + fixed-point caches).
    pub fn kv_bytes(&self) -> usize {
        self.dense_kv.bytes() + self.fp_kv.iter().map(|k| k.bytes()).sum::<usize>()
    }
    /// Number of fixed-point caches (1 in one-step mode).
    pub fn fp_caches(&self) -> usize {
        self.fp_kv.len()
    }

    /// Runs every prompt (sequence b = prompts[b], all non-empty) and returns the last
    /// position's logits `[B, V]`. Sequences are processed one at a time.
    pub fn prefill(&mut self, prompts: &[Vec<u32>]) -> Result<Array2<f32>> {
        if prompts.len() != self.batch {
            return Err(ElmError::InvalidArgument(format!(
                "prefill: {} prompts for a session of batch {}",
                prompts.len(),
                self.batch
            )));
        }
        let v = self.model.config().vocab_size;
        let mut logits = Array2::zeros((self.batch, v));
        for (b, p) in prompts.iter().enumerate() {
            if p.is_empty() {
                return Err(ElmError::InvalidArgument(format!("prompt {b} is empty")));
            }
            check_context(self.model.config(), self.lens()[b] + p.len(), "prompt")?;
            let out = self.forward(&[b], &[p.as_slice()], true)?;
            logits.row_mut(b).assign(&out.row(0));
        }
        Ok(logits)
    }

    /// One new token per sequence; returns logits `[B, V]`.
    pub fn decode_step(&mut self, tokens: &[u32]) -> Result<Array2<f32>> {
        if tokens.len() != self.batch {
            return Err(ElmError::InvalidArgument(format!(
                "decode_step: {} tokens for batch {}",
                tokens.len(),
                self.batch
            )));
        }
        let seqs: Vec<usize> = (0..self.batch).collect();
        let toks: Vec<&[u32]> = tokens.chunks(1).collect();
        self.forward(&seqs, &toks, false)
    }

    /// One new token for each sequence with `active[b]` (others untouched); logits `[B, V]`
    /// (zero rows for inactive sequences).
    pub fn decode_step_masked(&mut self, tokens: &[u32], active: &[bool]) -> Result<Array2<f32>> {
        if tokens.len() != self.batch || active.len() != self.batch {
            return Err(ElmError::InvalidArgument(format!(
                "decode_step_masked: {} tokens / {} flags for batch {}",
                tokens.len(),
                active.len(),
                self.batch
            )));
        }
        let seqs: Vec<usize> = (0..self.batch).filter(|&b| active[b]).collect();
        let mut logits = Array2::zeros((self.batch, self.model.config().vocab_size));
        if seqs.is_empty() {
            return Ok(logits);
        }
        let toks: Vec<&[u32]> = seqs.iter().map(|&b| &tokens[b..b + 1]).collect();
        let out = self.forward(&seqs, &toks, false)?;
        for (ri, &b) in seqs.iter().enumerate() {
            logits.row_mut(b).assign(&out.row(ri));
        }
        Ok(logits)
    }

    /// Runs `tokens[r]` (all the same length T) of sequences `seqs[r]` through the model,
    /// committing every cache; returns logits of each row's last token `[R, V]`.
    pub(crate) fn forward(
        &mut self,
        seqs: &[usize],
        tokens: &[&[u32]],
        prefill: bool,
    ) -> Result<Array2<f32>> {
        let x = self.forward_hidden(seqs, tokens, prefill)?;
        let t = x.dim().1;
        let last = x.index_axis(Axis(1), t - 1).to_owned();
        Ok(self.logits(last.view()))
    }

    /// Logits `[N, V]` of final hidden states `[N, C]`.
    pub(crate) fn logits(&self, h: ArrayView2<f32>) -> Array2<f32> {
        let model = self.model;
        let mc = model.config();
        let mut hn = Array2::zeros(h.raw_dim());
        rms_norm_into(h, model.final_norm().view(), mc.rms_norm_eps, hn.view_mut());
        let mut logits = Array2::zeros((h.nrows(), mc.vocab_size));
        let mut qx = QActs::default();
        linear_any_into(hn.view(), model.lm_head(), None, logits.view_mut(), &mut qx);
        logits
    }

    /// Logits `[T, V]` of every position of one prompt for sequence `b` (teacher forcing;
    /// used for perplexity). Commits the caches like [`Self::prefill`].
    pub fn prefill_all_logits(&mut self, b: usize, prompt: &[u32]) -> Result<Array2<f32>> {
        if b >= self.batch || prompt.is_empty() {
            return Err(ElmError::InvalidArgument(format!(
                "prefill_all_logits: sequence {b} of batch {}, {} tokens",
                self.batch,
                prompt.len()
            )));
        }
        let x = self.forward_hidden(&[b], &[prompt], true)?;
        let x2 = x.index_axis(Axis(0), 0).to_owned();
        Ok(self.logits(x2.view()))
    }

    /// Final hidden states `[B, T, C]` (before the final norm; `T` = the longest sequence) of
    /// one whole sequence per row, for teacher forcing on a fresh session. Lengths may
    /// differ: rows are right-padded. Padding never reaches a real token: the dense layers are
    /// causal, and the fixed point is solved per group of rows with the same length on their
    /// real tokens only, so a row's solve (its iterates, residual, adaptive stop at δ·√len,
    /// Anderson/Broyden mixing) is the one it would get alone. Hidden states at padded
    /// positions are unspecified.
    pub fn teacher_forced_hidden(&mut self, tokens: &[Vec<u32>]) -> Result<Array3<f32>> {
        if tokens.len() != self.batch || tokens.iter().any(|t| t.is_empty()) {
            return Err(ElmError::InvalidArgument(format!(
                "teacher_forced_hidden: {} sequences (none may be empty) for a session of batch {}",
                tokens.len(),
                self.batch
            )));
        }
        if self.lens().iter().any(|&l| l > 0) {
            return Err(ElmError::InvalidArgument(
                "teacher_forced_hidden needs a fresh session".into(),
            ));
        }
        let lens: Vec<usize> = tokens.iter().map(Vec::len).collect();
        let t_max = lens.iter().copied().max().unwrap_or(0);
        if t_max > self.max_seq {
            return Err(ElmError::InvalidArgument(format!(
                "teacher_forced_hidden: {t_max} tokens for a session of max_seq {}",
                self.max_seq
            )));
        }
        let model = self.model;
        let seqs: Vec<usize> = (0..tokens.len()).collect();
        // [B, T, C]
        let (mut x, _) = model.embed(tokens)?;
        let (front, back) = model.front_back();
        for slot in 0..front {
            self.dense_layer(slot, &mut x, &seqs)?;
        }
        if model.elm_config().is_some() {
            let mut groups: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
            for (b, &len) in lens.iter().enumerate() {
                groups.entry(len).or_default().push(b);
            }
            for (len, rows) in groups {
                // h of the group's real tokens: [R, len, C].
                let mut y = x.select(Axis(0), &rows).slice(s![.., ..len, ..]).to_owned();
                self.solve_fixed_point(&mut y, &rows, true)?;
                for (gi, &b) in rows.iter().enumerate() {
                    x.slice_mut(s![b, ..len, ..])
                        .assign(&y.index_axis(Axis(0), gi));
                }
            }
        }
        for slot in front..front + back {
            self.dense_layer(slot, &mut x, &seqs)?;
        }
        Ok(x)
    }

    /// Final norm + LM head: hidden states `[N, C]` → logits `[N, V]`.
    pub fn logits_of_hidden(&self, h: ArrayView2<f32>) -> Array2<f32> {
        self.logits(h)
    }

    /// Final hidden states `[R, T, C]` (before the final norm).
    pub(crate) fn forward_hidden(
        &mut self,
        seqs: &[usize],
        tokens: &[&[u32]],
        prefill: bool,
    ) -> Result<Array3<f32>> {
        let model = self.model;
        let (mut x, _) = model.embed(tokens)?;
        let (front, back) = model.front_back();
        for slot in 0..front {
            self.dense_layer(slot, &mut x, seqs)?;
        }
        if model.elm_config().is_some() {
            self.solve_fixed_point(&mut x, seqs, prefill)?;
        }
        for slot in front..front + back {
            self.dense_layer(slot, &mut x, seqs)?;
        }
        Ok(x)
    }

    /// Runs kept dense layer `slot` (its cache too) in place on `x [R, T, C]` of `seqs`.
    pub(crate) fn dense_layer(
        &mut self,
        slot: usize,
        x: &mut Array3<f32>,
        seqs: &[usize],
    ) -> Result<()> {
        let model = self.model;
        let lens = &mut self.fp_work.bufs.lens;
        lens.clear();
        lens.resize(seqs.len(), x.dim().1);
        let lens = &*lens;
        let KvCache {
            layers, scratch, ..
        } = &mut self.dense_kv;
        block_forward_rows(
            model.kept_layer(slot),
            model.config(),
            x.view_mut(),
            seqs,
            lens,
            &mut layers[slot],
            true,
            scratch,
        )
    }

    /// Solves `z = f(z, h)` for each row of `x` (= `h` `[R, T, C]`), commits the final
    /// iterate's K/V and leaves `f(z*)` in `x`. Every buffer comes from the session's
    /// [`FpWork`], so a decode step allocates nothing here after the first.
    pub(crate) fn solve_fixed_point(
        &mut self,
        x: &mut Array3<f32>,
        seqs: &[usize],
        prefill: bool,
    ) -> Result<()> {
        // The module's products quantize activations in their own mode; the kept dense layers
        // keep theirs. Swapped back whatever the solve returns.
        let swap =
            |s: &mut Self| std::mem::swap(&mut s.dense_kv.scratch.qx, &mut s.fp_work.module_qx);
        swap(self);
        let solved = self.solve_module(x, seqs, prefill);
        swap(self);
        solved
    }

    /// [`Self::solve_fixed_point`] with the module's activation buffers in place.
    fn solve_module(&mut self, x: &mut Array3<f32>, seqs: &[usize], prefill: bool) -> Result<()> {
        let model = self.model;
        let (Some(ec), Some(view)) = (model.elm_config(), model.module_view()) else {
            return Err(ElmError::InvalidArgument(
                "solve_fixed_point on a dense model".into(),
            ));
        };
        let mc = model.config();
        let (r, t, c) = x.dim();
        let adaptive = !prefill || self.cfg.adaptive_prefill;
        let stop = self.cfg.stop_for(t, adaptive);
        // Pending K/V left by a failed earlier call must not be committed below.
        self.fp_kv.iter_mut().for_each(LayerKv::discard_pending);
        let scratch = &mut self.dense_kv.scratch;
        let FpWork {
            solver,
            solve,
            inj,
            z,
            next,
            all,
            bufs,
            module_qx: _, // in `scratch.qx` for the solve
        } = &mut self.fp_work;
        {
            let h2 = x
                .view()
                .into_shape_with_order((r * t, c))
                .map_err(|e| ElmError::shape("solve_fixed_point h", e.to_string()))?;
            view.injection_term_into(h2, inj, &mut scratch.qx);
            reshape2(z, r, t * c);
            let h_rows = x
                .view()
                .into_shape_with_order((r, t * c))
                .map_err(|e| ElmError::shape("solve_fixed_point h", e.to_string()))?;
            match (self.cfg.z0, ec.injection) {
                (InitialState::Module, true) | (InitialState::Zero, _) => z.fill(0.0),
                (InitialState::Module, false) | (InitialState::Input, _) => z.assign(&h_rows),
                (InitialState::Random, _) => {
                    // N(0, σ²) with σ the RMS of h: a start as far from 0 as h is, seeded so a
                    // rerun draws the same one.
                    let n = h_rows.len().max(1) as f64;
                    let rms = (h_rows
                        .iter()
                        .map(|&v| f64::from(v) * f64::from(v))
                        .sum::<f64>()
                        / n)
                        .sqrt();
                    let normal = rand_distr::Normal::new(0.0, rms.max(1e-12))
                        .map_err(|e| ElmError::InvalidArgument(format!("z0 random: {e}")))?;
                    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
                    z.iter_mut().for_each(|v| {
                        *v = rand_distr::Distribution::sample(&normal, &mut rng) as f32
                    });
                }
            }
        }
        reshape2(next, r, t * c);
        all.clear();
        all.resize(r, true);
        bufs.evals.clear();
        bufs.evals.resize(r, 0);
        let mut map = FpMap {
            module: view,
            cfg: mc,
            inj: inj.view(),
            dims: (r, t, c),
            seqs,
            mode: self.cfg.kv_mode,
            fp_kv: &mut self.fp_kv,
            scratch,
            bufs: &mut *bufs,
        };
        let solved = map.iterate(ec, solver.as_ref(), &stop, true, solve, z, next)?;
        // Final evaluation at z*: its K/V are what the cache keeps; its output goes on.
        map.eval(z.view(), all, next.view_mut())?;
        // Commit: every cache holds, as pending K/V, the iterate that belongs in it.
        if self.cfg.kv_mode == KvMode::MultiStep {
            // Caches past a row's final evaluation (reached by rows that iterated longer)
            // get that final iterate's K/V.
            for (ri, &b) in seqs.iter().enumerate() {
                let last = bufs.store_idx[ri];
                let (done, later) = self.fp_kv.split_at_mut(last + 1);
                for kv in later {
                    kv.copy_pending_from(&done[last], b)?;
                }
            }
        }
        for kv in self.fp_kv.iter_mut() {
            kv.commit();
        }
        for (ri, &b) in seqs.iter().enumerate() {
            let d2: f64 = next
                .row(ri)
                .iter()
                .zip(z.row(ri))
                .map(|(y, z)| ((*y - *z) as f64).powi(2))
                .sum();
            let stat = FpStat {
                sequence: b,
                tokens: t,
                iterations: bufs.evals[ri],
                residual: (d2 / t as f64).sqrt(),
                status: if solved {
                    solve.rows()[ri].status
                } else {
                    // A fixed budget has no convergence test: every row ran it out.
                    RowStatus::MaxIter
                },
            };
            if prefill {
                self.prefill_stats.push(stat);
            } else {
                self.decode_stats.push(stat);
            }
        }
        x.assign(
            &next
                .view()
                .into_shape_with_order((r, t, c))
                .map_err(|e| ElmError::shape("solve_fixed_point y", e.to_string()))?,
        );
        Ok(())
    }
}
