//! GPPO's policy: a categorical distribution `softmax(θ)` over the start layers, and its
//! group-normalised, clipped PPO update (all in f64, gradients written out by hand).

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};
use crate::train::AdamWConfig;

/// `softmax(θ)`.
pub fn softmax(theta: &[f64]) -> Vec<f64> {
    let m = theta.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = theta.iter().map(|&t| (t - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// `log softmax(θ)`.
pub fn log_softmax(theta: &[f64]) -> Vec<f64> {
    let m = theta.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + theta.iter().map(|&t| (t - m).exp()).sum::<f64>().ln();
    theta.iter().map(|&t| t - lse).collect()
}

/// Entropy `−Σ p log p` of `softmax(θ)`.
pub fn entropy(theta: &[f64]) -> f64 {
    softmax(theta)
        .iter()
        .zip(log_softmax(theta))
        .map(|(p, lp)| -p * lp)
        .sum()
}

/// Samples an index from `softmax(θ)` (inverse CDF on one uniform draw).
pub fn sample(theta: &[f64], rng: &mut impl Rng) -> usize {
    let p = softmax(theta);
    let u: f64 = rng.gen();
    let mut acc = 0.0;
    for (i, pi) in p.iter().enumerate() {
        acc += pi;
        if u < acc {
            return i;
        }
    }
    p.len() - 1
}

/// Group-normalised advantages `(r − mean r) / (std r + 1e-8)` with the unbiased std (as
/// `torch.std`); a group of one has std 0 and gets advantage 0.
pub fn advantages(rewards: &[f64]) -> Vec<f64> {
    let n = rewards.len();
    if n == 0 {
        return vec![];
    }
    let mean = rewards.iter().sum::<f64>() / n as f64;
    let std = if n > 1 {
        (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    rewards.iter().map(|r| (r - mean) / (std + 1e-8)).collect()
}

/// One buffered transition: the sampled start (index into θ), its reward and the log-prob
/// the policy gave it when it was sampled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transition {
    pub action: usize,
    pub reward: f64,
    pub old_logp: f64,
}

/// The PPO surrogate `J(θ) = mean_i min(ρ_i A_i, clip(ρ_i, 1−ε, 1+ε) A_i) + β·H(softmax θ)`,
/// `ρ_i = exp(log π_θ(a_i) − old_logp_i)`, and its gradient `∂J/∂θ` (the clipped term has
/// zero gradient wherever it is the smaller one).
pub fn ppo_objective(
    theta: &[f64],
    batch: &[Transition],
    adv: &[f64],
    clip_eps: f64,
    entropy_coef: f64,
) -> (f64, Vec<f64>) {
    let k = theta.len();
    let p = softmax(theta);
    let lp = log_softmax(theta);
    let n = batch.len().max(1) as f64;
    let mut obj = 0.0;
    let mut grad = vec![0.0; k];
    for (tr, &a) in batch.iter().zip(adv) {
        let ratio = (lp[tr.action] - tr.old_logp).exp();
        let clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps);
        let (un, cl) = (ratio * a, clipped * a);
        obj += un.min(cl) / n;
        if un <= cl {
            // ∂ρ/∂θ_j = ρ (1[j = a] − p_j).
            for j in 0..k {
                let ind = if j == tr.action { 1.0 } else { 0.0 };
                grad[j] += a * ratio * (ind - p[j]) / n;
            }
        }
    }
    if entropy_coef != 0.0 {
        let h: f64 = -p.iter().zip(&lp).map(|(pi, l)| pi * l).sum::<f64>();
        obj += entropy_coef * h;
        // ∂H/∂θ_j = −p_j (log p_j + H).
        for j in 0..k {
            grad[j] += entropy_coef * (-p[j] * (lp[j] + h));
        }
    }
    (obj, grad)
}

/// Adam on θ (gradient ascent on the PPO objective), its state serialisable for checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyState {
    pub theta: Vec<f64>,
    pub m: Vec<f64>,
    pub v: Vec<f64>,
    pub t: u64,
}

impl PolicyState {
    /// θ = 0 (uniform).
    pub fn uniform(k: usize) -> Self {
        PolicyState {
            theta: vec![0.0; k],
            m: vec![0.0; k],
            v: vec![0.0; k],
            t: 0,
        }
    }

    /// One ascent step of the shared Adam rule (`opt`, [`AdamWConfig::step_vector`]) along
    /// `grad` with learning rate `lr`.
    pub fn adam_ascent(&mut self, opt: &AdamWConfig, grad: &[f64], lr: f64) -> Result<()> {
        if grad.len() != self.theta.len() || grad.iter().any(|g| !g.is_finite()) {
            return Err(ElmError::NonFinite("policy gradient".into()));
        }
        opt.step_vector(
            &mut self.theta,
            (&mut self.m, &mut self.v),
            self.t,
            grad,
            lr,
            true,
        )?;
        self.t += 1;
        Ok(())
    }

    /// `q` PPO epochs on the buffered group (advantages normalised over it); returns the
    /// objective before the first epoch.
    pub fn ppo_update(
        &mut self,
        batch: &[Transition],
        epochs: usize,
        clip_eps: f64,
        entropy_coef: f64,
        opt: &AdamWConfig,
        lr: f64,
    ) -> Result<f64> {
        let rewards: Vec<f64> = batch.iter().map(|t| t.reward).collect();
        let adv = advantages(&rewards);
        let mut first = None;
        for _ in 0..epochs {
            let (obj, grad) = ppo_objective(&self.theta, batch, &adv, clip_eps, entropy_coef);
            first.get_or_insert(obj);
            self.adam_ascent(opt, &grad, lr)?;
        }
        Ok(first.unwrap_or(0.0))
    }
}
