//! Dense f32 weights of a decoder, in HF layout, shared by every model path.
//!
//! Linear weights are stored `[out, in]` (PyTorch `nn.Linear` layout) so `y = x · Wᵀ`.
//! Q/K rows are in the HF *half-split* RoPE order; the GGUF loader converts from
//! GGUF's interleaved order at load time.

use ndarray::{Array1, Array2};

use super::config::{LayerAttention, ModelConfig};

/// What a Gemma 3 block adds to a Llama-style one (its norm gains and how it attends), for
/// any storage of the gains: owned ([`Gemma3Block`]) or borrowed (`model::block_view::Gemma3Ref`).
#[derive(Clone, Copy, Debug)]
pub struct GemmaParts<V> {
    /// `[D]` RMSNorm gain applied to every query head before RoPE.
    pub q_norm: V,
    /// `[D]` RMSNorm gain applied to every key head before RoPE.
    pub k_norm: V,
    /// `[C]` RMSNorm gain of the attention output, before the residual add.
    pub post_attn_norm: V,
    /// `[C]` RMSNorm gain of the MLP output, before the residual add.
    pub post_mlp_norm: V,
    /// The layer's window (local layers) and RoPE base: an ELM module cut from this layer
    /// attends the same way.
    pub attention: LayerAttention,
}

/// Gemma 3's additions to a block, owned.
pub type Gemma3Block = GemmaParts<Array1<f32>>;

impl<V> GemmaParts<V> {
    /// The same parts with every gain mapped by `f` (borrowing them, say).
    pub fn map<'a, U>(&'a self, mut f: impl FnMut(&'a V) -> U) -> GemmaParts<U> {
        GemmaParts {
            q_norm: f(&self.q_norm),
            k_norm: f(&self.k_norm),
            post_attn_norm: f(&self.post_attn_norm),
            post_mlp_norm: f(&self.post_mlp_norm),
            attention: self.attention,
        }
    }
}

impl Gemma3Block {
    /// Number of scalar parameters (the four norm gains).
    pub fn num_params(&self) -> usize {
        self.q_norm.len() + self.k_norm.len() + self.post_attn_norm.len() + self.post_mlp_norm.len()
    }
}

/// One decoder block, described once for every storage of its projections: `W` is an f32
/// matrix ([`LayerWeights`], the training and reference form) or a `crate::quant::Linear` in any
/// block format (`super::QLayer`, the inference form). Norm gains and biases stay f32 in every
/// storage: they are tiny. The tape's parameters (`model::tape::BlockParams`) and the kernels'
/// borrowed view (`model::block_view::BlockRef`) are built from it.
#[derive(Clone, Debug)]
pub struct Block<W> {
    /// `[C]` RMSNorm gain before attention.
    pub attn_norm: Array1<f32>,
    /// `[H*D, C]`
    pub wq: W,
    /// `[KV*D, C]`
    pub wk: W,
    /// `[KV*D, C]`
    pub wv: W,
    /// `[C, H*D]`
    pub wo: W,
    /// `[H*D]` (Qwen2 only)
    pub bq: Option<Array1<f32>>,
    /// `[KV*D]` (Qwen2 only)
    pub bk: Option<Array1<f32>>,
    /// `[KV*D]` (Qwen2 only)
    pub bv: Option<Array1<f32>>,
    /// `[C]` RMSNorm gain before the MLP.
    pub mlp_norm: Array1<f32>,
    /// `[I, C]`
    pub w_gate: W,
    /// `[I, C]`
    pub w_up: W,
    /// `[C, I]`
    pub w_down: W,
    /// Gemma 3 only: its extra norms and its layer's attention.
    pub gemma: Option<Gemma3Block>,
}

/// Weights of one decoder block in f32.
pub type LayerWeights = Block<Array2<f32>>;

