//! HF `config.json` + safetensors loading/saving. References: checkpoints whose config.json
//! was written by transformers' own config classes and whose tensors (F16/BF16/F32, sharded)
//! were written with numpy (tests/fixtures/gen/ref_hf_tiny.py), plus exact round trips.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use elm::formats::{config_from_hf_json, load_hf_model, save_hf_model};
use elm::model::{Arch, ModelConfig, ModelWeights};
use elm::ElmError;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::json;

/// Every tensor of `w` by HF name, as (shape, values).
fn by_hf_name(w: &ModelWeights) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let mut m = HashMap::new();
    let mut put = |n: String, s: &[usize], v: Vec<f32>| {
        m.insert(n, (s.to_vec(), v));
    };
    put(
        "model.embed_tokens.weight".into(),
        w.embed.shape(),
        w.embed.iter().copied().collect(),
    );
    put(
        "model.norm.weight".into(),
        w.final_norm.shape(),
        w.final_norm.to_vec(),
    );
    if let Some(h) = &w.lm_head {
        put(
            "lm_head.weight".into(),
            h.shape(),
            h.iter().copied().collect(),
        );
    }
    for (l, x) in w.layers.iter().enumerate() {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        put(
            p("input_layernorm.weight"),
            x.attn_norm.shape(),
            x.attn_norm.to_vec(),
        );
        put(
            p("post_attention_layernorm.weight"),
            x.mlp_norm.shape(),
            x.mlp_norm.to_vec(),
        );
        for (n, a) in [
            ("self_attn.q_proj.weight", &x.wq),
            ("self_attn.k_proj.weight", &x.wk),
            ("self_attn.v_proj.weight", &x.wv),
            ("self_attn.o_proj.weight", &x.wo),
            ("mlp.gate_proj.weight", &x.w_gate),
            ("mlp.up_proj.weight", &x.w_up),
            ("mlp.down_proj.weight", &x.w_down),
        ] {
            put(p(n), a.shape(), a.iter().copied().collect());
        }
        for (n, b) in [("q", &x.bq), ("k", &x.bk), ("v", &x.bv)] {
            if let Some(b) = b {
                put(
                    p(&format!("self_attn.{n}_proj.bias")),
                    b.shape(),
                    b.to_vec(),
                );
            }
        }
    }
    m
}

#[test]
fn loads_transformers_written_checkpoints_exactly() {
    for (dir, arch) in [
        ("hf_tiny_llama", Arch::Llama),
        ("hf_tiny_qwen2", Arch::Qwen2),
    ] {
        let w =
            load_hf_model(fixture(&format!("io/{dir}"))).unwrap_or_else(|e| panic!("{dir}: {e}"));
        let c = &w.config;
        assert_eq!(c.arch, arch);
        assert_eq!(
            (
                c.vocab_size,
                c.hidden_size,
                c.intermediate_size,
                c.num_layers
            ),
            (64, 32, 48, 2)
        );
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 8));
        assert_eq!(c.max_position_embeddings, 128);
        match arch {
            Arch::Llama => {
                assert_eq!((c.rope_theta, c.rms_norm_eps), (100000.0, 1e-5));
                assert!(c.tie_word_embeddings && !c.attention_bias && w.lm_head.is_none());
                assert_eq!((c.bos_token_id, c.eos_token_id), (Some(1), Some(2)));
            }
            Arch::Qwen2 => {
                assert_eq!((c.rope_theta, c.rms_norm_eps), (10000.0, 1e-6));
                assert!(!c.tie_word_embeddings && c.attention_bias && w.lm_head.is_some());
                // eos_token_id is a list in config.json: the first id is kept.
                assert_eq!((c.bos_token_id, c.eos_token_id), (Some(5), Some(6)));
            }
            Arch::Gemma3 => unreachable!("no HF Gemma 3 fixture: only the GGUF is read"),
        }
        let bytes = std::fs::read(fixture(&format!("io/{dir}_expected.safetensors"))).unwrap();
        let expected = SafeTensors::deserialize(&bytes).unwrap();
        let got = by_hf_name(&w);
        assert_eq!(got.len(), expected.len(), "{dir}: tensor count");
        for (name, view) in expected.tensors() {
            let (shape, values) = &got[&name];
            assert_eq!(shape, view.shape(), "{dir} {name}");
            let want: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let diff = values
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                values
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dir} {name}: max abs diff {diff}"
            );
        }
    }
}

