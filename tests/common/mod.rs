//! Fixtures shared by the integration tests (each test file says `mod common;`):
//!
//! - the skip policy ([`require`], [`optional`]; `tests/common/skip.rs`, shared with
//!   `paper_repro/tests`): a missing prerequisite fails under CI or `ELM_REQUIRE_REAL_MODEL=1`,
//!   elsewhere the test prints `skipped <test>: <why>` and is counted in the skip log;
//! - the real SmolLM2 checkpoint: [`real_model`], the one lookup every real-checkpoint test
//!   uses;
//! - tiny random models: [`tiny_config`], [`tiny_weights`], [`tiny_transformer`], and
//!   [`uniform_weights`] (used by the io round trips);
//! - [`TempDir`]: a fresh directory removed on drop;
//! - committed reference files under `tests/fixtures/` ([`fixture`], [`fixture_json`]), a
//!   word-level tokenizer over the tiny vocabulary and a weight comparison.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use elm::model::{Arch, LayerWeights, ModelConfig, ModelWeights, Transformer};
use ndarray::{Array1, Array2};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------- skips

mod skip;
#[allow(unused_imports)]
pub use skip::{current_test, optional, require, skip, skip_log, strict, REQUIRE_REAL_MODEL};

// ---------------------------------------------------------------------------- real model

/// The real SmolLM2-135M-Instruct GGUF (`elm::model::default_model_path()`: the file
/// `elm::formats::SMOLLM2_GGUF` in `$ELM_MODELS_DIR`, default `models/`, fetched by
/// scripts/setup.sh); its tokenizer is inside it. When absent: [`require`]'s policy (a failure
/// under CI or `ELM_REQUIRE_REAL_MODEL=1`, else a counted skip) and `None`:
///
/// ```ignore
/// let Some(path) = common::real_model() else { return };
/// ```
pub fn real_model() -> Option<PathBuf> {
    let path = elm::model::default_model_path();
    require(
        "the real model",
        path.is_file(),
        format!(
            "not found at {} (run scripts/setup.sh, or point ELM_MODELS_DIR at the directory \
             holding {})",
            path.display(),
            elm::formats::SMOLLM2_GGUF
        ),
    )
    .then_some(path)
}

/// The real Gemma 3 270M Q4_K_M GGUF (`elm::formats::GEMMA3_GGUF` in `$ELM_MODELS_DIR`,
/// fetched by scripts/setup.sh), with [`real_model`]'s one behaviour when it is absent.
pub fn real_gemma3() -> Option<PathBuf> {
    fetched_file(
        elm::formats::models_dir().join(elm::formats::GEMMA3_GGUF),
        "the real Gemma 3 model",
    )
}

/// A file `scripts/setup.sh` fetches (e.g. HumanEval's problems), with [`real_model`]'s one
/// behaviour when it is absent.
pub fn fetched_file(path: PathBuf, what: &str) -> Option<PathBuf> {
    let found = path.is_file();
    require(
        what,
        found,
        format!("not found at {} (run scripts/setup.sh)", path.display()),
    )
    .then_some(path)
}

// ---------------------------------------------------------------------------- tiny models

/// `ModelConfig::tiny(arch)` (vocab 64, width 32, context 128) with `layers` layers.
pub fn tiny_config(arch: Arch, layers: usize) -> ModelConfig {
    ModelConfig {
        num_layers: layers,
        ..ModelConfig::tiny(arch)
    }
}

/// `ModelWeights::random` (seeded) on [`tiny_config`].
pub fn tiny_weights(arch: Arch, layers: usize, seed: u64) -> ModelWeights {
    ModelWeights::random(&tiny_config(arch, layers), seed)
}

/// Three seeded prompts of 6, 3 and 9 tokens inside the tiny vocabulary (ragged on purpose:
/// batched passes must pad them).
pub fn ragged_prompts() -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(8);
    [6usize, 3, 9]
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(3..64)).collect())
        .collect()
}

/// [`tiny_weights`] ready for inference.
pub fn tiny_transformer(arch: Arch, layers: usize, seed: u64) -> Transformer {
    Transformer::new(tiny_weights(arch, layers, seed)).unwrap()
}

fn rand_mat(rng: &mut StdRng, r: usize, c: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |_| rng.gen_range(-1.0..1.0))
}
fn rand_vec(rng: &mut StdRng, n: usize) -> Array1<f32> {
    Array1::from_shape_fn(n, |_| rng.gen_range(0.5..1.5))
}

/// Seeded uniform weights for `config`: matrices in ±1, norms and biases in 0.5..1.5 (not
/// `ModelWeights::random`'s scaled normals; the io save/load round trips use these).
pub fn uniform_weights(config: &ModelConfig, seed: u64) -> ModelWeights {
    let mut rng = StdRng::seed_from_u64(seed);
    let (c, i, v) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
    );
    let (hd, kvd) = (
        config.num_heads * config.head_dim,
        config.num_kv_heads * config.head_dim,
    );
    let bias = config.attention_bias;
    let layers = (0..config.num_layers)
        .map(|layer| LayerWeights {
            attn_norm: rand_vec(&mut rng, c),
            wq: rand_mat(&mut rng, hd, c),
            wk: rand_mat(&mut rng, kvd, c),
            wv: rand_mat(&mut rng, kvd, c),
            wo: rand_mat(&mut rng, c, hd),
            bq: bias.then(|| rand_vec(&mut rng, hd)),
            bk: bias.then(|| rand_vec(&mut rng, kvd)),
            bv: bias.then(|| rand_vec(&mut rng, kvd)),
            mlp_norm: rand_vec(&mut rng, c),
            w_gate: rand_mat(&mut rng, i, c),
            w_up: rand_mat(&mut rng, i, c),
            w_down: rand_mat(&mut rng, c, i),
            gemma: config
                .has_gemma_norms()
                .then(|| elm::model_data::weights::Gemma3Block {
                    q_norm: rand_vec(&mut rng, config.head_dim),
                    k_norm: rand_vec(&mut rng, config.head_dim),
                    post_attn_norm: rand_vec(&mut rng, c),
                    post_mlp_norm: rand_vec(&mut rng, c),
                    attention: config.layer_attention(layer),
                }),
        })
        .collect();
    ModelWeights {
        config: config.clone(),
        embed: rand_mat(&mut rng, v, c),
        layers,
        final_norm: rand_vec(&mut rng, c),
        lm_head: (!config.tie_word_embeddings).then(|| rand_mat(&mut rng, v, c)),
    }
}

