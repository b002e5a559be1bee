//! Training-free depth compression: each method returns an ordinary dense model with fewer
//! layers (saved as an HF directory by the CLI) and a report of what it chose and why.

use std::time::Instant;

use ndarray::{s, Array2, Array3};
use ndarray_linalg::{FactorizeInto, Solve};
use serde::{Deserialize, Serialize};

use super::calibration::{BoundaryStates, Calibration};
use super::metrics::{
    angular_distance, argmax, block_influence, lowest, taylor_importance, taylor_sums,
    window_cosine, window_removal_nll,
};
use crate::autograd::Tape;
use crate::elm::accounting::{embedding_params, layer_kv_bytes};
use crate::error::{ElmError, Result};
use crate::model::tape::{attention_branch, mlp_branch, BlockVars};
use crate::model::{LayerWeights, ModelWeights};

/// A training-free compression method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PruneMethod {
    /// ShortGPT: delete the M layers of lowest Block Influence (not necessarily contiguous).
    ShortGpt,
    /// Shortened-LLaMA (PPL criterion, one shot): delete the M blocks whose single removal
    /// raises the calibration NLL least, never the first 4 or the last 2 (its "+" rule).
    ShortenedPpl,
    /// Shortened-LLaMA (Taylor+ criterion, one shot): block importance `Σ_W |Σ W ⊙ ∂CE/∂W|` over
    /// the block's weights on the calibration LM loss; delete the M least important blocks,
    /// never the first 4 or the last 2 (the same "+" rule as [`PruneMethod::ShortenedPpl`]).
    ShortenedTaylor,
    /// UIDL-style window deletion: delete the window of lowest last-token angular distance.
    WindowDelete,
    /// ReplaceMe (least squares): delete the window of lowest angular distance and fold the
    /// least-squares linear map into the down projection of the layer before it.
    ReplaceMeLs,
    /// LaCo's RDSC merge of the window of highest window cosine into its first layer.
    LaCo,
    /// LaCo's own top-down search: merges of [`LACO_MERGE_SIZE`] layers accepted while the final
    /// hidden states stay similar above a threshold, the highest threshold reaching M.
    LaCoSearch,
}

impl PruneMethod {
    pub const ALL: [PruneMethod; 7] = [
        PruneMethod::ShortGpt,
        PruneMethod::ShortenedPpl,
        PruneMethod::ShortenedTaylor,
        PruneMethod::WindowDelete,
        PruneMethod::ReplaceMeLs,
        PruneMethod::LaCo,
        PruneMethod::LaCoSearch,
    ];
    /// The CLI / JSON name.
    pub fn name(self) -> &'static str {
        match self {
            PruneMethod::ShortGpt => "short-gpt",
            PruneMethod::ShortenedPpl => "shortened-ppl",
            PruneMethod::ShortenedTaylor => "shortened-taylor",
            PruneMethod::WindowDelete => "window-delete",
            PruneMethod::ReplaceMeLs => "replace-me-ls",
            PruneMethod::LaCo => "la-co",
            PruneMethod::LaCoSearch => "la-co-search",
        }
    }
    /// Whether the method removes one contiguous window (so `--start` may fix it).
    pub fn is_window(self) -> bool {
        !matches!(
            self,
            PruneMethod::ShortGpt
                | PruneMethod::ShortenedPpl
                | PruneMethod::ShortenedTaylor
                | PruneMethod::LaCoSearch
        )
    }
}

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