#[test]
fn save_then_load_is_bit_exact_and_leaves_no_temp_files() {
    for (arch, tie) in [
        (Arch::Llama, true),
        (Arch::Llama, false),
        (Arch::Qwen2, false),
    ] {
        let mut cfg = tiny_config(arch, 2);
        cfg.tie_word_embeddings = tie;
        let w = uniform_weights(&cfg, 11);
        let tmp = TempDir::new("hf-rt");
        let dir = tmp.join("ckpt"); // save creates it
        save_hf_model(&w, &dir).unwrap();
        let back = load_hf_model(&dir).unwrap();
        assert_weights_eq(&w, &back);
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, ["config.json", "model.safetensors"]);
    }
}

#[test]
fn save_rejects_weights_inconsistent_with_config() {
    let mut w = uniform_weights(&tiny_config(Arch::Llama, 2), 1);
    w.layers[1].w_up = ndarray::Array2::zeros((3, 3));
    let e = save_hf_model(&w, TempDir::new("bad-save")).unwrap_err();
    assert!(
        e.to_string().contains("model.layers.1.mlp.up_proj.weight"),
        "{e}"
    );
}

/// SmolLM2-135M-Instruct's config.json as published (transformers 4.42 key set).
fn smollm2_config_json() -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576,
        "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
        "is_llama_config": true, "max_position_embeddings": 8192, "mlp_bias": false,
        "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
        "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_interleaved": false, "rope_scaling": null, "rope_theta": 100000,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
        "use_cache": true, "vocab_size": 49152
    })
}

#[test]
fn smollm2_hf_config_matches_gguf_config() {
    let hf = config_from_hf_json(&smollm2_config_json()).unwrap();
    assert_eq!(hf.head_dim, 64);
    let Some(path) = real_model() else { return };
    let gguf =
        elm::formats::config_from_gguf(&elm::formats::GgufFile::open(path).unwrap()).unwrap();
    assert_eq!(hf, gguf);
}

#[test]
fn config_keys_that_change_the_math_are_rejected_by_name() {
    let cases = [
        ("rope_scaling", json!({"type": "linear", "factor": 2.0})),
        ("hidden_act", json!("gelu")),
        ("use_sliding_window", json!(true)),
        ("rope_interleaved", json!(true)),
        ("mlp_bias", json!(true)),
        ("quantization_config", json!({"quant_method": "gptq"})),
        (
            "rope_parameters",
            json!({"rope_type": "yarn", "factor": 4.0}),
        ),
        ("some_new_key", json!(1)),
    ];
    for (key, value) in cases {
        let mut cfg = smollm2_config_json();
        cfg[key] = value;
        let e = config_from_hf_json(&cfg).unwrap_err();
        assert!(
            matches!(&e, ElmError::Config { field, .. } if field == key),
            "{key}: {e}"
        );
    }
    let mut cfg = smollm2_config_json();
    cfg.as_object_mut().unwrap().remove("hidden_size");
    let e = config_from_hf_json(&cfg).unwrap_err();
    assert!(
        matches!(&e, ElmError::Config { field, .. } if field == "hidden_size"),
        "{e}"
    );
    let mut cfg = smollm2_config_json();
    cfg["num_key_value_heads"] = json!(4);
    let e = config_from_hf_json(&cfg).unwrap_err();
    assert!(e.to_string().contains("num_kv_heads"), "{e}");
    let mut cfg = smollm2_config_json();
    cfg["model_type"] = json!("mistral");
    assert!(config_from_hf_json(&cfg).is_err());
}

/// Rewrites `dir/model.safetensors` through `edit` on its (name, dtype, shape, bytes) list.
fn rewrite(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut list: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut list);
    let views: Vec<_> = list
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(&path, safetensors::serialize(views, &None).unwrap()).unwrap();
}

fn saved_tiny(name: &str) -> TempDir {
    let dir = TempDir::new(name);
    save_hf_model(&uniform_weights(&tiny_config(Arch::Llama, 2), 2), &dir).unwrap();
    dir
}

