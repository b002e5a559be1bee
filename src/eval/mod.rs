//! Evaluation: GSM8K exact match (answer extraction) and perplexity.

pub mod answer;

pub use answer::{exact_match, extract_answer};
