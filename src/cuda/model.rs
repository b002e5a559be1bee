//! Llama / Qwen2 / Gemma 3 inference on the GPU: weights resident on the device, batched prefill
//! with per-sequence lengths, a preallocated KV cache and batched decode.
//!
//! Every forward pass works on a packed list of `N` new tokens, each tagged with its sequence slot
//! and position; prefill and decode differ only in how the list is built. Per layer:
//! `x → rmsnorm → [q|k|v] = x·W_qkvᵀ (+b) → rope(q,k) → append k,v to cache → attention over
//! cache → ·W_oᵀ → +x → rmsnorm → [gate|up] = x·W_guᵀ → silu(gate)·up → ·W_downᵀ → +x`.
//! A Gemma 3 layer (as the CPU block, `model::block`) adds a per-head RMSNorm of q and k before
//! RoPE, its own RoPE base and sliding window, an RMSNorm of each sublayer's output before its
//! residual add, and GeGLU (tanh GELU) for SwiGLU; the embedding is scaled by `√C`.

use ndarray::{concatenate, Array1, Array2, Axis};

use super::backend::{GpuDevice, GpuModel, RopeStyle};
use super::device::{cuda_err, device_count, CudaDevice, GpuBuffer};
use super::kernels::raw::{self, AttnGeometry, MAX_ATTN_SMEM_BYTES};
use crate::error::{ElmError, Result};
use crate::model::config::LayerAttention;
use crate::model::weights::GemmaParts;
use crate::model::{ModelConfig, ModelWeights};

/// Device copy of one decoder block (fused projections).
struct GpuLayer {
    attn_norm: GpuBuffer<f32>,
    /// `[(H + 2 KV) D, C]`: rows of wq, then wk, then wv.
    w_qkv: GpuBuffer<f32>,
    /// `[(H + 2 KV) D]` when the model has q/k/v bias.
    b_qkv: Option<GpuBuffer<f32>>,
    /// `[C, H D]`
    w_o: GpuBuffer<f32>,
    mlp_norm: GpuBuffer<f32>,
    /// `[2 I, C]`: rows of w_gate, then w_up.
    w_gate_up: GpuBuffer<f32>,
    /// `[C, I]`
    w_down: GpuBuffer<f32>,
    /// `[max_batch, KV, max_seq, D]`
    k_cache: GpuBuffer<f32>,
    v_cache: GpuBuffer<f32>,
    /// The layer's RoPE base and window (the model's for Llama / Qwen2).
    attention: LayerAttention,
    /// Gemma 3's extra norms.
    gemma: Option<GpuGemmaNorms>,
}

/// Device copy of a Gemma 3 layer's additions: the block description's own Gemma part
/// ([`GemmaParts`]) over device buffers.
type GpuGemmaNorms = GemmaParts<GpuBuffer<f32>>;

/// Activation buffers for up to `tokens` packed rows and `batch` sequences.
struct Scratch {
    tokens: usize,
    x: GpuBuffer<f32>,
    xn: GpuBuffer<f32>,
    qkv: GpuBuffer<f32>,
    attn: GpuBuffer<f32>,
    proj: GpuBuffer<f32>,
    gate_up: GpuBuffer<f32>,
    act: GpuBuffer<f32>,
    token_ids: GpuBuffer<u32>,
    slots: GpuBuffer<u32>,
    positions: GpuBuffer<u32>,
    last_rows: GpuBuffer<u32>,
    last_x: GpuBuffer<f32>,
    last_xn: GpuBuffer<f32>,
    logits: GpuBuffer<f32>,
}

impl Scratch {
    fn new(dev: &CudaDevice, cfg: &ModelConfig, tokens: usize, batch: usize) -> Result<Self> {
        let c = cfg.hidden_size;
        let hd = cfg.num_heads * cfg.head_dim;
        let qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
        let i = cfg.intermediate_size;
        Ok(Scratch {
            tokens,
            x: dev.zeros(tokens * c)?,
            xn: dev.zeros(tokens * c)?,
            qkv: dev.zeros(tokens * qkv)?,
            attn: dev.zeros(tokens * hd)?,
            proj: dev.zeros(tokens * c)?,
            gate_up: dev.zeros(tokens * 2 * i)?,
            act: dev.zeros(tokens * i)?,
            token_ids: dev.zeros(tokens)?,
            slots: dev.zeros(tokens)?,
            positions: dev.zeros(tokens)?,
            last_rows: dev.zeros(batch)?,
            last_x: dev.zeros(batch * c)?,
            last_xn: dev.zeros(batch * c)?,
            logits: dev.zeros(batch * cfg.vocab_size)?,
        })
    }
}

