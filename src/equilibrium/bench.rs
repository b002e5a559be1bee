//! The comparative bench behind `elm bench --weights a,b,.. [--elm CKPT]`: each configuration
//! (dense or ELM × weight storage) as a typed run — speed, resident bytes, peak RSS, KV bytes.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::model::bench::{
    check_bench_len, embedding_params, kv_bytes_per_token, run_bench, BenchHeader, BenchRun,
};
use crate::model::generate::argmax;
use crate::model::{DecoderWeights, Transformer, WeightStorage};

use super::accounting::{dense_params, param_report};
use super::inference_config::{InferenceConfig, KvMode};
use super::model::ElmModel;
use super::session::ElmSession;

/// One ELM configuration of a comparative bench (the dense ones are [`BenchRun`]s).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ElmBenchRun {
    /// `model` is always `elm` (the dense runs say `dense`), so one list holds both.
    #[serde(flatten)]
    pub header: BenchHeader,
    pub prefill_tokens: usize,
    /// Best of three prefills of one `prefill_tokens` prompt.
    pub prefill_tok_s: f64,
    pub decode_steps: usize,
    /// Best-step and mean decode tok/s at batch 1 and 8 (prefill excluded).
    pub decode_b1_tok_s: f64,
    pub decode_b1_mean_tok_s: f64,
    pub decode_b8_tok_s: f64,
    pub decode_b8_mean_tok_s: f64,
    /// Block evaluations per decoded token: kept dense layers + fixed-point evaluations
    /// (the committing one included).
    pub block_evals_per_token_b1: f64,
    pub block_evals_per_token_b8: f64,
    pub solver: String,
    pub abs_tol: f64,
    pub max_iter: usize,
    /// The ELM against its dense parent in alternating rounds, batch 1 then 8 (`elm bench
    /// --rounds`; absent with 0 rounds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versus_dense: Vec<VersusDense>,
}

/// The ELM against its dense parent in wall clock ([`versus_dense`]): both models in one
/// process, decoded by the same loop ([`ElmSession`]) in alternating rounds, so a slow minute
/// of the machine falls on both sides and the ratio is read per round.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VersusDense {
    pub batch: usize,
    pub decode_steps: usize,
    /// Mean decode tok/s of each round (tokens over the summed step times: every step counts,
    /// since an ELM's steps differ in iterations). Even rounds run the dense model first, odd
    /// rounds the ELM.
    pub dense_tok_s: Vec<f64>,
    pub elm_tok_s: Vec<f64>,
    /// ELM / dense tok/s per round: median, lowest and highest.
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// Block evaluations per decoded token over all rounds (the dense model: its layers).
    pub dense_block_evals_per_token: f64,
    pub elm_block_evals_per_token: f64,
}

/// One decode measurement of [`decode_run`].
struct DecodeRun {
    /// From the fastest step.
    best_tok_s: f64,
    /// Tokens over the summed step times.
    mean_tok_s: f64,
    /// Block evaluations per decoded token: kept dense layers + fixed-point evaluations.
    block_evals: f64,
}

/// Deterministic, vocabulary-spread tokens: no tokenizer needed, the same on every run.
fn bench_tokens(vocab: usize, n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % vocab) as u32)
        .collect()
}

