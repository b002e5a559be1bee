//! Canonical fixed-point problems with known answers, used by tests, benches and `elm solve`.
//! All random data is seeded (`StdRng::seed_from_u64`).
//!
//! | problem | map | D × B | exact solution |
//! |---|---|---|---|
//! | [`LinearProblem`] | `z = A z + b`, `A = Q diag(λ) Qᵀ`, λ = linspace(−ρ, ρ) | 100 × 1 | `Q diag(1/(1 − λ)) Qᵀ b` |
//! | [`TanhProblem`] | `z = tanh(W z + U x + b)`, `‖W‖₂ = 0.95` | 200 × 64 | none; error ≤ residual / (1 − 0.95) |
//! | [`CosProblem`] | `z = cos z` | 1 × 1 | Dottie number 0.739085133215160641… |
//! | [`PoissonJacobi`] | Jacobi sweep for `−Δu = 1` on a 50×50 grid | 2500 × 1 | discrete sine transform |

use ndarray::{linalg::general_mat_mul, s, Array1, Array2, ArrayView2, ArrayViewMut2, Axis};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use super::{FixedPointMap, SolverFloat};
use crate::error::{MapError, Result, SolverError};
use crate::kinds::builtin_kinds;
use crate::linalg::{apply_eigen, householder_q, largest_singular_value};

/// The fixed point of `cos`, `z = cos z` (Dottie number), to f64 precision.
pub const DOTTIE: f64 = 0.739_085_133_215_160_7;

fn gaussian<T: SolverFloat>(rng: &mut StdRng, shape: (usize, usize), scale: f64) -> Array2<T> {
    Array2::from_shape_simple_fn(shape, || {
        let x: f64 = StandardNormal.sample(rng);
        T::from(x * scale).unwrap()
    })
}

/// `out[b] = W z[b] + c[b]` for active rows: one GEMM when every row of a batch of ≥ 8 is
/// active, else GEMVs on the active rows only. z, out, c: `[B, D]`, w: `[D, D]`.
fn affine_rows<T: SolverFloat>(
    z: ArrayView2<T>,
    w: &Array2<T>,
    c: &Array2<T>,
    active: &[bool],
    mut out: ArrayViewMut2<T>,
) {
    // GEMM packs all of W per call, which dominates for a handful of rows: use GEMV there.
    if active.len() >= 8 && active.iter().all(|&a| a) {
        out.assign(c);
        general_mat_mul(T::one(), &z, &w.t(), T::one(), &mut out);
    } else {
        for (b, _) in active.iter().enumerate().filter(|(_, &a)| a) {
            let mut o = out.row_mut(b);
            o.assign(&c.row(b));
            ndarray::linalg::general_mat_vec_mul(T::one(), w, &z.row(b), T::one(), &mut o);
        }
    }
}

fn check_shape(what: &str, z: &ArrayView2<impl Sized>, batch: usize, dim: usize) -> Result<()> {
    if z.dim() != (batch, dim) {
        return Err(SolverError::shape(
            what,
            format!("expected z [{batch}, {dim}], got {:?}", z.dim()),
        ));
    }
    Ok(())
}

/// `z = A z + b` with symmetric `A` of spectral radius (= ‖A‖₂) exactly `rho`.
pub struct LinearProblem {
    /// `[n, n]`.
    pub a: Array2<f64>,
    /// `[B, n]`, one right-hand side per row.
    pub b: Array2<f64>,
    /// `[B, n]`, `(I − A)⁻¹ b` per row.
    pub exact: Array2<f64>,
    pub rho: f64,
}

