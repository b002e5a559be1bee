//! Preallocated key/value cache and scratch buffers of the inference path.

use ndarray::{Array4, Axis};

use super::ops::RopeTable;
use crate::error::{ElmError, Result};
use crate::model_data::config::ModelConfig;
use crate::quant::QActs;

/// New tokens a sliding-window layer's cache makes room for without growing: the chunk the
/// prefill feeds at a time ([`crate::model::Transformer::prefill`]), so that a long prompt
/// neither sizes the scratch by its whole length nor grows a sliding cache past
/// `window − 1 + PREFILL_CHUNK` slots.
pub const PREFILL_CHUNK: usize = 512;

/// Slots per sequence of a layer's cache for contexts up to `max_seq` tokens: a sliding
/// cache's `window − 1 +` [`PREFILL_CHUNK`] for a layer that sees its last `window` keys
/// (until it grows for a longer call), every position otherwise.
pub fn kv_slots(window: Option<usize>, max_seq: usize) -> usize {
    match window {
        Some(w) if w > 0 && w < max_seq => (w - 1 + PREFILL_CHUNK).min(max_seq),
        _ => max_seq,
    }
}

/// K/V of one attention layer for a batch of sequences, with per-sequence lengths.
///
/// Keys are stored after RoPE. Slots `lens[b]..lens[b] + pending[b]` hold the K/V of
/// the last uncommitted call of [`super::block_forward_cached`] (`commit = false`) that
/// ran sequence `b`: they are attended to by that call but become part of the history
/// only on [`LayerKv::commit`]; the next uncommitted call simply overwrites them.
///
/// A full cache ([`Self::new`]) keeps every position: slot `p` holds position `p`. A sliding
/// one ([`Self::sliding`], for a layer whose queries see only their last `w` keys: Gemma 3's
/// local layers) keeps only what a later query can still see: before a call writes new
/// tokens, positions older than the last `w − 1` committed ones are dropped by moving the
/// kept ones to the front, so slot `s` of sequence `b` holds position `first[b] + s`. It is
/// the same attention over a fraction of the memory (`w − 1 +` [`PREFILL_CHUNK`] slots
/// instead of `max_seq`); the order of the keys is unchanged, so the attention over them
/// is computed as over the full cache.
#[derive(Clone, Debug)]
pub struct LayerKv {
    /// `[B, KV, S, D]`, `S` slots (see [`Self::slots`]).
    pub k: Array4<f32>,
    /// `[B, KV, S, D]`
    pub v: Array4<f32>,
    lens: Vec<usize>,
    pending: Vec<usize>,
    /// Position held by slot 0, per sequence (always 0 in a full cache).
    first: Vec<usize>,
    /// Positions a sequence may reach.
    max_seq: usize,
    /// `Some(w)`: a sliding cache for queries that see their last `w` keys.
    window: Option<usize>,
}

impl LayerKv {
    /// An empty cache for `batch` sequences of at most `max_seq` tokens, every position kept.
    pub fn new(config: &ModelConfig, batch: usize, max_seq: usize) -> Result<Self> {
        Self::with_slots(config, batch, max_seq, max_seq, None)
    }

    /// An empty cache for a layer whose queries see only their last `window` keys: it holds
    /// `window − 1 +` [`PREFILL_CHUNK`] slots (at most `max_seq`) and grows only for a call
    /// that brings more new tokens than that. A `window` of `max_seq` or more keeps every
    /// position, as [`Self::new`].
    pub fn sliding(
        config: &ModelConfig,
        batch: usize,
        max_seq: usize,
        window: usize,
    ) -> Result<Self> {
        if window == 0 {
            return Err(ElmError::InvalidArgument(
                "a sliding KV cache needs a window of at least 1 key".into(),
            ));
        }
        if window >= max_seq {
            return Self::new(config, batch, max_seq);
        }
        let slots = kv_slots(Some(window), max_seq);
        Self::with_slots(config, batch, max_seq, slots, Some(window))
    }

