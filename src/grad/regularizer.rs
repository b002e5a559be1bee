//! Regularisers for any implicit layer, at (an approximation of) its fixed point.
//!
//! [`jacobian_penalty`] is the Hutchinson estimate of `‖∂f/∂z‖²_F` used by TorchDEQ's Jacobian
//! regularisation: for Gaussian probes `v`, `E‖J v‖² = tr(Jᵀ J) = ‖J‖²_F`. The tape is
//! reverse-mode only (it gives `vᵀ J`, not `J v`, and cannot differentiate a VJP), so `J v` is a
//! central difference of two taped applications of `f`, `(f(z + εv) − f(z − εv)) / 2ε`: exact for
//! a map linear in `z`, `O(ε²)` off otherwise, and differentiable in θ and `x` like any forward
//! pass. Penalising it pushes the map's Jacobian, hence its spectral radius, down.
//!
//! [`fixed_point_correction`] is the fixed-point correction loss of Bai et al. (2022, DEQ
//! optical flow; TorchDEQ's `fc_loss`): the task loss on every differentiable iterate `z_i` of
//! the forward pass, weighted `γ^(n−1−i)` so the last counts most, which gives the early
//! iterates a direct gradient towards the target and makes the map converge in fewer steps.

use ndarray::{ArrayD, IxDyn};
use rand::Rng;
use rand_distr::StandardNormal;

use super::implicit::ImplicitLayer;
use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// Settings of [`fixed_point_correction`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FixedPointCorrection {
    /// Decay `γ ∈ (0, 1]` of the iterates' weights `γ^(n−1−i)`; 0 = off (only the last
    /// iterate's loss, as without the correction).
    pub gamma: f64,
}

impl Default for FixedPointCorrection {
    fn default() -> Self {
        FixedPointCorrection { gamma: 0.0 }
    }
}

impl FixedPointCorrection {
    /// Whether the correction is off: configs then serialise without it.
    pub fn is_off(&self) -> bool {
        self.gamma == 0.0
    }
    /// Checks the range; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if !(self.gamma.is_finite() && (0.0..=1.0).contains(&self.gamma)) {
            return Err(ElmError::config(
                "fixed_point_correction.gamma",
                format!("{}: must be in [0, 1] (0 = off)", self.gamma),
            ));
        }
        Ok(())
    }
}

/// `Σ_i γ^(n−1−i) · loss(z_i) / Σ_i γ^(n−1−i)` over the taped `iterates` (first to last, e.g.
/// [`super::GradReport::taped_iterates`]): a weighted mean, so its scale is the task loss's.
/// With one iterate, or `γ` = 0, it is `loss(z_last)`.
pub fn fixed_point_correction<T: AdFloat>(
    tape: &mut Tape<T>,
    iterates: &[Var],
    cfg: &FixedPointCorrection,
    mut loss: impl FnMut(&mut Tape<T>, Var) -> Result<Var>,
) -> Result<Var> {
    cfg.validate()?;
    let Some((&last, _)) = iterates.split_last() else {
        return Err(ElmError::InvalidArgument(
            "fixed_point_correction: no taped iterates (the rule put none on the tape)".into(),
        ));
    };
    if cfg.is_off() || iterates.len() == 1 {
        return loss(tape, last);
    }
    let n = iterates.len();
    let weights: Vec<f64> = (0..n).map(|i| cfg.gamma.powi((n - 1 - i) as i32)).collect();
    let total: f64 = weights.iter().sum();
    let mut sum: Option<Var> = None;
    for (&z, w) in iterates.iter().zip(&weights) {
        let l = loss(tape, z)?;
        let term = tape.scale(l, T::of(w / total));
        sum = Some(match sum {
            Some(acc) => tape.add(acc, term)?,
            None => term,
        });
    }
    Ok(sum.expect("n >= 2 terms"))
}

/// Settings of [`jacobian_penalty`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JacobianPenalty {
    /// Weight of the penalty in the training loss (0: off).
    pub weight: f64,
    /// Gaussian probe vectors per step (each costs two taped applications of `f`).
    pub probes: usize,
    /// Central-difference step, relative to the root mean square of `z` per row.
    pub rel_step: f64,
}