/// The CUDA [`GpuModel`]: a decoder whose weights, KV cache and activations live on one device.
pub struct CudaModel {
    dev: CudaDevice,
    cfg: ModelConfig,
    max_batch: usize,
    max_seq: usize,
    embed: GpuBuffer<f32>,
    /// `None` when tied to `embed`.
    lm_head: Option<GpuBuffer<f32>>,
    final_norm: GpuBuffer<f32>,
    layers: Vec<GpuLayer>,
    scratch: Scratch,
    /// Tokens held in the cache per active sequence; `len()` = active batch.
    lens: Vec<usize>,
}

impl std::fmt::Debug for CudaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModel")
            .field("device", &self.dev)
            .field("max_batch", &self.max_batch)
            .field("max_seq", &self.max_seq)
            .field("lens", &self.lens)
            .finish()
    }
}

fn upload2(dev: &CudaDevice, a: &Array2<f32>) -> Result<GpuBuffer<f32>> {
    let std = a.as_standard_layout();
    dev.upload(std.as_slice().expect("standard layout is contiguous"))
}

fn upload1(dev: &CudaDevice, a: &Array1<f32>) -> Result<GpuBuffer<f32>> {
    dev.upload(&a.to_vec())
}

/// Validates every tensor's shape against the config (typed errors naming the tensor): the CPU
/// model's one check (`DecoderWeights::check`), Gemma 3's norms included.
fn validate_weights(w: &ModelWeights) -> Result<()> {
    crate::model::DecoderWeights::check(w)
}

impl GpuModel for CudaModel {
    type Device = CudaDevice;

