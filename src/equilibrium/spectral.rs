//! Spectral radius of the trained map's Jacobian `∂φ/∂z` at its fixed point, the quantity that
//! decides whether (and how fast) Picard iteration contracts: `ρ < 1` is the local contraction
//! condition, and Picard's error shrinks by about `ρ` per iteration.
//!
//! The Jacobian is never formed: [`power_iteration_radius`] runs power iteration on
//! central-difference Jacobian-vector products `J·v ≈ (f(z + εv) − f(z − εv)) / 2ε` and
//! estimates `ρ ≈ ‖Jᵏ v‖^{1/k}` as the geometric mean of the per-step growth over the second
//! half of the iterations, which also converges for a complex dominant pair (where the
//! per-step ratio oscillates). On whole sequences the Jacobian is block lower triangular
//! (causal attention), so its spectrum is the union of the per-position diagonal blocks'.

use ndarray::{Array3, ArrayView3};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};
use crate::model::dense_pass::{embed, run_dense_layers};
use crate::model::{ModelConfig, ModelWeights};
use crate::solver::{SolverConfig, StopCriteria};

use super::config::ElmConfig;
use super::infer::solve_sequences;
use super::module::ElmModule;

/// Settings of [`power_iteration_radius`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerIteration {
    /// Jacobian-vector products (each two map evaluations).
    pub iterations: usize,
    /// Step of the central difference, relative to `‖z‖_RMS` (per entry).
    pub rel_step: f64,
    /// Seed of the random start vector.
    pub seed: u64,
}

impl Default for PowerIteration {
    fn default() -> Self {
        PowerIteration {
            iterations: 30,
            rel_step: 1e-2,
            seed: 0,
        }
    }
}

fn norm(a: &Array3<f32>) -> f64 {
    a.iter()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt()
}

/// Spectral radius of the Jacobian of `f` at `z` (see the module doc). `f` maps a state of
/// `z`'s shape to one of the same shape.
pub fn power_iteration_radius(
    f: impl Fn(&Array3<f32>) -> Result<Array3<f32>>,
    z: &Array3<f32>,
    cfg: &PowerIteration,
) -> Result<f64> {
    // A difference of two maps `rel_step` (1%) of the state either side: bf16's rounding of
    // the inputs (0.4% relative) would be a large part of it, so the maps run in f32 whatever
    // the process's precision.
    crate::gemm::with_f32_products(|| power_iteration_in_f32(f, z, cfg))
}

fn power_iteration_in_f32(
    f: impl Fn(&Array3<f32>) -> Result<Array3<f32>>,
    z: &Array3<f32>,
    cfg: &PowerIteration,
) -> Result<f64> {
    if cfg.iterations < 2 {
        return Err(ElmError::config("iterations", "must be >= 2"));
    }
    if !(cfg.rel_step.is_finite() && cfg.rel_step > 0.0) {
        return Err(ElmError::config("rel_step", "must be finite and > 0"));
    }
    let n = z.len().max(1) as f64;
    let rms = (norm(z) / n.sqrt()).max(1e-6);
    // Perturbation of RMS size rel_step·rms per entry: ‖εv‖ = rel_step·rms·√n with ‖v‖ = 1.
    let eps = cfg.rel_step * rms * n.sqrt();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut v = z.mapv(|_| rng.gen::<f32>() - 0.5);
    let mut logs = Vec::with_capacity(cfg.iterations);
    for _ in 0..cfg.iterations {
        let nv = norm(&v);
        if !(nv.is_finite() && nv > 0.0) {
            return Err(ElmError::NonFinite("power iteration vector".into()));
        }
        v.mapv_inplace(|x| (x as f64 / nv) as f32);
        let plus = z + &v.mapv(|x| (x as f64 * eps) as f32);
        let minus = z - &v.mapv(|x| (x as f64 * eps) as f32);
        let (fp, fm) = (f(&plus)?, f(&minus)?);
        if fp.dim() != z.dim() || fm.dim() != z.dim() {
            return Err(ElmError::shape(
                "power_iteration_radius",
                format!("map returned {:?} for a state of {:?}", fp.dim(), z.dim()),
            ));
        }
        let jv = (&fp - &fm).mapv(|x| (x as f64 / (2.0 * eps)) as f32);
        let growth = norm(&jv);
        if !growth.is_finite() {
            return Err(ElmError::NonFinite("Jacobian-vector product".into()));
        }
        if growth == 0.0 {
            return Ok(0.0);
        }
        logs.push(growth.ln());
        v = jv;
    }
    let tail = &logs[logs.len() / 2..];
    Ok((tail.iter().sum::<f64>() / tail.len() as f64).exp())
}

/// ρ(∂φ/∂z) of `module` at a fixed point `z_star` of whole sequences `h` `[B, T, C]` (from
/// [`solve_sequences`], or any solve the caller already ran), and that point's residual
/// `‖φ(z*) − z*‖ / ‖z*‖`, so a caller can tell a radius at a poorly converged point.
pub fn spectral_radius_at(
    module: &ElmModule,
    cfg: &ModelConfig,
    h: ArrayView3<f32>,
    z_star: &Array3<f32>,
    power: &PowerIteration,
) -> Result<(f64, f64)> {
    let map = |x: &Array3<f32>| module.apply(cfg, x.view(), h);
    let fz = map(z_star)?;
    let rel_residual = norm(&(&fz - z_star)) / norm(z_star).max(1e-30);
    Ok((power_iteration_radius(map, z_star, power)?, rel_residual))
}

