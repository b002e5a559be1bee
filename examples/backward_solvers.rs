//! How many vector-Jacobian products each backward solver of the implicit rule needs, and how
//! close its gradient is to the exact IFT gradient, as ρ(∂f/∂z) → 1. Writes the table to
//! `results/backward_solvers.md` and prints it.
//!
//! `cargo run --example backward_solvers`
//!
//! Layer: `z = W z + U x + b` with `W` the solver crate's canonical symmetric matrix of spectral
//! radius exactly ρ (`LinearProblem`, n = 100), so `J = W` and the exact gradient is a dense
//! solve of `(I − Wᵀ) u = c` per row (LAPACK); loss `Σ c ⊙ z*`, a batch of 4 rows. The forward
//! pass starts at the exact fixed point, so only the backward is measured.

use std::time::Instant;

use elm::autograd::Tape;
use elm::grad::{implicit_forward, DeqConfig, GradientRule};
use elm::solver::problems::LinearProblem;
use elm::solver::{LinearSolverConfig, SolverConfig, StopCriteria};
use ndarray::{Array1, Array2, Axis};
use ndarray_linalg::Solve;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

#[path = "support/linear_deq.rs"]
mod linear_deq;
use linear_deq::{LinearDeq, Params};

const N: usize = 100;
const B: usize = 4;
const DX: usize = 8;
const RHOS: [f64; 3] = [0.5, 0.9, 0.99];
const REL_TOL: f64 = 1e-10;
const MAX_ITER: usize = 20_000;

struct Case {
    w: Array2<f64>,
    u: Array2<f64>,
    b: Array1<f64>,
    x: Array2<f64>,
    c: Array2<f64>,
    z: Array2<f64>,
    exact: Vec<f64>,
}

fn randn(rng: &mut StdRng, r: usize, c: usize) -> Array2<f64> {
    Array2::from_shape_fn((r, c), |_| StandardNormal.sample(rng))
}

fn case(rho: f64) -> elm::Result<Case> {
    let w = LinearProblem::new(N, rho, 1, 1)?.a;
    let mut rng = StdRng::seed_from_u64(2);
    let u = randn(&mut rng, N, DX) * 0.5;
    let b = randn(&mut rng, 1, N).row(0).to_owned() * 0.3;
    let x = randn(&mut rng, B, DX);
    let c = randn(&mut rng, B, N);
    let m = Array2::<f64>::eye(N) - &w;
    let mt = m.t().to_owned();
    let pre_x = x.dot(&u.t()) + &b;
    let (mut z, mut adj) = (Array2::zeros((B, N)), Array2::zeros((B, N)));
    for r in 0..B {
        let solve = |a: &Array2<f64>, v: Array1<f64>| {
            a.solve(&v)
                .map_err(|e| elm::ElmError::Linalg(e.to_string()))
        };
        z.row_mut(r).assign(&solve(&m, pre_x.row(r).to_owned())?);
        adj.row_mut(r).assign(&solve(&mt, c.row(r).to_owned())?);
    }
    let exact = grads_from_adjoint(&z, &adj, &x, &u);
    Ok(Case {
        w,
        u,
        b,
        x,
        c,
        z,
        exact,
    })
}

/// (dW, dU, db, dx) flattened, for adjoints `adj` [B, N] at the fixed point `z`.
fn grads_from_adjoint(
    z: &Array2<f64>,
    adj: &Array2<f64>,
    x: &Array2<f64>,
    u: &Array2<f64>,
) -> Vec<f64> {
    let dw = adj.t().dot(z);
    let du = adj.t().dot(x);
    let db = adj.sum_axis(Axis(0));
    let dx = adj.dot(u);
    dw.iter()
        .chain(du.iter())
        .chain(db.iter())
        .chain(dx.iter())
        .copied()
        .collect()
}

/// One measurement: batched adjoint VJPs (taped steps for phantom), relative gradient error,
/// converged.
struct Cell {
    cost: usize,
    err: f64,
    converged: bool,
}

fn measure(k: &Case, rule: &GradientRule) -> elm::Result<Cell> {
    let deq = DeqConfig::new(rule.clone())
        .with_forward(SolverConfig::anderson(), StopCriteria::relative(1e-13, 500));
    let mut tape = Tape::<f64>::new();
    let w = tape.param(k.w.clone().into_dyn());
    let u = tape.param(k.u.clone().into_dyn());
    let b = tape.param(k.b.clone().into_dyn());
    let x = tape.param(k.x.clone().into_dyn());
    let c = tape.constant(k.c.clone().into_dyn());
    let z0 = k.z.clone().into_dyn();
    let (z, report) = implicit_forward(&mut tape, &LinearDeq, x, &Params { w, u, b }, &z0, &deq)?;
    let zc = tape.mul(z, c)?;
    let loss = tape.sum(zc);
    let mut g = tape.backward(loss)?;
    let got: Vec<f64> = [w, u, b, x]
        .iter()
        .flat_map(|&v| g.take(v).into_iter().flat_map(|a| a.into_iter()))
        .collect();
    let diff: f64 = got
        .iter()
        .zip(&k.exact)
        .map(|(a, e)| (a - e).powi(2))
        .sum::<f64>()
        .sqrt();
    let scale = k.exact.iter().map(|e| e * e).sum::<f64>().sqrt();
    let (cost, converged) = match report.backward.get() {
        Some(back) => (back.vjp_evals, back.converged()),
        // JFB solves no adjoint; phantom's cost is its taped steps (one VJP each in backward).
        None if rule.name() == "jfb" => (0, true),
        None => (report.tape_applications, true),
    };
    Ok(Cell {
        cost,
        err: diff / scale,
        converged,
    })
}

