//! The real SmolLM2-135M-Instruct GGUF against `tests/fixtures/gen/ref_model.py` (gguf-package
//! dequantization + numpy float64 Llama forward with interleaved RoPE on the raw GGUF
//! Q/K weights): top-k logits of the last prompt token and 32-token greedy continuations.
//! Token ids are fixed in the fixture, so no tokenizer is involved.

mod common;

use elm::model::generate::{generate, SamplingConfig};
use elm::model::Transformer;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    text: String,
    tokens: Vec<u32>,
    top_ids: Vec<u32>,
    top_logits: Vec<f64>,
    greedy: Vec<u32>,
    greedy_min_margin: f64,
}

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

fn load_model() -> Option<Transformer> {
    let path = common::real_model()?;
    let weights = elm::formats::load_gguf_model(&path).expect("load real model");
    Some(Transformer::new(weights).expect("valid weights"))
}

fn fixture() -> Fixture {
    let text = include_str!("fixtures/model/smollm2_logits.json");
    serde_json::from_str(text).expect("fixture parses")
}

#[test]
fn real_model_logits_and_greedy_continuations_match_numpy_reference() {
    let Some(model) = load_model() else { return };
    let fx = fixture();
    assert!(fx.cases.len() >= 3);
    for case in &fx.cases {
        let mut cache = model.new_cache(1, case.tokens.len()).unwrap();
        let logits = model
            .prefill(std::slice::from_ref(&case.tokens), &mut cache)
            .unwrap();
        let mut max_abs = 0.0f64;
        let mut max_rel = 0.0f64;
        for (&id, &want) in case.top_ids.iter().zip(&case.top_logits) {
            let got = logits[[0, id as usize]] as f64;
            max_abs = max_abs.max((got - want).abs());
            max_rel = max_rel.max((got - want).abs() / want.abs().max(1.0));
        }
        eprintln!(
            "{:?}: top-{} logits max abs diff {max_abs:.3e}, max rel diff {max_rel:.3e}",
            case.text,
            case.top_ids.len()
        );
        assert!(
            max_rel < 1e-4,
            "{:?}: max abs diff {max_abs:.3e}, max rel diff {max_rel:.3e}",
            case.text
        );
        let argmax = elm::model::generate::argmax(logits.row(0));
        assert_eq!(
            argmax as u32, case.top_ids[0],
            "{:?}: top-1 token",
            case.text
        );
    }

    // Greedy continuations, all prompts in ONE batch (different lengths).
    let prompts: Vec<Vec<u32>> = fx.cases.iter().map(|c| c.tokens.clone()).collect();
    let n = fx.cases[0].greedy.len();
    let out = generate(
        &model,
        &prompts,
        &SamplingConfig::greedy(n, None),
        None,
        |_, _| {},
    )
    .unwrap();
    for (case, got) in fx.cases.iter().zip(&out.tokens) {
        assert_eq!(
            got, &case.greedy,
            "{:?}: greedy continuation (reference min top-2 margin {:.3e})",
            case.text, case.greedy_min_margin
        );
    }
}