impl std::str::FromStr for PruneMethod {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        PruneMethod::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = PruneMethod::ALL.iter().map(|m| m.name()).collect();
                ElmError::config(
                    "method",
                    format!(
                        "unknown method `{s}` (expected one of {})",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// What to compress and how.
#[derive(Clone, Debug)]
pub struct PruneOptions {
    pub method: PruneMethod,
    /// Layers removed, M.
    pub num_replaced: usize,
    /// Fixes the window start of a window method instead of selecting it.
    pub start: Option<usize>,
    /// Calibration chunks per forward batch.
    pub batch: usize,
}

/// What a method chose, from which scores, and what the result costs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PruneReport {
    pub method: PruneMethod,
    pub num_replaced: usize,
    /// Original indices of the layers no longer run (for LaCo: merged into `start`).
    pub removed_layers: Vec<usize>,
    /// Window start for window methods.
    pub start: Option<usize>,
    /// The selection metric's name and its score per layer (ShortGPT, Shortened) or per window
    /// start (window methods); empty when `start` was given.
    pub metric: String,
    pub scores: Vec<f64>,
    pub calibration_tokens: usize,
    pub dense_params: usize,
    pub dense_non_embedding_params: usize,
    pub params: usize,
    pub non_embedding_params: usize,
    /// Parameters the method adds (0: ReplaceMe folds its map into an existing matrix).
    pub added_params: usize,
    /// KV-cache bytes for one sequence of 1,024 tokens (f32), dense and compressed.
    pub dense_kv_bytes_1k: usize,
    pub kv_bytes_1k: usize,
    pub seconds: f64,
}

/// A compressed model and its report.
pub struct PrunedModel {
    pub weights: ModelWeights,
    pub report: PruneReport,
}

/// The model without the layers in `remove` (original indices).
pub fn delete_layers(weights: &ModelWeights, remove: &[usize]) -> Result<ModelWeights> {
    let n = weights.config.num_layers;
    if let Some(&bad) = remove.iter().find(|&&l| l >= n) {
        return Err(ElmError::config(
            "layers",
            format!("layer {bad} outside the model's {n} layers"),
        ));
    }
    let mut out = weights.clone();
    out.layers = (0..n)
        .filter(|l| !remove.contains(l))
        .map(|l| weights.layers[l].clone())
        .collect();
    if out.layers.is_empty() {
        return Err(ElmError::config(
            "num_replaced",
            "removing every layer leaves no model",
        ));
    }
    out.config.num_layers = out.layers.len();
    Ok(out)
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

/// How `elm compress` initialises the module's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockInit {
    /// A copy of the first replaced layer (the ELM paper's init).
    FirstLayer,
    /// LaCo's RDSC merge of the whole window (`θ_l + Σ_k (θ_{l+k} − θ_l)`): the window's
    /// layers collapsed into one as a zero-training starting point.
    LaCo,
}

impl std::str::FromStr for BlockInit {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "first-layer" => Ok(BlockInit::FirstLayer),
            "la-co" => Ok(BlockInit::LaCo),
            other => Err(ElmError::config(
                "block_init",
                format!("unknown block init `{other}` (expected first-layer or la-co)"),
            )),
        }
    }
}

