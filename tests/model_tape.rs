//! The decoder training path (`elm::model::tape`) against
//! (1) an independent numpy f64 reference (tests/fixtures/gen/ref_llama_block.py → tests/fixtures/autograd/
//!     tiny_{llama,qwen2}.json: logits, CE loss, and central-difference gradients of the loss
//!     w.r.t. every weight and w.r.t. the embedded input), and
//! (2) f64 central differences computed here through a 2-block stack (all weights + input),
//! plus structural checks (layer ranges, hidden states, KV prefix, frozen layers, memory).

use std::collections::HashMap;

use elm::autograd::{gradcheck, Tape, Var};
use elm::model::tape::{
    block_forward, block_forward_with_prefix, block_kv, BlockTensors, ModelTensors, ModelVars,
    Trainable,
};
use elm::model::weights::Gemma3Block;
use elm::model::{Arch, LayerWeights, ModelConfig, ModelWeights};
use elm::nn::{self, IGNORE_INDEX};
use ndarray::{s, Array1, Array2, ArrayD, IxDyn};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::Deserialize;

#[derive(Deserialize)]
struct Tensor {
    shape: Vec<usize>,
    data: Vec<f64>,
}

impl Tensor {
    fn arr(&self) -> ArrayD<f64> {
        ArrayD::from_shape_vec(IxDyn(&self.shape), self.data.clone()).unwrap()
    }
    fn a1(&self) -> Array1<f32> {
        assert_eq!(self.shape.len(), 1);
        Array1::from_iter(self.data.iter().map(|&x| x as f32))
    }
    fn a2(&self) -> Array2<f32> {
        assert_eq!(self.shape.len(), 2);
        Array2::from_shape_vec(
            (self.shape[0], self.shape[1]),
            self.data.iter().map(|&x| x as f32).collect(),
        )
        .unwrap()
    }
}

#[derive(Deserialize)]
struct Fixture {
    config: ModelConfig,
    ids: Vec<Vec<usize>>,
    targets: Vec<Vec<i64>>,
    weights: HashMap<String, Tensor>,
    logits: Tensor,
    loss: f64,
    grads: HashMap<String, Tensor>,
    grad_h0: Tensor,
}

fn load(arch: &str) -> Fixture {
    let path = format!(
        "{}/tests/fixtures/autograd/tiny_{arch}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn weights_of(fx: &Fixture) -> ModelWeights {
    let w = &fx.weights;
    let layers = (0..fx.config.num_layers)
        .map(|l| {
            let g = |n: &str| &w[&format!("layers.{l}.{n}")];
            let opt = |n: &str| w.get(&format!("layers.{l}.{n}")).map(|t| t.a1());
            LayerWeights {
                attn_norm: g("attn_norm").a1(),
                wq: g("wq").a2(),
                wk: g("wk").a2(),
                wv: g("wv").a2(),
                wo: g("wo").a2(),
                bq: opt("bq"),
                bk: opt("bk"),
                bv: opt("bv"),
                mlp_norm: g("mlp_norm").a1(),
                w_gate: g("w_gate").a2(),
                w_up: g("w_up").a2(),
                w_down: g("w_down").a2(),
                gemma: None,
            }
        })
        .collect();
    ModelWeights {
        config: fx.config.clone(),
        embed: w["embed"].a2(),
        layers,
        final_norm: w["final_norm"].a1(),
        lm_head: w.get("lm_head").map(|t| t.a2()),
    }
}

/// `(name, var)` for every weight, named like the fixture.
fn named_vars(m: &ModelVars) -> Vec<(String, Var)> {
    let mut v = vec![("embed".to_string(), m.embed)];
    for (l, b) in m.layers.iter().enumerate() {
        for (n, var) in b.named() {
            v.push((format!("layers.{l}.{n}"), *var));
        }
    }
    v.push(("final_norm".into(), m.final_norm));
    if m.lm_head != m.embed {
        v.push(("lm_head".into(), m.lm_head));
    }
    v
}

/// ∞-norm relative difference, printed on failure.
fn rel_diff<T: Into<f64> + Copy>(got: &ArrayD<T>, want: &ArrayD<f64>) -> (f64, f64) {
    assert_eq!(got.shape(), want.shape());
    let abs = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a.into() - b).abs())
        .fold(0.0, f64::max);
    let scale = want.iter().map(|x| x.abs()).fold(0.0, f64::max).max(1e-12);
    (abs, abs / scale)
}

