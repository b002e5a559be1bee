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

use std::cell::RefCell;
use std::path::Path;

use ndarray::{s, Array2, Array3, ArrayView1, ArrayView2, ArrayView3, ArrayViewMut2, Axis};
use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};
use crate::io::tokenizer::Tokenizer;
use crate::model::generate::{generate, Decoder, Detokenize, SamplingConfig};
use crate::model::ops::{linear_any_into, linear_into, rms_norm_into};
use crate::model::quant::{Linear, QActs, QFfn, QFormat, QLayer, QuantWeights, WeightStorage};
use crate::model::{
    block_forward_rows, check_context, load_inference, load_pretrained, BlockWeights, KvCache,
    LayerKv, LayerWeights, ModelConfig, ModelWeights, Scratch,
};
use crate::solver::{
    FixedPointMap, FixedPointSolver, MapError, RowStatus, SolveWorkspace, SolverConfig,
    StopCriteria,
};

use super::config::ElmConfig;
use super::map::{fresh_cache, ModuleView};
use super::module::{load_module_for, ElmModule, ModuleBlock};

/// KV-cache policy of the fixed-point block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvMode {
    OneStep,
    MultiStep,
}

impl std::str::FromStr for KvMode {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "one-step" => Ok(KvMode::OneStep),
            "multi-step" => Ok(KvMode::MultiStep),
            _ => Err(ElmError::config(
                "kv",
                format!("`{s}`: expected one-step or multi-step"),
            )),
        }
    }
}

/// How the fixed-point module is solved at inference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferenceConfig {
    /// Solver and its parameters.
    #[serde(default = "SolverConfig::anderson")]
    pub solver: SolverConfig,
    /// When a token stops: `abs_tol` = δ per token (see module doc; 0 with `rel_tol` 0 = always
    /// `max_iter`), `max_iter` map evaluations per token (the commit evaluation comes on top).
    #[serde(default = "d_stop")]
    pub stop: StopCriteria,
    #[serde(default = "d_kv")]
    pub kv_mode: KvMode,
    /// Stop prefill rows adaptively too (else prefill always runs `max_iter`).
    #[serde(default = "d_true")]
    pub adaptive_prefill: bool,
}

/// δ = 0.5 per token, at most 16 evaluations.
fn d_stop() -> StopCriteria {
    StopCriteria::absolute(0.5, 16)
}
fn d_kv() -> KvMode {
    KvMode::OneStep
}
fn d_true() -> bool {
    true
}

impl Default for InferenceConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

impl InferenceConfig {
    /// `solver` stopping per token as `stop` (see the module doc), other fields default.
    pub fn new(solver: SolverConfig, stop: StopCriteria) -> Self {
        InferenceConfig {
            solver,
            stop,
            ..InferenceConfig::default()
        }
    }
    /// The stop criteria of a row of `tokens` tokens: δ scaled to the row (`δ·√T`), or no
    /// tolerance when the row is not stopped adaptively.
    fn stop_for(&self, tokens: usize, adaptive: bool) -> StopCriteria {
        let (abs_tol, rel_tol) = if adaptive {
            (
                self.stop.abs_tol * (tokens as f64).sqrt(),
                self.stop.rel_tol,
            )
        } else {
            (0.0, 0.0)
        };
        StopCriteria {
            abs_tol,
            rel_tol,
            ..self.stop.clone()
        }
    }
    /// The solver, returning each row's best iterate (its K/V are the ones committed).
    fn build_solver(&self) -> Box<dyn FixedPointSolver<f32>> {
        let mut cfg = self.solver.clone();
        if let Some(output) = cfg.output_mut() {
            output.return_best = true;
        }
        cfg.build()
    }
    pub fn validate(&self) -> Result<()> {
        self.stop.validate()?;
        Ok(self.solver.validate()?)
    }
}

