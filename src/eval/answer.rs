//! Numeric answer extraction and exact match for GSM8K-style outputs.
//!
//! Extraction order: the first number after the last `####`; else the first number after the
//! last "the answer is" (case-insensitive); else the last number in the text. Numbers are
//! normalised (thousands separators, `$`, trailing `.`/zeros removed) so `1,000.00` == `1000`.

/// The numeric answer of a model output or reference, normalised; `None` if no number.
pub fn extract_answer(text: &str) -> Option<String> {
    if let Some(pos) = text.rfind("####") {
        if let Some(n) = numbers(&text[pos + 4..]).into_iter().next() {
            return Some(n);
        }
    }
    let lower = text.to_lowercase();
    // `to_lowercase` may change byte offsets for non-ASCII text; only use the hit when the
    // lengths agree (always true for ASCII).
    if lower.len() == text.len() {
        if let Some(pos) = lower.rfind("the answer is") {
            if let Some(n) = numbers(&text[pos + "the answer is".len()..])
                .into_iter()
                .next()
            {
                return Some(n);
            }
        }
    }
    numbers(text).pop()
}

/// True when both texts yield the same normalised number.
pub fn exact_match(prediction: &str, reference: &str) -> bool {
    match (extract_answer(prediction), extract_answer(reference)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// All numbers in `text`, in order, normalised.
pub fn numbers(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let neg = b[i] == b'-' && i + 1 < b.len() && b[i + 1].is_ascii_digit();
        if b[i].is_ascii_digit() || neg {
            let start = i;
            i += 1;
            // digits, thousands commas followed by 3 digits, one decimal point followed by a digit
            let mut seen_dot = false;
            while i < b.len() {
                let c = b[i];
                let next_digit = i + 1 < b.len() && b[i + 1].is_ascii_digit();
                // A thousands comma is followed by exactly 3 digits.
                let thousands_comma = c == b',' && !seen_dot && i + 3 < b.len() + 1 && {
                    let run = b[i + 1..].iter().take_while(|x| x.is_ascii_digit()).count();
                    run == 3
                };
                if c.is_ascii_digit() || thousands_comma {
                    i += 1;
                } else if c == b'.' && !seen_dot && next_digit {
                    seen_dot = true;
                    i += 1;
                } else {
                    break;
                }
            }
            if let Some(n) = normalize_number(&text[start..i]) {
                out.push(n);
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Canonical form of a number literal: no commas, no trailing zeros after a decimal point,
/// `-0` → `0`. Returns `None` if it does not parse.
pub fn normalize_number(s: &str) -> Option<String> {
    let cleaned: String = s
        .trim()
        .trim_start_matches('$')
        .trim_end_matches('.')
        .chars()
        .filter(|&c| c != ',')
        .collect();
    cleaned.parse::<f64>().ok()?;
    let mut n = cleaned;
    if n.contains('.') {
        n = n.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    if n == "-0" || n.is_empty() {
        n = "0".into();
    }
    Some(n)
}
