//! GGUF reader, dequantization, RoPE un-permutation and model loading.
//! References: fixtures written by the PyPI `gguf` package (tests/fixtures/gen/ref_gguf_quants.py,
//! tests/fixtures/gen/ref_gguf_smollm.py), the real SmolLM2 checkpoint, and RoPE algebra.

mod common;

use common::*;
use elm::formats::gguf::{
    dequantize, gguf_to_bytes, kv, GgmlType, GgufFile, GgufTensorData, GgufValue,
};
use elm::formats::{load_gguf_model, permute_rope_rows, save_gguf_model, unpermute_rope_rows};
use elm::io::Fnv64;
use elm::model::{Arch, QFormat};
use elm::ElmError;
use ndarray::{Array1, Array2, Axis};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn type_from_name(name: &str) -> GgmlType {
    match name {
        "F32" => GgmlType::F32,
        "F16" => GgmlType::F16,
        "BF16" => GgmlType::BF16,
        other => GgmlType::Block(
            QFormat::ALL
                .into_iter()
                .find(|f| f.name().eq_ignore_ascii_case(other))
                .unwrap_or_else(|| panic!("fixture type {other}")),
        ),
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn bits(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| f32::from_bits(b.as_u64().unwrap() as u32))
        .collect()
}

/// Bit-exact comparison (NaN-safe), printing max abs diff and the first mismatch.
fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mismatches: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&i) = mismatches.first() {
        let max = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        panic!(
            "{what}: {} of {} values differ; first at {i}: got {} want {}; max abs diff {max}",
            mismatches.len(),
            got.len(),
            got[i],
            want[i]
        );
    }
}

#[test]
fn dequantize_matches_gguf_python_package_bit_exact() {
    let fx = fixture_json("io/quants.json");
    let blocks = fx["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 6);
    for b in blocks {
        let ty = type_from_name(b["type"].as_str().unwrap());
        let want = bits(&b["dequant_bits"]);
        let got = dequantize(ty, &hex(b["bytes_hex"].as_str().unwrap()), want.len()).unwrap();
        assert_bits_eq(b["type"].as_str().unwrap(), &got, &want);
    }
}

/// Q5_0, Q5_1 and the K-quants, block by block: random bytes in every packed field (every
/// scale, min, nibble and high bit), an all-zero block and one with every field at its largest,
/// against the `gguf` package's numpy decoders (tests/fixtures/gen/ref_gguf_kquants.py), bit for bit.
#[test]
fn new_block_formats_dequantize_as_the_gguf_python_package_bit_exact() {
    let fx = fixture_json("io/kquants.json");
    let blocks = fx["blocks"].as_array().unwrap();
    let names: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
    );
    for b in blocks {
        let name = b["type"].as_str().unwrap();
        let ty = type_from_name(name);
        let want = bits(&b["dequant_bits"]);
        let bytes = hex(b["bytes_hex"].as_str().unwrap());
        let (elems, block_bytes) = ty.block_layout().unwrap();
        assert_eq!(bytes.len() / block_bytes * elems, want.len(), "{name}");
        let got = dequantize(ty, &bytes, want.len()).unwrap();
        assert_bits_eq(name, &got, &want);
        // The row decoder of the in-memory matrices reads the same blocks the same way.
        let GgmlType::Block(format) = ty else {
            unreachable!()
        };
        let m = elm::model::QMatrix::from_blocks(format, 1, want.len(), bytes).unwrap();
        let row = m.dequantize();
        assert_bits_eq(&format!("{name} QMatrix"), row.as_slice().unwrap(), &want);
    }
}

