//! Impossible requests are refused up front (issue 17): no panic (101), no abort (134), no
//! signal, no runaway (every child has a wall-clock limit), no silent success; the message
//! names the argument, file or field; stdout is empty or, with `--json`, one JSON error object.
//!
//! One test per reported case, then a seeded generator (`ELM_FUZZ_SEED` to change the seed)
//! over random bad arguments and mutated/truncated files. Everything runs on a tiny random
//! model (context 128) built in a temp dir, so no download is needed and each run is fast.

mod common;

use common::word_tokenizer_json as tokenizer_json;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use elm::model::{Arch, ModelConfig, ModelWeights};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const U64_MAX: &str = "18446744073709551615";
/// A hang is a failure: every child is killed after this.
const CHILD_LIMIT: Duration = Duration::from_secs(30);

struct Fixture {
    /// Shared by every test. A static is never dropped, so it lives beside the build
    /// (`CARGO_TARGET_TMPDIR`, one fixed directory the next run replaces), not in `/tmp`.
    dir: PathBuf,
    /// Tiny HF model directory (config.json, model.safetensors, tokenizer.json).
    model: PathBuf,
    /// The same model as a GGUF (weights only: `compress` reads it).
    gguf: PathBuf,
    /// An ELM checkpoint of the tiny model (layers [1, 3)).
    ckpt: PathBuf,
    /// Training text (.jsonl, `text` records).
    data: PathBuf,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn fresh(name: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    fixture().dir.join(format!("{name}-{n}"))
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("refuse-fixture");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = ModelConfig::tiny(Arch::Llama);
        let w = ModelWeights::random(&cfg, 7);
        let model = dir.join("tiny");
        elm::formats::save_hf_model(&w, &model).unwrap();
        std::fs::write(model.join("tokenizer.json"), tokenizer_json()).unwrap();
        let gguf = dir.join("tiny.gguf");
        elm::formats::save_gguf_model(&w, &gguf).unwrap();
        let data = dir.join("train.jsonl");
        common::write_word_corpus(&data, 8, 5);
        let ckpt = dir.join("ckpt");
        let out = run(&[
            "compress",
            "--model",
            s(&model),
            "--start",
            "1",
            "--num-replaced",
            "2",
            "--out",
            s(&ckpt),
        ]);
        assert_eq!(out.code, Some(0), "fixture compress: {}", out.stderr);
        Fixture {
            dir,
            model,
            gguf,
            ckpt,
            data,
        }
    })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

/// Runs `elm args` with a wall-clock limit (killed past it).
fn run(args: &[&str]) -> Outcome {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let base = std::env::temp_dir().join(format!("elm-refuse-out-{}-{n}", std::process::id()));
    let (out_path, err_path) = (base.with_extension("out"), base.with_extension("err"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .env("OPENBLAS_NUM_THREADS", "1")
        .env_remove("ELM_DATA_DIR")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn elm");
    let start = Instant::now();
    let (status, timed_out) = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break (Some(st), false);
        }
        if start.elapsed() > CHILD_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).to_string();
    let out = Outcome {
        code: status.and_then(|s| s.code()),
        stdout: read(&out_path),
        stderr: read(&err_path),
        timed_out,
    };
    let _ = std::fs::remove_file(out_path);
    let _ = std::fs::remove_file(err_path);
    out
}

/// Asserts a clean refusal: exit code 1 or 2 (never 0, 101, 134 or a signal), no timeout, the
/// message names one of `names` (case-insensitive, `-` and `_` alike), stdout empty or exactly
/// one JSON error object (required with `--json`).
fn assert_refused(args: &[&str], out: &Outcome, names: &[&str]) {
    let ctx = format!(
        "elm {}\n--- code {:?} timed_out {}\n--- stderr\n{}\n--- stdout\n{}",
        args.join(" ").chars().take(400).collect::<String>(),
        out.code,
        out.timed_out,
        out.stderr,
        out.stdout.chars().take(400).collect::<String>()
    );
    assert!(!out.timed_out, "runaway: {ctx}");
    assert!(
        matches!(out.code, Some(1) | Some(2)),
        "expected a refusal with exit 1 or 2: {ctx}"
    );
    assert!(!out.stderr.contains("panicked"), "panic: {ctx}");
    let norm = |t: &str| t.to_lowercase().replace('-', "_");
    let err = norm(&out.stderr);
    assert!(
        names
            .iter()
            .any(|n| err.contains(&norm(n.trim_start_matches("--")))),
        "message names none of {names:?}: {ctx}"
    );
    let stdout = out.stdout.trim();
    let json_asked = args.contains(&"--json");
    if json_asked || !stdout.is_empty() {
        let v: serde_json::Value = serde_json::from_str(stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {ctx}"));
        let e = &v["error"];
        assert!(
            e["kind"].is_string() && e["message"].is_string(),
            "not a JSON error: {ctx}"
        );
        assert!(e.get("file").is_some() && e.get("field").is_some(), "{ctx}");
    }
}

fn refused(args: &[&str], names: &[&str]) -> Outcome {
    let out = run(args);
    assert_refused(args, &out, names);
    out
}

/// The tiny HF model directory, as a CLI argument.
fn tiny_model() -> &'static str {
    s(&fixture().model)
}

