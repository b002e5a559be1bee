//! A benchmark of fixed-point problems with standard diagnostics: SciPy's nonlinear test
//! problems written as fixed-point problems, DEQ-shaped layers, and two standard problems of the
//! Anderson-acceleration literature (`scripts/solver-benchmark.sh` runs every solver of ours and
//! SciPy's on each; the Python package exposes them as `elm_solver.BenchmarkProblem`).
//!
//! **Root problems** `F(x) = 0` (SciPy's `scipy/optimize/tests/test_nonlin.py`: `F`, `F2`,
//! `F2_lucky`, `F3`, `F4_powell`, `F5` (the pressure network of `test_minpack.py`), `F6`, each
//! from its `xin`) become `x = g(x)` with
//!
//! `g(x) = x + α F(x)`,  `α = 0.5 · max(‖x₀‖₂, 1) / ‖F(x₀)‖₂` (1 when `F(x₀) = 0`):
//!
//! the sign and the step are those of SciPy's own initial Jacobian guess `J ≈ −1/α` with its
//! default `α` (`scipy.optimize._nonlin.GenericBroyden.setup`), so Picard on `g` is SciPy's
//! `linearmixing` step for step, and a row stops on `‖g(x) − x‖₂ = α‖F(x)‖₂`.
//!
//! **DEQ-shaped problems** are [`TanhProblem`]s (`z = tanh(W z + U x + b)`, `‖W‖₂ = ρ`,
//! D = 64, 64 inputs of width 16) at ρ ∈ {0.5, 0.9, 0.99}: `g` is the layer itself (α = 1,
//! `F(z) = g(z) − z`).
//!
//! **The Chandrasekhar H-equation** (radiative transfer; the H-equation test of Anderson
//! acceleration in C. T. Kelley's *Solving Nonlinear Equations with Iterative Methods*, SIAM
//! 2022, ch. 4),
//!
//! `H(μ) = 1 / (1 − (c/2) ∫₀¹ μ H(ν) / (μ + ν) dν)`,
//!
//! on the composite midpoint rule with N = 500 nodes `μᵢ = (i − ½)/N`:
//! `G(H)ᵢ = 1 / (1 − (c/2N) Σⱼ μᵢ Hⱼ / (μᵢ + μⱼ))`, from `H = 1`, at c ∈ {0.5, 0.99, 0.9999}.
//! The statement is read from Kelley's `ctkelley/SIAMFANLEquations.jl` (`HeqFix!` and `heqinit`
//! in `src/TestProblems/Systems/Hequation.jl`: the fixed-point map, the midpoint nodes, and
//! Kelley's `F(H) = H − G(H)`; `test/Chapter4/heq_aa.jl` runs Anderson on N = 500, c = 0.99 from
//! `H = 1`; `ctkelley/NotebookSIAMFANL` `src/Chapter4/aa_heq.jl` draws the book's Fig. 4.1 from
//! it). `g` is Kelley's map `G` itself (α = 1, `F(H) = G(H) − H`, SciPy's sign convention).
//! The midpoint solution satisfies `(c/2N) Σᵢ Hᵢ = 1 − √(1 − c)` exactly (multiply the equation
//! by `Hᵢ`, sum, and symmetrise `μᵢ/(μᵢ+μⱼ) + μⱼ/(μᵢ+μⱼ) = 1`), which the tests check.
//!
//! **The one-dimensional Bratu problem** `u'' + λ eᵘ = 0`, `u(0) = u(1) = 0` (statement,
//! analytic solution `u(x) = −2 ln(cosh((x − ½)θ/2) / cosh(θ/4))` with `θ = √(2λ) cosh(θ/4)`
//! and the turning point λc ≈ 3.513830719: Boundary Value Problems 2013:142,
//! doi 10.1186/1687-2770-2013-142, eqs. (1)–(3); the copy read prints `sinh` in (3), where
//! substituting the solution gives `cosh`), on N = 100 interior points (`h = 1/(N+1)`, second
//! differences `T = tridiag(−1, 2, −1)`), in the fixed-point form
//!
//! `g(u) = λ h² T⁻¹ e^u`
//!
//! (Picard on it is the classical monotone iteration from `u = 0` to the lower branch), at λ = 1
//! and λ = 3.5 (close to the fold: `g`'s Jacobian at the solution has spectral radius ≈ 0.91),
//! α = 1, `F(u) = g(u) − u`.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2};

use crate::error::{MapError, Result, SolverError};
use crate::kinds::builtin_kinds;
use crate::problems::TanhProblem;
use crate::FixedPointMap;

