//! Interchange with the official ELM code (`elm::equilibrium::interchange`), against fixtures
//! made by the official code itself (tests/fixtures/gen/ref_official_elm.py; no PyTorch here):
//! - official -> ours: a tiny Qwen2 ELM trained-format checkpoint and LoRA, put through the
//!   official `convert_to_hf.py`; our import gives the official `Qwen2ELMForCausalLM`'s logits
//!   (within 1e-4) and greedy tokens, run as the official code runs it (M iterations, decoding
//!   stopped by its exit threshold, one-step KV);
//! - ours -> official: ELMs built here (Qwen2, and a tied Llama-family model written with zero
//!   q/k/v biases) exported byte for byte as committed, and the official class's logits and
//!   greedy tokens on those files equal ours;
//! - corrupted or mismatched files are typed errors naming the tensor or the key.

mod common;

use std::path::{Path, PathBuf};

use elm::equilibrium::infer::{ElmModel, ElmSession, InferenceConfig, KvMode};
use elm::equilibrium::interchange::is_official_dir;
use elm::equilibrium::{ElmConfig, ElmModule};
use elm::model::config::Arch;
use elm::solver::{SolverConfig, StopCriteria};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn fixture_dir(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/official_elm")
        .join(rel)
}

struct Reference {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    greedy: Vec<u32>,
}

fn reference(name: &str) -> (Reference, serde_json::Value) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir(name)).unwrap()).unwrap();
    let r = Reference {
        tokens: serde_json::from_value(v["tokens"].clone()).unwrap(),
        logits: serde_json::from_value(v["logits"].clone()).unwrap(),
        greedy: serde_json::from_value(v["greedy"].clone()).unwrap(),
    };
    (r, v)
}

/// The official inference: Picard from z⁰ = 0, `m` iterations, prefill never stopped early,
/// a decoded token stopped once its residual is below `threshold`, one-step KV.
fn official_settings(m: usize, threshold: f64) -> InferenceConfig {
    InferenceConfig {
        solver: SolverConfig::picard(),
        stop: StopCriteria::absolute(threshold, m),
        kv_mode: KvMode::OneStep,
        adaptive_prefill: false,
        ..InferenceConfig::default()
    }
}

fn check_against(model: &ElmModel, cfg: &InferenceConfig, r: &Reference, what: &str) {
    let mut s =
        ElmSession::new(model, cfg.clone(), 1, r.tokens.len() + r.greedy.len() + 1).unwrap();
    let logits = s.prefill_all_logits(0, &r.tokens).unwrap();
    assert_eq!(logits.nrows(), r.logits.len());
    let mut worst = 0f32;
    for (row, want) in logits.rows().into_iter().zip(&r.logits) {
        for (a, b) in row.iter().zip(want) {
            worst = worst.max((a - b).abs());
        }
    }
    println!("{what}: largest logit difference {worst:e}");
    assert!(worst < 1e-4, "{what}: logits differ by {worst}");
    let mut s =
        ElmSession::new(model, cfg.clone(), 1, r.tokens.len() + r.greedy.len() + 1).unwrap();
    let greedy = elm::equilibrium::decode::generate_greedy(
        &mut s,
        std::slice::from_ref(&r.tokens),
        r.greedy.len(),
        &[],
    )
    .unwrap();
    assert_eq!(greedy[0], r.greedy, "{what}: greedy tokens");
}

#[test]
fn official_checkpoint_imports_with_the_official_logits_and_tokens() {
    let dir = fixture_dir("integrated");
    assert!(is_official_dir(&dir));
    let (model, tok, settings) = ElmModel::import_official(&dir).unwrap();
    let (r, v) = reference("official_reference.json");
    let elm = model.elm_config().unwrap();
    assert_eq!(elm.start_layer as u64, v["start"].as_u64().unwrap());
    assert_eq!(elm.num_replaced as u64, v["num_replaced"].as_u64().unwrap());
    assert_eq!(settings.max_iters as u64, v["max_iters"].as_u64().unwrap());
    assert_eq!(
        settings.exit_threshold,
        v["exit_threshold"].as_f64().unwrap()
    );
    assert!(tok.is_some(), "the converter copies the base tokenizer");
    let cfg = official_settings(settings.max_iters, settings.exit_threshold);
    check_against(&model, &cfg, &r, "official -> ours");
}

