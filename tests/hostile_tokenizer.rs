//! Hostile tokenizer metadata (issue 59): each test writes a GGUF with the crate's writer and
//! loads it with `Tokenizer::from_gguf`. Loading is linear in the vocabulary's total length
//! (before the fix, on the 2-core development machine, 40,000 control tokens took 9.2 s and
//! 100,000 47 s, quadratic in their number; a 400,000-byte SentencePiece token 17 s, quadratic
//! in its length; after it, 0.1 s each);
//! an empty vocabulary is a typed error; a tokenizer is checked against an embedding's rows.
//! Normal vocabularies encode, decode and serialize exactly as the tokenizers crate's added
//! vocabulary did before (built here the old way and compared).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use elm::formats::gguf::{kv, write_gguf, GgufValue};
use elm::formats::tokenizer::{Tokenizer, MAX_JSON_ADDED_TOKENS};
use elm::formats::GgufFile;
use elm::ElmError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokenizers::AddedToken;

/// A GGUF tokenizer: `model` is `gpt2` (byte-level BPE) or `llama` (SentencePiece-style).
struct Vocab {
    model: &'static str,
    tokens: Vec<String>,
    types: Vec<i32>,
    /// `llama`: one per token.
    scores: Vec<f32>,
    /// `gpt2`: `"a b"` pairs.
    merges: Vec<String>,
}

impl Vocab {
    /// Byte-level BPE: `<s>` and `</s>` (control), GPT-2's 256 byte symbols, then one token per
    /// merge, ranked in the order given.
    fn gpt2(merges: &[&str]) -> Vocab {
        let mut tokens: Vec<String> = vec!["<s>".into(), "</s>".into()];
        tokens.extend(byte_symbols());
        tokens.extend(merges.iter().map(|m| m.replace(' ', "")));
        let mut types = vec![3, 3];
        types.resize(tokens.len(), 1);
        Vocab {
            model: "gpt2",
            tokens,
            types,
            scores: Vec::new(),
            merges: merges.iter().map(|m| m.to_string()).collect(),
        }
    }

    /// SentencePiece-style: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then `normal` tokens
    /// with their scores.
    fn llama(normal: &[(&str, f32)]) -> Vocab {
        let mut v = Vocab {
            model: "llama",
            tokens: vec!["<unk>".into(), "<s>".into(), "</s>".into()],
            types: vec![2, 3, 3],
            scores: vec![0.0; 3],
            merges: Vec::new(),
        };
        for b in 0..=255u8 {
            v.push(&format!("<0x{b:02X}>"), 6);
        }
        for &(t, score) in normal {
            v.push(t, 1);
            *v.scores.last_mut().unwrap() = score;
        }
        v
    }

    fn push(&mut self, token: &str, ty: i32) -> u32 {
        self.tokens.push(token.to_string());
        self.types.push(ty);
        if self.model == "llama" {
            self.scores.push(-1e4);
        }
        self.tokens.len() as u32 - 1
    }

    fn write(&self) -> (TempDir, PathBuf) {
        let dir = TempDir::new("hostile-tok");
        let path = dir.join("tok.gguf");
        let s = |x: &str| GgufValue::String(x.into());
        let mut meta = vec![
            kv("general.architecture", s("llama")),
            kv("tokenizer.ggml.model", s(self.model)),
            kv(
                "tokenizer.ggml.tokens",
                GgufValue::Array(self.tokens.iter().map(|t| s(t)).collect()),
            ),
            kv(
                "tokenizer.ggml.token_type",
                GgufValue::Array(self.types.iter().map(|&t| GgufValue::I32(t)).collect()),
            ),
            kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1)),
            kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2)),
        ];
        if self.model == "gpt2" {
            meta.push(kv("tokenizer.ggml.pre", s("smollm")));
            meta.push(kv(
                "tokenizer.ggml.merges",
                GgufValue::Array(self.merges.iter().map(|m| s(m)).collect()),
            ));
        } else {
            meta.push(kv(
                "tokenizer.ggml.scores",
                GgufValue::Array(self.scores.iter().map(|&x| GgufValue::F32(x)).collect()),
            ));
            meta.push(kv(
                "tokenizer.ggml.add_space_prefix",
                GgufValue::Bool(false),
            ));
            meta.push(kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(true)));
        }
        write_gguf(&path, &meta, &[]).unwrap();
        (dir, path)
    }
}

