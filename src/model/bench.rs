//! Roofline measurements for the inference path: machine read bandwidth and sgemm
//! peak, measured in the same run as the model's prefill and decode throughput so
//! the ratios compare like with like.

use std::time::Instant;

use ndarray::{linalg::general_mat_mul, Array2};
use serde::{Deserialize, Serialize};

use super::block_view::BlockWeights;
use super::generate::argmax;
use super::transformer::{DecoderWeights, Transformer};
use crate::error::Result;
use crate::model_data::config::ModelConfig;
use crate::model_data::weights::ModelWeights;
use crate::team::SpinTeam;

/// A buffer whose parallel read measures the machine's read bandwidth.
///
/// The read is split over the same [`SpinTeam`] threads, in the same contiguous
/// per-thread shares, as the batch-1 decode matvecs, so the two compare like with like.
pub struct BandwidthProbe {
    data: Vec<f32>,
}

impl BandwidthProbe {
    /// A probe reading `bytes` bytes (rounded down to whole f32), on huge pages where the
    /// weights it stands for are ([`crate::heap::back_with_huge_pages`]): the ceiling is then
    /// measured on the memory the decode reads.
    pub fn new(bytes: usize) -> Self {
        let data: Vec<f32> = (0..bytes / 4).map(|i| (i % 7) as f32).collect();
        crate::heap::back_with_huge_pages(&[crate::heap::f32_bytes(&data)]);
        BandwidthProbe { data }
    }

    /// One timed read of the whole buffer on every core, in GB/s (1e9 bytes/s).
    pub fn measure(&self) -> f64 {
        let team = SpinTeam::global();
        let parts = team.parts();
        let n = self.data.len();
        let read_part = |p: usize| {
            std::hint::black_box(sum_chunk(&self.data[n * p / parts..n * (p + 1) / parts]));
        };
        let start = Instant::now();
        team.run(&read_part);
        (n * 4) as f64 / start.elapsed().as_secs_f64() / 1e9
    }
}

/// Best-of-`reps` read bandwidth in GB/s over `bytes` bytes (see [`BandwidthProbe`]).
pub fn read_bandwidth_gbs(bytes: usize, reps: usize) -> f64 {
    let probe = BandwidthProbe::new(bytes);
    (0..reps.max(1))
        .map(|_| probe.measure())
        .fold(0.0, f64::max)
}

/// Sum of a chunk with many independent accumulators, so it is bound by loading the
/// data (the same AVX2 loads the decode matvec uses), not by add latency or by
/// instruction throughput of a baseline-x86-64 build.
fn sum_chunk(c: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked above).
            return unsafe { sum_chunk_avx2(c) };
        }
    }
    let mut acc = [0.0f32; 32];
    let blocks = c.chunks_exact(32);
    let tail: f32 = blocks.remainder().iter().sum();
    for block in blocks {
        for (a, &v) in acc.iter_mut().zip(block) {
            *a += v;
        }
    }
    acc.iter().map(|&a| a as f64).sum::<f64>() + tail as f64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_chunk_avx2(c: &[f32]) -> f64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 8];
    let blocks = c.chunks_exact(64);
    let tail: f32 = blocks.remainder().iter().sum();
    for block in blocks {
        let p = block.as_ptr();
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_ps(*a, _mm256_loadu_ps(p.add(8 * k)));
        }
    }
    let mut lanes = [0.0f32; 8];
    let mut total = tail as f64;
    for a in acc {
        _mm256_storeu_ps(lanes.as_mut_ptr(), a);
        total += lanes.iter().map(|&v| v as f64).sum::<f64>();
    }
    total
}