fn check_against_fixture<T: elm::autograd::AdFloat + Into<f64>>(
    arch: &str,
    logit_tol: f64,
    grad_tol: f64,
) {
    let fx = load(arch);
    let tensors = ModelTensors::<T>::from_weights(&weights_of(&fx)).unwrap();
    let (b, t) = (fx.ids.len(), fx.ids[0].len());
    let ids: Vec<usize> = fx.ids.concat();
    let targets: Vec<i64> = fx.targets.concat();
    assert!(targets.contains(&IGNORE_INDEX));

    // All weights trainable: logits, loss and every weight gradient.
    let mut tape = Tape::<T>::new();
    let m = ModelVars::register(&mut tape, &tensors, &Trainable::all(fx.config.num_layers));
    let logits = m.forward_logits(&mut tape, &ids, b, t).unwrap();
    let (abs, rel) = rel_diff(tape.value(logits), &fx.logits.arr());
    println!(
        "{arch} {}: logits max abs {abs:.3e} rel {rel:.3e}",
        std::any::type_name::<T>()
    );
    assert!(
        rel < logit_tol,
        "{arch} logits: max abs {abs:.3e} rel {rel:.3e}"
    );
    let loss = nn::cross_entropy(&mut tape, logits, &targets, IGNORE_INDEX).unwrap();
    let lv: f64 = tape.scalar(loss).into();
    assert!(
        (lv - fx.loss).abs() / fx.loss < logit_tol,
        "{arch} loss {lv} vs numpy {}",
        fx.loss
    );
    let grads = tape.backward(loss).unwrap();
    let names = named_vars(&m);
    assert_eq!(
        names.len(),
        fx.grads.len(),
        "every fixture weight is covered"
    );
    for (name, var) in names {
        let (abs, rel) = rel_diff(grads.get(var).unwrap(), &fx.grads[&name].arr());
        assert!(
            rel < grad_tol,
            "{arch} grad {name}: max abs {abs:.3e} rel {rel:.3e}"
        );
    }

    // Everything frozen, gradient w.r.t. the embedded input only (flows through frozen blocks).
    let mut tape = Tape::<T>::new();
    let m = ModelVars::register(&mut tape, &tensors, &Trainable::none());
    let emb = m.embed(&mut tape, &ids, b, t).unwrap();
    let h0 = tape.param(tape.value(emb).clone());
    let h = m
        .run_layers(&mut tape, 0..fx.config.num_layers, h0, 0)
        .unwrap();
    let logits = m.head(&mut tape, h).unwrap();
    let loss = nn::cross_entropy(&mut tape, logits, &targets, IGNORE_INDEX).unwrap();
    let grads = tape.backward(loss).unwrap();
    assert_eq!(grads.len(), 1, "frozen weights must not receive gradients");
    let (abs, rel) = rel_diff(grads.get(h0).unwrap(), &fx.grad_h0.arr());
    println!(
        "{arch} {}: dL/dh0 max abs {abs:.3e} rel {rel:.3e}",
        std::any::type_name::<T>()
    );
    assert!(
        rel < grad_tol,
        "{arch} dL/dh0: max abs {abs:.3e} rel {rel:.3e}"
    );
}

#[test]
fn llama_matches_numpy_reference_f64() {
    // Fixture gradients are numpy central differences (error ~1e-9).
    check_against_fixture::<f64>("llama", 1e-12, 1e-6);
}

#[test]
fn qwen2_matches_numpy_reference_f64() {
    check_against_fixture::<f64>("qwen2", 1e-12, 1e-6);
}