/// GPT-2's byte-to-unicode map: the 256 symbols of a byte-level vocabulary.
fn byte_symbols() -> Vec<String> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            let c = if printable.contains(&b) {
                b
            } else {
                printable.push(b);
                next += 1;
                next - 1
            };
            char::from_u32(c).unwrap().to_string()
        })
        .collect()
}

fn load(path: &Path) -> elm::Result<Tokenizer> {
    Tokenizer::from_gguf(&GgufFile::open(path)?)
}

/// Loads `vocab` from its GGUF, timing `from_gguf` alone.
fn timed_load(vocab: &Vocab) -> (Tokenizer, Duration) {
    let (_dir, path) = vocab.write();
    let gguf = GgufFile::open(&path).unwrap();
    let t = Instant::now();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    (tok, t.elapsed())
}

/// The tokenizer as `from_gguf` built it before issue 59: the same model, normalizer,
/// pre-tokenizer and decoder, with the control tokens added as special tokens and the
/// user-defined ones as tokens, `normalized(false)`, to the tokenizers crate's added
/// vocabulary.
fn built_the_old_way(tok: &Tokenizer, vocab: &Vocab) -> tokenizers::Tokenizer {
    let mut old: tokenizers::Tokenizer = tok.inner().to_string(false).unwrap().parse().unwrap();
    let added = |kind: i32, special: bool| -> Vec<AddedToken> {
        vocab
            .tokens
            .iter()
            .zip(&vocab.types)
            .filter(|(_, &ty)| ty == kind)
            .map(|(t, _)| AddedToken::from(t.to_string(), special).normalized(false))
            .collect()
    };
    old.add_special_tokens(&added(3, true));
    old.add_tokens(&added(4, false));
    old
}

/// The SentencePiece-style merges as `from_gguf` found them before issue 59: every split of a
/// normal token (the first of its string) into two vocabulary tokens, each string halves
/// hashed, ranked by score (highest first), then id, then split position.
fn merges_the_old_way(vocab: &Vocab) -> Vec<(String, String)> {
    let mut first = std::collections::HashMap::new();
    for (id, t) in vocab.tokens.iter().enumerate() {
        first.entry(t.as_str()).or_insert(id);
    }
    let mut ranked = Vec::new();
    for (id, (t, &ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
        if ty != 1 || first[t.as_str()] != id {
            continue;
        }
        for (i, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(i);
            if first.contains_key(l) && first.contains_key(r) {
                ranked.push((vocab.scores[id], id, l, r));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked
        .into_iter()
        .map(|(_, _, l, r)| (l.to_string(), r.to_string()))
        .collect()
}

/// The merges of a `tokenizer.json`'s BPE model, in rank order.
fn json_merges(json: &str) -> Vec<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => {
                let (l, r) = s.split_once(' ').unwrap();
                (l.to_string(), r.to_string())
            }
            pair => (
                pair[0].as_str().unwrap().to_string(),
                pair[1].as_str().unwrap().to_string(),
            ),
        })
        .collect()
}

/// `tok` against [`built_the_old_way`]: the same `tokenizer.json` (pretty and compact), and
/// the same ids and decoded text for every text; a SentencePiece-style vocabulary's merges
/// are [`merges_the_old_way`].
fn assert_as_before(tok: &Tokenizer, vocab: &Vocab, texts: &[String]) {
    if vocab.model == "llama" {
        let merges = json_merges(&tok.inner().to_string(false).unwrap());
        assert!(!merges.is_empty());
        assert!(merges == merges_the_old_way(vocab), "merges differ");
    }
    let old = built_the_old_way(tok, vocab);
    for pretty in [true, false] {
        let (json, _) = tok.to_json_parts(pretty).unwrap();
        assert!(
            old.to_string(pretty).unwrap() == json,
            "tokenizer.json (pretty: {pretty}) differs from the tokenizers crate's"
        );
    }
    for text in texts {
        let mut want = Vec::new();
        if tok.prepends_bos() {
            want.extend(tok.bos_id());
        }
        want.extend_from_slice(old.encode(text.as_str(), true).unwrap().get_ids());
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, want, "{text:?}");
        assert_eq!(
            tok.decode(&got).unwrap(),
            old.decode(&got, false).unwrap(),
            "{text:?}"
        );
    }
}

