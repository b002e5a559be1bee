//! Batched sampling loop written once for every decoder (dense [`Transformer`],
//! GPU model, ELM): greedy / temperature / top-k / top-p with a seed, stop on EOS
//! token ids or stop strings.

use std::time::Instant;

use ndarray::{Array2, ArrayView1};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::kv_cache::KvCache;
use super::transformer::{DecoderWeights, Transformer};
use crate::error::{ElmError, Result};

/// What the sampling loop needs from a model.
pub trait Decoder {
    /// Per-generation state (KV caches, scratch).
    type State;
    fn vocab_size(&self) -> usize;
    /// The model's context length (`max_position_embeddings`), when it has one: [`generate`]
    /// refuses prompt + new tokens past it up front.
    fn context_len(&self) -> Option<usize> {
        None
    }
    /// State for `batch` sequences of at most `max_seq` tokens.
    fn new_state(&self, batch: usize, max_seq: usize) -> Result<Self::State>;
    /// Processes the prompts (lengths may differ); logits of each last token `[B, V]`.
    fn prefill(&self, tokens: &[Vec<u32>], state: &mut Self::State) -> Result<Array2<f32>>;
    /// Appends `tokens[b]` to every sequence with `active[b]` and writes the next-token
    /// logits into `logits` `[B, V]` (rows of inactive sequences are ignored;
    /// implementations may still compute them).
    fn decode_step(
        &self,
        tokens: &[u32],
        active: &[bool],
        state: &mut Self::State,
        logits: &mut Array2<f32>,
    ) -> Result<()>;
}

impl<W: DecoderWeights> Decoder for Transformer<W> {
    type State = KvCache;
    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }
    fn context_len(&self) -> Option<usize> {
        Some(self.config().max_position_embeddings)
    }
    fn new_state(&self, batch: usize, max_seq: usize) -> Result<KvCache> {
        self.new_cache(batch, max_seq)
    }
    fn prefill(&self, tokens: &[Vec<u32>], state: &mut KvCache) -> Result<Array2<f32>> {
        Transformer::prefill(self, tokens, state)
    }
    fn decode_step(
        &self,
        tokens: &[u32],
        active: &[bool],
        state: &mut KvCache,
        logits: &mut Array2<f32>,
    ) -> Result<()> {
        self.decode_step_into(tokens, active, state, logits)
    }
}

/// Sampling and stopping parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingConfig {
    pub max_new_tokens: usize,
    /// `0` = greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` = off.
    pub top_k: usize,
    /// Keep the smallest set of tokens with probability mass ≥ `top_p`; `1` = off.
    pub top_p: f32,
    /// Sequence `b` samples from `StdRng::seed_from_u64(seed + b)`, so a sequence's
    /// text does not depend on what else is in the batch.
    pub seed: u64,
    /// Generation of a sequence stops after it emits one of these (it is kept).
    pub stop_token_ids: Vec<u32>,
    /// Generation stops once the decoded new text contains one of these.
    pub stop_strings: Vec<String>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            max_new_tokens: 64,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        }
    }
}

impl SamplingConfig {
    /// Greedy decoding of `max_new_tokens`, stopping at `eos` if given.
    pub fn greedy(max_new_tokens: usize, eos: Option<u32>) -> Self {
        SamplingConfig {
            max_new_tokens,
            stop_token_ids: eos.into_iter().collect(),
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ElmError::config("temperature", "must be finite and >= 0"));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ElmError::config("top_p", "must be in (0, 1]"));
        }
        Ok(())
    }
}

/// Draws tokens from logits; one seeded RNG per sequence; buffers are reused.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplingConfig,
    rngs: Vec<StdRng>,
    order: Vec<u32>,
    probs: Vec<f32>,
}

impl Sampler {
    pub fn new(config: &SamplingConfig, batch: usize) -> Result<Self> {
        config.validate()?;
        Ok(Sampler {
            config: config.clone(),
            rngs: (0..batch)
                .map(|b| StdRng::seed_from_u64(config.seed.wrapping_add(b as u64)))
                .collect(),
            order: Vec::new(),
            probs: Vec::new(),
        })
    }

