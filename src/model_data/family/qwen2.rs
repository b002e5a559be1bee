//! Qwen2: Llama's block with q/k/v biases, always; its GGUFs keep HF's row order.

use super::facts::{Activation, Arch, BiasRule, Family, TinySwitches};

pub(super) const FAMILY: Family = Family {
    arch: Arch::Qwen2,
    display_name: "Qwen2",
    gguf_name: "qwen2",
    hf_model_type: "qwen2",
    hf_class: "Qwen2ForCausalLM",
    activation: Activation::SwiGlu,
    hf_activation: ("hidden_act", "silu"),
    attention_bias: BiasRule::Always,
    gguf_permutes_qk_rows: false,
    hf_norm_gain_offset: 0.0,
    extra_norms: false,
    scales_embeddings: false,
    windows: None,
    hf_extra_keys: &[],
    // Biases, and an untied head, so that the tiny models exercise both head layouts.
    tiny: TinySwitches {
        tie_word_embeddings: false,
        attention_bias: true,
        windows: None,
    },
};
