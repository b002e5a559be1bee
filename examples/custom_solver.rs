//! A fixed-point solver written outside the library (`support/adaptive_picard.rs`: Picard with
//! per-row residual-driven damping), used everywhere the library solves: on the canonical
//! problems beside the built-ins, and decoding an ELM cut from the real SmolLM2 checkpoint
//! (`SolverConfig::custom` in the `InferenceConfig`). Training with it: `cargo run --example
//! deq_classifier -- --solver adaptive-picard` (forward and backward solver).
//!
//! `cargo run --release --example custom_solver [-- --model FILE.gguf] [--json]`

#[path = "support/adaptive_picard.rs"]
mod adaptive_picard;

use std::path::PathBuf;

use adaptive_picard::AdaptivePicard;
use elm::equilibrium::infer::{generate_greedy, ElmModel, ElmSession, InferenceConfig};
use elm::equilibrium::{ElmConfig, ElmModule};
use elm::model::{default_model_path, load_pretrained};
use elm::solver::problems::Problem;
use elm::solver::{SolverConfig, StopCriteria, BUILTIN_SOLVERS};
use serde_json::json;

fn main() -> elm::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().any(|a| a == "--json");
    let model = match args.iter().position(|a| a == "--model") {
        Some(i) => PathBuf::from(args.get(i + 1).ok_or_else(|| {
            elm::ElmError::config("--model", "expects a GGUF file or model directory")
        })?),
        None => default_model_path(),
    };
    let mine = SolverConfig::custom(AdaptivePicard::default());
    let solvers: Vec<SolverConfig> = BUILTIN_SOLVERS
        .iter()
        .map(|n| SolverConfig::by_name(n))
        .chain([Ok(mine.clone())])
        .collect::<Result<_, _>>()?;

    // 1. The canonical problems: map evaluations to an absolute residual of 1e-8.
    let mut problems = vec![];
    for (name, rho) in [
        ("linear", 0.9),
        ("linear", 0.99),
        ("tanh", 0.0),
        ("cos", 0.0),
    ] {
        let mut p = Problem::by_name(name, rho, 0)?;
        let z0 = p.z0();
        let mut row = serde_json::Map::new();
        for s in &solvers {
            let sol = s.build::<f64>().solve(
                p.map(),
                z0.view(),
                &StopCriteria::absolute(1e-8, 50_000),
            )?;
            row.insert(
                s.name().into(),
                json!({"map_evals": sol.map_evals, "converged": sol.all_converged()}),
            );
        }
        problems.push(json!({"problem": name, "rho": rho, "solvers": row}));
    }

    // 2. An ELM cut from the real checkpoint (layers 12–19 → one module, the paper's init),
    //    decoded greedily with the custom solver and with Anderson at a tight tolerance: both
    //    reach the same fixed points, so the same tokens.
    let (dense, tok) = load_pretrained(&model)?;
    let ec = ElmConfig::new(12, 8);
    let module = ElmModule::init(&dense, &ec)?;
    let elm_model = ElmModel::new(dense, ec, module)?;
    let prompt = tok.encode("The capital of France is", true)?;
    let stop = StopCriteria::absolute(1e-3, 200);
    let mut decoded = vec![];
    for s in [mine, SolverConfig::anderson()] {
        let cfg = InferenceConfig::new(s.clone(), stop.clone());
        let mut session = ElmSession::new(&elm_model, cfg, 1, prompt.len() + 16)?;
        let out = generate_greedy(&mut session, std::slice::from_ref(&prompt), 12, &[])?;
        let stats = &session.decode_stats;
        let converged = stats
            .iter()
            .all(|s| s.status == elm::solver::RowStatus::Converged);
        let mean_iters =
            stats.iter().map(|s| s.iterations as f64).sum::<f64>() / stats.len().max(1) as f64;
        decoded.push(json!({
            "solver": s.name(), "tokens": out[0], "text": tok.decode(&out[0])?,
            "all_converged": converged, "mean_iterations": mean_iters,
        }));
    }
    let same = decoded[0]["tokens"] == decoded[1]["tokens"];
    let report = json!({"problems": problems, "elm_decode": decoded, "same_tokens": same});
    if json_out {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report).expect("json"));
    }
    if !same {
        return Err(elm::ElmError::InvalidArgument(
            "the custom solver decoded other tokens than Anderson at the same tolerance".into(),
        ));
    }
    Ok(())
}
