//! ShortGPT (Men et al. 2024): delete the M layers of lowest Block Influence, `1 − cos(h_l, h_{l+1})`
//! averaged over calibration tokens; the layers need not be contiguous.

use super::Selection;
use crate::compress::calibration::BoundaryStates;
use crate::compress::metrics::{block_influence, lowest};

/// The `m` layers of lowest Block Influence, ascending.
pub fn select(states: &BoundaryStates, m: usize) -> Selection {
    let bi = block_influence(states);
    let mut removed = lowest(&bi, m);
    removed.sort_unstable();
    Selection {
        removed,
        replaced: vec![],
        start: None,
        metric: "block influence".to_string(),
        scores: bi,
    }
}