/// Texts made of pieces that overlap the test vocabularies' control and user-defined tokens.
fn texts(seed: u64, extra: &[&str]) -> Vec<String> {
    let pieces = [
        "<", ">", "s>", "<s>", "</s>", "<s", "<ctrl7>", "<ctrl", "<t>", "<t", "\n", "\n\n", " ",
        "  ", "a", "b", "ab", "abc", "é", "字", "1", "2", "12", "<0x41>", "▁",
    ];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out: Vec<String> = ["", " ", "\n\n\n", "<s><s>", "ab ab\n\nab"]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
    for _ in 0..300 {
        let n = rng.gen_range(1..12);
        out.push(
            (0..n)
                .map(|_| pieces[rng.gen_range(0..pieces.len())])
                .collect(),
        );
    }
    out
}

/// 100,000 control tokens: before the fix, adding them to the tokenizers crate's added
/// vocabulary compared each with every one before (on the 2-core development machine 40,000
/// took 9.2 s, these 100,000 47 s, a 262,144-token file ~6 min); now 0.1 s.
#[test]
fn many_control_tokens_load_in_linear_time() {
    const N: usize = 100_000;
    for mut vocab in [
        Vocab::gpt2(&["a b"]),
        Vocab::llama(&[("a", -1.0), ("b", -2.0)]),
    ] {
        let first = vocab.tokens.len() as u32;
        for i in 0..N {
            vocab.push(&format!("<ctrl{i}>"), 3);
        }
        let (tok, took) = timed_load(&vocab);
        eprintln!("{} control tokens ({}): {took:?}", N, vocab.model);
        assert!(took < Duration::from_secs(10), "{}: {took:?}", vocab.model);
        assert_eq!(tok.vocab_size(), vocab.tokens.len());
        // Control tokens stay whole, the longest one where several start.
        let text = "a<ctrl77777>b<ctrl9><ctrl99999<ctrl1>";
        let ids = tok.encode(text, false).unwrap();
        for t in [77777, 9, 1] {
            assert!(ids.contains(&(first + t)), "<ctrl{t}>: {ids:?}");
        }
        assert!(!ids.contains(&(first + 99999)), "{ids:?}");
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
}

/// One 400,000-byte token: the SentencePiece-style builder used to hash every split of it
/// (quadratic in its length: 100,000 bytes took 1.6 s, this test 17 s); now 0.1 s.
#[test]
fn a_400k_byte_token_loads_in_linear_time() {
    let long = "ab".repeat(200_000);
    let mut vocab = Vocab::llama(&[("a", -1.0), ("b", -2.0), ("ab", -0.5)]);
    let normal = vocab.push(&long, 1);
    let control = vocab.push(&format!("<{}>", "c".repeat(400_000)), 3);
    let (tok, took) = timed_load(&vocab);
    eprintln!("400,000-byte normal and control tokens: {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let bos = tok.bos_id().unwrap();
    let ab = tok.token_to_id("ab").unwrap();
    assert_eq!(tok.encode("abab", true).unwrap(), vec![bos, ab, ab]);
    let text = format!("ab<{}>ab", "c".repeat(400_000));
    assert_eq!(tok.encode(&text, false).unwrap(), vec![ab, control, ab]);
    // No pair of vocabulary tokens makes the long normal token: it is never merged into,
    // as in llama.cpp, but it decodes.
    assert_eq!(tok.decode(&[normal]).unwrap(), long);
}

/// An empty vocabulary is refused where the tokenizer is built, naming the field (it used to
/// surface as "--prompt encodes to zero tokens" after the weights had loaded).
#[test]
fn an_empty_vocabulary_is_a_typed_error() {
    for model in ["gpt2", "llama"] {
        let vocab = Vocab {
            model,
            tokens: Vec::new(),
            types: Vec::new(),
            scores: Vec::new(),
            merges: Vec::new(),
        };
        let (_dir, path) = vocab.write();
        let e = load(&path).err().unwrap();
        assert!(
            matches!(&e, ElmError::Format { path: p, .. } if *p == path)
                && e.to_string().contains("tokenizer.ggml.tokens is empty"),
            "{model}: {e}"
        );
    }
    let json = bpe_json("[]");
    let e = Tokenizer::from_json_parts(&json, None, Path::new("tokenizer.json"))
        .err()
        .unwrap();
    assert!(
        matches!(e, ElmError::Format { .. }) && e.to_string().contains("empty"),
        "{e}"
    );
}

/// A `tokenizer.json` with an empty BPE vocabulary and `added` as its `added_tokens`.
fn bpe_json(added: &str) -> String {
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":{added},
        "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
        "model":{{"type":"BPE","dropout":null,"unk_token":null,
        "continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,
        "byte_fallback":false,"vocab":{{}},"merges":[]}}}}"#
    )
}