/// An ELM built here: seeded dense weights, the paper's init from layer `start`, then every
/// module matrix moved (as training would) so that no part of the export is an identity.
fn built_here(arch: Arch) -> ElmModel {
    let dense = common::tiny_weights(arch, 6, 11);
    let cfg = ElmConfig::new(2, 3);
    let mut module = ElmModule::init(&dense, &cfg).unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let p = module.projection.as_mut().unwrap();
    p.w_z.mapv_inplace(|x| x + rng.gen_range(-0.05..0.05));
    p.w_h.mapv_inplace(|x| x + rng.gen_range(-0.05..0.05));
    p.bias.mapv_inplace(|_| rng.gen_range(-0.1..0.1));
    ElmModel::new(dense, cfg, module).unwrap()
}

fn exported(arch: Arch, dir: &Path) {
    built_here(arch).export_official(None, 1.0, dir).unwrap();
}

const ARCHS: [(Arch, &str); 2] = [(Arch::Qwen2, "qwen2"), (Arch::Llama, "llama")];

#[test]
fn export_is_the_committed_file_and_the_official_code_reads_what_we_run() {
    for (arch, name) in ARCHS {
        let tmp = common::TempDir::new(&format!("export-{name}"));
        exported(arch, tmp.path());
        let committed = fixture_dir(&format!("exported_{name}"));
        for file in ["model.safetensors", "config.json"] {
            let ours = std::fs::read(tmp.path().join(file)).unwrap();
            let theirs = std::fs::read(committed.join(file)).unwrap();
            assert!(
                ours == theirs,
                "{name}: {file} differs from the committed export"
            );
        }
        let (r, _) = reference(&format!("exported_{name}_reference.json"));
        let model = built_here(arch);
        check_against(
            &model,
            &official_settings(3, 1.0),
            &r,
            &format!("ours ({name}) -> official"),
        );
        // And our importer reads our export back to the same model.
        let (back, _, settings) = ElmModel::import_official(tmp.path()).unwrap();
        assert_eq!(settings.max_iters, 3);
        check_against(
            &back,
            &official_settings(3, 1.0),
            &r,
            &format!("{name} round trip"),
        );
    }
}

/// Writes the committed export fixtures (then run tests/fixtures/gen/ref_official_elm.py --check-export).
#[test]
#[ignore]
fn write_export_fixtures() {
    for (arch, name) in ARCHS {
        exported(arch, &fixture_dir(&format!("exported_{name}")));
    }
}

