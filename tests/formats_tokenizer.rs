//! GGUF tokenizer vs tests/fixtures/gen/ref_tokenizer.py (a Python port of llama.cpp's SMOLLM BPE,
//! cross-checked against transformers' GGUF converter) and the GGUF's own Jinja chat
//! template rendered with jinja2.

mod common;

use std::sync::OnceLock;

use common::*;
use elm::formats::gguf::{kv, write_gguf, GgufValue};
use elm::formats::tokenizer::Tokenizer;
use elm::formats::GgufFile;
use elm::ElmError;

/// The real checkpoint's tokenizer, loaded once; `None` (each caller printing its own skip
/// line) without the real model.
fn smollm2_tokenizer() -> Option<&'static Tokenizer> {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    let path = real_model()?;
    Some(TOK.get_or_init(|| Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap()))
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn first_diff(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn token_ids_match_reference_and_decode_round_trips() {
    let Some(tok) = smollm2_tokenizer() else {
        return;
    };
    let fx = fixture_json("io/tokenizer_ref.json");
    assert_eq!(tok.bos_id(), Some(fx["bos"].as_u64().unwrap() as u32));
    assert_eq!(tok.eos_id(), Some(fx["eos"].as_u64().unwrap() as u32));
    assert_eq!(tok.vocab_size(), 49152);
    // The count the tokenizers crate makes from its whole vocabulary map (which ours avoids).
    assert_eq!(tok.vocab_size(), tok.inner().get_vocab_size(true));
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = tok.encode(text, false).unwrap();
        assert!(
            got == want,
            "{text:?}: ids differ from index {}\n got  {got:?}\n want {want:?}",
            first_diff(&got, &want)
        );
        // SmolLM2's GGUF has add_bos_token = false: add_special adds nothing.
        assert_eq!(
            tok.encode(text, true).unwrap(),
            want,
            "{text:?} with add_special"
        );
        assert_eq!(tok.decode(&got).unwrap(), text);
    }
}

#[test]
fn control_tokens_stay_whole() {
    let Some(tok) = smollm2_tokenizer() else {
        return;
    };
    let fx = fixture_json("io/tokenizer_ref.json");
    for t in fx["control_tokens"].as_array().unwrap() {
        let t = t.as_str().unwrap();
        let got = tok.encode(t, false).unwrap();
        assert_eq!(got.len(), 1, "{t} -> {got:?}");
        assert_eq!(tok.id_to_token(got[0]).as_deref(), Some(t));
    }
}

#[test]
fn chat_template_matches_jinja_rendering_of_gguf_template() {
    let Some(tok) = smollm2_tokenizer() else {
        return;
    };
    assert_eq!(
        tok.default_system_prompt(),
        Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    );
    let fx = fixture_json("io/tokenizer_ref.json");
    for chat in fx["chats"].as_array().unwrap() {
        let msgs: Vec<(String, String)> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m[0].as_str().unwrap().into(), m[1].as_str().unwrap().into()))
            .collect();
        let gen = chat["add_generation_prompt"].as_bool().unwrap();
        let rendered = tok.apply_chat_template(&msgs, gen);
        assert_eq!(rendered, chat["rendered"].as_str().unwrap());
        assert_eq!(
            tok.encode(&rendered, false).unwrap(),
            ids(&chat["ids"]),
            "{rendered:?}"
        );
    }
}

#[test]
fn tokenizer_json_round_trip_gives_same_ids() {
    let Some(tok) = smollm2_tokenizer() else {
        return;
    };
    let dir = TempDir::new("tokjson");
    let path = dir.join("tokenizer.json");
    tok.save(&path).unwrap();
    let reloaded = Tokenizer::from_file(&path).unwrap();
    let fx = fixture_json("io/tokenizer_ref.json");
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            reloaded.encode(text, false).unwrap(),
            ids(&case["ids"]),
            "{text:?}"
        );
    }
    // bos/eos from a sibling tokenizer_config.json.
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
            "chat_template": "{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}"}"#,
    )
    .unwrap();
    let reloaded = Tokenizer::from_file(&path).unwrap();
    assert_eq!((reloaded.bos_id(), reloaded.eos_id()), (Some(1), Some(2)));
    assert_eq!(reloaded.default_system_prompt(), Some("Be brief."));
}