/// `decode_steps` greedy steps of `batch` sequences after a 16-token prompt each, timed per
/// step (prefill excluded).
fn decode_run(
    model: &ElmModel,
    cfg: &InferenceConfig,
    batch: usize,
    decode_steps: usize,
) -> Result<DecodeRun> {
    let vocab = model.config().vocab_size;
    let mut s = ElmSession::new(model, cfg.clone(), batch, 16 + decode_steps + 1)?;
    let prompts: Vec<Vec<u32>> = (0..batch).map(|b| bench_tokens(vocab, 16, b + 1)).collect();
    let mut logits = s.prefill(&prompts)?;
    s.decode_stats.clear();
    let mut times = Vec::with_capacity(decode_steps);
    for _ in 0..decode_steps {
        let next: Vec<u32> = (0..batch).map(|b| argmax(logits.row(b)) as u32).collect();
        let t = Instant::now();
        logits = s.decode_step(&next)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let fp: f64 = s
        .decode_stats
        .iter()
        .map(|st| st.iterations as f64)
        .sum::<f64>()
        / s.decode_stats.len().max(1) as f64;
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    let total: f64 = times.iter().sum();
    Ok(DecodeRun {
        best_tok_s: batch as f64 / best,
        mean_tok_s: (batch * decode_steps) as f64 / total,
        block_evals: model.kept_layers().len() as f64 + fp,
    })
}

/// `elm` against `dense` (the same model without its module, e.g. `ElmModel::load_with(path,
/// None, storage)`) in `rounds` alternating rounds of `decode_steps` steps at `batch`, after
/// one untimed warm-up run of each.
pub fn versus_dense(
    dense: &ElmModel,
    elm: &ElmModel,
    cfg: &InferenceConfig,
    batch: usize,
    decode_steps: usize,
    rounds: usize,
) -> Result<VersusDense> {
    if dense.elm_config().is_some() || elm.elm_config().is_none() {
        return Err(crate::error::ElmError::InvalidArgument(
            "versus_dense takes a dense model and an ELM".into(),
        ));
    }
    check_bench_len(elm.config(), 16, decode_steps)?;
    for m in [dense, elm] {
        decode_run(m, cfg, batch, decode_steps.min(8))?;
    }
    let (mut d, mut e) = (vec![], vec![]);
    let (mut d_evals, mut e_evals) = (0.0, 0.0);
    for round in 0..rounds {
        let one = |m: &ElmModel| decode_run(m, cfg, batch, decode_steps);
        let (dr, er) = if round % 2 == 0 {
            let dr = one(dense)?;
            (dr, one(elm)?)
        } else {
            let er = one(elm)?;
            (one(dense)?, er)
        };
        d.push(dr.mean_tok_s);
        e.push(er.mean_tok_s);
        d_evals += dr.block_evals / rounds as f64;
        e_evals += er.block_evals / rounds as f64;
    }
    let mut ratios: Vec<f64> = e.iter().zip(&d).map(|(e, d)| e / d).collect();
    ratios.sort_by(f64::total_cmp);
    let median = match ratios.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => ratios[n / 2],
        n => (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0,
    };
    Ok(VersusDense {
        batch,
        decode_steps,
        dense_tok_s: d,
        elm_tok_s: e,
        ratio_median: median,
        ratio_min: ratios.first().copied().unwrap_or(f64::NAN),
        ratio_max: ratios.last().copied().unwrap_or(f64::NAN),
        dense_block_evals_per_token: d_evals,
        elm_block_evals_per_token: e_evals,
    })
}

/// One configuration of a comparative bench.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BenchEntry {
    Elm(ElmBenchRun),
    Dense(BenchRun),
}

/// What `elm bench` prints for several configurations.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchSuite {
    /// CPU and cores the figures were measured on.
    pub machine: String,
    /// Threads of the decode team.
    pub threads: usize,
    pub runs: Vec<BenchEntry>,
}

/// One dense configuration: [`run_bench`]; `progress` hears each stage's name.
pub fn bench_dense<W: DecoderWeights>(
    model: &Transformer<W>,
    weights_label: &str,
    prompt_len: usize,
    decode_steps: usize,
    kv_context: usize,
    progress: impl FnMut(&str),
) -> Result<BenchRun> {
    crate::model::check_context(model.config(), kv_context, "the KV context")?;
    let report = run_bench(model, prompt_len, decode_steps, progress)?;
    let kv_bytes_at_context = model.new_cache(1, kv_context)?.bytes();
    Ok(BenchRun {
        header: BenchHeader {
            model: "dense".to_string(),
            weights: weights_label.to_string(),
            resident_weight_bytes: model.weights.weight_bytes(),
            embedding_bytes: model.weights.embedding_bytes(),
            embedding_params: embedding_params(model.config()),
            params: dense_params(model.config()),
            memory: None,
            kv_bytes_per_token: kv_bytes_per_token(model.config(), model.weights.layers().len()),
            kv_context_tokens: kv_context,
            kv_bytes_at_context,
            kv_bytes_at_context_multi_step: None,
        },
        report,
    })
}

