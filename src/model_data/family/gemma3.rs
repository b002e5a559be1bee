//! Gemma 3 (text): per-head RMSNorm of q and k, an RMSNorm after each sublayer (before the
//! residual add), a GeGLU MLP with GELU's tanh approximation, embeddings scaled by `√C`, and
//! local sliding-window layers with their own RoPE base, one global layer every 6 (llama.cpp's
//! `src/models/gemma3.cpp` and `llama-hparams.cpp`). HF stores its norm gains as `gain − 1`.

use super::facts::{Activation, Arch, BiasRule, Family, TinySwitches, TinyWindows, WindowRules};

pub(super) const FAMILY: Family = Family {
    arch: Arch::Gemma3,
    display_name: "Gemma 3",
    gguf_name: "gemma3",
    hf_model_type: "gemma3_text",
    hf_class: "Gemma3ForCausalLM",
    activation: Activation::GeGluTanh,
    hf_activation: ("hidden_activation", "gelu_pytorch_tanh"),
    attention_bias: BiasRule::Optional,
    gguf_permutes_qk_rows: false,
    hf_norm_gain_offset: 1.0,
    extra_norms: true,
    scales_embeddings: true,
    windows: Some(WindowRules {
        default_pattern: 6,
        default_local_theta: 10_000.0,
    }),
    hf_extra_keys: &[
        "sliding_window",
        "sliding_window_pattern",
        "_sliding_window_pattern",
        "layer_types",
        "rope_local_base_freq",
        "query_pre_attn_scalar",
        "hidden_activation",
        "hidden_act",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "use_bidirectional_attention",
    ],
    // A local layer (window 2, RoPE base 1000) then a global one, twice: three tokens already
    // exercise both.
    tiny: TinySwitches {
        tie_word_embeddings: true,
        attention_bias: false,
        windows: Some(TinyWindows {
            window: 2,
            pattern: 2,
            local_theta: 1000.0,
        }),
    },
};