#[test]
fn decode_rejects_out_of_range_ids() {
    let Some(tok) = smollm2_tokenizer() else {
        return;
    };
    let e = tok.decode(&[1, 49152]).unwrap_err();
    assert!(
        matches!(e, ElmError::Tokenizer(_)) && e.to_string().contains("49152"),
        "{e}"
    );
}

/// A tiny byte-level vocabulary in a synthetic GGUF: exercises from_gguf without the model.
/// Returns the GGUF's path and the temp dir holding it (removed when dropped).
fn tiny_vocab_gguf(
    pre: &str,
    model: &str,
    merges: &[&str],
    add_bos: bool,
) -> (TempDir, std::path::PathBuf) {
    // All 256 byte symbols of GPT-2's byte->unicode map, then a few merged tokens.
    let mut bytes: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut n = 0;
    let mut map = vec![0u32; 256];
    for b in 0..256u32 {
        if !bytes.contains(&b) {
            bytes.push(b);
            map[b as usize] = 256 + n;
            n += 1;
        } else {
            map[b as usize] = b;
        }
    }
    let sym = |b: u8| char::from_u32(map[b as usize]).unwrap().to_string();
    let mut tokens: Vec<String> = vec!["<s>".into(), "</s>".into()];
    tokens.extend((0..=255u8).map(sym));
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut types = vec![3i32, 3];
    types.extend(std::iter::repeat_n(1, tokens.len() - 2));
    let dir = TempDir::new("tinytok");
    let path = dir.join("tok.gguf");
    let s = |x: &str| GgufValue::String(x.into());
    write_gguf(
        &path,
        &[
            kv("general.architecture", s("llama")),
            kv("tokenizer.ggml.model", s(model)),
            kv("tokenizer.ggml.pre", s(pre)),
            kv(
                "tokenizer.ggml.tokens",
                GgufValue::Array(tokens.iter().map(|t| s(t)).collect()),
            ),
            kv(
                "tokenizer.ggml.token_type",
                GgufValue::Array(types.into_iter().map(GgufValue::I32).collect()),
            ),
            kv(
                "tokenizer.ggml.merges",
                GgufValue::Array(merges.iter().map(|m| s(m)).collect()),
            ),
            kv("tokenizer.ggml.bos_token_id", GgufValue::U32(0)),
            kv("tokenizer.ggml.eos_token_id", GgufValue::U32(1)),
            kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(add_bos)),
        ],
        &[],
    )
    .unwrap();
    (dir, path)
}

#[test]
fn synthetic_gguf_vocab_merges_digits_split_and_bos() {
    // Merge ranks: "a b" first, then "ab c"; "Ġ a" lets a space join the next letter.
    let (_dir, path) = tiny_vocab_gguf("smollm", "gpt2", &["a b", "ab c", "Ġ a", "1 2"], true);
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let id = |t: &str| tok.token_to_id(t).unwrap();
    assert_eq!(tok.encode("abc", false).unwrap(), vec![id("abc")]);
    assert_eq!(tok.encode(" a", false).unwrap(), vec![id("Ġa")]);
    // Digits are split one by one before BPE, so the "1 2" merge can never apply.
    assert_eq!(tok.encode("12", false).unwrap(), vec![id("1"), id("2")]);
    // Control tokens are whole; add_bos_token = true prepends BOS with add_special.
    assert_eq!(
        tok.encode("<s>abc</s>", false).unwrap(),
        vec![0, id("abc"), 1]
    );
    assert_eq!(tok.encode("abc", true).unwrap(), vec![0, id("abc")]);
    assert_eq!(
        tok.decode(&tok.encode("héllo 12 abc", false).unwrap())
            .unwrap(),
        "héllo 12 abc"
    );
    // GPT-2 pre-tokenizer (no digit split): "1 2" merges.
    let (_dir, path) = tiny_vocab_gguf("gpt2", "gpt2", &["1 2"], false);
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert_eq!(
        tok.encode("12", false).unwrap(),
        vec![tok.token_to_id("12").unwrap()]
    );
}

