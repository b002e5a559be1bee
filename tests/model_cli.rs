//! The `elm` CLI on the real model: `logits --json` through the GGUF tokenizer gives the
//! fixture's token ids and numpy-reference logits; `generate --json` reports its fields
//! and reproduces the reference greedy continuation; bad arguments fail with exit code 1.

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

fn model_path() -> Option<std::path::PathBuf> {
    let path = elm::model::default_model_path();
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} missing in CI",
        path.display()
    );
    eprintln!(
        "skipping: {} not found (set ELM_MODELS_DIR)",
        path.display()
    );
    None
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
    let Some(path) = model_path() else { return };
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
        elm::io::tokenizer::Tokenizer::from_gguf(&elm::io::GgufFile::open(path).unwrap()).unwrap();
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
    let Some(path) = model_path() else { return };
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