/// The module of `cfg` initialised as `init` says ([`ElmModule::init`], then for
/// [`BlockInit::LaCo`] the block replaced by the RDSC merge of the window — its MLP half for
/// an FFN block).
pub fn init_module(
    dense: &ModelWeights,
    cfg: &crate::elm::ElmConfig,
    init: BlockInit,
) -> Result<crate::elm::ElmModule> {
    let mut module = crate::elm::ElmModule::init(dense, cfg)?;
    if init == BlockInit::LaCo {
        let merged = rdsc_merge(&dense.layers[cfg.start_layer..cfg.end_layer()])?;
        module.block = crate::elm::ModuleBlock::of_layer(&merged, cfg.block);
    }
    Ok(module)
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
                    let out = crate::elm::forward::run_layers(
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

/// Parameters in total and without the embeddings, for a model config.
fn param_counts(weights: &ModelWeights) -> (usize, usize) {
    let total = weights.num_params();
    (total, total - embedding_params(&weights.config))
}

/// Runs `opts.method` on `weights` with the calibration residual stream `states` (of `calib`).
pub fn prune(
    weights: &ModelWeights,
    calib: &Calibration,
    states: &BoundaryStates,
    opts: &PruneOptions,
) -> Result<PrunedModel> {
    let t0 = Instant::now();
    let (n, m) = (weights.config.num_layers, opts.num_replaced);
    if m == 0 || m >= n {
        return Err(ElmError::config(
            "num_replaced",
            format!("{m} layers of a model of {n} (need 1 <= M < N)"),
        ));
    }
    if states.num_layers() != n {
        return Err(ElmError::shape(
            "prune",
            format!("{} layer boundaries for {n} layers", states.states.len()),
        ));
    }
    if let Some(s) = opts.start {
        if !opts.method.is_window() {
            return Err(ElmError::config(
                "start",
                format!("{} selects its own layers", opts.method.name()),
            ));
        }
        if s + m > n {
            return Err(ElmError::config(
                "start",
                format!("window [{s}, {}) outside the model's {n} layers", s + m),
            ));
        }
    }
    // Window start: given, or chosen by the method's metric (with the scores for the report).
    let choose = |metric: &str, scores: Vec<f64>, pick: Option<usize>| -> Result<_> {
        let s = pick.ok_or_else(|| ElmError::InvalidArgument(format!("no {metric} score")))?;
        Ok((s, metric.to_string(), scores))
    };
    let angular_window = |min_start: usize| -> Result<(usize, String, Vec<f64>)> {
        let scores = angular_distance(states, m)?;
        let best = (min_start..scores.len()).min_by(|&a, &b| scores[a].total_cmp(&scores[b]));
        choose("last-token angular distance", scores, best)
    };
    let (removed, start, metric, scores, merged) = match opts.method {
        PruneMethod::ShortGpt => {
            let bi = block_influence(states);
            let mut remove = lowest(&bi, m);
            remove.sort_unstable();
            (remove, None, "block influence".to_string(), bi, vec![])
        }
        PruneMethod::ShortenedPpl => {
            let nll = window_removal_nll(weights, states, calib, 1, opts.batch)?;
            (
                shortened_plus_select(&nll, m),
                None,
                "calibration NLL without the block".to_string(),
                nll,
                vec![],
            )
        }
        PruneMethod::ShortenedTaylor => {
            let importance = taylor_importance(&taylor_sums::<f32>(weights, calib, opts.batch)?);
            (
                shortened_plus_select(&importance, m),
                None,
                "taylor+ |Σ W·∂CE/∂W|".to_string(),
                importance,
                vec![],
            )
        }
        PruneMethod::WindowDelete | PruneMethod::ReplaceMeLs | PruneMethod::LaCo => {
            let min_start = usize::from(opts.method == PruneMethod::ReplaceMeLs);
            let (s, metric, scores) = match opts.start {
                Some(s) => (s, "given".to_string(), Vec::new()),
                None if opts.method == PruneMethod::LaCo => {
                    let scores = window_cosine(states, m)?;
                    let best = argmax(&scores);
                    choose("window cosine", scores, best)?
                }
                None => angular_window(min_start)?,
            };
            let merged = match opts.method {
                PruneMethod::LaCo => vec![(s, rdsc_merge(&weights.layers[s..s + m])?)],
                _ => vec![],
            };
            // LaCo keeps (the merged) layer s; the others drop the whole window.
            let first_removed = if merged.is_empty() { s } else { s + 1 };
            (
                (first_removed..s + m).collect(),
                Some(s),
                metric,
                scores,
                merged,
            )
        }
        PruneMethod::LaCoSearch => {
            let found = laco_search(weights, states, m)?;
            let mut removed: Vec<usize> = found
                .merges
                .iter()
                .flat_map(|&(l, k)| l + 1..l + k)
                .collect();
            removed.sort_unstable();
            let merged = found
                .merges
                .iter()
                .map(|&(l, k)| Ok((l, rdsc_merge(&weights.layers[l..l + k])?)))
                .collect::<Result<Vec<_>>>()?;
            (
                removed,
                None,
                format!(
                    "LaCo search: threshold {:.2}, merges (first layer, size) {:?}, cosine of the final states after each",
                    found.threshold, found.merges
                ),
                found.similarities,
                merged,
            )
        }
    };
    let mut base = weights.clone();
    for (s, layer) in merged {
        base.layers[s] = layer;
    }
    if opts.method == PruneMethod::ReplaceMeLs {
        let s =
            start.ok_or_else(|| ElmError::InvalidArgument("ReplaceMe without window".into()))?;
        let t = replace_me_map(weights, states, s, m, opts.batch)?;
        // Mo·T = u·W_downᵀ·T = u·(Tᵀ·W_down)ᵀ: the map folds into layer s−1's down projection.
        let w_down = &base.layers[s - 1].w_down;
        let folded = t.t().dot(&w_down.mapv(f64::from));
        base.layers[s - 1].w_down = folded.mapv(|v| v as f32);
    }
    let pruned = delete_layers(&base, &removed)?;
    let (dense_params, dense_non_embedding_params) = param_counts(weights);
    let (params, non_embedding_params) = param_counts(&pruned);
    let kv = |w: &ModelWeights| w.config.num_layers * layer_kv_bytes(&w.config, 1, 1024);
    let report = PruneReport {
        method: opts.method,
        num_replaced: m,
        removed_layers: removed,
        start,
        metric,
        scores,
        calibration_tokens: calib.tokens(),
        dense_params,
        dense_non_embedding_params,
        params,
        non_embedding_params,
        added_params: 0,
        dense_kv_bytes_1k: kv(weights),
        kv_bytes_1k: kv(&pruned),
        seconds: t0.elapsed().as_secs_f64(),
    };
    Ok(PrunedModel {
        weights: pruned,
        report,
    })
}