impl<W> Block<W> {
    /// The same block with every projection mapped by `proj` (norms, biases and Gemma's parts
    /// cloned): quantizing a block, or dequantizing one.
    pub fn map_projections<V>(&self, mut proj: impl FnMut(&W) -> V) -> Block<V> {
        Block {
            attn_norm: self.attn_norm.clone(),
            wq: proj(&self.wq),
            wk: proj(&self.wk),
            wv: proj(&self.wv),
            wo: proj(&self.wo),
            bq: self.bq.clone(),
            bk: self.bk.clone(),
            bv: self.bv.clone(),
            mlp_norm: self.mlp_norm.clone(),
            w_gate: proj(&self.w_gate),
            w_up: proj(&self.w_up),
            w_down: proj(&self.w_down),
            gemma: self.gemma.clone(),
        }
    }

    /// The seven projections, in the one order (q, k, v, o, gate, up, down).
    pub fn projections(&self) -> [&W; 7] {
        [
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.w_gate,
            &self.w_up,
            &self.w_down,
        ]
    }

    /// Scalars outside the projections: norm gains, biases and Gemma 3's norms (f32 in every
    /// storage).
    pub fn vector_params(&self) -> usize {
        let opt = |b: &Option<Array1<f32>>| b.as_ref().map_or(0, |b| b.len());
        self.attn_norm.len()
            + opt(&self.bq)
            + opt(&self.bk)
            + opt(&self.bv)
            + self.mlp_norm.len()
            + self.gemma.as_ref().map_or(0, Gemma3Block::num_params)
    }
}

/// All weights of a decoder-only model.
#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub config: ModelConfig,
    /// `[V, C]`
    pub embed: Array2<f32>,
    pub layers: Vec<LayerWeights>,
    /// `[C]`
    pub final_norm: Array1<f32>,
    /// `[V, C]`; `None` when tied to `embed`.
    pub lm_head: Option<Array2<f32>>,
}

impl ModelWeights {
    /// The LM head matrix `[V, C]` (the embedding when tied).
    pub fn lm_head(&self) -> &Array2<f32> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Every matrix of the model registered as unchanging while borrowed: large products pack
    /// each once (see [`crate::gemm::FrozenWeights`]).
    pub fn frozen(&self) -> crate::gemm::FrozenWeights<'_> {
        let mut f = crate::gemm::FrozenWeights::new();
        f.borrow(&self.embed);
        if let Some(head) = &self.lm_head {
            f.borrow(head);
        }
        for l in &self.layers {
            for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                f.borrow(w);
            }
        }
        f
    }

    /// What scoring passes over fixed weights keep packed while the returned value lives: the
    /// LM head always (its products have few rows, so packing it would dominate them); under
    /// bf16 every matrix too (their packing also rounds, and bf16 packs take half the
    /// weight's size).
    pub fn frozen_for_scoring(&self) -> crate::gemm::FrozenWeights<'_> {
        if crate::gemm::precision() == crate::gemm::Precision::Bf16 {
            self.frozen()
        } else {
            let mut f = crate::gemm::FrozenWeights::new();
            f.borrow(self.lm_head());
            f
        }
    }
}

impl LayerWeights {
    /// Number of scalar parameters in this block.
    pub fn num_params(&self) -> usize {
        self.projections().iter().map(|w| w.len()).sum::<usize>() + self.vector_params()
    }
}

/// A feed-forward-only block `x + MLP(RMSNorm(x))`: a decoder block without its attention
/// sublayer (LLM-Streamline's FFN replacement), names as in [`Block`], for every storage of its
/// projections ([`FfnWeights`] in f32, `super::QFfn` in any format).
#[derive(Clone, Debug)]
pub struct Ffn<W> {
    /// `[C]` RMSNorm gain before the MLP.
    pub mlp_norm: Array1<f32>,
    /// `[I, C]`
    pub w_gate: W,
    /// `[I, C]`
    pub w_up: W,
    /// `[C, I]`
    pub w_down: W,
}

/// A feed-forward-only block in f32.
pub type FfnWeights = Ffn<Array2<f32>>;

impl<W> Ffn<W> {
    /// The same block with every projection mapped by `proj` (the norm cloned).
    pub fn map_projections<V>(&self, mut proj: impl FnMut(&W) -> V) -> Ffn<V> {
        Ffn {
            mlp_norm: self.mlp_norm.clone(),
            w_gate: proj(&self.w_gate),
            w_up: proj(&self.w_up),
            w_down: proj(&self.w_down),
        }
    }
}

