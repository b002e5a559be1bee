//! One decoder block on new tokens against its KV cache (tape-free inference path).
//!
//! `x ← x + Attn(RMSNorm(x))`, then `x ← x + MLP(RMSNorm(x))` with grouped-query
//! attention over the cached K/V plus the new tokens' own K/V (causal), half-split
//! RoPE at positions `cache.lens()[b] + t`, and a SwiGLU MLP.
//!
//! A Gemma 3 block ([`super::block_view::Gemma3Ref`]) adds: RMSNorm of every q and k head
//! before RoPE, its layer's RoPE base and sliding window (a local layer's query at position
//! `p` sees keys `p − w + 1 ..= p`), an RMSNorm of each sublayer's output before its residual
//! add, and a GeGLU MLP (tanh GELU).

use ndarray::{s, Array3, ArrayView2, ArrayView3, ArrayViewMut2, ArrayViewMut3, ShapeBuilder, Zip};

use super::block_view::BlockWeights;
use super::kv_cache::{take, LayerKv, Scratch};
use super::ops::{
    geglu_tanh_inplace, linear_any_into, linears_into, masked_softmax_inplace,
    rms_norm_chunks_inplace, rms_norm_into, swiglu_inplace, windowed_softmax_inplace, RopeTable,
};
use crate::error::{ElmError, Result};
use crate::model_data::config::{Activation, ModelConfig};
use crate::nn::attention::first_visible;

/// Runs one block on the new tokens `x` `[B, T, C]` of every sequence and returns
/// the block output `[B, T, C]`.
///
/// All `T` tokens are new for every sequence. Their K/V are written to `cache` and
/// appended to its history only when `commit` is true (else they stay pending, see
/// [`LayerKv`]). For per-sequence token counts use [`block_forward_inplace`].
pub fn block_forward_cached<W: BlockWeights + ?Sized>(
    w: &W,
    cfg: &ModelConfig,
    x: ArrayView3<f32>,
    cache: &mut LayerKv,
    commit: bool,
    scratch: &mut Scratch,
) -> Result<Array3<f32>> {
    let (b, t, _) = x.dim();
    let mut out = x.as_standard_layout().into_owned();
    let new_lens = vec![t; b];
    block_forward_inplace(w, cfg, out.view_mut(), &new_lens, cache, commit, scratch)?;
    Ok(out)
}

/// In-place form of [`block_forward_cached`]: `x` `[B, T, C]` (standard layout) is
/// the residual stream and is overwritten with the block output.
///
/// Sequence `b` has `new_lens[b] ≤ T` valid new tokens (right padding); padded rows
/// and sequences with `new_lens[b] = 0` (inactive) leave the cache untouched and
/// their outputs are unspecified.
pub fn block_forward_inplace<W: BlockWeights + ?Sized>(
    w: &W,
    cfg: &ModelConfig,
    x: ArrayViewMut3<f32>,
    new_lens: &[usize],
    cache: &mut LayerKv,
    commit: bool,
    scratch: &mut Scratch,
) -> Result<()> {
    forward_rows(w, cfg, x, None, new_lens, cache, commit, scratch)
}

/// [`block_forward_inplace`] for a subset of the cache's sequences: row `r` of `x`
/// `[R, T, C]` holds `new_lens[r]` new tokens of sequence `seqs[r]` (distinct ids).
///
/// Sequences not in `seqs` are neither read nor written, and their pending K/V stay as
/// they were; `commit` commits every sequence's pending K/V (see [`LayerKv::commit`]).
/// Lets a caller run only the sequences that still need it (e.g. unconverged rows of a
/// fixed-point solve) without computing the others.
#[allow(clippy::too_many_arguments)] // the block's inputs plus its row → sequence map
pub fn block_forward_rows<W: BlockWeights + ?Sized>(
    w: &W,
    cfg: &ModelConfig,
    x: ArrayViewMut3<f32>,
    seqs: &[usize],
    new_lens: &[usize],
    cache: &mut LayerKv,
    commit: bool,
    scratch: &mut Scratch,
) -> Result<()> {
    // Quadratic in the (few) rows rather than a per-call `seen` vector: decode calls this
    // once per layer and token, and allocates nothing here.
    for (i, &s) in seqs.iter().enumerate() {
        if s >= cache.batch() || seqs[..i].contains(&s) {
            return Err(ElmError::InvalidArgument(format!(
                "block_forward_rows: sequence ids {seqs:?} must be distinct and < batch {}",
                cache.batch()
            )));
        }
    }
    if seqs.len() != x.dim().0 {
        return Err(ElmError::shape(
            "block_forward_rows",
            format!("x has {} rows, {} sequence ids", x.dim().0, seqs.len()),
        ));
    }
    forward_rows(w, cfg, x, Some(seqs), new_lens, cache, commit, scratch)
}

