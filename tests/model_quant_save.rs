//! Deployable quantized GGUFs (`elm::equilibrium::quant_gguf`, `elm quantize`): save → load round
//! trips keep every block byte-for-byte and every logit, for dense models and ELMs (with and
//! without the input projection, Llama's permuted Q/K included); an f32 HF model quantized on
//! the fly saves and loads to the in-memory quantization; corrupt, truncated and incomplete
//! files are typed errors; on the real SmolLM2 checkpoint a compressed ELM saved quantized is
//! smaller than the model and decodes the same greedy tokens.

mod common;

use common::{word_tokenizer_json as tokenizer_json, TempDir};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use elm::equilibrium::infer::{ElmDecoder, ElmModel, ElmSession, InferenceConfig, QuantElm};
use elm::equilibrium::{BlockKind, ElmConfig, ElmModule, ModuleBlock};
use elm::error::ElmError;
use elm::formats::gguf::{kv, write_gguf, GgufFile, GgufTensorData};
use elm::formats::tokenizer::Tokenizer;
use elm::model::generate::{generate, SamplingConfig};
use elm::model::QLayer;
use elm::model::{
    load_inference, Arch, ModelConfig, ModelWeights, QuantWeights, WeightStorage, WriteFormat,
};
use elm::quant::Linear;
use elm::solver::{SolverConfig, StopCriteria};
use ndarray::Array2;

/// GGUF metadata as written.
type Meta = Vec<(String, elm::formats::gguf::GgufValue)>;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A path in `dir` no earlier call returned (round trips in a loop each keep their file).
fn fresh(dir: &Path, name: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{n}-{name}"))
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_json_parts(&tokenizer_json(), None, Path::new("tokenizer.json")).unwrap()
}

/// The tiny config with whole 32-blocks in every row (GGUF stores blocks only for those).
fn whole_block_config(arch: Arch) -> ModelConfig {
    ModelConfig {
        intermediate_size: 64,
        ..common::tiny_config(arch, 5)
    }
}

fn icfg() -> InferenceConfig {
    // Picard with a fixed iteration count: every run does the same evaluations.
    InferenceConfig::new(SolverConfig::picard(), StopCriteria::absolute(0.0, 5))
}

/// Prefill + three decode steps: the logits of each call.
fn run(m: &ElmModel) -> Vec<Array2<f32>> {
    let prompt = vec![vec![3u32, 9, 27, 1, 4]];
    let mut s = ElmSession::new(m, icfg(), 1, 16).unwrap();
    let mut out = vec![s.prefill(&prompt).unwrap()];
    for t in [5u32, 7, 2] {
        out.push(s.decode_step(&[t]).unwrap());
    }
    out
}

/// Teacher-forced logits of every position (the NLL / perplexity / eval path).
fn scored(m: &ElmModel) -> Array2<f32> {
    let tokens = vec![vec![3u32, 9, 27, 1, 4, 8, 8]];
    let mut s = ElmSession::new(m, icfg(), 1, 16).unwrap();
    let h = s.teacher_forced_hidden(&tokens).unwrap();
    s.logits_of_hidden(h.index_axis(ndarray::Axis(0), 0))
}

fn assert_same_logits(a: &ElmModel, b: &ElmModel, what: &str) {
    for (x, y) in run(a).iter().zip(run(b)) {
        assert_eq!(x, &y, "{what}: logits differ");
    }
    assert_eq!(scored(a), scored(b), "{what}: teacher-forced logits differ");
}

fn same_linear(a: &Linear, b: &Linear, what: &str) {
    match (a, b) {
        (Linear::Quant(x), Linear::Quant(y)) => assert_eq!(x, y, "{what}: blocks differ"),
        (Linear::F32(x), Linear::F32(y)) => assert_eq!(x, y, "{what}: f32 differs"),
        _ => panic!("{what}: storage {} vs {}", a.format_name(), b.format_name()),
    }
}