impl FfnWeights {
    /// The MLP half (norm and SwiGLU) of a decoder block.
    pub fn from_layer(l: &LayerWeights) -> Self {
        FfnWeights {
            mlp_norm: l.mlp_norm.clone(),
            w_gate: l.w_gate.clone(),
            w_up: l.w_up.clone(),
            w_down: l.w_down.clone(),
        }
    }

    /// Number of scalar parameters in this block.
    pub fn num_params(&self) -> usize {
        self.mlp_norm.len() + self.w_gate.len() + self.w_up.len() + self.w_down.len()
    }
}

impl ModelWeights {
    /// Seeded random weights for tests and examples (any config, e.g. [`ModelConfig::tiny`]).
    ///
    /// Linear weights ~ N(0, 1/in) so activations keep unit scale through depth;
    /// norm gains ~ 1 + N(0, 0.1²) and biases ~ N(0, 0.1²) so that no parameter is
    /// trivially the identity (tests then exercise every term of the math).
    pub fn random(config: &ModelConfig, seed: u64) -> Self {
        use rand::{rngs::StdRng, SeedableRng};
        use rand_distr::{Distribution, Normal};

        let mut rng = StdRng::seed_from_u64(seed);
        let mut normal = |shape: (usize, usize), std: f32| -> Array2<f32> {
            let dist = Normal::new(0.0f32, std).expect("finite std");
            Array2::from_shape_simple_fn(shape, || dist.sample(&mut rng))
        };
        let (c, i, v) = (
            config.hidden_size,
            config.intermediate_size,
            config.vocab_size,
        );
        let (hd, kvd) = (
            config.num_heads * config.head_dim,
            config.num_kv_heads * config.head_dim,
        );
        let inv_sqrt = |n: usize| 1.0 / (n as f32).sqrt();
        let vector = |a: Array2<f32>| {
            let n = a.len();
            a.into_shape_with_order(n).expect("[1, N]")
        };
        // A norm gain of any width (C, or D for Gemma 3's q/k norms): 1 + the noise.
        let gain = |a: Array2<f32>| vector(a) + 1.0;

        let embed = normal((v, c), 1.0);
        let mut layers = Vec::with_capacity(config.num_layers);
        for layer in 0..config.num_layers {
            let bias = config.attention_bias;
            layers.push(LayerWeights {
                attn_norm: gain(normal((1, c), 0.1)),
                wq: normal((hd, c), inv_sqrt(c)),
                wk: normal((kvd, c), inv_sqrt(c)),
                wv: normal((kvd, c), inv_sqrt(c)),
                wo: normal((c, hd), inv_sqrt(hd)),
                bq: bias.then(|| vector(normal((1, hd), 0.1))),
                bk: bias.then(|| vector(normal((1, kvd), 0.1))),
                bv: bias.then(|| vector(normal((1, kvd), 0.1))),
                mlp_norm: gain(normal((1, c), 0.1)),
                w_gate: normal((i, c), inv_sqrt(c)),
                w_up: normal((i, c), inv_sqrt(c)),
                w_down: normal((c, i), inv_sqrt(i)),
                gemma: config.has_gemma_norms().then(|| Gemma3Block {
                    q_norm: gain(normal((1, config.head_dim), 0.1)),
                    k_norm: gain(normal((1, config.head_dim), 0.1)),
                    post_attn_norm: gain(normal((1, c), 0.1)),
                    post_mlp_norm: gain(normal((1, c), 0.1)),
                    attention: config.layer_attention(layer),
                }),
            });
        }
        let final_norm = gain(normal((1, c), 0.1));
        let lm_head = (!config.tie_word_embeddings).then(|| normal((v, c), inv_sqrt(c)));
        ModelWeights {
            config: config.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
        }
    }

    /// Number of scalar parameters (the LM head counted once when tied).
    pub fn num_params(&self) -> usize {
        self.embed.len()
            + self.layers.iter().map(|l| l.num_params()).sum::<usize>()
            + self.final_norm.len()
            + self.lm_head.as_ref().map_or(0, |w| w.len())
    }
}