/// Best-of-`reps` sgemm throughput `C = A·B` for `n × n` f32 matrices, GFLOP/s.
pub fn sgemm_gflops(n: usize, reps: usize) -> f64 {
    let a = Array2::from_shape_fn((n, n), |(i, j)| ((i * 31 + j * 17) % 13) as f32 * 0.1);
    let b = Array2::from_shape_fn((n, n), |(i, j)| ((i * 7 + j * 3) % 11) as f32 * 0.1);
    let mut c = Array2::<f32>::zeros((n, n));
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        general_mat_mul(1.0, &a, &b, 0.0, &mut c);
        best = best.min(start.elapsed().as_secs_f64());
    }
    std::hint::black_box(&c);
    2.0 * (n as f64).powi(3) / best / 1e9
}

/// Weight bytes streamed per decode step at batch 1: every block tensor, the final
/// norm and the LM head (one embedding row is negligible; a tied head is the embedding).
pub fn decode_weight_bytes(w: &ModelWeights) -> usize {
    let layers: usize = w.layers.iter().map(|l| l.num_params()).sum();
    (layers + w.final_norm.len() + w.lm_head().len()) * std::mem::size_of::<f32>()
}

/// Useful FLOPs of a `t`-token prefill: the linear layers for every token, causal
/// attention (`QKᵀ` and `PV` over positions `≤ p`), and the LM head for the last token.
pub fn prefill_flops<W: DecoderWeights + ?Sized>(w: &W, t: usize) -> f64 {
    let cfg = w.config();
    let elems = |l: crate::quant::LinearRef<'_>| l.dim().0 * l.dim().1;
    let linear: usize = w
        .layers()
        .iter()
        .map(|l| {
            let b = l.block_ref();
            b.linears().into_iter().map(elems).sum::<usize>()
        })
        .sum();
    let hd = (cfg.num_heads * cfg.head_dim) as f64;
    let causal_pairs = (t * (t + 1) / 2) as f64;
    let attention = cfg.num_layers as f64 * 4.0 * hd * causal_pairs;
    2.0 * linear as f64 * t as f64 + attention + 2.0 * elems(w.lm_head_ref()) as f64
}

/// Everything `elm bench` reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    /// Best of `decode_steps` reads, each taken just before a batch-1 decode step
    /// (interleaved, so both see the same interference from other processes).
    pub read_bandwidth_gb_s: f64,
    pub sgemm_n: usize,
    pub sgemm_gflop_s: f64,
    pub prefill_tokens: usize,
    pub prefill_tok_s: f64,
    pub prefill_gflop_s: f64,
    /// Prefill FLOP/s ÷ sgemm peak.
    pub prefill_vs_sgemm_peak: f64,
    pub decode_steps: usize,
    /// From the fastest step (see [`bench_decode`]).
    pub decode_b1_tok_s: f64,
    /// Over all steps.
    pub decode_b1_mean_tok_s: f64,
    pub decode_b8_tok_s: f64,
    pub decode_b8_mean_tok_s: f64,
    pub decode_weight_bytes_per_step: usize,
    /// Read bandwidth ÷ weight bytes per step: the batch-1 decode ceiling.
    pub decode_roofline_tok_s: f64,
    /// Measured batch-1 decode (fastest step) ÷ roofline.
    pub decode_b1_vs_roofline: f64,
    pub rayon_threads: usize,
    /// 1-minute load average when the bench finished (other processes skew timings).
    pub load_average_1m: Option<f64>,
    pub openblas_threads: usize,
}

fn bench_tokens(vocab: usize, n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % vocab) as u32)
        .collect()
}

/// Best-of-`reps` prefill throughput (tokens/s) of one `prompt_len`-token prompt.
pub fn bench_prefill<W: DecoderWeights>(
    model: &Transformer<W>,
    prompt_len: usize,
    reps: usize,
) -> Result<f64> {
    let tokens = bench_tokens(model.config().vocab_size, prompt_len, 0);
    let mut cache = model.new_cache(1, prompt_len)?;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        cache.reset();
        let start = Instant::now();
        std::hint::black_box(model.prefill(std::slice::from_ref(&tokens), &mut cache)?);
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(prompt_len as f64 / best)
}