fn same_layer(a: &QLayer, b: &QLayer, what: &str) {
    assert_eq!(a.attn_norm, b.attn_norm, "{what}.attn_norm");
    assert_eq!(a.mlp_norm, b.mlp_norm, "{what}.mlp_norm");
    assert_eq!(
        (&a.bq, &a.bk, &a.bv),
        (&b.bq, &b.bk, &b.bv),
        "{what}.biases"
    );
    for (n, x, y) in [
        ("wq", &a.wq, &b.wq),
        ("wk", &a.wk, &b.wk),
        ("wv", &a.wv, &b.wv),
        ("wo", &a.wo, &b.wo),
        ("w_gate", &a.w_gate, &b.w_gate),
        ("w_up", &a.w_up, &b.w_up),
        ("w_down", &a.w_down, &b.w_down),
    ] {
        same_linear(x, y, &format!("{what}.{n}"));
    }
}

fn same_quant(a: &QuantElm, b: &QuantElm) {
    assert_eq!(a.dense.config, b.dense.config);
    same_linear(&a.dense.embed, &b.dense.embed, "embed");
    assert_eq!(a.dense.final_norm, b.dense.final_norm);
    match (&a.dense.lm_head, &b.dense.lm_head) {
        (Some(x), Some(y)) => same_linear(x, y, "lm_head"),
        (None, None) => {}
        _ => panic!("lm_head presence differs"),
    }
    assert_eq!(a.dense.layers.len(), b.dense.layers.len());
    for (i, (x, y)) in a.dense.layers.iter().zip(&b.dense.layers).enumerate() {
        same_layer(x, y, &format!("layer slot {i}"));
    }
    match (&a.module, &b.module) {
        (None, None) => {}
        (Some(x), Some(y)) => {
            match (&x.block, &y.block) {
                (ModuleBlock::Decoder(a), ModuleBlock::Decoder(b)) => {
                    same_layer(a, b, "module.block")
                }
                (ModuleBlock::Ffn(a), ModuleBlock::Ffn(b)) => {
                    assert_eq!(a.mlp_norm, b.mlp_norm, "module.block.mlp_norm");
                    same_linear(&a.w_gate, &b.w_gate, "module.block.w_gate");
                    same_linear(&a.w_up, &b.w_up, "module.block.w_up");
                    same_linear(&a.w_down, &b.w_down, "module.block.w_down");
                }
                _ => panic!("module block kinds differ"),
            }
            match (&x.projection, &y.projection) {
                (None, None) => {}
                (Some(p), Some(q)) => {
                    same_linear(&p.w_z, &q.w_z, "w_z");
                    same_linear(&p.w_h, &q.w_h, "w_h");
                    assert_eq!(p.bias, q.bias);
                }
                _ => panic!("projection presence differs"),
            }
        }
        _ => panic!("module presence differs"),
    }
}

/// Saves `m`, loads it back, and checks blocks and logits are identical.
fn round_trip(m: &ElmModel, what: &str, dir: &Path) -> PathBuf {
    let path = fresh(dir, "model.gguf");
    let bytes = m.save_quant_gguf(&path, &tokenizer()).unwrap();
    assert!(bytes > 0);
    let (back, tok) = ElmModel::load_quant_gguf(&path).unwrap();
    assert_eq!(tok.encode("w3 w9 w27", false).unwrap(), vec![3, 9, 27]);
    assert_eq!(back.kept_layers(), m.kept_layers(), "{what}");
    assert_eq!(back.elm_config(), m.elm_config(), "{what}: ELM config");
    same_quant(m.quant_weights().unwrap(), back.quant_weights().unwrap());
    assert_eq!(back.weight_bytes(), m.weight_bytes(), "{what}");
    assert_same_logits(m, &back, what);
    path
}

