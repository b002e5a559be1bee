//! `elm::lora`: the merge checked against the unmerged LoRA forward (one linear map and a whole
//! model, with α/r ≠ 1 so a merge without the scaling fails), SFT lowering the answer CE,
//! resume = uninterrupted, and typed errors for bad input.

mod common;

use common::{tiny_weights, TempDir};
use elm::data::{make_batch, TokenSequence};
use elm::lora::{LoraConfig, LoraSpec, LoraTrainer};
use elm::model::dense_pass::{embed, run_dense_layers};
use elm::model::lora_adapter::{insert_adapters, lora_names, merge_layer, target_linear, TARGETS};
use elm::model::{Arch, ModelConfig};
use elm::search::candidate::answer_nll_of_hidden;
use elm::train::OptimConfig;
use elm::train::ParamStore;
use ndarray::{Array2, ArrayD, Ix2, IxDyn};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn data(n: usize, seed: u64) -> Vec<TokenSequence> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let len = rng.gen_range(8..14);
            // A learnable pattern: the answer repeats the prompt's first token.
            let first = rng.gen_range(3..64u32);
            let tokens: Vec<u32> = (0..len)
                .map(|i| {
                    if i >= len / 2 {
                        first
                    } else {
                        rng.gen_range(3..64)
                    }
                })
                .collect();
            let tokens = std::iter::once(first).chain(tokens).collect::<Vec<_>>();
            let n = tokens.len();
            let loss_mask = (0..n).map(|i| i > n / 2).collect();
            TokenSequence { tokens, loss_mask }
        })
        .collect()
}

fn spec() -> LoraSpec {
    // α/r = 4: a merge that forgets the scaling is off by a factor 4 on B·A.
    LoraSpec {
        rank: 2,
        alpha: 8.0,
        dropout: 0.0,
    }
}

/// Adapters with random non-zero B (fresh ones have B = 0, which would hide any merge bug).
fn random_adapters(cfg: &ModelConfig, layers: usize, seed: u64) -> ParamStore {
    let mut s = ParamStore::new();
    insert_adapters(&mut s, cfg, &spec(), "", 0..layers, seed).unwrap();
    let mut rng = StdRng::seed_from_u64(seed + 1);
    for i in 0..s.len() {
        if s.name(i).ends_with("lora_b") {
            s.value_mut(i).mapv_inplace(|_| rng.gen_range(-0.2f32..0.2));
        }
    }
    s
}

#[test]
fn merged_linear_equals_the_unmerged_lora_forward() {
    let w = tiny_weights(Arch::Qwen2, 1, 7);
    let cfg = &w.config;
    let store = random_adapters(cfg, 1, 3);
    let merged = merge_layer(&w.layers[0], &store, &spec(), "", 0).unwrap();
    let mut rng = StdRng::seed_from_u64(9);
    for t in TARGETS {
        let (na, nb) = lora_names("", 0, t);
        let (a, b) = (store.get(&na).unwrap(), store.get(&nb).unwrap());
        let (w0, w1, bias): (&Array2<f32>, &Array2<f32>, Option<&ndarray::Array1<f32>>) = match t {
            "wq" => (&w.layers[0].wq, &merged.wq, w.layers[0].bq.as_ref()),
            "wk" => (&w.layers[0].wk, &merged.wk, w.layers[0].bk.as_ref()),
            "wv" => (&w.layers[0].wv, &merged.wv, w.layers[0].bv.as_ref()),
            "wo" => (&w.layers[0].wo, &merged.wo, None),
            "w_gate" => (&w.layers[0].w_gate, &merged.w_gate, None),
            "w_up" => (&w.layers[0].w_up, &merged.w_up, None),
            _ => (&w.layers[0].w_down, &merged.w_down, None),
        };
        let k = w0.ncols();
        let x = ArrayD::from_shape_simple_fn(IxDyn(&[2, 3, k]), || rng.gen_range(-1.0f32..1.0));
        let biasd = bias.map(|b| b.clone().into_dyn());
        // Unmerged: the library's LoRA linear op, y = x Wᵀ + b + (α/r)(x Aᵀ) Bᵀ.
        let (y_lora, _) = elm::nn::lora::forward(
            &x,
            &w0.clone().into_dyn(),
            biasd.as_ref(),
            a,
            b,
            spec().scale(),
            None,
        )
        .unwrap();
        // Merged: a plain linear with W' = W + (α/r) B A.
        let y_merged =
            elm::autograd::ops::linear_forward(&x, &w1.clone().into_dyn(), biasd.as_ref()).unwrap();
        let diff = y_lora
            .iter()
            .zip(y_merged.iter())
            .map(|(p, q)| (p - q).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "{t}: merged vs unmerged differ by {diff}");
        // And the update really is there (B ≠ 0), four times B·A.
        let ba = b
            .clone()
            .into_dimensionality::<Ix2>()
            .unwrap()
            .dot(&a.clone().into_dimensionality::<Ix2>().unwrap());
        let d = w1 - w0;
        let err = (&d - &(ba * 4.0))
            .mapv(f32::abs)
            .fold(0.0f32, |m, &v| m.max(v));
        assert!(err < 1e-6 && d.iter().any(|v| v.abs() > 1e-4), "{t}");
    }
}

