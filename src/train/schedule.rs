//! Learning-rate schedule: linear warmup, then cosine decay to a floor fraction of the peak.
//!
//! For step `s` (0-based) with warmup `W`, total `N`, peak `η`, floor fraction `f`:
//! ```text
//! s < W :  lr = η · (s + 1) / W                      (reaches η at s = W − 1)
//! s ≥ W :  p  = min(1, (s − W) / max(1, N − W))
//!          lr = η · (f + (1 − f) · ½ · (1 + cos(π p)))   (η at s = W, f·η at s ≥ N)
//! ```

use serde::{Deserialize, Serialize};

use crate::{ElmError, Result};

/// Warmup + cosine schedule (see the module doc for the exact formula).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Peak learning rate η.
    pub peak_lr: f64,
    /// Linear-warmup steps W (0 = start at the peak).
    pub warmup_steps: usize,
    /// Total steps N; the floor is reached at step N and kept after.
    pub total_steps: usize,
    /// Final lr as a fraction of the peak, in [0, 1].
    #[serde(default)]
    pub final_lr_frac: f64,
}

impl ScheduleConfig {
    /// Warmup given as a fraction of `total_steps` (e.g. 0.1 → 10 %), rounded to nearest.
    pub fn warmup_cosine(
        peak_lr: f64,
        total_steps: usize,
        warmup_frac: f64,
        final_lr_frac: f64,
    ) -> Self {
        let warmup_steps = (warmup_frac * total_steps as f64).round() as usize;
        Self {
            peak_lr,
            warmup_steps,
            total_steps,
            final_lr_frac,
        }
    }

    /// Checks ranges: finite η ≥ 0, W ≤ N, f ∈ [0, 1].
    pub fn validate(&self) -> Result<()> {
        if !self.peak_lr.is_finite() || self.peak_lr < 0.0 {
            return Err(ElmError::config(
                "peak_lr",
                format!("must be finite and ≥ 0, got {}", self.peak_lr),
            ));
        }
        if self.warmup_steps > self.total_steps {
            return Err(ElmError::config(
                "warmup_steps",
                format!(
                    "{} exceeds total_steps {}",
                    self.warmup_steps, self.total_steps
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.final_lr_frac) {
            return Err(ElmError::config(
                "final_lr_frac",
                format!("must be in [0, 1], got {}", self.final_lr_frac),
            ));
        }
        Ok(())
    }

    /// Learning rate at 0-based step `step`.
    pub fn lr_at(&self, step: usize) -> f64 {
        let (w, n) = (self.warmup_steps, self.total_steps);
        if step < w {
            return self.peak_lr * (step + 1) as f64 / w as f64;
        }
        let p = ((step - w) as f64 / (n.saturating_sub(w)).max(1) as f64).min(1.0);
        let f = self.final_lr_frac;
        self.peak_lr * (f + (1.0 - f) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos()))
    }
}
