//! GSM8K: greedy generation in the chat template, answer extraction, exact match; and
//! perplexity of the reference answers (teacher forcing), for a dense model or an ELM.

use std::time::Instant;

use serde::Serialize;

use crate::elm::data::QaExample;
use crate::elm::infer::{generate_greedy, ElmModel, ElmSession, FpStat, InferenceConfig};
use crate::error::Result;
use crate::io::tokenizer::Tokenizer;

use super::answer::{exact_match, extract_answer};

/// Fixed-point statistics over decode tokens.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SolverSummary {
    pub tokens: usize,
    /// Mean fixed-point block evaluations per decoded token (incl. the commit evaluation).
    pub mean_iterations: f64,
    pub max_iterations: usize,
    /// Mean decoder-block evaluations per decoded token: kept dense layers + fixed-point ones.
    pub layer_evals_per_token: f64,
    pub mean_residual: f64,
    /// Fraction of tokens whose solve converged within `max_iter`.
    pub converged_frac: f64,
}

impl SolverSummary {
    /// Summarises `stats` for a model with `kept` dense layers.
    pub fn from_stats(stats: &[FpStat], kept: usize) -> Self {
        if stats.is_empty() {
            return SolverSummary {
                layer_evals_per_token: kept as f64,
                ..Default::default()
            };
        }
        let n = stats.len() as f64;
        let mean_it = stats.iter().map(|s| s.iterations as f64).sum::<f64>() / n;
        SolverSummary {
            tokens: stats.len(),
            mean_iterations: mean_it,
            max_iterations: stats.iter().map(|s| s.iterations).max().unwrap_or(0),
            layer_evals_per_token: kept as f64 + mean_it,
            mean_residual: stats.iter().map(|s| s.residual).sum::<f64>() / n,
            converged_frac: stats
                .iter()
                .filter(|s| s.status == crate::solver::RowStatus::Converged)
                .count() as f64
                / n,
        }
    }
}

/// One evaluated problem.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub question: String,
    pub reference: Option<String>,
    pub prediction: String,
    pub extracted: Option<String>,
    pub correct: bool,
}

/// GSM8K evaluation settings.
#[derive(Clone, Debug)]
pub struct Gsm8kOptions {
    pub batch: usize,
    pub max_new_tokens: usize,
    pub inference: InferenceConfig,
    /// Also compute the perplexity of the reference answers.
    pub perplexity: bool,
}

/// GSM8K results.
#[derive(Clone, Debug, Serialize)]
pub struct Gsm8kResult {
    pub n: usize,
    pub correct: usize,
    pub accuracy: f64,
    /// `exp(mean NLL)` of the reference answer tokens given the chat prompt.
    pub answer_perplexity: Option<f64>,
    pub generated_tokens: usize,
    pub seconds: f64,
    pub tok_s: f64,
    pub solver: SolverSummary,
    pub kv_bytes_per_sequence: usize,
    pub samples: Vec<Sample>,
}

/// Chat prompt of a question (user turn + generation prompt).
pub fn chat_prompt(tok: &Tokenizer, question: &str) -> String {
    tok.apply_chat_template(&[("user", question)], true)
}

/// Token ids that end an assistant turn: EOS and `<|im_end|>` when present.
pub fn stop_ids(tok: &Tokenizer) -> Vec<u32> {
    let mut v: Vec<u32> = tok.eos_id().into_iter().collect();
    if let Some(id) = tok.token_to_id("<|im_end|>") {
        if !v.contains(&id) {
            v.push(id);
        }
    }
    v
}

/// Runs GSM8K on `examples` with `model` (dense or ELM); `on_progress(done)` is called after
/// each batch with the number of examples finished so far.
pub fn eval_gsm8k(
    model: &ElmModel,
    tok: &Tokenizer,
    examples: &[QaExample],
    opts: &Gsm8kOptions,
    mut on_progress: impl FnMut(usize),
) -> Result<Gsm8kResult> {
    let stops = stop_ids(tok);
    let start = Instant::now();
    let mut samples = Vec::with_capacity(examples.len());
    let mut stats = Vec::new();
    let mut generated = 0;
    let mut kv_bytes_per_sequence = 0;
    for chunk in examples.chunks(opts.batch.max(1)) {
        let prompts = chunk
            .iter()
            .map(|e| tok.encode(&chat_prompt(tok, &e.question), false))
            .collect::<Result<Vec<_>>>()?;
        let max_prompt = prompts.iter().map(|p| p.len()).max().unwrap_or(1);
        let mut session = ElmSession::new(
            model,
            opts.inference.clone(),
            prompts.len(),
            max_prompt + opts.max_new_tokens + 1,
        )?;
        let outs = generate_greedy(&mut session, &prompts, opts.max_new_tokens, &stops)?;
        kv_bytes_per_sequence = session.kv_bytes() / prompts.len();
        stats.extend(session.decode_stats.iter().cloned());
        for (e, out) in chunk.iter().zip(outs) {
            generated += out.len();
            let ids: Vec<u32> = out.into_iter().filter(|t| !stops.contains(t)).collect();
            let prediction = tok.decode(&ids)?;
            samples.push(Sample {
                question: e.question.clone(),
                reference: extract_answer(&e.answer),
                extracted: extract_answer(&prediction),
                correct: exact_match(&prediction, &e.answer),
                prediction,
            });
        }
        on_progress(samples.len());
    }
    let seconds = start.elapsed().as_secs_f64();
    let answer_perplexity = if opts.perplexity {
        Some(answer_perplexity(model, tok, examples, &opts.inference)?)
    } else {
        None
    };
    let correct = samples.iter().filter(|s| s.correct).count();
    Ok(Gsm8kResult {
        n: samples.len(),
        correct,
        accuracy: correct as f64 / samples.len().max(1) as f64,
        answer_perplexity,
        generated_tokens: generated,
        seconds,
        tok_s: generated as f64 / seconds.max(1e-9),
        solver: SolverSummary::from_stats(&stats, model.kept_layers().len()),
        kv_bytes_per_sequence,
        samples,
    })
}

/// `exp(mean NLL)` of the answer tokens (answer + `<|im_end|>\n`) given the chat prompt.
pub fn answer_perplexity(
    model: &ElmModel,
    tok: &Tokenizer,
    examples: &[QaExample],
    inference: &InferenceConfig,
) -> Result<f64> {
    let (mut nll, mut count) = (0.0f64, 0usize);
    for e in examples {
        let prompt = tok.encode(&chat_prompt(tok, &e.question), false)?;
        let answer = tok.encode(&format!("{}<|im_end|>\n", e.answer), false)?;
        let mut all = prompt.clone();
        all.extend(&answer);
        let mut s = ElmSession::new(model, inference.clone(), 1, all.len())?;
        let logits = s.prefill_all_logits(0, &all)?;
        for (i, &tgt) in answer.iter().enumerate() {
            let row = logits.row(prompt.len() + i - 1);
            let m = row.fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let lse = m as f64
                + row
                    .iter()
                    .map(|&v| ((v - m) as f64).exp())
                    .sum::<f64>()
                    .ln();
            nll += lse - row[tgt as usize] as f64;
            count += 1;
        }
    }
    Ok((nll / count.max(1) as f64).exp())
}
