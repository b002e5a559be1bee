//! Layer- and window-selection scores on the dense residual stream ([`BoundaryStates`]), each
//! accumulated in f64. Windows are `[s, s + M)`; removing one feeds `h_s` to layer `s + M`.

use ndarray::{s, ArrayView1, ArrayView3};
use rayon::prelude::*;

use super::calibration::{BoundaryStates, Calibration};
use crate::autograd::{AdFloat, Tape};
use crate::error::{ElmError, Result};
use crate::eval::nll::token_nll;
use crate::model::dense_pass::{head_logits, run_dense_layers};
use crate::model::tape::{BlockParams, ModelTensors, ModelVars, Trainable};
use crate::model::ModelWeights;
use crate::nn::IGNORE_INDEX;

/// `cos(a, b)` in f64; 0 when either vector is zero (no direction to compare).
fn cosine(a: ArrayView1<f32>, b: ArrayView1<f32>) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b.iter()) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        0.0
    } else {
        ab / (aa.sqrt() * bb.sqrt())
    }
}

/// Mean over every token of `cos(a_t, b_t)`; `a`, `b`: `[n, T, C]`.
fn mean_token_cosine(a: ArrayView3<f32>, b: ArrayView3<f32>) -> f64 {
    let (n, t, _) = a.dim();
    let mut sum = 0.0;
    for i in 0..n {
        for j in 0..t {
            sum += cosine(a.slice(s![i, j, ..]), b.slice(s![i, j, ..]));
        }
    }
    sum / (n * t).max(1) as f64
}

fn check_window(states: &BoundaryStates, m: usize) -> Result<usize> {
    let n = states.num_layers();
    if m == 0 || m >= n {
        return Err(ElmError::config(
            "num_replaced",
            format!("window of {m} layers in a model of {n} (need 1 <= M < N)"),
        ));
    }
    Ok(n - m + 1)
}

/// ShortGPT's Block Influence of every layer: `BI_i = mean_t (1 − cos(h_i, h_{i+1}))`. Low = the
/// layer changes its input little.
pub fn block_influence(states: &BoundaryStates) -> Vec<f64> {
    (0..states.num_layers())
        .map(|i| 1.0 - mean_token_cosine(states.states[i].view(), states.states[i + 1].view()))
        .collect()
}

/// LLM-Streamline's window score: `mean_t cos(h_s, h_{s+M})` for every start `s`. High = the
/// window changes the stream little.
pub fn window_cosine(states: &BoundaryStates, m: usize) -> Result<Vec<f64>> {
    let windows = check_window(states, m)?;
    Ok((0..windows)
        .map(|s| mean_token_cosine(states.states[s].view(), states.states[s + m].view()))
        .collect())
}

/// ReplaceMe's / UIDL's window score: the angular distance `arccos(cos(h_s, h_{s+M})) / π` of
/// each chunk's last token, averaged over chunks. Low = the window changes the stream little.
pub fn angular_distance(states: &BoundaryStates, m: usize) -> Result<Vec<f64>> {
    let windows = check_window(states, m)?;
    Ok((0..windows)
        .map(|s| {
            let (a, b) = (&states.states[s], &states.states[s + m]);
            let (n, t, _) = a.dim();
            let sum: f64 = (0..n)
                .map(|i| {
                    let c = cosine(a.slice(s![i, t - 1, ..]), b.slice(s![i, t - 1, ..]));
                    c.clamp(-1.0, 1.0).acos() / std::f64::consts::PI
                })
                .sum();
            sum / n.max(1) as f64
        })
        .collect())
}

/// Mean next-token NLL (nats per predicted token) of the calibration chunks when the window
/// `[s, s + M)` is removed (`h_s` goes straight to layer `s + M`), for every start `s`:
/// Shortened-LLaMA's one-shot PPL criterion in window form (`M = 1` scores single blocks).
/// Runs `batch` chunks at a time through the remaining layers and the LM head.
pub fn window_removal_nll(
    weights: &ModelWeights,
    states: &BoundaryStates,
    calib: &Calibration,
    m: usize,
    batch: usize,
) -> Result<Vec<f64>> {
    let windows = check_window(states, m)?;
    let _frozen = weights.frozen_for_scoring();
    (0..windows)
        .map(|s| removal_nll(weights, states, calib, s, s + m, batch))
        .collect()
}

