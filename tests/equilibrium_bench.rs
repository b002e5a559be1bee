//! `elm bench`'s comparative report (`elm::equilibrium::bench`) on a tiny model: the KV bytes at
//! a context are those of the allocated caches — the dense model's every layer, the ELM's kept
//! layers plus one fixed-point cache (one-step) or one per solver iteration reached
//! (multi-step); and its rounds against the dense parent (`versus_dense`).

mod common;

use std::process::Command;

use elm::model::Arch;

#[test]
fn kv_bytes_at_a_context_are_the_allocated_caches() {
    let dir = common::TempDir::new("elm-bench");
    let model = dir.join("tiny");
    let w = common::uniform_weights(&common::tiny_config(Arch::Llama, 4), 3);
    elm::formats::save_hf_model(&w, &model).unwrap();
    std::fs::write(model.join("tokenizer.json"), common::word_tokenizer_json()).unwrap();
    let ck = dir.join("elm");
    let out = Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(["compress", "--start", "1", "--num-replaced", "2", "--json"])
        .arg("--model")
        .arg(&model)
        .arg("--out")
        .arg(&ck)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let context = 96;
    let out = Command::new(env!("CARGO_BIN_EXE_elm"))
        .args([
            "bench",
            "--weights",
            "f32,q8_0",
            "--prompt-len",
            "8",
            "--decode-steps",
            "2",
        ])
        .args([
            "--kv-context",
            &context.to_string(),
            "--solver",
            "picard",
            "--abs-tol",
            "1e-6",
        ])
        .args(["--max-iter", "5", "--json"])
        .arg("--model")
        .arg(&model)
        .arg("--elm")
        .arg(&ck)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cfg = &w.config;
    // K and V, f32, per layer: the cache of one sequence of `context` tokens.
    let layer = 2 * cfg.num_kv_heads * cfg.head_dim * 4 * context;
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for r in runs {
        let at = |k: &str| r[k].as_u64().unwrap() as usize;
        assert_eq!(at("kv_context_tokens"), context);
        match r["model"].as_str().unwrap() {
            "dense" => {
                assert_eq!(at("kv_bytes_at_context"), 4 * layer);
                assert!(r["kv_bytes_at_context_multi_step"].is_null());
            }
            _ => {
                // Kept layers 0 and 3, plus one fixed-point cache.
                assert_eq!(at("kv_bytes_at_context"), 3 * layer);
                // Multi-step: one cache per evaluation reached (the solver's iterations and the
                // committing one), so at most max_iter + 1 = 6 beside the 2 kept layers; an
                // untrained module at this tolerance needs more than one.
                let multi = at("kv_bytes_at_context_multi_step");
                assert!(multi > 3 * layer && multi <= (2 + 6) * layer, "{multi}");
                assert_eq!((multi - 2 * layer) % layer, 0);
                // `--rounds` (default 5): the ELM against its dense parent, batch 1 and 8, a
                // tok/s per round for each, the median ratio inside its range, and each side's
                // block evaluations (the dense model: its 4 layers; the ELM: 2 kept + 2..=6).
                let vs = r["versus_dense"].as_array().unwrap();
                assert_eq!(vs.len(), 2);
                for (v, batch) in vs.iter().zip([1, 8]) {
                    let f = |k: &str| v[k].as_f64().unwrap();
                    assert_eq!(v["batch"].as_u64(), Some(batch));
                    for side in ["dense_tok_s", "elm_tok_s"] {
                        let t = v[side].as_array().unwrap();
                        assert_eq!(t.len(), 5, "{side}");
                        assert!(t.iter().all(|x| x.as_f64().unwrap() > 0.0), "{side}");
                    }
                    assert!(
                        f("ratio_min") <= f("ratio_median") && f("ratio_median") <= f("ratio_max")
                    );
                    assert_eq!(f("dense_block_evals_per_token"), 4.0);
                    let evals = f("elm_block_evals_per_token");
                    assert!((4.0..=8.0).contains(&evals), "{evals}");
                }
            }
        }
        // Memory is measured on GGUF files (the runtime probe is cut from one): none for an HF
        // directory (the real models' are tests/memory_resident.rs's).
        assert!(r["memory"].is_null(), "{}", r["memory"]);
    }
}
