//! Borrowed views of a block's weights, whatever their storage: what the block kernels
//! ([`super::block`]) run on. The plain data (`model_data::Block<W>` and `Ffn<W>`: `LayerWeights`,
//! `FfnWeights`, `QLayer`, `QFfn`) lives below the model (`crate::model_data`); the view over it is the model's own
//! notion, so it lives here and the data folder knows nothing of it.

use ndarray::{Array1, ArrayView1};

use crate::model_data::weights::{infallible, Block, BlockMapper, Ffn, GemmaParts};
use crate::quant::{AsLinearRef, LinearRef};

/// Borrowed weights of one block, whatever their storage: what [`super::block`] runs on.
/// A decoder block has both sublayers; a feed-forward-only block (`FfnWeights`, `QFfn`)
/// has no attention.
#[derive(Clone, Copy, Debug)]
pub struct BlockRef<'a> {
    /// The attention sublayer (`None`: the block is `x + MLP(RMSNorm(x))`).
    pub attn: Option<AttnRef<'a>>,
    pub mlp_norm: ArrayView1<'a, f32>,
    pub w_gate: LinearRef<'a>,
    pub w_up: LinearRef<'a>,
    pub w_down: LinearRef<'a>,
    /// Gemma 3's additions ([`Gemma3Block`](crate::model_data::weights::Gemma3Block)).
    pub gemma: Option<Gemma3Ref<'a>>,
}

/// A borrowed [`Gemma3Block`](crate::model_data::weights::Gemma3Block): its gains as views.
pub type Gemma3Ref<'a> = GemmaParts<ArrayView1<'a, f32>>;

/// Borrowed weights of a block's attention sublayer.
#[derive(Clone, Copy, Debug)]
pub struct AttnRef<'a> {
    pub attn_norm: ArrayView1<'a, f32>,
    pub wq: LinearRef<'a>,
    pub wk: LinearRef<'a>,
    pub wv: LinearRef<'a>,
    pub wo: LinearRef<'a>,
    pub bq: Option<ArrayView1<'a, f32>>,
    pub bk: Option<ArrayView1<'a, f32>>,
    pub bv: Option<ArrayView1<'a, f32>>,
}

impl<'a> BlockRef<'a> {
    /// The block's matrices: attention's (when it has it), then the MLP's.
    pub fn linears(&self) -> Vec<LinearRef<'a>> {
        let mut v = Vec::with_capacity(7);
        if let Some(a) = &self.attn {
            v.extend([a.wq, a.wk, a.wv, a.wo]);
        }
        v.extend([self.w_gate, self.w_up, self.w_down]);
        v
    }

    /// Bytes of every tensor of the block.
    pub fn bytes(&self) -> usize {
        let vec = |v: Option<ArrayView1<f32>>| v.map_or(0, |v| v.len() * 4);
        let attn_vectors = self.attn.as_ref().map_or(0, |a| {
            vec(Some(a.attn_norm)) + vec(a.bq) + vec(a.bk) + vec(a.bv)
        });
        let gemma_vectors = self.gemma.as_ref().map_or(0, |g| {
            vec(Some(g.q_norm))
                + vec(Some(g.k_norm))
                + vec(Some(g.post_attn_norm))
                + vec(Some(g.post_mlp_norm))
        });
        self.linears().iter().map(|l| l.bytes()).sum::<usize>()
            + vec(Some(self.mlp_norm))
            + attn_vectors
            + gemma_vectors
    }
}

/// Weights of a block in any storage (a [`Block`] or [`Ffn`] of f32 matrices or of
/// `Linear`s in any format, a [`BlockRef`] itself, an ELM's module block).
pub trait BlockWeights: Sync {
    fn block_ref(&self) -> BlockRef<'_>;
}

/// Borrowed weights are block weights too (e.g. a block read in place from tape values).
impl BlockWeights for BlockRef<'_> {
    fn block_ref(&self) -> BlockRef<'_> {
        // Views are invariant in their lifetime: each is re-borrowed for `&self`'s.
        let attn = self.attn.as_ref().map(|a| AttnRef {
            attn_norm: a.attn_norm.view(),
            wq: a.wq.reborrow(),
            wk: a.wk.reborrow(),
            wv: a.wv.reborrow(),
            wo: a.wo.reborrow(),
            bq: a.bq.as_ref().map(ArrayView1::view),
            bk: a.bk.as_ref().map(ArrayView1::view),
            bv: a.bv.as_ref().map(ArrayView1::view),
        });
        BlockRef {
            attn,
            mlp_norm: self.mlp_norm.view(),
            w_gate: self.w_gate.reborrow(),
            w_up: self.w_up.reborrow(),
            w_down: self.w_down.reborrow(),
            gemma: self.gemma.as_ref().map(|g| g.map(|v| v.view())),
        }
    }
}

/// Every tensor of a block borrowed as the kernels read it: projections as [`LinearRef`]s of
/// their storage, vectors as views.
struct Borrowed;

impl<'a, W: AsLinearRef + 'a> BlockMapper<'a, W, Array1<f32>> for Borrowed {
    type Weight = LinearRef<'a>;
    type Vector = ArrayView1<'a, f32>;
    type Error = std::convert::Infallible;
    fn weight(&mut self, _: &'static str, w: &'a W) -> Result<LinearRef<'a>, Self::Error> {
        Ok(w.linear_ref())
    }
    fn vector(
        &mut self,
        _: &'static str,
        v: &'a Array1<f32>,
    ) -> Result<ArrayView1<'a, f32>, Self::Error> {
        Ok(v.view())
    }
}

impl<'a> BlockRef<'a> {
    /// A decoder block's kernel view from its description over borrowed tensors.
    pub fn of_block(b: Block<LinearRef<'a>, ArrayView1<'a, f32>>) -> Self {
        BlockRef {
            attn: Some(AttnRef {
                attn_norm: b.attn_norm,
                wq: b.wq,
                wk: b.wk,
                wv: b.wv,
                wo: b.wo,
                bq: b.bq,
                bk: b.bk,
                bv: b.bv,
            }),
            mlp_norm: b.mlp_norm,
            w_gate: b.w_gate,
            w_up: b.w_up,
            w_down: b.w_down,
            gemma: b.gemma,
        }
    }

    /// A feed-forward-only block's kernel view (no attention).
    pub fn of_ffn(f: Ffn<LinearRef<'a>, ArrayView1<'a, f32>>) -> Self {
        BlockRef {
            attn: None,
            mlp_norm: f.mlp_norm,
            w_gate: f.w_gate,
            w_up: f.w_up,
            w_down: f.w_down,
            gemma: None,
        }
    }
}

impl<W: AsLinearRef + Sync> BlockWeights for Block<W> {
    fn block_ref(&self) -> BlockRef<'_> {
        BlockRef::of_block(infallible(self.try_map_with(&mut Borrowed)))
    }
}

impl<W: AsLinearRef + Sync> BlockWeights for Ffn<W> {
    fn block_ref(&self) -> BlockRef<'_> {
        BlockRef::of_ffn(infallible(self.try_map_with(&mut Borrowed)))
    }
}