// ------------------------------------------------------------------------ one test per case

#[test]
fn panic_start_layer_overflow_from_cli_and_from_elm_json() {
    let out = fresh("c");
    refused(
        &[
            "compress",
            "--model",
            tiny_model(),
            "--start",
            U64_MAX,
            "--num-replaced",
            "2",
            "--out",
            s(&out),
            "--json",
        ],
        &["start_layer"],
    );
    let ck = copy_ckpt("overflow");
    edit_json(
        &ck.join("elm.json"),
        &["elm", "start_layer"],
        serde_json::json!(u64::MAX),
    );
    refused(
        &[
            "generate",
            "--model",
            tiny_model(),
            "--elm",
            s(&ck),
            "--prompt",
            "w3 w4",
            "--max-new-tokens",
            "1",
        ],
        &["elm.json"],
    );
    let out = run(&[
        "generate",
        "--model",
        tiny_model(),
        "--elm",
        s(&ck),
        "--prompt",
        "w3",
        "--json",
    ]);
    assert!(out.stderr.contains("start_layer"), "{}", out.stderr);
}

#[test]
fn abort_anderson_history_and_broyden_memory_are_refused_with_the_bytes_needed() {
    for h in ["100000000", "1000000000000"] {
        let out = refused(
            &[
                "solve",
                "--problem",
                "linear",
                "--solver",
                "anderson",
                "--history",
                h,
            ],
            &["history"],
        );
        assert!(out.stderr.contains("bytes"), "{}", out.stderr);
    }
    for m in ["100000000", "1000000000000"] {
        let out = refused(
            &[
                "solve",
                "--problem",
                "linear",
                "--solver",
                "broyden",
                "--memory",
                m,
            ],
            &["memory"],
        );
        assert!(out.stderr.contains("bytes"), "{}", out.stderr);
    }
}

#[test]
fn abort_bench_prompt_len_past_the_context() {
    refused(
        &[
            "bench",
            "--model",
            tiny_model(),
            "--prompt-len",
            "100000000000",
        ],
        &["prompt_len", "context"],
    );
    refused(
        &[
            "bench",
            "--model",
            tiny_model(),
            "--prompt-len",
            "120",
            "--decode-steps",
            "20",
        ],
        &["context"],
    );
}

#[test]
fn runaway_solve_with_zero_tolerance_and_unbounded_iterations() {
    refused(
        &[
            "solve",
            "--problem",
            "linear",
            "--tol",
            "0",
            "--max-iter",
            U64_MAX,
        ],
        &["max_iter"],
    );
    refused(
        &["solve", "--problem", "linear", "--spectral-iters", U64_MAX],
        &["spectral_iters"],
    );
}

#[test]
fn runaway_generate_huge_batch_is_refused_with_the_bytes_needed() {
    let out = refused(
        &[
            "generate",
            "--model",
            tiny_model(),
            "--prompt",
            "w3",
            "--batch",
            "1000000000",
        ],
        &["--batch"],
    );
    assert!(out.stderr.contains("bytes"), "{}", out.stderr);
}