/// The smallest tensor of each block type in the real Gemma 3 Q4_K_M file (Q4_K, Q5_0, Q6_K,
/// Q8_0), dequantized whole: the FNV-1a hash of its f32 values and its first 64 values equal
/// the `gguf` package's (tests/fixtures/gen/ref_gguf_kquants.py on the same file).
#[test]
fn real_gemma3_tensors_of_each_block_type_dequantize_as_the_gguf_python_package() {
    let Some(path) = real_gemma3() else {
        return;
    };
    let g = GgufFile::open(&path).unwrap();
    let fx = fixture_json("io/kquants.json");
    let tensors = fx["real_file"].as_array().unwrap();
    let types: Vec<&str> = tensors
        .iter()
        .map(|t| t["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["Q4_K", "Q5_0", "Q6_K", "Q8_0"]);
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        let info = g.tensor_info(name).unwrap();
        assert_eq!(
            info.ggml_type,
            type_from_name(t["type"].as_str().unwrap()),
            "{name}"
        );
        let n = t["elements"].as_u64().unwrap() as usize;
        let got = dequantize(info.ggml_type, g.tensor_bytes(name).unwrap(), n).unwrap();
        let mut h = Fnv64::new();
        for v in &got {
            h.write(&v.to_le_bytes());
        }
        assert_bits_eq(name, &got[..64], &bits(&t["first_bits"]));
        assert_eq!(
            format!("{:016x}", h.finish()),
            t["fnv64"].as_str().unwrap(),
            "{name}"
        );
    }
}

#[test]
fn dequantize_rejects_wrong_byte_count_and_unsupported_types() {
    assert!(matches!(
        dequantize(GgmlType::Block(QFormat::Q4_1), &[0u8; 19], 32),
        Err(ElmError::InvalidArgument(_))
    ));
    assert!(matches!(
        dequantize(GgmlType::Other(15), &[0u8; 292], 256), // Q8_K: a kernel format only
        Err(ElmError::Unsupported(_))
    ));
}

#[test]
fn reads_file_written_by_reference_gguf_writer() {
    let g = GgufFile::open(fixture("io/ref_small.gguf")).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_start() % 64, 0);
    // Values the script wrote (constants in tests/fixtures/gen/ref_gguf_quants.py).
    assert_eq!(g.get("test.u8"), Some(&GgufValue::U8(200)));
    assert_eq!(g.get("test.i8"), Some(&GgufValue::I8(-100)));
    assert_eq!(g.get("test.u16"), Some(&GgufValue::U16(60000)));
    assert_eq!(g.get("test.i16"), Some(&GgufValue::I16(-30000)));
    assert_eq!(g.get("test.u32"), Some(&GgufValue::U32(4_000_000_000)));
    assert_eq!(g.get("test.i32"), Some(&GgufValue::I32(-2_000_000_000)));
    assert_eq!(g.get("test.f32"), Some(&GgufValue::F32(0.15625)));
    assert_eq!(g.get("test.bool"), Some(&GgufValue::Bool(true)));
    assert_eq!(g.get_str("test.str").unwrap(), "héllo 🙂");
    assert_eq!(g.get("test.u64"), Some(&GgufValue::U64((1u64 << 63) + 5)));
    assert_eq!(g.get("test.i64"), Some(&GgufValue::I64(-(1i64 << 62))));
    assert_eq!(g.get("test.f64"), Some(&GgufValue::F64(1e-300)));
    assert_eq!(g.get_int_array("test.arr_i32").unwrap(), vec![1, -2, 3]);
    assert_eq!(g.get_str_array("test.arr_str").unwrap(), vec!["a", "", "ü"]);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    // Wrong-typed access is a typed error naming the key.
    let err = g.get_str("test.u8").unwrap_err().to_string();
    assert!(err.contains("test.u8"), "{err}");

    let fx = fixture_json("io/quants.json");
    let want_tensors = fx["file_tensors"].as_array().unwrap();
    assert_eq!(g.tensors().len(), want_tensors.len());
    for t in want_tensors {
        let name = t["name"].as_str().unwrap();
        let info = g.tensor_info(name).unwrap();
        assert_eq!(
            info.ggml_type,
            type_from_name(t["type"].as_str().unwrap()),
            "{name}"
        );
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        // GGUF ne is the reverse of the numpy shape.
        assert_eq!(info.shape(), shape, "{name}");
        assert_eq!(
            info.ne
                .iter()
                .rev()
                .map(|&d| d as usize)
                .collect::<Vec<_>>(),
            shape
        );
        let x = g.tensor_f32(name).unwrap();
        assert_eq!(x.shape(), &shape[..]);
        assert_bits_eq(name, x.as_slice().unwrap(), &bits(&t["dequant_bits"]));
    }
}