    /// Next token of sequence `b` from its logits `[V]`.
    pub fn sample(&mut self, b: usize, logits: ArrayView1<f32>) -> Result<u32> {
        if logits.iter().any(|v| !v.is_finite()) {
            return Err(ElmError::NonFinite(format!("logits of sequence {b}")));
        }
        let cfg = &self.config;
        if cfg.temperature == 0.0 || cfg.top_k == 1 {
            return Ok(argmax(logits) as u32);
        }
        let v = logits.len();
        self.order.clear();
        self.order.extend(0..v as u32);
        let by_logit_desc = |a: &u32, b: &u32| {
            logits[*b as usize]
                .partial_cmp(&logits[*a as usize])
                .expect("finite")
                .then(a.cmp(b))
        };
        let k = if cfg.top_k == 0 { v } else { cfg.top_k.min(v) };
        if k < v {
            self.order.select_nth_unstable_by(k - 1, by_logit_desc);
            self.order.truncate(k);
        }
        self.order.sort_unstable_by(by_logit_desc);
        let max = logits[self.order[0] as usize];
        self.probs.clear();
        let mut total = 0.0f64;
        for &i in &self.order {
            let p = (((logits[i as usize] - max) / cfg.temperature) as f64).exp();
            total += p;
            self.probs.push(p as f32);
        }
        // Nucleus: smallest prefix whose mass reaches top_p.
        let mut keep = self.probs.len();
        if cfg.top_p < 1.0 {
            let mut mass = 0.0f64;
            for (j, &p) in self.probs.iter().enumerate() {
                mass += p as f64 / total;
                if mass >= cfg.top_p as f64 {
                    keep = j + 1;
                    break;
                }
            }
        }
        let kept: f64 = self.probs[..keep].iter().map(|&p| p as f64).sum();
        let mut u = self.rngs[b].gen::<f64>() * kept;
        for j in 0..keep {
            u -= self.probs[j] as f64;
            if u < 0.0 {
                return Ok(self.order[j]);
            }
        }
        Ok(self.order[keep - 1])
    }
}

/// Index of the largest value (first one on ties).
pub fn argmax(x: ArrayView1<f32>) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    StopToken,
    StopString,
    Length,
}

/// Result of [`generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// New tokens of each sequence (a stop token is included).
    pub tokens: Vec<Vec<u32>>,
    pub finish: Vec<FinishReason>,
    /// Sum of prompt lengths.
    pub prompt_tokens: usize,
    /// Sum of new tokens.
    pub new_tokens: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    /// Decode steps run (each processes one token of every active sequence).
    pub decode_steps: usize,
}

/// Turns token ids into text (for stop strings).
pub type Detokenize<'a> = &'a dyn Fn(&[u32]) -> Result<String>;

