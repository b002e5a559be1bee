//! Shared helpers of the fuzz targets (`fuzz_targets/*.rs`) and the seed generator
//! (`gen_seeds.rs`): where an input goes on disk, the size cap on what a target reads, and the
//! micro model configs the safetensors target and its seeds agree on.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use elm::model_data::{Arch, ModelConfig};

/// Largest tensor (in bytes, as stored or as f32) a target reads: keeps every run fast and far
/// below libFuzzer's `-malloc_limit_mb`. Inputs are a few KiB, so only a reader that trusts a
/// size from the file could ask for more, and such a tensor is refused at open time anyway.
pub const MAX_TENSOR_BYTES: u64 = 64 << 20;

/// A scratch folder of this process: `$ELM_FUZZ_TMP` (scripts/fuzz.sh points it at a folder it
/// removes afterwards), else `/dev/shm` (no disk writes per execution), else the temp folder.
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::var_os("ELM_FUZZ_TMP")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("elm-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fuzz scratch folder");
        dir
    })
}

/// Writes `data` to `name` in [`scratch_dir`] (replacing the previous input) and returns its path:
/// the readers under test take paths (they memory-map files), not byte slices.
pub fn input_file(name: &str, data: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, data).expect("write the fuzz input");
    path
}

/// A sub-folder `name` of [`scratch_dir`] (created on first use; a target that writes its input
/// there overwrites the same file names each time).
pub fn input_dir(name: &str) -> PathBuf {
    let dir = scratch_dir().join(name);
    std::fs::create_dir_all(&dir).expect("create the fuzz input folder");
    dir
}

/// The smallest model of each family the loaders accept: vocabulary 8, width 4, one layer of
/// 2 heads (1 KV head) of dimension 2, so a whole checkpoint is a few hundred bytes. Llama ties
/// its embeddings, Qwen2 has attention biases and an `lm_head`, Gemma 3 has its extra norms.
pub fn micro_config(arch: Arch) -> ModelConfig {
    // The family's own switches (tied embeddings, biases, Gemma 3's windows) from
    // `ModelConfig::tiny`; only the sizes are smaller.
    ModelConfig {
        vocab_size: 8,
        hidden_size: 4,
        intermediate_size: 4,
        num_layers: 1,
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 2,
        max_position_embeddings: 16,
        ..ModelConfig::tiny(arch)
    }
}

/// The families, in the order the safetensors target's selector byte picks them.
pub const ARCHS: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Gemma3];

/// Texts the tokenizer targets encode: ASCII words, digits, a control token written in the
/// text, spaces and newlines, multi-byte UTF-8 and SentencePiece's `▁`.
pub const TOKENIZER_TEXTS: &[&str] = &[
    "Hello, world! 12345",
    "<|im_start|>user\nhéllo  wörld\n\n<|im_end|>",
    " \t\r\n ▁x 日本語 🦀 '' 's",
    "",
];

/// What a caller does with a tokenizer it loaded: every accessor, [`TOKENIZER_TEXTS`] encoded
/// (with and without special tokens) and decoded, the first ids decoded and looked up, a chat
/// prompt formatted. Property beyond "no panic": every id `encode` returns is below
/// `vocab_size()` (`decode` refuses the others, and a model indexes its embedding with them).
pub fn exercise_tokenizer(tok: &elm::formats::Tokenizer) {
    let n = tok.vocab_size();
    let _ = (
        tok.bos_id(),
        tok.eos_id(),
        tok.prepends_bos(),
        tok.has_chat_template(),
        tok.default_system_prompt(),
    );
    for text in TOKENIZER_TEXTS {
        for add_special in [false, true] {
            if let Ok(ids) = tok.encode(text, add_special) {
                if let Some(bad) = ids.iter().find(|&&id| id as usize >= n) {
                    panic!("encode({text:?}) gave id {bad}, outside vocab_size {n}: {ids:?}");
                }
                let _ = tok.decode(&ids);
            }
        }
        let _ = tok.encode_prompt(text);
    }
    let first: Vec<u32> = (0..n.min(64) as u32).collect();
    let _ = tok.decode(&first);
    let _ = tok.decode(&[u32::MAX]);
    for &id in &first {
        if let Some(t) = tok.id_to_token(id) {
            let _ = tok.token_to_id(&t);
        }
    }
    let _ = tok.apply_chat_template(&[("system", "be brief"), ("user", "hi")], true);
    let _ = tok.apply_chat_template(&[("user", "hi")], false);
}

/// The safetensors target's first byte: bits 0-6 pick the family (`ARCHS`, modulo 3), bit 7
/// asks for one extra tensor `elm.extra` of shape `[2, 2]` (`load_hf_model_with`'s `extra`).
pub fn safetensors_case(selector: u8) -> (ModelConfig, Vec<(String, Vec<usize>)>) {
    let config = micro_config(ARCHS[(selector & 0x7f) as usize % ARCHS.len()]);
    let extra = if selector & 0x80 != 0 {
        vec![("elm.extra".to_string(), vec![2, 2])]
    } else {
        Vec::new()
    };
    (config, extra)
}

/// Runs one input's body. With `ELM_FUZZ_IGNORE_PANICS` set (a comma-separated list of
/// substrings), a panic whose `file:line:col: message` contains one of them is caught and the
/// input counts as refused instead of as a crash: opt-in, to fuzz past bugs already reported
/// (e.g. `ELM_FUZZ_IGNORE_PANICS=src/formats/gguf.rs:462,decoders/mod.rs:90`) until they are
/// fixed. Unset (the default), a panic aborts through libFuzzer's hook as usual.
pub fn guarded(body: impl FnOnce()) {
    static IGNORE: OnceLock<Vec<String>> = OnceLock::new();
    let ignore = IGNORE.get_or_init(|| {
        let list: Vec<String> = std::env::var("ELM_FUZZ_IGNORE_PANICS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        if !list.is_empty() {
            // Installed on the first input, after libfuzzer-sys's own hook (which aborts):
            // that hook still handles every panic not on the list.
            let aborting = std::panic::take_hook();
            let known = list.clone();
            std::panic::set_hook(Box::new(move |info| {
                let payload = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                let at = info
                    .location()
                    .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
                    .unwrap_or_default();
                let text = format!("{at}: {payload}");
                if !known.iter().any(|k| text.contains(k.as_str())) {
                    aborting(info);
                }
            }));
        }
        list
    });
    if ignore.is_empty() {
        body();
    } else {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    }
}