#[test]
fn writer_round_trips_metadata_and_default_alignment() {
    let dir = TempDir::new("writer");
    let path = dir.join("w.gguf");
    let meta = vec![
        kv("general.architecture", GgufValue::String("llama".into())),
        kv(
            "a.nested",
            GgufValue::Array(vec![GgufValue::F64(0.5), GgufValue::F64(-2.0)]),
        ),
        kv("a.empty", GgufValue::Array(vec![])),
    ];
    let t = GgufTensorData::f32("x", &[2, 3], &[1., 2., 3., 4., 5., 6.]);
    elm::formats::gguf::write_gguf(
        &path,
        &meta,
        &[
            t.clone(),
            GgufTensorData {
                name: "y".into(),
                ..t
            },
        ],
    )
    .unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.metadata(), &meta[..]);
    assert_eq!(g.tensor_info("y").unwrap().offset % 32, 0);
    assert_eq!(g.tensor_info("x").unwrap().ne, vec![3, 2]);
    let y = g.tensor_f32_2d("y").unwrap();
    assert_eq!(y, ndarray::arr2(&[[1., 2., 3.], [4., 5., 6.]]));
}

/// llama.cpp's `permute` written as numpy does it:
/// `w.reshape(h, 2, D/2, C).swapaxes(1, 2).reshape(w.shape)`.
fn numpy_style_permute(w: &Array2<f32>, heads: usize) -> Array2<f32> {
    let (rows, cols) = w.dim();
    let v = w
        .clone()
        .into_shape_with_order((heads, 2, rows / heads / 2, cols))
        .unwrap();
    let swapped = v.permuted_axes([0, 2, 1, 3]);
    swapped
        .as_standard_layout()
        .to_owned()
        .into_shape_with_order((rows, cols))
        .unwrap()
}

/// Half-split RoPE (HF): pairs `(i, i + D/2)` of each head.
fn rope_half_split(q: &Array1<f32>, d: usize, pos: f64, theta: f64) -> Array1<f32> {
    let mut out = q.clone();
    for h in 0..q.len() / d {
        for i in 0..d / 2 {
            let a = pos * theta.powf(-2.0 * i as f64 / d as f64);
            let (x, y) = (q[h * d + i] as f64, q[h * d + i + d / 2] as f64);
            out[h * d + i] = (x * a.cos() - y * a.sin()) as f32;
            out[h * d + i + d / 2] = (x * a.sin() + y * a.cos()) as f32;
        }
    }
    out
}

/// Interleaved RoPE (ggml "normal" mode): pairs `(2i, 2i + 1)`.
fn rope_interleaved(q: &Array1<f32>, d: usize, pos: f64, theta: f64) -> Array1<f32> {
    let mut out = q.clone();
    for h in 0..q.len() / d {
        for i in 0..d / 2 {
            let a = pos * theta.powf(-2.0 * i as f64 / d as f64);
            let (x, y) = (q[h * d + 2 * i] as f64, q[h * d + 2 * i + 1] as f64);
            out[h * d + 2 * i] = (x * a.cos() - y * a.sin()) as f32;
            out[h * d + 2 * i + 1] = (x * a.sin() + y * a.cos()) as f32;
        }
    }
    out
}

