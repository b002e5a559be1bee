//! The `elm` CLI on the real model: `logits --json` through the GGUF tokenizer gives the
//! fixture's token ids and numpy-reference logits; `generate --json` reports its fields
//! and reproduces the reference greedy continuation; bad arguments fail with exit code 1.

mod common;

use common::{real_model, TempDir};
use std::process::Command;

use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    text: String,
    tokens: Vec<u32>,
    top_ids: Vec<u32>,
    top_logits: Vec<f64>,
    greedy: Vec<u32>,
}

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

fn elm(args: &[&str]) -> (bool, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(args)
        .output()
        .expect("run elm");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.success(), json, stderr)
}

#[test]
fn logits_and_generate_json_match_reference() {
    let Some(path) = real_model() else { return };
    let path = path.to_str().unwrap();
    let fx: Fixture =
        serde_json::from_str(include_str!("fixtures/model/smollm2_logits.json")).unwrap();
    let case = &fx.cases[0];
    let (ok, v, err) = elm(&[
        "logits", "--model", path, "--prompt", &case.text, "--top", "5", "--json",
    ]);
    assert!(ok, "elm logits failed: {err}");
    let ids: Vec<u32> = serde_json::from_value(v["prompt_tokens"].clone()).unwrap();
    assert_eq!(ids, case.tokens, "tokenizer ids for {:?}", case.text);
    let top: Vec<(u32, f64)> = serde_json::from_value(v["top"].clone()).unwrap();
    assert_eq!(top.len(), 5);
    for ((id, logit), (&want_id, &want)) in
        top.iter().zip(case.top_ids.iter().zip(&case.top_logits))
    {
        assert_eq!(*id, want_id);
        assert!(
            (logit - want).abs() / want.abs().max(1.0) < 1e-4,
            "logit {logit} vs {want}"
        );
    }

    let (ok, v, err) = elm(&[
        "generate",
        "--model",
        path,
        "--prompt",
        &case.text,
        "--max-new-tokens",
        "8",
        "--json",
    ]);
    assert!(ok, "elm generate failed: {err}");
    assert_eq!(v["prompt_tokens"], case.tokens.len());
    assert_eq!(v["new_tokens"], 8);
    assert!(v["prefill_tok_s"].as_f64().unwrap() > 0.0);
    assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0);
    // Greedy text = detokenized reference continuation.
    let tok =
        elm::formats::tokenizer::Tokenizer::from_gguf(&elm::formats::GgufFile::open(path).unwrap())
            .unwrap();
    assert_eq!(
        v["text"].as_str().unwrap(),
        tok.decode(&case.greedy[..8]).unwrap()
    );
}

#[test]
fn bad_arguments_fail_with_typed_messages() {
    let (ok, _, err) = elm(&[
        "generate",
        "--model",
        "/nonexistent/model.gguf",
        "--prompt",
        "hi",
    ]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    let (ok, _, err) = elm(&["generate", "--prompt", "hi", "--device", "tpu"]);
    assert!(!ok);
    assert!(err.contains("device") && err.contains("tpu"), "{err}");
    let (ok, _, err) = elm(&[
        "perplexity",
        "--file",
        "/nonexistent.txt",
        "--model",
        "/nonexistent.gguf",
    ]);
    assert!(!ok && err.contains("nonexistent"), "{err}");
}

#[test]
fn generate_on_cuda_without_the_feature_is_a_cuda_error() {
    if cfg!(feature = "cuda") {
        return; // exercised by the GPU tests of the cuda module
    }
    let Some(path) = real_model() else { return };
    let (ok, _, err) = elm(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        "hi",
        "--device",
        "cuda:0",
    ]);
    assert!(!ok);
    assert!(err.contains("cuda"), "{err}");
}