#[test]
fn save_load_round_trip_is_exact_for_dense_and_elm() {
    let tmp = TempDir::new("qsave-round-trip");
    for arch in [Arch::Llama, Arch::Qwen2] {
        let cfg = whole_block_config(arch);
        let w = ModelWeights::random(&cfg, 3);
        for format in WriteFormat::ALL {
            let what = format!("{arch:?} {format:?}");
            // Dense: an ordinary GGUF the dense loader reads too.
            let dense =
                ElmModel::quantized(QuantWeights::quantize(&w, format), None, None).unwrap();
            let path = round_trip(&dense, &format!("{what} dense"), &tmp);
            let (plain, _) = load_inference(&path, WeightStorage::Auto).unwrap();
            same_quant(
                dense.quant_weights().unwrap(),
                &QuantElm {
                    dense: plain,
                    module: None,
                },
            );
            // ELM with projection, and the no-injection (looped) variant.
            let ec = ElmConfig::new(1, 3);
            let module = ElmModule::init(&w, &ec).unwrap();
            let m = ElmModel::quantized(
                QuantWeights::quantize(&w, format),
                Some((ec, &module)),
                None,
            )
            .unwrap();
            assert!(m
                .quant_weights()
                .unwrap()
                .module
                .as_ref()
                .unwrap()
                .projection
                .is_some());
            let path = round_trip(&m, &format!("{what} elm"), &tmp);
            // A dense loader refuses the ELM file, naming the metadata.
            let e = match load_inference(&path, WeightStorage::Auto) {
                Ok(_) => panic!("the dense loader read an ELM file"),
                Err(e) => e.to_string(),
            };
            assert!(e.contains("elm.config") && e.contains("--elm"), "{e}");
            let mut looped = ElmConfig::new(2, 2);
            looped.injection = false;
            looped.fixed_iterations = Some(3);
            let lm = ElmModule::init(&w, &looped).unwrap();
            let m = ElmModel::quantized(
                QuantWeights::quantize(&w, format),
                Some((looped, &lm)),
                None,
            )
            .unwrap();
            round_trip(&m, &format!("{what} looped"), &tmp);
            // LLM-Streamline's FFN block: only the block's ffn_* tensors are written.
            let mut ffn = ElmConfig::new(1, 3);
            ffn.injection = false;
            ffn.fixed_iterations = Some(1);
            ffn.block = BlockKind::Ffn;
            let fm = ElmModule::init(&w, &ffn).unwrap();
            let m = ElmModel::quantized(QuantWeights::quantize(&w, format), Some((ffn, &fm)), None)
                .unwrap();
            let path = round_trip(&m, &format!("{what} ffn"), &tmp);
            let names: Vec<String> = GgufFile::open(&path)
                .unwrap()
                .tensors()
                .iter()
                .map(|t| t.name.clone())
                .filter(|n| n.starts_with("elm.blk."))
                .collect();
            assert_eq!(
                names,
                [
                    "ffn_norm.weight",
                    "ffn_gate.weight",
                    "ffn_up.weight",
                    "ffn_down.weight"
                ]
                .map(|n| format!("elm.blk.{n}")),
                "{what}"
            );
        }
        // Mixed storage: f32 matrices next to blocks (the module kept f32) round-trip too.
        let ec = ElmConfig::new(0, 2);
        let module = ElmModule::init(&w, &ec).unwrap();
        let mut qw = QuantWeights::quantize(&w, WriteFormat::Q4_1);
        qw.embed = Linear::F32(w.embed.clone());
        let m = ElmModel::quantized(qw, Some((ec, &module)), None).unwrap();
        round_trip(&m, &format!("{arch:?} mixed"), &tmp);
    }
}