#[test]
fn unpermuted_weights_with_half_split_rope_equal_gguf_weights_with_interleaved_rope() {
    let mut rng = StdRng::seed_from_u64(7);
    let (heads, d, c) = (3, 8, 10);
    let w_hf = Array2::from_shape_fn((heads * d, c), |_| rng.gen_range(-1.0f32..1.0));
    let x = Array1::from_shape_fn(c, |_| rng.gen_range(-1.0f32..1.0));
    let w_gguf = numpy_style_permute(&w_hf, heads);
    assert_eq!(
        permute_rope_rows(&w_hf, heads),
        w_gguf,
        "permute == llama.cpp permute"
    );
    assert_eq!(
        unpermute_rope_rows(&w_gguf, heads),
        w_hf,
        "unpermute inverts it exactly"
    );

    for pos in [0.0, 1.0, 5.0, 123.0] {
        let q_hf = rope_half_split(&w_hf.dot(&x), d, pos, 10000.0);
        let q_gguf = rope_interleaved(&w_gguf.dot(&x), d, pos, 10000.0);
        // Same rotated vector, only the order of its rows differs.
        let back =
            unpermute_rope_rows(&q_gguf.clone().insert_axis(Axis(1)), heads).remove_axis(Axis(1));
        let diff = back
            .iter()
            .zip(&q_hf)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "pos {pos}: max abs diff {diff}");
        // Attention scores are permutation-invariant: q·k equal in both layouts.
        let k_hf = rope_half_split(
            &w_hf
                .row(1)
                .to_owned()
                .insert_axis(Axis(0))
                .dot(&w_hf.t())
                .remove_axis(Axis(0)),
            d,
            pos,
            10000.0,
        );
        let k_g = rope_interleaved(
            &w_hf
                .row(1)
                .to_owned()
                .insert_axis(Axis(0))
                .dot(&w_gguf.t())
                .remove_axis(Axis(0)),
            d,
            pos,
            10000.0,
        );
        let (s1, s2) = (q_hf.dot(&k_hf), q_gguf.dot(&k_g));
        assert!(
            (s1 - s2).abs() < 1e-4 * s1.abs().max(1.0),
            "scores {s1} vs {s2}"
        );
    }
}

#[test]
fn tiny_model_round_trips_through_gguf() {
    let dir = TempDir::new("tiny-rt");
    for arch in Arch::ALL {
        let w = uniform_weights(&tiny_config(arch, 2), 3);
        let path = dir.join(format!("{arch:?}.gguf"));
        save_gguf_model(&w, &path).unwrap();
        let back = load_gguf_model(&path).unwrap();
        assert_weights_eq(&w, &back);
        // Llama Q rows are stored permuted on disk (numpy's permute of llama.cpp's converter);
        // Qwen2's and Gemma 3's are not.
        let g = GgufFile::open(&path).unwrap();
        let q_disk = g.tensor_f32_2d("blk.0.attn_q.weight").unwrap();
        match arch {
            Arch::Llama => assert_eq!(
                q_disk,
                numpy_style_permute(&w.layers[0].wq, w.config.num_heads)
            ),
            Arch::Qwen2 | Arch::Gemma3 => assert_eq!(q_disk, w.layers[0].wq),
        }
        // Gemma 3's extra norms are written, and its local layers' pattern read back.
        if arch == Arch::Gemma3 {
            assert!(g.tensor_info("blk.1.post_ffw_norm.weight").is_some());
            assert_eq!(back.config.sliding_window_pattern, Some(2));
        }
    }
}

// ---------------------------------------------------------------- errors

/// Bytes of a tiny valid Llama GGUF, plus its tensors and metadata for editing.
fn tiny_parts() -> (Vec<(String, GgufValue)>, Vec<GgufTensorData>) {
    let dir = TempDir::new("tiny-parts");
    let path = dir.join("m.gguf");
    save_gguf_model(&uniform_weights(&tiny_config(Arch::Llama, 2), 5), &path).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let tensors: Vec<GgufTensorData> = g.tensor_data().unwrap();
    (g.metadata().to_vec(), tensors)
}

fn write_and_load(
    name: &str,
    meta: &[(String, GgufValue)],
    tensors: &[GgufTensorData],
) -> ElmError {
    let dir = TempDir::new(name);
    let path = dir.join("m.gguf");
    std::fs::write(&path, gguf_to_bytes(meta, tensors, 32)).unwrap();
    load_gguf_model(&path).expect_err("must fail")
}

