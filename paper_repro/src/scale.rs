//! Run sizes: `smoke` (minutes, CI), `small` (SmolLM2-135M on the CPU), `paper` (the paper's setting).

use clap::ValueEnum;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Scale {
    Smoke,
    Small,
    Paper,
}

/// Sizes of one scale.
pub struct Limits {
    /// GSM8K test problems of the answer-NLL figure (the primary signal).
    pub nll_eval: usize,
    /// GSM8K test problems of the exact-match figures (greedy generation).
    pub gsm8k_eval: usize,
    pub max_new_tokens: usize,
    pub train_steps: usize,
    pub batch_size: usize,
    pub seq_len: usize,
    pub held_out: usize,
    pub bench: bool,
}

impl Scale {
    pub fn limits(self) -> Limits {
        match self {
            Scale::Smoke => Limits {
                nll_eval: 2,
                gsm8k_eval: 2,
                max_new_tokens: 32,
                train_steps: 2,
                batch_size: 1,
                seq_len: 64,
                held_out: 2,
                bench: false,
            },
            Scale::Small => Limits {
                nll_eval: 300,
                gsm8k_eval: 30,
                max_new_tokens: 200,
                train_steps: 200,
                batch_size: 2,
                seq_len: 128,
                held_out: 16,
                bench: true,
            },
            Scale::Paper => Limits {
                nll_eval: 1319,
                gsm8k_eval: 1319,
                max_new_tokens: 256,
                train_steps: 2000,
                batch_size: 8,
                seq_len: 256,
                held_out: 64,
                bench: true,
            },
        }
    }
}
