//! Writes the seed corpora of the fuzz targets: small, valid, deterministic inputs built with
//! elm's own writers (and a hand-written safetensors writer with a fixed key order), each
//! checked to load before it is written. Usage: `gen_seeds OUT_DIR` writes
//! `OUT_DIR/<target>/<name>` (scripts/fuzz.sh: `fuzz/seeds`, committed).
//!
//! When the real model is present (`$ELM_MODELS_DIR` or `models/`, scripts/fetch-smollm2.sh),
//! it also writes `real-*` seeds from it (git-ignored, not committed): the first 64 KiB of the
//! file, and its metadata with the vocabulary cut to 512 tokens and no tensors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use elm::equilibrium::quant_gguf::{read_quant_gguf_with, write_quant_gguf};
use elm::equilibrium::quant_module::QuantElm;
use elm::formats::gguf::{gguf_to_bytes, kv, GgmlType, GgufFile, GgufTensorData, GgufValue};
use elm::formats::gguf_model::arch_metadata;
use elm::formats::hf::{config_to_hf_json, load_hf_model_with};
use elm::formats::{config_from_hf_json, load_gguf_quant, load_gguf_weights, Tokenizer};
use elm::io::tensor_file::load_f32_tensors;
use elm::model_data::{Arch, ModelConfig};
use elm::quant::WeightStorage;
use elm::train::ParamStore;
use elm_fuzz::{micro_config, safetensors_case, ARCHS};
use serde_json::{json, Value};

const DEFAULT_ALIGNMENT: u64 = 32;

struct Out {
    root: PathBuf,
    count: usize,
    bytes: usize,
}

impl Out {
    fn put(&mut self, target: &str, name: &str, data: &[u8]) -> PathBuf {
        let dir = self.root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        // Unchanged seeds are not rewritten (their mtime stays; `git status` stays clean).
        if std::fs::read(&path).ok().as_deref() != Some(data) {
            std::fs::write(&path, data).unwrap();
        }
        self.count += 1;
        self.bytes += data.len();
        path
    }
}

/// A scratch file for checking a seed with the reader it is for.
fn scratch(name: &str, data: &[u8]) -> PathBuf {
    elm_fuzz::input_file(name, data)
}

/// Deterministic values in ±1 (no RNG: the seeds must not change between runs).
fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7 + salt * 13) % 17) as f32 - 8.0) / 8.0)
        .collect()
}

/// Deterministic bytes for a quantized tensor (any bit pattern is a valid block, f16 scales
/// included: NaN and inf scales must dequantize without panicking too).
fn pattern_bytes(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

// ------------------------------------------------------------------------------- GGUF models

/// The GGUF tensors of a dense model of `cfg` (llama.cpp names, HF `[rows, cols]` shapes, F32):
/// what `load_gguf_weights` reads, Gemma 3's extra norms included.
fn model_tensors(cfg: &ModelConfig) -> Vec<GgufTensorData> {
    let (c, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (hd, kvd, d) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.head_dim,
    );
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![v, c]),
        ("output_norm.weight".into(), vec![c]),
    ];
    if !cfg.tie_word_embeddings {
        shapes.push(("output.weight".into(), vec![v, c]));
    }
    for l in 0..cfg.num_layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        shapes.push((n("attn_norm.weight"), vec![c]));
        shapes.push((n("attn_q.weight"), vec![hd, c]));
        shapes.push((n("attn_k.weight"), vec![kvd, c]));
        shapes.push((n("attn_v.weight"), vec![kvd, c]));
        shapes.push((n("attn_output.weight"), vec![c, hd]));
        if cfg.attention_bias {
            shapes.push((n("attn_q.bias"), vec![hd]));
            shapes.push((n("attn_k.bias"), vec![kvd]));
            shapes.push((n("attn_v.bias"), vec![kvd]));
        }
        shapes.push((n("ffn_norm.weight"), vec![c]));
        shapes.push((n("ffn_gate.weight"), vec![i, c]));
        shapes.push((n("ffn_up.weight"), vec![i, c]));
        shapes.push((n("ffn_down.weight"), vec![c, i]));
        if cfg.has_gemma_norms() {
            shapes.push((n("attn_q_norm.weight"), vec![d]));
            shapes.push((n("attn_k_norm.weight"), vec![d]));
            shapes.push((n("post_attention_norm.weight"), vec![c]));
            shapes.push((n("post_ffw_norm.weight"), vec![c]));
        }
    }
    shapes
        .iter()
        .enumerate()
        .map(|(k, (name, shape))| {
            GgufTensorData::f32(name, shape, &values(shape.iter().product(), k))
        })
        .collect()
}