fn expect_msg(err: &ElmError, parts: &[&str]) {
    let s = err.to_string();
    for p in parts {
        assert!(s.contains(p), "error `{s}` should mention `{p}`");
    }
}

#[test]
fn wrong_magic_unsupported_version_and_truncation_are_format_errors() {
    let (meta, tensors) = tiny_parts();
    let good = gguf_to_bytes(&meta, &tensors, 32);
    let dir = TempDir::new("corrupt");
    let path = dir.join("bad.gguf");

    let mut bad = good.clone();
    bad[..4].copy_from_slice(b"GGML");
    std::fs::write(&path, &bad).unwrap();
    let e = GgufFile::open(&path).err().unwrap();
    assert!(matches!(e, ElmError::Format { .. }), "{e}");
    expect_msg(&e, &["bad.gguf", "magic"]);

    let mut bad = good.clone();
    bad[4..8].copy_from_slice(&7u32.to_le_bytes());
    std::fs::write(&path, &bad).unwrap();
    let e = GgufFile::open(&path).err().unwrap();
    expect_msg(&e, &["bad.gguf", "version 7"]);

    // Cut inside the header, the metadata, the tensor table and the tensor data.
    for cut in [3, 20, 100, good.len() / 3, good.len() - 1] {
        std::fs::write(&path, &good[..cut]).unwrap();
        let e = GgufFile::open(&path)
            .err()
            .unwrap_or_else(|| panic!("cut {cut} must fail"));
        assert!(matches!(e, ElmError::Format { .. }), "cut {cut}: {e}");
        expect_msg(&e, &["bad.gguf", "truncated"]);
    }

    // A corrupt huge array count must not allocate or panic.
    let mut bad = good.clone();
    bad[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
    std::fs::write(&path, &bad).unwrap();
    let e = GgufFile::open(&path).err().unwrap();
    expect_msg(&e, &["bad.gguf", "metadata count"]);

    let e = GgufFile::open(dir.join("missing.gguf")).err().unwrap();
    assert!(matches!(e, ElmError::Io { .. }), "{e}");
}

#[test]
fn unsupported_quant_type_names_tensor_and_type() {
    let (meta, mut tensors) = tiny_parts();
    let t = tensors
        .iter_mut()
        .find(|t| t.name == "blk.1.ffn_up.weight")
        .unwrap();
    t.ggml_type = GgmlType::Other(16); // IQ2_XXS
    let e = write_and_load("unsup", &meta, &tensors);
    assert!(matches!(e, ElmError::Unsupported(_)), "{e}");
    expect_msg(&e, &["blk.1.ffn_up.weight", "ggml type 16"]);
}

#[test]
fn missing_unexpected_and_misshaped_tensors_are_named() {
    let (meta, tensors) = tiny_parts();

    let fewer: Vec<_> = tensors
        .iter()
        .filter(|t| t.name != "blk.1.attn_v.weight")
        .cloned()
        .collect();
    let e = write_and_load("missing", &meta, &fewer);
    assert!(matches!(e, ElmError::Tensor { .. }), "{e}");
    expect_msg(&e, &["blk.1.attn_v.weight", "missing"]);

    let mut more = tensors.clone();
    more.push(GgufTensorData::f32("rope_freqs.weight", &[4], &[1.0; 4]));
    let e = write_and_load("unexpected", &meta, &more);
    expect_msg(&e, &["rope_freqs.weight", "unexpected"]);

    let mut reshaped = tensors.clone();
    let t = reshaped
        .iter_mut()
        .find(|t| t.name == "blk.0.ffn_down.weight")
        .unwrap();
    t.shape = vec![t.shape[1], t.shape[0]]; // transposed
    let e = write_and_load("shape", &meta, &reshaped);
    expect_msg(&e, &["blk.0.ffn_down.weight", "shape"]);
}

#[test]
fn config_metadata_that_changes_the_math_is_rejected() {
    let (meta, tensors) = tiny_parts();
    let with = |key: &str, v: GgufValue| {
        let mut m: Vec<_> = meta.iter().filter(|(k, _)| k != key).cloned().collect();
        m.push(kv(key, v));
        m
    };
    let e = write_and_load(
        "scaling",
        &with(
            "llama.rope.scaling.type",
            GgufValue::String("linear".into()),
        ),
        &tensors,
    );
    // A config error, named in its file.
    assert!(e.kind() == "config" && e.file().is_some(), "{e}");
    expect_msg(&e, &["llama.rope.scaling.type"]);

    let e = write_and_load(
        "rotary",
        &with("llama.rope.dimension_count", GgufValue::U32(4)),
        &tensors,
    );
    expect_msg(&e, &["llama.rope.dimension_count"]);

    let e = write_and_load(
        "kvheads",
        &with("llama.attention.head_count_kv", GgufValue::U32(3)),
        &tensors,
    );
    // A config error found by validation also names the file (wrapped in `InFile`).
    assert_eq!(e.kind(), "config", "{e}");
    expect_msg(&e, &["num_kv_heads"]);

    // Config and tensors disagree: more layers than the file holds.
    let e = write_and_load(
        "layers",
        &with("llama.block_count", GgufValue::U32(3)),
        &tensors,
    );
    expect_msg(&e, &["blk.2.", "missing"]);

    let e = write_and_load(
        "arch",
        &with("general.architecture", GgufValue::String("gemma".into())),
        &tensors,
    );
    assert!(e.kind() == "unsupported" && e.file().is_some(), "{e}");
    expect_msg(&e, &["gemma"]);

    let no_eps: Vec<_> = meta
        .iter()
        .filter(|(k, _)| k != "llama.attention.layer_norm_rms_epsilon")
        .cloned()
        .collect();
    let e = write_and_load("eps", &no_eps, &tensors);
    expect_msg(&e, &["llama.attention.layer_norm_rms_epsilon"]);
}

// ---------------------------------------------------------------- real model

#[test]
fn smollm2_gguf_matches_python_gguf_reference() {
    let Some(path) = real_model() else { return };
    let fx = fixture_json("io/smollm2_ref.json");
    let g = GgufFile::open(&path).unwrap();
    let c = &fx["config"];
    assert_eq!(g.version(), 3);
    assert_eq!(g.tensors().len() as u64, c["n_tensors"].as_u64().unwrap());

    let t0 = std::time::Instant::now();
    let w = load_gguf_model(&path).unwrap();
    eprintln!("load_gguf_model: {:?}", t0.elapsed());
    let cfg = &w.config;
    assert_eq!(cfg.arch, Arch::Llama);
    let u = |k: &str| c[k].as_u64().unwrap() as usize;
    assert_eq!(cfg.vocab_size, u("vocab_size"));
    assert_eq!(cfg.hidden_size, u("hidden_size"));
    assert_eq!(cfg.intermediate_size, u("intermediate_size"));
    assert_eq!(cfg.num_layers, u("num_layers"));
    assert_eq!(cfg.num_heads, u("num_heads"));
    assert_eq!(cfg.num_kv_heads, u("num_kv_heads"));
    assert_eq!(cfg.head_dim, 64);
    assert_eq!(cfg.max_position_embeddings, u("max_position_embeddings"));
    assert_eq!(cfg.rope_theta as f64, c["rope_theta"].as_f64().unwrap());
    assert_eq!(cfg.rms_norm_eps as f64, c["rms_norm_eps"].as_f64().unwrap());
    assert_eq!(cfg.bos_token_id, Some(u("bos_token_id") as u32));
    assert_eq!(cfg.eos_token_id, Some(u("eos_token_id") as u32));
    assert!(cfg.tie_word_embeddings && w.lm_head.is_none());
    assert!(!cfg.attention_bias);

    for t in fx["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        // HF-layout tensor from the loaded weights (Q/K already un-permuted).
        let x: Array2<f32> = match name {
            "token_embd.weight" => w.embed.clone(),
            "output_norm.weight" => w.final_norm.clone().insert_axis(Axis(0)),
            _ => {
                let parts: Vec<&str> = name.split('.').collect();
                let l = &w.layers[parts[1].parse::<usize>().unwrap()];
                match parts[2] {
                    "attn_q" => l.wq.clone(),
                    "attn_k" => l.wk.clone(),
                    "attn_v" => l.wv.clone(),
                    "attn_norm" => l.attn_norm.clone().insert_axis(Axis(0)),
                    "ffn_down" => l.w_down.clone(),
                    "ffn_gate" => l.w_gate.clone(),
                    other => panic!("{other}"),
                }
            }
        };
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(x.len(), shape.iter().product::<usize>(), "{name}");
        if shape.len() == 2 {
            assert_eq!(x.shape(), &shape[..], "{name}");
        }
        for (row, want) in t["rows"].as_object().unwrap() {
            let r: usize = row.parse().unwrap();
            let want: Vec<f32> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let got = x
                .row(r)
                .iter()
                .take(want.len())
                .copied()
                .collect::<Vec<_>>();
            assert_bits_eq(&format!("{name} row {r}"), &got, &want);
        }
        let sum: f64 = x.iter().map(|&v| v as f64).sum();
        let sum_sq: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
        for (got, key) in [(sum, "sum"), (sum_sq, "sum_sq")] {
            let want = t[key].as_f64().unwrap();
            let rel = (got - want).abs() / want.abs().max(1e-12);
            assert!(
                rel < 1e-9,
                "{name} {key}: got {got} want {want} (rel diff {rel:e})"
            );
        }
    }
}

// ---------------------------------------------------------------- loading that releases the file

/// A Q8_0 block per 32 values with a finite f16 scale and random codes, `n` values.
fn q8_0_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n / 32 * 34);
    for _ in 0..n / 32 {
        let d = half::f16::from_f32(rng.gen_range(-0.1f32..0.1));
        out.extend_from_slice(&d.to_le_bytes());
        out.extend((0..32).map(|_| rng.gen::<u8>()));
    }
    out
}

