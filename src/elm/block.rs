//! No-tape decoder block over a KV store, for an arbitrary subset of sequences.
//!
//! The ELM's fixed-point block is evaluated many times per token, on only the sequences still
//! iterating, against a cache that must NOT grow until the final iterate: this file provides
//! exactly that (`block_forward` reads the store, returns the new K/V, and the caller decides
//! whether and where to append them). Math: HF Llama/Qwen2 pre-norm block with half-split RoPE.

use ndarray::{s, Array2, Array3, ArrayView2, ArrayView3, Axis};
use rayon::prelude::*;

use crate::error::{ElmError, Result};
use crate::model::{LayerWeights, ModelConfig};

/// Half-split RoPE tables: `cos/sin [T_max, D/2]`, frequency `θ^(−2i/D)`.
#[derive(Clone, Debug)]
pub struct Rope {
    cos: Array2<f32>,
    sin: Array2<f32>,
}

impl Rope {
    pub fn new(cfg: &ModelConfig, max_seq: usize) -> Self {
        let half = cfg.head_dim / 2;
        let mut cos = Array2::zeros((max_seq, half));
        let mut sin = Array2::zeros((max_seq, half));
        for p in 0..max_seq {
            for i in 0..half {
                let freq = (cfg.rope_theta as f64).powf(-2.0 * i as f64 / cfg.head_dim as f64);
                let a = p as f64 * freq;
                cos[[p, i]] = a.cos() as f32;
                sin[[p, i]] = a.sin() as f32;
            }
        }
        Rope { cos, sin }
    }
    pub fn max_seq(&self) -> usize {
        self.cos.nrows()
    }
    /// Rotates every head (width `head_dim`) of `row` in place at position `pos`.
    fn apply(&self, row: &mut [f32], head_dim: usize, pos: usize) {
        let half = head_dim / 2;
        let (c, s) = (self.cos.row(pos), self.sin.row(pos));
        for head in row.chunks_exact_mut(head_dim) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x, y) = (a[i], b[i]);
                a[i] = x * c[i] - y * s[i];
                b[i] = y * c[i] + x * s[i];
            }
        }
    }
}

/// K/V history of one attention layer: `k, v [B, T_max, KV*D]` (keys after RoPE) plus
/// per-sequence lengths. Allocated once at its full size.
#[derive(Clone, Debug)]
pub struct KvStore {
    k: Array3<f32>,
    v: Array3<f32>,
    lens: Vec<usize>,
}

impl KvStore {
    pub fn new(cfg: &ModelConfig, batch: usize, max_seq: usize) -> Self {
        let w = cfg.num_kv_heads * cfg.head_dim;
        KvStore {
            k: Array3::zeros((batch, max_seq, w)),
            v: Array3::zeros((batch, max_seq, w)),
            lens: vec![0; batch],
        }
    }
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }
    pub fn max_seq(&self) -> usize {
        self.k.dim().1
    }
    /// Exact bytes allocated for K and V.
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * std::mem::size_of::<f32>()
    }
    /// Appends `k, v [T, KV*D]` to sequence `b`.
    pub fn append(&mut self, b: usize, k: ArrayView2<f32>, v: ArrayView2<f32>) -> Result<()> {
        let (len, t) = (self.lens[b], k.nrows());
        if len + t > self.max_seq() {
            return Err(ElmError::InvalidArgument(format!(
                "KV cache full: sequence {b} has {len} tokens, +{t} exceeds max_seq {}",
                self.max_seq()
            )));
        }
        self.k.slice_mut(s![b, len..len + t, ..]).assign(&k);
        self.v.slice_mut(s![b, len..len + t, ..]).assign(&v);
        self.lens[b] += t;
        Ok(())
    }
    /// Empties every sequence.
    pub fn reset(&mut self) {
        self.lens.iter_mut().for_each(|l| *l = 0);
    }
}

/// Output of [`block_forward`]: `y [R, T, C]` and the new tokens' `k, v [R, T, KV*D]`.
pub struct BlockOut {
    pub y: Array3<f32>,
    pub k: Array3<f32>,
    pub v: Array3<f32>,
}