/// A `tokenizer.json` (HF directories, `elm.tokenizer.json` in files `elm quantize` wrote)
/// still goes through the tokenizers crate's added vocabulary: more added tokens than
/// `MAX_JSON_ADDED_TOKENS` are refused before it parses them.
#[test]
fn too_many_json_added_tokens_are_a_typed_error() {
    let entry = |i: usize| {
        format!(
            r#"{{"id":{i},"content":"<t{i}>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}"#
        )
    };
    let path = Path::new("tokenizer.json");
    let ok: Vec<String> = (0..1000).map(entry).collect();
    let tok =
        Tokenizer::from_json_parts(&bpe_json(&format!("[{}]", ok.join(","))), None, path).unwrap();
    assert_eq!(tok.encode("<t5><t999>", false).unwrap(), vec![5, 999]);
    let many: Vec<String> = (0..=MAX_JSON_ADDED_TOKENS).map(entry).collect();
    let t = Instant::now();
    let e = Tokenizer::from_json_parts(&bpe_json(&format!("[{}]", many.join(","))), None, path)
        .err()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(
        matches!(e, ElmError::Format { .. })
            && e.to_string()
                .contains(&format!("added_tokens lists {}", MAX_JSON_ADDED_TOKENS + 1)),
        "{e}"
    );
}

/// Small vocabularies with control and user-defined tokens that overlap each other and the
/// text: the ids by hand, then everything against the tokenizer built the old way.
#[test]
fn normal_vocabularies_encode_decode_and_serialize_as_before() {
    // Byte-level BPE (SmolLM2's route).
    let mut vocab = Vocab::gpt2(&["a b", "ab c", "Ġ a", "1 2"]);
    let t = vocab.push("<t>", 3);
    vocab.push("<ctrl7>", 3);
    vocab.push("<s", 4);
    let nn = vocab.push("\n\n", 4);
    let (_dir, path) = vocab.write();
    let tok = load(&path).unwrap();
    let id = |s: &str| tok.token_to_id(s).unwrap();
    assert_eq!(
        tok.encode("<s>abc<t>\n\n a12</s>", false).unwrap(),
        vec![0, id("abc"), t, nn, id("Ġa"), id("1"), id("2"), 1]
    );
    assert_as_before(&tok, &vocab, &texts(1, &["<s>abc<t>\n\n a12</s>"]));

    // SentencePiece-style (Gemma 3's route): control and user-defined tokens, byte fallback,
    // BOS from add_bos_token.
    let mut vocab = Vocab::llama(&[
        ("▁", -3.0),
        ("a", -1.0),
        ("b", -1.5),
        ("c", -2.0),
        ("ab", -0.5),
        ("▁ab", -0.7),
        ("abc", -0.2),
        ("字", -4.0),
    ]);
    let sot = vocab.push("<start_of_turn>", 3);
    let eot = vocab.push("<end_of_turn>", 3);
    vocab.push("<t>", 3);
    vocab.push("<s", 4);
    let nn = vocab.push("\n\n", 4);
    vocab.push("\n\n\n", 4);
    vocab.push("<t", 3);
    // A string twice: the second id decodes as the first.
    let dup = vocab.push("ab", 1);
    let (_dir, path) = vocab.write();
    let tok = load(&path).unwrap();
    let id = |s: &str| tok.token_to_id(s).unwrap();
    assert_eq!(
        tok.encode("<start_of_turn>ab ab\n\nc<end_of_turn>", true)
            .unwrap(),
        vec![1, sot, id("ab"), id("▁ab"), nn, id("c"), eot]
    );
    // é has no token: its two bytes.
    assert_eq!(tok.encode("é", false).unwrap(), vec![3 + 0xC3, 3 + 0xA9]);
    assert_eq!(tok.decode(&[dup, id("c")]).unwrap(), "abc");
    assert_eq!(tok.id_to_token(dup).as_deref(), Some("ab"));
    assert_as_before(
        &tok,
        &vocab,
        &texts(
            2,
            &["<start_of_turn>ab ab\n\nc<end_of_turn>", "<t><t\n\n\n\n"],
        ),
    );
    // The saved tokenizer.json reads back with the same ids.
    let dir = TempDir::new("hostile-json");
    tok.save_dir(&dir).unwrap();
    let back = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    for text in texts(3, &[]) {
        assert_eq!(
            back.encode(&text, true).unwrap(),
            tok.encode(&text, true).unwrap(),
            "{text:?}"
        );
    }
}