fn s(x: &str) -> GgufValue {
    GgufValue::String(x.into())
}
fn strings<I: IntoIterator<Item = String>>(items: I) -> GgufValue {
    GgufValue::Array(items.into_iter().map(GgufValue::String).collect())
}

/// GPT-2's byte → printable-char map (the byte-level BPE alphabet).
fn byte_symbols() -> Vec<String> {
    let mut bytes: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut map = vec![0u32; 256];
    let mut n = 0;
    for b in 0..256u32 {
        if !bytes.contains(&b) {
            bytes.push(b);
            map[b as usize] = 256 + n;
            n += 1;
        } else {
            map[b as usize] = b;
        }
    }
    (0..256)
        .map(|b| char::from_u32(map[b]).unwrap().to_string())
        .collect()
}

/// `tokenizer.ggml.*` of a byte-level BPE (`gpt2`): 3 control tokens, the 256 byte symbols,
/// a few merges (letters, a leading space, digits), a ChatML template.
fn gpt2_tokenizer_meta(pre: &str) -> Vec<(String, GgufValue)> {
    let merges = [
        "a b", "ab c", "Ġ a", "1 2", "h e", "he l", "hel l", "hell o", "Ġ w",
    ];
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    tokens.extend(byte_symbols());
    tokens.extend(merges.iter().map(|m| m.replace(' ', "")));
    let mut types = vec![3i32; 3];
    types.resize(tokens.len(), 1);
    vec![
        kv("tokenizer.ggml.model", s("gpt2")),
        kv("tokenizer.ggml.pre", s(pre)),
        kv("tokenizer.ggml.tokens", strings(tokens)),
        kv(
            "tokenizer.ggml.token_type",
            GgufValue::Array(types.into_iter().map(GgufValue::I32).collect()),
        ),
        kv("tokenizer.ggml.merges", strings(merges.iter().map(|m| m.to_string()))),
        kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1)),
        kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2)),
        kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(false)),
        kv(
            "tokenizer.chat_template",
            s("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"),
        ),
    ]
}

/// `tokenizer.ggml.*` of a SentencePiece-style vocabulary (`llama`, as Gemma 3's): unknown,
/// BOS, EOS, a control token, the 256 `<0xXX>` byte tokens, `▁`-pieces with scores, and a
/// user-defined run of newlines.
fn llama_tokenizer_meta(add_space_prefix: bool) -> Vec<(String, GgufValue)> {
    let mut tokens: Vec<String> = vec![
        "<unk>".into(),
        "<s>".into(),
        "</s>".into(),
        "<start_of_turn>".into(),
    ];
    let mut types = vec![2i32, 3, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let pieces = [
        "▁", "a", "b", "c", "ab", "abc", "▁a", "▁ab", "▁abc", "h", "e", "l", "o", "he", "ll",
        "llo", "hello", "▁hello", "1", "2", "12",
    ];
    for p in pieces {
        tokens.push(p.into());
        types.push(1);
    }
    tokens.push("\n\n".into());
    types.push(4);
    let scores: Vec<GgufValue> = (0..tokens.len())
        .map(|i| {
            GgufValue::F32(if types[i] == 1 {
                -(i as f32) / 10.0
            } else {
                0.0
            })
        })
        .collect();
    vec![
        kv("tokenizer.ggml.model", s("llama")),
        kv("tokenizer.ggml.pre", s("default")),
        kv("tokenizer.ggml.tokens", strings(tokens)),
        kv(
            "tokenizer.ggml.token_type",
            GgufValue::Array(types.into_iter().map(GgufValue::I32).collect()),
        ),
        kv("tokenizer.ggml.scores", GgufValue::Array(scores)),
        kv("tokenizer.ggml.unknown_token_id", GgufValue::U32(0)),
        kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1)),
        kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2)),
        kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(true)),
        kv(
            "tokenizer.ggml.add_space_prefix",
            GgufValue::Bool(add_space_prefix),
        ),
    ]
}

