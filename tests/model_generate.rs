//! Sampling and the batch generation loop: analytic distributions (softmax with
//! temperature, top-k / top-p support), seed reproducibility, stop conditions, and
//! batched == unbatched greedy generation on a tiny random model.

mod common;

use common::tiny_transformer;
use elm::model::generate::{argmax, generate, FinishReason, Sampler, SamplingConfig};
use elm::model::Arch;
use ndarray::{array, Array1};

fn sampling(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplingConfig {
    SamplingConfig {
        temperature,
        top_k,
        top_p,
        seed,
        ..Default::default()
    }
}

fn frequencies(cfg: &SamplingConfig, logits: &Array1<f32>, draws: usize) -> Vec<f64> {
    let mut s = Sampler::new(cfg, 1).unwrap();
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..draws {
        counts[s.sample(0, logits.view()).unwrap() as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / draws as f64).collect()
}

fn softmax(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
    x.iter().map(|v| (v - m).exp() / z).collect()
}

/// Frequencies within 5 binomial standard deviations (+1e-3) of the analytic probabilities.
fn assert_matches(what: &str, freq: &[f64], probs: &[f64], draws: usize) {
    for (i, (&f, &p)) in freq.iter().zip(probs).enumerate() {
        let sd = (p * (1.0 - p) / draws as f64).sqrt();
        assert!(
            (f - p).abs() <= 5.0 * sd + 1e-3,
            "{what}: token {i} frequency {f:.4} vs probability {p:.4} (diff {:.2e})",
            (f - p).abs()
        );
    }
}

#[test]
fn temperature_sampling_follows_scaled_softmax() {
    let logits = array![1.0f32, 0.0, 2.5, -1.0, 0.5];
    let draws = 40_000;
    for t in [1.0f32, 0.5, 2.0] {
        let scaled: Vec<f64> = logits.iter().map(|&v| v as f64 / t as f64).collect();
        let freq = frequencies(&sampling(t, 0, 1.0, 3), &logits, draws);
        assert_matches(&format!("T={t}"), &freq, &softmax(&scaled), draws);
    }
}

#[test]
fn top_k_and_top_p_restrict_the_support_and_renormalize() {
    let logits = array![1.0f32, 0.0, 2.5, -1.0, 0.5];
    let draws = 40_000;
    // top-k = 2 keeps tokens 2 and 0.
    let freq = frequencies(&sampling(1.0, 2, 1.0, 5), &logits, draws);
    let p = softmax(&[2.5, 1.0]);
    assert_matches("top_k=2", &freq, &[p[1], 0.0, p[0], 0.0, 0.0], draws);
    // Probabilities: token 2 ≈ 0.63, token 0 ≈ 0.14, 4 ≈ 0.09 ... top_p = 0.7 keeps {2, 0}.
    let full = softmax(&logits.iter().map(|&v| v as f64).collect::<Vec<_>>());
    assert!(
        full[2] < 0.7 && full[2] + full[0] >= 0.7,
        "test premise: {full:?}"
    );
    let freq = frequencies(&sampling(1.0, 0, 0.7, 6), &logits, draws);
    assert_matches("top_p=0.7", &freq, &[p[1], 0.0, p[0], 0.0, 0.0], draws);
    // A tiny top_p or top_k = 1 is greedy.
    let freq = frequencies(&sampling(1.0, 0, 1e-6, 7), &logits, 1000);
    assert_eq!(freq[2], 1.0);
    let freq = frequencies(&sampling(1.0, 1, 1.0, 7), &logits, 1000);
    assert_eq!(freq[2], 1.0);
}

#[test]
fn sampling_is_reproducible_for_a_seed_and_rejects_bad_input() {
    let logits = Array1::from_iter((0..100).map(|i| ((i * 37 % 11) as f32) * 0.3));
    let cfg = sampling(0.9, 40, 0.95, 42);
    let draw = |cfg: &SamplingConfig| {
        let mut s = Sampler::new(cfg, 2).unwrap();
        (0..200)
            .map(|i| s.sample(i % 2, logits.view()).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(&cfg), draw(&cfg));
    assert_ne!(draw(&cfg), draw(&sampling(0.9, 40, 0.95, 43)));
    assert_eq!(argmax(logits.view()), 8); // 8·37 ≡ 10 (mod 11); first of the ties (8, 19)
    let mut s = Sampler::new(&cfg, 1).unwrap();
    let bad = array![0.0f32, f32::NAN];
    assert!(s.sample(0, bad.view()).is_err());
    assert!(Sampler::new(&sampling(-1.0, 0, 1.0, 0), 1).is_err());
    assert!(Sampler::new(&sampling(1.0, 0, 0.0, 0), 1).is_err());
}

#[test]
fn batched_generation_equals_unbatched_for_greedy_and_seeded_sampling() {
    let m = tiny_transformer(Arch::Qwen2, 4, 99);
    // The library refuses what the CLI refuses: zero new tokens.
    let mut none = sampling(0.0, 0, 1.0, 0);
    none.max_new_tokens = 0;
    let e = generate(&m, &[vec![3u32, 9]], &none, None, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("max_new_tokens"), "{e}");
    let prompts = vec![
        vec![3u32, 9, 27, 17],
        vec![5],
        vec![60, 61, 62, 63, 0, 1, 2],
    ];
    for cfg in [SamplingConfig::greedy(12, None), sampling(1.0, 10, 0.9, 7)] {
        let cfg = SamplingConfig {
            max_new_tokens: 12,
            ..cfg
        };
        let mut streamed = vec![Vec::new(); 3];
        let batched = generate(&m, &prompts, &cfg, None, |b, t| streamed[b].push(t)).unwrap();
        assert_eq!(streamed, batched.tokens);
        assert_eq!(batched.new_tokens, 36);
        assert_eq!(batched.prompt_tokens, 12);
        for (b, p) in prompts.iter().enumerate() {
            // Sequence b of a batch samples with seed + b.
            let single_cfg = SamplingConfig {
                seed: cfg.seed + b as u64,
                ..cfg.clone()
            };
            let single =
                generate(&m, std::slice::from_ref(p), &single_cfg, None, |_, _| {}).unwrap();
            assert_eq!(single.tokens[0], batched.tokens[b], "sequence {b}, {cfg:?}");
            assert_eq!(single.finish[0], FinishReason::Length);
        }
    }
}

#[test]
fn generation_stops_on_tokens_and_strings() {
    let m = tiny_transformer(Arch::Llama, 4, 99);
    let prompt = vec![vec![7u32, 8, 9]];
    let free = generate(
        &m,
        &prompt,
        &SamplingConfig::greedy(10, None),
        None,
        |_, _| {},
    )
    .unwrap();
    let stop_at = free.tokens[0][3];
    let first = free.tokens[0].iter().position(|&t| t == stop_at).unwrap();
    let stopped = generate(
        &m,
        &prompt,
        &SamplingConfig::greedy(10, Some(stop_at)),
        None,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(stopped.tokens[0], free.tokens[0][..=first]);
    assert_eq!(stopped.finish[0], FinishReason::StopToken);

    // A toy detokenizer: token i ↦ "<i>".
    let detok =
        |ids: &[u32]| -> elm::Result<String> { Ok(ids.iter().map(|i| format!("<{i}>")).collect()) };
    let needle = format!("<{}><{}>", free.tokens[0][4], free.tokens[0][5]);
    let cfg = SamplingConfig {
        stop_strings: vec![needle.clone()],
        ..SamplingConfig::greedy(10, None)
    };
    let by_string = generate(&m, &prompt, &cfg, Some(&detok), |_, _| {}).unwrap();
    let text = detok(&by_string.tokens[0]).unwrap();
    assert!(text.ends_with(&needle), "{text} should end with {needle}");
    assert_eq!(by_string.finish[0], FinishReason::StopString);
    assert!(generate(&m, &prompt, &cfg, None, |_, _| {}).is_err());
    // Zero new tokens is refused (as the CLI refuses it), not answered with nothing.
    let none = generate(
        &m,
        &prompt,
        &SamplingConfig::greedy(0, None),
        None,
        |_, _| {},
    );
    assert!(none.is_err_and(|e| e.to_string().contains("max_new_tokens")));
}