/// The invariant between a tokenizer and a model's embedding: every id the tokenizer emits
/// indexes a row (vocab_size <= rows, else a Format error naming the file); padding rows past
/// the vocabulary are legitimate, and an id there is a decode error, never garbage text.
#[test]
fn vocabulary_against_embedding_rows() {
    let vocab = Vocab::gpt2(&["a b"]);
    let (_dir, path) = vocab.write();
    let tok = load(&path).unwrap();
    let n = vocab.tokens.len();
    assert_eq!(tok.vocab_size(), n);
    let model = Path::new("model.gguf");
    tok.check_embedding_rows(n, model).unwrap();
    tok.check_embedding_rows(n + 64, model).unwrap();
    let e = tok.check_embedding_rows(n - 1, model).unwrap_err();
    assert!(
        matches!(&e, ElmError::Format { path, .. } if path == model)
            && e.to_string().contains(&format!("{n} token ids")),
        "{e}"
    );
    // An id of a padding row.
    let e = tok.decode(&[0, n as u32]).unwrap_err();
    assert!(matches!(e, ElmError::Tokenizer(_)), "{e}");
}

/// The real tokenizers, when present: the same ids and JSON as the tokenizer built the old
/// way, and Gemma 3's control and user-defined tokens matched whole.
#[test]
fn real_tokenizers_behave_as_before() {
    let fixture = fixture_json("io/tokenizer_ref.json");
    let mut extra: Vec<String> = fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    extra.push("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n".into());
    extra.push("<|im_start|>system\nBe brief.<|im_end|>\n<unused0><unused6241>\n\n\n  x".into());
    let extra: Vec<&str> = extra.iter().map(|s| s.as_str()).collect();
    for path in [real_model(), real_gemma3()].into_iter().flatten() {
        let gguf = GgufFile::open(&path).unwrap();
        let t = Instant::now();
        let tok = Tokenizer::from_gguf(&gguf).unwrap();
        eprintln!("{}: loaded in {:?}", path.display(), t.elapsed());
        let model = gguf.get_str("tokenizer.ggml.model").unwrap();
        let vocab = Vocab {
            model: if model == "llama" { "llama" } else { "gpt2" },
            tokens: gguf
                .get_str_array("tokenizer.ggml.tokens")
                .unwrap()
                .into_iter()
                .map(String::from)
                .collect(),
            types: gguf
                .get_int_array("tokenizer.ggml.token_type")
                .unwrap()
                .into_iter()
                .map(|t| t as i32)
                .collect(),
            scores: match model {
                "llama" => gguf.get_f32_array("tokenizer.ggml.scores").unwrap(),
                _ => Vec::new(),
            },
            merges: Vec::new(),
        };
        assert_as_before(&tok, &vocab, &texts(4, &extra));
    }
}

