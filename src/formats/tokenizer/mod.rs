//! Tokenizers: a thin wrapper over the `tokenizers` crate, built either from an HF
//! `tokenizer.json` or from a GGUF's `tokenizer.ggml.*` metadata, plus ChatML prompts.
//!
//! GGUF route (`tokenizer.ggml.model = "gpt2"`): byte-level BPE with the vocabulary and
//! merges from the file; the pre-tokenizer reproduces llama.cpp's split regexes for the
//! file's `tokenizer.ggml.pre`: for `smollm` (and the identical `starcoder` group) the text
//! is split first on every single digit `\p{N}`, then with the GPT-2 regex, text between
//! matches kept as its own piece; `llama-bpe` (Llama 3) and `qwen2` use their one regex.
//! Tokens whose `token_type` is 3 (control, e.g. `<|im_start|>`) are matched whole in the
//! input before any splitting.
//!
//! GGUF route (`tokenizer.ggml.model = "llama"`, SentencePiece-style, e.g. Gemma 3): llama.cpp
//! merges the adjacent pair whose concatenation is the highest-scoring vocabulary token, again
//! and again, and spells what stays unknown as `<0xXX>` byte tokens. That is BPE whose merges
//! are every split of a token into two vocabulary tokens, ranked by the token's score, with
//! byte fallback: built so here. Spaces become `▁` first (and a leading one is added only with
//! `add_space_prefix`); user-defined tokens (type 4: runs of newlines or spaces, …) are matched
//! on the raw text before that, as llama.cpp's special-token partition does.
//!
//! Hostile files (issue 59): loading is linear in the vocabulary's total length. The GGUF's
//! control and user-defined tokens are matched by `WholeTokens`, not added to the
//! `tokenizers` crate's added vocabulary (whose `add_tokens` compares each token with every
//! one added before it: 40,000 took 9 s, 100,000 47 s, a 262,144-token vocabulary of control
//! tokens ~6 min); the SentencePiece-style merges are found with rolling hashes (see
//! `vocab_splits`) instead of hashing every split of every token (a 400,000-byte token took
//! 17-46 s). A `tokenizer.json` keeps the tokenizers crate's added vocabulary, its size
//! bounded by [`MAX_JSON_ADDED_TOKENS`]. An empty vocabulary is refused, and
//! [`Tokenizer::check_embedding_rows`] compares the ids with a model's embedding.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::{Prepend, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{DecoderWrapper, NormalizerWrapper};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use super::gguf::GgufFile;
use crate::error::{ElmError, Result};

mod json_guards;
mod linear;

use json_guards::{canonical, refuse_panicking_decoders, refuse_panicking_post_processors};
pub use json_guards::{MAX_JSON_ADDED_TOKENS, MAX_JSON_TOKEN_ID};
pub use linear::MAX_MERGE_TEXT;
use linear::{random_base, vocab_splits, WholeTokens};

/// GPT-2's split regex as llama.cpp writes it (no trailing `\s+`: llama.cpp keeps
/// unmatched text as its own piece, which `Split` with `Isolated` also does).
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// llama.cpp's Llama-3 split regex (`LLAMA_VOCAB_PRE_TYPE_LLAMA3`): case-insensitive
/// contractions, letters with one leading non-letter, digits in runs of at most three.
const LLAMA3_SPLIT: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// llama.cpp's Qwen2 split regex (`LLAMA_VOCAB_PRE_TYPE_QWEN2`): Llama 3's, but every
/// digit on its own.
const QWEN2_SPLIT: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The `tokenizer.ggml.pre` values [`split_regexes`] knows, for error messages.
const SUPPORTED_PRE: &str = "smollm, starcoder, refact, codeshell, gpt2, llama-bpe, llama3, qwen2";