impl Default for JacobianPenalty {
    fn default() -> Self {
        JacobianPenalty {
            weight: 0.0,
            probes: 1,
            rel_step: 1e-2,
        }
    }
}

impl JacobianPenalty {
    /// Whether the penalty is off (weight 0): configs then serialise without it.
    pub fn is_off(&self) -> bool {
        self.weight == 0.0
    }
    /// Checks value ranges; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if !(self.weight.is_finite() && self.weight >= 0.0) {
            return Err(ElmError::config(
                "jacobian_penalty.weight",
                format!("{}: must be finite and >= 0", self.weight),
            ));
        }
        if self.probes == 0 || self.probes > 64 {
            return Err(ElmError::config(
                "jacobian_penalty.probes",
                format!("{}: must be in 1..=64", self.probes),
            ));
        }
        if !(self.rel_step.is_finite() && self.rel_step > 0.0 && self.rel_step <= 1.0) {
            return Err(ElmError::config(
                "jacobian_penalty.rel_step",
                format!("{}: must be in (0, 1]", self.rel_step),
            ));
        }
        Ok(())
    }
}

/// The Hutchinson estimate of `‖∂f/∂z‖²_F / D` at the (detached) state `z` `[B, ...]`, averaged
/// over the batch rows and `cfg.probes` Gaussian probes (`D` = elements per row, TorchDEQ's
/// normalisation), as a scalar on the tape differentiable in `params` and `x`.
pub fn jacobian_penalty<T: AdFloat, L: ImplicitLayer<T>>(
    tape: &mut Tape<T>,
    layer: &L,
    z: &ArrayD<T>,
    x: Var,
    params: &L::Params,
    cfg: &JacobianPenalty,
    rng: &mut impl Rng,
) -> Result<Var> {
    cfg.validate()?;
    let shape = z.shape().to_vec();
    let b = shape.first().copied().unwrap_or(0);
    if b == 0 || z.is_empty() {
        return Err(ElmError::shape("jacobian_penalty", "empty state"));
    }
    let d = z.len() / b;
    // Per-row step ε_r = rel_step · RMS(z_r) (a zero row gets rel_step itself).
    let steps: Vec<T> = z
        .as_standard_layout()
        .into_shape_with_order((b, d))
        .map_err(|e| ElmError::shape("jacobian_penalty", e.to_string()))?
        .rows()
        .into_iter()
        .map(|r| {
            let rms = (r.iter().map(|v| *v * *v).sum::<T>() / T::of(d as f64)).sqrt();
            T::of(cfg.rel_step) * if rms > T::zero() { rms } else { T::one() }
        })
        .collect();
    let mut total: Option<Var> = None;
    for _ in 0..cfg.probes {
        let v = ArrayD::<T>::from_shape_fn(IxDyn(&shape), |_| {
            T::of(rng.sample::<f64, _>(StandardNormal))
        });
        // ε_r · v and its reciprocal scale 1 / (2 ε_r), per row.
        let mut delta = v.clone();
        let mut inv = ArrayD::<T>::zeros(IxDyn(&shape));
        for (r, (mut dr, mut ir)) in delta.outer_iter_mut().zip(inv.outer_iter_mut()).enumerate() {
            dr.mapv_inplace(|x| x * steps[r]);
            ir.fill(T::one() / (T::of(2.0) * steps[r]));
        }
        let plus = tape.constant(z + &delta);
        let minus = tape.constant(z - &delta);
        let fp = layer.forward(tape, plus, x, params)?;
        let fm = layer.forward(tape, minus, x, params)?;
        let diff = tape.sub(fp, fm)?;
        let invv = tape.constant(inv);
        let jv = tape.mul(diff, invv)?; // ≈ J v, [B, ...]
        let sq = tape.sum_squares(jv);
        total = Some(match total {
            None => sq,
            Some(t) => tape.add(t, sq)?,
        });
    }
    let total = total.expect("probes >= 1");
    Ok(tape.scale(total, T::of(1.0 / (cfg.probes * b * d) as f64)))
}