/// Shared body: row `bi` of `x` is cache sequence `seqs[bi]` (`bi` itself when `None`,
/// which keeps the full-batch path allocation-free).
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)] // `bi` indexes x and new_lens
fn forward_rows<W: BlockWeights + ?Sized>(
    w: &W,
    cfg: &ModelConfig,
    mut x: ArrayViewMut3<f32>,
    seqs: Option<&[usize]>,
    new_lens: &[usize],
    cache: &mut LayerKv,
    commit: bool,
    scratch: &mut Scratch,
) -> Result<()> {
    let (b, t, c) = x.dim();
    let seq = |bi: usize| seqs.map_or(bi, |s| s[bi]);
    let w = w.block_ref();
    let gemma = w.gemma;
    // The block's RoPE table and window: its layer's (Gemma 3), else the model's.
    let window = gemma.and_then(|g| g.attention.window);
    check_inputs(cfg, (b, t, c), seqs, new_lens, cache, scratch, window)?;
    let (h, kv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let n = b * t;
    let Scratch {
        rope,
        rope_local,
        xn,
        q,
        k,
        v,
        attn,
        scores,
        gate,
        up,
        tmp,
        qx,
    } = scratch;
    let rope: &RopeTable = match gemma.map(|g| g.attention.rope_theta) {
        Some(theta) if theta != rope.theta() => rope_local
            .as_ref()
            .filter(|r| r.theta() == theta)
            .ok_or_else(|| {
                ElmError::config(
                    "rope_local_theta",
                    format!(
                        "a block asks for RoPE base {theta}, which this scratch has no table for"
                    ),
                )
            })?,
        _ => rope,
    };
    let xs = x
        .as_slice_mut()
        .ok_or_else(|| ElmError::shape("block_forward", "x must be in standard layout"))?;
    let mut x2 = ArrayViewMut2::from_shape((n, c), xs).map_err(layout)?;

    let mut xn = ArrayViewMut2::from_shape((n, c), take(xn, n * c)).map_err(layout)?;
    let mut tmp = ArrayViewMut2::from_shape((n, c), take(tmp, n * c)).map_err(layout)?;
    // A feed-forward-only block has no attention: its cache only counts the tokens it saw.
    if let Some(a) = w.attn {
        // --- attention: q/k/v projections of the normalized stream, RoPE, cache write.
        rms_norm_into(x2.view(), a.attn_norm, cfg.rms_norm_eps, xn.view_mut());
        let mut q = ArrayViewMut2::from_shape((n, h * d), take(q, n * h * d)).map_err(layout)?;
        let mut k = ArrayViewMut2::from_shape((n, kv * d), take(k, n * kv * d)).map_err(layout)?;
        let mut v = ArrayViewMut2::from_shape((n, kv * d), take(v, n * kv * d)).map_err(layout)?;
        // Batch-1 decode: the three projections share one fork-join (and one quantized x).
        linears_into(
            xn.view(),
            &mut [
                (a.wq, a.bq, q.view_mut()),
                (a.wk, a.bk, k.view_mut()),
                (a.wv, a.bv, v.view_mut()),
            ],
            qx,
        );
        if let Some(g) = gemma {
            let (qn, kn) = (
                g.q_norm.as_slice().ok_or_else(not_contiguous)?,
                g.k_norm.as_slice().ok_or_else(not_contiguous)?,
            );
            rms_norm_chunks_inplace(
                q.as_slice_mut().ok_or_else(not_contiguous)?,
                qn,
                cfg.rms_norm_eps,
            );
            rms_norm_chunks_inplace(
                k.as_slice_mut().ok_or_else(not_contiguous)?,
                kn,
                cfg.rms_norm_eps,
            );
        }
        for bi in 0..b {
            let cb = seq(bi);
            // A sliding cache drops the keys no query of this call can see.
            if new_lens[bi] > 0 {
                cache.make_room(cb, new_lens[bi])?;
            }
            let p0 = cache.lens()[cb];
            let slot0 = p0 - cache.first()[cb];
            for ti in 0..new_lens[bi] {
                let row = bi * t + ti;
                rope.apply(
                    q.row_mut(row).as_slice_mut().ok_or_else(not_contiguous)?,
                    p0 + ti,
                );
                rope.apply(
                    k.row_mut(row).as_slice_mut().ok_or_else(not_contiguous)?,
                    p0 + ti,
                );
                for kh in 0..kv {
                    let cols = kh * d..(kh + 1) * d;
                    cache
                        .k
                        .slice_mut(s![cb, kh, slot0 + ti, ..])
                        .assign(&k.slice(s![row, cols.clone()]));
                    cache
                        .v
                        .slice_mut(s![cb, kh, slot0 + ti, ..])
                        .assign(&v.slice(s![row, cols]));
                }
            }
        }

        // --- scaled dot-product attention per (sequence, head): two small GEMMs each, in
        // f32 under either precision (as the bf16 mode's quality was measured).
        let kernel = crate::gemm::detected_kernel();
        let scale = 1.0 / (d as f32).sqrt();
        let group = cfg.group_size();
        let qv = ArrayView3::from_shape((b, t, h * d), q.as_slice().ok_or_else(not_contiguous)?)
            .map_err(layout)?;
        let mut attn =
            ArrayViewMut3::from_shape((b, t, h * d), take(attn, n * h * d)).map_err(layout)?;
        attn.fill(0.0);
        if new_lens.iter().all(|&nl| nl <= FEW_QUERIES) {
            FewQueryAttention {
                q: qv,
                cache: &*cache,
                new_lens,
                seqs,
                heads: h,
                group,
                scale,
                window,
                out: attn.as_mut_ptr(),
            }
            .run(scores)?;
        } else {
            for bi in 0..b {
                let nl = new_lens[bi];
                if nl == 0 {
                    continue;
                }
                let cb = seq(bi);
                let p0 = cache.lens()[cb];
                // Slot `s` holds position `offset + s` (0 but in a sliding cache).
                let offset = cache.first()[cb];
                let slots = p0 + nl - offset;
                for hi in 0..h {
                    let kh = hi / group;
                    let cols = hi * d..(hi + 1) * d;
                    let q_h = qv.slice(s![bi, ..nl, cols.clone()]);
                    let k_h = cache.k.slice(s![cb, kh, ..slots, ..]);
                    let v_h = cache.v.slice(s![cb, kh, ..slots, ..]);
                    let mut out_h = attn.slice_mut(s![bi, ..nl, cols]);
                    if nl <= FEW_QUERIES {
                        let sc = take(scores, slots);
                        attend_few(q_h, k_h, v_h, p0, offset, scale, window, sc, out_h)?;
                        continue;
                    }
                    let mut sc = ArrayViewMut2::from_shape((nl, slots), take(scores, nl * slots))
                        .map_err(layout)?;
                    crate::gemm::sgemm_with(kernel, scale, &q_h, &k_h.t(), 0.0, &mut sc);
                    for (ti, mut row) in sc.rows_mut().into_iter().enumerate() {
                        let visible = p0 + ti + 1;
                        windowed_softmax_inplace(
                            row.as_slice_mut().ok_or_else(not_contiguous)?,
                            first_visible(visible, window) - offset,
                            visible - offset,
                        );
                    }
                    crate::gemm::sgemm_with(kernel, 1.0, &sc.view(), &v_h, 0.0, &mut out_h);
                }
            }
        }
        let attn2 = ArrayView2::from_shape((n, h * d), attn.as_slice().ok_or_else(not_contiguous)?)
            .map_err(layout)?;
        linear_any_into(attn2, a.wo, None, tmp.view_mut(), qx);
        if let Some(g) = gemma {
            post_norm(&mut tmp, g.post_attn_norm, cfg.rms_norm_eps)?;
        }
        x2 += &tmp;
    }

    // --- SwiGLU MLP.
    let i = cfg.intermediate_size;
    rms_norm_into(x2.view(), w.mlp_norm, cfg.rms_norm_eps, xn.view_mut());
    let mut gate = ArrayViewMut2::from_shape((n, i), take(gate, n * i)).map_err(layout)?;
    let mut up = ArrayViewMut2::from_shape((n, i), take(up, n * i)).map_err(layout)?;
    linears_into(
        xn.view(),
        &mut [
            (w.w_gate, None, gate.view_mut()),
            (w.w_up, None, up.view_mut()),
        ],
        qx,
    );
    let (gs, us) = (
        gate.as_slice_mut().ok_or_else(not_contiguous)?,
        up.as_slice().ok_or_else(not_contiguous)?,
    );
    match cfg.activation() {
        Activation::SwiGlu => swiglu_inplace(gs, us),
        Activation::GeGluTanh => geglu_tanh_inplace(gs, us),
    }
    linear_any_into(gate.view(), w.w_down, None, tmp.view_mut(), qx);
    if let Some(g) = gemma {
        post_norm(&mut tmp, g.post_mlp_norm, cfg.rms_norm_eps)?;
    }
    Zip::from(&mut x2).and(&tmp).for_each(|a, &b| *a += b);

    match seqs {
        None => cache.set_pending(new_lens),
        Some(ids) => {
            for (&cb, &nl) in ids.iter().zip(new_lens) {
                cache.set_pending_of(cb, nl);
            }
        }
    }
    if commit {
        cache.commit();
    }
    Ok(())
}

/// Up to this many new tokens per sequence, attention runs as plain loops: a decode
/// step would otherwise make `2·B·H` tiny BLAS calls per layer, whose call and
/// threading overhead dominates the few FLOPs they do.
const FEW_QUERIES: usize = 4;

/// `out ← RMSNorm(out)·gain` in place (Gemma 3's norm of a sublayer's output).
fn post_norm(out: &mut ArrayViewMut2<f32>, gain: ndarray::ArrayView1<f32>, eps: f32) -> Result<()> {
    rms_norm_chunks_inplace(
        out.as_slice_mut().ok_or_else(not_contiguous)?,
        gain.as_slice().ok_or_else(not_contiguous)?,
        eps,
    );
    Ok(())
}

/// Work (query rows × visible keys × the width of all heads) below which a decode step's
/// attention stays on the calling thread: a join costs about a microsecond, a head over
/// a few dozen keys less.
const SPLIT_ATTENTION_WORK: usize = 1 << 15;

/// The attention of a step where every sequence brings at most [`FEW_QUERIES`] new tokens
/// (decode): its `(sequence, head)` pairs are independent units of [`attend_few`], split
/// over the [`SpinTeam`](crate::team::SpinTeam) in one join. Compiled for the baseline
/// target and on one thread, these loops were about a quarter of a quantized SmolLM2
/// decode step.
struct FewQueryAttention<'a> {
    /// Queries `[B, T, H·D]` (RoPE applied).
    q: ArrayView3<'a, f32>,
    /// Holds this step's keys and values already (pending).
    cache: &'a LayerKv,
    new_lens: &'a [usize],
    /// Cache sequence of each batch row (`None`: row `bi` is sequence `bi`).
    seqs: Option<&'a [usize]>,
    heads: usize,
    /// Query heads per key/value head.
    group: usize,
    scale: f32,
    window: Option<usize>,
    /// `attn` `[B, T, H·D]`, contiguous; the unit `(bi, hi)` alone writes columns
    /// `hi·D..(hi + 1)·D` of rows `bi, ..new_lens[bi]`.
    out: *mut f32,
}

