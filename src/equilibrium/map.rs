//! The ELM map `φ(z, h) = f*(W_z·z + W_h·h + b)`, written once, in its three evaluation modes:
//!
//! - [`apply_taped`]: on the autograd tape (training; [`ElmLayer`] is its [`ImplicitLayer`]);
//! - [`ModuleView::apply`] (and [`ElmModule::apply`]): no tape, whole sequences from position 0
//!   (gradient-free iterations, reading the tape's values in place; distillation evaluation);
//! - [`ModuleView::apply_cached`] (through `ElmModule::view` for an f32 module): no tape, new tokens of some
//!   sequences against the fixed-point block's KV cache (prefill and decode, see
//!   [`super::infer`]).
//!
//! The two no-tape modes are one function (a whole-sequence pass is a cached pass on an empty
//! cache); the taped mode runs the same steps on the tape's ops, and tests hold the two equal.

use std::sync::Arc;

use ndarray::{Array2, Array3, ArrayD, ArrayView1, ArrayView2, ArrayView3, ArrayViewMut3, Ix3};

use crate::autograd::{Tape, Var};
use crate::error::{ElmError, Result};
use crate::grad::ImplicitLayer;
use crate::model::dense_pass::fresh_cache;
use crate::model::ops::linear_any_into;
use crate::model::tape::{block_forward, ffn_forward, view_rank};
use crate::model::{block_forward_rows, BlockWeights, LayerKv, ModelConfig, Scratch};
use crate::quant::LinearRef;
use crate::quant::QActs;

use super::config::ElmConfig;
use super::module::{ElmModule, ElmParams, ModuleBlock};

/// The fixed-point module as the no-tape kernels see it, with f32 or quantized matrices (the
/// one code path of [`ElmModule`] and of the quantized module of `super::infer`): its block,
/// and its projection `(W_z, W_h, b)` (`None` without injection).
pub(crate) struct ModuleView<'a, W: ?Sized> {
    pub block: &'a W,
    pub projection: Option<(LinearRef<'a>, LinearRef<'a>, ArrayView1<'a, f32>)>,
}