    fn with_slots(
        config: &ModelConfig,
        batch: usize,
        max_seq: usize,
        slots: usize,
        window: Option<usize>,
    ) -> Result<Self> {
        if batch == 0 || max_seq == 0 {
            return Err(ElmError::InvalidArgument(format!(
                "KV cache needs batch > 0 and max_seq > 0 (got batch {batch}, max_seq {max_seq})"
            )));
        }
        let shape = (batch, config.num_kv_heads, slots, config.head_dim);
        Ok(LayerKv {
            k: Array4::zeros(shape),
            v: Array4::zeros(shape),
            lens: vec![0; batch],
            pending: vec![0; batch],
            first: vec![0; batch],
            max_seq,
            window,
        })
    }

    /// A cache for a block without attention (a feed-forward-only block): it counts each
    /// sequence's tokens and checks the capacity like [`Self::new`] but holds no K/V (its
    /// arrays have zero heads, so [`Self::bytes`] is 0).
    pub fn without_kv(config: &ModelConfig, batch: usize, max_seq: usize) -> Result<Self> {
        let no_heads = ModelConfig {
            num_kv_heads: 0,
            ..config.clone()
        };
        Self::with_slots(&no_heads, batch, max_seq, 1, None)
    }

    /// Number of sequences.
    pub fn batch(&self) -> usize {
        self.lens.len()
    }

