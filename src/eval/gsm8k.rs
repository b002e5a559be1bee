//! GSM8K for a dense model or an ELM: greedy generation in the chat template scored by the
//! harness's strict and flexible exact match ([`super::answer`]), and the teacher-forced NLL
//! of the reference solutions ([`super::nll`]). Every figure is kept per item so that
//! [`super::stats`] can put an interval on it and pair two models on the same problems.

use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use crate::data::{qa_prompt, QaLayout};
use crate::data::{tokenize_example, Example, QaExample};
use crate::equilibrium::infer::{
    generate_greedy_until, ElmModel, ElmSession, FpStat, InferenceConfig,
};
use crate::error::{ElmError, Result};
use crate::formats::tokenizer::Tokenizer;

use super::answer::{score_response, AnswerScore};
use super::nll::{each_batch, teacher_forced_nll, NllRun, ScoredSequence};
use super::solver_summary::SolverSummary;
use super::stats::ItemScore;

/// One evaluated problem.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sample {
    /// Index of the problem in its split.
    pub id: String,
    pub question: String,
    pub reference: String,
    pub prediction: String,
    pub score: AnswerScore,
}

/// GSM8K evaluation settings.
#[derive(Clone, Debug)]
pub struct Gsm8kOptions {
    pub batch: usize,
    pub max_new_tokens: usize,
    pub inference: InferenceConfig,
}

/// GSM8K exact match (greedy generation), both harness extractions, per item.
#[derive(Clone, Debug, Serialize)]
pub struct Gsm8kResult {
    pub n: usize,
    /// Per problem: `value` 1 when the strict extraction matches, weight 1.
    pub strict_items: Vec<ItemScore>,
    /// Per problem: `value` 1 when the flexible extraction matches, weight 1.
    pub flexible_items: Vec<ItemScore>,
    #[serde(flatten)]
    pub run: GenerationRun,
    pub kv_bytes_per_sequence: usize,
    pub samples: Vec<Sample>,
}

/// What a generation task's greedy decoding cost (its JSON keys sit beside the task's own).
#[derive(Clone, Debug, Serialize)]
pub struct GenerationRun {
    pub generated_tokens: usize,
    pub seconds: f64,
    /// Generated tokens per second.
    pub tok_s: f64,
    pub solver: SolverSummary,
}

impl GenerationRun {
    /// `generated` tokens since `start`, with the fixed-point statistics of every decoded token.
    pub fn measured(generated: usize, start: Instant, stats: &[FpStat], model: &ElmModel) -> Self {
        let seconds = start.elapsed().as_secs_f64();
        GenerationRun {
            generated_tokens: generated,
            seconds,
            tok_s: generated as f64 / seconds.max(1e-9),
            solver: SolverSummary::from_stats(stats, model.kept_layers().len()),
        }
    }
}

/// What [`greedy_batch`] produced.
pub struct GreedyBatch {
    /// Each prompt's completion, decoded with its stop tokens dropped (a stop text stays: each
    /// task cuts its answer its own way).
    pub texts: Vec<String>,
    /// New tokens per prompt (stop token included).
    pub new_tokens: Vec<usize>,
    /// Fixed-point statistics of every decoded token.
    pub decode_stats: Vec<FpStat>,
    /// K/V bytes the session allocated.
    pub kv_bytes: usize,
}

/// What lm-evaluation-harness's `gsm8k` task generates `until` besides the end of turn: a
/// response that starts the next few-shot question is over.
pub const GSM8K_STOP_STRINGS: [&str; 1] = ["Question:"];