/// Asserts two weight sets are bit-identical, naming the first differing tensor.
pub fn assert_weights_eq(a: &ModelWeights, b: &ModelWeights) {
    assert_eq!(a.config, b.config);
    let cmp2 = |n: &str, x: &Array2<f32>, y: &Array2<f32>| {
        assert_eq!(x.shape(), y.shape(), "{n} shape");
        let d = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(x == y, "{n}: max abs diff {d}");
    };
    let cmp1 = |n: &str, x: &Array1<f32>, y: &Array1<f32>| {
        assert!(x == y, "{n} differs");
    };
    cmp2("embed", &a.embed, &b.embed);
    cmp1("final_norm", &a.final_norm, &b.final_norm);
    assert_eq!(a.lm_head.is_some(), b.lm_head.is_some());
    if let (Some(x), Some(y)) = (&a.lm_head, &b.lm_head) {
        cmp2("lm_head", x, y);
    }
    for (l, (x, y)) in a.layers.iter().zip(&b.layers).enumerate() {
        cmp1(&format!("{l}.attn_norm"), &x.attn_norm, &y.attn_norm);
        cmp2(&format!("{l}.wq"), &x.wq, &y.wq);
        cmp2(&format!("{l}.wk"), &x.wk, &y.wk);
        cmp2(&format!("{l}.wv"), &x.wv, &y.wv);
        cmp2(&format!("{l}.wo"), &x.wo, &y.wo);
        assert_eq!(x.bq, y.bq, "{l}.bq");
        assert_eq!(x.bk, y.bk, "{l}.bk");
        assert_eq!(x.bv, y.bv, "{l}.bv");
        cmp1(&format!("{l}.mlp_norm"), &x.mlp_norm, &y.mlp_norm);
        cmp2(&format!("{l}.w_gate"), &x.w_gate, &y.w_gate);
        cmp2(&format!("{l}.w_up"), &x.w_up, &y.w_up);
        cmp2(&format!("{l}.w_down"), &x.w_down, &y.w_down);
    }
}

// ---------------------------------------------------------------------------- temp dirs

/// A fresh, empty directory under the system temp dir, unique per process and per call (tests
/// run as parallel threads of one process), removed with its contents on drop. A failing test
/// keeps it and prints where, so its files can be inspected.
///
/// Derefs to `Path`; bind it to a name (`let dir = TempDir::new("x");`): a temporary
/// (`TempDir::new("x").join("f")`) is removed at the end of its statement.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("elm-test-{}-{n}-{name}", std::process::id()));
        // A leftover of an earlier process with the same id.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} (the test failed)", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

// ---------------------------------------------------------------------------- fixtures

/// `tests/fixtures/<rel>` (committed reference files).
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// `tests/fixtures/<rel>`, parsed as JSON.
pub fn fixture_json(rel: &str) -> serde_json::Value {
    let path = fixture(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// Writes a `.jsonl` training text of `lines` records of 12 words of [`word_tokenizer_json`]'s
/// vocabulary (`stride` varies the words from line to line).
pub fn write_word_corpus(path: &Path, lines: usize, stride: usize) {
    let records: Vec<String> = (0..lines)
        .map(|i| {
            let words: Vec<String> = (0..12)
                .map(|j| format!("w{}", 3 + (i * stride + j) % 60))
                .collect();
            serde_json::json!({ "text": words.join(" ") }).to_string()
        })
        .collect();
    std::fs::write(path, records.join("\n")).unwrap();
}

/// `w` as an HF model directory at `dir` with [`word_tokenizer_json`]'s tokenizer: a model the
/// `elm` CLI loads like a real one.
pub fn write_word_model(w: &elm::model::ModelWeights, dir: &Path) {
    elm::formats::save_hf_model(w, dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), word_tokenizer_json()).unwrap();
}

/// A word-level tokenizer (HF `tokenizer.json`) over the tiny models' 64 ids: `<unk>`, `<s>`,
/// `</s>`, `w3`..`w63`.
pub fn word_tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(t.to_string(), i.into());
    }
    for i in 3..64 {
        vocab.insert(format!("w{i}"), i.into());
    }
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
    .to_string()
}

/// Whether this kernel collapses advised memory into transparent huge pages
/// (`MADV_COLLAPSE`, Linux 6.1+, THP not switched off); tests of
/// `elm::heap::back_with_huge_pages` hold its effect to the kernel's counters only then.
pub fn huge_page_collapse_expected() -> bool {
    let thp_on = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| !s.contains("[never]"));
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']);
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let supported = thp_on && (major, minor) >= (6, 1);
    if !supported {
        eprintln!("kernel {release:?} without THP collapse: huge-page effects not checked");
    }
    supported
}

/// A lock the tests of one file take to run one at a time (each test binary compiles its own
/// copy of this module, so the lock is per file): for a file whose tests share something
/// process-wide — the GEMM precision, the resident-memory counter, a sandbox user's process
/// limit. The caller's comment says what.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
