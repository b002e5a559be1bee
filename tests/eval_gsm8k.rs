//! GSM8K's generation budget sized from the reference solutions
//! (`elm::eval::gsm8k::reference_token_budget`), against lengths known by construction.

mod common;

use elm::data::QaExample;
use elm::eval::gsm8k::{reference_token_budget, MaxNewTokens, REFERENCE_BUDGET_QUANTILE};
use elm::formats::tokenizer::Tokenizer;

/// Answers of 1, 2, …, `n` words of the word tokenizer's vocabulary (one token each; the base
/// layout's blank lines are whitespace, no token).
fn answers(n: usize) -> Vec<QaExample> {
    (1..=n)
        .map(|k| QaExample {
            question: "w3".into(),
            answer: (0..k)
                .map(|i| format!("w{}", 3 + i % 60))
                .collect::<Vec<_>>()
                .join(" "),
        })
        .collect()
}

fn word_tokenizer() -> Tokenizer {
    Tokenizer::from_json_parts(
        &common::word_tokenizer_json(),
        None,
        std::path::Path::new("tokenizer.json"),
    )
    .unwrap()
}

#[test]
fn the_budget_covers_the_quantile_of_the_reference_solutions() {
    let tok = word_tokenizer();
    // 100 answers of 1..=100 tokens: the nearest-rank 99th percentile is 99 tokens, the
    // median (lower) 50, the longest 100; 99 rounded up to a multiple of 16 is 112.
    let b = reference_token_budget(&tok, &answers(100), REFERENCE_BUDGET_QUANTILE).unwrap();
    assert_eq!(
        (
            b.problems,
            b.tokens_at_quantile,
            b.median_tokens,
            b.max_tokens,
            b.max_new_tokens
        ),
        (100, 99, 50, 100, 112)
    );
    // The quantile 1 is the longest answer; 0 the shortest (rank 1).
    assert_eq!(
        reference_token_budget(&tok, &answers(100), 1.0)
            .unwrap()
            .tokens_at_quantile,
        100
    );
    assert_eq!(
        reference_token_budget(&tok, &answers(100), 0.0)
            .unwrap()
            .tokens_at_quantile,
        1
    );
    // Nothing to size on, or a quantile outside [0, 1]: typed errors, no panic.
    assert!(reference_token_budget(&tok, &[], 0.99).is_err());
    let e = reference_token_budget(&tok, &answers(3), 1.5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("quantile"), "{e}");
}

#[test]
fn max_new_tokens_reads_a_count_or_auto() {
    assert_eq!(
        "auto".parse::<MaxNewTokens>().unwrap(),
        MaxNewTokens::FromReferences
    );
    assert_eq!(
        "96".parse::<MaxNewTokens>().unwrap(),
        MaxNewTokens::Fixed(96)
    );
    assert_eq!(MaxNewTokens::FromReferences.to_string(), "auto");
    assert_eq!(
        serde_json::to_value(MaxNewTokens::Fixed(8)).unwrap(),
        serde_json::json!(8)
    );
    assert_eq!(
        serde_json::to_value(MaxNewTokens::FromReferences).unwrap(),
        serde_json::json!("auto")
    );
    let e = "lots".parse::<MaxNewTokens>().unwrap_err().to_string();
    assert!(e.contains("max-new-tokens"), "{e}");
}