/// The `llama-bpe` (Llama 3) and `qwen2` split regexes vs tests/fixtures/gen/ref_tokenizer_pre.py
/// (llama.cpp port and transformers' converter, which agree): the SmolLM2 vocabulary and
/// merges, plus a few digit merges that make the two digit rules differ, are written to
/// a GGUF with each `tokenizer.ggml.pre`.
#[test]
fn llama3_and_qwen2_pre_tokenizers_match_reference() {
    let Some(src) = real_model() else { return };
    let src = GgufFile::open(src).unwrap();
    let fx = fixture_json("io/tokenizer_pre_ref.json");
    let extra: Vec<&str> = fx["extra_merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let s = |x: &str| GgufValue::String(x.into());
    let strings = |v: Vec<&str>| GgufValue::Array(v.into_iter().map(s).collect());
    let mut tokens = src.get_str_array("tokenizer.ggml.tokens").unwrap();
    let mut types = src.get_int_array("tokenizer.ggml.token_type").unwrap();
    let mut merges = src.get_str_array("tokenizer.ggml.merges").unwrap();
    let merged: Vec<String> = extra.iter().map(|m| m.replace(' ', "")).collect();
    tokens.extend(merged.iter().map(|t| t.as_str()));
    types.extend(std::iter::repeat_n(1, extra.len()));
    merges.extend(&extra);
    for pre in ["llama-bpe", "qwen2"] {
        let dir = TempDir::new("pretok");
        let path = dir.join(format!("{pre}.gguf"));
        write_gguf(
            &path,
            &[
                kv("general.architecture", s("llama")),
                kv("tokenizer.ggml.model", s("gpt2")),
                kv("tokenizer.ggml.pre", s(pre)),
                kv("tokenizer.ggml.tokens", strings(tokens.clone())),
                kv(
                    "tokenizer.ggml.token_type",
                    GgufValue::Array(types.iter().map(|&t| GgufValue::I32(t as i32)).collect()),
                ),
                kv("tokenizer.ggml.merges", strings(merges.clone())),
                kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1)),
                kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2)),
            ],
            &[],
        )
        .unwrap();
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        let cases = fx[pre].as_array().unwrap();
        assert!(
            cases.len() >= 20,
            "{pre}: fixture has {} cases",
            cases.len()
        );
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want = ids(&case["ids"]);
            let got = tok.encode(text, false).unwrap();
            assert_eq!(
                got,
                want,
                "{pre} {text:?}: first difference at token {}",
                first_diff(&got, &want)
            );
            assert_eq!(tok.decode(&got).unwrap(), text, "{pre}: decode round trip");
        }
    }
}

#[test]
fn unsupported_tokenizer_metadata_is_a_typed_error() {
    let (_dir, path) = tiny_vocab_gguf("chatglm-bpe", "gpt2", &[], false);
    let e = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
        .err()
        .unwrap();
    assert!(
        matches!(e, ElmError::Unsupported(_)) && e.to_string().contains("chatglm-bpe"),
        "{e}"
    );
    let (_dir, path) = tiny_vocab_gguf("smollm", "bert", &[], false);
    let e = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
        .err()
        .unwrap();
    assert!(
        matches!(e, ElmError::Unsupported(_)) && e.to_string().contains("bert"),
        "{e}"
    );
    // The SentencePiece-style model reads the tokens' scores: without them, an error naming
    // the missing key.
    let (_dir, path) = tiny_vocab_gguf("default", "llama", &[], false);
    let e = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
        .err()
        .unwrap();
    assert!(e.to_string().contains("tokenizer.ggml.scores"), "{e}");
    let (_dir, path) = tiny_vocab_gguf("smollm", "gpt2", &["a zz"], false);
    let e = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
        .err()
        .unwrap();
    assert!(e.to_string().contains("merges[0]"), "{e}");
    let empty = TempDir::new("nofile");
    let e = Tokenizer::from_file(empty.join("tokenizer.json"))
        .err()
        .unwrap();
    assert!(matches!(e, ElmError::Io { .. }), "{e}");
}