impl<W: BlockWeights + ?Sized> ModuleView<'_, W> {
    /// The part of the block input that a solve does not change, `h·W_hᵀ + b` (`h` `[N, C]`),
    /// into `out` (reshaped to `[N, C]` when needed), so that each iteration adds only
    /// `z·W_zᵀ`. Without injection the block input is `z` alone and `out` is left as it is.
    pub fn injection_term_into(&self, h: ArrayView2<f32>, out: &mut Array2<f32>, qx: &mut QActs) {
        if let Some((_, w_h, bias)) = self.projection {
            if out.dim() != h.dim() {
                *out = Array2::zeros(h.dim());
            }
            linear_any_into(h, w_h, Some(bias), out.view_mut(), qx);
        }
    }

    /// `φ(z, h)` for new tokens into `u` `[R, T, C]`, given the injection term `inj` `[R·T, C]`
    /// of [`Self::injection_term_into`]: `u = f*(z·W_zᵀ + inj)`, or `f*(z)` without injection.
    /// Row `r` of `z` holds `T` new tokens of sequence `seqs[r]` of `cache`, which they attend
    /// to after its history; their K/V stay pending in `cache` (the caller commits the iterate
    /// it keeps). `lens` is a buffer refilled here, so a caller that keeps it (and `u`)
    /// allocates nothing.
    #[allow(clippy::too_many_arguments)] // the map's inputs plus its cache and buffers
    pub fn apply_cached_into(
        &self,
        cfg: &ModelConfig,
        z: ArrayView3<f32>,
        inj: ArrayView2<f32>,
        seqs: &[usize],
        cache: &mut LayerKv,
        scratch: &mut Scratch,
        lens: &mut Vec<usize>,
        mut u: ArrayViewMut3<f32>,
    ) -> Result<()> {
        let (r, t, c) = z.dim();
        let shape_err = |e: ndarray::ShapeError| ElmError::shape("ElmModule::apply", e.to_string());
        if u.dim() != (r, t, c) {
            return Err(ElmError::shape(
                "ElmModule::apply",
                format!("z is {:?} but the output is {:?}", z.dim(), u.dim()),
            ));
        }
        match self.projection {
            Some((w_z, _, _)) => {
                if inj.dim() != (r * t, c) {
                    return Err(ElmError::shape(
                        "ElmModule::apply",
                        format!(
                            "{} rows of z but the injection term is {:?}",
                            r * t,
                            inj.dim()
                        ),
                    ));
                }
                let z2 = z.into_shape_with_order((r * t, c)).map_err(shape_err)?;
                let mut u2 = u
                    .view_mut()
                    .into_shape_with_order((r * t, c))
                    .map_err(shape_err)?;
                // u = z·W_zᵀ + (h·W_hᵀ + b)   [R·T, C]
                linear_any_into(z2, w_z, None, u2.view_mut(), &mut scratch.qx);
                u2 += &inj;
            }
            None => u.assign(&z),
        }
        lens.clear();
        lens.resize(r, t);
        block_forward_rows(self.block, cfg, u, seqs, lens, cache, false, scratch)
    }

    /// `φ(z, h)` for new tokens: row `r` of `z`, `h` `[R, T, C]` holds `T` new tokens of
    /// sequence `seqs[r]` of `cache`, which they attend to after its history. Their K/V stay
    /// pending in `cache` (the caller commits the iterate it keeps). Returns `[R, T, C]`.
    pub fn apply_cached(
        &self,
        cfg: &ModelConfig,
        z: ArrayView3<f32>,
        h: ArrayView3<f32>,
        seqs: &[usize],
        cache: &mut LayerKv,
        scratch: &mut Scratch,
    ) -> Result<Array3<f32>> {
        let (r, t, c) = z.dim();
        if h.dim() != (r, t, c) {
            return Err(ElmError::shape(
                "ElmModule::apply",
                format!("z is {:?} but h is {:?}", z.dim(), h.dim()),
            ));
        }
        let h2 = h
            .to_shape((r * t, c))
            .map_err(|e| ElmError::shape("ElmModule::apply", e.to_string()))?;
        let mut inj = Array2::zeros((0, 0));
        self.injection_term_into(h2.view(), &mut inj, &mut scratch.qx);
        let z = z.as_standard_layout();
        let mut u = Array3::zeros((r, t, c));
        self.apply_cached_into(
            cfg,
            z.view(),
            inj.view(),
            seqs,
            cache,
            scratch,
            &mut vec![],
            u.view_mut(),
        )?;
        Ok(u)
    }

    /// `φ(z, h)` on whole sequences `[B, T, C]` at positions `0..T` (causal, no history).
    pub fn apply(
        &self,
        cfg: &ModelConfig,
        z: ArrayView3<f32>,
        h: ArrayView3<f32>,
    ) -> Result<Array3<f32>> {
        let (b, t, _) = z.dim();
        let (mut cache, mut scratch) = fresh_cache(cfg, b, t)?;
        let seqs: Vec<usize> = (0..b).collect();
        self.apply_cached(cfg, z, h, &seqs, &mut cache, &mut scratch)
    }
}

impl ElmModule {
    /// Block input `u = z·W_zᵀ + h·W_hᵀ + b` (without injection: `u = z`). z, h: `[N, C]` →
    /// `[N, C]`.
    pub fn inject(&self, z: ArrayView2<f32>, h: ArrayView2<f32>) -> Array2<f32> {
        match &self.projection {
            Some(p) => {
                let mut u = crate::gemm::matmul(&h, &p.w_h.t());
                crate::gemm::sgemm(1.0, &z, &p.w_z.t(), 1.0, &mut u.view_mut());
                u += &p.bias;
                u
            }
            None => z.to_owned(),
        }
    }

    /// The module as the no-tape kernels see it.
    pub(crate) fn view(&self) -> ModuleView<'_, dyn BlockWeights> {
        ModuleView {
            block: &self.block,
            projection: self.projection.as_ref().map(|p| {
                (
                    LinearRef::F32(p.w_z.view()),
                    LinearRef::F32(p.w_h.view()),
                    p.bias.view(),
                )
            }),
        }
    }

    /// [`ModuleView::apply`] on this module: `φ(z, h)` on whole sequences `[B, T, C]`.
    pub fn apply(
        &self,
        cfg: &ModelConfig,
        z: ArrayView3<f32>,
        h: ArrayView3<f32>,
    ) -> Result<Array3<f32>> {
        self.view().apply(cfg, z, h)
    }
}

