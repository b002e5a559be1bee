//! Spectral normalisation of a linear map inside an implicit layer (Miyato et al. 2018, as
//! TorchDEQ applies it to DEQ weights): `W_sn = c · W / σ̂(W)`, so `‖W_sn‖₂ ≈ c` and a layer
//! `f(z) = act(W_sn z + …)` with a 1-Lipschitz activation contracts in `z` for `c < 1`.
//!
//! `σ̂ = uᵀ W v` comes from power iteration whose vectors `u`, `v` are kept across training
//! steps, so one iteration per step tracks σ as `W` drifts. On the tape `σ̂` is differentiable
//! in `W` (with `u`, `v` held fixed, Miyato's estimator), so the gradient sees the
//! normalisation.

use ndarray::{Array1, Array2, ArrayD, Ix2};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// Settings of spectral normalisation for a layer's linear maps (e.g. `"spectral_norm":
/// {"target": 0.9}` in an ELM training config).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpectralNormConfig {
    /// `c`: every normalised matrix has spectral norm `c` (or `c` times its starting spectral
    /// norm, when `relative`).
    pub target: f64,
    /// Power iterations per training step (1 tracks σ once warm; the start is warmed up).
    #[serde(default = "one")]
    pub iterations: usize,
    /// Hold each matrix at `target × σ(W₀)` of its own start instead of one absolute norm: for
    /// a layer initialised from a pretrained one, whose matrices' norms differ by orders of
    /// magnitude.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub relative: bool,
}

fn one() -> usize {
    1
}

/// Most power iterations that warm a fresh state up before its first use (it stops earlier
/// once σ̂ changes by less than 1e-9 relative between iterations).
const WARMUP_ITERATIONS: usize = 1000;

/// Refuses a target norm that is not finite and positive, naming the field.
fn check_target(target: f64) -> Result<()> {
    if !(target.is_finite() && target > 0.0) {
        return Err(ElmError::config(
            "spectral_norm.target",
            format!("{target}: must be finite and > 0"),
        ));
    }
    Ok(())
}

impl SpectralNormConfig {
    /// Refuses a target that is not finite and positive and an iteration count of 0 or above
    /// the iteration cap, naming the field.
    pub fn validate(&self) -> Result<()> {
        check_target(self.target)?;
        crate::limits::check_max_iter("spectral_norm.iterations", self.iterations)
    }
}

/// `σ̂` when it can divide a matrix: finite and positive (a zero or non-finite matrix is not).
fn usable_sigma(sigma: f64) -> Result<f64> {
    if !sigma.is_finite() || sigma <= 0.0 {
        return Err(ElmError::NonFinite(format!(
            "spectral_norm: σ̂ = {sigma} (a zero or non-finite matrix)"
        )));
    }
    Ok(sigma)
}

/// The power-iteration state of one `[N, K]` matrix.
#[derive(Clone, Debug)]
pub struct SpectralNorm {
    /// `[N]` left and `[K]` right singular-vector estimates.
    u: Array1<f64>,
    v: Array1<f64>,
    /// `c`: the spectral norm `W_sn` is scaled to.
    pub target: f64,
    /// Power iterations per [`SpectralNorm::apply`] (1 is the usual choice once warm).
    pub iterations: usize,
    sigma: Option<f64>,
}

impl SpectralNorm {
    /// State for an `[rows, cols]` matrix, random unit start vectors from `seed`.
    pub fn new(rows: usize, cols: usize, target: f64, seed: u64) -> Result<Self> {
        if rows == 0 || cols == 0 {
            return Err(ElmError::shape("spectral_norm", "empty matrix"));
        }
        check_target(target)?;
        let mut rng = StdRng::seed_from_u64(seed);
        let unit = |n: usize, rng: &mut StdRng| {
            let a: Array1<f64> = Array1::from_shape_fn(n, |_| rng.gen_range(-1.0..1.0));
            let norm = a.dot(&a).sqrt().max(1e-30);
            a / norm
        };
        Ok(SpectralNorm {
            u: unit(rows, &mut rng),
            v: unit(cols, &mut rng),
            target,
            iterations: 1,
            sigma: None,
        })
    }

    /// The last estimate `σ̂ = uᵀ W v`.
    pub fn sigma(&self) -> Option<f64> {
        self.sigma
    }

