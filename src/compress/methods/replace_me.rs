//! ReplaceMe (Shopkhoev et al. 2025), least-squares variant: delete the window of lowest angular
//! distance and fold a linear map, fitted on calibration tokens, into the down projection of the
//! layer before it (so it adds no parameters).

use ndarray::{s, Array2, Array3};
use ndarray_linalg::{FactorizeInto, Solve};

use super::window_delete::angular_window;
use super::Selection;
use crate::autograd::Tape;
use crate::compress::calibration::BoundaryStates;
use crate::error::{ElmError, Result};
use crate::model::tape::{attention_branch, mlp_branch, BlockVars};
use crate::model::ModelWeights;

/// Deletes the window (never starting at layer 0: the map needs a layer before it) and replaces
/// layer `s − 1` by itself with `Tᵀ·W_down` as down projection.
pub fn select(
    weights: &ModelWeights,
    states: &BoundaryStates,
    m: usize,
    given: Option<usize>,
    batch: usize,
) -> Result<Selection> {
    let (s, metric, scores) = angular_window(states, m, 1, given)?;
    let t = replace_me_map(weights, states, s, m, batch)?;
    // Mo·T = u·W_downᵀ·T = u·(Tᵀ·W_down)ᵀ: the map folds into layer s−1's down projection.
    let mut layer = weights.layers[s - 1].clone();
    layer.w_down = t.t().dot(&layer.w_down.mapv(f64::from)).mapv(|v| v as f32);
    Ok(Selection {
        removed: (s..s + m).collect(),
        replaced: vec![(s - 1, layer)],
        start: Some(s),
        metric,
        scores,
    })
}

/// ReplaceMe's least-squares map for removing `[start, start + m)`: with `mid` the residual
/// stream of layer `start − 1` after its attention and `Mo` its MLP output (`h_start = mid + Mo`),
/// `T = argmin ‖Mo·T − (h_{start+m} − mid)‖²` over every calibration token, from the normal
/// equations accumulated in f64. Returns `T` `[C, C]`.
pub fn replace_me_map(
    weights: &ModelWeights,
    states: &BoundaryStates,
    start: usize,
    m: usize,
    batch: usize,
) -> Result<Array2<f64>> {
    if start == 0 || start + m > weights.config.num_layers {
        return Err(ElmError::config(
            "start",
            format!(
                "ReplaceMe needs a layer before the window: window [{start}, {}) of {} layers",
                start + m,
                weights.config.num_layers
            ),
        ));
    }
    let c = weights.config.hidden_size;
    let (mut gram, mut cross) = (Array2::<f64>::zeros((c, c)), Array2::<f64>::zeros((c, c)));
    let input = &states.states[start - 1];
    let target = &states.states[start + m];
    let n = input.dim().0;
    for first in (0..n).step_by(batch.max(1)) {
        let rows = first..(first + batch.max(1)).min(n);
        let (mid, mo) = mlp_split(
            weights,
            start - 1,
            input.slice(s![rows.clone(), .., ..]).to_owned(),
        )?;
        let y = target.slice(s![rows, .., ..]);
        let flat = |a: ndarray::ArrayView3<f32>| -> Result<Array2<f64>> {
            let (b, t, c) = a.dim();
            a.to_shape((b * t, c))
                .map(|v| v.mapv(f64::from))
                .map_err(|e| ElmError::shape("replace_me_map", e.to_string()))
        };
        let mo = flat(mo.view())?;
        let rhs = flat(y)? - flat(mid.view())?;
        gram += &mo.t().dot(&mo);
        cross += &mo.t().dot(&rhs);
    }
    let lu = gram
        .factorize_into()
        .map_err(|e| ElmError::Linalg(format!("ReplaceMe normal equations: {e}")))?;
    let mut t = Array2::<f64>::zeros((c, c));
    for j in 0..c {
        let col = lu
            .solve(&cross.column(j).to_owned())
            .map_err(|e| ElmError::Linalg(format!("ReplaceMe normal equations: {e}")))?;
        t.column_mut(j).assign(&col);
    }
    if t.iter().any(|v| !v.is_finite()) {
        return Err(ElmError::NonFinite(
            "ReplaceMe map (singular normal equations: too few calibration tokens?)".into(),
        ));
    }
    Ok(t)
}

/// Layer `layer` on `x` `[B, T, C]` split at its MLP: `(x + Attn(x), MLP(x + Attn(x)))`.
pub fn mlp_split(
    weights: &ModelWeights,
    layer: usize,
    x: Array3<f32>,
) -> Result<(Array3<f32>, Array3<f32>)> {
    let mut tape = Tape::<f32>::new();
    tape.no_grad(|t| {
        let b = BlockVars::from_weights(t, &weights.layers[layer], &weights.config, false);
        let xv = t.constant(x.into_dyn());
        let o = attention_branch(t, &b, xv, 0, None)?;
        let mid = t.add(xv, o)?;
        let mo = mlp_branch(t, &b, mid)?;
        let dim3 = |a: &ndarray::ArrayD<f32>| {
            a.clone()
                .into_dimensionality::<ndarray::Ix3>()
                .map_err(|e| ElmError::shape("mlp_split", e.to_string()))
        };
        Ok((dim3(t.value(mid))?, dim3(t.value(mo))?))
    })
}
