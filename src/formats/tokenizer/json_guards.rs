//! Limits and checks on a `tokenizer.json` before (and as) the `tokenizers` crate reads it:
//! sections it reads without complaint and then panics on, ids without bound, added vocabularies
//! it takes quadratic time over (issue 59, each found by hand or by the tokenizer_json fuzz
//! target).

use std::path::Path;

use crate::error::{ElmError, Result};

/// Most added tokens a `tokenizer.json` may list. The `tokenizers` crate (0.21) adds them in
/// time quadratic in their number (`AddedVocabulary::add_tokens` compares each token with
/// every one added before it): 20,000 take ~1.5 s, 40,000 ~9 s, 262,144 minutes. Real
/// tokenizers list tens to a few thousand (Gemma 3's ~6,400, Llama 3's 256); GGUF
/// vocabularies do not go through this limit (their tokens are matched by `WholeTokens`).
pub const MAX_JSON_ADDED_TOKENS: usize = 1 << 15;

/// A section of a parsed tokenizer (`what`: its key) as the `tokenizers` crate writes it back:
/// the form the checks below read, whatever spelling the file used.
pub(super) fn canonical(
    section: &impl serde::Serialize,
    what: &str,
    path: &Path,
) -> Result<serde_json::Value> {
    serde_json::to_value(section)
        .map_err(|e| ElmError::format(path, format!("tokenizer.json: {what}: {e}")))
}

/// Refuses decoders with which the `tokenizers` crate (0.21.4) panics while decoding: a `Strip`
/// decoder with `stop > 0` indexes before the start of a token shorter than `stop` made of its
/// `content` alone (`decoders/strip.rs:46`; found by the tokenizer_json fuzz target). Real
/// tokenizers strip at the start only (`"start": 1, "stop": 0`).
pub(super) fn refuse_panicking_decoders(decoder: &serde_json::Value, path: &Path) -> Result<()> {
    if let Some(inner) = decoder.get("decoders").and_then(|d| d.as_array()) {
        for d in inner {
            refuse_panicking_decoders(d, path)?;
        }
    }
    let is_strip = decoder.get("type").and_then(|t| t.as_str()) == Some("Strip");
    let stop = decoder.get("stop").and_then(|s| s.as_u64()).unwrap_or(0);
    if is_strip && stop > 0 {
        return Err(ElmError::format(
            path,
            format!(
                "tokenizer.json: a Strip decoder with stop = {stop} is unsupported (the \
                 tokenizers crate panics on tokens shorter than it)"
            ),
        ));
    }
    Ok(())
}

/// Refuses post-processors the `tokenizers` crate (0.21.4) reads without complaint and then
/// panics on when encoding, or that add ids the vocabulary does not hold. Its
/// `TemplateProcessing` checks its templates only when built in code, not when read from JSON:
/// a template naming a special token that `special_tokens` lacks indexes a map with a missing
/// key, a single-sequence template with `$B` indexes the second of one encoding, and a special
/// token with more ids than token strings makes an encoding of unequal parts. `vocab_size` is
/// one past the largest id of the vocabulary: a post-processor's id past it would reach the
/// embedding as a row that does not exist.
pub(super) fn refuse_panicking_post_processors(
    processor: &serde_json::Value,
    vocab_size: usize,
    path: &Path,
) -> Result<()> {
    let refuse = |msg: String| {
        Err(ElmError::format(
            path,
            format!("tokenizer.json: post_processor: {msg}"),
        ))
    };
    let check_id = |id: &serde_json::Value, what: &str| -> Result<()> {
        match id.as_u64() {
            Some(id) if (id as usize) < vocab_size => Ok(()),
            _ => refuse(format!(
                "{what} has id {id}, not one of the vocabulary's ids 0..{vocab_size}"
            )),
        }
    };
    match processor.get("type").and_then(|t| t.as_str()) {
        Some("Sequence") => {
            for inner in processor
                .get("processors")
                .and_then(|p| p.as_array())
                .into_iter()
                .flatten()
            {
                refuse_panicking_post_processors(inner, vocab_size, path)?;
            }
        }
        Some("BertProcessing" | "RobertaProcessing") => {
            for key in ["sep", "cls"] {
                if let Some(id) = processor.get(key).and_then(|pair| pair.get(1)) {
                    check_id(id, key)?;
                }
            }
        }
        Some("TemplateProcessing") => {
            let empty = serde_json::Map::new();
            let specials = processor
                .get("special_tokens")
                .and_then(|t| t.as_object())
                .unwrap_or(&empty);
            for (name, token) in specials {
                let ids = token.get("ids").and_then(|i| i.as_array());
                let tokens = token.get("tokens").and_then(|t| t.as_array());
                if let (Some(ids), Some(tokens)) = (ids, tokens) {
                    if ids.len() != tokens.len() {
                        return refuse(format!(
                            "special token `{name}` has {} ids but {} token strings",
                            ids.len(),
                            tokens.len()
                        ));
                    }
                    for id in ids {
                        check_id(id, &format!("special token `{name}`"))?;
                    }
                }
            }
            for template in ["single", "pair"] {
                let pieces = processor.get(template).and_then(|t| t.as_array());
                for piece in pieces.into_iter().flatten() {
                    if let Some(id) = piece
                        .get("SpecialToken")
                        .and_then(|t| t.get("id"))
                        .and_then(|i| i.as_str())
                    {
                        if !specials.contains_key(id) {
                            return refuse(format!(
                                "the `{template}` template names special token `{id}`, which \
                                 special_tokens does not define"
                            ));
                        }
                    }
                    let sequence = piece.get("Sequence").and_then(|q| q.get("id"));
                    if template == "single" && sequence.and_then(|i| i.as_str()) == Some("B") {
                        return refuse(
                            "the `single` template uses sequence $B, which only a pair has".into(),
                        );
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Largest token id + 1 a `tokenizer.json` may use: 16× the largest real vocabulary (Gemma 3's
/// 262,144), so that ids cannot leave a range of holes without bound.
pub const MAX_JSON_TOKEN_ID: usize = 1 << 22;