/// llama.cpp's split regexes per `tokenizer.ggml.pre`, applied in order.
/// Only families verified against a reference (tests/formats_tokenizer.rs) or identical to
/// one are listed.
fn split_regexes(pre: &str) -> Option<Vec<&'static str>> {
    match pre {
        // LLAMA_VOCAB_PRE_TYPE_{SMOLLM, STARCODER, REFACT, CODESHELL}: same regex list.
        "smollm" | "starcoder" | "refact" | "codeshell" => Some(vec![r"\p{N}", GPT2_SPLIT]),
        "gpt-2" | "gpt2" => Some(vec![GPT2_SPLIT]),
        "llama-bpe" | "llama3" | "llama-v3" => Some(vec![LLAMA3_SPLIT]),
        "qwen2" => Some(vec![QWEN2_SPLIT]),
        _ => None,
    }
}

/// GGUF metadata key holding a tokenizer as HF `tokenizer.json` text (files written by
/// `elm quantize`; read by [`Tokenizer::from_gguf`] when `tokenizer.ggml.*` is absent).
pub const TOKENIZER_JSON_KEY: &str = "elm.tokenizer.json";
/// GGUF metadata key of the matching `tokenizer_config.json` text.
pub const TOKENIZER_CONFIG_KEY: &str = "elm.tokenizer.config";

/// A text tokenizer with BOS/EOS ids and a ChatML prompt formatter.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// GGUF route: the control and user-defined tokens, matched whole in the raw text before
    /// `inner` sees the pieces between them (`inner` has no added tokens then). `None` for a
    /// `tokenizer.json`, whose added tokens live in `inner`.
    whole: Option<WholeTokens>,
    /// GGUF ids whose string an earlier id already has (`inner` knows only the first id of a
    /// string): decoded as that earlier id. Empty for real vocabularies.
    aliases: HashMap<u32, u32>,
    /// Token ids are below this: the model's vocabulary and the added tokens (see
    /// [`id_bound`]), counted once; a GGUF's `tokenizer.ggml.tokens` count.
    vocab_size: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    /// Prepend BOS when `encode(.., add_special = true)` (GGUF `add_bos_token`); HF
    /// `tokenizer.json` files do this through their own post-processor instead.
    prepend_bos: bool,
    /// System prompt the chat template inserts when the messages have none.
    default_system_prompt: Option<String>,
    /// Whether the model came with a chat template (a chat-tuned model); a base model has none
    /// and is prompted in a plain layout (`crate::data::QaLayout`).
    chat_template: bool,
}

/// One past the largest token id: the model's vocabulary size or an added token's id + 1.
///
/// Not `tokenizers::Tokenizer::get_vocab_size(true)`: that builds the whole vocabulary map
/// (49k strings for SmolLM2, 262k for Gemma 3) to count it. Called per streamed token by
/// `elm generate`, it was a third of its decode time; called once at load, it still left
/// ~30 MB of freed heap in a Gemma 3 process.
fn id_bound(inner: &tokenizers::Tokenizer) -> usize {
    use tokenizers::Model;
    let added = inner.get_added_vocabulary().get_added_tokens_decoder();
    let past_added = added.keys().map(|&id| id as usize + 1).max().unwrap_or(0);
    // One past the largest id, not the number of entries: a `tokenizer.json` whose ids have
    // gaps encodes ids at or past its entry count (found by the tokenizer_json fuzz target).
    // The map is built once here and dropped.
    let past_model = inner
        .get_model()
        .get_vocab()
        .values()
        .map(|&id| id as usize + 1)
        .max()
        .unwrap_or(0);
    past_model.max(past_added)
}

fn tok_err(e: impl std::fmt::Display) -> ElmError {
    ElmError::Tokenizer(e.to_string())
}

/// Pulls the default system prompt out of a ChatML Jinja template: the literal text
/// between `<|im_start|>system\n` and the next `<|im_end|>`, as SmolLM2's template has.
fn default_system_prompt(template: &str) -> Option<String> {
    // Templates spell the newline either literally or as a `\n` escape in a string literal.
    let template = template.replace("\\n", "\n");
    let start = "<|im_start|>system\n";
    let i = template.find(start)? + start.len();
    let rest = &template[i..];
    let end = rest.find("<|im_end|>")?;
    let prompt = &rest[..end];
    // A template that builds the system turn from a variable has no literal default.
    (!prompt.contains("{{") && !prompt.contains("' +") && !prompt.contains("+ '"))
        .then(|| prompt.to_string())
}