// SAFETY: every field but `out` is a shared view; `out` is written by each unit in its own
// disjoint block of columns (see the field), and units are not shared between threads.
unsafe impl Sync for FewQueryAttention<'_> {}

/// A scratch pointer the team's threads use in disjoint chunks.
struct ScoresPtr(*mut f32);
// SAFETY: part `p` alone touches chunk `p` (see `FewQueryAttention::run`).
unsafe impl Sync for ScoresPtr {}

impl ScoresPtr {
    /// Chunk `p` of `len` values.
    ///
    /// # Safety
    /// The buffer holds chunk `p` whole, and no other live slice overlaps it.
    #[allow(clippy::mut_from_ref)] // disjoint chunks of one buffer, one per team part
    unsafe fn chunk(&self, p: usize, len: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.0.add(p * len), len)
    }
}

impl FewQueryAttention<'_> {
    fn run(&self, scores: &mut Vec<f32>) -> Result<()> {
        let b = self.q.dim().0;
        let width = self.q.dim().2;
        let seq = |bi: usize| self.seqs.map_or(bi, |s| s[bi]);
        // Slots each sequence's attention reads (its keys, new ones included).
        let total = |bi: usize| {
            let cb = seq(bi);
            self.cache.lens()[cb] + self.new_lens[bi] - self.cache.first()[cb]
        };
        let stride = (0..b).map(total).max().unwrap_or(0);
        let work: usize = (0..b)
            .map(|bi| self.new_lens[bi] * total(bi))
            .sum::<usize>()
            * width;
        let team = crate::team::SpinTeam::global();
        let parts = if work >= SPLIT_ATTENTION_WORK {
            team.parts()
        } else {
            1
        };
        let units = b * self.heads;
        let chunks = ScoresPtr(take(scores, parts * stride).as_mut_ptr());
        let failure = std::sync::Mutex::new(None);
        let run_part = |p: usize| {
            // SAFETY: the buffer holds `parts · stride` values; part `p` alone uses chunk `p`.
            let sc = unsafe { chunks.chunk(p, stride) };
            for u in units * p / parts..units * (p + 1) / parts {
                if let Err(e) = self.unit(u / self.heads, u % self.heads, seq(u / self.heads), sc) {
                    *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                }
            }
        };
        if parts == 1 {
            run_part(0);
        } else {
            team.run(&run_part);
        }
        match failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Head `hi` of batch row `bi` (cache sequence `cb`).
    fn unit(&self, bi: usize, hi: usize, cb: usize, scores: &mut [f32]) -> Result<()> {
        let nl = self.new_lens[bi];
        if nl == 0 {
            return Ok(());
        }
        let (_, t, width) = self.q.dim();
        let d = width / self.heads;
        let p0 = self.cache.lens()[cb];
        let offset = self.cache.first()[cb];
        let slots = p0 + nl - offset;
        let kh = hi / self.group;
        let q_h = self.q.slice(s![bi, ..nl, hi * d..(hi + 1) * d]);
        let k_h = self.cache.k.slice(s![cb, kh, ..slots, ..]);
        let v_h = self.cache.v.slice(s![cb, kh, ..slots, ..]);
        // SAFETY: `out` is `[B, T, H·D]` contiguous, `bi < B`, `nl ≤ T`, the head's columns
        // lie inside a row; this unit alone writes them (see `FewQueryAttention::out`).
        let out = unsafe {
            ArrayViewMut2::from_shape_ptr(
                (nl, d).strides((width, 1)),
                self.out.add(bi * t * width + hi * d),
            )
        };
        attend_few(
            q_h,
            k_h,
            v_h,
            p0,
            offset,
            self.scale,
            self.window,
            &mut scores[..slots],
            out,
        )
    }
}