fn copy_fixture(name: &str) -> common::TempDir {
    let tmp = common::TempDir::new(name);
    for e in std::fs::read_dir(fixture_dir("integrated")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    tmp
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

fn import_err(dir: &Path) -> String {
    match ElmModel::import_official(dir) {
        Ok(_) => panic!("{} imported", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn corrupted_or_mismatched_files_are_typed_errors_naming_the_culprit() {
    // A window past the model's end.
    let d = copy_fixture("bad-window");
    edit_config(d.path(), |v| v["fixed_point_layer_interval_len"] = 9.into());
    let e = import_err(d.path());
    assert!(e.contains("config.json"), "{e}");
    // A physical layer count that does not match N − M + 1: the block's proj is then at the
    // wrong index and a tensor is named.
    let d = copy_fixture("bad-start");
    edit_config(d.path(), |v| v["fixed_point_layer_idx"] = 1.into());
    let e = import_err(d.path());
    assert!(e.contains("model.layers."), "{e}");
    // Fewer physical layers than the config implies.
    let d = copy_fixture("bad-len");
    edit_config(d.path(), |v| v["fixed_point_layer_interval_len"] = 2.into());
    let e = import_err(d.path());
    assert!(e.contains("model.layers.5"), "{e}");
    // A key that changes the math.
    let d = copy_fixture("bad-key");
    edit_config(d.path(), |v| v["use_sliding_window"] = true.into());
    let e = import_err(d.path());
    assert!(e.contains("use_sliding_window"), "{e}");
    // The threshold must be a number.
    let d = copy_fixture("bad-threshold");
    edit_config(d.path(), |v| v["fixed_point_exit_threshold"] = "x".into());
    let e = import_err(d.path());
    assert!(e.contains("fixed_point_exit_threshold"), "{e}");
    // Not an official directory at all (a plain HF model): no fixed-point key.
    let plain = common::fixture("io/hf_tiny_qwen2");
    assert!(!is_official_dir(&plain));
    let e = import_err(&plain);
    assert!(e.contains("fixed_point_layer_idx"), "{e}");
    // A truncated safetensors file.
    let d = copy_fixture("truncated");
    let st = d.path().join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    let e = import_err(d.path());
    assert!(e.contains("model.safetensors"), "{e}");
    // A tensor of the wrong shape: proj made square.
    let d = copy_fixture("bad-shape");
    let tmp_model = built_here(Arch::Qwen2);
    let tmp = common::TempDir::new("bad-shape-src");
    tmp_model.export_official(None, 1.0, tmp.path()).unwrap();
    std::fs::copy(
        tmp.path().join("model.safetensors"),
        d.path().join("model.safetensors"),
    )
    .unwrap();
    let e = import_err(d.path());
    assert!(e.contains("model."), "{e}");
}

fn elm_cli(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The CLI: `--elm` takes an official directory as it is (here `elm eval`), and
/// `elm export-official` writes one from a checkpoint `elm compress` made, which `--elm` reads.
#[test]
fn cli_reads_official_directories_and_exports_checkpoints() {
    let official = fixture_dir("integrated");
    let s = |p: &Path| p.display().to_string();
    let (ok, out, err) = elm_cli(&[
        "eval",
        "--model",
        "unused-for-an-official-directory",
        "--elm",
        &s(&official),
        "--task",
        "gsm8k-nll",
        "--limit",
        "2",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(
        v["metrics"]["answer_nll"]["estimate"]["value"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // The spectral radius of the imported map (only the layers before the window run).
    let (ok, out, err) = elm_cli(&[
        "spectral",
        "--model",
        "unused-for-an-official-directory",
        "--elm",
        &s(&official),
        "--limit",
        "1",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let rho = v["mean_radius"].as_f64().unwrap();
    assert!(rho.is_finite() && rho > 0.0, "{v}");

    // The tiny Qwen2 HF model with a tokenizer beside it whose ids its 64 embedding rows cover
    // (the official fixture's has 285: a model that is refused, issue 59).
    let ck = common::TempDir::new("cli-ck");
    let tiny = ck.path().join("tiny");
    std::fs::create_dir_all(&tiny).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(
            common::fixture("io/hf_tiny_qwen2").join(file),
            tiny.join(file),
        )
        .unwrap();
    }
    std::fs::write(tiny.join("tokenizer.json"), common::word_tokenizer_json()).unwrap();
    let (ok, _, err) = elm_cli(&[
        "compress",
        "--model",
        &s(&tiny),
        "--start",
        "0",
        "--num-replaced",
        "1",
        "--out",
        &s(&ck.path().join("elm")),
    ]);
    assert!(ok, "{err}");
    let out_dir = ck.path().join("official");
    let (ok, out, err) = elm_cli(&[
        "export-official",
        "--model",
        &s(&tiny),
        "--elm",
        &s(&ck.path().join("elm")),
        "--out",
        &s(&out_dir),
        "--json",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("\"fixed_point_layer_idx\":0"), "{out}");
    assert!(is_official_dir(&out_dir));
    let (model, _, settings) = ElmModel::import_official(&out_dir).unwrap();
    assert_eq!(settings.max_iters, 1);
    assert_eq!(model.elm_config().unwrap().num_replaced, 1);
    // An imported model cannot be trained further (its teacher layers are not in the file),
    // and it is not a dense model either: both refusals say what to do instead.
    let (ok, out, _) = elm_cli(&[
        "train",
        "--model",
        &s(&tiny),
        "--elm",
        &s(&official),
        "--out",
        &s(&ck.path().join("train")),
        "--steps",
        "1",
        "--json",
    ]);
    assert!(!ok && out.contains("cannot be trained further"), "{out}");
    let (ok, out, _) = elm_cli(&["eval", "--model", &s(&official), "--limit", "1", "--json"]);
    assert!(!ok && out.contains("give it as --elm"), "{out}");
    // A dense model has nothing to export.
    let (ok, out, _) = elm_cli(&[
        "export-official",
        "--model",
        &s(&tiny),
        "--elm",
        &s(&tiny),
        "--out",
        &s(&ck.path().join("dense")),
        "--json",
    ]);
    assert!(!ok, "{out}");
}
