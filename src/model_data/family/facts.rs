//! The vocabulary of the family files: which families there are ([`Arch`]) and what a family
//! is ([`Family`]). It imports nothing of the model's, so that the config and every format can
//! read a family's facts without a loop.

use serde::{Deserialize, Serialize};

/// Decoder-only families we implement; what each is lives in its file beside this one
/// ([`Arch::family`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Qwen2,
    Gemma3,
}

/// The MLP's gated activation: `act(gate) · up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu(g) · u`.
    SwiGlu,
    /// `gelu_tanh(g) · u` (GELU's tanh approximation).
    GeGluTanh,
}

/// What a family is and how its files store it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Family {
    pub arch: Arch,
    /// The family's name for people (errors, tables).
    pub display_name: &'static str,
    /// GGUF `general.architecture`, also the prefix of its `{name}.*` metadata keys.
    pub gguf_name: &'static str,
    /// HF `config.json` `model_type`.
    pub hf_model_type: &'static str,
    /// HF `config.json` `architectures[0]`, the transformers class we write.
    pub hf_class: &'static str,
    /// The MLP's gated activation.
    pub activation: Activation,
    /// The activation as HF's `config.json` names it: `(key, value)`.
    pub hf_activation: (&'static str, &'static str),
    /// Whether q/k/v carry biases.
    pub attention_bias: BiasRule,
    /// llama.cpp's converter stores q and k rows in interleaved-RoPE order (its `permute`),
    /// which loading undoes and writing redoes.
    pub gguf_permutes_qk_rows: bool,
    /// An HF checkpoint stores a norm gain `g` as `g − offset` (Gemma's RMSNorm multiplies by
    /// `1 + weight`; GGUF and elm hold the gain itself).
    pub hf_norm_gain_offset: f32,
    /// Per-head RMSNorm of q and k, and an RMSNorm after each sublayer before the residual add.
    pub extra_norms: bool,
    /// Token embeddings multiplied by `√C` before the first layer.
    pub scales_embeddings: bool,
    /// Local sliding-window layers, and what the files leave unsaid about them.
    pub windows: Option<WindowRules>,
    /// `config.json` keys only this family holds: the HF reader reads or checks them (the
    /// window keys, the activation, and keys that must hold the family's defaults) instead of
    /// refusing them as unknown.
    pub hf_extra_keys: &'static [&'static str],
    /// The switches of the family's tiny test model (`ModelConfig::tiny`).
    pub tiny: TinySwitches,
}

/// Whether a family's q/k/v projections carry biases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BiasRule {
    /// Always (Qwen2): a `config.json` saying `attention_bias: false` is refused.
    Always,
    /// As the config's `attention_bias` says (false when absent).
    Optional,
}

/// A family with local sliding-window layers: what its files leave unsaid.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowRules {
    /// One global layer every `pattern` layers when a file does not say (llama.cpp hard-codes
    /// it for Gemma 3).
    pub default_pattern: usize,
    /// The local layers' RoPE base when a file does not say.
    pub default_local_theta: f32,
}

/// How a family's tiny test model differs from the shared tiny sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TinySwitches {
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub windows: Option<TinyWindows>,
}

/// A tiny model's local layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TinyWindows {
    pub window: usize,
    pub pattern: usize,
    pub local_theta: f32,
}
