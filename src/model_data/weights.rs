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
    /// The same parts with every gain mapped by `f` (uploading them, say); the first error
    /// stops the walk.
    pub fn try_map<'a, U, E>(
        &'a self,
        mut f: impl FnMut(&'a V) -> Result<U, E>,
    ) -> Result<GemmaParts<U>, E> {
        Ok(GemmaParts {
            q_norm: f(&self.q_norm)?,
            k_norm: f(&self.k_norm)?,
            post_attn_norm: f(&self.post_attn_norm)?,
            post_mlp_norm: f(&self.post_mlp_norm)?,
            attention: self.attention,
        })
    }

    /// The same parts with every gain mapped by `f` (borrowing them, say).
    pub fn map<'a, U>(&'a self, mut f: impl FnMut(&'a V) -> U) -> GemmaParts<U> {
        infallible(self.try_map(|v| Ok(f(v))))
    }
}

impl Gemma3Block {
    /// Number of scalar parameters (the four norm gains).
    pub fn num_params(&self) -> usize {
        self.q_norm.len() + self.k_norm.len() + self.post_attn_norm.len() + self.post_mlp_norm.len()
    }
}

/// One decoder block, described once for every storage: `W` is what a projection is, `V` what a
/// norm gain or a bias is. The f32 reference form ([`LayerWeights`]: f32 matrices, f32 vectors)
/// and the inference form (`super::QLayer`: a `crate::quant::Linear` in any block format, f32
/// vectors) keep the vectors as f32 arrays, since they are tiny; the tape's parameters
/// (`model::tape::BlockParams`: one handle type for every tensor, a tape variable, a shared
/// tensor or a shape) and the kernels' borrowed view (`model::block_view::BlockRef`, built by
/// [`Block::try_map_with`]) are the same description over other types. The names and their
/// order are written once, in [`Block::try_map_with`].
#[derive(Clone, Debug)]
pub struct Block<W, V = Array1<f32>> {
    /// `[C]` RMSNorm gain before attention.
    pub attn_norm: V,
    /// `[H*D, C]`
    pub wq: W,
    /// `[KV*D, C]`
    pub wk: W,
    /// `[KV*D, C]`
    pub wv: W,
    /// `[C, H*D]`
    pub wo: W,
    /// `[H*D]` (Qwen2 only)
    pub bq: Option<V>,
    /// `[KV*D]` (Qwen2 only)
    pub bk: Option<V>,
    /// `[KV*D]` (Qwen2 only)
    pub bv: Option<V>,
    /// `[C]` RMSNorm gain before the MLP.
    pub mlp_norm: V,
    /// `[I, C]`
    pub w_gate: W,
    /// `[I, C]`
    pub w_up: W,
    /// `[C, I]`
    pub w_down: W,
    /// Gemma 3 only: its extra norms and its layer's attention.
    pub gemma: Option<GemmaParts<V>>,
}

/// Weights of one decoder block in f32.
pub type LayerWeights = Block<Array2<f32>>;

/// How [`Block::try_map_with`] and [`Ffn::try_map_with`] turn each tensor of a block into
/// another form: projections by [`Self::weight`], norm gains and biases by [`Self::vector`],
/// each with the tensor's name. One value carries the state both need (a tape, a device, a
/// list being filled), so the two can share it.
pub trait BlockMapper<'a, W: 'a, V: 'a> {
    type Weight;
    type Vector;
    type Error;
    fn weight(&mut self, name: &'static str, w: &'a W) -> Result<Self::Weight, Self::Error>;
    fn vector(&mut self, name: &'static str, v: &'a V) -> Result<Self::Vector, Self::Error>;
}

/// A [`BlockMapper`] for a block whose every tensor has one type `H`: one function serves both.
struct SameMapper<F>(F);

impl<'a, H: 'a, G, E, F: FnMut(&'static str, &'a H) -> Result<G, E>> BlockMapper<'a, H, H>
    for SameMapper<F>
{
    type Weight = G;
    type Vector = G;
    type Error = E;
    fn weight(&mut self, name: &'static str, w: &'a H) -> Result<G, E> {
        (self.0)(name, w)
    }
    fn vector(&mut self, name: &'static str, v: &'a H) -> Result<G, E> {
        (self.0)(name, v)
    }
}

/// The value of a mapping that cannot fail (`Result<T, Infallible>`).
pub(crate) fn infallible<T>(r: Result<T, std::convert::Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(never) => match never {},
    }
}