    /// Capacity in tokens per sequence.
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }

    /// Slots per sequence and KV head (`max_seq` for a full cache).
    pub fn slots(&self) -> usize {
        self.k.dim().2
    }

    /// `Some(w)` for a sliding cache ([`Self::sliding`]).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// Position held by slot 0 of each sequence (0 unless a sliding cache dropped keys).
    pub fn first(&self) -> &[usize] {
        &self.first
    }

    /// Committed tokens per sequence (= position of the next new token).
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Tokens written by the last uncommitted call, per sequence.
    pub fn pending(&self) -> &[usize] {
        &self.pending
    }

    /// Appends the pending K/V of the last call to the history.
    pub fn commit(&mut self) {
        for (len, pending) in self.lens.iter_mut().zip(self.pending.iter_mut()) {
            *len += *pending;
            *pending = 0;
        }
    }

    /// Forgets the pending K/V of the last call.
    pub fn discard_pending(&mut self) {
        self.pending.iter_mut().for_each(|p| *p = 0);
    }

    /// Truncates sequence `b` to `len` committed tokens (e.g. to reuse a prompt prefix). A
    /// sliding cache refuses a length whose next query would see keys it has dropped.
    pub fn truncate(&mut self, b: usize, len: usize) -> Result<()> {
        if b >= self.batch() || len > self.lens[b] {
            return Err(ElmError::InvalidArgument(format!(
                "truncate sequence {b} to {len}: batch {} / current length {:?}",
                self.batch(),
                self.lens.get(b)
            )));
        }
        if let Some(w) = self.window {
            if self.first[b] > 0 && len + 1 < self.first[b] + w {
                return Err(ElmError::InvalidArgument(format!(
                    "truncate sequence {b} to {len}: this sliding cache (window {w}) keeps positions from {} on, and the next query would see position {}",
                    self.first[b],
                    (len + 1).saturating_sub(w)
                )));
            }
        }
        self.lens[b] = len;
        self.pending[b] = 0;
        Ok(())
    }

    /// Empties every sequence (buffers are kept).
    pub fn reset(&mut self) {
        self.lens.iter_mut().for_each(|l| *l = 0);
        self.first.iter_mut().for_each(|f| *f = 0);
        self.discard_pending();
    }

    /// Bytes allocated for K and V.
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * std::mem::size_of::<f32>()
    }

    /// Copies sequence `b`'s pending K/V from `src` (a cache of the same shape and the
    /// same committed length and first position for `b`) into this cache's pending slots,
    /// replacing its own.
    pub fn copy_pending_from(&mut self, src: &LayerKv, b: usize) -> Result<()> {
        if src.k.dim() != self.k.dim()
            || b >= self.batch()
            || src.lens[b] != self.lens[b]
            || src.first[b] != self.first[b]
        {
            return Err(ElmError::InvalidArgument(format!(
                "copy_pending_from: sequence {b}, shapes {:?} / {:?}, lengths {:?} / {:?}, first positions {:?} / {:?}",
                src.k.dim(),
                self.k.dim(),
                src.lens.get(b),
                self.lens.get(b),
                src.first.get(b),
                self.first.get(b)
            )));
        }
        let (from, n) = (src.lens[b] - src.first[b], src.pending[b]);
        let rows = ndarray::s![b, .., from..from + n, ..];
        self.k.slice_mut(rows).assign(&src.k.slice(rows));
        self.v.slice_mut(rows).assign(&src.v.slice(rows));
        self.pending[b] = n;
        Ok(())
    }

    /// Makes room in sequence `b` for `new` tokens after its committed ones: a sliding cache
    /// drops the positions no query from `lens[b]` on can see (moving the last `w − 1`
    /// committed keys to the front) and grows when `new` exceeds its spare slots; a full
    /// cache has room already (the caller checked `lens[b] + new ≤ max_seq`).
    pub(crate) fn make_room(&mut self, b: usize, new: usize) -> Result<()> {
        let Some(w) = self.window else {
            return Ok(());
        };
        let len = self.lens[b];
        if len + new - self.first[b] <= self.slots() {
            return Ok(());
        }
        let keep_from = (len + 1).saturating_sub(w).max(self.first[b]);
        let (from, kept) = (keep_from - self.first[b], len - keep_from);
        let d = self.k.dim().3;
        for cache in [&mut self.k, &mut self.v] {
            for mut head in cache.index_axis_mut(Axis(0), b).outer_iter_mut() {
                // `[S, D]` of one KV head, contiguous in the standard layout.
                let rows = head.as_slice_mut().ok_or_else(|| {
                    ElmError::shape("KV cache", "a head's slots are not contiguous")
                })?;
                rows.copy_within(from * d..(from + kept) * d, 0);
            }
        }
        self.first[b] = keep_from;
        let needed = kept + new;
        if needed > self.slots() {
            self.grow(needed.min(self.max_seq))?;
        }
        Ok(())
    }

    /// Reallocates to `slots` slots per sequence, keeping what every sequence holds.
    fn grow(&mut self, slots: usize) -> Result<()> {
        let (batch, heads, old, d) = self.k.dim();
        let bytes = crate::limits::bytes_of(2 * 4, &[batch, heads, slots, d]);
        crate::limits::check_alloc("sliding KV cache (batch x slots)", bytes)?;
        for cache in [&mut self.k, &mut self.v] {
            let mut bigger = Array4::zeros((batch, heads, slots, d));
            bigger
                .slice_mut(ndarray::s![.., .., ..old, ..])
                .assign(cache);
            *cache = bigger;
        }
        Ok(())
    }

    pub(crate) fn set_pending(&mut self, new_lens: &[usize]) {
        self.pending.copy_from_slice(new_lens);
    }

    pub(crate) fn set_pending_of(&mut self, b: usize, new_len: usize) {
        self.pending[b] = new_len;
    }
}

/// Reusable work buffers of one decoder block; grown on first use, then reused, so
/// steady-state decode allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    pub(crate) rope: RopeTable,
    /// The local layers' table when their RoPE base differs (Gemma 3); `theta` of each
    /// table is checked against the block's before use.
    pub(crate) rope_local: Option<RopeTable>,
    pub(crate) xn: Vec<f32>,
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) attn: Vec<f32>,
    pub(crate) scores: Vec<f32>,
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
    pub(crate) tmp: Vec<f32>,
    /// Activations quantized for the integer kernels of quantized weights.
    pub(crate) qx: QActs,
}

impl Scratch {
    /// Scratch with a RoPE table covering positions `0..max_seq`.
    pub fn new(config: &ModelConfig, max_seq: usize) -> Self {
        Scratch {
            rope: RopeTable::new(config.head_dim, config.rope_theta, max_seq),
            rope_local: config
                .rope_local_theta
                .filter(|&t| t != config.rope_theta)
                .map(|t| RopeTable::new(config.head_dim, t, max_seq)),
            ..Default::default()
        }
    }

