//! Tape-free Llama/Qwen2 forward: batched prefill, cached decode, hidden states.

use std::ops::Range;

use ndarray::{s, Array2, Array3, ArrayView1, ArrayView2, ArrayView3, ArrayViewMut3, Axis};

use super::block::block_forward_inplace;
use super::block_view::BlockWeights;
use super::kv_cache::{take, KvCache, LayerKv, Scratch, PREFILL_CHUNK};
use super::ops::{linear_any_into, rms_norm_into};
use crate::error::{ElmError, Result};
use crate::model_data::config::ModelConfig;
use crate::model_data::weights::{LayerWeights, ModelWeights};
use crate::model_data::{QLayer, QuantWeights};
use crate::quant::QActs;
use crate::quant::{Linear, LinearRef};

/// A decoder ready for inference: owns its weights (checked against the config), f32
/// [`ModelWeights`] by default or quantized [`QuantWeights`].
#[derive(Clone, Debug)]
pub struct Transformer<W = ModelWeights> {
    pub weights: W,
}

/// The weights of a whole decoder, in any storage: what the inference path needs.
pub trait DecoderWeights: Sync {
    type Layer: BlockWeights;
    fn config(&self) -> &ModelConfig;
    fn layers(&self) -> &[Self::Layer];
    /// Embedding of token `token` (< vocab size, checked by the caller) into `out` `[C]`.
    fn embed_row_into(&self, token: usize, out: &mut [f32]);
    /// `[C]`
    fn final_norm(&self) -> &ndarray::Array1<f32>;
    /// `[V, C]` (the embedding when tied).
    fn lm_head_ref(&self) -> LinearRef<'_>;
    /// Every tensor's shape against the config.
    fn check(&self) -> Result<()>;
    /// Bytes of weights held in memory.
    fn weight_bytes(&self) -> usize;
    /// Bytes of the token embedding and, when untied, the LM head: what is neither a block nor
    /// a norm (often stored in another format than the blocks, e.g. Q8_0 beside Q4_1 layers).
    fn embedding_bytes(&self) -> usize {
        let blocks: usize = self.layers().iter().map(|l| l.block_ref().bytes()).sum();
        self.weight_bytes() - blocks - self.final_norm().len() * 4
    }
    /// Weight bytes one batch-1 decode step reads: every block, the final norm, the LM
    /// head (one embedding row is negligible).
    fn decode_bytes(&self) -> usize {
        let blocks: usize = self.layers().iter().map(|l| l.block_ref().bytes()).sum();
        blocks + self.final_norm().len() * 4 + self.lm_head_ref().bytes()
    }
    /// Moves the matrices a decode step streams (every block's, the LM head) onto huge
    /// pages where the kernel allows it ([`crate::heap::back_with_huge_pages`]); returns
    /// the bytes moved.
    fn back_with_huge_pages(&self) -> usize {
        back_linears_with_huge_pages(
            (self.layers().iter())
                .flat_map(|l| l.block_ref().linears())
                .chain([self.lm_head_ref()]),
        )
    }
}

/// Moves the memory of `linears` onto huge pages where the kernel allows it
/// ([`crate::heap::back_with_huge_pages`]); returns the bytes moved.
pub fn back_linears_with_huge_pages<'a>(linears: impl IntoIterator<Item = LinearRef<'a>>) -> usize {
    let memory: Vec<&[u8]> = linears.into_iter().filter_map(|l| l.memory()).collect();
    crate::heap::back_with_huge_pages(&memory)
}

impl DecoderWeights for ModelWeights {
    type Layer = LayerWeights;
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn layers(&self) -> &[LayerWeights] {
        &self.layers
    }
    fn embed_row_into(&self, token: usize, out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(self.embed.row(token)) {
            *o = v;
        }
    }
    fn final_norm(&self) -> &ndarray::Array1<f32> {
        &self.final_norm
    }
    fn lm_head_ref(&self) -> LinearRef<'_> {
        LinearRef::F32(self.lm_head().view())
    }
    fn check(&self) -> Result<()> {
        check_shapes(
            &self.config,
            LinearRef::F32(self.embed.view()),
            self.final_norm.view(),
            self.lm_head.as_ref().map(|h| LinearRef::F32(h.view())),
            &self.layers,
        )
    }
    fn weight_bytes(&self) -> usize {
        self.num_params() * 4
    }
}

