//! GSM8K answer extraction and exact match, as EleutherAI's lm-evaluation-harness defines
//! them (task `gsm8k`, version 3):
//!
//! - **strict-match**: the first match of `#### (\-?[0-9\.\,]+)`, its group;
//! - **flexible-extract**: the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`, its non-empty
//!   group (so a lone digit counts, and `$5,` or `18.` are taken whole);
//!
//! a response without a match becomes `[invalid]`. `exact_match` then applies the metric's
//! `regexes_to_ignore` (`,`, `\$`, `(?s).*#### `, `\.$`, in this order) and `ignore_case` to
//! both the extracted answer and the full reference solution, and compares the strings.
//! So `1,000` == `1000` and `$18.` == `18`, but `18.00` != `18` (the harness compares text,
//! not numbers). The regular expressions are written out by hand below (no regex crate).

/// What the harness's regex filter returns when nothing matches.
pub const INVALID: &str = "[invalid]";

/// Strict-match extraction: the number after the first `#### ` (or [`INVALID`]).
pub fn strict_extract(text: &str) -> String {
    let b = text.as_bytes();
    let mut from = 0;
    while let Some(pos) = text[from..].find("#### ") {
        let start = from + pos + "#### ".len();
        // `\-?[0-9\.\,]+`: the optional minus is only kept when a class char follows it.
        let class = |c: u8| c.is_ascii_digit() || c == b'.' || c == b',';
        let run_from = |i: usize| b[i..].iter().take_while(|&&c| class(c)).count();
        let sign = usize::from(b.get(start) == Some(&b'-'));
        let run = run_from(start + sign);
        if run > 0 {
            return text[start..start + sign + run].to_string();
        }
        from = start;
    }
    INVALID.to_string()
}

/// Flexible extraction: the last number-like token of the text (or [`INVALID`]).
pub fn flexible_extract(text: &str) -> String {
    flexible_matches(text)
        .pop()
        .map_or_else(|| INVALID.to_string(), |m| m.trim().to_string())
}

/// Every match of `(-?[$0-9.,]{2,})|(-?[0-9]+)` in order (Python `re.findall` semantics:
/// leftmost, first alternative first, greedy, non-overlapping).
pub fn flexible_matches(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let class = |c: u8| c.is_ascii_digit() || c == b'$' || c == b'.' || c == b',';
    let class_run = |i: usize| b[i..].iter().take_while(|&&c| class(c)).count();
    let digit_run = |i: usize| b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let sign = usize::from(b[i] == b'-');
        // Alternative 1 with the minus, then without it (a `-` is not in the class, so
        // without it the match cannot start here); then alternative 2 likewise.
        let len = if class_run(i + sign) >= 2 {
            sign + class_run(i + sign)
        } else if sign == 0 && class_run(i) >= 2 {
            class_run(i)
        } else if digit_run(i + sign) >= 1 {
            sign + digit_run(i + sign)
        } else {
            0
        };
        if len > 0 {
            out.push(&text[i..i + len]);
            i += len;
        } else {
            // Advance by one character (keep UTF-8 boundaries).
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// The metric's normalisation: drop `,` and `$`, everything up to the last `#### `, one
/// trailing `.` (Python's `\.$` also matches before a final newline), then lowercase.
pub fn normalize(text: &str) -> String {
    let mut s: String = text.chars().filter(|&c| c != ',' && c != '$').collect();
    if let Some(pos) = s.rfind("#### ") {
        s.drain(..pos + "#### ".len());
    }
    if s.ends_with('.') {
        s.pop();
    } else if s.ends_with(".\n") {
        s.remove(s.len() - 2);
    }
    s.to_lowercase()
}

/// Exact match of an extracted answer against the full reference solution.
pub fn exact_match(extracted: &str, reference: &str) -> bool {
    normalize(extracted) == normalize(reference)
}

/// Both harness scores of one model response.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AnswerScore {
    pub strict: String,
    pub flexible: String,
    pub strict_correct: bool,
    pub flexible_correct: bool,
}

/// Extracts and scores `response` against the reference solution (`... #### N`).
pub fn score_response(response: &str, reference: &str) -> AnswerScore {
    let strict = strict_extract(response);
    let flexible = flexible_extract(response);
    AnswerScore {
        strict_correct: exact_match(&strict, reference),
        flexible_correct: exact_match(&flexible, reference),
        strict,
        flexible,
    }
}

/// The reference's final answer (the text after the last `#### `, trimmed) when it is a
/// number the strict rule would extract in full; `None` marks a malformed reference.
pub fn reference_answer(answer: &str) -> Option<String> {
    let pos = answer.rfind("#### ")?;
    let tail = answer[pos + "#### ".len()..].trim();
    let extracted = strict_extract(&answer[pos..]);
    let is_number = tail.chars().any(|c| c.is_ascii_digit());
    (is_number && extracted == tail).then(|| tail.to_string())
}
