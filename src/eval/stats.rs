//! Uncertainty of evaluation figures: seeded percentile bootstrap over items.
//!
//! Every figure is a ratio of sums over items, `Σ value_i / Σ weight_i`: accuracy is
//! `value ∈ {0, 1}`, `weight = 1`; mean NLL per token is `value = Σ token NLL of item i`,
//! `weight = its token count`. Resampling items (not tokens) keeps the tokens of one answer
//! together, which is what makes the interval honest for NLL. A paired comparison resamples
//! the same item indices for both models, so the item-to-item variation that both share
//! cancels in the difference.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};

/// One evaluated item: its id in the data set and its contribution to the figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemScore {
    /// Index of the item in its split (GSM8K line order) or its task id (HumanEval).
    pub id: String,
    pub value: f64,
    pub weight: f64,
}

/// How the bootstrap is run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootstrapConfig {
    pub resamples: usize,
    pub seed: u64,
    /// Two-sided coverage of the interval (0.95).
    pub level: f64,
}

impl Default for BootstrapConfig {
    fn default() -> Self {
        BootstrapConfig {
            resamples: 2000,
            seed: 0,
            level: 0.95,
        }
    }
}

/// Most bootstrap resamples an interval may ask for.
pub const MAX_RESAMPLES: usize = 1_000_000;

impl BootstrapConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        // The cap bounds the resampling loop and its buffers (an interval needs far fewer).
        if self.resamples > MAX_RESAMPLES {
            return Err(ElmError::config(
                "bootstrap",
                format!(
                    "{} resamples exceed the cap of {MAX_RESAMPLES}",
                    self.resamples
                ),
            ));
        }
        if self.resamples < 10 || !(self.level > 0.0 && self.level < 1.0) {
            return Err(ElmError::config(
                "bootstrap",
                format!(
                    "need resamples >= 10 and 0 < level < 1, got {} and {}",
                    self.resamples, self.level
                ),
            ));
        }
        Ok(())
    }
}

/// A figure with its percentile-bootstrap interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Estimate {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
    /// Items it is computed from.
    pub n: usize,
    pub level: f64,
}

/// Model vs reference on the same items.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairedComparison {
    pub model: Estimate,
    pub reference: Estimate,
    /// `model − reference` (ΔNLL in nats/token for NLL figures).
    pub delta: Estimate,
    /// `model / reference` (the paper's retention RP for scores); `None` when the
    /// reference figure is 0.
    pub ratio: Option<Estimate>,
    /// `"higher"`, `"lower"` or `"indistinguishable"`: whether the delta interval excludes 0.
    pub verdict: String,
}

fn ratio_of(items: &[ItemScore], idx: impl Iterator<Item = usize>) -> f64 {
    let (mut v, mut w) = (0.0, 0.0);
    for i in idx {
        v += items[i].value;
        w += items[i].weight;
    }
    v / w
}

fn check_items(what: &str, items: &[ItemScore]) -> Result<()> {
    if items.is_empty() {
        return Err(ElmError::InvalidArgument(format!("{what}: no items")));
    }
    if let Some(it) = items
        .iter()
        .find(|it| !(it.value.is_finite() && it.weight.is_finite() && it.weight >= 0.0))
    {
        return Err(ElmError::InvalidArgument(format!(
            "{what}: item {} has value {} weight {}",
            it.id, it.value, it.weight
        )));
    }
    if items.iter().map(|it| it.weight).sum::<f64>() <= 0.0 {
        return Err(ElmError::InvalidArgument(format!(
            "{what}: total weight is 0"
        )));
    }
    Ok(())
}

/// Percentile interval of `samples` (sorted in place) at `level`.
fn percentile_interval(samples: &mut [f64], level: f64) -> (f64, f64) {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    let q = |p: f64| {
        // Linear interpolation between order statistics (numpy's default).
        let pos = p * (n - 1) as f64;
        let (i, frac) = (pos.floor() as usize, pos - pos.floor());
        let j = (i + 1).min(n - 1);
        samples[i] + frac * (samples[j] - samples[i])
    };
    let alpha = (1.0 - level) / 2.0;
    (q(alpha), q(1.0 - alpha))
}

/// `Σ value / Σ weight` of `items` with its bootstrap interval.
pub fn estimate(items: &[ItemScore], cfg: &BootstrapConfig) -> Result<Estimate> {
    cfg.validate()?;
    check_items("estimate", items)?;
    let n = items.len();
    let value = ratio_of(items, 0..n);
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut samples: Vec<f64> = (0..cfg.resamples)
        .map(|_| ratio_of(items, (0..n).map(|_| rng.gen_range(0..n))))
        .filter(|v| v.is_finite())
        .collect();
    let (lo, hi) = percentile_interval(&mut samples, cfg.level);
    Ok(Estimate {
        value,
        lo,
        hi,
        n,
        level: cfg.level,
    })
}

