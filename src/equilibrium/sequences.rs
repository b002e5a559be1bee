//! [`solve_sequences`]: the module's fixed point for whole sequences with nothing cached (the
//! teacher-forced evaluation path).

use ndarray::{Array2, Array3, ArrayView3};

use crate::error::{ElmError, Result};
use crate::model::ModelConfig;
use crate::solver::{SolveWorkspace, SolverConfig, StopCriteria};

use super::config::ElmConfig;
use super::fixed_point::{EvalBufs, FpMap};
use super::inference_config::KvMode;
use super::module::ElmModule;
use crate::model::dense_pass::fresh_cache;

/// The module's output state for whole sequences `h` `[B, T, C]` at positions `0..T` (nothing
/// cached before them), each sequence one solver row: `z*` solved by `solver` until `stop`, or
/// `K` applications for a fixed-K module (see [`ElmConfig::fixed_iterations`]).
pub fn solve_sequences(
    ec: &ElmConfig,
    module: &ElmModule,
    cfg: &ModelConfig,
    h: ArrayView3<f32>,
    solver: &SolverConfig,
    stop: &StopCriteria,
) -> Result<Array3<f32>> {
    let (b, t, c) = h.dim();
    let (cache, mut scratch) = fresh_cache(cfg, b, t)?;
    let mut caches = vec![cache];
    let seqs: Vec<usize> = (0..b).collect();
    let view = module.view();
    let h2 = h.as_standard_layout();
    let mut inj = Array2::zeros((0, 0));
    view.injection_term_into(
        h2.view()
            .into_shape_with_order((b * t, c))
            .map_err(|e| ElmError::shape("solve_sequences h", e.to_string()))?,
        &mut inj,
        &mut scratch.qx,
    );
    let mut z = if ec.injection {
        Array2::zeros((b, t * c))
    } else {
        h2.view()
            .into_shape_with_order((b, t * c))
            .map_err(|e| ElmError::shape("solve_sequences h", e.to_string()))?
            .to_owned()
    };
    let mut next = Array2::zeros((b, t * c));
    let mut bufs = EvalBufs {
        evals: vec![0; b],
        ..EvalBufs::default()
    };
    let mut map = FpMap {
        module: view,
        cfg,
        inj: inj.view(),
        dims: (b, t, c),
        seqs: &seqs,
        mode: KvMode::OneStep,
        fp_kv: &mut caches,
        scratch: &mut scratch,
        bufs: &mut bufs,
    };
    let mut ws = SolveWorkspace::new();
    map.iterate(
        ec,
        solver.build().as_ref(),
        stop,
        false,
        &mut ws,
        &mut z,
        &mut next,
    )?;
    z.into_shape_with_order((b, t, c))
        .map_err(|e| ElmError::shape("solve_sequences z", e.to_string()))
}
