//! Training-free depth compression, one file per method: each returns an ordinary dense model
//! with fewer layers (saved as an HF directory by the CLI) and a report of what it chose and why.
//!
//! - [`short_gpt`]: ShortGPT (delete the layers of lowest Block Influence).
//! - [`shortened_llama`]: Shortened-LLaMA's one-shot PPL and Taylor+ criteria with its "+" rule.
//! - [`window_delete`]: UIDL-style deletion of the window of lowest angular distance.
//! - [`replace_me`]: ReplaceMe's least-squares map folded into the layer before the window.
//! - [`laco`]: LaCo's RDSC merge of one window, and its own top-down layer-collapse search.
//!
//! A method only *selects* (a [`Selection`]: layers to drop, layers to replace, and the scores it
//! chose from); [`prune`] checks the options, applies the selection and writes the report, so a
//! new method is one file here and its variant of [`PruneMethod`] (with its entry in the
//! variant list, its name and its arms in `is_window` and [`prune`], each of which the compiler
//! asks for).

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::calibration::{BoundaryStates, Calibration};
use crate::equilibrium::accounting::{embedding_params, layer_kv_bytes};
use crate::error::{ElmError, Result};
use crate::model::{LayerWeights, ModelWeights};
use crate::registry::Registry;

pub mod laco;
pub mod replace_me;
pub mod short_gpt;
pub mod shortened_llama;
pub mod window_delete;

pub use laco::{
    laco_search, mean_flat_cosine, rdsc_merge, LacoSearch, LACO_MERGE_SIZE, LACO_SAMPLES,
};
pub use replace_me::{mlp_split, replace_me_map};
pub use shortened_llama::shortened_plus_select;

crate::registry::variant_list! {
    /// A training-free compression method.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum PruneMethod("method") {
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
}

impl PruneMethod {
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
        match self {
            PruneMethod::WindowDelete | PruneMethod::ReplaceMeLs | PruneMethod::LaCo => true,
            PruneMethod::ShortGpt
            | PruneMethod::ShortenedPpl
            | PruneMethod::ShortenedTaylor
            | PruneMethod::LaCoSearch => false,
        }
    }
}

impl std::str::FromStr for PruneMethod {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        <PruneMethod as Registry>::from_name(s).ok_or_else(|| {
            ElmError::config(
                "method",
                format!(
                    "unknown method `{s}` (expected one of {})",
                    PruneMethod::names().join(", ")
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

/// What a method chose: the layers it drops (original indices), the layers it replaces first
/// (original index, new weights), and the metric it chose by with its scores.
pub struct Selection {
    pub removed: Vec<usize>,
    /// Original layer index and its replacement, applied before the removal.
    pub replaced: Vec<(usize, LayerWeights)>,
    /// Window start for window methods.
    pub start: Option<usize>,
    pub metric: String,
    pub scores: Vec<f64>,
}

/// A window method's start: `given`, or the best of `scores` (computed only when needed) with
/// the metric's name.
pub(crate) fn window_start(
    given: Option<usize>,
    metric: &str,
    scores: impl FnOnce() -> Result<(Vec<f64>, Option<usize>)>,
) -> Result<(usize, String, Vec<f64>)> {
    if let Some(s) = given {
        return Ok((s, "given".to_string(), Vec::new()));
    }
    let (scores, best) = scores()?;
    let s = best.ok_or_else(|| ElmError::InvalidArgument(format!("no {metric} score")))?;
    Ok((s, metric.to_string(), scores))
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
    let selection = match opts.method {
        PruneMethod::ShortGpt => short_gpt::select(states, m),
        PruneMethod::ShortenedPpl => {
            shortened_llama::select_ppl(weights, calib, states, m, opts.batch)?
        }
        PruneMethod::ShortenedTaylor => {
            shortened_llama::select_taylor(weights, calib, m, opts.batch)?
        }
        PruneMethod::WindowDelete => window_delete::select(states, m, opts.start)?,
        PruneMethod::ReplaceMeLs => replace_me::select(weights, states, m, opts.start, opts.batch)?,
        PruneMethod::LaCo => laco::select_window(weights, states, m, opts.start)?,
        PruneMethod::LaCoSearch => laco::select_search(weights, states, m)?,
    };
    let mut base = weights.clone();
    for (l, layer) in selection.replaced {
        base.layers[l] = layer;
    }
    let pruned = delete_layers(&base, &selection.removed)?;
    let (dense_params, dense_non_embedding_params) = param_counts(weights);
    let (params, non_embedding_params) = param_counts(&pruned);
    let kv = |w: &ModelWeights| w.config.num_layers * layer_kv_bytes(&w.config, 1, 1024);
    let report = PruneReport {
        method: opts.method,
        num_replaced: m,
        removed_layers: selection.removed,
        start: selection.start,
        metric: selection.metric,
        scores: selection.scores,
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