/// ELM decode/prefill speed and memory on an [`ElmSession`] with `cfg`: best-step and mean
/// decode tok/s at batch 1 and 8, prefill tok/s of one `prompt_len` prompt, block evaluations
/// per token, and the KV bytes one sequence of `kv_context` tokens allocates in either KV
/// mode. `storage` is what the model was loaded as (its label in the report).
pub fn bench_elm(
    model: &ElmModel,
    cfg: &InferenceConfig,
    storage: WeightStorage,
    prompt_len: usize,
    decode_steps: usize,
    kv_context: usize,
    mut progress: impl FnMut(&str),
) -> Result<ElmBenchRun> {
    check_bench_len(model.config(), prompt_len, decode_steps)?;
    let vocab = model.config().vocab_size;
    let toks = |n: usize, salt: usize| bench_tokens(vocab, n, salt);
    let next_token = |row: ndarray::ArrayView1<f32>| argmax(row) as u32;
    progress("prefill");
    let mut prefill_best = f64::INFINITY;
    for _ in 0..3 {
        let mut s = ElmSession::new(model, cfg.clone(), 1, prompt_len)?;
        let t = Instant::now();
        std::hint::black_box(s.prefill(&[toks(prompt_len, 0)])?);
        prefill_best = prefill_best.min(t.elapsed().as_secs_f64());
    }
    progress("decode");
    let b1 = decode_run(model, cfg, 1, decode_steps)?;
    let b8 = decode_run(model, cfg, 8, decode_steps)?;
    let kept = model.kept_layers().len() + 1; // one-step: one fixed-point cache
                                              // Multi-step KV adds a fixed-point cache the first time the solver reaches each iteration:
                                              // the bytes are read after a short generation, not at creation.
    let kv_at_context = |kv_mode| -> Result<usize> {
        let mode_cfg = InferenceConfig {
            kv_mode,
            ..cfg.clone()
        };
        let mut s = ElmSession::new(model, mode_cfg, 1, kv_context)?;
        let mut logits = s.prefill(&[toks(16.min(kv_context), 5)])?;
        for _ in 0..8.min(kv_context.saturating_sub(16)) {
            logits = s.decode_step(&[next_token(logits.row(0))])?;
        }
        Ok(s.kv_bytes())
    };
    Ok(ElmBenchRun {
        header: BenchHeader {
            model: "elm".to_string(),
            weights: storage.to_string(),
            resident_weight_bytes: model.weight_bytes(),
            embedding_bytes: model.embedding_bytes(),
            embedding_params: embedding_params(model.config()),
            params: model.elm_config().map_or_else(
                || dense_params(model.config()),
                |ec| param_report(model.config(), ec).elm_total,
            ),
            memory: None,
            kv_bytes_per_token: kv_bytes_per_token(model.config(), kept),
            kv_context_tokens: kv_context,
            kv_bytes_at_context: kv_at_context(KvMode::OneStep)?,
            kv_bytes_at_context_multi_step: Some(kv_at_context(KvMode::MultiStep)?),
        },
        prefill_tokens: prompt_len,
        prefill_tok_s: prompt_len as f64 / prefill_best,
        decode_steps,
        decode_b1_tok_s: b1.best_tok_s,
        decode_b1_mean_tok_s: b1.mean_tok_s,
        decode_b8_tok_s: b8.best_tok_s,
        decode_b8_mean_tok_s: b8.mean_tok_s,
        block_evals_per_token_b1: b1.block_evals,
        block_evals_per_token_b8: b8.block_evals,
        solver: cfg.solver.name().to_string(),
        abs_tol: cfg.stop.abs_tol,
        max_iter: cfg.stop.max_iter,
        versus_dense: vec![],
    })
}
