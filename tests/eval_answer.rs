//! Answer extraction / exact match on hand-written GSM8K-style strings and on the real
//! GSM8K references (every reference must yield the number after its `####`).

use elm::eval::answer::{exact_match, extract_answer, normalize_number, numbers};

#[test]
fn extraction_priority_hash_then_phrase_then_last_number() {
    assert_eq!(extract_answer("a 3 b 4\n#### 72").as_deref(), Some("72"));
    assert_eq!(extract_answer("#### 5 then 9 later").as_deref(), Some("5"));
    assert_eq!(
        extract_answer("So 3+4=7. The answer is 12 apples, not 13.").as_deref(),
        Some("12")
    );
    assert_eq!(
        extract_answer("THE ANSWER IS $1,250.").as_deref(),
        Some("1250")
    );
    assert_eq!(
        extract_answer("we get 3, then 4, finally 18.").as_deref(),
        Some("18")
    );
    assert_eq!(extract_answer("no digits here"), None);
}

#[test]
fn number_normalisation() {
    assert_eq!(normalize_number("1,000.00").as_deref(), Some("1000"));
    assert_eq!(normalize_number("$35").as_deref(), Some("35"));
    assert_eq!(normalize_number("-0.50").as_deref(), Some("-0.5"));
    assert_eq!(normalize_number("7.").as_deref(), Some("7"));
    assert_eq!(
        numbers("costs $1,200, or 3.5 each, -4 left; list 1,2,3"),
        vec!["1200", "3.5", "-4", "1", "2", "3"]
    );
}

#[test]
fn exact_match_semantics() {
    assert!(exact_match("The answer is 1,000", "blah\n#### 1000"));
    assert!(exact_match("= 18.00 dollars", "#### 18"));
    assert!(!exact_match("The answer is 17", "#### 18"));
    assert!(!exact_match("I don't know", "#### 18"));
}

#[test]
fn real_gsm8k_references_extract_their_final_answer() {
    let Ok(dir) = elm::elm::data::resolve_data_dir(None) else {
        assert!(std::env::var("CI").is_err(), "GSM8K data missing in CI");
        eprintln!("skipping: no data dir");
        return;
    };
    let path = elm::elm::data::gsm8k_path(&dir, elm::elm::data::Split::Test);
    if !path.exists() {
        assert!(std::env::var("CI").is_err(), "GSM8K data missing in CI");
        eprintln!("skipping: {} absent", path.display());
        return;
    }
    let test = elm::elm::data::load_gsm8k(&dir, elm::elm::data::Split::Test).unwrap();
    assert_eq!(test.len(), 1319, "GSM8K test has 1319 problems");
    for ex in &test {
        let tail = ex
            .answer
            .rsplit("####")
            .next()
            .unwrap()
            .trim()
            .replace(',', "");
        let got = extract_answer(&ex.answer).expect("reference has a number");
        let want: f64 = tail.parse().unwrap();
        assert_eq!(got.parse::<f64>().unwrap(), want, "answer: {}", ex.answer);
        assert!(exact_match(&ex.answer, &ex.answer));
    }
}