/// Causal attention of `nl ≤ FEW_QUERIES` query rows `q` `[nl, D]` at positions
/// `p0..p0+nl` over keys/values `[p0+nl−offset, D]` of positions `offset..p0+nl` (only the
/// last `window` of them when given); writes `out` `[nl, D]`. `scores` holds at least
/// `p0 + nl − offset` values.
#[allow(clippy::too_many_arguments)]
fn attend_few(
    q: ArrayView2<f32>,
    k: ArrayView2<f32>,
    v: ArrayView2<f32>,
    p0: usize,
    offset: usize,
    scale: f32,
    window: Option<usize>,
    scores: &mut [f32],
    mut out: ArrayViewMut2<f32>,
) -> Result<()> {
    let d = q.ncols();
    let keys = k.as_slice().ok_or_else(not_contiguous)?;
    let values = v.as_slice().ok_or_else(not_contiguous)?;
    for (ti, (q_row, mut o_row)) in q.rows().into_iter().zip(out.rows_mut()).enumerate() {
        let visible = p0 + ti + 1;
        let first = first_visible(visible, window);
        let q_row = q_row.to_slice().ok_or_else(not_contiguous)?;
        let sc = &mut scores[..visible - first];
        let rows = (first - offset) * d..(visible - offset) * d;
        crate::simd::scaled_row_dots(q_row, &keys[rows.clone()], scale, sc);
        masked_softmax_inplace(sc, visible - first);
        let o = o_row.as_slice_mut().ok_or_else(not_contiguous)?;
        crate::simd::weighted_row_sum(sc, &values[rows], o);
    }
    Ok(())
}