/// A dense micro model of `arch` as GGUF, with `tokenizer` metadata added; checked to load.
fn model_gguf(arch: Arch, tokenizer: Vec<(String, GgufValue)>) -> Vec<u8> {
    let cfg = micro_config(arch);
    let mut meta = arch_metadata(&cfg);
    // arch_metadata writes the BOS/EOS ids too: the tokenizer's replace them.
    meta.retain(|(k, _)| !tokenizer.iter().any(|(t, _)| t == k));
    meta.extend(tokenizer);
    let bytes = gguf_to_bytes(&meta, &model_tensors(&cfg), DEFAULT_ALIGNMENT);
    let g = GgufFile::open(scratch("check.gguf", &bytes)).unwrap();
    let w = load_gguf_weights(&g).unwrap_or_else(|e| panic!("{arch:?} seed: {e}"));
    assert_eq!(w.config, cfg, "{arch:?} seed config");
    bytes
}

/// One small tensor of every GGUF type id the reader knows (one block each, 1-D and 2-D) plus
/// one it does not (`IQ2_XXS`, id 16), under `general.alignment` 64.
fn all_types_gguf() -> Vec<u8> {
    let mut tensors = Vec::new();
    for id in [0u32, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30, 16] {
        let ty = GgmlType::from_id(id);
        let (block, block_bytes) = ty.block_layout().unwrap_or((1, 1));
        for (k, shape) in [vec![block], vec![2, block]].into_iter().enumerate() {
            let n_blocks = shape.iter().product::<usize>() / block;
            tensors.push(GgufTensorData {
                name: format!("t{id}.{k}"),
                shape,
                ggml_type: ty,
                data: pattern_bytes(n_blocks * block_bytes, id as u8),
            });
        }
    }
    let meta = vec![
        kv("general.architecture", s("llama")),
        kv("general.alignment", GgufValue::U32(64)),
    ];
    let bytes = gguf_to_bytes(&meta, &tensors, 64);
    let g = GgufFile::open(scratch("check.gguf", &bytes)).unwrap();
    assert_eq!(g.tensors().len(), tensors.len());
    bytes
}

/// Metadata of every value type, nested arrays and an empty one, no tensors; GGUF v2 header.
fn all_values_gguf() -> Vec<u8> {
    let meta = vec![
        kv("u8", GgufValue::U8(1)),
        kv("i8", GgufValue::I8(-1)),
        kv("u16", GgufValue::U16(2)),
        kv("i16", GgufValue::I16(-2)),
        kv("u32", GgufValue::U32(3)),
        kv("i32", GgufValue::I32(-3)),
        kv("f32", GgufValue::F32(0.5)),
        kv("bool", GgufValue::Bool(true)),
        kv("string", s("héllo")),
        kv("u64", GgufValue::U64(u64::MAX)),
        kv("i64", GgufValue::I64(i64::MIN)),
        kv("f64", GgufValue::F64(f64::NAN)),
        kv("empty", GgufValue::Array(vec![])),
        kv(
            "nested",
            GgufValue::Array(vec![
                GgufValue::Array(vec![GgufValue::U8(1), GgufValue::U8(2)]),
                GgufValue::Array(vec![GgufValue::U8(3)]),
            ]),
        ),
        kv(
            "floats",
            GgufValue::Array(vec![GgufValue::F32(1.0), GgufValue::F32(-2.0)]),
        ),
        kv("general.alignment", GgufValue::U64(16)),
    ];
    let mut bytes = gguf_to_bytes(&meta, &[], 16);
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    GgufFile::open(scratch("check.gguf", &bytes)).unwrap();
    bytes
}

