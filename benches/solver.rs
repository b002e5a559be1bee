//! Per-iteration solver overhead relative to the map it iterates.
//!
//! Map: `z ← tanh(W z + U x + b)` with D = 576 (`W` 576×576, f32), batch B ∈ {1, 64}; one map
//! evaluation is a [B, 576] × [576, 576] GEMM plus tanh. For each solver we time `K` iterations
//! (tolerance 0, so every row runs all `K`) and report
//! `overhead = (time per solver iteration − time per map evaluation) / time per map evaluation`,
//! both measured in this same run (criterion groups, then an interleaved median-of-reps table
//! that prints the ratios).
//!
//! `cargo bench --bench solver` (ratio table only, skipping the criterion groups:
//! `cargo bench --bench solver -- ratios-only`, a filter that matches no criterion benchmark).

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion};
use elm::solver::problems::TanhProblem;
use elm::solver::{FixedPointMap, SolverConfig, StopCriteria};
use ndarray::Array2;

const D: usize = 576;
const K: usize = 20;

fn problem(batch: usize) -> TanhProblem<f32> {
    TanhProblem::<f32>::new(D, 64, batch, 0.95, 0).expect("bench problem")
}

fn solver_config(name: &str) -> SolverConfig {
    SolverConfig::by_name(name).unwrap()
}

/// Exactly K evaluations per row: no tolerance, no divergence test.
fn k_iterations() -> StopCriteria {
    StopCriteria {
        abs_tol: 0.0,
        rel_tol: 0.0,
        max_iter: K,
        divergence_factor: f64::INFINITY,
        ..StopCriteria::default()
    }
}

/// K plain map evaluations, chained like Picard would (z ← f(z)) so the inputs stay realistic.
fn run_map(p: &mut TanhProblem<f32>, z: &mut Array2<f32>, out: &mut Array2<f32>, active: &[bool]) {
    for _ in 0..K {
        p.eval(z.view(), active, out.view_mut()).unwrap();
        std::mem::swap(z, out);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
        .configure_from_args();
    let solvers = elm::solver::BUILTIN_SOLVERS;
    for &batch in &[1usize, 64] {
        let mut group = c.benchmark_group(format!("solver_D{D}_B{batch}_{K}iters"));
        let mut p = problem(batch);
        let active = vec![true; batch];
        let z0 = Array2::<f32>::zeros((batch, D));
        group.bench_function("map_only", |b| {
            b.iter(|| {
                let mut z = z0.clone();
                let mut out = z0.clone();
                run_map(&mut p, &mut z, &mut out, &active);
                black_box(z)
            })
        });
        for name in solvers {
            let solver = solver_config(name).build::<f32>();
            group.bench_with_input(BenchmarkId::from_parameter(name), &name, |b, _| {
                b.iter(|| black_box(solver.solve(&mut p, z0.view(), &k_iterations()).unwrap()))
            });
        }
        group.finish();
    }

    // Ratios, measured interleaved in this run (median of reps, per map evaluation).
    println!("\nper-iteration overhead vs one map evaluation (D = {D}, {K} iterations per solve):");
    let mut rows = Vec::new();
    for &batch in &[1usize, 64] {
        let mut p = problem(batch);
        let active = vec![true; batch];
        let z0 = Array2::<f32>::zeros((batch, D));
        let built: Vec<_> = solvers
            .iter()
            .map(|n| solver_config(n).build::<f32>())
            .collect();
        let reps = if batch == 1 { 201 } else { 41 };
        let mut t_map = Vec::new();
        let mut t_solver = vec![Vec::new(); solvers.len()];
        for _ in 0..reps {
            let mut z = z0.clone();
            let mut out = z0.clone();
            let t = Instant::now();
            run_map(&mut p, &mut z, &mut out, &active);
            t_map.push(t.elapsed().as_secs_f64() / K as f64);
            black_box(&z);
            for (i, s) in built.iter().enumerate() {
                let t = Instant::now();
                let sol = s.solve(&mut p, z0.view(), &k_iterations()).unwrap();
                t_solver[i].push(t.elapsed().as_secs_f64() / sol.map_evals as f64);
                black_box(sol);
            }
        }
        let map = median(t_map);
        for (i, name) in solvers.iter().enumerate() {
            let it = median(std::mem::take(&mut t_solver[i]));
            let overhead = (it - map) / map;
            println!(
                "  B = {batch:2} {name:9} map {:8.2} us  solver iteration {:8.2} us  overhead {:+6.1}%",
                map * 1e6,
                it * 1e6,
                overhead * 100.0
            );
            rows.push(serde_json::json!({
                "batch": batch, "dim": D, "solver": name, "map_us": map * 1e6,
                "iteration_us": it * 1e6, "overhead_ratio": overhead,
            }));
        }
    }
    println!("{}", serde_json::json!({ "solver_overhead": rows }));
}