fn expect(e: ElmError, parts: &[&str]) {
    let s = e.to_string();
    for p in parts {
        assert!(s.contains(p), "error `{s}` should mention `{p}`");
    }
}

#[test]
fn missing_unexpected_misshaped_and_unsupported_tensors_are_named() {
    let dir = saved_tiny("hf-missing");
    rewrite(&dir, |l| {
        l.retain(|t| t.0 != "model.layers.1.mlp.up_proj.weight")
    });
    expect(
        load_hf_model(&dir).unwrap_err(),
        &["model.layers.1.mlp.up_proj.weight", "missing"],
    );

    let dir = saved_tiny("hf-unexpected");
    rewrite(&dir, |l| {
        l.push((
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            Dtype::F32,
            vec![1],
            vec![0; 4],
        ))
    });
    expect(
        load_hf_model(&dir).unwrap_err(),
        &["rotary_emb.inv_freq", "unexpected"],
    );

    let dir = saved_tiny("hf-shape");
    rewrite(&dir, |l| {
        let t = l
            .iter_mut()
            .find(|t| t.0 == "model.layers.0.mlp.down_proj.weight")
            .unwrap();
        t.2 = vec![t.2[1], t.2[0]];
    });
    expect(
        load_hf_model(&dir).unwrap_err(),
        &["model.layers.0.mlp.down_proj.weight", "shape"],
    );

    let dir = saved_tiny("hf-dtype");
    rewrite(&dir, |l| {
        let t = l.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap();
        t.1 = Dtype::I32;
    });
    let e = load_hf_model(&dir).unwrap_err();
    assert!(matches!(e, ElmError::Unsupported(_)), "{e}");
    expect(e, &["model.norm.weight", "I32"]);

    // config.json disagrees with the tensors: more layers, wider MLP.
    for (key, value, culprit) in [
        ("num_hidden_layers", 3, "model.layers.2."),
        ("intermediate_size", 64, "mlp.gate_proj.weight"),
    ] {
        let dir = saved_tiny("hf-config-mismatch");
        let p = dir.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        cfg[key] = json!(value);
        std::fs::write(&p, cfg.to_string()).unwrap();
        expect(load_hf_model(&dir).unwrap_err(), &[culprit]);
    }

    // Tied checkpoints may carry lm_head.weight only as an exact copy of the embedding.
    let dir = saved_tiny("hf-tied-copy");
    rewrite(&dir, |l| {
        let e = l
            .iter()
            .find(|t| t.0 == "model.embed_tokens.weight")
            .unwrap()
            .clone();
        l.push(("lm_head.weight".into(), e.1, e.2, e.3));
    });
    load_hf_model(&dir).unwrap();
    rewrite(&dir, |l| {
        let t = l.iter_mut().find(|t| t.0 == "lm_head.weight").unwrap();
        t.3[0] ^= 1;
    });
    expect(
        load_hf_model(&dir).unwrap_err(),
        &["lm_head.weight", "differs"],
    );
}