// ---------------------------------------------------------------------------- tokenizers

/// A word-level `tokenizer.json` of 8 words, the micro models' vocabulary.
fn word_level_json() -> String {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(t.to_string(), i.into());
    }
    for i in 3..8 {
        vocab.insert(format!("w{i}"), i.into());
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
    .to_string()
}

/// A WordPiece `tokenizer.json` with BERT's normalizer, pre-tokenizer and post-processor.
fn wordpiece_json() -> String {
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [
            {"id": 0, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]}, "[SEP]": {"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
            "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "world": 4, "he": 5, "##llo": 6, "1": 7, "##2": 8, ",": 9, "!": 10}}
    })
    .to_string()
}

/// A Unigram `tokenizer.json` with a Metaspace pre-tokenizer and decoder, NFKC, byte fallback.
fn unigram_json() -> String {
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Replace", "pattern": {"String": "  "}, "content": " "}]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
        "post_processor": null,
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": true,
            "vocab": [["<unk>", 0.0], ["▁", -1.0], ["▁hello", -2.0], ["he", -3.0], ["llo", -3.5], ["<0x21>", -9.0], ["w", -4.0], ["o", -4.0], ["r", -4.0], ["l", -4.0], ["d", -4.0], ["h", -4.0], ["e", -4.0]]}
    })
    .to_string()
}

/// A BPE `tokenizer.json` with a regex Split, ByteLevel, added tokens and a padding/truncation.
fn bpe_regex_json() -> String {
    let syms = byte_symbols();
    let mut vocab = serde_json::Map::new();
    for (i, t) in syms.iter().enumerate() {
        vocab.insert(t.clone(), (i + 1).into());
    }
    vocab.insert("<pad>".into(), 0.into());
    vocab.insert("he".into(), 257.into());
    vocab.insert("ll".into(), 258.into());
    json!({
        "version": "1.0",
        "truncation": {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0},
        "padding": {"strategy": {"Fixed": 4}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>"},
        "added_tokens": [{"id": 259, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}| ?\\p{L}+|\\s+(?!\\S)"}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": [["h", "e"], ["l", "l"]]}
    })
    .to_string()
}

/// A Llama-2-style `tokenizer.json`: BPE with byte fallback, a Prepend + Replace normalizer,
/// and the decoder chain Replace, ByteFallback, Fuse, Strip (what HF writes for SentencePiece
/// BPE models), plus a TemplateProcessing post-processor adding `<s>`.
fn llama2_style_json() -> String {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(t.to_string(), i.into());
    }
    for b in 0..=255u8 {
        vocab.insert(format!("<0x{b:02X}>"), (3 + b as usize).into());
    }
    for (i, t) in [
        "▁", "h", "e", "l", "o", "he", "ll", "hell", "hello", "▁hello",
    ]
    .iter()
    .enumerate()
    {
        vocab.insert(t.to_string(), (259 + i).into());
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [
            {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
        ],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": ["h e", "l l", "he ll", "hell o", "▁ hello"]}
    })
    .to_string()
}

/// A `tokenizer_config.json` naming BOS/EOS (one as a string, one as an AddedToken object),
/// `add_bos_token` and a ChatML template with a literal default system prompt.
fn tokenizer_config(bos: &str, eos: &str) -> String {
    json!({
        "bos_token": bos,
        "eos_token": {"content": eos, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false},
        "add_bos_token": true,
        "chat_template": "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}{% endfor %}"
    })
    .to_string()
}