#[test]
fn f32_path_matches_numpy_reference() {
    check_against_fixture::<f32>("llama", 1e-5, 1e-4);
    check_against_fixture::<f32>("qwen2", 1e-5, 1e-4);
}

/// Random weights of layer `layer` of `cfg` (with Gemma 3's norms and attention when `cfg` is
/// a Gemma 3).
fn random_layer(cfg: &ModelConfig, layer: usize, rng: &mut StdRng) -> LayerWeights {
    let (c, i) = (cfg.hidden_size, cfg.intermediate_size);
    let (hd, kvd) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let mut m = |r: usize, k: usize, sc: f32| {
        Array2::from_shape_fn((r, k), |_| sc * rng.gen_range(-1.0f32..1.0))
    };
    let (wq, wk, wv, wo) = (m(hd, c, 0.4), m(kvd, c, 0.4), m(kvd, c, 0.4), m(c, hd, 0.3));
    let (w_gate, w_up, w_down) = (m(i, c, 0.3), m(i, c, 0.3), m(c, i, 0.3));
    let mut v = |n: usize, base: f32| {
        Array1::from_shape_fn(n, |_| base + 0.2 * rng.gen_range(-1.0f32..1.0))
    };
    let bias = cfg.attention_bias;
    LayerWeights {
        attn_norm: v(c, 1.0),
        wq,
        wk,
        wv,
        wo,
        bq: bias.then(|| v(hd, 0.0)),
        bk: bias.then(|| v(kvd, 0.0)),
        bv: bias.then(|| v(kvd, 0.0)),
        mlp_norm: v(c, 1.0),
        w_gate,
        w_up,
        w_down,
        gemma: cfg.has_gemma_norms().then(|| Gemma3Block {
            q_norm: v(cfg.head_dim, 1.0),
            k_norm: v(cfg.head_dim, 1.0),
            post_attn_norm: v(c, 1.0),
            post_mlp_norm: v(c, 1.0),
            attention: cfg.layer_attention(layer),
        }),
    }
}

/// f64 central differences through two blocks, w.r.t. the input and every block weight. The
/// Gemma 3 stack is a local layer (window 2 of 3 tokens, its own RoPE base) then a global one,
/// with q/k norms, post-norms and GeGLU.
#[test]
fn two_block_stack_gradcheck_f64() {
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Gemma3] {
        let cfg = ModelConfig {
            num_layers: 2,
            ..ModelConfig::tiny(arch)
        };
        let mut rng = StdRng::seed_from_u64(7);
        let layers: Vec<BlockTensors<f64>> = (0..2)
            .map(|l| BlockTensors::from_weights(&random_layer(&cfg, l, &mut rng), &cfg))
            .collect();
        let x = ArrayD::from_shape_fn(IxDyn(&[1, 3, cfg.hidden_size]), |_| {
            rng.gen_range(-1.0..1.0)
        });
        let mut inputs = vec![x];
        for l in &layers {
            inputs.extend(l.named().into_iter().map(|(_, a)| (**a).clone()));
        }
        let per_block = layers[0].named().len();
        let r = gradcheck(
            |tape, v| {
                let mut h = v[0];
                for l in 0..2 {
                    let w = &v[1 + l * per_block..1 + (l + 1) * per_block];
                    let mut it = w.iter().copied();
                    let b = layers[l].map(|_, _| it.next().expect("one var per tensor"));
                    h = block_forward(tape, &b, h, 2)?;
                }
                Ok(h)
            },
            &inputs,
            1e-6,
        )
        .unwrap();
        println!("{arch:?} 2-block stack: {r}");
        assert!(r.max_rel_err < 1e-6, "{arch:?}: {r}");
    }
}