impl DecoderWeights for QuantWeights {
    type Layer = QLayer;
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn layers(&self) -> &[QLayer] {
        &self.layers
    }
    fn embed_row_into(&self, token: usize, out: &mut [f32]) {
        self.embed.row_into(token, out)
    }
    fn final_norm(&self) -> &ndarray::Array1<f32> {
        &self.final_norm
    }
    fn lm_head_ref(&self) -> LinearRef<'_> {
        self.lm_head().as_ref()
    }
    fn check(&self) -> Result<()> {
        check_shapes(
            &self.config,
            self.embed.as_ref(),
            self.final_norm.view(),
            self.lm_head.as_ref().map(Linear::as_ref),
            &self.layers,
        )
    }
    fn weight_bytes(&self) -> usize {
        self.bytes()
    }
}

/// Token embeddings of `weights`, right-padded to the longest sequence: `[B, T, C]` and the
/// per-sequence lengths. Every model path (dense, ELM, training) embeds through this.
pub fn embed_tokens<S: AsRef<[u32]>, W: DecoderWeights + ?Sized>(
    weights: &W,
    tokens: &[S],
) -> Result<(Array3<f32>, Vec<usize>)> {
    if tokens.is_empty() {
        return Err(ElmError::InvalidArgument("empty batch of sequences".into()));
    }
    let lens: Vec<usize> = tokens.iter().map(|t| t.as_ref().len()).collect();
    let t_max = lens.iter().copied().max().unwrap_or(0);
    let mut x = Array3::zeros((tokens.len(), t_max, weights.config().hidden_size));
    for (bi, seq) in tokens.iter().enumerate() {
        for (ti, &tok) in seq.as_ref().iter().enumerate() {
            let mut row = x.slice_mut(s![bi, ti, ..]);
            embedding_row_into(weights, tok, row.as_slice_mut().ok_or_else(not_contiguous)?)?;
        }
    }
    Ok((x, lens))
}

/// The embedding of one token id (range-checked) into `out` `[C]`.
fn embedding_row_into<W: DecoderWeights + ?Sized>(
    weights: &W,
    token: u32,
    out: &mut [f32],
) -> Result<()> {
    let v = weights.config().vocab_size;
    if token as usize >= v {
        return Err(ElmError::InvalidArgument(format!(
            "token id {token} out of range for vocab size {v}"
        )));
    }
    weights.embed_row_into(token as usize, out);
    // Cheap beside the layers (C values per token), and the one place every prompt's rows pass:
    // a NaN scale in a kept quantized block is found here, naming the token, instead of
    // surfacing as non-finite logits.
    if let Some(i) = out.iter().position(|x| !x.is_finite()) {
        return Err(ElmError::NonFinite(format!(
            "embedding row of token {token} (element {i} is {}): the model's weights hold NaN or \
             infinity (--check-tensors scans them all)",
            out[i]
        )));
    }
    if let Some(scale) = weights.config().embedding_scale() {
        out.iter_mut().for_each(|x| *x *= scale);
    }
    Ok(())
}

fn not_contiguous() -> ElmError {
    ElmError::shape("embed", "buffer is not contiguous")
}

/// Refuses sequences longer than the model's context (positions past it were never trained
/// and the RoPE table would have to be extended silently).
pub fn check_context(cfg: &ModelConfig, len: usize, what: &str) -> Result<()> {
    if len > cfg.max_position_embeddings {
        return Err(ElmError::InvalidArgument(format!(
            "{what} of {len} tokens exceeds the model's context length of {} tokens \
             (max_position_embeddings)",
            cfg.max_position_embeddings
        )));
    }
    Ok(())
}

impl<W: DecoderWeights> Transformer<W> {
    /// Validates the config and every tensor shape.
    pub fn new(weights: W) -> Result<Self> {
        weights.check()?;
        weights.back_with_huge_pages();
        Ok(Transformer { weights })
    }

