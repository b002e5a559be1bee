//! Llama (SmolLM2 is one): the plain pre-norm block with SwiGLU; llama.cpp's converter permutes
//! the q/k rows of its GGUFs to interleaved-RoPE order.

use super::facts::{Activation, Arch, BiasRule, Family, TinySwitches};

pub(super) const FAMILY: Family = Family {
    arch: Arch::Llama,
    display_name: "Llama",
    gguf_name: "llama",
    hf_model_type: "llama",
    hf_class: "LlamaForCausalLM",
    activation: Activation::SwiGlu,
    hf_activation: ("hidden_act", "silu"),
    attention_bias: BiasRule::Optional,
    gguf_permutes_qk_rows: true,
    hf_norm_gain_offset: 0.0,
    extra_norms: false,
    scales_embeddings: false,
    windows: None,
    hf_extra_keys: &[],
    // Tied embeddings, no biases.
    tiny: TinySwitches {
        tie_word_embeddings: true,
        attention_bias: false,
        windows: None,
    },
};
