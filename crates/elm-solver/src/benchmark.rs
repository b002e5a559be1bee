//! A benchmark of fixed-point problems with standard diagnostics: SciPy's nonlinear test
//! problems written as fixed-point problems, and DEQ-shaped layers (`scripts/solver-benchmark.sh`
//! runs every solver of ours and SciPy's on each; the Python package exposes them as
//! `elm_solver.BenchmarkProblem`).
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

use ndarray::{Array1, Array2, ArrayView1, ArrayView2, ArrayViewMut2};

use crate::error::{MapError, Result, SolverError};
use crate::kinds::builtin_kinds;
use crate::problems::TanhProblem;
use crate::FixedPointMap;

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

/// One benchmark problem: its root function `F`, its fixed-point map `g = x + αF` (a
/// [`FixedPointMap`]) and its starting point.
pub struct BenchmarkProblem {
    kind: BenchmarkKind,
    alpha: f64,
    x0: Array2<f64>,
    deq: Option<TanhProblem<f64>>,
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
        BenchmarkKind::DeqTanh05 | BenchmarkKind::DeqTanh09 | BenchmarkKind::DeqTanh099 => {
            unreachable!("the DEQ problems' root function is batched (BenchmarkProblem::root)")
        }
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
        BenchmarkKind::DeqTanh05 | BenchmarkKind::DeqTanh09 | BenchmarkKind::DeqTanh099 => {
            unreachable!("the DEQ problems start at zero")
        }
    }
}

fn norm(v: ArrayView1<f64>) -> f64 {
    v.dot(&v).sqrt()
}

impl BenchmarkProblem {
    /// The problem of `kind` (the DEQ layers are seeded: the same problem every time).
    pub fn new(kind: BenchmarkKind) -> Result<Self> {
        let rho = match kind {
            BenchmarkKind::DeqTanh05 => Some(0.5),
            BenchmarkKind::DeqTanh09 => Some(0.9),
            BenchmarkKind::DeqTanh099 => Some(0.99),
            _ => None,
        };
        if let Some(rho) = rho {
            let deq = TanhProblem::new(64, 16, 64, rho, 7)?;
            return Ok(BenchmarkProblem {
                kind,
                alpha: 1.0,
                x0: Array2::zeros((64, 64)),
                deq: Some(deq),
            });
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
            deq: None,
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
        match &self.deq {
            Some(p) => format!(
                "z = tanh(W z + U x + b), ||W||_2 = {}, D = 64, 64 inputs (g is the layer)",
                p.w_norm
            ),
            None => format!(
                "SciPy test_nonlin {} from xin, g(x) = x + {:.4e} F(x)",
                self.kind.name().trim_start_matches("scipy-"),
                self.alpha
            ),
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
        Ok(match &self.deq {
            Some(p) => {
                let pre = x.dot(&p.w.t()) + &p.injection;
                pre.mapv(f64::tanh) - x
            }
            None => {
                let mut out = Array2::zeros(x.raw_dim());
                for (mut o, r) in out.rows_mut().into_iter().zip(x.rows()) {
                    o.assign(&scipy_root(self.kind, r));
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