/// `json` + NUL + `config`: the tokenizer_json target's input layout.
fn json_with_config(json: &str, config: Option<&str>) -> Vec<u8> {
    Tokenizer::from_json_parts(json, config, Path::new("seed")).unwrap();
    let mut out = json.as_bytes().to_vec();
    if let Some(c) = config {
        out.push(0);
        out.extend_from_slice(c.as_bytes());
    }
    out
}

// --------------------------------------------------------------------------- safetensors

/// A safetensors file by hand, in the given tensor order, with `metadata` sorted (the
/// `safetensors` crate writes its metadata map in hash order, which would change the seeds).
fn safetensors_bytes(
    tensors: &[(&str, &str, Vec<usize>, Vec<u8>)],
    metadata: &BTreeMap<&str, String>,
) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), json!(metadata));
    }
    let mut offset = 0;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.len()]}),
        );
        offset += data.len();
    }
    let mut text = Value::Object(header).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The HF tensors of a micro model of `cfg` (names and shapes as `load_hf_model_with` expects),
/// as `dtype` (F32, F16 or BF16), plus `extra`.
fn hf_safetensors(cfg: &ModelConfig, dtype: &str, extra: bool) -> Vec<u8> {
    let (c, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (hd, kvd) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, c]),
        ("model.norm.weight".into(), vec![c]),
    ];
    if !cfg.tie_word_embeddings {
        shapes.push(("lm_head.weight".into(), vec![v, c]));
    }
    let p = |s: &str| format!("model.layers.0.{s}");
    shapes.push((p("input_layernorm.weight"), vec![c]));
    shapes.push((p("self_attn.q_proj.weight"), vec![hd, c]));
    shapes.push((p("self_attn.k_proj.weight"), vec![kvd, c]));
    shapes.push((p("self_attn.v_proj.weight"), vec![kvd, c]));
    shapes.push((p("self_attn.o_proj.weight"), vec![c, hd]));
    if cfg.attention_bias {
        shapes.push((p("self_attn.q_proj.bias"), vec![hd]));
        shapes.push((p("self_attn.k_proj.bias"), vec![kvd]));
        shapes.push((p("self_attn.v_proj.bias"), vec![kvd]));
    }
    shapes.push((p("post_attention_layernorm.weight"), vec![c]));
    if cfg.has_gemma_norms() {
        shapes.push((p("pre_feedforward_layernorm.weight"), vec![c]));
        shapes.push((p("post_feedforward_layernorm.weight"), vec![c]));
        shapes.push((p("self_attn.q_norm.weight"), vec![cfg.head_dim]));
        shapes.push((p("self_attn.k_norm.weight"), vec![cfg.head_dim]));
    }
    shapes.push((p("mlp.gate_proj.weight"), vec![i, c]));
    shapes.push((p("mlp.up_proj.weight"), vec![i, c]));
    shapes.push((p("mlp.down_proj.weight"), vec![c, i]));
    if extra {
        shapes.push(("elm.extra".into(), vec![2, 2]));
    }
    let tensors: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = shapes
        .iter()
        .enumerate()
        .map(|(k, (name, shape))| {
            let vals = values(shape.iter().product(), k);
            let data = match dtype {
                "F32" => f32_bytes(&vals),
                // f16 / bf16 of the same values (exact: multiples of 1/8 in ±1).
                "F16" => vals
                    .iter()
                    .flat_map(|x| f16_bits(*x).to_le_bytes())
                    .collect(),
                _ => vals
                    .iter()
                    .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
                    .collect(),
            };
            (name.as_str(), dtype, shape.clone(), data)
        })
        .collect();
    safetensors_bytes(&tensors, &BTreeMap::new())
}