/// ρ(∂φ/∂z) at z* over a set of sequences (what `elm spectral` reports).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpectralReport {
    /// Sequences measured.
    pub n: usize,
    pub mean_radius: f64,
    pub min_radius: f64,
    pub max_radius: f64,
    /// One radius per sequence, in order.
    pub radii: Vec<f64>,
    /// Largest `‖φ(z*) − z*‖ / ‖z*‖` of the solves the radii were taken at.
    pub max_rel_residual: f64,
    /// Solver and relative tolerance of those solves.
    pub solver: String,
    pub tol: f64,
    pub power: PowerIteration,
}

/// [`spectral_radius_at`] the solved fixed point of each of `sequences` (token ids, one sequence at a time):
/// the dense layers before the module give `h`, the module's fixed point is solved by `solver`
/// to relative tolerance `tol` within `max_iter` evaluations.
#[allow(clippy::too_many_arguments)]
pub fn sequences_spectral_radius(
    dense: &ModelWeights,
    ec: &ElmConfig,
    module: &ElmModule,
    sequences: &[Vec<u32>],
    solver: &SolverConfig,
    tol: f64,
    max_iter: usize,
    power: &PowerIteration,
) -> Result<SpectralReport> {
    if sequences.is_empty() {
        return Err(ElmError::config("limit", "no sequence to measure"));
    }
    let stop = StopCriteria::relative(tol, max_iter);
    stop.validate()?;
    let (mut radii, mut residuals) = (vec![], vec![]);
    for tokens in sequences {
        // [1, T, C]
        let x = embed(dense, std::slice::from_ref(tokens))?;
        let h = run_dense_layers(dense, x, 0..ec.start_layer)?;
        let z_star = solve_sequences(ec, module, &dense.config, h.view(), solver, &stop)?;
        let (rho, res) = spectral_radius_at(module, &dense.config, h.view(), &z_star, power)?;
        radii.push(rho);
        residuals.push(res);
    }
    let fold = |f: fn(f64, f64) -> f64, v: &[f64]| v.iter().copied().reduce(f).unwrap_or(f64::NAN);
    Ok(SpectralReport {
        n: radii.len(),
        mean_radius: radii.iter().sum::<f64>() / radii.len() as f64,
        min_radius: fold(f64::min, &radii),
        max_radius: fold(f64::max, &radii),
        max_rel_residual: fold(f64::max, &residuals),
        radii,
        solver: solver.name().to_string(),
        tol,
        power: power.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array3;

    /// A linear map with a known spectrum: entries scaled by `d` (real eigenvalues) and, on the
    /// first two entries, a rotation by 1 rad scaled by `r` (eigenvalues `r·e^{±i}`).
    fn linear(d: &Array3<f32>, r: f32) -> impl Fn(&Array3<f32>) -> Result<Array3<f32>> + '_ {
        move |x: &Array3<f32>| {
            let mut y = x * d;
            let (a, b) = (x[[0, 0, 0]], x[[0, 0, 1]]);
            let (c, s) = (1f32.cos(), 1f32.sin());
            y[[0, 0, 0]] = r * (c * a - s * b);
            y[[0, 0, 1]] = r * (s * a + c * b);
            Ok(y)
        }
    }

    #[test]
    fn real_dominant_eigenvalue_is_found() {
        // Eigenvalues spread over [-0.7, 0.5]; the largest modulus is 0.7 (negative).
        let d = Array3::from_shape_fn((1, 4, 8), |(_, t, c)| {
            if (t, c) == (2, 3) {
                -0.7
            } else {
                0.5 * ((t * 8 + c) as f32 / 32.0)
            }
        });
        let z = Array3::from_elem((1, 4, 8), 1.0f32);
        let cfg = PowerIteration {
            iterations: 120,
            ..PowerIteration::default()
        };
        let rho = power_iteration_radius(linear(&d, 0.0), &z, &cfg).unwrap();
        assert!((rho - 0.7).abs() < 0.01, "rho = {rho}");
    }

    #[test]
    fn complex_dominant_pair_is_found() {
        let d = Array3::from_elem((1, 4, 8), 0.3f32);
        let z = Array3::from_elem((1, 4, 8), 2.0f32);
        let cfg = PowerIteration {
            iterations: 200,
            ..PowerIteration::default()
        };
        let rho = power_iteration_radius(linear(&d, 0.9), &z, &cfg).unwrap();
        assert!((rho - 0.9).abs() < 0.01, "rho = {rho}");
    }

    #[test]
    fn nonlinear_map_uses_the_jacobian_at_z() {
        // f(x) = 0.5·x² entrywise: J = diag(x), so at z (max entry 1.6) ρ = 1.6.
        let z = Array3::from_shape_fn((1, 3, 4), |(_, t, c)| {
            0.2 + 0.1 * (t * 4 + c) as f32 + if (t, c) == (2, 3) { 0.3 } else { 0.0 }
        });
        let expected = z.iter().cloned().fold(0.0f32, f32::max) as f64;
        let cfg = PowerIteration {
            iterations: 300,
            rel_step: 1e-3,
            seed: 1,
        };
        let rho = power_iteration_radius(|x| Ok(x.mapv(|v| 0.5 * v * v)), &z, &cfg).unwrap();
        assert!(
            (rho - expected).abs() < 0.01 * expected,
            "rho = {rho}, expected {expected}"
        );
    }

    #[test]
    fn bad_settings_are_typed_errors() {
        let z = Array3::from_elem((1, 1, 2), 1.0f32);
        let cfg = PowerIteration {
            iterations: 1,
            ..PowerIteration::default()
        };
        assert!(power_iteration_radius(|x| Ok(x.clone()), &z, &cfg).is_err());
    }
}
