//! Metric-based window choices and the "where to prune" report: GPPO's argmax and its
//! enumeration rank, the Spearman correlation of θ with the enumeration, and where each
//! metric's choice ranks. A typed, serialisable report for `paper_repro`.

use serde::{Deserialize, Serialize};

use crate::compress::metrics::{
    angular_distance, block_influence, window_cosine, window_removal_nll,
};
use crate::compress::{BoundaryStates, Calibration};
use crate::error::{ElmError, Result};
use crate::model::ModelWeights;

use super::enumerate::Enumeration;
use super::gppo::GppoOutcome;

crate::registry::variant_list! {
    /// A metric-based window selector.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum Selector("selector") {
        /// LLM-Streamline: highest `mean_t cos(h_s, h_{s+M})`.
        Cosine,
        /// ShortGPT's Block Influence: lowest sum of per-layer BI over the window.
        Bi,
        /// ReplaceMe: lowest last-token angular distance between `h_s` and `h_{s+M}`.
        Angular,
        /// Shortened-LLaMA one-shot PPL: lowest calibration NLL with the window removed.
        Ppl,
    }
}

impl Selector {
    pub fn name(self) -> &'static str {
        match self {
            Selector::Cosine => "cosine",
            Selector::Bi => "bi",
            Selector::Angular => "angular",
            Selector::Ppl => "ppl",
        }
    }
    /// Whether a lower score is a better window to replace.
    pub fn lower_is_better(self) -> bool {
        match self {
            Selector::Cosine => false,
            Selector::Bi | Selector::Angular | Selector::Ppl => true,
        }
    }
}

impl std::str::FromStr for Selector {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        <Selector as crate::registry::Registry>::from_name(s).ok_or_else(|| {
            ElmError::config(
                "method",
                format!(
                    "unknown selector `{s}` ({})",
                    <Selector as crate::registry::Registry>::names().join(" | ")
                ),
            )
        })
    }
}

/// One selector's window scores (index = start) and its choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricChoice {
    pub method: Selector,
    pub scores: Vec<f64>,
    pub lower_is_better: bool,
    /// Best start over all windows.
    pub choice: usize,
}

/// Best index of `scores` (first on ties).
pub fn best(scores: &[f64], lower_is_better: bool) -> usize {
    let mut b = 0;
    for i in 1..scores.len() {
        let better = if lower_is_better {
            scores[i] < scores[b]
        } else {
            scores[i] > scores[b]
        };
        if better {
            b = i;
        }
    }
    b
}

/// Window scores of `method` for windows of `m` layers on the dense residual stream.
pub fn metric_choice(
    weights: &ModelWeights,
    calib: &Calibration,
    states: &BoundaryStates,
    method: Selector,
    m: usize,
    batch: usize,
) -> Result<MetricChoice> {
    let scores = match method {
        Selector::Cosine => window_cosine(states, m)?,
        Selector::Angular => angular_distance(states, m)?,
        Selector::Ppl => window_removal_nll(weights, states, calib, m, batch)?,
        Selector::Bi => {
            let n = states.num_layers();
            window_cosine(states, m)?; // validates m
            let bi = block_influence(states);
            (0..=n - m).map(|s| bi[s..s + m].iter().sum()).collect()
        }
    };
    let lower = method.lower_is_better();
    Ok(MetricChoice {
        method,
        choice: best(&scores, lower),
        lower_is_better: lower,
        scores,
    })
}

/// Average ranks (1 = smallest; ties share the mean rank).
pub fn ranks(x: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && x[idx[j + 1]] == x[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's ρ: Pearson correlation of the average ranks (`None` when either is constant
/// or fewer than two points).
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() != b.len() || a.len() < 2 {
        return None;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma).powi(2);
        sbb += (y - mb).powi(2);
    }
    (saa > 0.0 && sbb > 0.0).then(|| sab / (saa * sbb).sqrt())
}