/// Greedy decoding of one batch of prompts in a fresh session sized for them (shared by the
/// generation tasks); a sequence stops at its first end-of-turn token ([`stop_ids`]) or at
/// one of `stop_strings`.
pub fn greedy_batch(
    model: &ElmModel,
    tok: &Tokenizer,
    inference: &InferenceConfig,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    stop_strings: &[&str],
) -> Result<GreedyBatch> {
    let stops = stop_ids(tok);
    let max_prompt = prompts.iter().map(Vec::len).max().unwrap_or(1);
    let mut session = ElmSession::new(
        model,
        inference.clone(),
        prompts.len(),
        max_prompt + max_new_tokens + 1,
    )?;
    let detok = |ids: &[u32]| tok.decode(ids);
    let tokens = generate_greedy_until(
        &mut session,
        prompts,
        max_new_tokens,
        &stops,
        stop_strings,
        Some(&detok),
    )?;
    let new_tokens = tokens.iter().map(Vec::len).collect();
    let texts = tokens
        .into_iter()
        .map(|out| {
            let kept: Vec<u32> = out.into_iter().filter(|t| !stops.contains(t)).collect();
            tok.decode(&kept)
        })
        .collect::<Result<_>>()?;
    Ok(GreedyBatch {
        texts,
        new_tokens,
        decode_stats: std::mem::take(&mut session.decode_stats),
        kv_bytes: session.kv_bytes(),
    })
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

/// How [`generate_in_batches`] runs: prompts per batch, new tokens per prompt, and the texts
/// that end a completion.
#[derive(Clone, Copy, Debug)]
pub struct GenerationLimits<'a> {
    pub batch: usize,
    pub max_new_tokens: usize,
    pub stop_strings: &'a [&'a str],
}

/// What [`generate_in_batches`] measured over all its batches.
pub struct GenerationTotals {
    pub run: GenerationRun,
    /// K/V bytes per sequence of the last batch's session.
    pub kv_bytes_per_sequence: usize,
}

/// The generation tasks' one loop: greedy completions of `items`, `limits.batch` at a time.
/// `prompt(item)` tokenises each prompt; `take(item, text)` receives every completion in order
/// (stop tokens dropped, a stop text kept: each task cuts its answer its own way);
/// `on_progress(done)` runs after each batch. Batches are independent sessions, so they run
/// concurrently where teacher-forced scoring's do ([`each_batch`]): a batch-8 decode step is
/// too small to split over the cores, two batches are not.
#[allow(clippy::too_many_arguments)]
pub fn generate_in_batches<I>(
    model: &ElmModel,
    tok: &Tokenizer,
    inference: &InferenceConfig,
    items: &[I],
    limits: GenerationLimits<'_>,
    prompt: impl Fn(&I) -> Result<Vec<u32>>,
    mut take: impl FnMut(&I, String) -> Result<()>,
    on_progress: &mut (impl FnMut(usize) + Send),
) -> Result<GenerationTotals> {
    let start = Instant::now();
    let batch = limits.batch.max(1);
    let prompts = items.iter().map(&prompt).collect::<Result<Vec<_>>>()?;
    let chunks: Vec<&[Vec<u32>]> = prompts.chunks(batch).collect();
    let batches = each_batch(&chunks, on_progress, |prompts: &[Vec<u32>]| {
        greedy_batch(
            model,
            tok,
            inference,
            prompts,
            limits.max_new_tokens,
            limits.stop_strings,
        )
    });
    let (mut stats, mut generated, mut kv_bytes_per_sequence) = (vec![], 0, 0);
    for (chunk, done) in items.chunks(batch).zip(batches) {
        let done = done?;
        kv_bytes_per_sequence = done.kv_bytes / chunk.len();
        stats.extend(done.decode_stats);
        generated += done.new_tokens.iter().sum::<usize>();
        for (item, text) in chunk.iter().zip(done.texts) {
            take(item, text)?;
        }
    }
    Ok(GenerationTotals {
        run: GenerationRun::measured(generated, start, &stats, model),
        kv_bytes_per_sequence,
    })
}