#[test]
fn merged_model_answer_ce_equals_unmerged_training_forward() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let w = tiny_weights(arch, 3, 7);
        let cfg = LoraConfig {
            lora: spec(),
            steps: 6,
            batch_size: 2,
            seq_len: 32,
            optim: OptimConfig {
                lr: 2e-2,
                clip: 10.0,
                ..OptimConfig::default()
            },
            checkpoint_every: 0,
            ..LoraConfig::default()
        };
        let seqs = data(6, 1);
        let mut tr = LoraTrainer::new(&w, cfg, "tiny".into()).unwrap();
        let dir = TempDir::new(&format!("merge_{arch:?}"));
        tr.run(&seqs, 0, &dir, |_| {}).unwrap();
        // Unmerged: the tape forward with adapters (dropout off).
        let unmerged = tr.eval_ce(&seqs, 0, 3).unwrap();
        // Merged: the inference path (no tape, no LoRA) over the merged weights.
        let merged = tr.merged().unwrap();
        let (mut s, mut n) = (0.0, 0);
        for ch in seqs.chunks(3) {
            let refs: Vec<&TokenSequence> = ch.iter().collect();
            let b = make_batch(&refs, 0);
            let x = embed(&merged, &b.tokens).unwrap();
            let h = run_dense_layers(&merged, x, 0..3).unwrap();
            let (ss, nn) = answer_nll_of_hidden(&merged, &h, &b).unwrap();
            s += ss;
            n += nn;
        }
        let merged_ce = s / n as f64;
        assert!(
            (merged_ce - unmerged).abs() < 1e-4 * (1.0 + unmerged.abs()),
            "{arch:?}: merged {merged_ce} vs unmerged {unmerged}"
        );
        // Training moved the model.
        let base = LoraTrainer::new(&w, tr.cfg.clone(), "tiny".into())
            .unwrap()
            .eval_ce(&seqs, 0, 3)
            .unwrap();
        assert!((base - unmerged).abs() > 1e-3, "{base} vs {unmerged}");
    }
}

