//! Architecture hyper-parameters shared by every model path (training, inference, GPU, ELM).

use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};
use crate::model_data::family::facts::Family;
pub use crate::model_data::family::facts::{Activation, Arch};

/// How one layer attends: its RoPE base and, for a local layer, its window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttention {
    /// `Some(w)`: query `i` sees keys `i − w + 1 ..= i` only.
    pub window: Option<usize>,
    pub rope_theta: f32,
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
    /// Sliding-window attention: local layers see only the last `sliding_window` positions
    /// (Gemma 3: 512). Absent: every layer is global.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// With `sliding_window`: layer `l` is global when `(l + 1) % pattern == 0`, local
    /// otherwise (Gemma 3: 6, so layers 5, 11, 17 of 18 are global). Absent: all local.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_pattern: Option<usize>,
    /// RoPE base of the local layers (Gemma 3: 10,000, which llama.cpp hard-codes; the global
    /// layers use `rope_theta`). Absent: `rope_theta` everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_local_theta: Option<f32>,
}

impl ModelConfig {
    /// How layer `l` attends (see the fields above).
    pub fn layer_attention(&self, l: usize) -> LayerAttention {
        let local = self.sliding_window.is_some()
            && self
                .sliding_window_pattern
                .is_none_or(|p| !(l + 1).is_multiple_of(p));
        if local {
            LayerAttention {
                window: self.sliding_window,
                rope_theta: self.rope_local_theta.unwrap_or(self.rope_theta),
            }
        } else {
            LayerAttention {
                window: None,
                rope_theta: self.rope_theta,
            }
        }
    }

    /// The family's facts ([`Arch::family`]).
    pub fn family(&self) -> &'static Family {
        self.arch.family()
    }

    /// Per-head RMSNorm of q and k, and an RMSNorm after each sublayer (Gemma 3).
    pub fn has_gemma_norms(&self) -> bool {
        self.family().extra_norms
    }

    /// The MLP's activation.
    pub fn activation(&self) -> Activation {
        self.family().activation
    }

    /// What the token embeddings are multiplied by before the first layer (`√C` for Gemma 3,
    /// in f32 as llama.cpp computes it).
    pub fn embedding_scale(&self) -> Option<f32> {
        self.family()
            .scales_embeddings
            .then(|| (self.hidden_size as f32).sqrt())
    }

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
        // Every writer stores these as u32 (GGUF's type for them): a larger value is refused
        // here rather than truncated by a writer.
        for (field, v) in positive {
            if u32::try_from(v).is_err() {
                return Err(ElmError::config(field, format!("{v} exceeds u32")));
            }
        }
        if let Some(w) = self.sliding_window.filter(|&w| u32::try_from(w).is_err()) {
            return Err(ElmError::config(
                "sliding_window",
                format!("{w} exceeds u32"),
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
        if self.sliding_window == Some(0) {
            return Err(ElmError::config("sliding_window", "must be > 0"));
        }
        if self.sliding_window_pattern == Some(0) {
            return Err(ElmError::config("sliding_window_pattern", "must be > 0"));
        }
        if let Some(t) = self.rope_local_theta {
            if !(t.is_finite() && t > 0.0) {
                return Err(ElmError::config(
                    "rope_local_theta",
                    "must be finite and > 0",
                ));
            }
        }
        Ok(())
    }

    /// Query heads per KV head (GQA group size).
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// A tiny config for tests and examples: `vocab 64, C 32, I 48, 4 layers, 4 heads of 8,
    /// 2 KV heads, context 128`, with the family's own switches ([`Family::tiny`]).
    pub fn tiny(arch: Arch) -> Self {
        let tiny = arch.family().tiny;
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
            tie_word_embeddings: tiny.tie_word_embeddings,
            attention_bias: tiny.attention_bias,
            bos_token_id: Some(1),
            eos_token_id: Some(2),
            sliding_window: tiny.windows.map(|w| w.window),
            sliding_window_pattern: tiny.windows.map(|w| w.pattern),
            rope_local_theta: tiny.windows.map(|w| w.local_theta),
        }
    }
}
