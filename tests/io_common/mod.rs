//! Helpers shared by the `io_*` integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use elm::model::{Arch, LayerWeights, ModelConfig, ModelWeights};
use ndarray::{Array1, Array2};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `tests/fixtures/io/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/io")
        .join(name)
}

pub fn read_json(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture(name)).expect("fixture");
    serde_json::from_str(&text).expect("fixture json")
}

/// The real SmolLM2 GGUF via `ELM_MODELS_DIR` (default `<crate>/models`). `None` (with a
/// printed message) only when absent and not in CI; in CI a missing model fails the test.
pub fn smollm2_path() -> Option<PathBuf> {
    let dir = std::env::var_os("ELM_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    let path = dir.join(SMOLLM2_GGUF);
    if path.is_file() {
        return Some(path);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{} is missing in CI (run scripts/fetch-smollm2.sh)",
            path.display()
        );
    }
    eprintln!(
        "SKIP: {} not found (set ELM_MODELS_DIR or run scripts/fetch-smollm2.sh)",
        path.display()
    );
    None
}

/// A fresh, unique temp dir (tests run in parallel threads of one process).
pub fn temp_dir(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("elm-io-test-{}-{n}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_mat(rng: &mut StdRng, r: usize, c: usize) -> Array2<f32> {
    Array2::from_shape_fn((r, c), |_| rng.gen_range(-1.0..1.0))
}
fn rand_vec(rng: &mut StdRng, n: usize) -> Array1<f32> {
    Array1::from_shape_fn(n, |_| rng.gen_range(0.5..1.5))
}

/// Random weights for `config` (seeded).
pub fn random_weights(config: &ModelConfig, seed: u64) -> ModelWeights {
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
        .map(|_| LayerWeights {
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

pub fn tiny(arch: Arch) -> ModelConfig {
    let mut c = ModelConfig::tiny(arch);
    c.num_layers = 2;
    c
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