/// Three `random_layer` blocks (uniform, at the gradchecks' scale) and a unit final norm: not
/// `common::tiny_weights`' scaled normals.
fn uniform_tiny_model(arch: Arch, seed: u64) -> ModelWeights {
    let cfg = ModelConfig {
        num_layers: 3,
        ..ModelConfig::tiny(arch)
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let layers = (0..cfg.num_layers)
        .map(|l| random_layer(&cfg, l, &mut rng))
        .collect();
    let embed = Array2::from_shape_fn((cfg.vocab_size, cfg.hidden_size), |_| {
        rng.gen_range(-1.0f32..1.0)
    });
    let lm_head = (!cfg.tie_word_embeddings).then(|| {
        Array2::from_shape_fn((cfg.vocab_size, cfg.hidden_size), |_| {
            rng.gen_range(-0.3f32..0.3)
        })
    });
    ModelWeights {
        final_norm: Array1::ones(cfg.hidden_size),
        config: cfg,
        embed,
        layers,
        lm_head,
    }
}

#[test]
fn layer_ranges_hidden_states_and_kv_prefix_agree() {
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Gemma3] {
        let w = uniform_tiny_model(arch, 3);
        let tensors = ModelTensors::<f64>::from_weights(&w).unwrap();
        let mut tape = Tape::<f64>::new();
        let m = ModelVars::register(&mut tape, &tensors, &Trainable::none());
        let ids: Vec<usize> = (0..12).map(|i| (i * 7 + 3) % 64).collect();
        let hs = m.hidden_states(&mut tape, &ids, 2, 6).unwrap();
        assert_eq!(hs.len(), 4);
        let a = m.run_layers(&mut tape, 0..1, hs[0], 0).unwrap();
        let a = m.run_layers(&mut tape, 1..3, a, 0).unwrap();
        assert_eq!(tape.value(a), tape.value(hs[3]));
        let logits = m.forward_logits(&mut tape, &ids, 2, 6).unwrap();
        let via_hs = m.head(&mut tape, hs[3]).unwrap();
        assert_eq!(tape.value(logits), tape.value(via_hs));
        assert_eq!(tape.value(logits).shape(), &[2, 6, 64]);
        assert!(m.run_layers(&mut tape, 2..4, hs[0], 0).is_err());
        // The tape-free path computes the same blocks.
        let plain = tensors
            .run_layers_plain(0..3, tape.value(hs[0]), 0)
            .unwrap();
        let d = (&plain - tape.value(hs[3]))
            .mapv(f64::abs)
            .fold(0.0, |a: f64, &b| a.max(b));
        assert!(d < 1e-13, "{arch:?}: plain vs tape max abs diff {d:.3e}");

        // Block 1 on 6 tokens == block 1 on the last 2 tokens with the first 4 as KV prefix.
        let x = hs[1];
        let full = block_forward(&mut tape, &m.layers[1], x, 0).unwrap();
        let xv = tape.value(x).clone();
        let head = tape.constant(xv.slice(s![.., ..4, ..]).to_owned().into_dyn());
        let tail = tape.constant(xv.slice(s![.., 4.., ..]).to_owned().into_dyn());
        let (kp, vp) = block_kv(&mut tape, &m.layers[1], head, 0).unwrap();
        let out =
            block_forward_with_prefix(&mut tape, &m.layers[1], tail, 4, Some((kp, vp))).unwrap();
        let want = tape
            .value(full)
            .slice(s![.., 4.., ..])
            .to_owned()
            .into_dyn();
        let d = (tape.value(out) - &want)
            .mapv(f64::abs)
            .fold(0.0, |a: f64, &b| a.max(b));
        assert!(d < 1e-12, "{arch:?}: prefix vs full max abs diff {d:.3e}");
    }
}

