//! GPU throughput benchmark of [`CudaModel`](super::CudaModel): prefill and batched decode tok/s.
//!
//! Driven by `scripts/gpu-bench.sh`, which runs the same shapes through `scripts/torch_ref_bench.py`
//! (PyTorch eager) on the same GPU and prints ratios. Timing does not depend on weight values, so
//! both sides use seeded random weights of the exact model shapes (SmolLM2-135M and a
//! Qwen2.5-1.5B-shaped model). Shared verbatim by the stub build (where it returns the stub error).

use std::time::Instant;

use ndarray::{Array1, Array2};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{CudaModel, GpuDevice, GpuModel};
use crate::error::{ElmError, Result};
use crate::model::{Arch, LayerWeights, ModelConfig, ModelWeights};

/// SmolLM2-135M(-Instruct) hyper-parameters.
pub fn smollm2_135m_config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        vocab_size: 49152,
        hidden_size: 576,
        intermediate_size: 1536,
        num_layers: 30,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        rope_theta: 100000.0,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
        attention_bias: false,
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        sliding_window: None,
        sliding_window_pattern: None,
        rope_local_theta: None,
    }
}

/// Qwen2.5-1.5B hyper-parameters (q/k/v bias, tied embeddings).
pub fn qwen25_1_5b_config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: 151936,
        hidden_size: 1536,
        intermediate_size: 8960,
        num_layers: 28,
        num_heads: 12,
        num_kv_heads: 2,
        head_dim: 128,
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        max_position_embeddings: 32768,
        tie_word_embeddings: true,
        attention_bias: true,
        bos_token_id: None,
        eos_token_id: Some(151645),
        sliding_window: None,
        sliding_window_pattern: None,
        rope_local_theta: None,
    }
}

/// Seeded random weights of `cfg`'s shapes: uniform with std 0.02 (norm gains 1).
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> ModelWeights {
    let mut rng = StdRng::seed_from_u64(seed);
    let a = 0.02f32 * 3f32.sqrt();
    let mut mat =
        |r: usize, c: usize| Array2::from_shape_simple_fn((r, c), || rng.gen_range(-a..a));
    let (c, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (hd, kvd) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let embed = mat(v, c);
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for _ in 0..cfg.num_layers {
        let wq = mat(hd, c);
        let wk = mat(kvd, c);
        let wv = mat(kvd, c);
        let wo = mat(c, hd);
        let w_gate = mat(i, c);
        let w_up = mat(i, c);
        let w_down = mat(c, i);
        let (bq, bk, bv) = if cfg.attention_bias {
            (
                Some(mat(1, hd).into_shape_with_order(hd).expect("1 x hd")),
                Some(mat(1, kvd).into_shape_with_order(kvd).expect("1 x kvd")),
                Some(mat(1, kvd).into_shape_with_order(kvd).expect("1 x kvd")),
            )
        } else {
            (None, None, None)
        };
        layers.push(LayerWeights {
            attn_norm: Array1::ones(c),
            wq,
            wk,
            wv,
            wo,
            bq,
            bk,
            bv,
            mlp_norm: Array1::ones(c),
            w_gate,
            w_up,
            w_down,
            gemma: None,
        });
    }
    let lm_head = (!cfg.tie_word_embeddings).then(|| mat(v, c));
    ModelWeights {
        config: cfg.clone(),
        embed,
        layers,
        final_norm: Array1::ones(c),
        lm_head,
    }
}

/// What to measure.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchSpec {
    /// Label printed in the report (e.g. "smollm2-135m").
    pub label: String,
    /// Device ordinal.
    pub ordinal: usize,
    /// Prompt length of the prefill measurement (batch 1).
    pub prefill_len: usize,
    /// Prompt length before the decode measurement.
    pub decode_prompt_len: usize,
    /// Timed decode steps per batch size.
    pub decode_steps: usize,
    /// Batch sizes for decode.
    pub decode_batches: Vec<usize>,
    /// Timed repetitions of the prefill.
    pub prefill_reps: usize,
    /// Use TF32 tensor cores in cuBLAS.
    pub tf32: bool,
    /// Seed of the prompt token ids.
    pub seed: u64,
}

/// One decode measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DecodeResult {
    pub batch: usize,
    pub steps: usize,
    pub seconds: f64,
    /// Generated tokens per second over all sequences (`batch * steps / seconds`).
    pub tok_s: f64,
}

/// Result of [`run_bench`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub label: String,
    pub device: String,
    pub params: usize,
    pub tf32: bool,
    pub prefill_len: usize,
    pub prefill_seconds: f64,
    /// Prompt tokens per second (batch 1).
    pub prefill_tok_s: f64,
    pub decode: Vec<DecodeResult>,
}

fn random_prompt(rng: &mut StdRng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(0..vocab as u32)).collect()
}

/// Measures prefill tok/s (batch 1, median of `prefill_reps` after a warm-up) and decode tok/s for
/// each batch size (after a prefill of `decode_prompt_len` tokens and two warm-up steps).
/// Each timed region ends with the logits on the host, as in real generation.
pub fn run_bench(weights: &ModelWeights, spec: &BenchSpec) -> Result<BenchReport> {
    if spec.prefill_len == 0 || spec.decode_steps == 0 || spec.prefill_reps == 0 {
        return Err(ElmError::InvalidArgument(
            "bench: prefill_len, decode_steps and prefill_reps must be > 0".into(),
        ));
    }
    let cfg = &weights.config;
    let max_batch = spec
        .decode_batches
        .iter()
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    let warmup_steps = 2;
    let max_seq = spec
        .prefill_len
        .max(spec.decode_prompt_len + warmup_steps + spec.decode_steps);
    let mut model = CudaModel::new(weights, spec.ordinal, max_batch, max_seq)?;
    model.device_mut().set_tf32(spec.tf32)?;
    let device = model.device().name()?;
    let mut rng = StdRng::seed_from_u64(spec.seed);

    let prompt = vec![random_prompt(&mut rng, spec.prefill_len, cfg.vocab_size)];
    model.prefill(&prompt)?; // warm-up: NVRTC compile, cuBLAS heuristics, scratch growth
    let mut times = Vec::with_capacity(spec.prefill_reps);
    for _ in 0..spec.prefill_reps {
        let t = Instant::now();
        model.prefill(&prompt)?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let prefill_seconds = times[times.len() / 2];

    let mut decode = Vec::new();
    for &batch in &spec.decode_batches {
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|_| random_prompt(&mut rng, spec.decode_prompt_len.max(1), cfg.vocab_size))
            .collect();
        model.prefill(&prompts)?;
        let step_tokens: Vec<u32> = (0..batch as u32).collect();
        for _ in 0..warmup_steps {
            model.decode(&step_tokens)?;
        }
        let t = Instant::now();
        for _ in 0..spec.decode_steps {
            model.decode(&step_tokens)?;
        }
        let seconds = t.elapsed().as_secs_f64();
        decode.push(DecodeResult {
            batch,
            steps: spec.decode_steps,
            seconds,
            tok_s: (batch * spec.decode_steps) as f64 / seconds,
        });
    }
    let params = weights.embed.len()
        + weights.final_norm.len()
        + weights.lm_head.as_ref().map_or(0, |h| h.len())
        + weights
            .layers
            .iter()
            .map(LayerWeights::num_params)
            .sum::<usize>();
    Ok(BenchReport {
        label: spec.label.clone(),
        device,
        params,
        tf32: spec.tf32,
        prefill_len: spec.prefill_len,
        prefill_seconds,
        prefill_tok_s: spec.prefill_len as f64 / prefill_seconds,
        decode,
    })
}