    fn new(
        weights: &ModelWeights,
        ordinal: usize,
        max_batch: usize,
        max_seq: usize,
    ) -> Result<Self> {
        // Arguments first (typed errors naming the tensor / argument, testable without a GPU),
        // then the driver probe.
        validate_weights(weights)?;
        let cfg = weights.config.clone();
        if max_batch == 0 {
            return Err(ElmError::InvalidArgument("max_batch must be > 0".into()));
        }
        let max_attn_len = (MAX_ATTN_SMEM_BYTES / 4).saturating_sub(cfg.head_dim);
        if max_seq == 0 || max_seq > max_attn_len {
            return Err(ElmError::InvalidArgument(format!(
                "max_seq {max_seq} must be in 1..={max_attn_len} (attention keeps scores in shared memory)"
            )));
        }
        device_count()?;
        let dev = CudaDevice::new(ordinal)?;
        let kvd = cfg.num_kv_heads * cfg.head_dim;
        let cache_len = max_batch * kvd * max_seq;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for (l, lw) in weights.layers.iter().enumerate() {
            let w_qkv = concatenate(Axis(0), &[lw.wq.view(), lw.wk.view(), lw.wv.view()])
                .map_err(|e| ElmError::shape("fuse qkv", e.to_string()))?;
            let b_qkv = if lw.bq.is_some() || lw.bk.is_some() || lw.bv.is_some() {
                let part = |b: &Option<Array1<f32>>, len: usize| {
                    b.clone().unwrap_or_else(|| Array1::zeros(len))
                };
                let hd = cfg.num_heads * cfg.head_dim;
                let b = concatenate(
                    Axis(0),
                    &[
                        part(&lw.bq, hd).view(),
                        part(&lw.bk, kvd).view(),
                        part(&lw.bv, kvd).view(),
                    ],
                )
                .map_err(|e| ElmError::shape("fuse qkv bias", e.to_string()))?;
                Some(upload1(&dev, &b)?)
            } else {
                None
            };
            let w_gate_up = concatenate(Axis(0), &[lw.w_gate.view(), lw.w_up.view()])
                .map_err(|e| ElmError::shape("fuse gate/up", e.to_string()))?;
            layers.push(GpuLayer {
                attn_norm: upload1(&dev, &lw.attn_norm)?,
                w_qkv: upload2(&dev, &w_qkv)?,
                b_qkv,
                w_o: upload2(&dev, &lw.wo)?,
                mlp_norm: upload1(&dev, &lw.mlp_norm)?,
                w_gate_up: upload2(&dev, &w_gate_up)?,
                w_down: upload2(&dev, &lw.w_down)?,
                k_cache: dev.zeros(cache_len)?,
                v_cache: dev.zeros(cache_len)?,
                // The layer's own (a Gemma model with layers removed keeps each layer's).
                attention: lw
                    .gemma
                    .as_ref()
                    .map_or_else(|| cfg.layer_attention(l), |g| g.attention),
                gemma: lw
                    .gemma
                    .as_ref()
                    .map(|g| g.try_map(|gain| upload1(&dev, gain)))
                    .transpose()?,
            });
        }
        let embed = upload2(&dev, &weights.embed)?;
        let lm_head = match &weights.lm_head {
            Some(h) => Some(upload2(&dev, h)?),
            None => None,
        };
        let final_norm = upload1(&dev, &weights.final_norm)?;
        let scratch = Scratch::new(&dev, &cfg, max_batch, max_batch)?;
        dev.synchronize()?;
        Ok(CudaModel {
            dev,
            cfg,
            max_batch,
            max_seq,
            embed,
            lm_head,
            final_norm,
            layers,
            scratch,
            lens: Vec::new(),
        })
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn device(&self) -> &CudaDevice {
        &self.dev
    }

    fn device_mut(&mut self) -> &mut CudaDevice {
        &mut self.dev
    }

    fn seq_lens(&self) -> &[usize] {
        &self.lens
    }

    fn reset(&mut self) {
        self.lens.clear();
    }

    fn prefill(&mut self, tokens: &[Vec<u32>]) -> Result<Array2<f32>> {
        if tokens.is_empty() || tokens.len() > self.max_batch {
            return Err(ElmError::InvalidArgument(format!(
                "prefill needs 1..={} sequences, got {}",
                self.max_batch,
                tokens.len()
            )));
        }
        for (b, seq) in tokens.iter().enumerate() {
            if seq.is_empty() || seq.len() > self.max_seq {
                return Err(ElmError::InvalidArgument(format!(
                    "sequence {b} has {} tokens; must be 1..={} (max_seq)",
                    seq.len(),
                    self.max_seq
                )));
            }
        }
        self.lens.clear();
        let total: usize = tokens.iter().map(Vec::len).sum();
        let mut flat = Vec::with_capacity(total);
        let mut slots = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut last_rows = Vec::with_capacity(tokens.len());
        for (b, seq) in tokens.iter().enumerate() {
            flat.extend_from_slice(seq);
            slots.extend(std::iter::repeat_n(b as u32, seq.len()));
            positions.extend(0..seq.len() as u32);
            last_rows.push((flat.len() - 1) as u32);
        }
        let logits = self.forward(&flat, &slots, &positions, &last_rows)?;
        self.lens = tokens.iter().map(Vec::len).collect();
        Ok(logits)
    }

    fn decode(&mut self, tokens: &[u32]) -> Result<Array2<f32>> {
        if self.lens.is_empty() {
            return Err(ElmError::InvalidArgument(
                "decode called before prefill".into(),
            ));
        }
        if tokens.len() != self.lens.len() {
            return Err(ElmError::InvalidArgument(format!(
                "decode got {} tokens for {} active sequences",
                tokens.len(),
                self.lens.len()
            )));
        }
        if let Some(b) = self.lens.iter().position(|&l| l >= self.max_seq) {
            return Err(ElmError::InvalidArgument(format!(
                "sequence {b} is full ({} = max_seq tokens)",
                self.max_seq
            )));
        }
        let slots: Vec<u32> = (0..tokens.len() as u32).collect();
        let positions: Vec<u32> = self.lens.iter().map(|&l| l as u32).collect();
        let logits = self.forward(tokens, &slots, &positions, &slots)?;
        for l in &mut self.lens {
            *l += 1;
        }
        Ok(logits)
    }
}

impl CudaModel {
    /// Runs the decoder on `N` packed tokens (`slots[n]`, `positions[n]` locate each in the cache)
    /// and returns logits for the rows `last_rows` (`[B, V]`).
    fn forward(
        &mut self,
        tokens: &[u32],
        slots: &[u32],
        positions: &[u32],
        last_rows: &[u32],
    ) -> Result<Array2<f32>> {
        let cfg = &self.cfg;
        let vocab = cfg.vocab_size;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ElmError::InvalidArgument(format!(
                "token id {t} out of range for vocabulary of {vocab}"
            )));
        }
        let n = tokens.len();
        let batch = last_rows.len();
        if n > self.scratch.tokens {
            // Grow once to the largest prompt batch seen; decode never reallocates.
            self.scratch = Scratch::new(&self.dev, cfg, n, self.max_batch)?;
        }
        let dev = &self.dev;
        let s = &mut self.scratch;
        dev.write(tokens, &mut s.token_ids)?;
        dev.write(slots, &mut s.slots)?;
        dev.write(positions, &mut s.positions)?;
        dev.write(last_rows, &mut s.last_rows)?;