/// `tokenizer.json` post-processors that the tokenizers crate reads and then panics on when
/// encoding (it checks a `TemplateProcessing` only when one is built in code): a template naming
/// a special token it does not define, `$B` in the single-sequence template, a special token
/// with more ids than strings; and ids the vocabulary does not hold. Each is a typed error at
/// load naming the problem; a sound template still encodes.
#[test]
fn post_processors_that_panic_on_encoding_are_refused() {
    let with = |processor: serde_json::Value| {
        let mut json: serde_json::Value = serde_json::from_str(&word_tokenizer_json()).unwrap();
        json["post_processor"] = processor;
        json.to_string()
    };
    let special = |name: &str, ids: &[u32], tokens: &[&str]| serde_json::json!({ name: { "id": name, "ids": ids, "tokens": tokens } });
    let seq = |id: &str| serde_json::json!({ "Sequence": { "id": id, "type_id": 0 } });
    let tok = |id: &str| serde_json::json!({ "SpecialToken": { "id": id, "type_id": 0 } });
    let template = |single: Vec<serde_json::Value>, specials: serde_json::Value| {
        serde_json::json!({
            "type": "TemplateProcessing",
            "single": single,
            "pair": [seq("A"), seq("B")],
            "special_tokens": specials,
        })
    };
    let cases = [
        (
            "names special token `<cls>`",
            template(vec![tok("<cls>"), seq("A")], special("<s>", &[1], &["<s>"])),
        ),
        (
            "uses sequence $B",
            template(vec![seq("B")], special("<s>", &[1], &["<s>"])),
        ),
        (
            "has 2 ids but 1 token strings",
            template(
                vec![tok("<s>"), seq("A")],
                special("<s>", &[1, 2], &["<s>"]),
            ),
        ),
        (
            "has id 5000",
            template(
                vec![tok("<s>"), seq("A")],
                special("<s>", &[5000], &["<s>"]),
            ),
        ),
        (
            // The crate reads a post-processor by its fields, whatever its `type` says (found
            // by the tokenizer_json fuzz target).
            "names special token `<cls>`",
            serde_json::json!({
                "type": "TemplatePrgcessing",
                "single": [tok("<cls>"), seq("A")],
                "pair": [seq("A"), seq("B")],
                "special_tokens": special("<s>", &[1], &["<s>"]),
            }),
        ),
        (
            "has id 9999",
            serde_json::json!({
                "type": "Sequence",
                "processors": [{ "type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 9999] }],
            }),
        ),
    ];
    for (why, processor) in cases {
        let json = with(processor);
        let result = std::panic::catch_unwind(|| {
            Tokenizer::from_json_parts(&json, None, Path::new("hostile/tokenizer.json"))
                .and_then(|t| t.encode("w3 w4", true))
        });
        match result {
            Err(_) => panic!("{why}: panicked"),
            Ok(Ok(ids)) => panic!("{why}: accepted, encoded to {ids:?}"),
            Ok(Err(e)) => {
                let msg = e.to_string();
                assert!(
                    matches!(e, ElmError::Format { .. })
                        && msg.contains("hostile/tokenizer.json")
                        && msg.contains(why),
                    "{why}: {msg}"
                );
            }
        }
    }
    // A sound template: `<s>` before the sequence.
    let json = with(template(
        vec![tok("<s>"), seq("A")],
        special("<s>", &[1], &["<s>"]),
    ));
    let t = Tokenizer::from_json_parts(&json, None, Path::new("tokenizer.json")).unwrap();
    assert_eq!(t.encode("w3 w4", true).unwrap(), vec![1, 3, 4]);
}

/// A `tokenizer.json`'s truncation would cut a prompt without a word (and its stride at or past
/// its max_length panics in the tokenizers crate: found by the tokenizer_json fuzz target); its
/// padding would add pad ids. elm encodes whole texts and pads its own batches, so both are off:
/// the whole text is encoded, nothing panics.
#[test]
fn truncation_and_padding_of_a_tokenizer_json_are_off() {
    let mut json: serde_json::Value = serde_json::from_str(&word_tokenizer_json()).unwrap();
    json["truncation"] = serde_json::json!({
        "direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 5
    });
    json["padding"] = serde_json::json!({
        "direction": "Right", "pad_id": 0, "pad_to_multiple_of": null, "pad_token": "<unk>",
        "pad_type_id": 0, "strategy": {"Fixed": 8}
    });
    let t =
        Tokenizer::from_json_parts(&json.to_string(), None, Path::new("tokenizer.json")).unwrap();
    assert_eq!(t.encode("w3 w4 w5 w6", true).unwrap(), vec![3, 4, 5, 6]);
}