/// Where a choice lands in the enumeration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub method: String,
    /// The start chosen over all windows.
    pub choice: usize,
    /// The best enumerated start by the same criterion (= `choice` when it was enumerated).
    pub choice_on_grid: usize,
    /// 1-based rank of `choice_on_grid` among the enumerated windows.
    pub enum_rank: usize,
    /// Held-out NLL of `choice_on_grid` minus the enumeration's best.
    pub nll_gap: f64,
}

/// The "where to prune" report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhereToPrune {
    pub num_layers: usize,
    pub num_replaced: usize,
    /// Enumerated starts, best first, and their held-out NLL.
    pub enum_ranking: Vec<usize>,
    pub enum_nll: Vec<(usize, f64)>,
    /// 95% interval over the held-out problems of each `enum_nll` entry, in the same order
    /// (`None` where the enumeration did not record one).
    #[serde(default)]
    pub enum_nll_interval: Vec<Option<(f64, f64)>>,
    pub dense_nll: f64,
    pub gppo: Option<Placement>,
    /// Spearman ρ between θ and −NLL over the enumerated starts (1 = same order).
    pub gppo_spearman: Option<f64>,
    pub gppo_probs: Option<Vec<f64>>,
    pub metrics: Vec<Placement>,
}

impl WhereToPrune {
    /// The 95% interval of the `i`-th `enum_nll` entry, when the enumeration recorded one.
    pub fn enum_interval(&self, i: usize) -> Option<(f64, f64)> {
        self.enum_nll_interval.get(i).copied().flatten()
    }
}

fn place(method: &str, scores: &[f64], lower: bool, e: &Enumeration) -> Result<Placement> {
    let choice = best(scores, lower);
    let grid: Vec<usize> = e.entries.iter().map(|x| x.start).collect();
    let on_grid = grid
        .iter()
        .copied()
        .filter(|&s| s < scores.len())
        .reduce(|a, b| {
            let better = if lower {
                scores[b] < scores[a]
            } else {
                scores[b] > scores[a]
            };
            if better {
                b
            } else {
                a
            }
        })
        .ok_or_else(|| ElmError::InvalidArgument("enumeration has no window".into()))?;
    let rank = e
        .rank_of(on_grid)
        .ok_or_else(|| ElmError::InvalidArgument(format!("start {on_grid} not enumerated")))?;
    let nll = |s: usize| e.entries.iter().find(|x| x.start == s).map(|x| x.nll);
    let best_nll = nll(e.ranking()[0]).unwrap_or(f64::NAN);
    Ok(Placement {
        method: method.into(),
        choice,
        choice_on_grid: on_grid,
        enum_rank: rank,
        nll_gap: nll(on_grid).unwrap_or(f64::NAN) - best_nll,
    })
}

/// Builds the report from an enumeration, an optional GPPO result and metric choices.
pub fn where_to_prune(
    e: &Enumeration,
    gppo: Option<&GppoOutcome>,
    metrics: &[MetricChoice],
) -> Result<WhereToPrune> {
    if e.entries.is_empty() {
        return Err(ElmError::InvalidArgument(
            "enumeration has no window".into(),
        ));
    }
    let m = e.config.candidate.num_replaced;
    let (gp, rho) = match gppo {
        Some(g) => {
            if g.num_replaced != m {
                return Err(ElmError::config(
                    "gppo",
                    format!(
                        "GPPO searched M = {} but the enumeration M = {m}",
                        g.num_replaced
                    ),
                ));
            }
            let p = place("gppo", &g.theta, false, e)?;
            let pts: Vec<(f64, f64)> = e
                .entries
                .iter()
                .filter(|x| x.start < g.theta.len())
                .map(|x| (g.theta[x.start], -x.nll))
                .collect();
            let (a, b): (Vec<f64>, Vec<f64>) = pts.into_iter().unzip();
            (Some(p), spearman(&a, &b))
        }
        None => (None, None),
    };
    let metrics = metrics
        .iter()
        .map(|mc| place(mc.method.name(), &mc.scores, mc.lower_is_better, e))
        .collect::<Result<Vec<_>>>()?;
    let mut entries: Vec<&super::enumerate::EnumEntry> = e.entries.iter().collect();
    entries.sort_by_key(|x| x.start);
    Ok(WhereToPrune {
        num_layers: e.num_layers,
        num_replaced: m,
        enum_ranking: e.ranking(),
        enum_nll: entries.iter().map(|x| (x.start, x.nll)).collect(),
        enum_nll_interval: entries.iter().map(|x| x.nll_interval).collect(),
        dense_nll: e.dense_nll,
        gppo: gp,
        gppo_spearman: rho,
        gppo_probs: gppo.map(|g| g.probs.clone()),
        metrics,
    })
}