fn main() -> elm::Result<()> {
    let started = Instant::now();
    let cases: Vec<Case> = RHOS.iter().map(|&r| case(r)).collect::<elm::Result<_>>()?;
    let solvers: Vec<LinearSolverConfig> = vec![
        SolverConfig::picard().into(),
        SolverConfig::anderson().into(),
        SolverConfig::broyden().into(),
        LinearSolverConfig::neumann(MAX_ITER),
        LinearSolverConfig::gmres(30),
        LinearSolverConfig::bicgstab(),
        LinearSolverConfig::cgnr(),
    ];
    let header = |what: &str, cost: &str| {
        let mut h = format!("| {what} |");
        let mut rule = String::from("|---|");
        for rho in RHOS {
            h += &format!(" ρ = {rho}: {cost} | ρ = {rho}: rel. error |");
            rule += "---:|---:|";
        }
        format!("{h}\n{rule}\n")
    };
    let row = |name: String, cells: &[Cell]| {
        let mut line = format!("| {name} |");
        for c in cells {
            let flag = if c.converged { "" } else { " (not converged)" };
            line += &format!(" {}{flag} | {:.1e} |", c.cost, c.err);
        }
        line + "\n"
    };

    let mut md = String::from("# Backward solvers of the implicit rule\n\n");
    md += "Generated by `cargo run --example backward_solvers` (do not edit by hand).\n\n";
    md += &format!(
        "Linear implicit layer `z = W z + U x + b`, `W` = the canonical symmetric `A` of spectral \
         radius ρ (n = {N}), batch of {B} rows, loss `Σ c ⊙ z*`; f64. Backward stop: relative \
         residual ≤ {REL_TOL:e}, at most {MAX_ITER} VJPs per row, `on_failure: jfb`. VJPs: \
         batched vector-Jacobian products of the adjoint solve (each one covers the whole \
         batch); rel. error: `‖∇ − ∇_exact‖ / ‖∇_exact‖` over (W, U, b, x), the exact gradient \
         from a dense LAPACK solve of `(I − Wᵀ) u = c`.\n\n"
    );
    md += &header("backward solver", "VJPs");
    for solver in &solvers {
        // CGNR's J·v by central differences (relative error ~1e-11 in f64) floors its residual.
        let cgnr = matches!(solver, LinearSolverConfig::Cgnr);
        let tol = if cgnr { REL_TOL.max(1e-9) } else { REL_TOL };
        let rule = GradientRule::implicit(solver.clone(), tol, MAX_ITER);
        let cells: Vec<Cell> = cases
            .iter()
            .map(|k| measure(k, &rule))
            .collect::<elm::Result<_>>()?;
        let name = match solver {
            LinearSolverConfig::FixedPoint(c) => format!("fixed point: {}", c.name()),
            LinearSolverConfig::Gmres { restart } => format!("gmres (restart {restart})"),
            LinearSolverConfig::Neumann { .. } => "neumann series".to_string(),
            LinearSolverConfig::Cgnr => format!(
                "cgnr (VJPs + J·v by central differences, 2 forward passes each; tol {tol:e})"
            ),
            other => other.name().to_string(),
        };
        md += &row(name, &cells);
    }
    let jfb: Vec<Cell> = cases
        .iter()
        .map(|k| measure(k, &GradientRule::Jfb))
        .collect::<elm::Result<_>>()?;
    md += &row("jfb (u = g, no adjoint solve)".into(), &jfb);

    md += "\nPhantom gradients on the same layer (k taped damped steps at the fixed point, so \
           k VJPs through f in backward):\n\n";
    md += &header("phantom (k, τ)", "steps");
    for (k, tau) in [(10, 0.5), (10, 1.0), (100, 0.5), (100, 1.0), (1000, 1.0)] {
        let cells: Vec<Cell> = cases
            .iter()
            .map(|c| measure(c, &GradientRule::phantom(k, tau)))
            .collect::<elm::Result<_>>()?;
        md += &row(format!("k = {k}, τ = {tau}"), &cells);
    }
    md += &format!(
        "\nWhole table computed in {:.1} s ({} build).\n",
        started.elapsed().as_secs_f64(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    print!("{md}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results/backward_solvers.md");
    elm::io::write_atomic(&out, md.as_bytes())?;
    eprintln!("wrote {}", out.display());
    Ok(())
}
