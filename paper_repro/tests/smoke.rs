//! The one-command reproduction at `smoke` scale, end to end on the real SmolLM2 checkpoint.

use std::path::PathBuf;
use std::process::Command;

fn model_path() -> PathBuf {
    let dir = std::env::var_os("ELM_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")));
    dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

#[test]
fn smoke_scale_writes_every_table() {
    let model = model_path();
    if !model.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have {}",
            model.display()
        );
        eprintln!(
            "SKIP: {} absent (run scripts/fetch-smollm2.sh)",
            model.display()
        );
        return;
    }
    let out = std::env::temp_dir().join(format!("paper_repro_smoke_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(env!("CARGO_BIN_EXE_paper_repro"))
        .args(["--scale", "smoke", "--out"])
        .arg(&out)
        .arg("--model")
        .arg(&model)
        .status()
        .expect("run paper_repro");
    assert!(status.success(), "paper_repro --scale smoke failed");

    let report = std::fs::read_to_string(out.join("README.md")).unwrap();
    for heading in [
        "Fixed-point solvers",
        "ELM: layers [12, 20)",
        "| ELM | broyden | 0.5 |",
    ] {
        assert!(
            report.contains(heading),
            "missing `{heading}` in report:\n{report}"
        );
    }
    // A value the CLI did not print is an error, never a placeholder; "n/a" marks cells that
    // do not exist by definition (the dense model's solver columns, tanh's exact error).
    for line in report.lines().filter(|l| l.starts_with('|')) {
        for cell in line.trim_matches('|').split('|').map(str::trim) {
            assert!(
                !cell.is_empty() && cell != "—" && !cell.contains("NaN"),
                "placeholder cell `{cell}` in row `{line}`"
            );
        }
    }
    assert!(!report.contains("NaN"), "NaN in report:\n{report}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let steps = summary["steps"].as_array().unwrap();
    // 6 problems × (3 solvers + 1 study), compress, train, then answer NLL and exact match
    // for the dense model and 3 solvers × 2 tolerances.
    assert_eq!(steps.len(), 6 * 4 + 2 + 2 * (1 + 6));
    // Every evaluation figure comes with its interval around it.
    for s in steps.iter().filter(|s| s["section"] == "eval") {
        for (name, m) in s["result"]["metrics"].as_object().unwrap() {
            let e = &m["estimate"];
            let (v, lo, hi) = (e["value"].as_f64(), e["lo"].as_f64(), e["hi"].as_f64());
            let (v, lo, hi) = (v.unwrap(), lo.unwrap(), hi.unwrap());
            assert!(lo <= v && v <= hi, "{name}: {e}");
        }
    }
    for s in steps.iter().filter(|s| s["section"] == "solvers") {
        assert_eq!(s["result"]["converged"], true, "{s}");
    }
    for s in steps.iter().filter(|s| s["section"] == "study") {
        assert!(std::path::Path::new(s["plot"].as_str().unwrap()).exists());
    }
    let comp = steps
        .iter()
        .find(|s| s["section"] == "elm_compress")
        .unwrap();
    // One-step KV keeps N − M + 1 of N layers' caches.
    let ratio = comp["result"]["kv"]["one_step_ratio"].as_f64().unwrap();
    assert!(
        (ratio - 23.0 / 30.0).abs() < 1e-12,
        "one-step ratio {ratio}"
    );
    let train = &steps.iter().find(|s| s["section"] == "elm_train").unwrap()["result"];
    assert!(
        train["distill_after"].as_f64().unwrap() < train["distill_before"].as_f64().unwrap(),
        "training did not lower the distillation loss: {train}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
