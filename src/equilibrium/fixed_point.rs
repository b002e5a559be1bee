//! The module as the solver sees it ([`FpMap`]: rows = sequences, state = `[T·C]`) and the
//! buffers of a session's solves kept across tokens ([`FpWork`]).

use ndarray::{s, Array2, ArrayView1, ArrayView2, ArrayView3, ArrayViewMut2};

use crate::error::{ElmError, Result};
use crate::model::{BlockWeights, LayerKv, ModelConfig, Scratch};
use crate::quant::QActs;
use crate::solver::{FixedPointMap, FixedPointSolver, MapError, SolveWorkspace, StopCriteria};

use super::config::ElmConfig;
use super::inference_config::{InferenceConfig, KvMode};
use super::map::ModuleView;

/// `a` as a `[rows, cols]` matrix, reallocated only when the shape changes.
pub(crate) fn reshape2(a: &mut Array2<f32>, rows: usize, cols: usize) {
    if a.dim() != (rows, cols) {
        *a = Array2::zeros((rows, cols));
    }
}

/// The buffers of a session's fixed-point solves, kept across tokens: after the first decode
/// step of a batch shape, the solve allocates nothing (see `tests/equilibrium_decode_alloc.rs`).
pub(crate) struct FpWork {
    /// Built once per session (with `return_best`: the committed K/V are the best iterate's).
    pub(crate) solver: Box<dyn FixedPointSolver<f32>>,
    /// The solver's buffers and per-row state.
    pub(crate) solve: SolveWorkspace<f32>,
    /// The injection term `h·W_hᵀ + b` `[R·T, C]`, constant over a solve.
    pub(crate) inj: Array2<f32>,
    /// The iterate `[R, T·C]` (z⁰, then z*).
    pub(crate) z: Array2<f32>,
    /// `[R, T·C]`: fixed-K ping-pong buffer, then `f(z*)`.
    pub(crate) next: Array2<f32>,
    /// Every row active (the commit evaluation).
    pub(crate) all: Vec<bool>,
    pub(crate) bufs: EvalBufs,
    /// The activation buffers of the module's quantized products, in the session's
    /// [`InferenceConfig::module_activations`] mode (swapped in for the solve).
    pub(crate) module_qx: QActs,
}

impl FpWork {
    pub(crate) fn new(cfg: &InferenceConfig) -> Self {
        FpWork {
            solver: cfg.build_solver(),
            solve: SolveWorkspace::new(),
            inj: Array2::zeros((0, 0)),
            z: Array2::zeros((0, 0)),
            next: Array2::zeros((0, 0)),
            all: vec![],
            bufs: EvalBufs::default(),
            module_qx: QActs::new(cfg.module_activations),
        }
    }
}

/// Per-evaluation buffers of [`FpMap`] (refilled within their capacity).
#[derive(Default)]
pub(crate) struct EvalBufs {
    /// Evaluations so far per row (= index of the next iteration).
    pub(crate) evals: Vec<usize>,
    /// The cache each row's latest evaluation ran against.
    pub(crate) store_idx: Vec<usize>,
    pub(crate) lens: Vec<usize>,
    /// Rows, sequence ids, inputs, injection terms and outputs of one group of rows that
    /// share a cache, gathered (only when not every row is evaluated against one cache).
    pub(crate) group: Vec<usize>,
    pub(crate) seq_ids: Vec<usize>,
    pub(crate) zg: Vec<f32>,
    pub(crate) ig: Vec<f32>,
    pub(crate) ug: Vec<f32>,
}

/// The solver's view of the module: rows = sequences, state = `[T·C]`.
pub(crate) struct FpMap<'a> {
    pub(crate) module: ModuleView<'a, dyn BlockWeights>,
    pub(crate) cfg: &'a ModelConfig,
    /// Injection term `h·W_hᵀ + b` `[R·T, C]` (empty without injection).
    pub(crate) inj: ArrayView2<'a, f32>,
    /// `(R, T, C)`.
    pub(crate) dims: (usize, usize, usize),
    pub(crate) seqs: &'a [usize],
    pub(crate) mode: KvMode,
    /// Each evaluation leaves its K/V pending in the cache it ran against (for a given
    /// token, row `ri` visits multi-step cache `j` only at iteration `j`).
    pub(crate) fp_kv: &'a mut Vec<LayerKv>,
    pub(crate) scratch: &'a mut Scratch,
    pub(crate) bufs: &'a mut EvalBufs,
}

