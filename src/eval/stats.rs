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
    /// Two-sided exact McNemar p-value ([`exact_mcnemar`]) when every item of both sides is a
    /// 0/1 outcome of weight 1 (exact match, pass@1): the test for a paired difference of
    /// proportions that stays exact at the handful of discordant problems a small model gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_mcnemar_p: Option<f64>,
}

/// Two-sided exact McNemar test of `b` items that only the model gets right against `c` that
/// only the reference does: under no difference each discordant item is a fair coin, so the
/// p-value is `min(1, 2 · P[Binomial(b + c, ½) ≤ min(b, c)])` (1 without discordant items).
/// Summed in log space, so that thousands of discordant items neither underflow nor overflow.
pub fn exact_mcnemar(b: usize, c: usize) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // ln C(n, i) − n ln 2 for i = 0..=k, then log-sum-exp.
    let mut terms = Vec::with_capacity(k + 1);
    let mut ln_choose = 0.0f64;
    for i in 0..=k {
        if i > 0 {
            ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        terms.push(ln_choose - n as f64 * std::f64::consts::LN_2);
    }
    let top = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tail = top.exp() * terms.iter().map(|t| (t - top).exp()).sum::<f64>();
    (2.0 * tail).min(1.0)
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
    let binary = |items: &[ItemScore]| {
        items
            .iter()
            .all(|it| it.weight == 1.0 && (it.value == 0.0 || it.value == 1.0))
    };
    let exact_mcnemar_p = (binary(model) && binary(&reference)).then(|| {
        let only = |a: &[ItemScore], b: &[ItemScore]| {
            a.iter()
                .zip(b)
                .filter(|(x, y)| x.value == 1.0 && y.value == 0.0)
                .count()
        };
        exact_mcnemar(only(model, &reference), only(&reference, model))
    });
    Ok(PairedComparison {
        model: est(m0, &mut ms),
        reference: est(r0, &mut rs),
        delta,
        ratio,
        verdict: verdict.into(),
        exact_mcnemar_p,
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

/// The standard normal quantile Φ⁻¹(p) for 0 < p < 1 (Acklam's rational approximation:
/// relative error below 1.2e-9, far below what an interval's printed digits show).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// Wilson's score interval of a proportion: `successes` of `n` at confidence `level`. Unlike a
/// bootstrap's, it does not collapse to [0, 0] at zero successes (0 of 16 at 95%: [0, 0.194]).
pub fn wilson(successes: usize, n: usize, level: f64) -> Result<Estimate> {
    if n == 0 || successes > n || !(level > 0.0 && level < 1.0) {
        return Err(ElmError::InvalidArgument(format!(
            "wilson: {successes} successes of {n} at level {level}"
        )));
    }
    let z = normal_quantile(0.5 + level / 2.0);
    let (k, nf) = (successes as f64, n as f64);
    let p = k / nf;
    let denom = 1.0 + z * z / nf;
    let centre = (p + z * z / (2.0 * nf)) / denom;
    let half = z / denom * (p * (1.0 - p) / nf + z * z / (4.0 * nf * nf)).sqrt();
    // At 0 (or n) successes the bound is exactly 0 (or 1); the formula leaves rounding there.
    Ok(Estimate {
        value: p,
        lo: if successes == 0 {
            0.0
        } else {
            (centre - half).max(0.0)
        },
        hi: if successes == n {
            1.0
        } else {
            (centre + half).min(1.0)
        },
        n,
        level,
    })
}

/// McNemar's exact test of two 0/1 scores over the same items (matched by id): `model_only`
/// items the model gets right and the reference wrong, `reference_only` the reverse, and the
/// two-sided exact binomial p-value of that split under "no difference" (1 when no item
/// differs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct McNemar {
    pub model_only: usize,
    pub reference_only: usize,
    pub p_value: f64,
}

pub fn mcnemar(model: &[ItemScore], reference: &[ItemScore]) -> Result<McNemar> {
    let by_id: std::collections::HashMap<&str, f64> = reference
        .iter()
        .map(|it| (it.id.as_str(), it.value))
        .collect();
    if model.len() != reference.len() || by_id.len() != reference.len() {
        return Err(ElmError::InvalidArgument(format!(
            "mcnemar: {} model items vs {} reference items: not the same item set",
            model.len(),
            reference.len()
        )));
    }
    let (mut b, mut c) = (0usize, 0usize);
    for it in model {
        let r = *by_id.get(it.id.as_str()).ok_or_else(|| {
            ElmError::InvalidArgument(format!("mcnemar: item {} has no reference score", it.id))
        })?;
        let binary = |v: f64| (v == 0.0 || v == 1.0).then_some(v == 1.0);
        match (binary(it.value), binary(r)) {
            (Some(true), Some(false)) => b += 1,
            (Some(false), Some(true)) => c += 1,
            (Some(_), Some(_)) => {}
            _ => {
                return Err(ElmError::InvalidArgument(format!(
                    "mcnemar: item {} is not scored 0 or 1 ({} vs {r})",
                    it.id, it.value
                )))
            }
        }
    }
    let n = b + c;
    // P(X ≤ min(b, c)) for X ~ Binomial(n, ½), doubled, in logs (n may be in the thousands).
    let ln_choose =
        |n: usize, k: usize| -> f64 { (1..=k).map(|i| ((n - k + i) as f64 / i as f64).ln()).sum() };
    let k = b.min(c);
    let tail: f64 = (0..=k)
        .map(|i| (ln_choose(n, i) - n as f64 * std::f64::consts::LN_2).exp())
        .sum();
    Ok(McNemar {
        model_only: b,
        reference_only: c,
        p_value: (2.0 * tail).min(1.0),
    })
}