impl Tokenizer {
    /// Loads an HF `tokenizer.json`. If a sibling `tokenizer_config.json` exists, its
    /// `bos_token`, `eos_token` and `chat_template` (default system prompt) are used.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(ElmError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer file not found"),
            ));
        }
        let json = std::fs::read_to_string(path).map_err(|e| ElmError::io(path, e))?;
        let cfg_path = path.with_file_name("tokenizer_config.json");
        let cfg_text = if cfg_path.is_file() {
            Some(std::fs::read_to_string(&cfg_path).map_err(|e| ElmError::io(&cfg_path, e))?)
        } else {
            None
        };
        Self::from_json_parts(&json, cfg_text.as_deref(), path)
    }

    /// [`Tokenizer::from_file`] on the texts of a `tokenizer.json` and (optionally) its
    /// `tokenizer_config.json`; `origin` names them in errors. More than
    /// [`MAX_JSON_ADDED_TOKENS`] added tokens, or an empty vocabulary, is an
    /// [`ElmError::Format`] error.
    pub fn from_json_parts(json: &str, config: Option<&str>, origin: &Path) -> Result<Tokenizer> {
        let path = origin;
        /// What is read before the `tokenizers` crate parses the file.
        #[derive(serde::Deserialize)]
        struct Head {
            #[serde(default)]
            added_tokens: Vec<serde::de::IgnoredAny>,
            /// Read as a JSON value first: the `tokenizers` crate panics (`.expect("Helper")`)
            /// on a decoder section that is not one, e.g. a number out of range (found by the
            /// tokenizer_json fuzz target). A panic is caught below, but a refusal without one
            /// is what a caller's panic hook (libFuzzer's aborts) can live with.
            #[serde(default)]
            #[allow(dead_code)]
            decoder: Option<serde_json::Value>,
        }
        let head: Head = serde_json::from_str(json)
            .map_err(|e| ElmError::format(path, format!("invalid tokenizer.json: {e}")))?;
        if head.added_tokens.len() > MAX_JSON_ADDED_TOKENS {
            return Err(ElmError::format(
                path,
                format!(
                    "tokenizer.json: added_tokens lists {} tokens, more than the \
                     {MAX_JSON_ADDED_TOKENS} read (the tokenizers crate adds them in time \
                     quadratic in their number)",
                    head.added_tokens.len()
                ),
            ));
        }
        // The `tokenizers` crate panics on some malformed sections instead of returning an
        // error (0.21.4: `.expect("Helper")` in its decoder parser, which the JSON read above
        // keeps from firing): a panic not yet found must still be a typed error, not a crash.
        let parsed = std::panic::catch_unwind(|| json.parse::<tokenizers::Tokenizer>());
        let mut inner = match parsed {
            Ok(result) => result
                .map_err(|e| ElmError::format(path, format!("invalid tokenizer.json: {e}")))?,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                return Err(ElmError::format(
                    path,
                    format!(
                        "invalid tokenizer.json: the tokenizers crate could not read it ({why})"
                    ),
                ));
            }
        };
        // elm encodes whole texts and pads its own batches: a file's truncation would cut a
        // prompt without a word (and panics in the tokenizers crate when its stride is not
        // below its max_length: found by the tokenizer_json fuzz target), and its padding
        // would add pad ids to every encoding. Both are switched off, as for every LM
        // tokenizer the HF hub ships (`"truncation": null, "padding": null`).
        inner
            .with_truncation(None)
            .map_err(|e| ElmError::format(path, format!("tokenizer.json: truncation: {e}")))?;
        inner.with_padding(None);
        let vocab_size = id_bound(&inner);
        if vocab_size > MAX_JSON_TOKEN_ID {
            // An id of 134 million in a 300-entry vocabulary made writing the tokenizer back
            // list every hole (48 s; the tokenizer_json fuzz target's timeout).
            return Err(ElmError::format(
                path,
                format!(
                    "tokenizer.json: token id {} is beyond the cap of {MAX_JSON_TOKEN_ID} ids",
                    vocab_size - 1
                ),
            ));
        }
        if vocab_size == 0 {
            return Err(ElmError::format(
                path,
                "tokenizer.json: the vocabulary is empty (no model tokens, no added tokens)",
            ));
        }
        // Decoder and post-processor checked as the crate read them, written back in its
        // canonical form: its reader can take a section by its fields whatever its `type`
        // says (a `TemplatePrgcessing` from the tokenizer_json fuzz target was read as a
        // `TemplateProcessing`).
        if let Some(decoder) = inner.get_decoder() {
            refuse_panicking_decoders(&canonical(decoder, "decoder", path)?, path)?;
        }
        if let Some(processor) = inner.get_post_processor() {
            let processor = canonical(processor, "post_processor", path)?;
            refuse_panicking_post_processors(&processor, vocab_size, path)?;
        }
        let mut tok = Tokenizer {
            vocab_size,
            whole: None,
            aliases: HashMap::new(),
            inner,
            bos: None,
            eos: None,
            prepend_bos: false,
            default_system_prompt: None,
            chat_template: false,
        };
        if let Some(text) = config {
            let cfg: serde_json::Value =
                serde_json::from_str(text).map_err(|e| ElmError::Json {
                    what: format!("{} (tokenizer_config.json)", path.display()),
                    msg: e.to_string(),
                })?;
            let token = |k: &str| -> Option<u32> {
                let v = cfg.get(k)?;
                let s = v.as_str().or_else(|| v.get("content")?.as_str())?;
                tok.inner.token_to_id(s)
            };
            tok.bos = token("bos_token");
            tok.eos = token("eos_token");
            tok.prepend_bos = cfg
                .get("add_bos_token")
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            let template = cfg.get("chat_template").and_then(|t| t.as_str());
            tok.chat_template = template.is_some();
            tok.default_system_prompt = template.and_then(default_system_prompt);
        }
        Ok(tok)
    }

    /// Builds the tokenizer described by a GGUF's `tokenizer.ggml.*` metadata (byte-level BPE,
    /// `tokenizer.ggml.model = "gpt2"`, or SentencePiece-style, `"llama"`), in time linear in
    /// the vocabulary's total length; an empty `tokenizer.ggml.tokens` is an
    /// [`ElmError::Format`] naming it. Without that metadata, the file's
    /// `elm.tokenizer.json` (files written by `elm quantize`) is read as by
    /// [`Self::from_json_parts`].
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer> {
        let path = gguf.path();
        if gguf.get("tokenizer.ggml.model").is_none() {
            if let Some(json) = gguf.get(TOKENIZER_JSON_KEY) {
                // A file written by `elm quantize`: the tokenizer as HF JSON.
                let json = json.as_str().ok_or_else(|| {
                    ElmError::format(path, format!("{TOKENIZER_JSON_KEY} is not a string"))
                })?;
                let config = match gguf.get(TOKENIZER_CONFIG_KEY) {
                    Some(_) => Some(gguf.get_str(TOKENIZER_CONFIG_KEY)?),
                    None => None,
                };
                return Self::from_json_parts(json, config, path);
            }
        }
        let model = gguf.get_str("tokenizer.ggml.model")?;
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        if tokens.is_empty() {
            return Err(ElmError::format(
                path,
                "tokenizer.ggml.tokens is empty: a tokenizer needs at least one token",
            ));
        }
        let types = match gguf.get("tokenizer.ggml.token_type") {
            Some(_) => gguf.get_int_array("tokenizer.ggml.token_type")?,
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(ElmError::format(
                path,
                format!(
                    "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
                    types.len(),
                    tokens.len()
                ),
            ));
        }
        // The first id of each string; the later ones are its aliases (unreachable by encoding,
        // decoded as the first).
        let mut first: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
        let mut aliases = HashMap::new();
        for (id, &t) in tokens.iter().enumerate() {
            let first_id = *first.entry(t).or_insert(id as u32);
            if first_id != id as u32 {
                aliases.insert(id as u32, first_id);
            }
        }
        let inner = match model {
            "gpt2" => Self::byte_level_bpe(gguf, &first)?,
            "llama" => Self::sentencepiece_bpe(gguf, &tokens, &types, &first)?,
            other => {
                return Err(ElmError::Unsupported(format!(
                    "{}: tokenizer.ggml.model `{other}` (supported: gpt2 byte-level BPE, llama \
                     SentencePiece-style)",
                    path.display()
                )))
            }
        };

        // Control tokens stay whole; user-defined ones (type 4) too, but are not special.
        let whole = WholeTokens::new(&tokens, &types, &first);

        let id = |k: &str| -> Result<Option<u32>> {
            match gguf.get(k) {
                None => Ok(None),
                Some(_) => {
                    let id = gguf.get_usize(k)?;
                    if id >= tokens.len() {
                        return Err(ElmError::format(
                            path,
                            format!("{k} = {id} is outside the vocabulary of {}", tokens.len()),
                        ));
                    }
                    Ok(Some(id as u32))
                }
            }
        };
        let template = match gguf.get("tokenizer.chat_template") {
            Some(_) => Some(gguf.get_str("tokenizer.chat_template")?),
            None => None,
        };
        Ok(Tokenizer {
            vocab_size: tokens.len(),
            inner,
            whole,
            aliases,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            prepend_bos: match gguf.get("tokenizer.ggml.add_bos_token") {
                Some(_) => gguf.get_bool("tokenizer.ggml.add_bos_token")?,
                None => false,
            },
            chat_template: template.is_some(),
            default_system_prompt: template.and_then(default_system_prompt),
        })
    }

    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE with the file's merges, split first by
    /// llama.cpp's regexes for its `tokenizer.ggml.pre`.
    fn byte_level_bpe(
        gguf: &GgufFile,
        first: &HashMap<&str, u32>,
    ) -> Result<tokenizers::Tokenizer> {
        let path = gguf.path();
        let pre = match gguf.get("tokenizer.ggml.pre") {
            Some(_) => gguf.get_str("tokenizer.ggml.pre")?,
            None => "gpt2",
        };
        let regexes = split_regexes(pre).ok_or_else(|| {
            ElmError::Unsupported(format!(
                "{}: tokenizer.ggml.pre `{pre}` (supported: {SUPPORTED_PRE})",
                path.display()
            ))
        })?;

        let vocab = first;
        let merges = gguf
            .get_str_array("tokenizer.ggml.merges")?
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                let (a, b) = m.split_once(' ').ok_or_else(|| {
                    ElmError::format(
                        path,
                        format!("tokenizer.ggml.merges[{i}] = `{m}` has no space"),
                    )
                })?;
                if !vocab.contains_key(a)
                    || !vocab.contains_key(b)
                    || !vocab.contains_key(format!("{a}{b}").as_str())
                {
                    return Err(ElmError::format(
                        path,
                        format!(
                            "tokenizer.ggml.merges[{i}] = `{m}` uses tokens not in the vocabulary"
                        ),
                    ));
                }
                Ok((a.to_string(), b.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;

        let vocab: Vocab = vocab.iter().map(|(&t, &id)| (t.to_string(), id)).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(tok_err)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);

        let mut pre_tokenizers: Vec<PreTokenizerWrapper> = Vec::new();
        for r in regexes {
            let split = Split::new(
                SplitPattern::Regex(r.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(tok_err)?;
            pre_tokenizers.push(split.into());
        }
        // Regex splitting is done above; ByteLevel only maps bytes to its alphabet.
        pre_tokenizers.push(ByteLevel::new(false, false, false).into());
        inner.with_pre_tokenizer(Some(Sequence::new(pre_tokenizers)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        Ok(inner)
    }

    /// `tokenizer.ggml.model = "llama"` (SentencePiece-style, see the module's note): BPE whose
    /// merges are every split of a normal token into two vocabulary tokens ([`vocab_splits`]),
    /// ranked by the token's `tokenizer.ggml.scores` (highest first, then lower id), with byte
    /// fallback.
    fn sentencepiece_bpe(
        gguf: &GgufFile,
        tokens: &[&str],
        types: &[i64],
        first: &HashMap<&str, u32>,
    ) -> Result<tokenizers::Tokenizer> {
        let path = gguf.path();
        let scores = gguf.get_f32_array("tokenizer.ggml.scores")?;
        if scores.len() != tokens.len() {
            return Err(ElmError::format(
                path,
                format!(
                    "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
                    scores.len(),
                    tokens.len()
                ),
            ));
        }
        // Only normal tokens (type 1) are formed by merging: control, user-defined and byte
        // tokens are matched whole or emitted by the fallback.
        let splits = vocab_splits(tokens, types, first, random_base()).map_err(|id| {
            ElmError::format(
                path,
                format!(
                    "tokenizer.ggml.tokens: the merges of the normal tokens up to [{id}] (every \
                     split into two vocabulary tokens) pass {} MiB of text",
                    MAX_MERGE_TEXT >> 20
                ),
            )
        })?;
        let mut ranked: Vec<(f32, u32, &str, &str)> = splits
            .into_iter()
            .map(|(id, l, r)| (scores[id as usize], id, l, r))
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let merges = ranked
            .into_iter()
            .map(|(_, _, l, r)| (l.to_string(), r.to_string()))
            .collect();
        let unk = match gguf.get("tokenizer.ggml.unknown_token_id") {
            Some(_) => {
                let id = gguf.get_usize("tokenizer.ggml.unknown_token_id")?;
                tokens.get(id).map(|t| t.to_string())
            }
            None => None,
        };
        let vocab: Vocab = first.iter().map(|(&t, &id)| (t.to_string(), id)).collect();
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(unk) = unk {
            builder = builder.unk_token(unk);
        }
        let mut inner = tokenizers::Tokenizer::new(builder.build().map_err(tok_err)?);
        let add_space_prefix = match gguf.get("tokenizer.ggml.add_space_prefix") {
            Some(_) => gguf.get_bool("tokenizer.ggml.add_space_prefix")?,
            None => true,
        };
        let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
        if add_space_prefix {
            normalizers.push(Prepend::new("▁".into()).into());
        }
        normalizers.push(Replace::new(" ", "▁").map_err(tok_err)?.into());
        inner.with_normalizer(Some(NormalizerSequence::new(normalizers)));
        let decoders: Vec<DecoderWrapper> = vec![
            Replace::new("▁", " ").map_err(tok_err)?.into(),
            ByteFallback::new().into(),
            Fuse::new().into(),
        ];
        inner.with_decoder(Some(DecoderSequence::new(decoders)));
        Ok(inner)
    }

    /// Token ids of `text`. Control tokens written in the text (e.g. `<|im_start|>`) are
    /// always recognised. `add_special` adds what the model asks for around a sequence
    /// (BOS for GGUFs with `add_bos_token = true`; the post-processor of a tokenizer.json).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if add_special && self.prepend_bos {
            ids.extend(self.bos);
        }
        let Some(whole) = &self.whole else {
            let enc = self.inner.encode(text, add_special).map_err(tok_err)?;
            ids.extend_from_slice(enc.get_ids());
            return Ok(ids);
        };
        // A GGUF's tokens matched whole split the text; `inner` encodes each piece between
        // them on its own (normalizer and pre-tokenizer per piece), as the tokenizers crate
        // does with its added tokens. A GGUF-built `inner` has no post-processor, so
        // `add_special` adds nothing there.
        let piece = |s: &str, ids: &mut Vec<u32>| -> Result<()> {
            let enc = self.inner.encode(s, false).map_err(tok_err)?;
            ids.extend_from_slice(enc.get_ids());
            Ok(())
        };
        let mut start = 0;
        for (s, e, id) in whole.find(text) {
            if start < s {
                piece(&text[start..s], &mut ids)?;
            }
            ids.push(id);
            start = e;
        }
        if start < text.len() {
            piece(&text[start..], &mut ids)?;
        }
        Ok(ids)
    }

    /// Token ids of a prompt as llama.cpp feeds it: BOS first when the GGUF asks for it
    /// (`tokenizer.ggml.add_bos_token`, e.g. Gemma 3), then `text`; nothing else is added.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text, false)?;
        if self.prepend_bos {
            if let Some(bos) = self.bos {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// Text of `ids`, special tokens included (so `decode(encode(s)) == s`). An id at or past
    /// [`Self::vocab_size`] (e.g. a padding row of a model's embedding) is an
    /// [`ElmError::Tokenizer`] error, never silently dropped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let n = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= n) {
            return Err(ElmError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {n}"
            )));
        }
        if self.aliases.is_empty() {
            return self.inner.decode(ids, false).map_err(tok_err);
        }
        let ids: Vec<u32> = ids.iter().map(|&id| self.unalias(id)).collect();
        self.inner.decode(&ids, false).map_err(tok_err)
    }

    /// The id `inner` knows for `id` (the first id of its string).
    fn unalias(&self, id: u32) -> u32 {
        self.aliases.get(&id).copied().unwrap_or(id)
    }

    /// Checks this tokenizer against a model whose token embedding has `rows` rows (`file`
    /// names the model in the error). Every id the tokenizer emits (encoding, BOS/EOS) is
    /// below [`Self::vocab_size`], so that must not exceed `rows`, or an encoded id would
    /// index past the embedding: an [`ElmError::Format`] error. More rows than ids is
    /// legitimate (padding rows: HF checkpoints often round the embedding up, e.g. to a
    /// multiple of 64 or 128); a model that then predicts such an id gets an error from
    /// [`Self::decode`], not text.
    pub fn check_embedding_rows(&self, rows: usize, file: &Path) -> Result<()> {
        if self.vocab_size > rows {
            return Err(ElmError::format(
                file,
                format!(
                    "the tokenizer has {} token ids but the token embedding only {rows} rows: \
                     ids {rows}..{} would index past it",
                    self.vocab_size, self.vocab_size
                ),
            ));
        }
        Ok(())
    }

    /// Whether the model came with a chat template (see [`crate::data::QaLayout`]).
    pub fn has_chat_template(&self) -> bool {
        self.chat_template
    }

    /// Whether [`Self::encode_prompt`] starts a prompt with BOS.
    pub fn prepends_bos(&self) -> bool {
        self.prepend_bos
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Vocabulary size including added tokens (one past the largest token id).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(self.unalias(id))
    }

    /// The system prompt inserted when a chat has no system message (from the template).
    pub fn default_system_prompt(&self) -> Option<&str> {
        self.default_system_prompt.as_deref()
    }

    /// The underlying `tokenizers` tokenizer. Built from a GGUF's `tokenizer.ggml.*`, it does
    /// not hold the control and user-defined tokens (this type matches them itself, see
    /// `WholeTokens`): encode with [`Self::encode`]; [`Self::save`] writes them.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Writes an HF `tokenizer.json` (readable by [`Tokenizer::from_file`]).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let json = self.json(true)?;
        crate::io::write_atomic(path, json.as_bytes())
    }

    /// Writes `tokenizer.json` and a `tokenizer_config.json` (BOS/EOS tokens, `add_bos_token`,
    /// and a ChatML template carrying the default system prompt) into `dir`, so that
    /// [`Tokenizer::from_file`] on the result encodes and formats chats exactly like `self`
    /// (e.g. a pruned model saved as an HF directory keeps its GGUF tokenizer's behaviour).
    pub fn save_dir(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let (json, config) = self.to_json_parts(true)?;
        crate::io::write_atomic(&dir.join("tokenizer.json"), json.as_bytes())?;
        crate::io::write_atomic(&dir.join("tokenizer_config.json"), config.as_bytes())
    }

    /// The texts [`Tokenizer::save_dir`] writes, `(tokenizer.json, tokenizer_config.json)`;
    /// [`Tokenizer::from_json_parts`] reads them back. `pretty`: indented `tokenizer.json`.
    pub fn to_json_parts(&self, pretty: bool) -> Result<(String, String)> {
        let json = self.json(pretty)?;
        let token = |id: Option<u32>| id.and_then(|i| self.id_to_token(i));
        let template = match &self.default_system_prompt {
            // The system turn is a literal, as `default_system_prompt` reads it back.
            Some(system) => format!(
                "{{% if messages[0]['role'] != 'system' %}}<|im_start|>system\n{system}<|im_end|>\n{{% endif %}}{{% for message in messages %}}<|im_start|>{{{{ message['role'] }}}}\n{{{{ message['content'] }}}}<|im_end|>\n{{% endfor %}}{{% if add_generation_prompt %}}<|im_start|>assistant\n{{% endif %}}"
            ),
            None => "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".to_string(),
        };
        let mut cfg = serde_json::json!({
            "bos_token": token(self.bos),
            "eos_token": token(self.eos),
            "add_bos_token": self.prepend_bos,
        });
        // A base model's tokenizer stays without one, so it reads back as a base model's.
        if self.chat_template {
            cfg["chat_template"] = template.into();
        }
        let text = serde_json::to_string_pretty(&cfg).map_err(|e| ElmError::Json {
            what: "tokenizer_config.json".into(),
            msg: e.to_string(),
        })?;
        Ok((json, text))
    }

    /// The `tokenizer.json` text: `inner`'s, with a GGUF's whole-matched tokens as its
    /// `added_tokens`, byte for byte what the tokenizers crate writes for a tokenizer holding
    /// them as added tokens (`normalized: false`, special for control tokens).
    fn json(&self, pretty: bool) -> Result<String> {
        let mut json = self.inner.to_string(pretty).map_err(tok_err)?;
        let Some(whole) = &self.whole else {
            return Ok(json);
        };
        /// The tokenizers crate's `AddedTokenWithId`, fields in its order.
        #[derive(serde::Serialize)]
        struct Added<'a> {
            id: u32,
            content: &'a str,
            single_word: bool,
            lstrip: bool,
            rstrip: bool,
            normalized: bool,
            special: bool,
        }
        let mut entries = Vec::with_capacity(whole.listed.len());
        for &(id, special) in &whole.listed {
            let content = self.inner.id_to_token(id).ok_or_else(|| {
                ElmError::Tokenizer(format!("token {id} is missing from the vocabulary"))
            })?;
            let added = Added {
                id,
                content: &content,
                single_word: false,
                lstrip: false,
                rstrip: false,
                normalized: false,
                special,
            };
            let text = if pretty {
                serde_json::to_string_pretty(&added)
            } else {
                serde_json::to_string(&added)
            };
            entries.push(text.map_err(tok_err)?);
        }
        // `added_tokens` is the fourth key, after `version`, `truncation` and `padding` (null
        // here), so its first occurrence is the key. Strings hold no raw newline: indenting
        // lines is safe.
        let (empty, array) = if pretty {
            let indented: Vec<String> = entries
                .iter()
                .map(|e| {
                    e.lines()
                        .map(|l| format!("    {l}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .collect();
            (
                "\"added_tokens\": []",
                format!("\"added_tokens\": [\n{}\n  ]", indented.join(",\n")),
            )
        } else {
            (
                "\"added_tokens\":[]",
                format!("\"added_tokens\":[{}]", entries.join(",")),
            )
        };
        let at = json.find(empty).ok_or_else(|| {
            ElmError::Tokenizer("tokenizer.json without an empty added_tokens list".into())
        })?;
        json.replace_range(at..at + empty.len(), &array);
        Ok(json)
    }

    /// Renders a ChatML prompt, `<|im_start|>{role}\n{content}<|im_end|>\n` per message,
    /// exactly as SmolLM2's template does: when the first message is not a system message,
    /// the template's default system turn comes first; `add_generation_prompt` appends
    /// `<|im_start|>assistant\n`.
    pub fn apply_chat_template<R: AsRef<str>, C: AsRef<str>>(
        &self,
        messages: &[(R, C)],
        add_generation_prompt: bool,
    ) -> String {
        let mut out = String::new();
        let first_is_system = messages
            .first()
            .is_some_and(|(r, _)| r.as_ref() == "system");
        if !messages.is_empty() && !first_is_system {
            if let Some(sys) = &self.default_system_prompt {
                out.push_str(&format!("<|im_start|>system\n{sys}<|im_end|>\n"));
            }
        }
        for (role, content) in messages {
            out.push_str(&format!(
                "<|im_start|>{}\n{}<|im_end|>\n",
                role.as_ref(),
                content.as_ref()
            ));
        }
        if add_generation_prompt {
            out.push_str("<|im_start|>assistant\n");
        }
        out
    }
}
