//! `elm eval` on the real SmolLM2 checkpoint: every NLL figure comes with its interval, n and
//! tok/s; an ELM paired against its dense model gives Δ with its interval; the batched CLI
//! figure equals the one-sequence path; data is found in the repository without ../shared;
//! bad data and bad arguments are refused with a clear error.

mod common;

use common::{real_model, TempDir};
use std::process::Command;

use elm::data::{default_data_dir, load_gsm8k, Split};
use elm::equilibrium::infer::{ElmModel, ElmSession, InferenceConfig};
use elm::eval::gsm8k::{qa_prompt, QaLayout};
use elm::eval::nll::token_nll;

/// Runs `elm` with no ELM_DATA_DIR (as in a fresh clone without ../shared).
fn elm(args: &[&str]) -> (bool, serde_json::Value, String) {
    elm_with_env(args, &[])
}

/// [`elm`] with these variables set (`Some`) or removed (`None`).
fn elm_with_env(args: &[&str], env: &[(&str, Option<&str>)]) -> (bool, serde_json::Value, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_elm"));
    cmd.args(args).env_remove("ELM_DATA_DIR");
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let out = cmd.output().expect("run elm");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.success(), json, stderr)
}

/// NLL of the first `n` GSM8K test answers, one sequence at a time through
/// `prefill_all_logits` (an independent path from the batched one).
fn one_at_a_time_nll(model: &ElmModel, tok: &elm::formats::tokenizer::Tokenizer, n: usize) -> f64 {
    let test = load_gsm8k(&default_data_dir(), Split::Test).unwrap();
    let (mut sum, mut count) = (0.0, 0usize);
    for e in test.iter().take(n) {
        // lm-evaluation-harness's split, written out here: the chat prompt's closing newline
        // goes with the answer, the joint text is encoded once, the answer is what follows the
        // prompt's own tokens.
        let context = qa_prompt(tok, &e.question);
        let kept = context.trim_end();
        let all = tok
            .encode(
                &format!("{context}{}", QaLayout::of(tok).answer(&e.answer)),
                false,
            )
            .unwrap();
        let first = tok.encode(kept, false).unwrap().len();
        let mut s = ElmSession::new(model, InferenceConfig::default(), 1, all.len()).unwrap();
        let logits = s.prefill_all_logits(0, &all).unwrap();
        for (i, &t) in all.iter().enumerate().skip(first) {
            sum += token_nll(logits.row(i - 1), t);
            count += 1;
        }
    }
    sum / count as f64
}