/// Quadrature nodes of the H-equation problems.
pub const H_EQUATION_NODES: usize = 500;
/// Interior grid points of the Bratu problems.
pub const BRATU_POINTS: usize = 100;

builtin_kinds! {
    /// The benchmark's problems: the one list that [`BenchmarkProblem::new`], the Python
    /// package and the benchmark script read.
    pub enum BenchmarkKind {
        ScipyF => "scipy-F",
        ScipyF2 => "scipy-F2",
        ScipyF2Lucky => "scipy-F2-lucky",
        ScipyF3 => "scipy-F3",
        ScipyF4Powell => "scipy-F4-powell",
        ScipyF5 => "scipy-F5",
        ScipyF6 => "scipy-F6",
        DeqTanh05 => "deq-tanh-0.5",
        DeqTanh09 => "deq-tanh-0.9",
        DeqTanh099 => "deq-tanh-0.99",
        HEquation05 => "h-equation-0.5",
        HEquation099 => "h-equation-0.99",
        HEquation09999 => "h-equation-0.9999",
        Bratu1 => "bratu-1",
        Bratu35 => "bratu-3.5",
    }
    unknown: |name: &str| {
        SolverError::config(
            "problem",
            format!(
                "unknown benchmark problem `{name}` (expected {})",
                BenchmarkKind::NAMES.join("|")
            ),
        )
    };
}

/// The benchmark's problem names, in [`BenchmarkKind::ALL`]'s order.
pub const BENCHMARK_PROBLEMS: [&str; BenchmarkKind::ALL.len()] = BenchmarkKind::NAMES;

/// What a problem is made of, beyond its kind.
enum Body {
    /// One of SciPy's root problems (`g = x + αF`).
    Scipy,
    /// A DEQ-shaped tanh layer (`g` is the layer).
    Deq(TanhProblem<f64>),
    /// The H-equation with `kernel[i][j] = (c/2N) μᵢ / (μᵢ + μⱼ)` (`g` is Kelley's `G`).
    HEquation { c: f64, kernel: Array2<f64> },
    /// Bratu with `λh²` and the pivots `mᵢ` of `T`'s LU factors (`g(u) = λh² T⁻¹ e^u`).
    Bratu {
        lambda: f64,
        lh2: f64,
        pivots: Vec<f64>,
    },
}

/// One benchmark problem: its root function `F`, its fixed-point map `g = x + αF` (a
/// [`FixedPointMap`]) and its starting point.
pub struct BenchmarkProblem {
    kind: BenchmarkKind,
    alpha: f64,
    x0: Array2<f64>,
    body: Body,
}

/// SciPy's `F` … `F6` at one point (`x` of the problem's width).
fn scipy_root(kind: BenchmarkKind, x: ArrayView1<f64>) -> Array1<f64> {
    match kind {
        BenchmarkKind::ScipyF => {
            let d = [3.0, 2.0, 1.5, 1.0, 0.5];
            let xx = x.dot(&x);
            Array1::from_shape_fn(5, |i| -d[i] * x[i] - 0.01 * xx * x[i])
        }
        BenchmarkKind::ScipyF2 | BenchmarkKind::ScipyF2Lucky => x.to_owned(),
        BenchmarkKind::ScipyF3 => {
            let a = [[-2.0, 1.0, 0.0], [1.0, -2.0, 1.0], [0.0, 1.0, -2.0]];
            let b = [1.0, 2.0, 3.0];
            Array1::from_shape_fn(3, |i| (0..3).map(|j| a[i][j] * x[j]).sum::<f64>() - b[i])
        }
        BenchmarkKind::ScipyF4Powell => {
            let a = 1e4;
            Array1::from(vec![
                a * x[0] * x[1] - 1.0,
                (-x[0]).exp() + (-x[1]).exp() - (1.0 + 1.0 / a),
            ])
        }
        BenchmarkKind::ScipyF5 => {
            // Four parallel pipes, valve coefficients 0.5, total flow 4: P_i = k Q_i²,
            // F = (P_1 − P_0, P_2 − P_0, P_3 − P_0, ΣQ − 4).
            let p = x.mapv(|q| 0.5 * q * q);
            Array1::from(vec![p[1] - p[0], p[2] - p[0], p[3] - p[0], x.sum() - 4.0])
        }
        BenchmarkKind::ScipyF6 => {
            let (x1, x2) = (x[0], x[1]);
            let j0 = [[-4.256, 14.7], [0.839_498_9, 0.599_642_07]];
            let v = [
                (x1 + 3.0) * (x2.powi(5) - 7.0) + 18.0,
                (x2 * x1.exp() - 1.0).sin(),
            ];
            // −J0⁻¹ v by Cramer's rule (a fixed, well-conditioned 2×2).
            let det = j0[0][0] * j0[1][1] - j0[0][1] * j0[1][0];
            Array1::from(vec![
                -(j0[1][1] * v[0] - j0[0][1] * v[1]) / det,
                -(-j0[1][0] * v[0] + j0[0][0] * v[1]) / det,
            ])
        }
        _ => unreachable!("{kind:?} is not one of SciPy's root problems"),
    }
}

