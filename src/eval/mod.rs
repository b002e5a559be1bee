//! Evaluation: GSM8K exact match (answer extraction), answer perplexity, solver statistics.

pub mod answer;
pub mod gsm8k;

pub use answer::{exact_match, extract_answer};
pub use gsm8k::{eval_gsm8k, Gsm8kOptions, Gsm8kResult, SolverSummary};