#[test]
fn gsm8k_nll_dense_and_paired_elm() {
    let Some(model) = real_model() else { return };
    let m = model.to_str().unwrap();
    let (ok, v, err) = elm(&[
        "eval",
        "--model",
        m,
        "--task",
        "gsm8k-nll",
        "--limit",
        "3",
        "--batch",
        "2",
        "--json",
    ]);
    assert!(ok, "{err}");
    // The default data dir is the repository's data/.
    assert_eq!(
        std::path::Path::new(v["data_dir"].as_str().unwrap()),
        default_data_dir()
    );
    let est = &v["metrics"]["answer_nll"]["estimate"];
    let (value, lo, hi) = (
        est["value"].as_f64().unwrap(),
        est["lo"].as_f64().unwrap(),
        est["hi"].as_f64().unwrap(),
    );
    assert_eq!(est["n"], 3);
    assert!(lo <= value && value <= hi && lo < hi, "{est}");
    assert!(v["tok_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        v["metrics"]["answer_nll"]["items"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // The batched figure is the one-sequence-at-a-time figure.
    let (dense, tok) = ElmModel::load(&model, None).unwrap();
    let reference = one_at_a_time_nll(&dense, &tok, 3);
    assert!(
        (value - reference).abs() < 1e-3,
        "batched {value} vs one at a time {reference}"
    );

    // An ELM (just compressed: W_z small, so near the dense model but not equal) paired
    // with its dense model on the same 2 problems.
    let ck = TempDir::new("ck");
    let ck_s = ck.join("init");
    let (ok, _, err) = elm(&[
        "compress",
        "--model",
        m,
        "--start",
        "12",
        "--num-replaced",
        "8",
        "--out",
        ck_s.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let (ok, v, err) = elm(&[
        "eval",
        "--model",
        m,
        "--elm",
        ck_s.to_str().unwrap(),
        "--task",
        "gsm8k-nll",
        "--limit",
        "2",
        "--max-iter",
        "4",
        "--compare-dense",
        "--json",
    ]);
    assert!(ok, "{err}");
    let p = &v["metrics"]["answer_nll"]["paired"];
    let d = &p["delta"];
    let (dv, dlo, dhi) = (
        d["value"].as_f64().unwrap(),
        d["lo"].as_f64().unwrap(),
        d["hi"].as_f64().unwrap(),
    );
    assert!(dlo <= dv && dv <= dhi, "{p}");
    let elm_nll = v["metrics"]["answer_nll"]["estimate"]["value"]
        .as_f64()
        .unwrap();
    let dense_nll = v["reference"]["metrics"]["answer_nll"]["estimate"]["value"]
        .as_f64()
        .unwrap();
    assert!((dv - (elm_nll - dense_nll)).abs() < 1e-9);
    // Replacing 8 layers by one untrained module costs likelihood.
    assert!(dv > 0.0, "ΔNLL {dv}");
    assert!(
        v["solver"]["tokens"].as_u64().unwrap() == 2,
        "{}",
        v["solver"]
    );

    // --compare-model pairs against another dense model: the same file gives Δ = 0 exactly.
    let (ok, v, err) = elm(&[
        "eval",
        "--model",
        m,
        "--compare-model",
        m,
        "--task",
        "gsm8k-nll",
        "--limit",
        "2",
        "--json",
    ]);
    assert!(ok, "{err}");
    let p = &v["metrics"]["answer_nll"]["paired"];
    assert_eq!(p["delta"]["value"].as_f64(), Some(0.0), "{p}");
    assert_eq!(p["verdict"], "indistinguishable", "{p}");
}

#[test]
fn gsm8k_exact_match_reports_both_extractions() {
    let Some(model) = real_model() else { return };
    let (ok, v, err) = elm(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--task",
        "gsm8k",
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
        "--samples",
        "--json",
    ]);
    assert!(ok, "{err}");
    for name in ["strict_match", "flexible_extract"] {
        let e = &v["metrics"][name]["estimate"];
        assert_eq!(e["n"], 2, "{name}");
        let val = e["value"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&val));
    }
    assert_eq!(v["gsm8k_samples"].as_array().unwrap().len(), 2);
}

#[test]
fn bad_data_and_arguments_are_refused() {
    let Some(model) = real_model() else { return };
    let m = model.to_str().unwrap();
    // A GSM8K file whose answer lacks `#### N` is rejected, naming file and line.
    let dir = TempDir::new("bad");
    std::fs::create_dir_all(dir.join("gsm8k")).unwrap();
    std::fs::write(
        dir.join("gsm8k/test.jsonl"),
        "{\"question\": \"1+1?\", \"answer\": \"2\\n#### 2\"}\n\
         {\"question\": \"2+2?\", \"answer\": \"It is 4.\"}\n",
    )
    .unwrap();
    let d = dir.to_str().unwrap();
    for task in ["gsm8k-nll", "gsm8k"] {
        let (ok, v, err) = elm(&[
            "eval",
            "--model",
            m,
            "--task",
            task,
            "--data-dir",
            d,
            "--json",
        ]);
        // With --json a failure prints only the JSON error object, never figures.
        assert!(
            !ok && v["error"]["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("test.jsonl")),
            "{task}: scored bad data: {v}"
        );
        assert!(
            err.contains("test.jsonl") && err.contains("line 2") && err.contains("####"),
            "{err}"
        );
    }
    for (args, want) in [
        (vec!["--limit", "0"], "limit"),
        (vec!["--batch", "0"], "batch"),
        (vec!["--task", "mmlu"], "task"),
        (vec!["--compare-dense"], "compare-dense"),
    ] {
        let mut a = vec!["eval", "--model", m, "--json"];
        a.extend(args.iter());
        let (ok, _, err) = elm(&a);
        assert!(!ok, "{args:?} accepted");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `elm perplexity` runs the evaluation's teacher-forced path for dense and ELM alike: the
/// batched figure over uneven windows equals a per-window reference (dense: the
/// transformer's own `sequence_nll`; ELM: one-window sessions through `prefill_all_logits`).
#[test]
fn perplexity_dense_and_elm_match_per_window_references() {
    let Some(model) = real_model() else { return };
    let m = model.to_str().unwrap();
    let dir = TempDir::new("ppl");
    let text = dir.join("text.txt");
    std::fs::write(
        &text,
        "The fixed point of a contraction is unique. Iterating the map from any start \
         converges to it, and Anderson acceleration mixes the last few iterates to get \
         there in fewer steps. Equilibrium models use this to replace many layers by one fixed-point module.",
    )
    .unwrap();
    let ck = dir.join("elm");
    let (ok, _, err) = elm(&[
        "compress",
        "--model",
        m,
        "--start",
        "12",
        "--num-replaced",
        "8",
        "--out",
        ck.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let (dense, tok) = ElmModel::load(&model, None).unwrap();
    let ids = tok
        .encode(&std::fs::read_to_string(&text).unwrap(), false)
        .unwrap();
    let context = 16;
    assert!(
        ids.len() % context >= 2,
        "the last window is shorter (padding in its batch)"
    );
    let transformer = elm::model::Transformer::new(dense.f32_weights().unwrap().0.clone()).unwrap();
    let (mut sum, mut count) = (0.0, 0);
    for w in ids.chunks(context) {
        let (s, c) = transformer.sequence_nll(w).unwrap();
        sum += s;
        count += c;
    }
    let run = |extra: &[&str]| {
        let mut args = vec![
            "perplexity",
            "--model",
            m,
            "--file",
            text.to_str().unwrap(),
            "--context",
            "16",
            "--batch",
            "3",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (ok, v, err) = elm(&args);
        assert!(ok, "{err}");
        v
    };
    let v = run(&[]);
    assert_eq!(v["scored_tokens"].as_u64().unwrap() as usize, count);
    let got = v["mean_nll"].as_f64().unwrap();
    assert!(
        (got - sum / count as f64).abs() < 1e-3,
        "{got} vs {}",
        sum / count as f64
    );

    let (elm_model, _) = ElmModel::load(&model, Some(&ck)).unwrap();
    let icfg = InferenceConfig::default();
    let (mut esum, mut ecount) = (0.0, 0);
    for w in ids.chunks(context) {
        let mut s = ElmSession::new(&elm_model, icfg.clone(), 1, w.len()).unwrap();
        let logits = s.prefill_all_logits(0, w).unwrap();
        for (p, &t) in w.iter().enumerate().skip(1) {
            esum += token_nll(logits.row(p - 1), t);
            ecount += 1;
        }
    }
    let v = run(&["--elm", ck.to_str().unwrap()]);
    let got = v["mean_nll"].as_f64().unwrap();
    assert!(
        v["solver"]["tokens"].as_u64().unwrap() > 0,
        "{}",
        v["solver"]
    );
    assert!(
        (got - esum / ecount as f64).abs() < 2e-3,
        "ELM {got} vs {}",
        esum / ecount as f64
    );
    // Eight layers replaced by an untrained module cost likelihood on plain text too.
    assert!(got > sum / count as f64);
}

/// Generation's batches run concurrently (one per core) when BLAS is single-threaded, the
/// binary's default, and one after another when `OPENBLAS_NUM_THREADS` gives BLAS the cores:
/// the same batches either way, so the completions and their scores are the same to the token.
#[test]
fn gsm8k_generation_is_the_same_whether_batches_run_concurrently_or_in_turn() {
    let Some(model) = real_model() else { return };
    let run = |blas_threads: Option<&str>| {
        let (ok, v, err) = elm_with_env(
            &[
                "eval",
                "--model",
                model.to_str().unwrap(),
                "--task",
                "gsm8k",
                "--limit",
                "4",
                "--batch",
                "2",
                "--max-new-tokens",
                "12",
                "--samples",
                "--json",
            ],
            &[("OPENBLAS_NUM_THREADS", blas_threads)],
        );
        assert!(ok, "{err}");
        v
    };
    let (concurrent, in_turn) = (run(None), run(Some("2")));
    let samples = |v: &serde_json::Value| v["gsm8k_samples"].clone();
    assert_eq!(samples(&concurrent).as_array().map(Vec::len), Some(4));
    assert_eq!(samples(&concurrent), samples(&in_turn));
    assert_eq!(concurrent["tokens"], in_turn["tokens"]);
    assert_eq!(concurrent["metrics"], in_turn["metrics"]);
}