/// `logits` and `perplexity` (and `generate`) loaded the weights before refusing a prompt past
/// the context: a model whose weights cannot load at all shows the order. The refusal must be
/// about the prompt or the window, never about the weights.
#[test]
fn prompt_and_window_are_checked_before_the_weights_load() {
    let dir = fresh("no-weights");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(fixture().model.join(f), dir.join(f)).unwrap();
    }
    // Not safetensors at all: loading the weights fails.
    std::fs::write(dir.join("model.safetensors"), b"not weights").unwrap();
    let long: Vec<String> = (0..200).map(|i| format!("w{}", 3 + i % 60)).collect();
    let long = long.join(" ");
    let text = dir.join("text.txt");
    std::fs::write(&text, &long).unwrap();
    for args in [
        vec!["logits", "--model", s(&dir), "--prompt", &long],
        vec!["generate", "--model", s(&dir), "--prompt", &long],
        vec![
            "perplexity",
            "--model",
            s(&dir),
            "--file",
            s(&text),
            "--context",
            "4096",
        ],
    ] {
        let out = refused(&args, &["context"]);
        assert!(
            !out.stderr.contains("safetensors"),
            "{args:?}: the weights were read first: {}",
            out.stderr
        );
    }
    // Within the context, the weights are what is refused.
    let out = refused(
        &["logits", "--model", s(&dir), "--prompt", "w3 w4"],
        &["safetensors"],
    );
    assert!(!out.stderr.contains("context"), "{}", out.stderr);
}

