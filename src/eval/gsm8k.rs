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
    /// The completion reached `max_new_tokens` before an end of turn or a stop text: its
    /// answer was cut off by the generation budget, not finished.
    #[serde(default)]
    pub truncated: bool,
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
    /// Per problem: `value` 1 when the generation budget cut the completion off.
    pub truncated_items: Vec<ItemScore>,
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
    /// Per prompt: cut off at `max_new_tokens`, with neither an end-of-turn token nor a stop
    /// text in what it generated.
    pub truncated: Vec<bool>,
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
    let ended = |out: &[u32]| out.last().is_some_and(|t| stops.contains(t));
    let mut truncated = Vec::with_capacity(tokens.len());
    let texts = tokens
        .into_iter()
        .map(|out| {
            let at_budget = out.len() >= max_new_tokens && !ended(&out);
            let kept: Vec<u32> = out.into_iter().filter(|t| !stops.contains(t)).collect();
            let text = tok.decode(&kept)?;
            truncated.push(at_budget && !stop_strings.iter().any(|s| text.contains(s)));
            Ok(text)
        })
        .collect::<Result<_>>()?;
    Ok(GreedyBatch {
        texts,
        new_tokens,
        truncated,
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
/// (stop tokens dropped, a stop text kept: each task cuts its answer its own way) and whether
/// the budget cut it off ([`GreedyBatch::truncated`]);
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
    mut take: impl FnMut(&I, String, bool) -> Result<()>,
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
        for ((item, text), cut) in chunk.iter().zip(done.texts).zip(done.truncated) {
            take(item, text, cut)?;
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
        |(id, e), mut prediction, truncated| {
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
                truncated,
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
        truncated_items: samples.iter().map(|s| item(s, s.truncated)).collect(),
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

/// The generation budget the reference solutions call for: the `quantile` (e.g. 0.99) of their
/// lengths in `tok`'s tokens, laid out as the model is tuned to answer ([`QaLayout::answer`],
/// its end-of-turn included), rounded up to a multiple of 16. An exact-match run whose
/// `max_new_tokens` is below it cuts off answers the model would have finished; read it on the
/// validation split, so that no test problem sets it.
pub fn reference_token_budget(
    tok: &Tokenizer,
    examples: &[QaExample],
    quantile: f64,
) -> Result<GenerationBudget> {
    if examples.is_empty() {
        return Err(ElmError::InvalidArgument(
            "no reference solutions to size a generation budget on".into(),
        ));
    }
    if !(0.0..=1.0).contains(&quantile) {
        return Err(ElmError::config("quantile", "must be in [0, 1]"));
    }
    let layout = QaLayout::of(tok);
    let mut lengths = examples
        .iter()
        .map(|e| Ok(tok.encode(&layout.answer(&e.answer), false)?.len()))
        .collect::<Result<Vec<usize>>>()?;
    lengths.sort_unstable();
    // The nearest-rank quantile: the smallest length at least `quantile` of them reach.
    let rank = ((quantile * lengths.len() as f64).ceil() as usize).clamp(1, lengths.len());
    let at_quantile = lengths[rank - 1];
    Ok(GenerationBudget {
        problems: lengths.len(),
        quantile,
        tokens_at_quantile: at_quantile,
        median_tokens: lengths[(lengths.len() - 1) / 2],
        max_tokens: lengths[lengths.len() - 1],
        max_new_tokens: at_quantile.div_ceil(16) * 16,
    })
}

/// What [`reference_token_budget`] measured and the budget it sets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationBudget {
    pub problems: usize,
    pub quantile: f64,
    pub tokens_at_quantile: usize,
    pub median_tokens: usize,
    pub max_tokens: usize,
    /// `tokens_at_quantile` rounded up to a multiple of 16.
    pub max_new_tokens: usize,
}

/// A generation budget as `elm eval --max-new-tokens` takes it: a number of tokens, or `auto`,
/// sized by [`reference_token_budget`] on the validation split's reference solutions at
/// [`REFERENCE_BUDGET_QUANTILE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxNewTokens {
    Fixed(usize),
    FromReferences,
}

/// The quantile of the reference solutions' lengths that [`MaxNewTokens::FromReferences`]
/// covers.
pub const REFERENCE_BUDGET_QUANTILE: f64 = 0.99;

impl std::str::FromStr for MaxNewTokens {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(MaxNewTokens::FromReferences),
            n => n.parse().map(MaxNewTokens::Fixed).map_err(|_| {
                ElmError::config(
                    "max-new-tokens",
                    format!("`{s}`: expected a number of tokens or auto"),
                )
            }),
        }
    }
}

impl std::fmt::Display for MaxNewTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MaxNewTokens::Fixed(n) => write!(f, "{n}"),
            MaxNewTokens::FromReferences => f.write_str("auto"),
        }
    }
}

impl Serialize for MaxNewTokens {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            MaxNewTokens::Fixed(n) => s.serialize_u64(*n as u64),
            MaxNewTokens::FromReferences => s.serialize_str("auto"),
        }
    }
}