fn scipy_x0(kind: BenchmarkKind) -> Vec<f64> {
    match kind {
        BenchmarkKind::ScipyF => vec![1.0; 5],
        BenchmarkKind::ScipyF2 => vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        BenchmarkKind::ScipyF2Lucky => vec![0.0; 6],
        BenchmarkKind::ScipyF3 => vec![1.0, 2.0, 3.0],
        BenchmarkKind::ScipyF4Powell => vec![-1.0, -2.0],
        BenchmarkKind::ScipyF5 => vec![2.0, 0.0, 2.0, 0.0],
        BenchmarkKind::ScipyF6 => vec![-0.5, 1.4],
        _ => unreachable!("{kind:?} is not one of SciPy's root problems"),
    }
}

fn norm(v: ArrayView1<f64>) -> f64 {
    v.dot(&v).sqrt()
}

/// The H-equation's midpoint kernel `(c/2N) μᵢ / (μᵢ + μⱼ)`, `μᵢ = (i − ½)/N`.
fn h_equation_kernel(c: f64, n: usize) -> Array2<f64> {
    let mu = |i: usize| (i as f64 + 0.5) / n as f64;
    let w = c / (2.0 * n as f64);
    Array2::from_shape_fn((n, n), |(i, j)| w * mu(i) / (mu(i) + mu(j)))
}

/// The pivots `mᵢ` of `tridiag(−1, 2, −1) = LU` (`m₀ = 2`, `mᵢ = 2 − 1/mᵢ₋₁`).
fn second_difference_pivots(n: usize) -> Vec<f64> {
    let mut m = Vec::with_capacity(n);
    let mut prev = 0.0f64;
    for i in 0..n {
        let p = if i == 0 { 2.0 } else { 2.0 - 1.0 / prev };
        m.push(p);
        prev = p;
    }
    m
}