#[test]
fn f32_model_quantized_on_the_fly_saves_like_in_memory() {
    let tmp = TempDir::new("qsave-on-the-fly");
    for arch in [Arch::Llama, Arch::Qwen2] {
        let cfg = whole_block_config(arch);
        let w = ModelWeights::random(&cfg, 9);
        let dir = fresh(&tmp, "hf");
        elm::formats::save_hf_model(&w, &dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).unwrap();
        let ec = ElmConfig::new(1, 2);
        let module = ElmModule::init(&w, &ec).unwrap();
        let ckpt = fresh(&tmp, "ckpt");
        let meta = elm::equilibrium::ModuleMeta {
            format: elm::equilibrium::module::MODULE_FORMAT.into(),
            elm: ec.clone(),
            model_config: cfg.clone(),
            base_model: dir.display().to_string(),
            heal: None,
        };
        elm::equilibrium::save_module(&ckpt, &module, &meta).unwrap();
        for format in [WriteFormat::Q8_0, WriteFormat::Q4_1] {
            let storage = WeightStorage::Quant(format);
            let (loaded, tok) = ElmModel::load_with(&dir, Some(&ckpt), storage).unwrap();
            let path = fresh(&tmp, "fly.gguf");
            loaded.save_quant_gguf(&path, &tok).unwrap();
            let (back, _) = ElmModel::load_quant_gguf(&path).unwrap();
            // In memory: the same f32 weights quantized directly.
            let want = ElmModel::quantized(
                QuantWeights::quantize(&w, format),
                Some((ec.clone(), &module)),
                None,
            )
            .unwrap();
            same_quant(want.quant_weights().unwrap(), back.quant_weights().unwrap());
            assert_same_logits(&want, &back, &format!("{arch:?} {format:?}"));
            // `--elm FILE` through the generic loaders gives the same model.
            let (via, _) =
                ElmModel::load_with(Path::new("unused"), Some(&path), WeightStorage::Auto).unwrap();
            assert_same_logits(&want, &via, "load_with(--elm FILE)");
            // Loading as another block format re-quantizes every matrix.
            let (q8, _) =
                ElmModel::load_quant_gguf_with(&path, WeightStorage::Quant(WriteFormat::Q8_0))
                    .unwrap();
            let q = q8.quant_weights().unwrap();
            assert_eq!(q.dense.embed.format_name(), "q8_0");
        }
    }
}

fn load_err(p: &Path) -> ElmError {
    match ElmModel::load_quant_gguf(p) {
        Ok(_) => panic!("{} loaded", p.display()),
        Err(e) => e,
    }
}

fn assert_kind(e: &ElmError, kind: &str, needle: &str) {
    let msg = e.to_string();
    assert_eq!(e.kind(), kind, "{msg}");
    assert!(msg.contains(needle), "`{needle}` not in: {msg}");
}