    /// Bytes currently held by the buffers (including the RoPE table).
    pub fn bytes(&self) -> usize {
        let vecs = [
            &self.xn,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.scores,
            &self.gate,
            &self.up,
            &self.tmp,
        ];
        let buffers: usize = vecs.iter().map(|v| v.capacity()).sum();
        buffers * std::mem::size_of::<f32>()
            + self.rope.bytes()
            + self.rope_local.as_ref().map_or(0, RopeTable::bytes)
            + self.qx.bytes()
    }
}

/// Grows `buf` to at least `n` elements and returns its first `n`.
pub(crate) fn take(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// K/V caches for a stack of layers plus the scratch and hidden-state buffers
/// that a forward pass over them needs.
#[derive(Clone, Debug)]
pub struct KvCache {
    /// One cache per layer, in the order the caller runs them.
    pub layers: Vec<LayerKv>,
    /// Work buffers shared by all layers.
    pub scratch: Scratch,
    /// `[B, 1, C]` residual stream of a decode step.
    pub(crate) hidden: Vec<f32>,
    pub(crate) new_lens: Vec<usize>,
}

impl KvCache {
    /// Caches for every layer of `config`.
    pub fn new(config: &ModelConfig, batch: usize, max_seq: usize) -> Result<Self> {
        Self::with_layers(config, config.num_layers, batch, max_seq)
    }

    /// Caches for `num_layers` layers (a subset of the model, e.g. the kept dense
    /// layers plus one fixed-point block of an ELM), every position kept.
    pub fn with_layers(
        config: &ModelConfig,
        num_layers: usize,
        batch: usize,
        max_seq: usize,
    ) -> Result<Self> {
        Self::with_windows(config, &vec![None; num_layers], batch, max_seq)
    }

    /// One cache per entry of `windows`, in order: a sliding cache ([`LayerKv::sliding`])
    /// for a layer whose queries see only their last `w` keys (`Some(w)`), a full one
    /// otherwise. The windows must be the layers' own (the block forward refuses a sliding
    /// cache narrower than its block's window).
    pub fn with_windows(
        config: &ModelConfig,
        windows: &[Option<usize>],
        batch: usize,
        max_seq: usize,
    ) -> Result<Self> {
        // K and V of every layer, f32: refuse before allocating what cannot fit.
        let slots: usize = windows.iter().map(|&w| kv_slots(w, max_seq)).sum();
        let bytes =
            crate::limits::bytes_of(2 * 4, &[batch, config.num_kv_heads, slots, config.head_dim]);
        crate::limits::check_alloc("KV cache (batch x tokens)", bytes)?;
        let layers = windows
            .iter()
            .map(|w| match w {
                Some(w) => LayerKv::sliding(config, batch, max_seq, *w),
                None => LayerKv::new(config, batch, max_seq),
            })
            .collect::<Result<Vec<_>>>()?;
        if batch == 0 || max_seq == 0 {
            return Err(ElmError::InvalidArgument(format!(
                "KV cache needs batch > 0 and max_seq > 0 (got batch {batch}, max_seq {max_seq})"
            )));
        }
        Ok(KvCache {
            layers,
            scratch: Scratch::new(config, max_seq),
            hidden: vec![0.0; batch * config.hidden_size],
            new_lens: vec![0; batch],
        })
    }

    /// Number of sequences.
    pub fn batch(&self) -> usize {
        self.new_lens.len()
    }

    /// Capacity in tokens per sequence.
    pub fn max_seq(&self) -> usize {
        self.scratch.rope.positions()
    }

    /// Committed lengths of the first layer (all layers agree in normal use).
    pub fn lens(&self) -> &[usize] {
        self.layers.first().map_or(&[], |l| l.lens())
    }

    /// Exact bytes allocated for K and V over all layers.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.bytes()).sum()
    }

    /// Empties every sequence of every layer.
    pub fn reset(&mut self) {
        self.layers.iter_mut().for_each(|l| l.reset());
    }
}