/// How a window selector reads against the ground truth: every start trained at the full
/// budget and scored on validation (`truth`: `(start, NLL)`, lower is better).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgainstTruth {
    /// Starts with a ground-truth score.
    pub starts: usize,
    /// Spearman's ρ between the policy's probability of a start and the negated ground-truth
    /// NLL (1: the policy ranks the starts as full training does), over starts with both.
    pub policy_spearman: Option<f64>,
    /// Spearman's ρ between the enumeration's short-training NLL and the ground truth, over
    /// the starts it enumerated (the proxy GPPO's own ρ is reported against).
    pub proxy_spearman: Option<f64>,
    /// The policy's entropy over ln(number of starts): 1 is the uniform policy.
    pub policy_entropy_ratio: Option<f64>,
    /// The policy's largest probability, and the uniform one `1 / starts`.
    pub policy_max: Option<f64>,
    pub uniform: f64,
    /// Ground-truth NLL of the chosen start, and the mean over all starts (what a start drawn
    /// uniformly at random scores in expectation).
    pub choice_nll: Option<f64>,
    pub random_nll: f64,
    /// Share of the starts whose ground truth is better than the choice's (0: the best).
    pub share_better_than_choice: Option<f64>,
}

/// [`AgainstTruth`] of `report`'s GPPO run (its policy `gppo_probs`, indexed by start, and its
/// choice) and of its enumeration, against `truth`. `None` without ground truth.
pub fn against_truth(report: &WhereToPrune, truth: &[(usize, f64)]) -> Option<AgainstTruth> {
    if truth.is_empty() {
        return None;
    }
    let score = |start: usize| truth.iter().find(|(s, _)| *s == start).map(|(_, v)| *v);
    let paired = |xs: &[(usize, f64)]| -> (Vec<f64>, Vec<f64>) {
        xs.iter()
            .filter_map(|&(s, x)| score(s).map(|t| (x, t)))
            .unzip()
    };
    let probs: Option<Vec<(usize, f64)>> = report
        .gppo_probs
        .as_ref()
        .map(|p| p.iter().copied().enumerate().collect());
    let policy_spearman = probs.as_ref().and_then(|p| {
        let (x, t) = paired(p);
        let neg: Vec<f64> = t.iter().map(|v| -v).collect();
        spearman(&x, &neg)
    });
    let (proxy, t) = paired(&report.enum_nll);
    let proxy_spearman = spearman(&proxy, &t);
    let entropy = report.gppo_probs.as_ref().filter(|p| p.len() > 1).map(|p| {
        let h: f64 = p.iter().filter(|&&q| q > 0.0).map(|&q| -q * q.ln()).sum();
        h / (p.len() as f64).ln()
    });
    let choice_nll = report.gppo.as_ref().and_then(|g| score(g.choice));
    let random_nll = truth.iter().map(|(_, v)| v).sum::<f64>() / truth.len() as f64;
    Some(AgainstTruth {
        starts: truth.len(),
        policy_spearman,
        proxy_spearman,
        policy_entropy_ratio: entropy,
        policy_max: report
            .gppo_probs
            .as_ref()
            .and_then(|p| p.iter().copied().reduce(f64::max)),
        uniform: 1.0
            / report
                .gppo_probs
                .as_ref()
                .map_or(truth.len(), |p| p.len().max(1)) as f64,
        choice_nll,
        random_nll,
        share_better_than_choice: choice_nll
            .map(|c| truth.iter().filter(|(_, v)| *v < c).count() as f64 / truth.len() as f64),
    })
}
