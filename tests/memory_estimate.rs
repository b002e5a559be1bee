//! Each command's memory estimate (`elm::memory`, checked before its work) against the peak
//! resident set the same process then reaches, on the real checkpoint; a command whose estimate
//! exceeds the memory budget is refused before it does anything; and the estimate's arithmetic.
//! `scripts/memory-table.sh` measures larger settings for the README's table.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use elm::memory::{kv_cache_bytes, MemoryEstimate};
use elm::model::config::Arch;
use elm::model::{ModelConfig, ModelWeights};

fn elm_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_elm"))
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `(estimate, peak RSS)` from a command's `--json` report.
fn estimate_and_peak(what: &str, out: &Output) -> (f64, f64) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let estimate = v["memory_estimate"]["total_bytes"].as_f64().unwrap();
    let peak = v["peak_rss_bytes"].as_f64().unwrap();
    (estimate, peak)
}

#[test]
fn estimates_are_within_a_quarter_of_the_measured_peak_on_the_real_model() {
    let Some(model) = common::real_model() else {
        return;
    };
    let dir = common::TempDir::new("memory");
    let train_cfg = dir.path().join("train.json");
    // The CE term from the first step: the phase with the largest tape.
    std::fs::write(
        &train_cfg,
        r#"{"steps": 2, "batch_size": 2, "seq_len": 128, "checkpoint_every": 2,
            "lambda": {"ce_start": 0.0, "ce_end": 0.1}}"#,
    )
    .unwrap();
    let lora_cfg = dir.path().join("lora.json");
    std::fs::write(&lora_cfg, r#"{"steps": 1, "seq_len": 128}"#).unwrap();
    let m = s(&model);
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "generate",
            [
                "generate",
                "--model",
                &m,
                "--prompt",
                "What is 12 times 7?",
                "--max-new-tokens",
                "16",
                "--batch",
                "4",
            ]
            .map(String::from)
            .to_vec(),
        ),
        (
            "eval",
            [
                "eval",
                "--model",
                &m,
                "--task",
                "gsm8k-nll",
                "--limit",
                "16",
                "--batch",
                "8",
            ]
            .map(String::from)
            .to_vec(),
        ),
        (
            "train",
            vec![
                "train".into(),
                "--model".into(),
                m.clone(),
                "--start".into(),
                "12".into(),
                "--m".into(),
                "8".into(),
                "--config".into(),
                s(&train_cfg),
                "--out".into(),
                s(&dir.path().join("elm")),
                "--eval-examples".into(),
                "0".into(),
            ],
        ),
        (
            "lora",
            vec![
                "lora".into(),
                "--model".into(),
                m.clone(),
                "--config".into(),
                s(&lora_cfg),
                "--out".into(),
                s(&dir.path().join("lora")),
                "--eval-examples".into(),
                "0".into(),
            ],
        ),
    ];
    for (what, args) in cases {
        let out = elm_cmd().args(&args).arg("--json").output().unwrap();
        let (estimate, peak) = estimate_and_peak(what, &out);
        let ratio = estimate / peak;
        println!(
            "{what}: estimate {:.0} MiB, peak RSS {:.0} MiB, ratio {ratio:.3}",
            estimate / 1048576.0,
            peak / 1048576.0
        );
        assert!(
            (0.75..=1.25).contains(&ratio),
            "{what}: estimate {estimate} bytes vs peak RSS {peak} bytes (ratio {ratio:.3})"
        );
    }
}

#[test]
fn a_command_that_cannot_fit_is_refused_before_any_work() {
    let dir = common::TempDir::new("memory-refuse");
    let w = ModelWeights::random(&ModelConfig::tiny(Arch::Llama), 3);
    let model = dir.path().join("tiny");
    common::write_word_model(&w, &model);
    let data = dir.path().join("train.jsonl");
    common::write_word_corpus(&data, 8, 7);
    let out_dir = dir.path().join("run");
    // Less than the runtime alone: every estimate exceeds it; no single allocation of the
    // tiny model's loading does.
    let out = elm_cmd()
        .env(elm::limits::MEM_BUDGET_ENV, (4u64 << 20).to_string())
        .args([
            "train",
            "--model",
            &s(&model),
            "--start",
            "1",
            "--num-replaced",
            "2",
        ])
        .args(["--steps", "3", "--eval-examples", "0", "--data", &s(&data)])
        .args(["--out", &s(&out_dir), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert_eq!(v["error"]["kind"], "budget", "{v}");
    for part in ["memory estimate", "runtime", "loaded", "training step"] {
        assert!(msg.contains(part), "{part} not named in: {msg}");
    }
    // Refused before the first checkpoint (a fresh run saves its step 0 first thing).
    assert!(
        !out_dir.join(elm::equilibrium::train::STATE_FILE).exists(),
        "the refused run wrote a checkpoint"
    );
}

#[test]
fn an_estimate_is_what_it_holds_plus_its_largest_phase() {
    let e = MemoryEstimate::new("x", &[("a", 10), ("b", 5)])
        .with_phase("small", &[("p", 3), ("q", 4)])
        .with_phase("large", &[("r", 20)]);
    assert_eq!(e.total_bytes, 35);
    assert_eq!(e.peak_phase().unwrap().name, "large");
    assert!(e.summary().contains("large (r 0 MiB)"), "{}", e.summary());
    // An empty estimate needs nothing; saturating, never wrapping.
    assert_eq!(MemoryEstimate::new("x", &[]).total_bytes, 0);
    let huge = MemoryEstimate::new("x", &[("a", u64::MAX)]).with_phase("p", &[("b", 1)]);
    assert_eq!(huge.total_bytes, u64::MAX);
    // 2 (K and V) × layers × kv heads × head dim × rows × tokens × 4 bytes, by hand.
    let cfg = ModelConfig::tiny(Arch::Llama);
    assert_eq!(
        kv_cache_bytes(&cfg, 3, 7),
        (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 3 * 7 * 4) as u64
    );
}

/// The generation estimate's KV cache is the cache `Transformer::new_cache` allocates, to the
/// byte: sliding on a windowed model's local layers past `window − 1 + PREFILL_CHUNK`
/// tokens, full below that and on a model without windows.
#[test]
fn the_generation_kv_estimate_is_the_allocated_cache() {
    use elm::memory::generation_kv_cache_bytes;
    use elm::model::Transformer;
    for (arch, window) in [(Arch::Gemma3, Some(40)), (Arch::Llama, None)] {
        let cfg = ModelConfig {
            num_layers: 4,
            max_position_embeddings: 2000,
            sliding_window: window.or(ModelConfig::tiny(arch).sliding_window),
            ..ModelConfig::tiny(arch)
        };
        let m = Transformer::new(ModelWeights::random(&cfg, 5)).unwrap();
        for (batch, tokens) in [(1, 100), (2, 1600)] {
            let cache = m.new_cache(batch, tokens).unwrap();
            assert_eq!(
                generation_kv_cache_bytes(&cfg, batch, tokens),
                cache.bytes() as u64,
                "{arch:?}, batch {batch}, {tokens} tokens"
            );
            if window.is_some() && tokens > 600 {
                assert!(cache.bytes() < kv_cache_bytes(&cfg, batch, tokens) as usize);
            }
        }
    }
}