/// f32 → IEEE half bits for the seed values (multiples of 1/8 in [-1, 1]: exact, normal or 0).
fn f16_bits(x: f32) -> u16 {
    if x == 0.0 {
        return 0;
    }
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let mant = ((b >> 13) & 0x3ff) as u16;
    sign | ((exp as u16) << 10) | mant
}

// -------------------------------------------------------------------------------- main

fn main() {
    let root = PathBuf::from(std::env::args().nth(1).expect("usage: gen_seeds OUT_DIR"));
    let mut out = Out {
        root,
        count: 0,
        bytes: 0,
    };

    // gguf_reader: micro models of the three families, every tensor type, every value type,
    // and a quantized-ELM GGUF as `elm quantize` writes it (dense, its tokenizer as JSON).
    let llama = model_gguf(Arch::Llama, gpt2_tokenizer_meta("smollm"));
    out.put("gguf_reader", "micro-llama.gguf", &llama);
    out.put(
        "gguf_reader",
        "micro-qwen2.gguf",
        &model_gguf(Arch::Qwen2, vec![]),
    );
    out.put(
        "gguf_reader",
        "micro-gemma3.gguf",
        &model_gguf(Arch::Gemma3, vec![]),
    );
    out.put("gguf_reader", "all-types.gguf", &all_types_gguf());
    out.put("gguf_reader", "all-values-v2.gguf", &all_values_gguf());
    let quant_elm = {
        let g = GgufFile::open(scratch("llama.gguf", &llama)).unwrap();
        let dense = load_gguf_quant(&g, WeightStorage::Auto).unwrap();
        let tok = Tokenizer::from_json_parts(&word_level_json(), None, Path::new("seed")).unwrap();
        let q = QuantElm {
            dense,
            module: None,
        };
        let path = elm_fuzz::scratch_dir().join("quant-elm.gguf");
        write_quant_gguf(&path, None, &q, &tok).unwrap();
        read_quant_gguf_with(&path, WeightStorage::Auto).unwrap();
        std::fs::read(&path).unwrap()
    };
    out.put("gguf_reader", "quant-elm.gguf", &quant_elm);

    // gguf_tokenizer: the two GGUF tokenizer families (gpt2 BPE under three split-regex sets,
    // llama SentencePiece-style with and without the space prefix) and the embedded HF JSON.
    for pre in ["smollm", "llama-bpe", "qwen2"] {
        let meta = gpt2_tokenizer_meta(pre);
        let bytes = gguf_to_bytes(&meta, &[], DEFAULT_ALIGNMENT);
        let g = GgufFile::open(scratch("check.gguf", &bytes)).unwrap();
        Tokenizer::from_gguf(&g).unwrap();
        out.put("gguf_tokenizer", &format!("gpt2-{pre}.gguf"), &bytes);
    }
    for prefix in [true, false] {
        let bytes = gguf_to_bytes(&llama_tokenizer_meta(prefix), &[], DEFAULT_ALIGNMENT);
        let g = GgufFile::open(scratch("check.gguf", &bytes)).unwrap();
        let tok = Tokenizer::from_gguf(&g).unwrap();
        tok.encode("hello abc 12\n\nx", true).unwrap();
        out.put(
            "gguf_tokenizer",
            &format!("llama-spm-prefix-{prefix}.gguf"),
            &bytes,
        );
    }
    out.put("gguf_tokenizer", "quant-elm.gguf", &quant_elm);

    // tokenizer_json: HF tokenizer.json files of each model type, with and without a config,
    // and the JSON of the GGUF tokenizers above (to_json_parts).
    let word = word_level_json();
    out.put(
        "tokenizer_json",
        "wordlevel.json",
        &json_with_config(&word, None),
    );
    out.put(
        "tokenizer_json",
        "wordlevel+config.bin",
        &json_with_config(&word, Some(&tokenizer_config("<s>", "</s>"))),
    );
    out.put(
        "tokenizer_json",
        "wordpiece.json",
        &json_with_config(&wordpiece_json(), None),
    );
    out.put(
        "tokenizer_json",
        "unigram+config.bin",
        &json_with_config(&unigram_json(), Some(&tokenizer_config("<unk>", "▁hello"))),
    );
    out.put(
        "tokenizer_json",
        "bpe-regex.json",
        &json_with_config(&bpe_regex_json(), None),
    );
    out.put(
        "tokenizer_json",
        "llama2-style+config.bin",
        &json_with_config(&llama2_style_json(), Some(&tokenizer_config("<s>", "</s>"))),
    );
    for (name, meta) in [
        ("gguf-gpt2+config.bin", gpt2_tokenizer_meta("smollm")),
        ("gguf-llama-spm+config.bin", llama_tokenizer_meta(true)),
    ] {
        let bytes = gguf_to_bytes(&meta, &[], DEFAULT_ALIGNMENT);
        let g = GgufFile::open(scratch("check.gguf", &bytes)).unwrap();
        let (json, config) = Tokenizer::from_gguf(&g)
            .unwrap()
            .to_json_parts(false)
            .unwrap();
        out.put(
            "tokenizer_json",
            name,
            &json_with_config(&json, Some(&config)),
        );
    }

    // hf_config: what save_hf_model writes for each family, and the committed test fixtures.
    for arch in ARCHS {
        let v = config_to_hf_json(&micro_config(arch));
        config_from_hf_json(&v).unwrap();
        out.put(
            "hf_config",
            &format!("micro-{arch:?}.json").to_lowercase(),
            v.to_string().as_bytes(),
        );
    }
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/io");
    for name in ["hf_tiny_llama", "hf_tiny_qwen2"] {
        let text = std::fs::read(fixtures.join(name).join("config.json")).unwrap();
        config_from_hf_json(&serde_json::from_slice(&text).unwrap()).unwrap();
        out.put("hf_config", &format!("{name}.json"), &text);
    }

    // safetensors: selector byte (family; +128 adds the extra tensor) + a checkpoint of the
    // micro model, F32 for each family and F16 / BF16 for Llama.
    let st_dir = elm_fuzz::input_dir("seed-hf");
    let put_st = |out: &mut Out, name: &str, selector: u8, file: Vec<u8>| {
        let (cfg, extra) = safetensors_case(selector);
        std::fs::write(st_dir.join("model.safetensors"), &file).unwrap();
        load_hf_model_with(&st_dir, cfg, &extra).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut bytes = vec![selector];
        bytes.extend(file);
        out.put("safetensors", name, &bytes);
    };
    for (k, arch) in ARCHS.into_iter().enumerate() {
        let cfg = micro_config(arch);
        let name = format!("micro-{arch:?}-f32.bin").to_lowercase();
        put_st(&mut out, &name, k as u8, hf_safetensors(&cfg, "F32", false));
    }
    let llama_cfg = micro_config(Arch::Llama);
    put_st(
        &mut out,
        "micro-llama-f16.bin",
        0,
        hf_safetensors(&llama_cfg, "F16", false),
    );
    put_st(
        &mut out,
        "micro-llama-bf16.bin",
        0,
        hf_safetensors(&llama_cfg, "BF16", false),
    );
    put_st(
        &mut out,
        "micro-llama-f32-extra.bin",
        128,
        hf_safetensors(&llama_cfg, "F32", true),
    );

    // tensor_file: a ParamStore file (order + frozen metadata), a plain one, odd shapes.
    let order = json!(["b.weight", "a.bias", "scalar"]).to_string();
    let frozen = json!(["a.bias"]).to_string();
    let param_store = safetensors_bytes(
        &[
            ("a.bias", "F32", vec![3], f32_bytes(&values(3, 1))),
            ("b.weight", "F32", vec![2, 3], f32_bytes(&values(6, 2))),
            ("scalar", "F32", vec![], f32_bytes(&[0.25])),
        ],
        &BTreeMap::from([("elm.param_order", order), ("elm.frozen", frozen)]),
    );
    let store = ParamStore::load(scratch("check.safetensors", &param_store)).unwrap();
    assert_eq!(store.len(), 3);
    out.put("tensor_file", "param-store.safetensors", &param_store);
    let plain = safetensors_bytes(
        &[
            ("m.x", "F32", vec![2, 2], f32_bytes(&values(4, 3))),
            ("v.x", "F32", vec![2, 2], f32_bytes(&values(4, 4))),
            ("empty", "F32", vec![0, 5], vec![]),
        ],
        &BTreeMap::from([("note", "optimizer state".to_string())]),
    );
    assert_eq!(
        load_f32_tensors(&scratch("check.safetensors", &plain))
            .unwrap()
            .tensors
            .len(),
        3
    );
    out.put("tensor_file", "plain.safetensors", &plain);
    let no_tensors = safetensors_bytes(&[], &BTreeMap::new());
    load_f32_tensors(&scratch("check.safetensors", &no_tensors)).unwrap();
    out.put("tensor_file", "no-tensors.safetensors", &no_tensors);
    // Not F32: a typed error, still a useful starting point for mutations.
    let f16 = safetensors_bytes(
        &[("h", "F16", vec![2], vec![0, 0x3c, 0, 0xbc])],
        &BTreeMap::new(),
    );
    out.put("tensor_file", "f16.safetensors", &f16);

    let committed = (out.count, out.bytes);
    real_model_seeds(&mut out);
    println!(
        "gen_seeds: {} synthetic seeds ({} bytes) in {}; {} real-model seeds",
        committed.0,
        committed.1,
        out.root.display(),
        out.count - committed.0
    );
}