impl BenchmarkProblem {
    /// The problem of `kind` (the DEQ layers are seeded: the same problem every time).
    pub fn new(kind: BenchmarkKind) -> Result<Self> {
        let fixed_point = |x0: Array2<f64>, body| {
            Ok(BenchmarkProblem {
                kind,
                alpha: 1.0,
                x0,
                body,
            })
        };
        let deq = |rho: f64| -> Result<Self> {
            let deq = TanhProblem::new(64, 16, 64, rho, 7)?;
            fixed_point(Array2::zeros((64, 64)), Body::Deq(deq))
        };
        let h_equation = |c: f64| {
            let kernel = h_equation_kernel(c, H_EQUATION_NODES);
            fixed_point(
                Array2::ones((1, H_EQUATION_NODES)),
                Body::HEquation { c, kernel },
            )
        };
        let bratu = |lambda: f64| {
            let h = 1.0 / (BRATU_POINTS as f64 + 1.0);
            let body = Body::Bratu {
                lambda,
                lh2: lambda * h * h,
                pivots: second_difference_pivots(BRATU_POINTS),
            };
            fixed_point(Array2::zeros((1, BRATU_POINTS)), body)
        };
        match kind {
            BenchmarkKind::DeqTanh05 => return deq(0.5),
            BenchmarkKind::DeqTanh09 => return deq(0.9),
            BenchmarkKind::DeqTanh099 => return deq(0.99),
            BenchmarkKind::HEquation05 => return h_equation(0.5),
            BenchmarkKind::HEquation099 => return h_equation(0.99),
            BenchmarkKind::HEquation09999 => return h_equation(0.9999),
            BenchmarkKind::Bratu1 => return bratu(1.0),
            BenchmarkKind::Bratu35 => return bratu(3.5),
            BenchmarkKind::ScipyF
            | BenchmarkKind::ScipyF2
            | BenchmarkKind::ScipyF2Lucky
            | BenchmarkKind::ScipyF3
            | BenchmarkKind::ScipyF4Powell
            | BenchmarkKind::ScipyF5
            | BenchmarkKind::ScipyF6 => {}
        }
        let x0 = Array1::from(scipy_x0(kind));
        let f0 = norm(scipy_root(kind, x0.view()).view());
        let alpha = if f0 > 0.0 {
            0.5 * norm(x0.view()).max(1.0) / f0
        } else {
            1.0
        };
        let n = x0.len();
        Ok(BenchmarkProblem {
            kind,
            alpha,
            x0: x0.into_shape_with_order((1, n)).expect("one row"),
            body: Body::Scipy,
        })
    }
    /// The problem named `name` (one of [`BENCHMARK_PROBLEMS`]).
    pub fn by_name(name: &str) -> Result<Self> {
        Self::new(name.parse()?)
    }
    pub fn kind(&self) -> BenchmarkKind {
        self.kind
    }
    /// The step `α` of `g = x + αF`.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }
    /// The starting point `[B, D]`.
    pub fn x0(&self) -> Array2<f64> {
        self.x0.clone()
    }
    /// How the problem is stated, in one line.
    pub fn description(&self) -> String {
        match &self.body {
            Body::Deq(p) => format!(
                "z = tanh(W z + U x + b), ||W||_2 = {}, D = 64, 64 inputs (g is the layer)",
                p.w_norm
            ),
            Body::HEquation { c, .. } => format!(
                "Chandrasekhar H-equation, c = {c}, midpoint rule N = {H_EQUATION_NODES}, \
                 from H = 1 (g is Kelley's map G)"
            ),
            Body::Bratu { lambda, .. } => format!(
                "1-D Bratu u'' + {lambda} e^u = 0, u(0) = u(1) = 0, {BRATU_POINTS} interior \
                 points, from u = 0, g(u) = lambda h^2 T^-1 e^u"
            ),
            Body::Scipy => format!(
                "SciPy test_nonlin {} from xin, g(x) = x + {:.4e} F(x)",
                self.kind.name().trim_start_matches("scipy-"),
                self.alpha
            ),
        }
    }
    /// The fixed-point map of a problem posed as one (DEQ, H-equation, Bratu) at one point.
    fn fixed_point_row(&self, x: ArrayView1<f64>) -> Array1<f64> {
        match &self.body {
            Body::HEquation { kernel, .. } => kernel.dot(&x).mapv(|s| 1.0 / (1.0 - s)),
            Body::Bratu { lh2, pivots, .. } => {
                // T u = λh² e^x by forward elimination and back substitution.
                let n = x.len();
                let mut d = vec![0.0; n];
                for i in 0..n {
                    let carry = if i == 0 { 0.0 } else { d[i - 1] };
                    d[i] = (lh2 * x[i].exp() + carry) / pivots[i];
                }
                let mut u = Array1::zeros(n);
                for i in (0..n).rev() {
                    let next = if i + 1 < n { u[i + 1] } else { 0.0 };
                    u[i] = d[i] + next / pivots[i];
                }
                u
            }
            Body::Scipy | Body::Deq(_) => unreachable!("batched or root-form problem"),
        }
    }
    /// The root function `F` on every row of `x` (`[B, D]`): `g(x) = x + α F(x)`.
    pub fn root(&self, x: ArrayView2<f64>) -> Result<Array2<f64>> {
        if x.ncols() != self.x0.ncols() || x.nrows() != self.x0.nrows() {
            return Err(SolverError::shape(
                "benchmark root",
                format!("x is {:?}, the problem {:?}", x.dim(), self.x0.dim()),
            ));
        }
        Ok(match &self.body {
            Body::Deq(p) => {
                let pre = x.dot(&p.w.t()) + &p.injection;
                pre.mapv(f64::tanh) - x
            }
            body => {
                let mut out = Array2::zeros(x.raw_dim());
                for (mut o, r) in out.rows_mut().into_iter().zip(x.rows()) {
                    match body {
                        Body::Scipy => o.assign(&scipy_root(self.kind, r)),
                        _ => o.assign(&(self.fixed_point_row(r) - r)),
                    }
                }
                out
            }
        })
    }
}

impl FixedPointMap<f64> for BenchmarkProblem {
    fn dim(&self) -> usize {
        self.x0.ncols()
    }
    fn eval(
        &mut self,
        z: ArrayView2<f64>,
        active: &[bool],
        mut out: ArrayViewMut2<f64>,
    ) -> std::result::Result<(), MapError> {
        let f = self.root(z)?;
        for (b, &a) in active.iter().enumerate() {
            if a {
                let g = &z.row(b) + &(&f.row(b) * self.alpha);
                out.row_mut(b).assign(&g);
            }
        }
        Ok(())
    }
}