/// `generate --elm` goes through the shared sampling loop: seeded sampling is
/// reproducible, batches and stop strings work, solver statistics are reported, and
/// greedy decoding equals the library's ELM greedy loop.
#[test]
fn elm_generate_samples_batches_and_reports_solver_stats() {
    let Some(path) = real_model() else { return };
    let path = path.to_str().unwrap();
    let dir = TempDir::new("cli-gen");
    let ck = dir.join("ck");
    let ck_s = ck.to_str().unwrap();
    let (ok, _, err) = elm(&[
        "compress", "--model", path, "--start", "12", "--m", "8", "--out", ck_s, "--json",
    ]);
    assert!(ok, "compress failed: {err}");
    // `generate --elm CKPT --prompt "The sky is" --json` plus `extra`.
    let generate = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            path,
            "--elm",
            ck_s,
            "--prompt",
            "The sky is",
            "--json",
        ];
        args.extend_from_slice(extra);
        elm(&args)
    };
    let sample = |seed: &str| {
        let (ok, v, err) = generate(&[
            "--max-new-tokens",
            "6",
            "--temperature",
            "0.9",
            "--top-p",
            "0.95",
            "--batch",
            "2",
            "--seed",
            seed,
        ]);
        assert!(ok, "generate failed: {err}");
        v
    };
    let (a, b) = (sample("3"), sample("3"));
    assert_eq!(a["texts"], b["texts"], "same seed, same samples");
    assert_eq!(a["texts"].as_array().unwrap().len(), 2);
    let decode = &a["decode"];
    assert!(decode["tokens"].as_u64().unwrap() >= 1, "{a}");
    assert!(decode["mean_iterations"].as_f64().unwrap() >= 1.0, "{a}");
    assert_eq!(a["prefill_iterations"].as_array().unwrap().len(), 2, "{a}");
    assert!(a["kv_bytes"].as_u64().unwrap() > 0);

    // Greedy CLI output == library greedy loop on the same checkpoint.
    let (ok, g, err) = generate(&["--max-new-tokens", "5"]);
    assert!(ok, "{err}");
    let (model, tok) =
        elm::equilibrium::infer::ElmModel::load(std::path::Path::new(path), Some(ck.as_path()))
            .unwrap();
    let cfg = elm::equilibrium::infer::InferenceConfig::default();
    let mut s = elm::equilibrium::infer::ElmSession::new(&model, cfg, 1, 32).unwrap();
    let ids = tok.encode("The sky is", false).unwrap();
    let stops = elm::eval::gsm8k::stop_ids(&tok);
    let out = elm::equilibrium::infer::generate_greedy(&mut s, &[ids], 5, &stops).unwrap();
    let shown: Vec<u32> = out[0]
        .iter()
        .copied()
        .filter(|t| !stops.contains(t))
        .collect();
    assert_eq!(g["text"].as_str().unwrap(), tok.decode(&shown).unwrap());

    let (ok, _, err) = generate(&["--device", "cuda:0"]);
    assert!(!ok && err.contains("CPU"), "{err}");
}

/// `--ignore-eos` generates every requested token: a chat model answers "Hi" with an
/// end-of-turn token well before 48 tokens, and with the flag it goes on to all 48.
#[test]
fn ignore_eos_generates_every_requested_token() {
    let Some(path) = real_model() else { return };
    let path = path.to_str().unwrap();
    let base = [
        "generate",
        "--model",
        path,
        "--prompt",
        "Hi",
        "--chat",
        "--max-new-tokens",
        "48",
        "--json",
    ];
    let (ok, stops, err) = elm(&base);
    assert!(ok, "{err}");
    let (ok, all, err) = elm(&[&base[..], &["--ignore-eos"]].concat());
    assert!(ok, "{err}");
    assert_eq!(all["new_tokens"], 48);
    assert_eq!(all["finish_reasons"][0], "length");
    assert!(
        stops["new_tokens"].as_u64().unwrap() < 48,
        "the control reached the limit too: {stops}"
    );
}

/// `--prompt-file` gives the same tokens and greedy text as the same prompt on the command
/// line; a missing file is refused naming it, and so is a prompt given both ways.
#[test]
fn a_prompt_file_reads_as_the_prompt_argument() {
    let Some(path) = real_model() else { return };
    let path = path.to_str().unwrap();
    let dir = TempDir::new("prompt-file");
    let file = dir.path().join("prompt.txt");
    let text = "The capital of France is";
    std::fs::write(&file, text).unwrap();
    let file = file.to_str().unwrap();
    let run = |source: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            path,
            "--max-new-tokens",
            "6",
            "--json",
        ];
        args.extend_from_slice(source);
        elm(&args)
    };
    let (ok, from_file, err) = run(&["--prompt-file", file]);
    assert!(ok, "{err}");
    let (ok, from_arg, err) = run(&["--prompt", text]);
    assert!(ok, "{err}");
    assert_eq!(from_file["prompt_tokens"], from_arg["prompt_tokens"]);
    assert_eq!(from_file["text"], from_arg["text"]);
    let (ok, _, err) = run(&["--prompt-file", "/nonexistent/prompt.txt"]);
    assert!(!ok && err.contains("/nonexistent/prompt.txt"), "{err}");
    let (ok, _, err) = run(&["--prompt", text, "--prompt-file", file]);
    assert!(!ok && err.contains("--prompt-file"), "{err}");
}