/// A scratch buffer that cannot take the view's shape (a sizing bug, reported, not a panic).
fn layout(e: ndarray::ShapeError) -> ElmError {
    ElmError::shape("block_forward", format!("scratch view: {e}"))
}

/// A buffer the kernels read as one slice is not contiguous.
fn not_contiguous() -> ElmError {
    ElmError::shape("block_forward", "buffer is not contiguous")
}

fn check_inputs(
    cfg: &ModelConfig,
    (b, t, c): (usize, usize, usize),
    seqs: Option<&[usize]>,
    new_lens: &[usize],
    cache: &LayerKv,
    scratch: &Scratch,
    window: Option<usize>,
) -> Result<()> {
    if c != cfg.hidden_size {
        return Err(ElmError::shape(
            "block_forward",
            format!("x has C = {c}, config hidden_size = {}", cfg.hidden_size),
        ));
    }
    if (seqs.is_none() && b != cache.batch()) || new_lens.len() != b {
        return Err(ElmError::shape(
            "block_forward",
            format!(
                "x batch {b}, cache batch {}, new_lens {}",
                cache.batch(),
                new_lens.len()
            ),
        ));
    }
    // A sliding cache keeps the keys of its own window only: a wider (or no) window would
    // attend to keys it has dropped.
    if let Some(kept) = cache.window() {
        if window.is_none_or(|w| w > kept) {
            return Err(ElmError::InvalidArgument(format!(
                "a sliding KV cache of window {kept} for a block that attends {}",
                window.map_or("to every earlier key".to_string(), |w| format!(
                    "to its last {w} keys"
                ))
            )));
        }
    }
    for (bi, &nl) in new_lens.iter().enumerate() {
        let bi = seqs.map_or(bi, |s| s[bi]);
        let len = cache.lens()[bi];
        if nl > t {
            return Err(ElmError::shape(
                "block_forward",
                format!("sequence {bi}: {nl} new tokens but x has T = {t}"),
            ));
        }
        let limit = cache.max_seq().min(scratch.rope.positions());
        if len + nl > limit {
            return Err(ElmError::InvalidArgument(format!(
                "sequence {bi}: {len} cached + {nl} new tokens exceed the KV cache capacity (max_seq) {limit}"
            )));
        }
    }
    Ok(())
}
