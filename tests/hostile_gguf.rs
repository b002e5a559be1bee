//! Hostile GGUF files (issue 59): every file is made here, byte by byte where the writer would
//! refuse it, and each must be refused with a typed error naming the file and what is wrong —
//! never a panic, an allocation out of proportion to the file, or a model that loads and
//! prints plausible output.

mod common;

use std::path::{Path, PathBuf};

use elm::formats::gguf::{
    gguf_to_bytes, kv, supported_types, write_gguf, GgmlType, GgufFile, GgufTensorData, GgufValue,
};
use elm::model_data::Arch;
use elm::quant::QFormat;
use elm::ElmError;

// Every test of this file runs alone (`common::one_at_a_time`): one measures the process's
// resident memory, which the real-model tests beside it would otherwise grow while it reads (a
// flake seen once).

fn tmp(name: &str) -> (common::TempDir, PathBuf) {
    let dir = common::TempDir::new(name);
    let path = dir.path().join(format!("{name}.gguf"));
    (dir, path)
}

/// GGUF v3 bytes with one tensor entry written as given (dims in GGUF order, any type id, any
/// offset) and `data` bytes after the aligned table: what no writer of ours would produce.
fn raw_gguf(ne: &[u64], type_id: u32, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&1u64.to_le_bytes()); // tensors
    out.extend_from_slice(&0u64.to_le_bytes()); // metadata
    let name = b"t";
    out.extend_from_slice(&(name.len() as u64).to_le_bytes());
    out.extend_from_slice(name);
    out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
    for d in ne {
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.extend_from_slice(&type_id.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.resize(out.len().div_ceil(32) * 32, 0);
    out.extend_from_slice(data);
    out
}

fn open_err(bytes: &[u8], name: &str) -> String {
    let (_dir, path) = tmp(name);
    std::fs::write(&path, bytes).unwrap();
    match GgufFile::open(&path) {
        Ok(_) => panic!("{name}: a hostile file was accepted"),
        Err(e @ ElmError::Format { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            msg
        }
        Err(other) => panic!("{name}: not a format error: {other:?}"),
    }
}

/// `n / block · bytes` wrapped around u64 and passed the range check: a tensor of 2^62 F32
/// elements "needed" 0 bytes; reading it panicked with "capacity overflow".
#[test]
fn a_byte_size_that_wraps_u64_is_refused() {
    let _alone = common::one_at_a_time();
    let msg = open_err(&raw_gguf(&[1 << 62], 0, 0, &[0; 32]), "wrap-f32");
    assert!(msg.contains("overflow") || msg.contains("memory"), "{msg}");
    // F16: 2^63 elements of 2 bytes wrap to 0 bytes too.
    let msg = open_err(&raw_gguf(&[1 << 63], 1, 0, &[0; 64]), "wrap-f16");
    assert!(msg.contains("overflow"), "{msg}");
    // Dims whose product overflows.
    let msg = open_err(&raw_gguf(&[1 << 33, 1 << 33], 0, 0, &[]), "dims");
    assert!(msg.contains("overflow"), "{msg}");
}

/// ggml refuses a block-format tensor whose rows end inside a block; it was accepted when the
/// total element count was a whole number of blocks (NaN logits, or plausible tokens).
#[test]
fn rows_that_are_not_whole_blocks_are_refused() {
    let _alone = common::one_at_a_time();
    for q in QFormat::ALL {
        let (block, bytes) = (q.block_elems(), q.block_bytes());
        if block == 1 {
            continue;
        }
        // Two rows of half a block each: one block's worth of elements in all.
        let data = vec![0u8; bytes];
        let msg = open_err(
            &raw_gguf(&[block as u64 / 2, 2], q.ggml_id(), 0, &data),
            q.name(),
        );
        assert!(msg.contains("not a whole number of"), "{}: {msg}", q.name());
    }
}

#[test]
fn the_writer_refuses_what_the_reader_refuses() {
    let _alone = common::one_at_a_time();
    let (_dir, path) = tmp("writer");
    let short = GgufTensorData {
        name: "w".into(),
        shape: vec![2, 4],
        ggml_type: GgmlType::F32,
        data: vec![0; 8],
    };
    let err = write_gguf(&path, &[], &[short]).unwrap_err();
    assert!(err.to_string().contains("need 32"), "{err}");
    let q4k = QFormat::ALL
        .into_iter()
        .find(|q| q.block_elems() == 256)
        .expect("a K-quant");
    let half_rows = GgufTensorData {
        name: "k".into(),
        shape: vec![2, 128],
        ggml_type: GgmlType::Block(q4k),
        data: vec![0; q4k.block_bytes()],
    };
    let err = write_gguf(&path, &[], &[half_rows]).unwrap_err();
    assert!(err.to_string().contains("not a whole number of"), "{err}");
    assert!(!path.exists());
}

/// A value per array element (32 bytes each) let a 30 MiB file of `u8` arrays take ~1 GB;
/// arrays are now kept as their bytes on disk.
#[test]
fn metadata_arrays_take_memory_in_proportion_to_the_file() {
    let _alone = common::one_at_a_time();
    let n = 30 << 20;
    let (_dir, path) = tmp("big-array");
    let meta = vec![kv(
        "junk.bytes",
        GgufValue::Array(vec![GgufValue::U8(7); 1 << 10]),
    )];
    // Write the small array with the writer, then splice in a 30 MiB one by hand (the writer's
    // own input would itself be 32 bytes per element).
    let mut bytes = gguf_to_bytes(&meta, &[], 32);
    let count_at = bytes
        .windows(8)
        .position(|w| w == (1u64 << 10).to_le_bytes())
        .unwrap();
    bytes.truncate(count_at);
    bytes.extend_from_slice(&(n as u64).to_le_bytes());
    bytes.resize(bytes.len() + n, 7);
    std::fs::write(&path, &bytes).unwrap();
    let before = elm::io::rss_bytes().unwrap_or(0);
    let g = GgufFile::open(&path).unwrap();
    let after = elm::io::rss_bytes().unwrap_or(0);
    let packed = g.get("junk.bytes").unwrap().as_packed().unwrap();
    assert_eq!(packed.len(), n);
    assert_eq!(packed.raw_bytes().len(), n);
    let grew = after.saturating_sub(before);
    assert!(
        grew < 3 * n as u64,
        "RSS grew by {grew} bytes for a {n}-byte array"
    );
    // Read through the typed getters as before.
    assert_eq!(g.get_int_array("junk.bytes").unwrap()[..3], [7, 7, 7]);
}

#[test]
fn packed_arrays_round_trip_and_compare_equal_to_built_ones() {
    let _alone = common::one_at_a_time();
    let (_dir, path) = tmp("roundtrip");
    let strings = GgufValue::Array(vec![
        GgufValue::String("a".into()),
        GgufValue::String("βγ".into()),
        GgufValue::String(String::new()),
    ]);
    let floats = GgufValue::Array(vec![GgufValue::F32(0.5), GgufValue::F32(-2.0)]);
    let nested = GgufValue::Array(vec![GgufValue::Array(vec![GgufValue::I32(1)])]);
    let meta = vec![
        kv("s", strings.clone()),
        kv("f", floats.clone()),
        kv("n", nested.clone()),
    ];
    write_gguf(&path, &meta, &[]).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.get("s"), Some(&strings));
    assert_eq!(g.get("f"), Some(&floats));
    assert_eq!(g.get("n"), Some(&nested));
    assert_eq!(g.get_str_array("s").unwrap(), ["a", "βγ", ""]);
    assert_eq!(g.get_f32_array("f").unwrap(), [0.5, -2.0]);
    assert!(g.get_str_array("f").is_err());
    // Rewritten from what was read: the same bytes.
    let again = gguf_to_bytes(g.metadata(), &[], 32);
    assert_eq!(again, std::fs::read(&path).unwrap());
    // A string array with invalid UTF-8 is refused at open.
    let mut bad = again.clone();
    let at = bad.windows(4).position(|w| w == "βγ".as_bytes()).unwrap();
    bad[at] = 0xff;
    let msg = open_err(&bad, "utf8");
    assert!(msg.contains("UTF-8"), "{msg}");
}

#[test]
fn a_fifo_or_a_device_is_named_as_such() {
    let _alone = common::one_at_a_time();
    let msg = match GgufFile::open("/dev/zero") {
        Err(e) => e.to_string(),
        Ok(_) => panic!("/dev/zero opened as a GGUF"),
    };
    assert!(
        msg.contains("not a regular file (a character device)"),
        "{msg}"
    );
    let dir = common::TempDir::new("fifo");
    let fifo = dir.path().join("model.gguf");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let msg = match elm::model::load::load_weights(&fifo) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a FIFO loaded as a model"),
        };
        assert!(msg.contains("a FIFO"), "{msg}");
        assert!(!msg.contains("no such model file"), "{msg}");
    }
    let msg = elm::io::read_text_capped(Path::new("/dev/zero"), 1 << 16)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("longer than the cap of 65536 bytes"), "{msg}");
}