/// Decode throughput of `steps` greedy steps after a short prompt (prefill excluded):
/// `(best, mean)` new tokens/s over the whole batch, where `best` uses the fastest
/// single step (like the best-of-N bandwidth and sgemm figures, it filters out
/// interference from other processes) and `mean` the total time.
///
/// `before_step` runs, untimed, before every timed step (e.g. a bandwidth read).
pub fn bench_decode<W: DecoderWeights>(
    model: &Transformer<W>,
    batch: usize,
    steps: usize,
    mut before_step: impl FnMut(),
) -> Result<(f64, f64)> {
    let prompt_len = 16;
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|b| bench_tokens(model.config().vocab_size, prompt_len, b + 1))
        .collect();
    let mut cache = model.new_cache(batch, prompt_len + steps + 1)?;
    let mut logits = model.prefill(&prompts, &mut cache)?;
    let active = vec![true; batch];
    let mut next = vec![0u32; batch];
    let mut step = |logits: &mut Array2<f32>| -> Result<f64> {
        for (b, n) in next.iter_mut().enumerate() {
            *n = argmax(logits.row(b)) as u32;
        }
        before_step();
        let start = Instant::now();
        model.decode_step_into(&next, &active, &mut cache, logits)?;
        Ok(start.elapsed().as_secs_f64())
    };
    step(&mut logits)?; // untimed: first-use growth of the scratch buffers
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        times.push(step(&mut logits)?);
    }
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    let total: f64 = times.iter().sum();
    Ok((batch as f64 / best, (batch * steps) as f64 / total))
}

/// Runs every measurement in one process.
/// Refuses a benchmark whose prompt or prompt + decode steps exceed the model's context
/// (`--prompt-len 10^11` would otherwise try to allocate its tokens and caches).
pub fn check_bench_len(cfg: &ModelConfig, prompt_len: usize, decode_steps: usize) -> Result<()> {
    let ctx = cfg.max_position_embeddings;
    let field = "prompt_len + decode_steps";
    let total = crate::limits::checked_add(field, prompt_len, decode_steps)?;
    if total > ctx {
        return Err(crate::error::ElmError::config(
            field,
            format!(
                "prompt of {prompt_len} tokens + {decode_steps} decode steps exceeds the model's \
                 context length of {ctx} tokens (max_position_embeddings)"
            ),
        ));
    }
    Ok(())
}

pub fn run_bench<W: DecoderWeights>(
    model: &Transformer<W>,
    prompt_len: usize,
    decode_steps: usize,
    mut progress: impl FnMut(&str),
) -> Result<BenchReport> {
    let decode_steps = decode_steps.max(1);
    check_bench_len(model.config(), prompt_len, decode_steps)?;
    progress("sgemm peak");
    let sgemm_n = 1024;
    let peak = sgemm_gflops(sgemm_n, 5);
    progress("prefill");
    let prefill_tok_s = bench_prefill(model, prompt_len, 3)?;
    let prefill_gflop_s =
        prefill_flops(&model.weights, prompt_len) * prefill_tok_s / prompt_len as f64 / 1e9;
    progress("decode batch 1 + read bandwidth");
    // A bandwidth read of the bytes one step streams before every step: both
    // best-of-N figures then come from the same stretch of time.
    let probe = BandwidthProbe::new(model.weights.decode_bytes().max(1 << 28));
    let mut bw = 0.0f64;
    let (b1, b1_mean) = bench_decode(model, 1, decode_steps, || {
        bw = bw.max(probe.measure());
    })?;
    drop(probe);
    progress("decode batch 8");
    let (b8, b8_mean) = bench_decode(model, 8, decode_steps, || {})?;
    let bytes = model.weights.decode_bytes();
    let roofline = bw * 1e9 / bytes as f64;
    Ok(BenchReport {
        read_bandwidth_gb_s: bw,
        sgemm_n,
        sgemm_gflop_s: peak,
        prefill_tokens: prompt_len,
        prefill_tok_s,
        prefill_gflop_s,
        prefill_vs_sgemm_peak: prefill_gflop_s / peak,
        decode_steps,
        decode_b1_tok_s: b1,
        decode_b1_mean_tok_s: b1_mean,
        decode_b8_tok_s: b8,
        decode_b8_mean_tok_s: b8_mean,
        decode_weight_bytes_per_step: bytes,
        decode_roofline_tok_s: roofline,
        decode_b1_vs_roofline: b1 / roofline,
        rayon_threads: rayon::current_num_threads(),
        load_average_1m: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok()),
        openblas_threads: super::ops::blas_threads(),
    })
}

