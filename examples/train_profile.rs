//! The ELM training step as a benchmark (issue 25), the same work as
//! `scripts/torch_train_ref.py` so `scripts/bench-train.sh` can print the ratio: SmolLM2,
//! start 12, M = 8, stochastic JFB fixed at 2 gradient-free + 2 taped iterations, batches of
//! GSM8K sequences at least `SEQ` tokens long (every position real), per phase of the λ
//! schedule (distillation only; CE + distillation) and with / without the teacher cache; and
//! the LoRA SFT step (rank 16 on the seven linear maps of every layer).
//! One warm-up step, then the mean of `STEPS`.
//!
//! `cargo run --release --example train_profile -- [--model M] [--steps N] [--batch B] [--phases P,..]
//! [--seq T] [--precision f32|bf16] [--json]`
#[path = "support/args.rs"]
mod args;

use std::time::Instant;

use elm::data::{load_gsm8k, resolve_data_dir, tokenize_example, Example, Split};
use elm::equilibrium::module::ElmModule;
use elm::equilibrium::train::Trainer;
use elm::equilibrium::{ElmConfig, TrainConfig};
use elm::eval::gsm8k::QaLayout;
use elm::grad::{DeqConfig, GradientRule};

use args::flag;

/// This process's minor page faults and kernel CPU seconds so far (`/proc/self/stat` fields
/// 10 and 15; clock ticks of 1/100 s), or `None` off Linux.
fn minor_faults_and_system_seconds() -> Option<(u64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which may hold spaces, start at field 3.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let minflt = fields.get(10 - 3)?.parse().ok()?;
    let stime: f64 = fields.get(15 - 3)?.parse().ok()?;
    Some((minflt, stime / 100.0))
}

fn main() -> elm::Result<()> {
    let kept = elm::heap::retain_freed_memory();
    let gemm = elm::gemm::prefer_own_threads();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model: String = flag(
        &args,
        "--model",
        elm::model::default_model_path().display().to_string(),
    )?;
    let steps: usize = flag(&args, "--steps", 4)?;
    let batch: usize = flag(&args, "--batch", 2)?;
    let seq: usize = flag(&args, "--seq", 128)?;
    let json = args.iter().any(|a| a == "--json");
    // `--phases distill,ce_teacher_cache,lora`: only these (for profiling one); all by default.
    let only: String = flag(&args, "--phases", String::new())?;
    let wanted = |key: &str| only.is_empty() || only.split(',').any(|p| p == key);
    let precision: elm::gemm::Precision = flag(&args, "--precision", elm::gemm::Precision::F32)?;
    elm::gemm::set_precision(precision)?;

    let (dense, tok) = elm::model::load_pretrained(&model)?;
    let dir = resolve_data_dir(None)?;
    let layout = QaLayout::of(&tok);
    let prompt = |q: &str| layout.prompt(&tok, q);
    let answer = |a: &str| layout.answer(a);
    let enc = |s: &str| tok.encode(s, false);
    // Full-length sequences only, so both sides compute on exactly B x T real positions.
    let data: Vec<_> = load_gsm8k(&dir, Split::Train)?
        .into_iter()
        .map(|e| tokenize_example(&Example::Qa(e), seq, &prompt, &answer, &enc))
        .filter(|s| !matches!(s, Ok(s) if s.tokens.len() != seq))
        .collect::<elm::Result<_>>()?;
    let supervised = data
        .iter()
        .map(|s| s.loss_mask.iter().filter(|&&m| m).count() as f64)
        .sum::<f64>()
        / data.len().max(1) as f64
        * batch as f64;

    let ec = ElmConfig::new(12, 8);
    let module = ElmModule::init(&dense, &ec)?;
    let pad = tok.eos_id().unwrap_or(0);
    let cache = std::env::temp_dir().join(format!("elm-train-profile-{}", std::process::id()));
    let mut phases = serde_json::Map::new();
    // The CE ramp's start and end as fractions of training: at 1 it never starts, at 0 it is
    // at full weight from the first step.
    for (phase, ce_ramp) in [("distill", 1.0f32), ("ce", 0.0)] {
        let mut cfg = TrainConfig {
            steps: steps + 1,
            batch_size: batch,
            seq_len: seq,
            checkpoint_every: 0,
            deq: Some(DeqConfig::new(GradientRule::StochasticJfb {
                no_grad: [2, 2],
                grad: [2, 2],
                seed: 0,
            })),
            ..TrainConfig::default()
        };
        cfg.lambda.ce_start = ce_ramp;
        cfg.lambda.ce_end = ce_ramp;
        for cached in [false, true] {
            let key = if cached {
                format!("{phase}_teacher_cache")
            } else {
                phase.to_string()
            };
            if !wanted(&key) {
                continue;
            }
            let trainer = || Trainer::new(&dense, ec.clone(), &module, cfg.clone(), model.clone());
            if cached {
                // Fill the cache with the same batches, then time a trainer that reads it.
                let mut t = trainer()?;
                t.set_teacher_cache(cache.clone())?;
                for _ in 0..=steps {
                    t.train_step(&data, pad)?;
                }
            }
            let mut tr = trainer()?;
            if cached {
                tr.set_teacher_cache(cache.clone())?;
            }
            tr.train_step(&data, pad)?;
            let (mut seconds, mut tokens) = (0.0, 0usize);
            for _ in 0..steps {
                let t = Instant::now();
                let log = tr.train_step(&data, pad)?;
                seconds += t.elapsed().as_secs_f64();
                tokens += log.tokens;
            }
            phases.insert(
                key,
                serde_json::json!({
                    "seconds_per_step": seconds / steps as f64,
                    "tok_s": tokens as f64 / seconds,
                }),
            );
        }
    }
    let _ = std::fs::remove_dir_all(&cache);
    // The LoRA step of the healing and tuned-dense stages: rank-16 adapters on the seven
    // linear maps of every layer, CE at the supervised tokens, AdamW on the adapters.
    let lora_cfg = elm::lora::LoraConfig {
        steps: steps + 1,
        batch_size: batch,
        seq_len: seq,
        checkpoint_every: 0,
        ..Default::default()
    };
    if wanted("lora") {
        let mut lora = elm::lora::LoraTrainer::new(&dense, lora_cfg, model.clone())?;
        lora.train_step(&data, pad)?;
        let (mut seconds, mut tokens) = (0.0, 0usize);
        for _ in 0..steps {
            let t = Instant::now();
            lora.train_step(&data, pad)?;
            seconds += t.elapsed().as_secs_f64();
            // Positions processed (every sequence is `seq` tokens long); the step's own `tokens`
            // counts the supervised ones.
            tokens += batch * seq;
        }
        phases.insert(
            "lora".into(),
            serde_json::json!({
                "seconds_per_step": seconds / steps as f64,
                "tok_s": tokens as f64 / seconds,
            }),
        );
    }
    let out = serde_json::json!({
        "model": model,
        "threads": rayon::current_num_threads(),
        "batch": batch,
        "seq_len": seq,
        "steps": steps,
        "supervised_tokens": supervised,
        "freed_memory_kept": kept,
        "gemm_kernel": gemm.name(),
        "precision": precision,
        "openblas_threads": elm::gemm::blas_threads(),
        "peak_rss_bytes": elm::io::peak_rss_bytes(),
        "minor_faults_and_system_seconds": minor_faults_and_system_seconds(),
        "phases": phases,
    });
    if json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    }
    Ok(())
}