/// `y = x + Wo·attn(norm(x)); y += W_down·(silu(W_gate·n) ⊙ W_up·n), n = norm(y)`.
///
/// `x: [R, T, C]` are T new tokens of sequences `seqs[r]` of `store`, at positions
/// `store.lens()[seqs[r]] ..`; each attends to its sequence's stored K/V plus the new tokens
/// causally. The store is only read.
pub fn block_forward(
    w: &LayerWeights,
    cfg: &ModelConfig,
    rope: &Rope,
    x: ArrayView3<f32>,
    store: &KvStore,
    seqs: &[usize],
) -> Result<BlockOut> {
    let (r, t, c) = x.dim();
    if c != cfg.hidden_size || seqs.len() != r {
        return Err(ElmError::shape(
            "elm block_forward",
            format!(
                "x {:?}, {} sequence ids, hidden {}",
                x.dim(),
                seqs.len(),
                cfg.hidden_size
            ),
        ));
    }
    let (nh, nkv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    for &b in seqs {
        if store.lens[b] + t > rope.max_seq().min(store.max_seq()) {
            return Err(ElmError::InvalidArgument(format!(
                "sequence {b}: {} cached + {t} new tokens exceed max_seq {}",
                store.lens[b],
                rope.max_seq().min(store.max_seq())
            )));
        }
    }
    let x2 = x
        .to_shape((r * t, c))
        .map_err(|e| ElmError::shape("block x", e.to_string()))?;
    let xn = rms_norm(x2.view(), &w.attn_norm, cfg.rms_norm_eps);
    let mut q = linear(xn.view(), &w.wq, w.bq.as_ref());
    let mut k = linear(xn.view(), &w.wk, w.bk.as_ref());
    let v = linear(xn.view(), &w.wv, w.bv.as_ref());
    for ri in 0..r {
        let p0 = store.lens[seqs[ri]];
        for ti in 0..t {
            let row = ri * t + ti;
            rope.apply(q.row_mut(row).as_slice_mut().unwrap(), d, p0 + ti);
            rope.apply(k.row_mut(row).as_slice_mut().unwrap(), d, p0 + ti);
        }
    }
    // Causal GQA attention, one (sequence, head) per task.
    let scale = 1.0 / (d as f32).sqrt();
    let group = nh / nkv;
    let heads: Vec<Array2<f32>> = (0..r * nh)
        .into_par_iter()
        .map(|job| {
            let (ri, h) = (job / nh, job % nh);
            let b = seqs[ri];
            let len = store.lens[b];
            let kvh = h / group;
            let (hk, hv) = (
                store.k.slice(s![b, ..len, kvh * d..(kvh + 1) * d]),
                store.v.slice(s![b, ..len, kvh * d..(kvh + 1) * d]),
            );
            let nk = k.slice(s![ri * t..(ri + 1) * t, kvh * d..(kvh + 1) * d]);
            let nv = v.slice(s![ri * t..(ri + 1) * t, kvh * d..(kvh + 1) * d]);
            let mut out = Array2::<f32>::zeros((t, d));
            let mut scores = vec![0f32; len + t];
            for ti in 0..t {
                let qv = q.slice(s![ri * t + ti, h * d..(h + 1) * d]);
                let visible = len + ti + 1;
                for j in 0..len {
                    scores[j] = qv.dot(&hk.row(j)) * scale;
                }
                for j in 0..=ti {
                    scores[len + j] = qv.dot(&nk.row(j)) * scale;
                }
                let m = scores[..visible]
                    .iter()
                    .cloned()
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                for sc in &mut scores[..visible] {
                    *sc = (*sc - m).exp();
                    sum += *sc;
                }
                let mut o = out.row_mut(ti);
                for j in 0..len {
                    o.scaled_add(scores[j] / sum, &hv.row(j));
                }
                for j in 0..=ti {
                    o.scaled_add(scores[len + j] / sum, &nv.row(j));
                }
            }
            out
        })
        .collect();
    let mut attn = Array2::<f32>::zeros((r * t, nh * d));
    for (job, o) in heads.into_iter().enumerate() {
        let (ri, h) = (job / nh, job % nh);
        attn.slice_mut(s![ri * t..(ri + 1) * t, h * d..(h + 1) * d])
            .assign(&o);
    }
    let mut y = x2.to_owned();
    ndarray::linalg::general_mat_mul(1.0, &attn, &w.wo.t(), 1.0, &mut y);
    let yn = rms_norm(y.view(), &w.mlp_norm, cfg.rms_norm_eps);
    let mut gate = yn.dot(&w.w_gate.t());
    let up = yn.dot(&w.w_up.t());
    ndarray::Zip::from(&mut gate).and(&up).for_each(|g, &u| {
        *g = *g / (1.0 + (-*g).exp()) * u;
    });
    ndarray::linalg::general_mat_mul(1.0, &gate, &w.w_down.t(), 1.0, &mut y);
    let kvw = nkv * d;
    Ok(BlockOut {
        y: y.into_shape_with_order((r, t, c)).expect("[R*T, C]"),
        k: k.into_shape_with_order((r, t, kvw)).expect("[R*T, KV*D]"),
        v: v.into_shape_with_order((r, t, kvw)).expect("[R*T, KV*D]"),
    })
}

/// `x · Wᵀ (+ b)`: x `[N, in]`, W `[out, in]` → `[N, out]`.
pub fn linear(
    x: ArrayView2<f32>,
    w: &Array2<f32>,
    b: Option<&ndarray::Array1<f32>>,
) -> Array2<f32> {
    let mut y = x.dot(&w.t());
    if let Some(b) = b {
        y += b;
    }
    y
}

/// RMSNorm over the last axis: `x / sqrt(mean(x²) + eps) · g`.
pub fn rms_norm(x: ArrayView2<f32>, g: &ndarray::Array1<f32>, eps: f32) -> Array2<f32> {
    let mut out = x.to_owned();
    for mut row in out.axis_iter_mut(Axis(0)) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        row.zip_mut_with(g, |v, &gi| *v = *v * inv * gi);
    }
    out
}
