//! Architecture hyper-parameters shared by every model path (training, inference, GPU, ELM).

use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};

/// Decoder-only families we implement. They differ only in q/k/v bias and defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Qwen2,
}

/// Most layers a model config may declare.
pub const MAX_LAYERS: usize = 65_536;
/// Largest context length (`max_position_embeddings`) a model config may declare (2^24).
pub const MAX_CONTEXT: usize = 1 << 24;

/// Hyper-parameters of a Llama/Qwen2 decoder.
///
/// Shapes used throughout the crate: `C = hidden_size`, `H = num_heads`,
/// `KV = num_kv_heads`, `D = head_dim`, `I = intermediate_size`, `V = vocab_size`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    /// LM head shares the token-embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2).
    pub attention_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
}

impl ModelConfig {
    /// Checks internal consistency; every loader and constructor calls this.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(ElmError::config(field, "must be > 0"));
            }
        }
        // Loops over layers and position tables are sized by these: bound them where a
        // corrupt or hand-edited file would otherwise run for ever.
        if self.num_layers > MAX_LAYERS {
            return Err(ElmError::config(
                "num_layers",
                format!("{} exceeds the cap of {MAX_LAYERS}", self.num_layers),
            ));
        }
        if self.max_position_embeddings > MAX_CONTEXT {
            return Err(ElmError::config(
                "max_position_embeddings",
                format!(
                    "{} exceeds the cap of {MAX_CONTEXT}",
                    self.max_position_embeddings
                ),
            ));
        }
        // Tensor sizes from a file must not overflow where they are multiplied out.
        crate::limits::checked_product("vocab_size", &[self.vocab_size, self.hidden_size])?;
        crate::limits::checked_product(
            "intermediate_size",
            &[self.intermediate_size, self.hidden_size],
        )?;
        crate::limits::checked_product("num_heads", &[self.num_heads, self.head_dim])?;
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(ElmError::config(
                "num_kv_heads",
                format!(
                    "{} does not divide num_heads {}",
                    self.num_kv_heads, self.num_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ElmError::config("head_dim", "must be even for RoPE"));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(ElmError::config("rope_theta", "must be finite and > 0"));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(ElmError::config("rms_norm_eps", "must be finite and > 0"));
        }
        Ok(())
    }

    /// Query heads per KV head (GQA group size).
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// A tiny config for tests and examples.
    pub fn tiny(arch: Arch) -> Self {
        ModelConfig {
            arch,
            vocab_size: 64,
            hidden_size: 32,
            intermediate_size: 48,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 128,
            tie_word_embeddings: arch == Arch::Llama,
            attention_bias: arch == Arch::Qwen2,
            bos_token_id: Some(1),
            eos_token_id: Some(2),
        }
    }
}