    pub fn config(&self) -> &ModelConfig {
        self.weights.config()
    }

    /// A KV cache for all layers: a sliding one for each layer that attends to a window
    /// (Gemma 3's local layers keep `window − 1 +` [`PREFILL_CHUNK`] positions, not
    /// `max_seq`), a full one for the others.
    pub fn new_cache(&self, batch: usize, max_seq: usize) -> Result<KvCache> {
        let windows: Vec<Option<usize>> = self
            .weights
            .layers()
            .iter()
            .map(|l| l.block_ref().gemma.and_then(|g| g.attention.window))
            .collect();
        KvCache::with_windows(self.config(), &windows, batch, max_seq)
    }

    /// Token embeddings, right-padded to the longest sequence: `[B, T, C]` and the
    /// per-sequence lengths.
    pub fn embed(&self, tokens: &[Vec<u32>]) -> Result<(Array3<f32>, Vec<usize>)> {
        embed_tokens(&self.weights, tokens)
    }

    /// Runs layers `layers` on the residual stream `x` `[B, T, C]` (in place), using
    /// `kv[i]` as the cache of layer `layers.start + i`. Sequence `b` has
    /// `new_lens[b]` valid tokens; their K/V are committed.
    pub fn run_layers_inplace(
        &self,
        layers: Range<usize>,
        mut x: ArrayViewMut3<f32>,
        new_lens: &[usize],
        kv: &mut [LayerKv],
        scratch: &mut Scratch,
    ) -> Result<()> {
        if layers.end > self.weights.layers().len() || kv.len() != layers.len() {
            return Err(ElmError::InvalidArgument(format!(
                "run_layers {layers:?}: model has {} layers, {} caches given",
                self.weights.layers().len(),
                kv.len()
            )));
        }
        for (w, cache) in self.weights.layers()[layers].iter().zip(kv.iter_mut()) {
            block_forward_inplace(
                w,
                self.config(),
                x.view_mut(),
                new_lens,
                cache,
                true,
                scratch,
            )?;
        }
        Ok(())
    }

    /// [`Self::run_layers_inplace`] over every layer with `cache`'s own caches and scratch.
    fn run_all_layers(
        &self,
        x: ArrayViewMut3<f32>,
        new_lens: &[usize],
        cache: &mut KvCache,
    ) -> Result<()> {
        let n_layers = self.weights.layers().len();
        self.run_layers_inplace(
            0..n_layers,
            x,
            new_lens,
            &mut cache.layers,
            &mut cache.scratch,
        )
    }

    /// Runs layers `layers` on `x` `[B, T, C]` (all tokens new) with the caches
    /// `cache.layers[layers]` and returns the output of the last one.
    pub fn run_layers(
        &self,
        layers: Range<usize>,
        x: ArrayView3<f32>,
        cache: &mut KvCache,
    ) -> Result<Array3<f32>> {
        let (b, t, _) = x.dim();
        let mut out = x.as_standard_layout().into_owned();
        if layers.end > cache.layers.len() {
            return Err(ElmError::InvalidArgument(format!(
                "run_layers {layers:?}: cache has only {} layers",
                cache.layers.len()
            )));
        }
        let new_lens = vec![t; b];
        let KvCache {
            layers: kv,
            scratch,
            ..
        } = cache;
        self.run_layers_inplace(
            layers.clone(),
            out.view_mut(),
            &new_lens,
            &mut kv[layers],
            scratch,
        )?;
        Ok(out)
    }

    /// Final RMSNorm + LM head: `h` `[N, C]` → logits `[N, V]`.
    pub fn logits_from_hidden(&self, h: ArrayView2<f32>) -> Array2<f32> {
        let mut logits = Array2::zeros((h.nrows(), self.config().vocab_size));
        let mut normed = Vec::new();
        let mut qx = QActs::default();
        self.logits_into(h, &mut normed, &mut qx, logits.view_mut());
        logits
    }