#[test]
fn sft_lowers_answer_ce_and_resume_equals_uninterrupted() {
    let w = tiny_weights(Arch::Llama, 2, 7);
    let cfg = LoraConfig {
        lora: LoraSpec {
            rank: 4,
            alpha: 4.0,
            dropout: 0.05,
        },
        steps: 30,
        batch_size: 4,
        seq_len: 32,
        optim: OptimConfig {
            lr: 1e-2,
            clip: 1.0,
            ..OptimConfig::default()
        },
        seed: 5,
        checkpoint_every: 10,
    };
    let seqs = data(16, 2);
    let mut full = LoraTrainer::new(&w, cfg.clone(), "tiny".into()).unwrap();
    let before = full.eval_ce(&seqs, 0, 4).unwrap();
    let d1 = TempDir::new("full");
    full.run(&seqs, 0, &d1, |_| {}).unwrap();
    let after = full.eval_ce(&seqs, 0, 4).unwrap();
    assert!(after < before - 0.05, "CE {before} -> {after}");

    // Interrupted after 10 steps (the checkpoint), resumed, finished.
    let d2 = TempDir::new("resumed");
    let mut part = LoraTrainer::new(&w, cfg.clone(), "tiny".into()).unwrap();
    for _ in 0..10 {
        part.train_step(&seqs, 0).unwrap();
    }
    part.save(&d2).unwrap();
    let first_seconds: Vec<f64> = part.history.iter().map(|s| s.seconds).collect();
    drop(part);
    let mut resumed = LoraTrainer::resume(&w, &d2).unwrap();
    assert_eq!(resumed.step, 10);
    // The first run's step times come back with its history: a resumed run's compute counts
    // them (the report's seconds_all_runs sums every step).
    assert!(first_seconds.iter().all(|&s| s > 0.0), "{first_seconds:?}");
    let back: Vec<f64> = resumed.history.iter().map(|s| s.seconds).collect();
    for (x, y) in first_seconds.iter().zip(&back) {
        assert!((x - y).abs() <= 1e-12 * x.abs().max(1e-9), "{x} vs {y}");
    }
    resumed.run(&seqs, 0, &d2, |_| {}).unwrap();
    let a = full.adapters();
    let b = resumed.adapters();
    assert_eq!(a.names(), b.names());
    for i in 0..a.len() {
        assert_eq!(a.value(i), b.value(i), "{}", a.name(i));
    }
    // Logs of the first 10 steps went through JSON (last-digit float rounding).
    assert_eq!(full.history.len(), resumed.history.len());
    for (x, y) in full.history.iter().zip(&resumed.history) {
        assert_eq!((x.step, x.tokens), (y.step, y.tokens));
        assert!(
            (x.ce - y.ce).abs() <= 1e-12 * (1.0 + x.ce.abs()),
            "{x:?} vs {y:?}"
        );
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let w = tiny_weights(Arch::Llama, 2, 7);
    // tiny: hidden 32, kv dim 16 → rank 17 exceeds wk's smaller side.
    let big = LoraConfig {
        lora: LoraSpec {
            rank: 17,
            ..LoraSpec::default()
        },
        ..LoraConfig::default()
    };
    let e = LoraTrainer::new(&w, big, "t".into())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("rank") && e.contains("wk"), "{e}");
    let zero = LoraConfig {
        steps: 0,
        ..LoraConfig::default()
    };
    let e = LoraTrainer::new(&w, zero, "t".into())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("steps"), "{e}");
    let zr = LoraConfig {
        lora: LoraSpec {
            rank: 0,
            ..LoraSpec::default()
        },
        ..LoraConfig::default()
    };
    assert!(LoraTrainer::new(&w, zr, "t".into()).is_err());
    let e = serde_json::from_str::<LoraConfig>(r#"{"steps": 3, "rnak": 4}"#)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("rnak"), "{e}");
    // Resume from an empty directory names the missing file.
    let d = TempDir::new("empty");
    let e = LoraTrainer::resume(&w, &d).err().unwrap().to_string();
    assert!(e.contains("lora_state.json"), "{e}");
}

#[test]
fn a_batch_without_answer_tokens_passes_without_an_update() {
    let w = tiny_weights(Arch::Llama, 3, 2);
    let cfg = LoraConfig {
        lora: spec(),
        steps: 4,
        batch_size: 2,
        seq_len: 32,
        checkpoint_every: 0,
        ..LoraConfig::default()
    };
    // Every answer past the sequence: nothing to fit.
    let mut seqs = data(4, 3);
    for s in &mut seqs {
        s.loss_mask.iter_mut().for_each(|m| *m = false);
    }
    let mut tr = LoraTrainer::new(&w, cfg, "tiny".into()).unwrap();
    let before: Vec<ArrayD<f32>> = (0..tr.adapters().len())
        .map(|i| tr.adapters().value(i).clone())
        .collect();
    let log = tr.train_step(&seqs, 0).unwrap();
    assert_eq!((log.tokens, log.ce, log.grad_norm), (0, 0.0, 0.0));
    assert_eq!(tr.step, 1);
    for (i, b) in before.iter().enumerate() {
        assert_eq!(tr.adapters().value(i), b, "adapter {i} moved");
    }
}

/// The LoRA target names and the block's projections are one order: each name resolves to the
/// projection at its place, whose weight is the layer's field of that name.
#[test]
fn target_names_resolve_to_their_projection() {
    use elm::model::tape::BlockLinear;
    let w = tiny_weights(Arch::Llama, 1, 3);
    let layer = &w.layers[0];
    let fields = [
        &layer.wq,
        &layer.wk,
        &layer.wv,
        &layer.wo,
        &layer.w_gate,
        &layer.w_up,
        &layer.w_down,
    ];
    for (i, t) in TARGETS.iter().enumerate() {
        let p = target_linear(t).unwrap();
        assert_eq!(p.index(), i, "{t}");
        assert_eq!(BlockLinear::ALL[i], p);
        assert!(std::ptr::eq(p.weight(layer), fields[i]), "{t}");
    }
    assert!(target_linear("w_nope").is_err());
}