        let c = cfg.hidden_size;
        let (h, kv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let hd = h * d;
        let qkv_w = (h + 2 * kv) * d;
        let inter = cfg.intermediate_size;
        let eps = cfg.rms_norm_eps;
        let ids = s.token_ids.slice.slice(0..n);
        let slot_v = s.slots.slice.slice(0..n);
        let pos_v = s.positions.slice.slice(0..n);
        let max_len = positions.iter().map(|&p| p as usize + 1).max().unwrap_or(1);

        raw::gather_rows(
            dev,
            &self.embed.slice.as_view(),
            &ids,
            &mut s.x.slice.slice_mut(0..n * c),
            n,
            c,
            cfg.embedding_scale().unwrap_or(1.0),
        )?;
        for layer in &mut self.layers {
            let theta = layer.attention.rope_theta;
            // --- attention ---
            rmsnorm_rows(dev, &s.x, &layer.attn_norm, &mut s.xn, n, c, eps)?;
            linear_rows(dev, &s.xn, &layer.w_qkv, &mut s.qkv, n, c, qkv_w)?;
            if let Some(b) = &layer.b_qkv {
                raw::add_bias(
                    dev,
                    &mut s.qkv.slice.slice_mut(0..n * qkv_w),
                    &b.slice.as_view(),
                    n,
                    qkv_w,
                )?;
            }
            // q heads start at column 0 of each fused row, k heads at column H*D.
            if let Some(g) = &layer.gemma {
                let qkv = &mut s.qkv.slice;
                let (qn, kn) = (g.q_norm.slice.as_view(), g.k_norm.slice.as_view());
                raw::rmsnorm_heads(dev, &mut qkv.slice_mut(0..), &qn, n, qkv_w, h, d, eps)?;
                raw::rmsnorm_heads(dev, &mut qkv.slice_mut(hd..), &kn, n, qkv_w, kv, d, eps)?;
            }
            raw::rope(
                dev,
                &mut s.qkv.slice.slice_mut(0..n * qkv_w),
                &pos_v,
                n,
                qkv_w,
                h,
                d,
                theta,
                RopeStyle::HalfSplit,
            )?;
            raw::rope(
                dev,
                &mut s.qkv.slice.slice_mut(hd..n * qkv_w),
                &pos_v,
                n,
                qkv_w,
                kv,
                d,
                theta,
                RopeStyle::HalfSplit,
            )?;
            raw::kv_cache_write(
                dev,
                &s.qkv.slice.slice(0..n * qkv_w),
                qkv_w,
                hd,
                hd + kv * d,
                &mut layer.k_cache.slice.as_view_mut(),
                &mut layer.v_cache.slice.as_view_mut(),
                &slot_v,
                &pos_v,
                n,
                kv,
                d,
                self.max_seq,
            )?;
            let geom = AttnGeometry {
                rows: n,
                q_stride: qkv_w,
                out_stride: hd,
                n_heads: h,
                n_kv_heads: kv,
                head_dim: d,
                slot_stride: kv * self.max_seq * d,
                head_stride: self.max_seq * d,
                key_stride: d,
                max_len,
                window: layer.attention.window,
            };
            raw::attention(
                dev,
                &s.qkv.slice.slice(0..n * qkv_w),
                &layer.k_cache.slice.as_view(),
                &layer.v_cache.slice.as_view(),
                &mut s.attn.slice.slice_mut(0..n * hd),
                &slot_v,
                &pos_v,
                &geom,
            )?;
            let post_attn = layer.gemma.as_ref().map(|g| &g.post_attn_norm);
            add_projection(
                dev,
                &s.attn,
                &layer.w_o,
                post_attn,
                (&mut s.proj, &mut s.xn),
                &mut s.x,
                (n, hd, c),
                eps,
            )?;
            // --- MLP ---
            rmsnorm_rows(dev, &s.x, &layer.mlp_norm, &mut s.xn, n, c, eps)?;
            linear_rows(
                dev,
                &s.xn,
                &layer.w_gate_up,
                &mut s.gate_up,
                n,
                c,
                2 * inter,
            )?;
            raw::gated_activation(
                dev,
                cfg.activation(),
                &s.gate_up.slice.slice(0..n * 2 * inter),
                &s.gate_up.slice.slice(inter..n * 2 * inter),
                &mut s.act.slice.slice_mut(0..n * inter),
                n,
                inter,
                2 * inter,
            )?;
            let post_mlp = layer.gemma.as_ref().map(|g| &g.post_mlp_norm);
            add_projection(
                dev,
                &s.act,
                &layer.w_down,
                post_mlp,
                (&mut s.proj, &mut s.xn),
                &mut s.x,
                (n, inter, c),
                eps,
            )?;
        }
        // Only each sequence's last row needs logits.
        raw::gather_rows(
            dev,
            &s.x.slice.slice(0..n * c),
            &s.last_rows.slice.slice(0..batch),
            &mut s.last_x.slice.slice_mut(0..batch * c),
            batch,
            c,
            1.0,
        )?;
        rmsnorm_rows(
            dev,
            &s.last_x,
            &self.final_norm,
            &mut s.last_xn,
            batch,
            c,
            eps,
        )?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        linear_rows(dev, &s.last_xn, head, &mut s.logits, batch, c, vocab)?;
        let host = dev
            .stream
            .clone_dtoh(&s.logits.slice.slice(0..batch * vocab))
            .map_err(cuda_err("logits device->host"))?;
        dev.synchronize()?;
        Array2::from_shape_vec((batch, vocab), host)
            .map_err(|e| ElmError::shape("cuda logits", e.to_string()))
    }
}