/// Parameters of the token embedding and, when untied, the LM head.
pub fn embedding_params(cfg: &crate::model::ModelConfig) -> usize {
    let one = cfg.vocab_size * cfg.hidden_size;
    if cfg.tie_word_embeddings {
        one
    } else {
        2 * one
    }
}

/// K/V bytes one token adds per sequence over `layers` attention layers (f32 K and V).
pub fn kv_bytes_per_token(cfg: &crate::model::ModelConfig, layers: usize) -> usize {
    layers * 2 * cfg.num_kv_heads * cfg.head_dim * std::mem::size_of::<f32>()
}

/// What every configuration of a comparative `elm bench` reports first, dense or ELM: the
/// leading fields of [`BenchRun`] and of the ELM run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BenchHeader {
    /// `dense` or `elm`.
    pub model: String,
    /// `f32` or the block format(s) kept in memory (the storage the matrices were loaded as).
    pub weights: String,
    /// Bytes of weights held by this configuration.
    pub resident_weight_bytes: usize,
    /// Of those, the token embedding's (and an untied LM head's), and their parameters: the
    /// part an ELM shares with its dense parent, in its own format.
    pub embedding_bytes: usize,
    pub embedding_params: usize,
    /// Parameters of the model (embedding included; an ELM: kept layers, module, embedding).
    pub params: usize,
    /// This configuration's memory, measured in a process of its own (`elm bench` runs
    /// `elm generate` for it; the in-process runs would share one heap): `None` from the
    /// library's bench functions, and from `elm bench` on an HF directory or a GGUF without a
    /// tokenizer (nothing to generate with).
    pub memory: Option<crate::io::ProcessMemory>,
    /// K/V bytes one token adds per sequence (an ELM: kept dense layers plus the one
    /// fixed-point cache, one-step KV).
    pub kv_bytes_per_token: usize,
    /// K/V bytes allocated for one sequence of `kv_context_tokens` tokens, read from the
    /// allocated cache (an ELM: one-step KV, and multi-step KV in
    /// `kv_bytes_at_context_multi_step`: one fixed-point cache per solver iteration).
    pub kv_context_tokens: usize,
    pub kv_bytes_at_context: usize,
    pub kv_bytes_at_context_multi_step: Option<usize>,
}

/// One configuration (model × weight storage) of a comparative `elm bench`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchRun {
    #[serde(flatten)]
    pub header: BenchHeader,
    #[serde(flatten)]
    pub report: BenchReport,
}

/// `storage`, with the block formats the model actually holds (e.g. `auto` on a Q4_1 file whose
/// embedding is Q8_0 gives `auto (q4_1+q8_0)`).
pub fn storage_label<W: DecoderWeights>(
    storage: &crate::quant::WeightStorage,
    weights: &W,
) -> String {
    use crate::quant::LinearRef;
    let mut names: Vec<&str> = Vec::new();
    let mut add = |l: LinearRef<'_>| {
        let n = match l {
            LinearRef::F32(_) => "f32",
            LinearRef::Quant(q) => q.format().name(),
        };
        if !names.contains(&n) {
            names.push(n);
        }
    };
    for l in weights.layers() {
        for w in l.block_ref().linears() {
            add(w);
        }
    }
    add(weights.lm_head_ref());
    format!("{storage} ({})", names.join("+"))
}

/// CPU model and core count from /proc/cpuinfo (what a bench figure was measured on).
pub fn machine_description() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = info
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown CPU".to_string(), |s| s.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpu}, {cores} cores available")
}