/// A dense model with layers `[l, l+M)` replaced by a fixed-point module, or (when `elm` is
/// `None`) the dense model itself, run by the same code.
///
/// With `quant` set (see [`ElmModel::quantized`]) inference runs on the quantized matrices
/// there, and `weights` / the module in `elm` keep only the config and the ELM layout
/// (their tensors are empty), so only what runs is resident.
pub struct ElmModel {
    pub weights: ModelWeights,
    pub elm: Option<(ElmConfig, ElmModule)>,
    pub quant: Option<QuantElm>,
}

/// What a quantized [`ElmModel`] runs on: the kept dense layers (in order, `layers[slot]`),
/// embedding, final norm and LM head, and the fixed-point module, each matrix quantized.
#[derive(Clone, Debug)]
pub struct QuantElm {
    /// `layers` holds only the kept dense layers, in the order they run.
    pub dense: QuantWeights,
    /// The module (`None` for a dense model).
    pub module: Option<QuantModule>,
}

/// The fixed-point module with quantized matrices (`P = [W_z | W_h]` and the block).
#[derive(Clone, Debug)]
pub struct QuantModule {
    pub block: ModuleBlock<QLayer, QFfn>,
    /// The input injection (`None`: `u = z`, as [`ElmModule::projection`]).
    pub projection: Option<QuantProjection>,
}

/// `P = [W_z | W_h]` and `b`, quantized.
#[derive(Clone, Debug)]
pub struct QuantProjection {
    pub w_z: Linear,
    pub w_h: Linear,
    pub bias: ndarray::Array1<f32>,
}

impl QuantProjection {
    fn bytes(&self) -> usize {
        self.w_z.bytes() + self.w_h.bytes() + self.bias.len() * 4
    }
}

impl QuantModule {
    /// The module's matrices quantized to `format` (`None`: kept f32).
    pub fn from_f32(m: &ElmModule, format: Option<QFormat>) -> Self {
        QuantModule {
            block: match &m.block {
                ModuleBlock::Decoder(b) => ModuleBlock::Decoder(QLayer::from_f32(b, format)),
                ModuleBlock::Ffn(b) => ModuleBlock::Ffn(QFfn::from_f32(b, format)),
            },
            projection: m.projection.as_ref().map(|p| QuantProjection {
                w_z: Linear::from_f32(&p.w_z, format),
                w_h: Linear::from_f32(&p.w_h, format),
                bias: p.bias.clone(),
            }),
        }
    }

    /// Bytes of weights held.
    pub fn bytes(&self) -> usize {
        self.block.block_ref().bytes() + self.projection.as_ref().map_or(0, QuantProjection::bytes)
    }

    /// The module as the no-tape kernels see it (the path of [`ElmModule`]'s f32 matrices).
    fn view(&self) -> ModuleView<'_, dyn BlockWeights> {
        ModuleView {
            block: &self.block,
            projection: self
                .projection
                .as_ref()
                .map(|p| (p.w_z.as_ref(), p.w_h.as_ref(), &p.bias)),
        }
    }
}

/// A `[0, 0]` f32 matrix: the placeholder of a tensor that lives in [`QuantElm`].
fn empty2() -> Array2<f32> {
    Array2::zeros((0, 0))
}

fn empty_layer() -> LayerWeights {
    let e1 = || ndarray::Array1::zeros(0);
    LayerWeights {
        attn_norm: e1(),
        wq: empty2(),
        wk: empty2(),
        wv: empty2(),
        wo: empty2(),
        bq: None,
        bk: None,
        bv: None,
        mlp_norm: e1(),
        w_gate: empty2(),
        w_up: empty2(),
        w_down: empty2(),
    }
}

impl ElmModel {
    pub fn dense(weights: ModelWeights) -> Self {
        ElmModel {
            weights,
            elm: None,
            quant: None,
        }
    }
    pub fn new(weights: ModelWeights, cfg: ElmConfig, module: ElmModule) -> Result<Self> {
        cfg.validate(&weights.config)?;
        Ok(ElmModel {
            weights,
            elm: Some((cfg, module)),
            quant: None,
        })
    }