/// Checks the options and that every example has an id (`ids.len() == examples.len()`).
fn check(ids: &[String], examples: &[QaExample], batch: usize) -> Result<()> {
    if batch == 0 {
        return Err(ElmError::config("batch", "must be >= 1"));
    }
    if examples.is_empty() {
        return Err(ElmError::InvalidArgument(
            "no GSM8K problems to evaluate".into(),
        ));
    }
    if ids.len() != examples.len() {
        return Err(ElmError::InvalidArgument(format!(
            "{} ids for {} problems",
            ids.len(),
            examples.len()
        )));
    }
    Ok(())
}

/// Greedy generation on `examples` (ids `ids`, e.g. their split indices) with `model` (dense
/// or ELM) in the chat template, stopping at the end of the assistant turn; scores both
/// harness extractions. `on_progress(done)` after each batch.
pub fn eval_gsm8k(
    model: &ElmModel,
    tok: &Tokenizer,
    ids: &[String],
    examples: &[QaExample],
    opts: &Gsm8kOptions,
    mut on_progress: impl FnMut(usize) + Send,
) -> Result<Gsm8kResult> {
    check(ids, examples, opts.batch)?;
    let mut samples = Vec::with_capacity(examples.len());
    let indexed: Vec<(&String, &QaExample)> = ids.iter().zip(examples).collect();
    let totals = generate_in_batches(
        model,
        tok,
        &opts.inference,
        &indexed,
        GenerationLimits {
            batch: opts.batch,
            max_new_tokens: opts.max_new_tokens,
            stop_strings: &GSM8K_STOP_STRINGS,
        },
        |(_, e)| tok.encode(&qa_prompt(tok, &e.question), false),
        |(id, e), mut prediction| {
            // As the harness: the response ends before its stop text.
            if let Some(end) = GSM8K_STOP_STRINGS
                .iter()
                .filter_map(|s| prediction.find(s))
                .min()
            {
                prediction.truncate(end);
            }
            samples.push(Sample {
                id: (*id).clone(),
                question: e.question.clone(),
                reference: e.answer.clone(),
                score: score_response(&prediction, &e.answer),
                prediction,
            });
            Ok(())
        },
        &mut on_progress,
    )?;
    let item = |s: &Sample, correct: bool| ItemScore {
        id: s.id.clone(),
        value: f64::from(u8::from(correct)),
        weight: 1.0,
    };
    Ok(Gsm8kResult {
        n: samples.len(),
        strict_items: samples
            .iter()
            .map(|s| item(s, s.score.strict_correct))
            .collect(),
        flexible_items: samples
            .iter()
            .map(|s| item(s, s.score.flexible_correct))
            .collect(),
        run: totals.run,
        kv_bytes_per_sequence: totals.kv_bytes_per_sequence,
        samples,
    })
}

/// Teacher-forced NLL of each reference solution given its question, in the layout the model
/// is tuned with ([`QaLayout`]: `prompt ++ answer`, split as
/// lm-evaluation-harness splits a continuation: exactly the tokens `elm train` puts its loss
/// on; see [`crate::data::tokenize_example`]).
pub fn answer_nll(
    model: &ElmModel,
    tok: &Tokenizer,
    ids: &[String],
    examples: &[QaExample],
    inference: &InferenceConfig,
    batch: usize,
    on_progress: impl FnMut(usize) + Send,
) -> Result<NllRun> {
    check(ids, examples, batch)?;
    let layout = QaLayout::of(tok);
    let seqs = ids
        .iter()
        .zip(examples)
        .map(|(id, e)| {
            let seq = tokenize_example(
                &Example::Qa(e.clone()),
                usize::MAX,
                &|q: &str| layout.prompt(tok, q),
                &|a: &str| layout.answer(a),
                &|text: &str| tok.encode(text, false),
            )?;
            let first = seq.loss_mask.iter().position(|&m| m).ok_or_else(|| {
                ElmError::InvalidArgument(format!("problem {id}: answer has no tokens"))
            })?;
            Ok(ScoredSequence {
                id: id.clone(),
                tokens: seq.tokens,
                first_scored: first,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    teacher_forced_nll(model, inference, &seqs, batch, on_progress)
}