    fn logits_into(
        &self,
        h: ArrayView2<f32>,
        normed: &mut Vec<f32>,
        qx: &mut QActs,
        logits: ndarray::ArrayViewMut2<f32>,
    ) {
        let (n, c) = h.dim();
        let mut hn =
            ndarray::ArrayViewMut2::from_shape((n, c), take(normed, n * c)).expect("sized");
        rms_norm_into(
            h,
            self.weights.final_norm().view(),
            self.config().rms_norm_eps,
            hn.view_mut(),
        );
        linear_any_into(hn.view(), self.weights.lm_head_ref(), None, logits, qx);
    }

    /// Prompt processing: appends every sequence's tokens (lengths may differ) to
    /// `cache` and returns the logits of each sequence's last token `[B, V]`.
    pub fn prefill(&self, tokens: &[Vec<u32>], cache: &mut KvCache) -> Result<Array2<f32>> {
        if tokens.len() != cache.batch() {
            return Err(ElmError::shape(
                "prefill",
                format!(
                    "{} sequences for a cache of batch {}",
                    tokens.len(),
                    cache.batch()
                ),
            ));
        }
        if let Some(bi) = tokens.iter().position(|t| t.is_empty()) {
            return Err(ElmError::InvalidArgument(format!("sequence {bi} is empty")));
        }
        for (bi, t) in tokens.iter().enumerate() {
            let cached = cache.lens().get(bi).copied().unwrap_or(0);
            check_context(self.config(), cached + t.len(), "prompt")?;
        }
        // In chunks of PREFILL_CHUNK positions: the activations, the attention scores and a
        // sliding cache's slots are sized by the chunk, not by the prompt (a prompt that fits
        // one chunk runs as one call, as before chunking).
        let longest = tokens.iter().map(Vec::len).max().unwrap_or(0);
        let mut last = Array2::zeros((tokens.len(), self.config().hidden_size));
        for start in (0..longest).step_by(PREFILL_CHUNK) {
            let end = (start + PREFILL_CHUNK).min(longest);
            let piece: Vec<&[u32]> = tokens
                .iter()
                .map(|t| &t[start.min(t.len())..end.min(t.len())])
                .collect();
            let (mut x, lens) = embed_tokens(&self.weights, &piece)?;
            self.run_all_layers(x.view_mut(), &lens, cache)?;
            for (bi, t) in tokens.iter().enumerate() {
                // The chunk that holds the sequence's last token gives its logits.
                if (start + 1..=end).contains(&t.len()) {
                    last.row_mut(bi).assign(&x.slice(s![bi, lens[bi] - 1, ..]));
                }
            }
        }
        Ok(self.logits_from_hidden(last.view()))
    }

