//! Shortened-LLaMA (Kim et al. 2024), one shot: score every block by the calibration NLL of the
//! model without it (PPL criterion) or by its Taylor+ importance `Σ_W |Σ W ⊙ ∂CE/∂W|`, then
//! delete the M lowest, never the first 4 or the last 2 blocks (its "+" rule).

use super::Selection;
use crate::compress::calibration::{BoundaryStates, Calibration};
use crate::compress::metrics::{lowest, taylor_importance, taylor_sums, window_removal_nll};
use crate::error::Result;
use crate::model::ModelWeights;

/// Shortened-LLaMA's selection: the `m` lowest of `scores` (one per block), never the first 4 or
/// the last 2 blocks (its "+" rule) when the model is deep enough for that (`N > M + 6`);
/// otherwise the `m` lowest of all. Sorted ascending by layer index.
pub fn shortened_plus_select(scores: &[f64], m: usize) -> Vec<usize> {
    let n = scores.len();
    let protected = |l: usize| n > m + 6 && (l < 4 || l + 2 >= n);
    let masked: Vec<f64> = scores
        .iter()
        .enumerate()
        .map(|(l, &v)| if protected(l) { f64::INFINITY } else { v })
        .collect();
    let mut remove = lowest(&masked, m);
    remove.sort_unstable();
    remove
}

/// PPL criterion: the blocks whose single removal raises the calibration NLL least.
pub fn select_ppl(
    weights: &ModelWeights,
    calib: &Calibration,
    states: &BoundaryStates,
    m: usize,
    batch: usize,
) -> Result<Selection> {
    let nll = window_removal_nll(weights, states, calib, 1, batch)?;
    Ok(Selection {
        removed: shortened_plus_select(&nll, m),
        replaced: vec![],
        start: None,
        metric: "calibration NLL without the block".to_string(),
        scores: nll,
    })
}

/// Taylor+ criterion: the blocks of least importance on the calibration LM loss.
pub fn select_taylor(
    weights: &ModelWeights,
    calib: &Calibration,
    m: usize,
    batch: usize,
) -> Result<Selection> {
    let importance = taylor_importance(&taylor_sums::<f32>(weights, calib, batch)?);
    Ok(Selection {
        removed: shortened_plus_select(&importance, m),
        replaced: vec![],
        start: None,
        metric: "taylor+ |Σ W·∂CE/∂W|".to_string(),
        scores: importance,
    })
}
