//! LaCo (Yang et al. 2024): Reserving-Differences-while-Seeking-Common merges of consecutive
//! layers into their first — one window chosen by window cosine, or LaCo's own top-down search.

use ndarray::{s, Array2, Array3};
use serde::{Deserialize, Serialize};

use super::{window_start, Selection};
use crate::compress::calibration::BoundaryStates;
use crate::compress::metrics::{argmax, window_cosine};
use crate::error::{ElmError, Result};
use crate::model::{LayerWeights, ModelWeights};

/// Merges the window of highest window cosine (or the given one) into its first layer.
pub fn select_window(
    weights: &ModelWeights,
    states: &BoundaryStates,
    m: usize,
    given: Option<usize>,
) -> Result<Selection> {
    let (s, metric, scores) = window_start(given, "window cosine", || {
        let scores = window_cosine(states, m)?;
        let best = argmax(&scores);
        Ok((scores, best))
    })?;
    // The merged layer stays at s; the rest of the window goes.
    Ok(Selection {
        removed: (s + 1..s + m).collect(),
        replaced: vec![(s, rdsc_merge(&weights.layers[s..s + m])?)],
        start: Some(s),
        metric,
        scores,
    })
}

/// LaCo's own search ([`laco_search`]) for `m` removed layers.
pub fn select_search(
    weights: &ModelWeights,
    states: &BoundaryStates,
    m: usize,
) -> Result<Selection> {
    let found = laco_search(weights, states, m)?;
    let mut removed: Vec<usize> = found
        .merges
        .iter()
        .flat_map(|&(l, k)| l + 1..l + k)
        .collect();
    removed.sort_unstable();
    let replaced = found
        .merges
        .iter()
        .map(|&(l, k)| Ok((l, rdsc_merge(&weights.layers[l..l + k])?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Selection {
        removed,
        replaced,
        start: None,
        metric: format!(
            "LaCo search: threshold {:.2}, merges (first layer, size) {:?}, cosine of the final states after each",
            found.threshold, found.merges
        ),
        scores: found.similarities,
    })
}

/// LaCo's Reserving-Differences-while-Seeking-Common merge: `θ* = θ_0 + Σ_{k≥1} (θ_k − θ_0)` for
/// every projection (and bias), norms kept from the first layer.
pub fn rdsc_merge(layers: &[LayerWeights]) -> Result<LayerWeights> {
    let (first, rest) = layers
        .split_first()
        .ok_or_else(|| ElmError::InvalidArgument("rdsc_merge: no layers".into()))?;
    let mut merged = first.clone();
    for l in rest {
        let add = |m: &mut Array2<f32>, other: &Array2<f32>, base: &Array2<f32>| {
            *m += &(other - base);
        };
        add(&mut merged.wq, &l.wq, &first.wq);
        add(&mut merged.wk, &l.wk, &first.wk);
        add(&mut merged.wv, &l.wv, &first.wv);
        add(&mut merged.wo, &l.wo, &first.wo);
        add(&mut merged.w_gate, &l.w_gate, &first.w_gate);
        add(&mut merged.w_up, &l.w_up, &first.w_up);
        add(&mut merged.w_down, &l.w_down, &first.w_down);
        for (m, o, b) in [
            (&mut merged.bq, &l.bq, &first.bq),
            (&mut merged.bk, &l.bk, &first.bk),
            (&mut merged.bv, &l.bv, &first.bv),
        ] {
            if let (Some(m), Some(o), Some(b)) = (m.as_mut(), o, b) {
                *m += &(o - b);
            }
        }
    }
    Ok(merged)
}

/// Layers per merge of LaCo's search (its C): an accepted merge folds `C` consecutive layers
/// into the first, removing `C − 1`.
pub const LACO_MERGE_SIZE: usize = 3;
/// Calibration chunks LaCo's similarity test reads (the paper uses 5 short text prefixes).
pub const LACO_SAMPLES: usize = 5;

/// What LaCo's search accepted.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LacoSearch {
    /// The highest threshold T (0.95, 0.90, …, 0.05, then −1 = accept anything) at which the
    /// search merged away M layers.
    pub threshold: f64,
    /// Accepted merges, top-down: (first original layer, layers merged into it).
    pub merges: Vec<(usize, usize)>,
    /// Mean cosine similarity of the final hidden states to the dense model's after each
    /// accepted merge (the last one is the pruned model's).
    pub similarities: Vec<f64>,
    /// Candidate merges whose similarity was computed (cached across thresholds).
    pub candidates_evaluated: usize,
}

/// A LaCo candidate: the merges accepted above it (first layer, size), its first layer, its size.
type CandidateKey = (Vec<(usize, usize)>, usize, usize);

/// Mean over chunks of the cosine similarity of the flattened `[T·C]` states of `a` and `b`.
pub fn mean_flat_cosine(a: &Array3<f32>, b: &Array3<f32>) -> f64 {
    let n = a.dim().0.max(1);
    a.outer_iter()
        .zip(b.outer_iter())
        .map(|(x, y)| {
            let (mut xy, mut xx, mut yy) = (0.0f64, 0.0f64, 0.0f64);
            for (&p, &q) in x.iter().zip(y.iter()) {
                let (p, q) = (p as f64, q as f64);
                xy += p * q;
                xx += p * p;
                yy += q * q;
            }
            xy / (xx.sqrt() * yy.sqrt()).max(1e-30)
        })
        .sum::<f64>()
        / n as f64
}

/// LaCo's layer-collapse search (Yang et al. 2024) for `m` removed layers: going down from the
/// top, the candidate merges layers `[l, l + k)` into `l` by RDSC (`k` = [`LACO_MERGE_SIZE`],
/// fewer for the last merge so that exactly `m` go); it is accepted when the mean cosine
/// similarity of the flattened final hidden states (before the final norm) of the merged model
/// and the dense one, on the first [`LACO_SAMPLES`] calibration chunks, exceeds the threshold T,
/// and the search then moves down `C` layers (merges never overlap); otherwise it moves down one
/// layer. Layer 0 is never merged into. Thresholds are tried from 0.95 down in steps of 0.05
/// (then −1: accept anything); the highest that removes `m` layers wins.
pub fn laco_search(
    weights: &ModelWeights,
    states: &BoundaryStates,
    m: usize,
) -> Result<LacoSearch> {
    let n = weights.config.num_layers;
    let c = LACO_MERGE_SIZE;
    if m == 0 || m + 1 >= n {
        return Err(ElmError::config(
            "num_replaced",
            format!("LaCo's search cannot merge away {m} of {n} layers (layer 0 is kept)"),
        ));
    }
    let samples = states.states[0].dim().0.min(LACO_SAMPLES);
    let rows = |a: &Array3<f32>| a.slice(s![..samples, .., ..]).to_owned();
    let reference = rows(&states.states[n]);
    // Similarity of a candidate, keyed by the merges accepted above it and its window: the
    // same candidate recurs at every threshold until the first acceptance differs.
    let mut cache: std::collections::HashMap<CandidateKey, f64> = Default::default();
    let mut thresholds: Vec<f64> = (0..19).map(|i| (95 - 5 * i) as f64 / 100.0).collect();
    thresholds.push(-1.0);
    for threshold in thresholds {
        let mut merges: Vec<(usize, usize)> = vec![];
        let mut merged_layers: Vec<LayerWeights> = vec![];
        let mut similarities = vec![];
        let (mut removed, mut top) = (0usize, n);
        let mut l = n.saturating_sub(c);
        while removed < m {
            let k = c.min(m - removed + 1);
            l = l.min(top.saturating_sub(k));
            if l < 1 {
                break;
            }
            let key = (merges.clone(), l, k);
            let sim = match cache.get(&key) {
                Some(&v) => v,
                None => {
                    let candidate = rdsc_merge(&weights.layers[l..l + k])?;
                    // Layers above the window: originals, and the merges accepted so far (each
                    // replacing its window by its first layer).
                    let mut above: Vec<&LayerWeights> = vec![&candidate];
                    let mut j = l + k;
                    while j < n {
                        match merges.iter().position(|&(s, _)| s == j) {
                            Some(i) => {
                                above.push(&merged_layers[i]);
                                j += merges[i].1;
                            }
                            None => {
                                above.push(&weights.layers[j]);
                                j += 1;
                            }
                        }
                    }
                    let out = crate::model::dense_pass::run_layers(
                        &weights.config,
                        above.into_iter(),
                        rows(&states.states[l]),
                    )?;
                    let v = mean_flat_cosine(&out, &reference);
                    cache.insert(key, v);
                    v
                }
            };
            if sim > threshold {
                merged_layers.push(rdsc_merge(&weights.layers[l..l + k])?);
                merges.push((l, k));
                similarities.push(sim);
                removed += k - 1;
                top = l;
                l = l.saturating_sub(c);
            } else {
                l -= 1;
            }
        }
        if removed == m {
            return Ok(LacoSearch {
                threshold,
                merges,
                similarities,
                candidates_evaluated: cache.len(),
            });
        }
    }
    Err(ElmError::config(
        "num_replaced",
        format!("LaCo's search found no {m} layers to merge in {n}"),
    ))
}
