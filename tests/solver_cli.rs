//! `elm solve` / `elm study` end to end: JSON fields, exact-solution errors, plots, bad input.

mod common;

use common::TempDir;
use std::process::Command;

use serde_json::Value;

fn elm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(args)
        .env("OPENBLAS_NUM_THREADS", "1")
        .output()
        .expect("run elm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn solve_json_reports_required_fields_and_small_error() {
    for solver in elm::solver::BUILTIN_SOLVERS {
        let (ok, stdout, stderr) = elm(&[
            "solve",
            "--problem",
            "linear",
            "--rho",
            "0.9",
            "--solver",
            solver,
            "--tol",
            "1e-10",
            "--json",
        ]);
        assert!(ok, "{solver}: {stderr}");
        let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
        for key in [
            "problem",
            "solver",
            "iterations",
            "map_evals",
            "converged",
            "residual",
            "error_vs_exact",
            "seconds",
        ] {
            assert!(v.get(key).is_some(), "{solver}: missing `{key}` in {v}");
        }
        assert_eq!(v["solver"], solver);
        assert_eq!(v["converged"], true);
        let residual = v["residual"].as_f64().unwrap();
        let err = v["error_vs_exact"].as_f64().unwrap();
        // Contraction with ‖A‖₂ = 0.9: error ≤ residual / 0.1.
        assert!(
            residual <= 1e-10 && err <= residual / 0.1 * (1.0 + 1e-6),
            "{solver}: {v}"
        );
    }
    let (ok, stdout, _) = elm(&[
        "solve",
        "--problem",
        "cos",
        "--solver",
        "anderson",
        "--json",
        "--tol",
        "1e-12",
    ]);
    assert!(ok);
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(v["error_vs_exact"].as_f64().unwrap() < 1e-11, "{v}");
}

#[test]
fn study_writes_svg_and_png() {
    let dir = TempDir::new("solver-cli");
    for ext in ["svg", "png"] {
        let path = dir.join(format!("study.{ext}"));
        let (ok, stdout, stderr) = elm(&[
            "study",
            "--problem",
            "cos",
            "--plot",
            path.to_str().unwrap(),
            "--json",
        ]);
        assert!(ok, "{stderr}");
        let v: Value = serde_json::from_str(stdout.trim()).unwrap();
        let solvers = v["solvers"].as_array().unwrap();
        assert_eq!(solvers.len(), 3);
        for s in solvers {
            assert_eq!(s["converged"], true);
            assert_eq!(
                s["curve"].as_array().unwrap().len() as u64,
                s["map_evals"].as_u64().unwrap()
            );
        }
        let bytes = std::fs::read(&path).unwrap();
        if ext == "svg" {
            assert!(String::from_utf8_lossy(&bytes).contains("<svg"));
        } else {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        }
    }
}