    /// `w` as the `[N, K]` matrix this state is for, or a shape error.
    fn matrix<'w, T: AdFloat>(&self, w: &'w ArrayD<T>) -> Result<ndarray::ArrayView2<'w, T>> {
        let w = w
            .view()
            .into_dimensionality::<Ix2>()
            .map_err(|e| ElmError::shape("spectral_norm", e.to_string()))?;
        if w.dim() != (self.u.len(), self.v.len()) {
            return Err(ElmError::shape(
                "spectral_norm",
                format!(
                    "W {:?} for a state of [{}, {}]",
                    w.dim(),
                    self.u.len(),
                    self.v.len()
                ),
            ));
        }
        Ok(w)
    }

    /// `iterations` power-iteration steps on the value of `w` (`v ← Wᵀu/‖·‖`, `u ← Wv/‖·‖`);
    /// returns `σ̂ = uᵀ W v`.
    pub fn update<T: AdFloat>(&mut self, w: &ArrayD<T>) -> Result<f64> {
        let w = self.matrix(w)?;
        let w: Array2<f64> = w.mapv(|x| x.to_f64().unwrap_or(f64::NAN));
        for _ in 0..self.iterations {
            let v = w.t().dot(&self.u);
            self.v = &v / v.dot(&v).sqrt().max(1e-30);
            let u = w.dot(&self.v);
            self.u = &u / u.dot(&u).sqrt().max(1e-30);
        }
        let sigma = usable_sigma(self.u.dot(&w.dot(&self.v)))?;
        self.sigma = Some(sigma);
        Ok(sigma)
    }

    /// `target · W / σ̂(W)` on the tape after one [`SpectralNorm::update`] on `w`'s value; `σ̂`
    /// is `Σ W ⊙ (u vᵀ)` with `u`, `v` constants, so gradients flow through it.
    pub fn apply<T: AdFloat>(&mut self, tape: &mut Tape<T>, w: Var) -> Result<Var> {
        let value = tape.value(w).clone();
        self.update(&value)?;
        self.normalise(tape, w)
    }

    /// The state of the given vectors (a saved run's), refusing non-finite or empty ones.
    pub fn from_vectors(
        u: Array1<f64>,
        v: Array1<f64>,
        target: f64,
        iterations: usize,
    ) -> Result<Self> {
        if u.is_empty() || v.is_empty() || u.iter().chain(v.iter()).any(|x| !x.is_finite()) {
            return Err(ElmError::config(
                "spectral_norm",
                "singular-vector estimates must be non-empty and finite",
            ));
        }
        check_target(target)?;
        Ok(SpectralNorm {
            u,
            v,
            target,
            iterations,
            sigma: None,
        })
    }

    /// The left and right singular-vector estimates `(u, v)`.
    pub fn vectors(&self) -> (&Array1<f64>, &Array1<f64>) {
        (&self.u, &self.v)
    }

    /// `target · W / σ̂(W)` on the tape with the current `u`, `v` (no power iteration: the state
    /// is not changed, so a step can be replayed or probed).
    pub fn normalise<T: AdFloat>(&self, tape: &mut Tape<T>, w: Var) -> Result<Var> {
        let uv = Array2::from_shape_fn((self.u.len(), self.v.len()), |(i, j)| {
            T::of(self.u[i] * self.v[j])
        });
        let uvv = tape.constant(uv.into_dyn());
        let prod = tape.mul(w, uvv)?;
        let sigma = tape.sum(prod); // [] = uᵀ W v
        let inv = tape.recip(sigma);
        let inv = tape.scale(inv, T::of(self.target));
        tape.mul(w, inv)
    }
}

impl SpectralNorm {
    /// A state for the `[N, K]` matrix `w` under `cfg`, seeded, warmed up by power iteration
    /// until `σ̂` settles, so that it is close to σ from its first use (a random start needs
    /// many iterations where the top singular values are close). With `cfg.relative` its
    /// target is `cfg.target × σ̂(w)`.
    pub fn warm_start(w: &ArrayD<f32>, cfg: &SpectralNormConfig, seed: u64) -> Result<Self> {
        cfg.validate()?;
        if w.ndim() != 2 {
            return Err(ElmError::shape(
                "spectral_norm",
                format!("W of shape {:?} is not a matrix", w.shape()),
            ));
        }
        let mut state = SpectralNorm::new(w.shape()[0], w.shape()[1], cfg.target, seed)?;
        let mut last = state.update(w)?;
        for _ in 1..WARMUP_ITERATIONS {
            let sigma = state.update(w)?;
            let settled = (sigma - last).abs() <= 1e-9 * sigma;
            last = sigma;
            if settled {
                break;
            }
        }
        if cfg.relative {
            state.target = cfg.target * last;
        }
        state.iterations = cfg.iterations;
        Ok(state)
    }

    /// `target · W / σ̂` of a value with the current `u`, `v` (`σ̂ = uᵀ W v` in f64): the matrix
    /// a trained layer uses at inference.
    pub fn normalised_value(&self, w: &ArrayD<f32>) -> Result<ArrayD<f32>> {
        let w2 = self.matrix(w)?;
        let sigma = usable_sigma(
            w2.indexed_iter()
                .map(|((i, j), &x)| self.u[i] * x as f64 * self.v[j])
                .sum(),
        )?;
        let scale = self.target / sigma;
        Ok(w.mapv(|x| (x as f64 * scale) as f32))
    }
}
