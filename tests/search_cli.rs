//! `elm lora` / `elm search` on the real model: bad input (M ≥ layers, p or q = 0, zero steps,
//! a LoRA rank larger than the layer, an unknown method) fails with exit code 1 and a message
//! naming the field, before any training.

mod common;

use std::process::Command;

fn elm_err(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(args)
        .output()
        .expect("run elm");
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn bad_search_and_lora_arguments_are_clear_errors() {
    let Some(path) = common::real_model() else {
        return;
    };
    let m = path.to_str().unwrap();
    let tmp = common::TempDir::new("search-cli");
    let dir = tmp.join("out");
    let out = dir.to_str().unwrap();
    let gppo = |extra: &[&str]| {
        let mut a = vec!["search", "--model", m, "--method", "gppo", "--out", out];
        a.extend_from_slice(extra);
        elm_err(&a)
    };
    assert!(gppo(&["--m", "30"]).contains("num_replaced"));
    assert!(gppo(&["--m", "8", "--update-every", "0"]).contains("update_every"));
    assert!(gppo(&["--m", "8", "--ppo-epochs", "0"]).contains("ppo_epochs"));
    assert!(gppo(&["--m", "8", "--steps", "0"]).contains("steps"));
    let e = elm_err(&[
        "search",
        "--model",
        m,
        "--method",
        "enumerate",
        "--m",
        "8",
        "--every",
        "0",
        "--out",
        out,
    ]);
    assert!(e.contains("every"), "{e}");
    assert!(elm_err(&["search", "--model", m, "--method", "nope"]).contains("unknown method"));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("lora.json");
    std::fs::write(&cfg, r#"{"lora": {"rank": 1000}, "steps": 1}"#).unwrap();
    let run = dir.join("run");
    let run = run.to_str().unwrap();
    let e = elm_err(&[
        "lora",
        "--model",
        m,
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        run,
    ]);
    assert!(e.contains("rank") && e.contains("exceeds"), "{e}");
    let e = elm_err(&["lora", "--model", m, "--steps", "0", "--out", run]);
    assert!(e.contains("steps"), "{e}");
    // A fresh run never writes over a non-empty --out unless told to.
    let e = elm_err(&["lora", "--model", m, "--steps", "1", "--out", out]);
    assert!(e.contains("`out`") && e.contains("--force"), "{e}");
    assert!(gppo(&["--m", "8", "--steps", "1"]).contains("--force"));
}