    /// The inference-only quantized form: the kept layers of `dense` (quantized as loaded,
    /// e.g. by [`load_inference`]) and the module quantized to `module_format` (`None`: the
    /// format of the layer it replaced, f32 if that is f32).
    pub fn quantized(
        dense: QuantWeights,
        elm: Option<(ElmConfig, &ElmModule)>,
        module_format: Option<QFormat>,
    ) -> Result<Self> {
        let config = dense.config.clone();
        let (kept, module): (Vec<usize>, _) = match &elm {
            None => ((0..config.num_layers).collect(), None),
            Some((cfg, m)) => {
                cfg.validate(&config)?;
                let format = module_format.or(match dense.layers.get(cfg.start_layer) {
                    Some(QLayer {
                        wq: Linear::Quant(q),
                        ..
                    }) => Some(q.format()),
                    _ => None,
                });
                let kept = (0..cfg.start_layer)
                    .chain(cfg.end_layer()..config.num_layers)
                    .collect();
                (kept, Some(QuantModule::from_f32(m, format)))
            }
        };
        let mut dense = dense;
        dense.layers = std::mem::take(&mut dense.layers)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| kept.contains(i))
            .map(|(_, l)| l)
            .collect();
        ElmModel::from_quant(elm.map(|(c, _)| c), QuantElm { dense, module })
    }

    /// A quantized model from its parts: `quant.dense.layers` holds only the kept layers
    /// (all of them without `elm`) and `quant.module` is present exactly when `elm` is.
    pub fn from_quant(elm: Option<ElmConfig>, quant: QuantElm) -> Result<Self> {
        let config = quant.dense.config.clone();
        config.validate()?;
        let kept = match &elm {
            None => config.num_layers,
            Some(cfg) => {
                cfg.validate(&config)?;
                config.num_layers - cfg.num_replaced
            }
        };
        if quant.dense.layers.len() != kept {
            return Err(ElmError::shape(
                "ElmModel::from_quant",
                format!(
                    "{} dense layers for the {kept} kept layers",
                    quant.dense.layers.len()
                ),
            ));
        }
        match (&elm, &quant.module) {
            (Some(_), None) => {
                return Err(ElmError::InvalidArgument(
                    "ElmModel::from_quant: an ELM config without its module".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(ElmError::InvalidArgument(
                    "ElmModel::from_quant: a module without its ELM config".into(),
                ))
            }
            (Some(cfg), Some(m)) if cfg.injection != m.projection.is_some() => {
                return Err(ElmError::config(
                    "injection",
                    format!(
                        "{} but the module {} a projection",
                        cfg.injection,
                        if m.projection.is_some() {
                            "has"
                        } else {
                            "lacks"
                        }
                    ),
                ))
            }
            (Some(cfg), Some(m)) if cfg.block != m.block.kind() => {
                return Err(ElmError::config(
                    "block",
                    format!(
                        "{:?} but the module's block is {:?}",
                        cfg.block,
                        m.block.kind()
                    ),
                ))
            }
            _ => {}
        }
        let shell = ModelWeights {
            config: config.clone(),
            embed: empty2(),
            layers: vec![],
            final_norm: ndarray::Array1::zeros(0),
            lm_head: None,
        };
        let shell_module = |kind| ElmModule {
            block: ModuleBlock::of_layer(&empty_layer(), kind),
            projection: None,
        };
        Ok(ElmModel {
            weights: shell,
            elm: elm.map(|c| {
                let m = shell_module(c.block);
                (c, m)
            }),
            quant: Some(quant),
        })
    }

    /// Loads like [`Self::load`] with the matrices stored as `storage` says (f32: exactly
    /// [`Self::load`]; otherwise [`Self::quantized`] on [`load_inference`]'s weights).
    pub fn load_with(
        model: &Path,
        elm: Option<&Path>,
        storage: WeightStorage,
    ) -> Result<(Self, Tokenizer)> {
        if let Some(file) = elm.filter(|p| p.is_file()) {
            // A deployable file from `elm quantize`: it holds the whole model.
            return super::quant_gguf::load_quant_gguf_with(file, storage);
        }
        if storage == WeightStorage::F32 {
            return Self::load(model, elm);
        }
        let (dense, tok) = load_inference(model, storage)?;
        let module_format = match storage {
            WeightStorage::Quant(f) => Some(f),
            _ => None,
        };
        let loaded = match elm {
            None => ElmModel::quantized(dense, None, module_format)?,
            Some(dir) => {
                let (module, meta) = load_module_for(dir, &dense.config, model)?;
                ElmModel::quantized(dense, Some((meta.elm, &module)), module_format)?
            }
        };
        Ok((loaded, tok))
    }

    /// Bytes of weights held for inference (f32 tensors, or the quantized ones).
    pub fn weight_bytes(&self) -> usize {
        match &self.quant {
            Some(q) => {
                q.dense.embed.bytes()
                    + q.dense.layers.iter().map(QLayer::bytes).sum::<usize>()
                    + q.dense.final_norm.len() * 4
                    + q.dense.lm_head.as_ref().map_or(0, Linear::bytes)
                    + q.module.as_ref().map_or(0, QuantModule::bytes)
            }
            None => {
                4 * (self.weights.num_params()
                    + self.elm.as_ref().map_or(0, |(_, m)| m.num_params()))
            }
        }
    }
    /// Loads the dense model and its tokenizer and, with `elm`, the module checkpoint (which
    /// must have been cut from a model with the same config).
    ///
    /// `elm` may also be a quantized GGUF from `elm quantize` (see [`super::quant_gguf`]):
    /// that file holds the whole model, loaded with its matrices as stored (`model` is not read).
    pub fn load(model: &Path, elm: Option<&Path>) -> Result<(Self, Tokenizer)> {
        if let Some(file) = elm.filter(|p| p.is_file()) {
            return super::quant_gguf::load_quant_gguf_with(file, WeightStorage::Auto);
        }
        let (weights, tok) = load_pretrained(model)?;
        let loaded = match elm {
            None => ElmModel::dense(weights),
            Some(dir) => {
                let (module, meta) = load_module_for(dir, &weights.config, model)?;
                ElmModel::new(weights, meta.elm, module)?
            }
        };
        Ok((loaded, tok))
    }
    pub fn config(&self) -> &ModelConfig {
        &self.weights.config
    }
    /// Indices of the dense layers that are kept, in order.
    pub fn kept_layers(&self) -> Vec<usize> {
        let n = self.weights.config.num_layers;
        match &self.elm {
            None => (0..n).collect(),
            Some((c, _)) => (0..c.start_layer).chain(c.end_layer()..n).collect(),
        }
    }
}

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
    model: &'m ElmModel,
    cfg: InferenceConfig,
    /// Caches of the kept dense layers, and the scratch (RoPE table) every block uses.
    dense_kv: KvCache,
    /// Caches of the fixed-point block: one (one-step) or one per iteration (multi-step).
    fp_kv: Vec<LayerKv>,
    /// The fixed-point solves' buffers, kept across tokens.
    fp_work: FpWork,
    batch: usize,
    max_seq: usize,
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
        let dense_kv = KvCache::with_layers(mc, model.kept_layers().len(), batch, max_seq)?;
        let fp_kv = match &model.elm {
            Some((e, _)) if e.block.has_attention() => vec![LayerKv::new(mc, batch, max_seq)?],
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
    fn forward(&mut self, seqs: &[usize], tokens: &[&[u32]], prefill: bool) -> Result<Array2<f32>> {
        let x = self.forward_hidden(seqs, tokens, prefill)?;
        let t = x.dim().1;
        let last = x.index_axis(Axis(1), t - 1).to_owned();
        Ok(self.logits(last.view()))
    }

    /// Logits `[N, V]` of final hidden states `[N, C]`.
    fn logits(&self, h: ArrayView2<f32>) -> Array2<f32> {
        if let Some(q) = &self.model.quant {
            let d = &q.dense;
            let mut hn = Array2::zeros(h.raw_dim());
            rms_norm_into(h, &d.final_norm, d.config.rms_norm_eps, hn.view_mut());
            let mut logits = Array2::zeros((h.nrows(), d.config.vocab_size));
            let mut qx = QActs::default();
            linear_any_into(
                hn.view(),
                d.lm_head().as_ref(),
                None,
                logits.view_mut(),
                &mut qx,
            );
            return logits;
        }
        let w = &self.model.weights;
        let mut hn = Array2::zeros(h.raw_dim());
        rms_norm_into(h, &w.final_norm, w.config.rms_norm_eps, hn.view_mut());
        let mut logits = Array2::zeros((h.nrows(), w.config.vocab_size));
        linear_into(hn.view(), w.lm_head(), None, logits.view_mut());
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
        let mc = model.config();
        let seqs: Vec<usize> = (0..tokens.len()).collect();
        // [B, T, C]
        let (mut x, _) = match &model.quant {
            Some(q) => crate::model::embed_tokens(&q.dense, tokens)?,
            None => crate::model::embed_tokens(&model.weights, tokens)?,
        };
        let (front, back) = match &model.elm {
            None => (mc.num_layers, 0),
            Some((ec, _)) => (ec.start_layer, mc.num_layers - ec.end_layer()),
        };
        let kept = model.kept_layers();
        for (slot, &layer) in kept.iter().enumerate().take(front) {
            self.dense_layer(slot, layer, &mut x, &seqs)?;
        }
        if model.elm.is_some() {
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
        for (slot, &layer) in kept.iter().enumerate().skip(front).take(back) {
            self.dense_layer(slot, layer, &mut x, &seqs)?;
        }
        Ok(x)
    }

    /// Final norm + LM head: hidden states `[N, C]` → logits `[N, V]`.
    pub fn logits_of_hidden(&self, h: ArrayView2<f32>) -> Array2<f32> {
        self.logits(h)
    }

    /// Final hidden states `[R, T, C]` (before the final norm).
    fn forward_hidden(
        &mut self,
        seqs: &[usize],
        tokens: &[&[u32]],
        prefill: bool,
    ) -> Result<Array3<f32>> {
        let model = self.model;
        let mc = model.config();
        let (mut x, _) = match &model.quant {
            Some(q) => crate::model::embed_tokens(&q.dense, tokens)?,
            None => crate::model::embed_tokens(&model.weights, tokens)?,
        };
        let (front, back) = match &self.model.elm {
            None => (mc.num_layers, 0),
            Some((ec, _)) => (ec.start_layer, mc.num_layers - ec.end_layer()),
        };
        // Kept layers: slots 0..front are layers 0..front, slots front.. the last `back`.
        for slot in 0..front {
            self.dense_layer(slot, slot, &mut x, seqs)?;
        }
        if self.model.elm.is_some() {
            self.solve_fixed_point(&mut x, seqs, prefill)?;
        }
        for slot in front..front + back {
            self.dense_layer(slot, mc.num_layers - back + (slot - front), &mut x, seqs)?;
        }
        Ok(x)
    }

    /// Runs kept dense layer `layer` (cache `slot`) in place on `x [R, T, C]` of `seqs`.
    fn dense_layer(
        &mut self,
        slot: usize,
        layer: usize,
        x: &mut Array3<f32>,
        seqs: &[usize],
    ) -> Result<()> {
        let w = &self.model.weights;
        let lens = &mut self.fp_work.bufs.lens;
        lens.clear();
        lens.resize(seqs.len(), x.dim().1);
        let lens = &*lens;
        let KvCache {
            layers, scratch, ..
        } = &mut self.dense_kv;
        if let Some(q) = &self.model.quant {
            return block_forward_rows(
                &q.dense.layers[slot],
                &w.config,
                x.view_mut(),
                seqs,
                lens,
                &mut layers[slot],
                true,
                scratch,
            );
        }
        block_forward_rows(
            &w.layers[layer],
            &w.config,
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
    fn solve_fixed_point(
        &mut self,
        x: &mut Array3<f32>,
        seqs: &[usize],
        prefill: bool,
    ) -> Result<()> {
        let model = self.model;
        let Some((ec, module)) = model.elm.as_ref() else {
            return Err(ElmError::InvalidArgument(
                "solve_fixed_point on a dense model".into(),
            ));
        };
        let mc = &model.weights.config;
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
        } = &mut self.fp_work;
        let view: ModuleView<'_, dyn BlockWeights> =
            match model.quant.as_ref().and_then(|q| q.module.as_ref()) {
                Some(q) => q.view(),
                None => module.view(),
            };
        {
            let h2 = x
                .view()
                .into_shape_with_order((r * t, c))
                .map_err(|e| ElmError::shape("solve_fixed_point h", e.to_string()))?;
            view.injection_term_into(h2, inj, &mut scratch.qx);
            reshape2(z, r, t * c);
            if ec.injection {
                z.fill(0.0);
            } else {
                z.assign(
                    &x.view()
                        .into_shape_with_order((r, t * c))
                        .map_err(|e| ElmError::shape("solve_fixed_point h", e.to_string()))?,
                );
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

/// `a` as a `[rows, cols]` matrix, reallocated only when the shape changes.
fn reshape2(a: &mut Array2<f32>, rows: usize, cols: usize) {
    if a.dim() != (rows, cols) {
        *a = Array2::zeros((rows, cols));
    }
}

/// The buffers of a session's fixed-point solves, kept across tokens: after the first decode
/// step of a batch shape, the solve allocates nothing (see `tests/elm_decode_alloc.rs`).
struct FpWork {
    /// Built once per session (with `return_best`: the committed K/V are the best iterate's).
    solver: Box<dyn FixedPointSolver<f32>>,
    /// The solver's buffers and per-row state.
    solve: SolveWorkspace<f32>,
    /// The injection term `h·W_hᵀ + b` `[R·T, C]`, constant over a solve.
    inj: Array2<f32>,
    /// The iterate `[R, T·C]` (z⁰, then z*).
    z: Array2<f32>,
    /// `[R, T·C]`: fixed-K ping-pong buffer, then `f(z*)`.
    next: Array2<f32>,
    /// Every row active (the commit evaluation).
    all: Vec<bool>,
    bufs: EvalBufs,
}

impl FpWork {
    fn new(cfg: &InferenceConfig) -> Self {
        FpWork {
            solver: cfg.build_solver(),
            solve: SolveWorkspace::new(),
            inj: Array2::zeros((0, 0)),
            z: Array2::zeros((0, 0)),
            next: Array2::zeros((0, 0)),
            all: vec![],
            bufs: EvalBufs::default(),
        }
    }
}

/// Per-evaluation buffers of [`FpMap`] (refilled within their capacity).
#[derive(Default)]
struct EvalBufs {
    /// Evaluations so far per row (= index of the next iteration).
    evals: Vec<usize>,
    /// The cache each row's latest evaluation ran against.
    store_idx: Vec<usize>,
    lens: Vec<usize>,
    /// Rows, sequence ids, inputs, injection terms and outputs of one group of rows that
    /// share a cache, gathered (only when not every row is evaluated against one cache).
    group: Vec<usize>,
    seq_ids: Vec<usize>,
    zg: Vec<f32>,
    ig: Vec<f32>,
    ug: Vec<f32>,
}

/// The solver's view of the module: rows = sequences, state = `[T·C]`.
struct FpMap<'a> {
    module: ModuleView<'a, dyn BlockWeights>,
    cfg: &'a ModelConfig,
    /// Injection term `h·W_hᵀ + b` `[R·T, C]` (empty without injection).
    inj: ArrayView2<'a, f32>,
    /// `(R, T, C)`.
    dims: (usize, usize, usize),
    seqs: &'a [usize],
    mode: KvMode,
    /// Each evaluation leaves its K/V pending in the cache it ran against (for a given
    /// token, row `ri` visits multi-step cache `j` only at iteration `j`).
    fp_kv: &'a mut Vec<LayerKv>,
    scratch: &'a mut Scratch,
    bufs: &'a mut EvalBufs,
}

impl FpMap<'_> {
    /// Runs the module's iteration as `ec` defines it from `z` (holding z⁰: 0 with injection,
    /// `h` without): solved by `solver` until `stop` in `ws`, or `K` plain applications for a
    /// fixed-K module — `K − 1` when `then_commit` (the caller's commit evaluation is the K-th).
    /// Leaves the state rows `[R, T·C]` in `z` (`next` is scratch of the same shape); returns
    /// whether they were solved (their statuses are then `ws.rows()`).
    #[allow(clippy::too_many_arguments)] // the iteration's settings plus its buffers
    fn iterate(
        &mut self,
        ec: &ElmConfig,
        solver: &dyn FixedPointSolver<f32>,
        stop: &StopCriteria,
        then_commit: bool,
        ws: &mut SolveWorkspace<f32>,
        z: &mut Array2<f32>,
        next: &mut Array2<f32>,
    ) -> Result<bool> {
        let r = self.dims.0;
        match ec.fixed_iterations {
            Some(k) => {
                for _ in 0..k - usize::from(then_commit) {
                    self.eval_where(z.view(), |_| true, r, next.view_mut())?;
                    std::mem::swap(z, next);
                }
                Ok(false)
            }
            None => {
                solver.solve_in(ws, self, z.view(), stop)?;
                z.assign(&ws.z());
                Ok(true)
            }
        }
    }

    /// Cache that row `ri`'s next evaluation attends to; creates multi-step caches lazily
    /// as copies of the previous one (earlier tokens' latest iterate; its pending K/V are
    /// overwritten or replaced before the commit).
    fn store_for(&mut self, ri: usize) -> Result<usize> {
        match self.mode {
            KvMode::OneStep => Ok(0),
            KvMode::MultiStep => {
                let j = self.bufs.evals[ri];
                while self.fp_kv.len() <= j {
                    let last = self.fp_kv.last().cloned().ok_or_else(|| {
                        ElmError::InvalidArgument("multi-step KV: no fixed-point cache".into())
                    })?;
                    self.fp_kv.push(last);
                }
                Ok(j)
            }
        }
    }

    /// Evaluates `φ(z, h)` (`z` `[R, T·C]`) for the rows where `active(ri)`, row `ri` against
    /// cache [`Self::store_for`] (its K/V left pending there), into `out`; counts the
    /// evaluation. When every evaluated row runs against one cache (one-step KV; decode with
    /// all rows active) the rows go through the block in place, without gathering.
    fn eval_where(
        &mut self,
        z: ArrayView2<f32>,
        active: impl Fn(usize) -> bool,
        n_rows: usize,
        mut out: ArrayViewMut2<f32>,
    ) -> Result<()> {
        let (r, t, c) = self.dims;
        let shape_err = |e: ndarray::ShapeError| ElmError::shape("FpMap", e.to_string());
        self.bufs.store_idx.clear();
        let mut stores = (usize::MAX, 0usize);
        for ri in 0..n_rows {
            let s = if active(ri) {
                self.store_for(ri)?
            } else {
                usize::MAX
            };
            if s != usize::MAX {
                stores = (stores.0.min(s), stores.1.max(s));
            }
            self.bufs.store_idx.push(s);
        }
        if stores.0 == usize::MAX {
            return Ok(());
        }
        let every_row = (0..r).all(&active);
        if every_row && stores.0 == stores.1 {
            let z3 = z.into_shape_with_order((r, t, c)).map_err(shape_err)?;
            let o3 = out
                .view_mut()
                .into_shape_with_order((r, t, c))
                .map_err(shape_err)?;
            self.module.apply_cached_into(
                self.cfg,
                z3,
                self.inj,
                self.seqs,
                &mut self.fp_kv[stores.0],
                self.scratch,
                &mut self.bufs.lens,
                o3,
            )?;
            self.bufs.evals.iter_mut().for_each(|e| *e += 1);
            return Ok(());
        }
        let injected = self.module.projection.is_some();
        let (tc, b) = (t * c, &mut *self.bufs);
        for store in stores.0..=stores.1 {
            b.group.clear();
            b.group
                .extend((0..r).filter(|&ri| b.store_idx[ri] == store));
            if b.group.is_empty() {
                continue;
            }
            let n = b.group.len();
            b.seq_ids.clear();
            b.zg.clear();
            b.ig.clear();
            for &ri in &b.group {
                b.seq_ids.push(self.seqs[ri]);
                b.zg.extend(z.row(ri).iter());
                if injected {
                    b.ig.extend(self.inj.slice(s![ri * t..(ri + 1) * t, ..]).iter());
                }
            }
            b.ug.clear();
            b.ug.resize(n * tc, 0.0);
            let zg = ArrayView3::from_shape((n, t, c), &b.zg).map_err(shape_err)?;
            let ig = ArrayView2::from_shape((if injected { n * t } else { 0 }, c), &b.ig)
                .map_err(shape_err)?;
            let ug = ndarray::ArrayViewMut3::from_shape((n, t, c), &mut b.ug).map_err(shape_err)?;
            self.module.apply_cached_into(
                self.cfg,
                zg,
                ig,
                &b.seq_ids,
                &mut self.fp_kv[store],
                self.scratch,
                &mut b.lens,
                ug,
            )?;
            for (gi, &ri) in b.group.iter().enumerate() {
                out.row_mut(ri)
                    .assign(&ArrayView1::from(&b.ug[gi * tc..(gi + 1) * tc]));
                b.evals[ri] += 1;
            }
        }
        Ok(())
    }
}

impl FixedPointMap<f32> for FpMap<'_> {
    fn dim(&self) -> usize {
        self.dims.1 * self.dims.2
    }
    fn eval(
        &mut self,
        z: ArrayView2<f32>,
        active: &[bool],
        out: ArrayViewMut2<f32>,
    ) -> std::result::Result<(), MapError> {
        Ok(self.eval_where(z, |ri| active[ri], active.len(), out)?)
    }
}

/// The module's output state for whole sequences `h` `[B, T, C]` at positions `0..T` (nothing
/// cached before them), each sequence one solver row: `z*` solved by `solver` until `stop`, or
/// `K` applications for a fixed-K module (see [`ElmConfig::fixed_iterations`]).
pub fn solve_sequences(
    ec: &ElmConfig,
    module: &ElmModule,
    cfg: &ModelConfig,
    h: ArrayView3<f32>,
    solver: &SolverConfig,
    stop: &StopCriteria,
) -> Result<Array3<f32>> {
    let (b, t, c) = h.dim();
    let (cache, mut scratch) = fresh_cache(cfg, b, t)?;
    let mut caches = vec![cache];
    let seqs: Vec<usize> = (0..b).collect();
    let view = module.view();
    let h2 = h.as_standard_layout();
    let mut inj = Array2::zeros((0, 0));
    view.injection_term_into(
        h2.view()
            .into_shape_with_order((b * t, c))
            .map_err(|e| ElmError::shape("solve_sequences h", e.to_string()))?,
        &mut inj,
        &mut scratch.qx,
    );
    let mut z = if ec.injection {
        Array2::zeros((b, t * c))
    } else {
        h2.view()
            .into_shape_with_order((b, t * c))
            .map_err(|e| ElmError::shape("solve_sequences h", e.to_string()))?
            .to_owned()
    };
    let mut next = Array2::zeros((b, t * c));
    let mut bufs = EvalBufs {
        evals: vec![0; b],
        ..EvalBufs::default()
    };
    let mut map = FpMap {
        module: view,
        cfg,
        inj: inj.view(),
        dims: (b, t, c),
        seqs: &seqs,
        mode: KvMode::OneStep,
        fp_kv: &mut caches,
        scratch: &mut scratch,
        bufs: &mut bufs,
    };
    let mut ws = SolveWorkspace::new();
    map.iterate(
        ec,
        solver.build().as_ref(),
        stop,
        false,
        &mut ws,
        &mut z,
        &mut next,
    )?;
    z.into_shape_with_order((b, t, c))
        .map_err(|e| ElmError::shape("solve_sequences z", e.to_string()))
}

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
struct SessionDecoder<'s, 'm> {
    session: RefCell<Option<&'s mut ElmSession<'m>>>,
    vocab_size: usize,
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
    model: &'m ElmModel,
    cfg: InferenceConfig,
    record: RefCell<SessionRecord>,
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

    fn take_stats(&self, session: &mut ElmSession<'m>) {
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