#[test]
fn the_unsupported_type_list_comes_from_the_format_registry() {
    let _alone = common::one_at_a_time();
    let list = supported_types();
    for q in QFormat::ALL {
        assert!(
            list.contains(&q.name().to_ascii_uppercase()),
            "{list} lacks {}",
            q.name()
        );
    }
    // A tensor of an unsupported type (Q8_1, id 9) opens; reading it names the whole list.
    let (_dir, path) = tmp("unsupported");
    std::fs::write(&path, raw_gguf(&[32], 9, 0, &[0; 64])).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let msg = g.tensor_f32("t").unwrap_err().to_string();
    assert!(msg.contains(&list), "{msg}");
}

/// NaN weights: kept as f32 they made every logit NaN (printed as `null`), quantized they
/// became 0 and the model printed pad tokens. Refused where they enter, naming the tensor.
#[test]
fn non_finite_weights_are_refused_naming_the_tensor() {
    let _alone = common::one_at_a_time();
    let mut w = common::tiny_weights(Arch::Llama, 2, 3);
    w.layers[1].w_up[[3, 5]] = f32::NAN;
    let (_dir, path) = tmp("nan");
    elm::formats::save_gguf_model(&w, &path).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let msg = match elm::formats::load_gguf_weights(&g) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("NaN weights loaded"),
    };
    assert!(
        msg.contains("blk.1.ffn_up.weight") && msg.contains("NaN"),
        "{msg}"
    );
    // The quantizing path (what `--weights q8_0` takes) refuses it too.
    let q8 = elm::quant::WeightStorage::Quant(elm::quant::WriteFormat::Q8_0);
    let msg = match elm::formats::load_gguf_quant(&g, q8) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("NaN weights quantized"),
    };
    assert!(msg.contains("blk.1.ffn_up.weight"), "{msg}");
}