/// The loaders' reads (`take_tensor_f32`, `take_tensor_bytes`) convert a tensor slice by slice,
/// releasing each slice's pages: the values must be those of the whole-tensor reads, across
/// slice boundaries (tensors of several 4 MiB slices, and a length that is no multiple of one).
#[test]
fn releasing_reads_equal_whole_tensor_reads_across_slice_boundaries() {
    let dir = TempDir::new("gguf-take");
    let path = dir.join("big.gguf");
    let mut rng = StdRng::seed_from_u64(11);
    // 2.3 slices of Q8_0 bytes, and 1.5 slices of f32.
    let (q_rows, q_cols) = (2_300, 4_096);
    let f_values: Vec<f32> = (0..1_572_864 + 7)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let tensors = vec![
        GgufTensorData {
            name: "q".into(),
            shape: vec![q_rows, q_cols],
            ggml_type: GgmlType::Block(QFormat::Q8_0),
            data: q8_0_bytes(&mut rng, q_rows * q_cols),
        },
        GgufTensorData::f32("f", &[f_values.len()], &f_values),
    ];
    std::fs::write(&path, gguf_to_bytes(&[], &tensors, 32)).unwrap();
    let g = GgufFile::open(&path).unwrap();
    for name in ["q", "f"] {
        let whole = g.tensor_f32(name).unwrap();
        let taken = g.take_tensor_f32(name).unwrap();
        assert_eq!(whole.shape(), taken.shape(), "{name}");
        assert_bits_eq(name, taken.as_slice().unwrap(), whole.as_slice().unwrap());
        assert_eq!(
            g.take_tensor_bytes(name).unwrap(),
            g.tensor_bytes(name).unwrap(),
            "{name}: raw bytes"
        );
    }
    assert_bits_eq(
        "f values",
        g.tensor_f32("f").unwrap().as_slice().unwrap(),
        &f_values,
    );
}