/// `out[..rows] = x[..rows] · wᵀ` on the first `rows` packed rows (`x: [rows, k]`, `w: [m, k]`).
fn linear_rows(
    dev: &CudaDevice,
    x: &GpuBuffer<f32>,
    w: &GpuBuffer<f32>,
    out: &mut GpuBuffer<f32>,
    rows: usize,
    k: usize,
    m: usize,
) -> Result<()> {
    raw::gemm_wt(
        dev,
        &x.slice.slice(0..rows * k),
        &w.slice.as_view(),
        &mut out.slice.slice_mut(0..rows * m),
        rows,
        k,
        m,
        0.0,
    )
}

/// RMSNorm of the first `rows` packed rows of width `c` into `out`.
fn rmsnorm_rows(
    dev: &CudaDevice,
    x: &GpuBuffer<f32>,
    weight: &GpuBuffer<f32>,
    out: &mut GpuBuffer<f32>,
    rows: usize,
    c: usize,
    eps: f32,
) -> Result<()> {
    raw::rmsnorm(
        dev,
        &x.slice.slice(0..rows * c),
        &weight.slice.as_view(),
        &mut out.slice.slice_mut(0..rows * c),
        rows,
        c,
        eps,
    )
}

/// The block's two residual branches end alike: `x += input · wᵀ`, through the `proj` buffer;
/// with a Gemma 3 post-norm gain, `x += RMSNorm(input · wᵀ)·gain` (normalised into `normed`).
#[allow(clippy::too_many_arguments)]
fn add_projection(
    dev: &CudaDevice,
    input: &GpuBuffer<f32>,
    w: &GpuBuffer<f32>,
    post_norm: Option<&GpuBuffer<f32>>,
    (proj, normed): (&mut GpuBuffer<f32>, &mut GpuBuffer<f32>),
    x: &mut GpuBuffer<f32>,
    (rows, k, c): (usize, usize, usize),
    eps: f32,
) -> Result<()> {
    linear_rows(dev, input, w, proj, rows, k, c)?;
    let branch = match post_norm {
        Some(gain) => {
            rmsnorm_rows(dev, proj, gain, normed, rows, c, eps)?;
            &*normed
        }
        None => &*proj,
    };
    raw::add(
        dev,
        &mut x.slice.slice_mut(0..rows * c),
        &branch.slice.slice(0..rows * c),
        rows * c,
    )
}