#[test]
fn corrupt_truncated_and_incomplete_files_are_typed_errors() {
    let tmp = TempDir::new("qsave-corrupt");
    let cfg = whole_block_config(Arch::Qwen2);
    let w = ModelWeights::random(&cfg, 4);
    let ec = ElmConfig::new(1, 2);
    let module = ElmModule::init(&w, &ec).unwrap();
    let m = ElmModel::quantized(
        QuantWeights::quantize(&w, WriteFormat::Q4_0),
        Some((ec, &module)),
        None,
    )
    .unwrap();
    let good = fresh(&tmp, "good.gguf");
    m.save_quant_gguf(&good, &tokenizer()).unwrap();
    let bytes = std::fs::read(&good).unwrap();

    // Truncated: the tensor data runs past the end.
    let cut = fresh(&tmp, "cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let e = load_err(&cut);
    assert_kind(&e, "format", &cut.display().to_string());
    // Not a GGUF at all.
    let bad = fresh(&tmp, "bad.gguf");
    let mut b = bytes.clone();
    b[..4].copy_from_slice(b"NOPE");
    std::fs::write(&bad, &b).unwrap();
    assert_kind(&load_err(&bad), "format", "magic");

    // Rewrite the file with edited metadata / tensors.
    let g = GgufFile::open(&good).unwrap();
    let tensors: Vec<GgufTensorData> = g.tensor_data().unwrap();
    let meta = g.metadata().to_vec();
    let rewrite =
        |name: &str, edit_meta: &dyn Fn(&mut Meta), edit_t: &dyn Fn(&mut Vec<GgufTensorData>)| {
            let (mut m2, mut t2) = (meta.clone(), tensors.clone());
            edit_meta(&mut m2);
            edit_t(&mut t2);
            let p = fresh(&tmp, name);
            write_gguf(&p, &m2, &t2).unwrap();
            p
        };
    let none_m = |_: &mut Meta| {};
    let none_t = |_: &mut Vec<GgufTensorData>| {};
    // The unedited rewrite loads (the helper itself is sound).
    ElmModel::load_quant_gguf(&rewrite("same.gguf", &none_m, &none_t)).unwrap();

    let p = rewrite("missing.gguf", &none_m, &|t| {
        t.retain(|x| x.name != "elm.blk.ffn_up.weight")
    });
    let e = load_err(&p);
    assert_kind(&e, "tensor", "elm.blk.ffn_up.weight");
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");

    let p = rewrite("missing-proj.gguf", &none_m, &|t| {
        t.retain(|x| x.name != "elm.proj_z.weight")
    });
    assert_kind(&load_err(&p), "tensor", "elm.proj_z.weight");

    let p = rewrite("replaced-layer.gguf", &none_m, &|t| {
        let mut extra = t
            .iter()
            .find(|x| x.name == "blk.0.ffn_norm.weight")
            .unwrap()
            .clone();
        extra.name = "blk.1.ffn_norm.weight".into();
        t.push(extra);
    });
    assert_kind(&load_err(&p), "tensor", "blk.1.ffn_norm.weight");

    let p = rewrite(
        "bad-format.gguf",
        &|m| {
            for (k, v) in m.iter_mut() {
                if k == "elm.format" {
                    *v = elm::formats::gguf::GgufValue::String("elm-quant-v0".into());
                }
            }
        },
        &none_t,
    );
    assert_kind(&load_err(&p), "format", "elm.format");

    let p = rewrite(
        "no-format.gguf",
        &|m| m.retain(|(k, _)| k != "elm.format"),
        &none_t,
    );
    assert_kind(&load_err(&p), "format", "elm.format");

    let p = rewrite(
        "bad-config.gguf",
        &|m| {
            for (k, v) in m.iter_mut() {
                if k == "elm.config" {
                    *v = elm::formats::gguf::GgufValue::String(
                        r#"{"start_layer": 4, "num_replaced": 3}"#.into(),
                    );
                }
            }
        },
        &none_t,
    );
    let e = load_err(&p);
    assert!(e.to_string().contains("start_layer"), "{e}");
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");

    let p = rewrite(
        "bad-json.gguf",
        &|m| {
            m.retain(|(k, _)| k != "elm.model_config");
            m.push(kv(
                "elm.model_config",
                elm::formats::gguf::GgufValue::String("{not json".into()),
            ));
        },
        &none_t,
    );
    assert_kind(&load_err(&p), "format", "elm.model_config");

    // A wrong-shaped module matrix.
    let p = rewrite("shape.gguf", &none_m, &|t| {
        let x = t
            .iter_mut()
            .find(|x| x.name == "elm.proj_h.weight")
            .unwrap();
        x.shape = vec![x.shape[1] / 2, x.shape[0] * 2];
    });
    assert_kind(&load_err(&p), "tensor", "elm.proj_h.weight");
}

#[test]
fn cli_quantize_refuses_existing_out_and_generate_loads_the_file() {
    let tmp = TempDir::new("qsave-cli");
    let cfg = whole_block_config(Arch::Llama);
    let w = ModelWeights::random(&cfg, 21);
    let dir = fresh(&tmp, "cli-hf");
    elm::formats::save_hf_model(&w, &dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).unwrap();
    let ckpt = fresh(&tmp, "cli-ckpt");
    let ec = ElmConfig::new(1, 2);
    let meta = elm::equilibrium::ModuleMeta {
        format: elm::equilibrium::module::MODULE_FORMAT.into(),
        elm: ec.clone(),
        model_config: cfg.clone(),
        base_model: dir.display().to_string(),
        heal: None,
    };
    elm::equilibrium::save_module(&ckpt, &ElmModule::init(&w, &ec).unwrap(), &meta).unwrap();
    let out = fresh(&tmp, "cli.gguf");
    let elm_bin = env!("CARGO_BIN_EXE_elm");
    let quantize = |force: bool| {
        let mut c = std::process::Command::new(elm_bin);
        c.args(["quantize", "--model"])
            .arg(&dir)
            .arg("--elm")
            .arg(&ckpt)
            .args(["--format", "q8_0", "--json", "--out"])
            .arg(&out);
        if force {
            c.arg("--force");
        }
        c.output().unwrap()
    };
    let o = quantize(false);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["bytes"].as_u64().unwrap(),
        std::fs::metadata(&out).unwrap().len()
    );
    assert_eq!(v["matrices"]["q8_0"].as_u64().unwrap(), 1 + 7 * 4 + 2);
    let o = quantize(false);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stdout);
    assert!(err.contains("--force"), "{err}");
    assert!(quantize(true).status.success());
    let o = std::process::Command::new(elm_bin)
        .args([
            "generate",
            "--weights",
            "auto",
            "--prompt",
            "w3 w9",
            "--max-new-tokens",
            "3",
        ])
        .args(["--solver", "picard", "--json", "--elm"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("tokens") || text.contains("text"), "{text}");
}