    /// One decode step: token `tokens[b]` is appended to every sequence; returns `[B, V]`.
    pub fn decode_step(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Array2<f32>> {
        let mut logits = Array2::zeros((tokens.len(), self.config().vocab_size));
        let active = vec![true; tokens.len()];
        self.decode_step_into(tokens, &active, cache, &mut logits)?;
        Ok(logits)
    }

    /// Decode step without allocation: sequences with `active[b] = false` are left
    /// unchanged (their logits row is unspecified). `logits` is `[B, V]`.
    pub fn decode_step_into(
        &self,
        tokens: &[u32],
        active: &[bool],
        cache: &mut KvCache,
        logits: &mut Array2<f32>,
    ) -> Result<()> {
        let (b, c, v) = (
            cache.batch(),
            self.config().hidden_size,
            self.config().vocab_size,
        );
        if tokens.len() != b || active.len() != b || logits.dim() != (b, v) {
            return Err(ElmError::shape(
                "decode_step",
                format!(
                    "cache batch {b}: {} tokens, {} active flags, logits {:?} (want [{b}, {v}])",
                    tokens.len(),
                    active.len(),
                    logits.dim()
                ),
            ));
        }
        let KvCache {
            layers,
            scratch,
            hidden,
            new_lens,
        } = cache;
        let mut x = ArrayViewMut3::from_shape((b, 1, c), take(hidden, b * c)).expect("sized");
        for (bi, (&tok, &on)) in tokens.iter().zip(active).enumerate() {
            new_lens[bi] = on as usize;
            let mut row = x.slice_mut(s![bi, 0, ..]);
            embedding_row_into(
                &self.weights,
                tok,
                row.as_slice_mut().ok_or_else(not_contiguous)?,
            )?;
        }
        let n_layers = self.weights.layers().len();
        self.run_layers_inplace(0..n_layers, x.view_mut(), new_lens, layers, scratch)?;
        let h = x.index_axis(Axis(1), 0);
        self.logits_into(h, &mut scratch.xn, &mut scratch.qx, logits.view_mut());
        Ok(())
    }

    /// Full forward of equal-length sequences without a persistent cache: the hidden
    /// state entering every layer plus the final (pre-norm) output, each `[B, T, C]`
    /// (`num_layers + 1` arrays).
    pub fn forward_hidden(&self, tokens: &[Vec<u32>]) -> Result<Vec<Array3<f32>>> {
        let (mut x, lens) = self.embed(tokens)?;
        let t = x.dim().1;
        if lens.iter().any(|&l| l != t) || t == 0 {
            return Err(ElmError::InvalidArgument(format!(
                "forward_hidden needs equal, non-zero sequence lengths, got {lens:?}"
            )));
        }
        let mut cache = KvCache::with_layers(self.config(), 1, tokens.len(), t)?;
        let mut states = Vec::with_capacity(self.weights.layers().len() + 1);
        for w in self.weights.layers() {
            states.push(x.clone());
            cache.reset();
            block_forward_inplace(
                w,
                self.config(),
                x.view_mut(),
                &lens,
                &mut cache.layers[0],
                true,
                &mut cache.scratch,
            )?;
        }
        states.push(x);
        Ok(states)
    }

    /// Logits at every position of equal-length sequences: `[B, T, V]`.
    pub fn forward_logits(&self, tokens: &[Vec<u32>]) -> Result<Array3<f32>> {
        let t = tokens.first().map_or(0, |s| s.len());
        // Full caches: one call brings every token, so a sliding cache would only grow.
        let mut cache = KvCache::new(self.config(), tokens.len(), t.max(1))?;
        let (mut x, lens) = self.embed(tokens)?;
        if lens.iter().any(|&l| l != t) || t == 0 {
            return Err(ElmError::InvalidArgument(format!(
                "forward_logits needs equal, non-zero sequence lengths, got {lens:?}"
            )));
        }
        self.run_all_layers(x.view_mut(), &lens, &mut cache)?;
        let (b, _, c) = x.dim();
        let h = x.into_shape_with_order((b * t, c)).expect("contiguous");
        let logits = self.logits_from_hidden(h.view());
        let v = logits.ncols();
        Ok(logits.into_shape_with_order((b, t, v)).expect("contiguous"))
    }
}

impl<W: DecoderWeights> Transformer<W> {
    /// Next-token negative log-likelihood of one sequence (natural log): the sum over
    /// positions `1..T` of `-log p(tokens[t] | tokens[..t])`, and the count `T - 1`.
    /// Log-softmax in f64 over the full vocabulary.
    pub fn sequence_nll(&self, tokens: &[u32]) -> Result<(f64, usize)> {
        if tokens.len() < 2 {
            return Err(ElmError::InvalidArgument(
                "sequence_nll needs at least 2 tokens".into(),
            ));
        }
        check_context(self.config(), tokens.len(), "sequence")?;
        let logits = self.forward_logits(&[tokens.to_vec()])?;
        let mut nll = 0.0f64;
        for (t, &next) in tokens.iter().enumerate().skip(1) {
            let row = logits.slice(s![0, t - 1, ..]);
            let max = row.fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let lse = row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln()
                + max;
            nll += lse - row[next as usize] as f64;
        }
        Ok((nll, tokens.len() - 1))
    }
}

/// Checks a decoder's weights against its config, whatever their storage: every matrix's
/// shape, every vector's length, biases present exactly when the config has them, and the
/// LM head present exactly when the embeddings are not tied. The error names the tensor.
fn check_shapes<L: BlockWeights>(
    cfg: &ModelConfig,
    embed: LinearRef<'_>,
    final_norm: ArrayView1<'_, f32>,
    lm_head: Option<LinearRef<'_>>,
    layers: &[L],
) -> Result<()> {
    cfg.validate()?;
    let (c, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (hd, kvd) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let mat = |name: String, a: LinearRef<'_>, want: (usize, usize)| -> Result<()> {
        if a.dim() != want {
            return Err(ElmError::tensor(
                name,
                format!("shape {:?}, config requires {:?}", a.dim(), want),
            ));
        }
        Ok(())
    };
    let vecn = |name: String, a: Option<ArrayView1<f32>>, want: Option<usize>| match (
        a.map(|a| a.len()),
        want,
    ) {
        (got, want) if got == want => Ok(()),
        (got, want) => Err(ElmError::tensor(
            name,
            format!("length {got:?}, config requires {want:?}"),
        )),
    };
    mat("embed".into(), embed, (v, c))?;
    vecn("final_norm".into(), Some(final_norm), Some(c))?;
    match (lm_head, cfg.tie_word_embeddings) {
        (Some(h), false) => mat("lm_head".into(), h, (v, c))?,
        (None, true) => {}
        (Some(_), true) => {
            return Err(ElmError::tensor(
                "lm_head",
                "present but tie_word_embeddings = true",
            ))
        }
        (None, false) => {
            return Err(ElmError::tensor(
                "lm_head",
                "missing and tie_word_embeddings = false",
            ))
        }
    }
    if layers.len() != cfg.num_layers {
        return Err(ElmError::config(
            "num_layers",
            format!(
                "{} in config, {} layers of weights",
                cfg.num_layers,
                layers.len()
            ),
        ));
    }
    let bias = |n: usize| cfg.attention_bias.then_some(n);
    for (l, lw) in layers.iter().enumerate() {
        let b = lw.block_ref();
        let p = |s: &str| format!("layers.{l}.{s}");
        let a = b
            .attn
            .ok_or_else(|| ElmError::tensor(p("attn_norm"), "a decoder layer needs attention"))?;
        vecn(p("attn_norm"), Some(a.attn_norm), Some(c))?;
        vecn(p("mlp_norm"), Some(b.mlp_norm), Some(c))?;
        mat(p("wq"), a.wq, (hd, c))?;
        mat(p("wk"), a.wk, (kvd, c))?;
        mat(p("wv"), a.wv, (kvd, c))?;
        mat(p("wo"), a.wo, (c, hd))?;
        vecn(p("bq"), a.bq, bias(hd))?;
        vecn(p("bk"), a.bk, bias(kvd))?;
        vecn(p("bv"), a.bv, bias(kvd))?;
        mat(p("w_gate"), b.w_gate, (i, c))?;
        mat(p("w_up"), b.w_up, (i, c))?;
        mat(p("w_down"), b.w_down, (c, i))?;
        // A Gemma 3 layer without its norms would run as a Llama block with GeGLU (silently
        // wrong), and norms on another family would be ignored: both refused. The layer's own
        // attention (window, RoPE base) is not held to `cfg.layer_attention(l)`: a model with
        // layers removed keeps each layer's attention at its new index.
        match (b.gemma, cfg.has_gemma_norms()) {
            (Some(g), true) => {
                vecn(p("attn_q_norm"), Some(g.q_norm), Some(cfg.head_dim))?;
                vecn(p("attn_k_norm"), Some(g.k_norm), Some(cfg.head_dim))?;
                vecn(p("post_attention_norm"), Some(g.post_attn_norm), Some(c))?;
                vecn(p("post_ffw_norm"), Some(g.post_mlp_norm), Some(c))?;
            }
            (None, false) => {}
            (None, true) => {
                return Err(ElmError::tensor(
                    p("attn_q_norm"),
                    "missing: a Gemma 3 layer needs its q/k norms and post-norms",
                ))
            }
            (Some(_), false) => {
                return Err(ElmError::tensor(
                    p("attn_q_norm"),
                    format!("Gemma 3 norms in a {:?} model", cfg.arch),
                ))
            }
        }
    }
    Ok(())
}

impl Transformer<QuantWeights> {
    /// Quantizes a dense f32 model's matrices to `format` (norms and biases stay f32).
    pub fn quantized(weights: &ModelWeights, format: crate::quant::WriteFormat) -> Result<Self> {
        Transformer::new(QuantWeights::quantize(weights, format))
    }
}