/// `attention.sliding_window = 0` silently meant "no window" for Gemma 3, whose local layers
/// need one; token ids beyond u32 were truncated.
#[test]
fn gemma3_without_a_window_and_ids_beyond_u32_are_refused() {
    let _alone = common::one_at_a_time();
    let cfg = elm::model_data::ModelConfig::tiny(Arch::Gemma3);
    let (_dir, path) = tmp("window");
    let mut meta = elm::formats::gguf_model::arch_metadata(&cfg);
    for (k, v) in meta.iter_mut() {
        if k.ends_with("attention.sliding_window") {
            *v = GgufValue::U32(0);
        }
    }
    write_gguf(&path, &meta, &[]).unwrap();
    let msg = elm::formats::config_from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("sliding_window"), "{msg}");

    let mut meta =
        elm::formats::gguf_model::arch_metadata(&elm::model_data::ModelConfig::tiny(Arch::Llama));
    for (k, v) in meta.iter_mut() {
        if k == "tokenizer.ggml.eos_token_id" {
            *v = GgufValue::U64(1 << 32);
        }
    }
    write_gguf(&path, &meta, &[]).unwrap();
    let msg = elm::formats::config_from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("eos_token_id") && msg.contains("exceeds u32"),
        "{msg}"
    );
}

/// The same faults planted in the real files: a tensor of the real SmolLM2 (Q4_1) and Gemma 3
/// (Q4_K_M) GGUFs given dims whose byte size wraps u64, or rows that end inside a block.
#[test]
fn hostile_variants_of_the_real_files_are_refused() {
    let _alone = common::one_at_a_time();
    for path in [common::real_model(), common::real_gemma3()]
        .into_iter()
        .flatten()
    {
        let real = GgufFile::open(&path).unwrap();
        // The first 2-D block-format tensor: its ne entries are patched in a copy of the file.
        let t = real
            .tensors()
            .iter()
            .find(|t| t.ne.len() == 2 && elm::formats::qformat_of(t.ggml_type).is_some())
            .unwrap()
            .clone();
        let bytes = std::fs::read(&path).unwrap();
        let mut entry = (t.name.len() as u64).to_le_bytes().to_vec();
        entry.extend_from_slice(t.name.as_bytes());
        entry.extend_from_slice(&2u32.to_le_bytes());
        let at = bytes
            .windows(entry.len())
            .position(|w| w == entry)
            .expect("the tensor's table entry")
            + entry.len();
        let block = t.ggml_type.block_layout().unwrap().0 as u64;
        for (what, ne0, ne1) in [
            ("wrap", block << 40, 1u64 << 30),
            ("half-block rows", block / 2, t.ne[1] * 2),
        ] {
            let mut hostile = bytes.clone();
            hostile[at..at + 8].copy_from_slice(&ne0.to_le_bytes());
            hostile[at + 8..at + 16].copy_from_slice(&ne1.to_le_bytes());
            let name = format!("real-{what}");
            let msg = open_err(&hostile, &name);
            assert!(
                msg.contains(&format!("tensor `{}`", t.name)),
                "{what}: {msg}"
            );
        }
    }
}

