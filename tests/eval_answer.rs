//! GSM8K extraction and exact match against Python's own `re` applying lm-evaluation-harness's
//! rules (fixture from tests/fixtures/gen/ref_gsm8k_extract.py), hand-checked tricky answers, and the
//! committed GSM8K files (checksums, every reference scores itself).

use elm::eval::answer::{exact_match, flexible_extract, score_response, strict_extract, INVALID};

fn fixture() -> serde_json::Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/eval/gsm8k_extract_ref.json"
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn extraction_matches_python_re_on_every_fixture_case() {
    let f = fixture();
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() > 200);
    let (mut strict_hits, mut flexible_hits) = (0, 0);
    for c in cases {
        let (resp, reference) = (
            c["response"].as_str().unwrap(),
            c["reference"].as_str().unwrap(),
        );
        let s = score_response(resp, reference);
        assert_eq!(
            s.strict,
            c["strict"].as_str().unwrap(),
            "strict of {resp:?}"
        );
        assert_eq!(
            s.flexible,
            c["flexible"].as_str().unwrap(),
            "flexible of {resp:?}"
        );
        assert_eq!(
            s.strict_correct,
            c["strict_correct"].as_bool().unwrap(),
            "{resp:?} vs {reference:?}"
        );
        assert_eq!(
            s.flexible_correct,
            c["flexible_correct"].as_bool().unwrap(),
            "{resp:?} vs {reference:?}"
        );
        strict_hits += usize::from(s.strict_correct);
        flexible_hits += usize::from(s.flexible_correct);
    }
    // The fixture has both outcomes for both rules (it asserts something).
    assert!(strict_hits > 0 && flexible_hits > strict_hits);
}

#[test]
fn tricky_answers_follow_the_harness() {
    let reference = "so 1000 in total\n#### 1,000";
    // Commas: thousands separators are dropped on both sides.
    assert!(exact_match(&strict_extract("#### 1,000"), reference));
    assert!(exact_match(&flexible_extract("That is 1,000."), reference));
    // `$` and a trailing period are dropped; trailing units are not part of the number.
    assert_eq!(flexible_extract("It costs $1,000."), "$1,000.");
    assert!(exact_match(
        &flexible_extract("It costs $1,000."),
        reference
    ));
    assert!(exact_match(&flexible_extract("1000 dollars"), reference));
    assert!(exact_match(&flexible_extract("speed 1000 km/h"), reference));
    // The harness compares text: 1000.00 is not 1000.
    assert!(!exact_match(&flexible_extract("1000.00"), reference));
    // Negatives.
    assert_eq!(strict_extract("#### -3"), "-3");
    assert_eq!(flexible_extract("from 5 down to -3"), "-3");
    assert!(exact_match(&strict_extract("#### -3"), "#### -3"));
    assert_eq!(flexible_extract("a-7"), "-7");
    // Decimals.
    assert_eq!(flexible_extract("half is 0.5"), "0.5");
    assert!(exact_match(&flexible_extract("0.5"), "#### 0.5"));
    // Strict needs `#### ` with its space; flexible takes the LAST number.
    assert_eq!(strict_extract("####1000"), INVALID);
    assert_eq!(strict_extract("#### 5\n#### 7"), "5");
    assert_eq!(flexible_extract("#### 5\n#### 7"), "7");
    assert_eq!(flexible_extract("no digits"), INVALID);
    assert!(!exact_match(INVALID, reference));
    // A lone digit is a number for the second alternative.
    assert_eq!(flexible_extract("x = 7"), "7");
}

#[test]
fn committed_gsm8k_files_are_the_pinned_ones_and_self_score() {
    use elm::data::{default_data_dir, gsm8k_final_answer, load_gsm8k, Split};
    let dir = default_data_dir();
    for (file, sha) in [
        (
            "test.jsonl",
            "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
        ),
        (
            "train.jsonl",
            "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
        ),
    ] {
        let out = std::process::Command::new("sha256sum")
            .arg(dir.join("gsm8k").join(file))
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with(sha),
            "{file}"
        );
    }
    assert!(dir.join("gsm8k/LICENSE").exists());
    let test = load_gsm8k(&dir, Split::Test).unwrap();
    assert_eq!(test.len(), 1319);
    // train.jsonl's 7,473 problems: 6,973 to train on and the last 500 for validation.
    assert_eq!(load_gsm8k(&dir, Split::Train).unwrap().len(), 6973);
    assert_eq!(load_gsm8k(&dir, Split::Validation).unwrap().len(), 500);
    for ex in &test {
        let n = gsm8k_final_answer(&ex.answer).unwrap();
        // The reference, written as `#### N`, scores 1 under both rules.
        let s = score_response(&format!("#### {n}"), &ex.answer);
        assert!(s.strict_correct && s.flexible_correct, "{:?}", ex.answer);
    }
}