/// Memory: backward frees activations as it goes. Measured on a 3-block tiny model in f32.
#[test]
fn backward_frees_activations() {
    let w = uniform_tiny_model(Arch::Llama, 5);
    let tensors = ModelTensors::<f32>::from_weights(&w).unwrap();
    let ids: Vec<usize> = (0..64).map(|i| (i * 5 + 1) % 64).collect();
    let targets: Vec<i64> = ids.iter().map(|&i| ((i + 1) % 64) as i64).collect();
    let run = |retain: bool| {
        let mut tape = Tape::<f32>::new();
        tape.retain_values(retain);
        let m = ModelVars::register(
            &mut tape,
            &tensors,
            &Trainable {
                embed: false,
                layers: 1..2,
                head: false,
            },
        );
        let logits = m.forward_logits(&mut tape, &ids, 2, 32).unwrap();
        let loss = nn::cross_entropy(&mut tape, logits, &targets, IGNORE_INDEX).unwrap();
        let after_forward = tape.live_bytes();
        let g = tape.backward(loss).unwrap();
        // Only block 1's 9 weights are params.
        assert_eq!(g.len(), 9);
        (after_forward, tape.live_bytes(), tape.peak_bytes())
    };
    let (fwd, after_free, peak_free) = run(false);
    let (_, after_keep, peak_keep) = run(true);
    println!("tape bytes: after forward {fwd}, after backward {after_free} (retain_values: {after_keep}), peak {peak_free} (retain_values: {peak_keep})");
    let weights: usize = w.layers.iter().map(|l| l.num_params()).sum::<usize>() * 4
        + w.embed.len() * 4
        + w.final_norm.len() * 4;
    // After backward only the (shared) weight leaves and the loss remain.
    assert!(
        after_free <= weights + 64,
        "{after_free} vs weights {weights}"
    );
    assert!(after_keep > after_free + (fwd - weights) / 2);
    assert!(peak_free <= peak_keep);
}

/// The tape's Gemma 3 (q/k norms, post-norms, GeGLU, `√C` embedding scale, a local layer with
/// window 2 and its own RoPE base between global ones) computes the logits of the inference
/// path, which is held to llama.cpp on the real checkpoint (`tests/model_gemma3.rs`). Ten
/// tokens, so the window hides most keys of the local layers.
#[test]
fn gemma3_tape_matches_the_inference_path() {
    use elm::model::Transformer;
    let w = uniform_tiny_model(Arch::Gemma3, 11);
    assert_eq!(w.config.layer_attention(0).window, Some(2));
    assert_eq!(w.config.layer_attention(1).window, None);
    let ids: Vec<usize> = (0..10).map(|i| (i * 11 + 5) % 64).collect();
    let tensors = ModelTensors::<f64>::from_weights(&w).unwrap();
    let mut tape = Tape::<f64>::new();
    let m = ModelVars::register(&mut tape, &tensors, &Trainable::none());
    let taped = m.forward_logits(&mut tape, &ids, 1, ids.len()).unwrap();
    let inference = Transformer::new(w.clone())
        .unwrap()
        .forward_logits(&[ids.iter().map(|&i| i as u32).collect()])
        .unwrap();
    let d = (tape.value(taped).mapv(|v| v as f32) - &inference.into_dyn())
        .mapv(f32::abs)
        .fold(0.0f32, |a, &b| a.max(b));
    let scale = tape
        .value(taped)
        .mapv(f64::abs)
        .fold(0.0f64, |a, &b| a.max(b));
    println!("gemma3 tape vs inference: max |Δlogit| {d:.3e} (max |logit| {scale:.2})");
    assert!(d < 1e-3 * scale.max(1.0) as f32, "{d}");
    // Without its window the local layer computes something else: the window is exercised.
    let mut no_window = w.clone();
    no_window.config.sliding_window = Some(64);
    for l in &mut no_window.layers {
        if let Some(g) = &mut l.gemma {
            g.attention.window = g.attention.window.map(|_| 64);
        }
    }
    let wide = Transformer::new(no_window)
        .unwrap()
        .forward_logits(&[ids.iter().map(|&i| i as u32).collect()])
        .unwrap();
    let moved = (tape.value(taped).mapv(|v| v as f32) - &wide.into_dyn())
        .mapv(f32::abs)
        .fold(0.0f32, |a, &b| a.max(b));
    assert!(
        moved > 100.0 * d.max(1e-6),
        "window changed logits by only {moved}"
    );
}