/// A bad hyper-parameter gave a `Config` error without its file: `--json` printed `"file": null`
/// for a head count of 0, RoPE scaling, or a partial rotary dimension.
#[test]
fn every_config_error_names_its_file() {
    let _alone = common::one_at_a_time();
    let cfg = elm::model_data::ModelConfig::tiny(Arch::Llama);
    let (_dir, path) = tmp("config-file");
    let cases: [(&str, GgufValue); 4] = [
        ("llama.attention.head_count", GgufValue::U32(0)),
        (
            "llama.rope.scaling.type",
            GgufValue::String("linear".into()),
        ),
        ("llama.rope.dimension_count", GgufValue::U32(1)),
        ("llama.block_count", GgufValue::U32(0)),
    ];
    for (key, value) in cases {
        let mut meta = elm::formats::gguf_model::arch_metadata(&cfg);
        meta.retain(|(k, _)| k != key);
        meta.push(kv(key, value));
        write_gguf(&path, &meta, &[]).unwrap();
        let err = elm::formats::config_from_gguf(&GgufFile::open(&path).unwrap()).unwrap_err();
        assert_eq!(err.file().as_deref(), Some(path.as_path()), "{key}: {err}");
        let json = err.to_json();
        assert_eq!(
            json["error"]["file"].as_str(),
            Some(path.to_str().unwrap()),
            "{key}: {json}"
        );
        assert!(err.to_string().contains(key), "{key}: {err}");
    }
    let mut meta = elm::formats::gguf_model::arch_metadata(&cfg);
    for (k, v) in meta.iter_mut() {
        if k == "general.architecture" {
            *v = GgufValue::String("mamba".into());
        }
    }
    write_gguf(&path, &meta, &[]).unwrap();
    let err = elm::formats::config_from_gguf(&GgufFile::open(&path).unwrap()).unwrap_err();
    assert_eq!(err.file().as_deref(), Some(path.as_path()), "{err}");
    assert!(err.to_string().contains("`mamba`"), "{err}");
}

/// A NaN block scale inside a Q8_0 tensor: the file opens (blocks are decoded only as they are
/// used, so the loader that keeps blocks never sees it), and `check_tensors` (the CLI's
/// `--check-tensors`) finds it, naming the file, the tensor and the element. The real files pass.
#[test]
fn check_tensors_finds_a_nan_scale_inside_a_block() {
    let _alone = common::one_at_a_time();
    let mut data = Vec::new();
    for scale in [0x3C00u16, 0x7E00] {
        // Q8_0: an f16 scale (1.0, then NaN) and 32 signed bytes.
        data.extend_from_slice(&scale.to_le_bytes());
        data.extend_from_slice(&[1u8; 32]);
    }
    let bytes = raw_gguf(&[64, 1], 8, 0, &data);
    let (_dir, path) = tmp("nan-scale");
    std::fs::write(&path, bytes).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let err = g.check_tensors().unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.file().as_deref(), Some(path.as_path()), "{msg}");
    assert!(
        msg.contains("tensor `t`") && msg.contains("element 32 is NaN"),
        "{msg}"
    );
    let err = elm::model::check_tensors(&path).unwrap_err();
    assert!(err.to_string().contains("element 32"), "{err}");
    // What `--check-tensors` runs before a load: the scan for a GGUF, and for an HF directory
    // nothing (its load decodes every weight and refuses the NaN itself, naming the tensor).
    let err = elm::model::check_tensors_before_load(&path).unwrap_err();
    assert!(err.to_string().contains("element 32"), "{err}");
    let mut w = common::tiny_weights(Arch::Llama, 2, 3);
    w.layers[0].wq[[1, 2]] = f32::NAN;
    let hf = _dir.path().join("hf");
    elm::formats::save_hf_model(&w, &hf).unwrap();
    elm::model::check_tensors_before_load(&hf).unwrap();
    let msg = match elm::formats::load_hf_model(&hf) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an HF directory with a NaN weight loaded"),
    };
    assert!(msg.contains("q_proj") && msg.contains("NaN"), "{msg}");
    for real in [common::real_model(), common::real_gemma3()]
        .into_iter()
        .flatten()
    {
        elm::model::check_tensors(&real).unwrap();
    }
}

/// The embedding rows a prompt touches are checked as they are read (always on, C values a
/// token): a NaN there is refused naming the token, not turned into NaN logits.
#[test]
fn a_non_finite_embedding_row_touched_by_the_prompt_is_refused() {
    let _alone = common::one_at_a_time();
    let mut w = common::tiny_weights(Arch::Llama, 2, 5);
    w.embed[[7, 3]] = f32::NAN;
    let t = elm::model::AnyTransformer::F32(elm::model::Transformer::new(w).unwrap());
    let ok = t.prompt_logits(&[vec![5, 6]]);
    assert!(ok.is_ok(), "{:?}", ok.err());
    let msg = t.prompt_logits(&[vec![5, 7]]).unwrap_err().to_string();
    assert!(msg.contains("token 7") && msg.contains("NaN"), "{msg}");
}