/// NLL of the calibration chunks with layers `[from, to)` skipped (`from == to`: the dense model).
pub fn removal_nll(
    weights: &ModelWeights,
    states: &BoundaryStates,
    calib: &Calibration,
    from: usize,
    to: usize,
    batch: usize,
) -> Result<f64> {
    let n_layers = weights.config.num_layers;
    let h = &states.states[from];
    let (n, t, c) = h.dim();
    let (mut nll, mut count) = (0.0f64, 0usize);
    let batch = batch.max(1);
    for start in (0..n).step_by(batch) {
        let rows = start..(start + batch).min(n);
        let x = h.slice(s![rows.clone(), .., ..]).to_owned();
        let x = run_dense_layers(weights, x, to..n_layers)?;
        // Final norm and LM head on every position but the last (which has no target).
        let r = rows.len();
        let flat = x
            .slice(s![.., ..t - 1, ..])
            .to_shape(((r * (t - 1)), c))
            .map_err(|e| ElmError::shape("removal_nll", e.to_string()))?
            .into_owned();
        let logits = head_logits(weights, flat.view());
        // Rows in parallel (the f64 log-softmax over the vocabulary is a large share of the
        // cost), summed in order so that the total does not depend on the schedule.
        let row_nll: Vec<f64> = (0..logits.nrows())
            .into_par_iter()
            .map(|k| {
                let (ci, ti) = (rows.start + k / (t - 1), k % (t - 1));
                token_nll(logits.row(k), calib.chunks[ci][ti + 1])
            })
            .collect();
        for v in row_nll {
            nll += v;
            count += 1;
        }
    }
    if count == 0 {
        return Err(ElmError::InvalidArgument(
            "calibration chunks have no next-token targets".into(),
        ));
    }
    Ok(nll / count as f64)
}

/// Shortened-LLaMA's first-order Taylor sums of every block: for each weight `W` of layer `l`
/// (q, k, v, o, gate, up, down, the two RMSNorm gains, and the Q/K/V biases when the model has
/// them), `S_W = Σ_elements W ⊙ ∂CE/∂W`, signed, in f64. CE is the mean next-token cross-entropy
/// of the full dense model over every calibration token (each batch's mean weighted by its share
/// of the tokens, so the sums do not depend on `batch`); by the chain rule
/// `S_W = d/dε CE(W·(1 + ε))` at `ε = 0`. One forward and backward on the tape in precision `T`
/// per `batch` chunks, every block's weights registered as params.
pub fn taylor_sums<T: AdFloat>(
    weights: &ModelWeights,
    calib: &Calibration,
    batch: usize,
) -> Result<Vec<BlockParams<f64>>> {
    let n_layers = weights.config.num_layers;
    let t = calib.seq_len();
    if t < 2 || calib.chunks.iter().any(|c| c.len() != t) {
        return Err(ElmError::InvalidArgument(
            "calibration chunks must share one length >= 2 (no next-token target otherwise)".into(),
        ));
    }
    let tensors = ModelTensors::<T>::from_weights(weights)?;
    let mut sums: Vec<BlockParams<f64>> =
        tensors.layers.iter().map(|l| l.map(|_, _| 0.0)).collect();
    let trainable = Trainable {
        embed: false,
        layers: 0..n_layers,
        head: false,
    };
    let total = calib.chunks.len() * (t - 1);
    for chunk in calib.chunks.chunks(batch.max(1)) {
        let b = chunk.len();
        let ids: Vec<usize> = chunk.iter().flatten().map(|&x| x as usize).collect();
        // Position j predicts token j + 1; the last position has no target.
        let targets: Vec<i64> = chunk
            .iter()
            .flat_map(|c| {
                (0..t).map(move |j| {
                    if j + 1 < t {
                        i64::from(c[j + 1])
                    } else {
                        IGNORE_INDEX
                    }
                })
            })
            .collect();
        let mut tape = Tape::<T>::new();
        let mv = ModelVars::register(&mut tape, &tensors, &trainable);
        let logits = mv.forward_logits(&mut tape, &ids, b, t)?;
        let ce = crate::nn::cross_entropy(&mut tape, logits, &targets, IGNORE_INDEX)?;
        let ce_val = tape.scalar(ce).to_f64().unwrap_or(f64::NAN);
        if !ce_val.is_finite() {
            return Err(ElmError::NonFinite(
                "Taylor criterion: calibration CE".into(),
            ));
        }
        let grads = tape.backward(ce)?;
        // This batch's mean CE carries its share of the calibration tokens.
        let share = (b * (t - 1)) as f64 / total as f64;
        for ((sum, vars), w) in sums.iter_mut().zip(&mv.layers).zip(&tensors.layers) {
            let vars = vars.named();
            let ws = w.named();
            let mut k = 0;
            *sum = sum.map(|name, &acc| {
                let ((vn, var), (wn, arr)) = (vars[k], ws[k]);
                k += 1;
                debug_assert!(vn == name && wn == name);
                let dot = grads.get(*var).map_or(0.0, |g| {
                    g.iter()
                        .zip(arr.iter())
                        .map(|(&g, &w)| {
                            g.to_f64().unwrap_or(f64::NAN) * w.to_f64().unwrap_or(f64::NAN)
                        })
                        .sum::<f64>()
                });
                acc + share * dot
            });
        }
    }
    Ok(sums)
}

/// Taylor+ block importance from [`taylor_sums`]: `Σ_W |S_W|` per block (low = the loss is
/// insensitive to the block's weights to first order).
pub fn taylor_importance(sums: &[BlockParams<f64>]) -> Vec<f64> {
    sums.iter()
        .map(|b| b.named().into_iter().map(|(_, s)| s.abs()).sum())
        .collect()
}

/// Indices of the `k` smallest scores, ascending by score (ties: lower index first).
pub fn lowest(scores: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Index of the largest score (first on ties).
pub fn argmax(scores: &[f64]) -> Option<usize> {
    (0..scores.len()).reduce(|best, i| if scores[i] > scores[best] { i } else { best })
}