/// `φ(z, h)` on the tape: `z`, `h` `[B, T, C]` at positions `0..T`.
pub fn apply_taped(tape: &mut Tape<f32>, p: &ElmParams<Var>, z: Var, h: Var) -> Result<Var> {
    let u = match &p.projection {
        Some(pr) => {
            let a = tape.matmul_t(z, pr.w_z, None)?;
            let b = tape.matmul_t(h, pr.w_h, Some(pr.bias))?;
            tape.add(a, b)?
        }
        None => z,
    };
    match &p.block {
        ModuleBlock::Decoder(b) => block_forward(tape, b, u, 0),
        ModuleBlock::Ffn(f) => ffn_forward(tape, f, u),
    }
}

/// The module as an [`ImplicitLayer`] (state `z` and injection `h`: `[B, T, C]`).
///
/// Its gradient-free evaluations run [`ModuleView::apply`] on the parameter values they are
/// given, read in place: no copy per step, and the products find the matrices among the
/// step's frozen weights (registered by the trainer), so each is packed once per step.
#[derive(Clone)]
pub struct ElmLayer {
    cfg: ModelConfig,
    /// The module's layout (injection, block kind, the layer the block was cut from).
    elm: ElmConfig,
}

impl ElmLayer {
    /// The layer of the module `elm` lays out for model `cfg` ([`ElmParams::shapes`]).
    pub fn new(cfg: &ModelConfig, elm: &ElmConfig) -> Self {
        ElmLayer {
            cfg: cfg.clone(),
            elm: elm.clone(),
        }
    }

    /// `values` (in [`ElmParams`] order) named, their shapes checked against the module's.
    fn named<'v>(&self, values: &'v [Arc<ArrayD<f32>>]) -> Result<ElmParams<&'v ArrayD<f32>>> {
        let mut it = values.iter();
        let named = ElmParams::shapes(&self.cfg, &self.elm).try_map(|name, shape| {
            let v = it
                .next()
                .ok_or_else(|| ElmError::tensor(name, "ElmLayer: no value given"))?;
            if v.shape() != shape.as_slice() {
                return Err(ElmError::tensor(
                    name,
                    format!("ElmLayer: shape {:?}, expected {:?}", v.shape(), shape),
                ));
            }
            Ok(&**v)
        })?;
        if it.next().is_some() {
            return Err(ElmError::shape(
                "ElmLayer",
                format!(
                    "{} parameter values, more than the module has",
                    values.len()
                ),
            ));
        }
        Ok(named)
    }
}

impl ImplicitLayer<f32> for ElmLayer {
    type Params = ElmParams<Var>;

    fn forward(&self, tape: &mut Tape<f32>, z: Var, h: Var, p: &ElmParams<Var>) -> Result<Var> {
        apply_taped(tape, p, z, h)
    }

    fn eval(
        &self,
        z: ArrayD<f32>,
        h: &Arc<ArrayD<f32>>,
        _params: &ElmParams<Var>,
        values: &[Arc<ArrayD<f32>>],
    ) -> Result<ArrayD<f32>> {
        let named = self.named(values)?;
        let block = match &named.block {
            ModuleBlock::Decoder(b) => b.borrowed()?,
            ModuleBlock::Ffn(f) => f.borrowed()?,
        };
        let projection = match &named.projection {
            Some(p) => Some((
                LinearRef::F32(view_rank("p.w_z", &p.w_z)?),
                LinearRef::F32(view_rank("p.w_h", &p.w_h)?),
                view_rank("p.bias", &p.bias)?,
            )),
            None => None,
        };
        let module = ModuleView {
            block: &block,
            projection,
        };
        let z3 = z
            .into_dimensionality::<Ix3>()
            .map_err(|e| ElmError::shape("ElmLayer z", e.to_string()))?;
        let h3 = h
            .view()
            .into_dimensionality::<Ix3>()
            .map_err(|e| ElmError::shape("ElmLayer h", e.to_string()))?;
        Ok(module.apply(&self.cfg, z3.view(), h3)?.into_dyn())
    }
}