impl<W, V> Block<W, V> {
    /// The block with every tensor mapped by `m`, in the one fixed order of the block's tensors
    /// (the order checkpoints and the tape list them; names as the fields); the first error
    /// stops the walk. Gemma 3's attention (window, RoPE base) is copied.
    pub fn try_map_with<'a, M: BlockMapper<'a, W, V>>(
        &'a self,
        m: &mut M,
    ) -> Result<Block<M::Weight, M::Vector>, M::Error> {
        // Struct fields are evaluated in the order written: this is the order.
        Ok(Block {
            attn_norm: m.vector("attn_norm", &self.attn_norm)?,
            wq: m.weight("wq", &self.wq)?,
            wk: m.weight("wk", &self.wk)?,
            wv: m.weight("wv", &self.wv)?,
            wo: m.weight("wo", &self.wo)?,
            bq: self.bq.as_ref().map(|b| m.vector("bq", b)).transpose()?,
            bk: self.bk.as_ref().map(|b| m.vector("bk", b)).transpose()?,
            bv: self.bv.as_ref().map(|b| m.vector("bv", b)).transpose()?,
            mlp_norm: m.vector("mlp_norm", &self.mlp_norm)?,
            w_gate: m.weight("w_gate", &self.w_gate)?,
            w_up: m.weight("w_up", &self.w_up)?,
            w_down: m.weight("w_down", &self.w_down)?,
            gemma: match &self.gemma {
                Some(g) => Some(GemmaParts {
                    q_norm: m.vector("q_norm", &g.q_norm)?,
                    k_norm: m.vector("k_norm", &g.k_norm)?,
                    post_attn_norm: m.vector("post_attn_norm", &g.post_attn_norm)?,
                    post_mlp_norm: m.vector("post_mlp_norm", &g.post_mlp_norm)?,
                    attention: g.attention,
                }),
                None => None,
            },
        })
    }

    /// The same block with every projection mapped by `proj` (norms, biases and Gemma's parts
    /// cloned): quantizing a block, or dequantizing one.
    pub fn map_projections<U>(&self, proj: impl FnMut(&W) -> U) -> Block<U, V>
    where
        V: Clone,
    {
        struct Projections<F>(F);
        impl<'a, W: 'a, V: Clone + 'a, U, F: FnMut(&W) -> U> BlockMapper<'a, W, V> for Projections<F> {
            type Weight = U;
            type Vector = V;
            type Error = std::convert::Infallible;
            fn weight(&mut self, _: &'static str, w: &'a W) -> Result<U, Self::Error> {
                Ok((self.0)(w))
            }
            fn vector(&mut self, _: &'static str, v: &'a V) -> Result<V, Self::Error> {
                Ok(v.clone())
            }
        }
        infallible(self.try_map_with(&mut Projections(proj)))
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

    /// The block's MLP half as a feed-forward-only block (same names).
    pub fn ffn(&self) -> Ffn<W, V>
    where
        W: Clone,
        V: Clone,
    {
        Ffn {
            mlp_norm: self.mlp_norm.clone(),
            w_gate: self.w_gate.clone(),
            w_up: self.w_up.clone(),
            w_down: self.w_down.clone(),
        }
    }
}

impl<H> Block<H, H> {
    /// [`Self::try_map_with`] for a block whose every tensor has one type: `f(name, tensor)`.
    pub fn try_map<'a, G, E>(
        &'a self,
        f: impl FnMut(&'static str, &'a H) -> Result<G, E>,
    ) -> Result<Block<G, G>, E> {
        self.try_map_with(&mut SameMapper(f))
    }

    /// Infallible [`Self::try_map`].
    pub fn map<'a, G>(&'a self, mut f: impl FnMut(&'static str, &'a H) -> G) -> Block<G, G> {
        infallible(self.try_map(|n, h| Ok(f(n, h))))
    }

    /// `(name, tensor)` pairs in the fixed order.
    pub fn named(&self) -> Vec<(&'static str, &H)> {
        let mut v = Vec::with_capacity(16);
        self.map(|n, h| v.push((n, h)));
        v
    }
}

impl<W> Block<W> {
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
/// sublayer (LLM-Streamline's FFN replacement), names and storages as in [`Block`]
/// ([`FfnWeights`] in f32, `super::QFfn` in any format, the tape's `FfnParams`).
#[derive(Clone, Debug)]
pub struct Ffn<W, V = Array1<f32>> {
    /// `[C]` RMSNorm gain before the MLP.
    pub mlp_norm: V,
    /// `[I, C]`
    pub w_gate: W,
    /// `[I, C]`
    pub w_up: W,
    /// `[C, I]`
    pub w_down: W,
}

/// A feed-forward-only block in f32.
pub type FfnWeights = Ffn<Array2<f32>>;

impl<W, V> Ffn<W, V> {
    /// The block with every tensor mapped by `m`, in the order of [`Block::try_map_with`].
    pub fn try_map_with<'a, M: BlockMapper<'a, W, V>>(
        &'a self,
        m: &mut M,
    ) -> Result<Ffn<M::Weight, M::Vector>, M::Error> {
        Ok(Ffn {
            mlp_norm: m.vector("mlp_norm", &self.mlp_norm)?,
            w_gate: m.weight("w_gate", &self.w_gate)?,
            w_up: m.weight("w_up", &self.w_up)?,
            w_down: m.weight("w_down", &self.w_down)?,
        })
    }
}

impl<H> Ffn<H, H> {
    /// [`Self::try_map_with`] for a block whose every tensor has one type: `f(name, tensor)`.
    pub fn try_map<'a, G, E>(
        &'a self,
        f: impl FnMut(&'static str, &'a H) -> Result<G, E>,
    ) -> Result<Ffn<G, G>, E> {
        self.try_map_with(&mut SameMapper(f))
    }
}

impl<W> Ffn<W> {
    /// The same block with every projection mapped by `proj` (the norm cloned).
    pub fn map_projections<U>(&self, mut proj: impl FnMut(&W) -> U) -> Ffn<U> {
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
        l.ffn()
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