#[test]
fn bad_input_is_a_clean_error() {
    let (ok, _, stderr) = elm(&[
        "solve",
        "--problem",
        "linear",
        "--solver",
        "picard",
        "--history",
        "3",
    ]);
    assert!(!ok && stderr.contains("`history`"), "{stderr}");
    let (ok, _, stderr) = elm(&[
        "solve",
        "--problem",
        "linear",
        "--solver",
        "anderson",
        "--beta",
        "1.5",
    ]);
    assert!(!ok && stderr.contains("beta"), "{stderr}");
    let (ok, _, stderr) = elm(&["study", "--problem", "cos", "--plot", "/tmp/x.pdf"]);
    assert!(!ok && stderr.contains("extension"), "{stderr}");
    let (ok, _, _) = elm(&["solve", "--problem", "nope", "--solver", "picard"]);
    assert!(!ok);
    let dir = TempDir::new("solver-cfg");
    let cfg = dir.join("bad.json");
    std::fs::write(&cfg, r#"{"kind":"anderson","mm":2}"#).unwrap();
    let (ok, _, stderr) = elm(&[
        "solve",
        "--problem",
        "cos",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(
        !ok && stderr.contains("bad.json") && stderr.contains("mm"),
        "{stderr}"
    );
    // A config file describes the algorithm only: a `stop` block is refused (stopping comes from
    // --abs-tol/--rel-tol/--max-iter), never silently replaced.
    std::fs::write(
        &cfg,
        r#"{"kind":"anderson","history":2,"stop":{"max_iter":3}}"#,
    )
    .unwrap();
    let (ok, _, stderr) = elm(&[
        "solve",
        "--problem",
        "cos",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(
        !ok && stderr.contains("bad.json") && stderr.contains("stop"),
        "{stderr}"
    );
    std::fs::write(&cfg, r#"{"kind":"anderson","history":2}"#).unwrap();
    let (ok, stdout, stderr) = elm(&[
        "solve",
        "--problem",
        "cos",
        "--config",
        cfg.to_str().unwrap(),
        "--max-iter",
        "3",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["config"]["history"], 2);
    assert_eq!(v["stop"]["max_iter"], 3);
    assert_eq!(v["iterations"], 3);
}

/// `elm sweep` writes its rows (JSON), a markdown table and a plot; the JSON rows are the
/// library's `rho_sweep` rows for the same config, and a bad `--mark` is refused by name.
#[test]
fn sweep_writes_table_plot_and_the_library_rows() {
    let dir = TempDir::new("sweep");
    let out = dir.join("sweep");
    let o = out.to_str().unwrap();
    let (ok, stdout, stderr) = elm(&[
        "sweep",
        "--rhos",
        "0.5,0.9",
        "--rel-tols",
        "1e-4",
        "--mark",
        "ELM M=8=0.29",
        "--out",
        o,
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let rows: Vec<elm::solver::rho_sweep::RhoSweepRow> =
        serde_json::from_value(v["rows"].clone()).unwrap();
    let cfg = elm::solver::rho_sweep::RhoSweepConfig {
        rhos: vec![0.5, 0.9],
        rel_tols: vec![1e-4],
        ..Default::default()
    };
    let solvers: Vec<_> = elm::solver::BUILTIN_SOLVERS
        .iter()
        .map(|n| elm::solver::SolverConfig::by_name(n).unwrap())
        .collect();
    assert_eq!(
        rows,
        elm::solver::rho_sweep::rho_sweep(&cfg, &solvers).unwrap()
    );
    let md = std::fs::read_to_string(out.join("rho_sweep.md")).unwrap();
    assert!(
        md.contains("| 0.9 |") && md.contains("ELM M=8 ρ = 0.290"),
        "{md}"
    );
    let svg = std::fs::read_to_string(out.join("rho_sweep.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("anderson"));
    let (ok, _, stderr) = elm(&["sweep", "--mark", "rho", "--out", o]);
    assert!(!ok && stderr.contains("mark"), "{stderr}");
    let (ok, _, stderr) = elm(&["sweep", "--rhos", "1.2", "--out", o]);
    assert!(!ok && stderr.contains("rhos"), "{stderr}");

    // A mark read from an `elm spectral --json` report: its mean radius, labelled with its range.
    let report = elm::equilibrium::spectral::SpectralReport {
        n: 2,
        mean_radius: 0.25,
        min_radius: 0.2,
        max_radius: 0.3,
        radii: vec![0.2, 0.3],
        max_rel_residual: 1e-5,
        solver: "anderson".into(),
        tol: 1e-4,
        power: Default::default(),
    };
    let file = dir.join("spectral.json");
    std::fs::write(&file, serde_json::to_string(&report).unwrap()).unwrap();
    let mark = format!("trained={}", file.display());
    let (ok, _, stderr) = elm(&[
        "sweep",
        "--rhos",
        "0.5",
        "--rel-tols",
        "1e-2",
        "--mark-report",
        &mark,
        "--out",
        o,
    ]);
    assert!(ok, "{stderr}");
    let md = std::fs::read_to_string(out.join("rho_sweep.md")).unwrap();
    assert!(
        md.contains("trained (range 0.200–0.300 over 2 sequences) ρ = 0.250"),
        "{md}"
    );
    std::fs::write(&file, "{\"n\": 2}").unwrap();
    let (ok, _, stderr) = elm(&["sweep", "--mark-report", &mark, "--out", o]);
    assert!(!ok && stderr.contains("spectral.json"), "{stderr}");
}