/// `real-*` seeds from the real model, if present: the first 64 KiB of the GGUF (the header
/// and the start of its vocabulary; truncated, so it only exercises the metadata parser), and
/// its whole metadata with every array cut to 512 items (merges kept only where both halves
/// and the result are in the cut vocabulary) and no tensors: a real tokenizer that loads.
fn real_model_seeds(out: &mut Out) {
    let path = elm::formats::models_dir().join(elm::formats::SMOLLM2_GGUF);
    let Ok(file) = std::fs::File::open(&path) else {
        return;
    };
    use std::io::Read;
    let mut head = Vec::new();
    file.take(64 << 10).read_to_end(&mut head).unwrap();
    out.put("gguf_reader", "real-smollm2-head.gguf", &head);
    out.put("gguf_tokenizer", "real-smollm2-head.gguf", &head);

    let g = GgufFile::open(&path).unwrap();
    let keep = 512;
    let tokens: std::collections::HashSet<&str> = g
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap()
        .into_iter()
        .take(keep)
        .collect();
    let meta: Vec<(String, GgufValue)> = g
        .metadata()
        .iter()
        .map(|(k, v)| {
            let v = match v {
                GgufValue::Array(items) if k == "tokenizer.ggml.merges" => GgufValue::Array(
                    items
                        .iter()
                        .filter(|m| {
                            let m = m.as_str().unwrap();
                            let (a, b) = m.split_once(' ').unwrap();
                            tokens.contains(a)
                                && tokens.contains(b)
                                && tokens.contains(format!("{a}{b}").as_str())
                        })
                        .take(keep)
                        .cloned()
                        .collect(),
                ),
                GgufValue::Array(items) => {
                    GgufValue::Array(items.iter().take(keep).cloned().collect())
                }
                other => other.clone(),
            };
            (k.clone(), v)
        })
        .collect();
    let bytes = gguf_to_bytes(&meta, &[], g.alignment());
    let cut = GgufFile::open(scratch("check.gguf", &bytes)).unwrap();
    Tokenizer::from_gguf(&cut).unwrap();
    out.put("gguf_tokenizer", "real-smollm2-meta512.gguf", &bytes);
    out.put("gguf_reader", "real-smollm2-meta512.gguf", &bytes);
}