#[test]
fn corrupt_files_and_bad_index_are_typed_errors() {
    let dir = saved_tiny("hf-trunc");
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
    let e = load_hf_model(&dir).unwrap_err();
    assert!(matches!(e, ElmError::Format { .. }), "{e}");
    expect(e, &["model.safetensors"]);

    std::fs::write(&p, b"\xff\xff").unwrap();
    expect(load_hf_model(&dir).unwrap_err(), &["model.safetensors"]);

    std::fs::remove_file(&p).unwrap();
    expect(load_hf_model(&dir).unwrap_err(), &["no model.safetensors"]);

    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    let e = load_hf_model(&dir).unwrap_err();
    assert!(matches!(e, ElmError::Json { .. }), "{e}");
    expect(e, &["config.json"]);

    // Sharded: the index names a shard that does not hold the tensor.
    let dir = TempDir::new("hf-index");
    for f in std::fs::read_dir(fixture("io/hf_tiny_llama")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    load_hf_model(&dir).unwrap();
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    let map = index["weight_map"].as_object_mut().unwrap();
    let (name, file) = map
        .iter()
        .next()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .unwrap();
    let other = if file.contains("00001") {
        "model-00002-of-00002.safetensors"
    } else {
        "model-00001-of-00002.safetensors"
    };
    map.insert(name.clone(), json!(other));
    std::fs::write(&index_path, index.to_string()).unwrap();
    expect(load_hf_model(&dir).unwrap_err(), &[&name]);
}

/// A Gemma 3 model round-trips through an HF directory: `config.json` in transformers'
/// `gemma3_text` keys (window, `layer_types`, local RoPE base, GELU-tanh), norm gains stored as
/// `gain − 1` (HF's Gemma RMSNorm multiplies by `1 + weight`) and read back to within one f32
/// rounding, the same logits; a changed `layer_types` that is not one global layer every
/// `pattern` layers, or a soft-capping value, is refused naming the key.
#[test]
fn gemma3_round_trips_through_an_hf_directory() {
    use elm::model::Transformer;
    let cfg = ModelConfig {
        num_layers: 4,
        ..ModelConfig::tiny(Arch::Gemma3)
    };
    let mut w = common::uniform_weights(&cfg, 21);
    for (l, layer) in w.layers.iter_mut().enumerate() {
        let c = cfg.hidden_size;
        let d = cfg.head_dim;
        let ramp =
            |n: usize, base: f32| ndarray::Array1::from_shape_fn(n, |i| base + 0.05 * i as f32);
        layer.gemma = Some(elm::model::weights::Gemma3Block {
            q_norm: ramp(d, 0.7),
            k_norm: ramp(d, 1.1),
            post_attn_norm: ramp(c, 0.9),
            post_mlp_norm: ramp(c, 1.3),
            attention: cfg.layer_attention(l),
        });
    }
    let dir = common::TempDir::new("gemma3-hf");
    elm::formats::save_hf_model(&w, &dir).unwrap();
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["model_type"], "gemma3_text");
    assert_eq!(json["hidden_activation"], "gelu_pytorch_tanh");
    assert_eq!(
        json["layer_types"],
        serde_json::json!([
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention"
        ])
    );
    let back = elm::formats::load_hf_model(&dir).unwrap();
    assert_eq!(back.config, w.config);
    let close = |a: &ndarray::Array1<f32>, b: &ndarray::Array1<f32>| {
        a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 2.0 * f32::EPSILON * x.abs().max(1.0))
    };
    for (a, b) in w.layers.iter().zip(&back.layers) {
        let (ga, gb) = (a.gemma.as_ref().unwrap(), b.gemma.as_ref().unwrap());
        assert!(close(&ga.q_norm, &gb.q_norm) && close(&ga.post_mlp_norm, &gb.post_mlp_norm));
        assert!(close(&a.mlp_norm, &b.mlp_norm) && close(&a.attn_norm, &b.attn_norm));
        assert_eq!(ga.attention, gb.attention);
        assert_eq!(a.wq, b.wq);
    }
    // Stored as `gain − 1`: a gain of 1.1 (k_norm[0]) is stored as 0.1.
    let st = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    let k0 = st.tensor("model.layers.0.self_attn.k_norm.weight").unwrap();
    let first = f32::from_le_bytes(k0.data()[..4].try_into().unwrap());
    assert!((first - 0.1).abs() < 1e-6, "{first}");
    let ids = [vec![3u32, 9, 4, 17, 5, 6]];
    let a = Transformer::new(w).unwrap().forward_logits(&ids).unwrap();
    let b = Transformer::new(back)
        .unwrap()
        .forward_logits(&ids)
        .unwrap();
    let d = (&a - &b).mapv(f32::abs).fold(0.0f32, |m, &x| m.max(x));
    assert!(d < 1e-4, "{d}");

    for (key, value) in [
        (
            "layer_types",
            serde_json::json!([
                "sliding_attention",
                "full_attention",
                "full_attention",
                "full_attention"
            ]),
        ),
        ("final_logit_softcapping", serde_json::json!(30.0)),
        ("query_pre_attn_scalar", serde_json::json!(7)),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "linear", "factor": 8.0}),
        ),
    ] {
        let mut edited = json.clone();
        edited[key] = value;
        let err = elm::formats::config_from_hf_json(&edited)
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
}
