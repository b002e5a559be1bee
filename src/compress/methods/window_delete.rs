//! UIDL-style window deletion (Gromov et al. 2024): delete the M consecutive layers whose input
//! and output last-token states are closest in angular distance.

use super::{window_start, Selection};
use crate::compress::calibration::BoundaryStates;
use crate::compress::metrics::angular_distance;
use crate::error::Result;

/// The window start of lowest last-token angular distance among starts `>= min_start`, or
/// `given`; with the metric's name and scores.
pub fn angular_window(
    states: &BoundaryStates,
    m: usize,
    min_start: usize,
    given: Option<usize>,
) -> Result<(usize, String, Vec<f64>)> {
    window_start(given, "last-token angular distance", || {
        let scores = angular_distance(states, m)?;
        let best = (min_start..scores.len()).min_by(|&a, &b| scores[a].total_cmp(&scores[b]));
        Ok((scores, best))
    })
}

/// Deletes the window `[s, s + m)` of lowest angular distance (or the given one).
pub fn select(states: &BoundaryStates, m: usize, given: Option<usize>) -> Result<Selection> {
    let (s, metric, scores) = angular_window(states, m, 0, given)?;
    Ok(Selection {
        removed: (s..s + m).collect(),
        replaced: vec![],
        start: Some(s),
        metric,
        scores,
    })
}