/// Samples up to `config.max_new_tokens` tokens for every prompt in one batch.
///
/// `detokenize` turns a sequence's new tokens into text; it is required when
/// `config.stop_strings` is non-empty. `on_token(b, token)` is called for every
/// sampled token in order (streaming).
pub fn generate<D: Decoder + ?Sized>(
    model: &D,
    prompts: &[Vec<u32>],
    config: &SamplingConfig,
    detokenize: Option<Detokenize<'_>>,
    mut on_token: impl FnMut(usize, u32),
) -> Result<Generation> {
    let batch = prompts.len();
    if batch == 0 || prompts.iter().any(|p| p.is_empty()) {
        return Err(ElmError::InvalidArgument(
            "generate needs at least one non-empty prompt".into(),
        ));
    }
    if config.max_new_tokens == 0 {
        // The CLI refuses it too: zero new tokens generates and measures nothing.
        return Err(ElmError::config(
            "max_new_tokens",
            "must be >= 1 (zero new tokens generates nothing)",
        ));
    }
    if !config.stop_strings.is_empty() && detokenize.is_none() {
        return Err(ElmError::InvalidArgument(
            "stop strings need a detokenizer".into(),
        ));
    }
    let mut sampler = Sampler::new(config, batch)?;
    let max_prompt = prompts.iter().map(|p| p.len()).max().expect("non-empty");
    let total = crate::limits::checked_add("max_new_tokens", max_prompt, config.max_new_tokens)?;
    if let Some(ctx) = model.context_len() {
        if total > ctx {
            return Err(ElmError::config(
                "max_new_tokens",
                format!(
                    "prompt of {max_prompt} tokens + {} new tokens exceeds the model's context \
                     length of {ctx} tokens (max_position_embeddings)",
                    config.max_new_tokens
                ),
            ));
        }
    }
    let mut state = model.new_state(batch, max_prompt + config.max_new_tokens)?;
    let mut out = Generation {
        tokens: vec![Vec::new(); batch],
        finish: vec![FinishReason::Length; batch],
        prompt_tokens: prompts.iter().map(|p| p.len()).sum(),
        new_tokens: 0,
        prefill_secs: 0.0,
        decode_secs: 0.0,
        decode_steps: 0,
    };
    let start = Instant::now();
    let mut logits = model.prefill(prompts, &mut state)?;
    out.prefill_secs = start.elapsed().as_secs_f64();

    let mut active = vec![true; batch];
    let mut last = vec![0u32; batch];
    let start = Instant::now();
    loop {
        for b in 0..batch {
            if !active[b] {
                continue;
            }
            let tok = sampler.sample(b, logits.row(b))?;
            out.tokens[b].push(tok);
            out.new_tokens += 1;
            last[b] = tok;
            on_token(b, tok);
            if config.stop_token_ids.contains(&tok) {
                out.finish[b] = FinishReason::StopToken;
                active[b] = false;
            } else if let (false, Some(detok)) = (config.stop_strings.is_empty(), detokenize) {
                let text = detok(&out.tokens[b])?;
                if config
                    .stop_strings
                    .iter()
                    .any(|s| text.contains(s.as_str()))
                {
                    out.finish[b] = FinishReason::StopString;
                    active[b] = false;
                }
            }
            if out.tokens[b].len() >= config.max_new_tokens {
                active[b] = false;
            }
        }
        if !active.iter().any(|&a| a) {
            break;
        }
        model.decode_step(&last, &active, &mut state, &mut logits)?;
        out.decode_steps += 1;
    }
    out.decode_secs = start.elapsed().as_secs_f64();
    Ok(out)
}

/// Refuses, before anything is allocated, a generation past the model's context or whose
/// prompts and KV caches for `--batch` sequences cannot fit in memory.
pub fn check_generation_size(
    mc: &crate::model::ModelConfig,
    prompt: usize,
    max_new: usize,
    batch: usize,
) -> Result<()> {
    if prompt > mc.max_position_embeddings {
        return Err(ElmError::config(
            "--prompt",
            format!(
                "{prompt} tokens exceed the model's context length of {} tokens \
                 (max_position_embeddings)",
                mc.max_position_embeddings
            ),
        ));
    }
    let total = crate::limits::checked_add("--max-new-tokens", prompt, max_new)?;
    if total > mc.max_position_embeddings {
        return Err(ElmError::config(
            "--max-new-tokens",
            format!(
                "prompt of {prompt} tokens + {max_new} new tokens exceeds the model's context \
                 length of {} tokens (max_position_embeddings)",
                mc.max_position_embeddings
            ),
        ));
    }
    let kv = crate::limits::bytes_of(
        2 * 4,
        &[mc.num_layers, batch, mc.num_kv_heads, total, mc.head_dim],
    );
    let prompts = crate::limits::bytes_of(4, &[batch, total]);
    crate::limits::check_alloc("--batch", kv.saturating_add(prompts))
}
