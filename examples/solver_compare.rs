//! Map evaluations each solver needs on each canonical problem (with a few solver settings).
//! `cargo run --release --example solver_compare`
use elm::solver::problems::Problem;
use elm::solver::{SolverConfig, StopCriteria};

fn main() -> elm::Result<()> {
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let mut configs: Vec<SolverConfig> = vec![
        SolverConfig::picard(),
        SolverConfig::anderson(),
        SolverConfig::broyden(),
    ];
    for text in &extra {
        configs.push(SolverConfig::from_json(text)?);
    }
    let cases = [
        ("linear", 0.5),
        ("linear", 0.9),
        ("linear", 0.99),
        ("tanh", 0.0),
        ("cos", 0.0),
        ("poisson", 0.0),
    ];
    for (name, rho) in cases {
        let mut p = Problem::by_name(name, rho, 3)?;
        let z0 = p.z0();
        let mut line = format!("{name:8} rho={rho:<5}");
        for cfg in &configs {
            let stop = StopCriteria::absolute(1e-10, 50_000);
            let sol = cfg.build::<f64>().solve(p.map(), z0.view(), &stop)?;
            line += &format!(
                " | {}: {} evals{}",
                cfg.name(),
                sol.map_evals,
                if sol.all_converged() {
                    ""
                } else {
                    " (NOT converged)"
                }
            );
        }
        println!("{line}");
    }
    Ok(())
}