/// Loading only some blocks (an ELM's kept layers) gives exactly those blocks of the whole
/// load, in order, and still refuses a file with a tensor no block or global explains.
#[test]
fn loading_a_subset_of_layers_equals_the_whole_load_filtered() {
    use elm::formats::{load_gguf_quant, load_gguf_quant_layers};
    use elm::model::WeightStorage;
    let dir = TempDir::new("gguf-layers");
    let path = dir.join("m.gguf");
    save_gguf_model(&uniform_weights(&tiny_config(Arch::Llama, 4), 9), &path).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let cfg = elm::formats::config_from_gguf(&g).unwrap();
    for storage in [
        WeightStorage::F32,
        WeightStorage::Quant(elm::model::WriteFormat::Q8_0),
    ] {
        let whole = load_gguf_quant(&g, storage).unwrap();
        let keep = |l: usize| l != 1 && l != 2;
        let part = load_gguf_quant_layers(&g, cfg.clone(), storage, &keep).unwrap();
        assert_eq!(part.layers.len(), 2);
        for (got, want) in part.layers.iter().zip([&whole.layers[0], &whole.layers[3]]) {
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "{storage}");
        }
        assert_eq!(format!("{:?}", part.embed), format!("{:?}", whole.embed));
    }
    // A stray tensor is still named when the layers around it are skipped.
    let mut tensors = g.tensor_data().unwrap();
    tensors.push(GgufTensorData::f32("blk.9.stray", &[2], &[1.0, 2.0]));
    let stray = dir.join("stray.gguf");
    std::fs::write(&stray, gguf_to_bytes(g.metadata(), &tensors, 32)).unwrap();
    let g = GgufFile::open(&stray).unwrap();
    let err = load_gguf_quant_layers(&g, cfg, WeightStorage::Auto, &|l| l == 0).unwrap_err();
    expect_msg(&err, &["blk.9.stray", "unexpected"]);
}