impl FpMap<'_> {
    /// Runs the module's iteration as `ec` defines it from `z` (holding z⁰: 0 with injection,
    /// `h` without): solved by `solver` until `stop` in `ws`, or `K` plain applications for a
    /// fixed-K module — `K − 1` when `then_commit` (the caller's commit evaluation is the K-th).
    /// Leaves the state rows `[R, T·C]` in `z` (`next` is scratch of the same shape); returns
    /// whether they were solved (their statuses are then `ws.rows()`).
    #[allow(clippy::too_many_arguments)] // the iteration's settings plus its buffers
    pub(crate) fn iterate(
        &mut self,
        ec: &ElmConfig,
        solver: &dyn FixedPointSolver<f32>,
        stop: &StopCriteria,
        then_commit: bool,
        ws: &mut SolveWorkspace<f32>,
        z: &mut Array2<f32>,
        next: &mut Array2<f32>,
    ) -> Result<bool> {
        let r = self.dims.0;
        match ec.fixed_iterations {
            Some(k) => {
                for _ in 0..k - usize::from(then_commit) {
                    self.eval_where(z.view(), |_| true, r, next.view_mut())?;
                    std::mem::swap(z, next);
                }
                Ok(false)
            }
            None => {
                solver.solve_in(ws, self, z.view(), stop)?;
                z.assign(&ws.z());
                Ok(true)
            }
        }
    }

    /// Cache that row `ri`'s next evaluation attends to; creates multi-step caches lazily
    /// as copies of the previous one (earlier tokens' latest iterate; its pending K/V are
    /// overwritten or replaced before the commit).
    pub(crate) fn store_for(&mut self, ri: usize) -> Result<usize> {
        match self.mode {
            KvMode::OneStep => Ok(0),
            KvMode::MultiStep => {
                let j = self.bufs.evals[ri];
                while self.fp_kv.len() <= j {
                    let last = self.fp_kv.last().cloned().ok_or_else(|| {
                        ElmError::InvalidArgument("multi-step KV: no fixed-point cache".into())
                    })?;
                    self.fp_kv.push(last);
                }
                Ok(j)
            }
        }
    }

    /// Evaluates `φ(z, h)` (`z` `[R, T·C]`) for the rows where `active(ri)`, row `ri` against
    /// cache [`Self::store_for`] (its K/V left pending there), into `out`; counts the
    /// evaluation. When every evaluated row runs against one cache (one-step KV; decode with
    /// all rows active) the rows go through the block in place, without gathering.
    pub(crate) fn eval_where(
        &mut self,
        z: ArrayView2<f32>,
        active: impl Fn(usize) -> bool,
        n_rows: usize,
        mut out: ArrayViewMut2<f32>,
    ) -> Result<()> {
        let (r, t, c) = self.dims;
        let shape_err = |e: ndarray::ShapeError| ElmError::shape("FpMap", e.to_string());
        self.bufs.store_idx.clear();
        let mut stores = (usize::MAX, 0usize);
        for ri in 0..n_rows {
            let s = if active(ri) {
                self.store_for(ri)?
            } else {
                usize::MAX
            };
            if s != usize::MAX {
                stores = (stores.0.min(s), stores.1.max(s));
            }
            self.bufs.store_idx.push(s);
        }
        if stores.0 == usize::MAX {
            return Ok(());
        }
        let every_row = (0..r).all(&active);
        if every_row && stores.0 == stores.1 {
            let z3 = z.into_shape_with_order((r, t, c)).map_err(shape_err)?;
            let o3 = out
                .view_mut()
                .into_shape_with_order((r, t, c))
                .map_err(shape_err)?;
            self.module.apply_cached_into(
                self.cfg,
                z3,
                self.inj,
                self.seqs,
                &mut self.fp_kv[stores.0],
                self.scratch,
                &mut self.bufs.lens,
                o3,
            )?;
            self.bufs.evals.iter_mut().for_each(|e| *e += 1);
            return Ok(());
        }
        let injected = self.module.projection.is_some();
        let (tc, b) = (t * c, &mut *self.bufs);
        for store in stores.0..=stores.1 {
            b.group.clear();
            b.group
                .extend((0..r).filter(|&ri| b.store_idx[ri] == store));
            if b.group.is_empty() {
                continue;
            }
            let n = b.group.len();
            b.seq_ids.clear();
            b.zg.clear();
            b.ig.clear();
            for &ri in &b.group {
                b.seq_ids.push(self.seqs[ri]);
                b.zg.extend(z.row(ri).iter());
                if injected {
                    b.ig.extend(self.inj.slice(s![ri * t..(ri + 1) * t, ..]).iter());
                }
            }
            b.ug.clear();
            b.ug.resize(n * tc, 0.0);
            let zg = ArrayView3::from_shape((n, t, c), &b.zg).map_err(shape_err)?;
            let ig = ArrayView2::from_shape((if injected { n * t } else { 0 }, c), &b.ig)
                .map_err(shape_err)?;
            let ug = ndarray::ArrayViewMut3::from_shape((n, t, c), &mut b.ug).map_err(shape_err)?;
            self.module.apply_cached_into(
                self.cfg,
                zg,
                ig,
                &b.seq_ids,
                &mut self.fp_kv[store],
                self.scratch,
                &mut b.lens,
                ug,
            )?;
            for (gi, &ri) in b.group.iter().enumerate() {
                out.row_mut(ri)
                    .assign(&ArrayView1::from(&b.ug[gi * tc..(gi + 1) * tc]));
                b.evals[ri] += 1;
            }
        }
        Ok(())
    }
}

impl FixedPointMap<f32> for FpMap<'_> {
    fn dim(&self) -> usize {
        self.dims.1 * self.dims.2
    }
    fn eval(
        &mut self,
        z: ArrayView2<f32>,
        active: &[bool],
        out: ArrayViewMut2<f32>,
    ) -> std::result::Result<(), MapError> {
        Ok(self.eval_where(z, |ri| active[ri], active.len(), out)?)
    }
}