impl LinearProblem {
    /// `A = Q diag(linspace(−ρ, ρ, n)) Qᵀ` with `Q` the orthogonal factor of a Gaussian matrix.
    pub fn new(n: usize, rho: f64, batch: usize, seed: u64) -> Result<Self> {
        if n < 2 || batch == 0 {
            return Err(SolverError::InvalidArgument(format!(
                "linear problem needs n >= 2 and batch >= 1, got n={n}, batch={batch}"
            )));
        }
        if !(rho.is_finite() && rho >= 0.0) {
            return Err(SolverError::config(
                "rho",
                format!("must be finite and >= 0, got {rho}"),
            ));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let g: Array2<f64> = gaussian(&mut rng, (n, n), 1.0);
        let q = householder_q(&g);
        let lambdas = Array1::linspace(-rho, rho, n);
        if lambdas.iter().any(|l| (1.0 - l).abs() < 1e-9) {
            return Err(SolverError::config(
                "rho",
                "I − A would be singular (eigenvalue 1)",
            ));
        }
        let a = (&q * &lambdas).dot(&q.t());
        let b: Array2<f64> = gaussian(&mut rng, (batch, n), 1.0);
        // (I − A)⁻¹ = Q diag(1/(1 − λ)) Qᵀ: exact up to rounding, no factorisation needed.
        let exact = apply_eigen(&q, &lambdas.mapv(|l| 1.0 / (1.0 - l)), &b);
        Ok(LinearProblem { a, b, exact, rho })
    }
    /// The canonical instance: n = 100, one row.
    pub fn canonical(rho: f64, seed: u64) -> Result<Self> {
        Self::new(100, rho, 1, seed)
    }
}

impl FixedPointMap<f64> for LinearProblem {
    fn dim(&self) -> usize {
        self.a.nrows()
    }
    fn eval(
        &mut self,
        z: ArrayView2<f64>,
        active: &[bool],
        out: ArrayViewMut2<f64>,
    ) -> Result<(), MapError> {
        check_shape("linear problem", &z, self.b.nrows(), self.a.nrows())?;
        affine_rows(z, &self.a, &self.b, active, out);
        Ok(())
    }
}

/// `z = tanh(W z + U x + b)` batched over inputs `x`; `‖W‖₂ = w_norm < 1` makes it a contraction.
pub struct TanhProblem<T> {
    /// `[n, n]`.
    pub w: Array2<T>,
    /// `[B, n]`: `U x_b + b` per row.
    pub injection: Array2<T>,
    pub w_norm: f64,
}

impl<T: SolverFloat> TanhProblem<T> {
    /// Random instance: `W` Gaussian rescaled to spectral norm `w_norm`, `U ~ N(0, 1/nx)`,
    /// `x ~ N(0, 1)`, `b ~ N(0, 0.01)`.
    pub fn new(n: usize, nx: usize, batch: usize, w_norm: f64, seed: u64) -> Result<Self> {
        if n == 0 || nx == 0 || batch == 0 {
            return Err(SolverError::InvalidArgument(format!(
                "tanh problem needs n, nx, batch >= 1, got {n}, {nx}, {batch}"
            )));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let g: Array2<f64> = gaussian(&mut rng, (n, n), 1.0);
        let sigma_max = largest_singular_value(&g, 100_000);
        let w64 = g * (w_norm / sigma_max);
        let u: Array2<f64> = gaussian(&mut rng, (n, nx), 1.0 / (nx as f64).sqrt());
        let bias: Array2<f64> = gaussian(&mut rng, (1, n), 0.1);
        let x: Array2<f64> = gaussian(&mut rng, (batch, nx), 1.0);
        let inj = x.dot(&u.t()) + &bias;
        Ok(TanhProblem {
            w: w64.mapv(|v| T::from(v).unwrap()),
            injection: inj.mapv(|v| T::from(v).unwrap()),
            w_norm,
        })
    }
    /// The canonical instance: n = 200, 64 inputs of width 32, ‖W‖₂ = 0.95.
    pub fn canonical(seed: u64) -> Result<Self> {
        Self::new(200, 32, 64, 0.95, seed)
    }
    pub fn batch(&self) -> usize {
        self.injection.nrows()
    }
}

impl<T: SolverFloat> FixedPointMap<T> for TanhProblem<T> {
    fn dim(&self) -> usize {
        self.w.nrows()
    }
    fn eval(
        &mut self,
        z: ArrayView2<T>,
        active: &[bool],
        mut out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        check_shape("tanh problem", &z, self.injection.nrows(), self.w.nrows())?;
        affine_rows(z, &self.w, &self.injection, active, out.view_mut());
        for (b, mut row) in out.axis_iter_mut(Axis(0)).enumerate() {
            if active[b] {
                row.mapv_inplace(|v| v.tanh());
            }
        }
        Ok(())
    }
}

/// Scalar `z = cos z`; the map is applied to every row independently.
pub struct CosProblem;

impl<T: SolverFloat> FixedPointMap<T> for CosProblem {
    fn dim(&self) -> usize {
        1
    }
    fn eval(
        &mut self,
        z: ArrayView2<T>,
        active: &[bool],
        mut out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        for (b, &a) in active.iter().enumerate() {
            if a {
                out[[b, 0]] = z[[b, 0]].cos();
            }
        }
        Ok(())
    }
}

/// One Jacobi sweep for `−Δu = f` on the unit square, zero Dirichlet boundary, `n × n` interior
/// grid (h = 1/(n+1)): `u_ij ← (u_{i−1,j} + u_{i+1,j} + u_{i,j−1} + u_{i,j+1} + h² f_ij) / 4`.
/// Its fixed point is the discrete solution; the iteration matrix has spectral radius `cos(π h)`.
pub struct PoissonJacobi {
    pub n: usize,
    /// `[n·n]` source, row-major.
    pub f: Array1<f64>,
    /// `[n·n]` exact discrete solution.
    pub exact: Array1<f64>,
}

impl PoissonJacobi {
    /// `f ≡ 1`; the exact discrete solution comes from the discrete sine transform, which
    /// diagonalises the 5-point Laplacian: eigenvalues `(μ_k + μ_l)/h²`, `μ_k = 4 sin²(πk h/2)`.
    pub fn new(n: usize) -> Result<Self> {
        if n == 0 {
            return Err(SolverError::InvalidArgument(
                "poisson grid needs n >= 1".into(),
            ));
        }
        let np1 = (n + 1) as f64;
        let h = 1.0 / np1;
        let f = Array2::<f64>::ones((n, n));
        let s = Array2::from_shape_fn((n, n), |(i, k)| {
            (std::f64::consts::PI * ((i + 1) * (k + 1)) as f64 / np1).sin()
        });
        let mu: Vec<f64> = (1..=n)
            .map(|k| 4.0 * (std::f64::consts::PI * k as f64 * h / 2.0).sin().powi(2))
            .collect();
        // S S = (n+1)/2 I, so coefficients C = (2/(n+1))² S F S and U = S (C ./ Λ) S.
        let mut c = s.dot(&f).dot(&s) * (2.0 / np1).powi(2);
        for ((k, l), v) in c.indexed_iter_mut() {
            *v /= (mu[k] + mu[l]) / (h * h);
        }
        let u = s.dot(&c).dot(&s);
        Ok(PoissonJacobi {
            n,
            f: f.into_shape_with_order(n * n).unwrap(),
            exact: u.into_shape_with_order(n * n).unwrap(),
        })
    }
    /// The canonical instance: 50 × 50 interior grid.
    pub fn canonical() -> Result<Self> {
        Self::new(50)
    }
    /// Spectral radius of the Jacobi iteration matrix, `cos(π h)`.
    pub fn jacobi_spectral_radius(&self) -> f64 {
        (std::f64::consts::PI / (self.n + 1) as f64).cos()
    }
    /// `−Δ_h u` on the interior (zero boundary), `[n·n]`. Used to check solutions independently.
    pub fn neg_laplacian(&self, u: &Array1<f64>) -> Array1<f64> {
        let n = self.n;
        let h2 = 1.0 / ((n + 1) as f64).powi(2);
        let at = |i: isize, j: isize| -> f64 {
            if i < 0 || j < 0 || i >= n as isize || j >= n as isize {
                0.0
            } else {
                u[i as usize * n + j as usize]
            }
        };
        Array1::from_shape_fn(n * n, |idx| {
            let (i, j) = ((idx / n) as isize, (idx % n) as isize);
            (4.0 * at(i, j) - at(i - 1, j) - at(i + 1, j) - at(i, j - 1) - at(i, j + 1)) / h2
        })
    }
}

impl FixedPointMap<f64> for PoissonJacobi {
    fn dim(&self) -> usize {
        self.n * self.n
    }
    fn eval(
        &mut self,
        z: ArrayView2<f64>,
        active: &[bool],
        mut out: ArrayViewMut2<f64>,
    ) -> Result<(), MapError> {
        let n = self.n;
        if z.ncols() != n * n {
            return Err(SolverError::shape(
                "poisson jacobi",
                format!("expected z [B, {}], got {:?}", n * n, z.dim()),
            )
            .into());
        }
        let h2 = 1.0 / ((n + 1) as f64).powi(2);
        for (b, &a) in active.iter().enumerate() {
            if !a {
                continue;
            }
            let u = z.row(b);
            let u = u
                .as_slice()
                .ok_or_else(|| SolverError::shape("poisson jacobi", "z rows must be contiguous"))?;
            let mut o = out.row_mut(b);
            for i in 0..n {
                for j in 0..n {
                    let mut s = h2 * self.f[i * n + j];
                    if i > 0 {
                        s += u[(i - 1) * n + j];
                    }
                    if i + 1 < n {
                        s += u[(i + 1) * n + j];
                    }
                    if j > 0 {
                        s += u[i * n + j - 1];
                    }
                    if j + 1 < n {
                        s += u[i * n + j + 1];
                    }
                    o[i * n + j] = 0.25 * s;
                }
            }
        }
        Ok(())
    }
}

builtin_kinds! {
    /// The canonical problems: the one list that [`Problem::by_name`], [`PROBLEM_NAMES`] and
    /// the command line (`elm solve --problem`) read.
    pub enum ProblemKind {
        Linear => "linear",
        Tanh => "tanh",
        Cos => "cos",
        Poisson => "poisson",
    }
    unknown: |name: &str| {
        SolverError::config(
            "problem",
            format!(
                "unknown problem `{name}` (expected {})",
                ProblemKind::NAMES.join("|")
            ),
        )
    };
}

/// The canonical problems' names, in [`ProblemKind::ALL`]'s order.
pub const PROBLEM_NAMES: [&str; ProblemKind::ALL.len()] = ProblemKind::NAMES;

/// A canonical problem chosen by name (CLI, benches).
pub enum Problem {
    Linear(LinearProblem),
    Tanh(TanhProblem<f64>),
    Cos(CosProblem),
    Poisson(PoissonJacobi),
}

impl Problem {
    /// `linear` (uses `rho`), `tanh`, `cos` or `poisson`; `seed` for the random ones.
    pub fn by_name(name: &str, rho: f64, seed: u64) -> Result<Self> {
        Problem::of_kind(name.parse()?, rho, seed)
    }
    /// The canonical problem of `kind` (`rho` for the linear one, `seed` for the random ones).
    pub fn of_kind(kind: ProblemKind, rho: f64, seed: u64) -> Result<Self> {
        Ok(match kind {
            ProblemKind::Linear => Problem::Linear(LinearProblem::canonical(rho, seed)?),
            ProblemKind::Tanh => Problem::Tanh(TanhProblem::canonical(seed)?),
            ProblemKind::Cos => Problem::Cos(CosProblem),
            ProblemKind::Poisson => Problem::Poisson(PoissonJacobi::canonical()?),
        })
    }
    /// Its kind.
    pub fn kind(&self) -> ProblemKind {
        match self {
            Problem::Linear(_) => ProblemKind::Linear,
            Problem::Tanh(_) => ProblemKind::Tanh,
            Problem::Cos(_) => ProblemKind::Cos,
            Problem::Poisson(_) => ProblemKind::Poisson,
        }
    }
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
    /// Rows in the batch.
    pub fn batch(&self) -> usize {
        match self {
            Problem::Linear(p) => p.b.nrows(),
            Problem::Tanh(p) => p.batch(),
            Problem::Cos(_) => 1,
            Problem::Poisson(_) => 1,
        }
    }
    /// Starting point `[B, D]` (zeros).
    pub fn z0(&self) -> Array2<f64> {
        Array2::zeros((self.batch(), self.map_ref_dim()))
    }
    fn map_ref_dim(&self) -> usize {
        match self {
            Problem::Linear(p) => p.a.nrows(),
            Problem::Tanh(p) => p.w.nrows(),
            Problem::Cos(_) => 1,
            Problem::Poisson(p) => p.n * p.n,
        }
    }
    /// Exact solution `[B, D]` when known.
    pub fn exact(&self) -> Option<Array2<f64>> {
        match self {
            Problem::Linear(p) => Some(p.exact.clone()),
            Problem::Tanh(_) => None,
            Problem::Cos(_) => Some(Array2::from_elem((1, 1), DOTTIE)),
            Problem::Poisson(p) => Some(p.exact.clone().insert_axis(Axis(0))),
        }
    }
    /// A Lipschitz constant `L < 1` of the map when known: then `‖z − z*‖ ≤ ‖f(z) − z‖ / (1 − L)`.
    pub fn lipschitz(&self) -> Option<f64> {
        match self {
            Problem::Linear(p) if p.rho < 1.0 => Some(p.rho),
            Problem::Linear(_) => None,
            Problem::Tanh(p) => Some(p.w_norm),
            Problem::Cos(_) => None,
            Problem::Poisson(p) => Some(p.jacobi_spectral_radius()),
        }
    }
    pub fn map(&mut self) -> &mut dyn FixedPointMap<f64> {
        match self {
            Problem::Linear(p) => p,
            Problem::Tanh(p) => p,
            Problem::Cos(p) => p,
            Problem::Poisson(p) => p,
        }
    }
}

/// Max over rows of `‖z_b − exact_b‖₂`. Shapes must match.
pub fn max_row_error(z: ArrayView2<f64>, exact: ArrayView2<f64>) -> f64 {
    (0..z.nrows())
        .map(|b| {
            let d = &z.slice(s![b, ..]) - &exact.slice(s![b, ..]);
            d.dot(&d).sqrt()
        })
        .fold(0.0, f64::max)
}