/// The runtime probe (what `elm bench` measures a process's fixed memory on) is the model cut
/// to its first block: the same metadata but the block count, the same tokenizer, the globals
/// and block 0 byte for byte.
#[test]
fn runtime_probe_keeps_the_tokenizer_globals_and_first_block() {
    let Some(model) = real_model() else { return };
    let dir = TempDir::new("gguf-probe");
    let probe = dir.join("probe.gguf");
    let src = GgufFile::open(&model).unwrap();
    elm::formats::write_runtime_probe(&src, &probe).unwrap();
    let p = GgufFile::open(&probe).unwrap();
    let cfg = elm::formats::config_from_gguf(&p).unwrap();
    let full = elm::formats::config_from_gguf(&src).unwrap();
    assert_eq!(cfg.num_layers, 1);
    assert_eq!(
        ModelConfigSansLayers::of(&cfg),
        ModelConfigSansLayers::of(&full)
    );
    for (k, v) in src.metadata() {
        if !k.ends_with(".block_count") {
            assert_eq!(Some(v), p.get(k), "metadata `{k}`");
        }
    }
    for t in p.tensors() {
        assert!(
            !t.name.starts_with("blk.") || t.name.starts_with("blk.0."),
            "{}",
            t.name
        );
        assert_eq!(
            p.tensor_bytes(&t.name).unwrap(),
            src.tensor_bytes(&t.name).unwrap()
        );
    }
    let want = src
        .tensors()
        .iter()
        .filter(|t| !t.name.starts_with("blk.") || t.name.starts_with("blk.0."))
        .count();
    assert_eq!(p.tensors().len(), want);
    // It loads and generates like any model.
    let (w, tok) = elm::model::load_inference(&probe, elm::model::WeightStorage::Auto).unwrap();
    assert_eq!(w.layers.len(), 1);
    assert_eq!(tok.vocab_size(), full.vocab_size);
}

/// A config with its layer count blanked, to compare a probe's with its model's.
#[derive(Debug, PartialEq)]
struct ModelConfigSansLayers(elm::model::ModelConfig);

impl ModelConfigSansLayers {
    fn of(c: &elm::model::ModelConfig) -> Self {
        ModelConfigSansLayers(elm::model::ModelConfig {
            num_layers: 0,
            ..c.clone()
        })
    }
}