#[test]
fn real_checkpoint_elm_saves_smaller_and_decodes_the_same_tokens() {
    let Some(path) = common::real_model() else {
        return;
    };
    let (f32w, tok) = elm::model::load_pretrained(&path).unwrap();
    let f32_bytes = f32w.num_params() * 4;
    // `elm compress --start 12 --num-replaced 8`.
    let ec = ElmConfig::new(12, 8);
    let module = ElmModule::init(&f32w, &ec).unwrap();
    drop(f32w);
    let (qw, _) = load_inference(&path, WeightStorage::Auto).unwrap();
    let mem = ElmModel::quantized(qw, Some((ec, &module)), None).unwrap();
    let tmp = TempDir::new("qsave-smollm2");
    let out = tmp.join("smollm2-elm.gguf");
    let bytes = mem.save_quant_gguf(&out, &tok).unwrap();
    let dense_gguf = std::fs::metadata(&path).unwrap().len();
    eprintln!(
        "f32 model {f32_bytes} bytes, dense Q4_1 GGUF {dense_gguf} bytes, saved quantized ELM \
         GGUF {bytes} bytes"
    );
    assert!(
        (bytes as usize) < f32_bytes / 4,
        "{bytes} vs f32 {f32_bytes}"
    );
    assert!(bytes < dense_gguf, "{bytes} vs dense GGUF {dense_gguf}");
    let (back, tok2) = ElmModel::load_quant_gguf(&out).unwrap();
    same_quant(mem.quant_weights().unwrap(), back.quant_weights().unwrap());
    let prompt = tok
        .encode(
            &tok.apply_chat_template(&[("user", "What is 2+2?")], true),
            false,
        )
        .unwrap();
    assert_eq!(
        tok2.encode(
            &tok2.apply_chat_template(&[("user", "What is 2+2?")], true),
            false
        )
        .unwrap(),
        prompt,
        "the embedded tokenizer encodes like the GGUF one"
    );
    let cfg = SamplingConfig {
        max_new_tokens: 8,
        ..SamplingConfig::default()
    };
    let gen = |m: &ElmModel| {
        let d = ElmDecoder::new(m, InferenceConfig::default()).unwrap();
        generate(&d, std::slice::from_ref(&prompt), &cfg, None, |_, _| {})
            .unwrap()
            .tokens
    };
    assert_eq!(gen(&mem), gen(&back));
}