/// Paired comparison of `model` against `reference` over the items both have (matched by
/// id; every id must be in both, in any order).
pub fn paired(
    model: &[ItemScore],
    reference: &[ItemScore],
    cfg: &BootstrapConfig,
) -> Result<PairedComparison> {
    cfg.validate()?;
    check_items("paired: model", model)?;
    check_items("paired: reference", reference)?;
    let by_id: std::collections::HashMap<&str, usize> = reference
        .iter()
        .enumerate()
        .map(|(i, it)| (it.id.as_str(), i))
        .collect();
    if by_id.len() != reference.len() || model.len() != reference.len() {
        return Err(ElmError::InvalidArgument(format!(
            "paired: {} model items vs {} reference items ({} distinct ids): not the same item set",
            model.len(),
            reference.len(),
            by_id.len()
        )));
    }
    let reference: Vec<ItemScore> = model
        .iter()
        .map(|it| {
            by_id
                .get(it.id.as_str())
                .map(|&i| reference[i].clone())
                .ok_or_else(|| {
                    ElmError::InvalidArgument(format!(
                        "paired: item {} has no reference score",
                        it.id
                    ))
                })
        })
        .collect::<Result<_>>()?;
    let n = model.len();
    let (m0, r0) = (ratio_of(model, 0..n), ratio_of(&reference, 0..n));
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let (mut ms, mut rs, mut ds, mut qs) = (vec![], vec![], vec![], vec![]);
    let mut idx = vec![0; n];
    for _ in 0..cfg.resamples {
        idx.iter_mut().for_each(|i| *i = rng.gen_range(0..n));
        let m = ratio_of(model, idx.iter().copied());
        let r = ratio_of(&reference, idx.iter().copied());
        if m.is_finite() && r.is_finite() {
            ms.push(m);
            rs.push(r);
            ds.push(m - r);
            if r != 0.0 {
                qs.push(m / r);
            }
        }
    }
    let est = |value: f64, s: &mut Vec<f64>| {
        let (lo, hi) = percentile_interval(s, cfg.level);
        Estimate {
            value,
            lo,
            hi,
            n,
            level: cfg.level,
        }
    };
    let delta = est(m0 - r0, &mut ds);
    let verdict = if delta.lo > 0.0 {
        "higher"
    } else if delta.hi < 0.0 {
        "lower"
    } else {
        "indistinguishable"
    };
    // The ratio's interval needs most resamples to have a non-zero reference.
    let ratio = (r0 != 0.0 && qs.len() * 10 >= cfg.resamples * 9).then(|| est(m0 / r0, &mut qs));
    Ok(PairedComparison {
        model: est(m0, &mut ms),
        reference: est(r0, &mut rs),
        delta,
        ratio,
        verdict: verdict.into(),
    })
}

/// Spread of one figure over independent runs (seeds): mean, sample standard deviation
/// (n − 1 in the denominator; 0 for one run), min and max.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub n: usize,
    pub mean: f64,
    pub sd: f64,
    pub min: f64,
    pub max: f64,
}

/// [`Spread`] of `values`; an error for no value or a non-finite one.
pub fn spread(values: &[f64]) -> Result<Spread> {
    if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
        return Err(ElmError::InvalidArgument(format!(
            "spread: needs at least one finite value, got {values:?}"
        )));
    }
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n as f64;
    let ss: f64 = values.iter().map(|v| (v - mean).powi(2)).sum();
    Ok(Spread {
        n,
        mean,
        sd: if n > 1 {
            (ss / (n - 1) as f64).sqrt()
        } else {
            0.0
        },
        min: values.iter().cloned().fold(f64::INFINITY, f64::min),
        max: values.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    })
}

/// Ordinary least-squares fit `y ≈ a + b·x`: returns `(a, b)`; an error when fewer than two
/// distinct `x` or a non-finite value (a learning curve's trend per doubling of the budget is
/// the slope against `log2(tokens)`).
pub fn least_squares_line(x: &[f64], y: &[f64]) -> Result<(f64, f64)> {
    let finite = x.iter().chain(y).all(|v| v.is_finite());
    if x.len() != y.len() || !finite {
        return Err(ElmError::InvalidArgument(format!(
            "least_squares_line: {} x vs {} y values, all must be finite",
            x.len(),
            y.len()
        )));
    }
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let sxx: f64 = x.iter().map(|v| (v - mx).powi(2)).sum();
    if x.len() < 2 || sxx == 0.0 {
        return Err(ElmError::InvalidArgument(
            "least_squares_line: needs at least two distinct x".into(),
        ));
    }
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let b = sxy / sxx;
    Ok((my - b * mx, b))
}
