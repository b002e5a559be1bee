//! Cache-free (whole-sequence) forward passes used by training and evaluation: dense hidden
//! states at layer boundaries, and the module's fixed point for a padded batch.
//!
//! Right padding is harmless here: attention is causal, so real tokens never see pads.

use ndarray::{Array2, Array3, ArrayView2, ArrayView3, ArrayViewMut2};

use crate::error::{ElmError, Result};
use crate::model::{block_forward_inplace, LayerKv, ModelConfig, ModelWeights, Scratch};
use crate::solver::{FixedPointMap, FixedPointSolver, Solution};

use super::module::ElmModule;

/// Token embeddings `[B, T, C]` of a rectangular batch.
pub fn embed(weights: &ModelWeights, tokens: &[Vec<u32>]) -> Result<Array3<f32>> {
    let cfg = &weights.config;
    let t = tokens.first().map_or(0, |s| s.len());
    let mut x = Array3::zeros((tokens.len(), t, cfg.hidden_size));
    for (b, seq) in tokens.iter().enumerate() {
        if seq.len() != t {
            return Err(ElmError::shape(
                "embed",
                "ragged batch: pad sequences to one length",
            ));
        }
        for (i, &tok) in seq.iter().enumerate() {
            if tok as usize >= cfg.vocab_size {
                return Err(ElmError::InvalidArgument(format!(
                    "token id {tok} >= vocab size {}",
                    cfg.vocab_size
                )));
            }
            x.slice_mut(ndarray::s![b, i, ..])
                .assign(&weights.embed.row(tok as usize));
        }
    }
    Ok(x)
}

/// Runs dense layers `range` on `x [B, T, C]` (positions from 0).
pub fn run_dense_layers(
    weights: &ModelWeights,
    mut x: Array3<f32>,
    range: std::ops::Range<usize>,
) -> Result<Array3<f32>> {
    let cfg = &weights.config;
    let (b, t, _) = x.dim();
    let (mut kv, mut scratch) = fresh_cache(cfg, b, t)?;
    // commit = false: every layer sees an empty history, so one cache serves them all.
    let lens = vec![t; b];
    for l in range {
        block_forward_inplace(
            &weights.layers[l],
            cfg,
            x.view_mut(),
            &lens,
            &mut kv,
            false,
            &mut scratch,
        )?;
    }
    Ok(x)
}

/// An empty single-layer cache and scratch for a whole-sequence pass of `[B, T]` tokens.
fn fresh_cache(cfg: &ModelConfig, b: usize, t: usize) -> Result<(LayerKv, Scratch)> {
    let (b, t) = (b.max(1), t.max(1));
    Ok((LayerKv::new(cfg, b, t)?, Scratch::new(cfg, t)))
}

/// One application `f(z, h) = block(z·W_zᵀ + h·W_hᵀ + b)` on `[B, T, C]`.
pub fn module_apply(
    module: &ElmModule,
    cfg: &ModelConfig,
    z: ArrayView3<f32>,
    h: ArrayView3<f32>,
) -> Result<Array3<f32>> {
    let (b, t, c) = z.dim();
    let z2 = z
        .to_shape((b * t, c))
        .map_err(|e| ElmError::shape("module z", e.to_string()))?;
    let h2 = h
        .to_shape((b * t, c))
        .map_err(|e| ElmError::shape("module h", e.to_string()))?;
    let mut u = module
        .inject(z2.view(), h2.view())
        .into_shape_with_order((b, t, c))
        .expect("[B, T, C]");
    let (mut kv, mut scratch) = fresh_cache(cfg, b, t)?;
    let lens = vec![t; b];
    block_forward_inplace(
        &module.block,
        cfg,
        u.view_mut(),
        &lens,
        &mut kv,
        false,
        &mut scratch,
    )?;
    Ok(u)
}

/// Solves `z = f(z, h)` per sequence (rows `[T·C]`) from `z⁰ = 0` with `solver`.
pub fn solve_module(
    module: &ElmModule,
    cfg: &ModelConfig,
    h: &ArrayView3<f32>,
    solver: &dyn FixedPointSolver<f32>,
) -> Result<(Array3<f32>, Solution<f32>)> {
    let (b, t, c) = h.dim();
    struct Map<'a> {
        module: &'a ElmModule,
        cfg: &'a ModelConfig,
        h: ArrayView3<'a, f32>,
    }
    impl FixedPointMap<f32> for Map<'_> {
        fn dim(&self) -> usize {
            self.h.dim().1 * self.h.dim().2
        }
        fn eval(
            &mut self,
            z: ArrayView2<f32>,
            active: &[bool],
            mut out: ArrayViewMut2<f32>,
        ) -> Result<()> {
            let (_, t, c) = self.h.dim();
            let rows: Vec<usize> = (0..active.len()).filter(|&r| active[r]).collect();
            let zr = z
                .select(ndarray::Axis(0), &rows)
                .into_shape_with_order((rows.len(), t, c))
                .expect("rows");
            let hr = self.h.select(ndarray::Axis(0), &rows);
            let y = module_apply(self.module, self.cfg, zr.view(), hr.view())?;
            for (i, &r) in rows.iter().enumerate() {
                out.row_mut(r).assign(
                    &y.index_axis(ndarray::Axis(0), i)
                        .to_shape(t * c)
                        .expect("row"),
                );
            }
            Ok(())
        }
    }
    let mut map = Map {
        module,
        cfg,
        h: h.view(),
    };
    let z0 = Array2::<f32>::zeros((b, t * c));
    let sol = solver.solve(&mut map, z0.view())?;
    let z = sol
        .z
        .clone()
        .into_shape_with_order((b, t, c))
        .expect("[B, T, C]");
    Ok((z, sol))
}

/// Mean over valid tokens of the per-token mean squared error: `Σ_valid ‖a−b‖² / (C·#valid)`.
pub fn masked_mse(a: ArrayView3<f32>, b: ArrayView3<f32>, valid: &[Vec<bool>]) -> f64 {
    let (bs, t, c) = a.dim();
    let (mut sum, mut n) = (0.0f64, 0usize);
    for i in 0..bs {
        for j in 0..t {
            if valid[i][j] {
                n += 1;
                for k in 0..c {
                    let d = (a[[i, j, k]] - b[[i, j, k]]) as f64;
                    sum += d * d;
                }
            }
        }
    }
    if n == 0 {
        0.0
    } else {
        sum / (n * c) as f64
    }
}