#[test]
fn runaway_prompt_and_generation_past_the_context() {
    let long: Vec<String> = (0..200).map(|i| format!("w{}", 3 + i % 60)).collect();
    let long = long.join(" ");
    refused(
        &[
            "generate",
            "--model",
            tiny_model(),
            "--prompt",
            &long,
            "--max-new-tokens",
            "1",
        ],
        &["context"],
    );
    refused(
        &[
            "generate",
            "--model",
            tiny_model(),
            "--prompt",
            "w3 w4",
            "--max-new-tokens",
            "127",
        ],
        &["context"],
    );
    // Within the context it runs.
    let ok = run(&[
        "generate",
        "--model",
        tiny_model(),
        "--prompt",
        "w3 w4",
        "--max-new-tokens",
        "3",
        "--json",
    ]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    // The library refuses it too, for any decoder with a context.
    let cfg = ModelConfig::tiny(Arch::Llama);
    let t = elm::model::Transformer::new(ModelWeights::random(&cfg, 1)).unwrap();
    let sc = elm::model::generate::SamplingConfig {
        max_new_tokens: 200,
        ..Default::default()
    };
    let e = elm::model::generate::generate(&t, &[vec![3, 4]], &sc, None, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("context"), "{e}");
}

#[test]
fn silent_out_of_an_existing_run_is_refused_without_force() {
    // compress over an existing checkpoint.
    let ck = copy_ckpt("existing");
    let before = std::fs::read(ck.join("elm.json")).unwrap();
    refused(
        &[
            "compress",
            "--model",
            tiny_model(),
            "--start",
            "0",
            "--num-replaced",
            "1",
            "--out",
            s(&ck),
        ],
        &["--force", "out"],
    );
    assert_eq!(
        std::fs::read(ck.join("elm.json")).unwrap(),
        before,
        "existing run was replaced"
    );
    let ok = run(&[
        "compress",
        "--model",
        tiny_model(),
        "--start",
        "0",
        "--num-replaced",
        "1",
        "--out",
        s(&ck),
        "--force",
    ]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    // train over an existing directory without --resume.
    let run_dir = fresh("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    std::fs::write(run_dir.join("train_state.json"), "{}").unwrap();
    refused(
        &[
            "train",
            "--model",
            tiny_model(),
            "--start",
            "0",
            "--num-replaced",
            "1",
            "--out",
            s(&run_dir),
            "--eval-examples",
            "0",
            "--data",
            s(&fixture().data),
        ],
        &["--force", "--resume"],
    );
    assert_eq!(
        std::fs::read_to_string(run_dir.join("train_state.json")).unwrap(),
        "{}"
    );
}

#[test]
fn silent_eval_limit_zero_and_batch_zero() {
    refused(
        &["eval", "--model", tiny_model(), "--limit", "0", "--json"],
        &["limit"],
    );
    refused(
        &["eval", "--model", tiny_model(), "--batch", "0"],
        &["batch"],
    );
    refused(
        &[
            "generate",
            "--model",
            tiny_model(),
            "--prompt",
            "w3",
            "--batch",
            "0",
        ],
        &["batch"],
    );
}

#[test]
fn silent_generate_zero_new_tokens() {
    refused(
        &[
            "generate",
            "--model",
            tiny_model(),
            "--prompt",
            "w3",
            "--max-new-tokens",
            "0",
            "--json",
        ],
        &["max_new_tokens"],
    );
}

#[test]
fn silent_gsm8k_answer_without_the_marker() {
    let d = fresh("data");
    std::fs::create_dir_all(d.join("gsm8k")).unwrap();
    std::fs::write(
        d.join("gsm8k/test.jsonl"),
        "{\"question\": \"q\", \"answer\": \"it is 5\"}\n",
    )
    .unwrap();
    refused(
        &[
            "eval",
            "--model",
            tiny_model(),
            "--task",
            "gsm8k",
            "--data-dir",
            s(&d),
            "--limit",
            "1",
        ],
        &["####", "test.jsonl"],
    );
}

#[test]
fn unclear_gguf_config_error_names_the_file_and_the_key() {
    let mut bytes = std::fs::read(&fixture().gguf).unwrap();
    let key = b"llama.block_count";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("block_count key")
        + key.len();
    let ty = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let width = match ty {
        4 | 5 => 4,
        10 | 11 => 8,
        other => panic!("unexpected GGUF type {other}"),
    };
    bytes[at + 4..at + 4 + width].fill(0);
    let path = fresh("zero-layers").with_extension("gguf");
    std::fs::write(&path, bytes).unwrap();
    let out = refused(
        &[
            "compress",
            "--model",
            s(&path),
            "--start",
            "0",
            "--num-replaced",
            "1",
            "--out",
            s(&fresh("o")),
        ],
        &["block_count"],
    );
    assert!(out.stderr.contains(s(&path)), "{}", out.stderr);
}

#[test]
fn unclear_out_that_is_a_file() {
    let f = fresh("file");
    std::fs::write(&f, "x").unwrap();
    let out = refused(
        &[
            "compress",
            "--model",
            tiny_model(),
            "--start",
            "0",
            "--num-replaced",
            "1",
            "--out",
            s(&f),
            "--json",
        ],
        &["not a directory"],
    );
    assert!(!out.stderr.contains("os error 17"), "{}", out.stderr);
}

#[test]
fn unclear_wrong_typed_field_is_named_as_wrong_typed() {
    let ck = copy_ckpt("typed");
    edit_json(
        &ck.join("elm.json"),
        &["elm", "start_layer"],
        serde_json::json!("1"),
    );
    let out = refused(
        &[
            "generate",
            "--model",
            tiny_model(),
            "--elm",
            s(&ck),
            "--prompt",
            "w3",
            "--json",
        ],
        &["start_layer"],
    );
    assert!(
        out.stderr.contains("invalid type") && !out.stderr.contains("missing"),
        "{}",
        out.stderr
    );
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["error"]["field"], "start_layer");
    assert!(v["error"]["file"].as_str().unwrap().ends_with("elm.json"));
}

#[test]
fn unclear_tampered_hidden_size_names_elm_json_and_the_field() {
    let ck = copy_ckpt("hidden");
    edit_json(
        &ck.join("elm.json"),
        &["model_config", "hidden_size"],
        serde_json::json!(16),
    );
    let out = refused(
        &[
            "generate",
            "--model",
            tiny_model(),
            "--elm",
            s(&ck),
            "--prompt",
            "w3",
        ],
        &["hidden_size"],
    );
    assert!(
        out.stderr.contains("elm.json") && !out.stderr.contains("shape"),
        "{}",
        out.stderr
    );
}

#[test]
fn leftovers_of_a_killed_run_are_removed_on_resume() {
    let run_dir = fresh("resume");
    let data = s(&fixture().data);
    let args = [
        "train",
        "--model",
        tiny_model(),
        "--start",
        "1",
        "--num-replaced",
        "2",
        "--steps",
        "2",
        "--out",
        s(&run_dir),
        "--eval-examples",
        "0",
        "--data",
        data,
    ];
    let out = run(&args);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // What a SIGKILL during write_atomic leaves: unrenamed temporaries.
    let step = std::fs::read_dir(&run_dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("step-"))
        .unwrap()
        .path();
    let temps = [
        run_dir.join(".train_state.json.tmp4242-0"),
        run_dir.join(".module.safetensors.tmp4242-1"),
        step.join(".params.safetensors.tmp4242-2"),
    ];
    for t in &temps {
        std::fs::write(t, "partial").unwrap();
    }
    let out = run(&[
        "train",
        "--model",
        tiny_model(),
        "--out",
        s(&run_dir),
        "--resume",
        "--eval-examples",
        "0",
        "--data",
        data,
    ]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    for t in &temps {
        assert!(!t.exists(), "{} left after resume", t.display());
    }
    // A second new run into it is refused.
    refused(&args, &["--resume"]);
}

#[test]
fn json_errors_for_usage_errors_too() {
    let args = [
        "solve",
        "--problem",
        "linear",
        "--max-iter",
        "abc",
        "--json",
    ];
    let out = refused(&args, &["max_iter"]);
    assert_eq!(out.code, Some(2));
}

// ------------------------------------------------------------------------------ helpers

fn copy_ckpt(name: &str) -> PathBuf {
    let dst = fresh(name);
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["elm.json", "module.safetensors"] {
        std::fs::copy(fixture().ckpt.join(f), dst.join(f)).unwrap();
    }
    dst
}

fn edit_json(path: &Path, keys: &[&str], value: serde_json::Value) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut at = &mut v;
    for k in &keys[..keys.len() - 1] {
        at = &mut at[*k];
    }
    at[keys[keys.len() - 1]] = value;
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

// ---------------------------------------------------------------------------------- fuzz

/// One generated bad invocation: its arguments and the names its message may cite.
struct Case {
    args: Vec<String>,
    names: Vec<String>,
}

fn counts_bad() -> Vec<&'static str> {
    vec![
        "-1",
        "abc",
        "",
        "1.5",
        "18446744073709551616",
        "99999999999999999999999",
    ]
}
fn floats_bad() -> Vec<&'static str> {
    vec!["NaN", "inf", "-inf", "-1", "x"]
}

/// A random bad argument of a random subcommand.
fn arg_case(rng: &mut StdRng) -> Case {
    let f = fixture();
    let gen_base = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["generate", "--model", tiny_model(), "--prompt", "w3 w4"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let ck = s(&f.ckpt).to_string();
    let out = s(&fresh("fz")).to_string();
    let data = s(&f.data).to_string();
    let solve = |extra: &[&str]| -> Vec<String> {
        let mut v = vec!["solve".to_string(), "--problem".into(), "linear".into()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // (base args, flag, values that must be refused)
    let mut table: Vec<(Vec<String>, &str, Vec<&str>)> = vec![
        (
            solve(&[]),
            "--max-iter",
            [vec!["0", U64_MAX, "1000001"], counts_bad()].concat(),
        ),
        (
            solve(&["--solver", "anderson"]),
            "--history",
            [vec!["0", "1000000000000", U64_MAX], counts_bad()].concat(),
        ),
        (
            solve(&["--solver", "broyden"]),
            "--memory",
            [vec!["0", "10000000000", U64_MAX], counts_bad()].concat(),
        ),
        (solve(&[]), "--abs-tol", floats_bad()),
        (solve(&[]), "--rel-tol", floats_bad()),
        (solve(&["--solver", "anderson"]), "--lambda", floats_bad()),
        (solve(&[]), "--beta", vec!["NaN", "inf", "-1", "x"]),
        (
            solve(&[]),
            "--spectral-iters",
            [vec![U64_MAX, "1000001"], counts_bad()].concat(),
        ),
        (solve(&["--solver", "picard"]), "--history", vec!["3"]),
        (
            gen_base(&[]),
            "--batch",
            [vec!["0", "1000000000", U64_MAX], counts_bad()].concat(),
        ),
        (
            gen_base(&[]),
            "--max-new-tokens",
            [vec!["0", "127", "200", U64_MAX], counts_bad()].concat(),
        ),
        (gen_base(&[]), "--temperature", floats_bad()),
        (gen_base(&[]), "--device", vec!["gpu", "cuda:x", ""]),
        (gen_base(&[]), "--weights", vec!["q9", ""]),
        (
            gen_base(&["--elm", &ck]),
            "--max-iter",
            [vec!["0", U64_MAX], counts_bad()].concat(),
        ),
        (gen_base(&["--elm", &ck]), "--abs-tol", floats_bad()),
        (gen_base(&["--elm", &ck]), "--kv", vec!["two-step", ""]),
        (
            owned(&["bench", "--model", tiny_model()]),
            "--prompt-len",
            [vec!["0", "129", "100000000000", U64_MAX], counts_bad()].concat(),
        ),
        (
            owned(&["bench", "--model", tiny_model()]),
            "--decode-steps",
            [vec!["0", "1000", U64_MAX], counts_bad()].concat(),
        ),
        (
            owned(&["bench", "--model", tiny_model()]),
            "--kv-context",
            [vec!["0", "129", U64_MAX], counts_bad()].concat(),
        ),
        (
            owned(&[
                "compress",
                "--model",
                tiny_model(),
                "--out",
                &out,
                "--num-replaced",
                "1",
            ]),
            "--start",
            [vec!["4", "100", U64_MAX], counts_bad()].concat(),
        ),
        (
            owned(&[
                "compress",
                "--model",
                tiny_model(),
                "--out",
                &out,
                "--start",
                "0",
            ]),
            "--num-replaced",
            [vec!["0", "5", U64_MAX], counts_bad()].concat(),
        ),
        (
            owned(&[
                "compress",
                "--model",
                tiny_model(),
                "--out",
                &out,
                "--start",
                "0",
                "--num-replaced",
                "1",
            ]),
            "--fixed-iterations",
            [vec!["0", U64_MAX], counts_bad()].concat(),
        ),
        (
            owned(&["eval", "--model", tiny_model()]),
            "--limit",
            [vec!["0"], counts_bad()].concat(),
        ),
        (
            owned(&["eval", "--model", tiny_model()]),
            "--batch",
            [vec!["0"], counts_bad()].concat(),
        ),
        (
            owned(&["eval", "--model", tiny_model()]),
            "--max-iter",
            vec!["0", U64_MAX],
        ),
        (
            owned(&["eval", "--model", tiny_model()]),
            "--task",
            vec!["nope", ""],
        ),
        (
            owned(&["perplexity", "--model", tiny_model(), "--file", &data]),
            "--context",
            [vec!["0", "1", "129", U64_MAX], counts_bad()].concat(),
        ),
        (
            owned(&["eval", "--model", tiny_model()]),
            "--bootstrap",
            [vec!["0", "1000000000000", U64_MAX], counts_bad()].concat(),
        ),
        (
            owned(&["eval", "--model", tiny_model(), "--task", "humaneval"]),
            "--timeout",
            floats_bad(),
        ),
        (
            owned(&[
                "compress",
                "--model",
                tiny_model(),
                "--out",
                &out,
                "--start",
                "0",
                "--num-replaced",
                "1",
            ]),
            "--context",
            vec![U64_MAX, "-1", "x"],
        ),
        (
            owned(&[
                "train",
                "--model",
                tiny_model(),
                "--out",
                &out,
                "--num-replaced",
                "1",
                "--eval-examples",
                "0",
                "--data",
                &data,
            ]),
            "--start",
            vec!["4", U64_MAX, "-1"],
        ),
        (
            owned(&[
                "train",
                "--model",
                tiny_model(),
                "--out",
                &out,
                "--start",
                "0",
                "--num-replaced",
                "1",
                "--eval-examples",
                "0",
                "--data",
                &data,
            ]),
            "--steps",
            vec!["0", U64_MAX, "1000000000"],
        ),
    ];
    let (mut args, flag, values) = table.swap_remove(rng.gen_range(0..table.len()));
    let value = values[rng.gen_range(0..values.len())];
    // `--flag=value`: a detached `-1` would be read as an unknown flag, not as the value.
    args.push(format!("{flag}={value}"));
    let mut names = vec![flag.to_string()];
    // Context and budget errors name what the value drives.
    names.extend(
        [
            "context",
            "bytes",
            "start_layer",
            "num_replaced",
            "fixed_iterations",
            "max_iter",
        ]
        .map(String::from),
    );
    if flag == "--history" && args.contains(&"picard".to_string()) {
        names = vec!["history".into()];
    }
    Case { args, names }
}

/// A random mutation or truncation of a checkpoint, model or config file, and the command
/// that reads it.
fn file_case(rng: &mut StdRng) -> Case {
    let f = fixture();
    let bad_values = [
        serde_json::json!(u64::MAX),
        serde_json::json!(-1),
        serde_json::json!("x"),
        serde_json::json!(null),
        serde_json::json!(1.5),
        serde_json::json!([1]),
    ];
    let value = bad_values[rng.gen_range(0..bad_values.len())].clone();
    match rng.gen_range(0..6) {
        // elm.json: a layer index or model size made impossible.
        0 => {
            let ck = copy_ckpt("fz-meta");
            let keys: [&[&str]; 8] = [
                &["elm", "start_layer"],
                &["elm", "num_replaced"],
                &["model_config", "hidden_size"],
                &["model_config", "num_layers"],
                &["model_config", "num_heads"],
                &["model_config", "vocab_size"],
                &["model_config", "head_dim"],
                &["model_config", "max_position_embeddings"],
            ];
            let key = keys[rng.gen_range(0..keys.len())];
            edit_json(&ck.join("elm.json"), key, value);
            Case {
                args: owned_args(&[
                    "generate",
                    "--model",
                    tiny_model(),
                    "--elm",
                    s(&ck),
                    "--prompt",
                    "w3",
                    "--max-new-tokens",
                    "1",
                ]),
                names: vec!["elm.json".into(), key[1].into()],
            }
        }
        // elm.json or module.safetensors truncated.
        1 => {
            let ck = copy_ckpt("fz-trunc");
            let file = if rng.gen_bool(0.5) {
                "elm.json"
            } else {
                "module.safetensors"
            };
            let bytes = std::fs::read(ck.join(file)).unwrap();
            let keep = rng.gen_range(0..bytes.len() - 2);
            std::fs::write(ck.join(file), &bytes[..keep]).unwrap();
            Case {
                args: owned_args(&[
                    "generate",
                    "--model",
                    tiny_model(),
                    "--elm",
                    s(&ck),
                    "--prompt",
                    "w3",
                    "--max-new-tokens",
                    "1",
                ]),
                names: vec![file.into()],
            }
        }
        // GGUF truncated or a random header byte range zeroed.
        2 => {
            let mut bytes = std::fs::read(&f.gguf).unwrap();
            if rng.gen_bool(0.5) {
                bytes.truncate(rng.gen_range(0..bytes.len() - 1));
            } else {
                let at = rng.gen_range(0..256.min(bytes.len() - 8));
                bytes[at..at + 8].fill(0xff);
            }
            let path = fresh("fz").with_extension("gguf");
            std::fs::write(&path, bytes).unwrap();
            Case {
                args: owned_args(&[
                    "compress",
                    "--model",
                    s(&path),
                    "--start",
                    "0",
                    "--num-replaced",
                    "1",
                    "--out",
                    s(&fresh("o")),
                ]),
                names: vec![
                    path.file_name().unwrap().to_str().unwrap().into(),
                    "tensor".into(),
                    "key".into(),
                ],
            }
        }
        // HF config.json with an impossible size.
        3 => {
            let dir = fresh("fz-hf");
            std::fs::create_dir_all(&dir).unwrap();
            for e in std::fs::read_dir(&f.model).unwrap().flatten() {
                std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
            }
            let keys = [
                "num_hidden_layers",
                "hidden_size",
                "vocab_size",
                "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings",
                "head_dim",
            ];
            let key = keys[rng.gen_range(0..keys.len())];
            // 1.5 and null (= absent: a default applies) may be legal; 0 never is.
            let value = if value.as_f64() == Some(1.5) || value.is_null() {
                serde_json::json!(0)
            } else {
                value
            };
            edit_json(&dir.join("config.json"), &[key], value);
            Case {
                args: owned_args(&[
                    "compress",
                    "--model",
                    s(&dir),
                    "--start",
                    "0",
                    "--num-replaced",
                    "1",
                    "--out",
                    s(&fresh("o")),
                ]),
                names: vec!["config.json".into(), key.into(), "tensor".into()],
            }
        }
        // Training config with an impossible count.
        4 => {
            let keys = [
                "steps",
                "batch_size",
                "seq_len",
                "lr",
                "clip",
                "checkpoint_every",
            ];
            let key = keys[rng.gen_range(0..keys.len())];
            let value = match (key, value.as_u64()) {
                // A huge checkpoint cadence is legal (only at the end); make it wrong-typed.
                ("checkpoint_every", _) => serde_json::json!("x"),
                ("steps" | "batch_size" | "seq_len", _) if value.as_f64() == Some(1.5) => {
                    serde_json::json!(0)
                }
                ("lr" | "clip", _) if value.is_number() => serde_json::json!(-1.0),
                _ => value,
            };
            let path = fresh("fz-cfg").with_extension("json");
            // The optimiser's keys sit in its one config, under `optim`.
            let config = if elm::train::OPTIM_KEYS.contains(&key) {
                serde_json::json!({ "optim": { key: value } })
            } else {
                serde_json::json!({ key: value })
            };
            std::fs::write(&path, config.to_string()).unwrap();
            Case {
                args: owned_args(&[
                    "train",
                    "--model",
                    tiny_model(),
                    "--config",
                    s(&path),
                    "--start",
                    "0",
                    "--num-replaced",
                    "1",
                    "--out",
                    s(&fresh("o")),
                    "--eval-examples",
                    "0",
                    "--data",
                    s(&f.data),
                ]),
                names: vec![
                    key.into(),
                    path.file_name().unwrap().to_str().unwrap().into(),
                ],
            }
        }
        // Solver config JSON with an impossible history or memory.
        _ => {
            let (kind, key) = if rng.gen_bool(0.5) {
                ("anderson", "history")
            } else {
                ("broyden", "memory")
            };
            let value = if value.as_f64() == Some(1.5) {
                serde_json::json!(10_000_000_000u64)
            } else {
                value
            };
            let path = fresh("fz-solver").with_extension("json");
            std::fs::write(
                &path,
                serde_json::json!({ "kind": kind, key: value }).to_string(),
            )
            .unwrap();
            Case {
                args: owned_args(&["solve", "--problem", "tanh", "--config", s(&path)]),
                names: vec![
                    key.into(),
                    path.file_name().unwrap().to_str().unwrap().into(),
                ],
            }
        }
    }
}

fn owned_args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn fuzz_bad_arguments_and_mutated_files_are_refused_cleanly() {
    let seed: u64 = std::env::var("ELM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(17);
    let cases: usize = std::env::var("ELM_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let mut slowest = (0.0f64, String::new());
    for i in 0..cases {
        let mut case = if i % 3 == 2 {
            file_case(&mut rng)
        } else {
            arg_case(&mut rng)
        };
        if rng.gen_bool(0.5) {
            case.args.push("--json".into());
        }
        let args: Vec<&str> = case.args.iter().map(String::as_str).collect();
        let names: Vec<&str> = case.names.iter().map(String::as_str).collect();
        let t = Instant::now();
        let out = run(&args);
        assert_refused(&args, &out, &names);
        let secs = t.elapsed().as_secs_f64();
        // Refusals come before any real work: a slow one means the check came too late.
        assert!(
            secs < 10.0,
            "took {secs:.1}s to refuse: elm {}",
            args.join(" ")
        );
        if secs > slowest.0 {
            slowest = (secs, args.join(" "));
        }
    }
    eprintln!("slowest case {:.2}s: elm {}", slowest.0, slowest.1);
    eprintln!(
        "{cases} cases (seed {seed}) in {:.1}s",
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn memory_budget_can_be_lowered_and_reports_needed_vs_available() {
    // Anderson history 50 on the linear problem needs well over 1000 bytes.
    let out = Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(["solve", "--problem", "linear", "--history", "50", "--json"])
        .env("ELM_MEM_BUDGET", "1000")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "budget", "{v}");
    assert_eq!(v["error"]["field"], "history", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("needs") && msg.contains("1000 bytes"), "{msg}");
    // Within the default budget the same solve runs.
    let ok = run(&["solve", "--problem", "linear", "--history", "50"]);
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
}

#[test]
fn unknown_block_kind_is_refused_and_an_ffn_module_runs_from_the_cli() {
    let out = fresh("block");
    let base = [
        "compress",
        "--model",
        tiny_model(),
        "--start",
        "1",
        "--num-replaced",
        "2",
        "--no-injection",
        "--fixed-iterations",
        "1",
        "--out",
        s(&out),
        "--json",
    ];
    let bad: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--block", "attention"])
        .collect();
    refused(&bad, &["block", "attention"]);
    let good: Vec<&str> = base.iter().copied().chain(["--block", "ffn"]).collect();
    let o = run(&good);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let report: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(report["block"], "ffn", "{report}");
    // The FFN module holds no K/V: one-step keeps only the N − M kept layers' caches.
    let (kv, n) = (&report["kv"], 4.0);
    let ratio = kv["one_step_ratio"].as_f64().unwrap();
    assert!((ratio - (n - 2.0) / n).abs() < 1e-12, "{report}");
    let g = run(&[
        "generate",
        "--model",
        tiny_model(),
        "--elm",
        s(&out),
        "--prompt",
        "w3 w4",
        "--max-new-tokens",
        "2",
    ]);
    assert_eq!(g.code, Some(0), "{}", g.stderr);
}
