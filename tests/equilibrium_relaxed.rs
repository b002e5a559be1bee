//! Relaxed Recursive Transformers (`elm::equilibrium::relaxed`) against references nobody tuned:
//! a window whose layers differ from their mean by low-rank matrices is rebuilt exactly by
//! loops of at least that rank (the truncated SVD is then the whole difference), so the merged
//! model is the dense model (independent transformer code) and the taped loops reproduce the
//! dense window at step 0; the adapters' algebra (orthonormal `A`, residual orthogonal to it);
//! the accounting against the stored tensors; the checkpoint and resume round trips; and the
//! refusals.

mod common;

use common::{ragged_prompts, tiny_weights, TempDir};
use elm::compress::{init_module, BlockInit};
use elm::data::TokenSequence;
use elm::equilibrium::accounting::{block_params, param_report};
use elm::equilibrium::config::TrainConfig;
use elm::equilibrium::module::{
    load_module_for, load_relaxed_for, save_module, ModuleMeta, MODULE_FORMAT,
};
use elm::equilibrium::relaxed::{loop_params, merged_model, save_loops, svd_init, LOOPS_PREFIX};
use elm::equilibrium::train::Trainer;
use elm::equilibrium::{ElmConfig, ElmModule, RelaxedLoops};
use elm::model::lora_adapter::lora_names;
use elm::model::{Arch, ModelWeights, Transformer};
use elm::train::OptimConfig;
use ndarray::{Array1, Array2, Ix2};
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::path::Path;

const START: usize = 1;
const M: usize = 3;

fn relaxed(rank: usize) -> ElmConfig {
    ElmConfig {
        injection: false,
        fixed_iterations: Some(M),
        relaxed: Some(RelaxedLoops { rank }),
        ..ElmConfig::new(START, M)
    }
}

fn rank_one(rng: &mut StdRng, rows: usize, cols: usize) -> Array2<f32> {
    let u = Array1::from_shape_fn(rows, |_| rng.gen_range(-0.3f32..0.3));
    let v = Array1::from_shape_fn(cols, |_| rng.gen_range(-0.3f32..0.3));
    let u = u.into_shape_with_order((rows, 1)).unwrap();
    let v = v.into_shape_with_order((1, cols)).unwrap();
    u.dot(&v)
}

/// A tiny model whose window layers `l + k` are layer `l` plus a rank-one matrix on each of the
/// seven linear maps, norms and biases shared: every layer's difference to the window's mean
/// then has rank at most `M`.
fn low_rank_window(arch: Arch) -> ModelWeights {
    let mut w = tiny_weights(arch, 6, 31);
    let base = w.layers[START].clone();
    let mut rng = StdRng::seed_from_u64(5);
    for k in 1..M {
        let mut layer = base.clone();
        for m in [
            &mut layer.wq,
            &mut layer.wk,
            &mut layer.wv,
            &mut layer.wo,
            &mut layer.w_gate,
            &mut layer.w_up,
            &mut layer.w_down,
        ] {
            let (r, c) = m.dim();
            *m += &rank_one(&mut rng, r, c);
        }
        w.layers[START + k] = layer;
    }
    w
}

fn max_abs(a: &Array2<f32>, b: &Array2<f32>) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn prefill(w: ModelWeights) -> Array2<f32> {
    let t = Transformer::new(w).unwrap();
    let ps = ragged_prompts();
    let mut cache = t.new_cache(ps.len(), 32).unwrap();
    t.prefill(&ps, &mut cache).unwrap()
}

fn shared_and_loops(
    w: &ModelWeights,
    ec: &ElmConfig,
) -> (ElmModule, elm::equilibrium::checkpoint::TensorMap) {
    let module = init_module(w, ec, BlockInit::Average).unwrap();
    let shared = module.block.decoder().unwrap().clone();
    let loops = svd_init(w, ec, &shared).unwrap();
    (module, loops)
}

#[test]
fn loops_of_sufficient_rank_rebuild_the_window_exactly() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let w = low_rank_window(arch);
        let ec = relaxed(M);
        let (module, loops) = shared_and_loops(&w, &ec);
        let shared = module.block.decoder().unwrap();
        // The average init is the window's mean, tensor by tensor.
        let mean = (&w.layers[1].w_up + &w.layers[2].w_up + &w.layers[3].w_up) / 3.0;
        assert!(max_abs(&shared.w_up, &mean) < 1e-6);
        let merged = merged_model(w.clone(), &ec, shared, &loops).unwrap();
        for k in 0..M {
            let d = max_abs(
                &merged.layers[START + k].w_down,
                &w.layers[START + k].w_down,
            );
            assert!(d < 1e-5, "{arch:?} loop {k}: w_down off by {d}");
        }
        // The dense transformer (its own code) on the merged model is the original model.
        let d = max_abs(&prefill(merged), &prefill(w.clone()));
        assert!(d < 1e-3, "{arch:?}: logits differ by {d}");
        // Rank 1 is not enough for a rank-3 difference: the merged model differs.
        let ec1 = relaxed(1);
        let (m1, l1) = shared_and_loops(&w, &ec1);
        let merged1 = merged_model(w.clone(), &ec1, m1.block.decoder().unwrap(), &l1).unwrap();
        assert!(max_abs(&merged1.layers[START].w_up, &w.layers[START].w_up) > 1e-3);
    }
}

#[test]
fn adapters_are_the_truncated_svd() {
    // Full-width random layers: the rank-2 adapters of each loop hold orthonormal rows in `A`
    // (the top right singular vectors) and `B = D Aᵀ`, so the residual `D − B A` is orthogonal
    // to them; and the rank-2 error is no larger than the rank-1 one (Eckart–Young's order).
    let w = tiny_weights(Arch::Llama, 6, 31);
    let (ec1, ec2) = (relaxed(1), relaxed(2));
    let (module, loops) = shared_and_loops(&w, &ec2);
    let (_, loops1) = shared_and_loops(&w, &ec1);
    let shared = module.block.decoder().unwrap();
    let get = |map: &elm::equilibrium::checkpoint::TensorMap, n: &str| {
        map[n].clone().into_dimensionality::<Ix2>().unwrap()
    };
    for k in 0..M {
        let (na, nb) = lora_names(LOOPS_PREFIX, k, "w_gate");
        let (a, b) = (get(&loops, &na), get(&loops, &nb));
        let d = &w.layers[START + k].w_gate - &shared.w_gate;
        let eye = Array2::<f32>::eye(2);
        assert!(max_abs(&a.dot(&a.t()), &eye) < 1e-4, "A Aᵀ = I");
        assert!(max_abs(&b, &d.dot(&a.t())) < 1e-4, "B = D Aᵀ");
        let residual = &d - &b.dot(&a);
        assert!(residual.dot(&a.t()).iter().all(|x| x.abs() < 1e-4));
        let (a1, b1) = (get(&loops1, &na), get(&loops1, &nb));
        let err = |r: &Array2<f32>| r.iter().map(|x| x * x).sum::<f32>();
        assert!(err(&residual) <= err(&(&d - &b1.dot(&a1))) + 1e-5);
        assert!(err(&residual) < err(&d));
    }
}

fn data() -> Vec<TokenSequence> {
    let mut rng = StdRng::seed_from_u64(2);
    (0..8)
        .map(|_| {
            let tokens: Vec<u32> = (0..10).map(|_| rng.gen_range(3..64)).collect();
            let loss_mask = (0..10).map(|i| i >= 5).collect();
            TokenSequence { tokens, loss_mask }
        })
        .collect()
}

fn train_config(steps: usize) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 4,
        seq_len: 10,
        optim: OptimConfig {
            lr: 3e-3,
            clip: 1.0,
            ..OptimConfig::default()
        },
        checkpoint_every: 0,
        ..TrainConfig::default()
    }
}

#[test]
fn taped_loops_are_the_window_at_init_and_training_moves_block_and_adapters() {
    let w = low_rank_window(Arch::Llama);
    let ec = relaxed(M);
    let (module, _) = shared_and_loops(&w, &ec);
    let mut t = Trainer::new(&w, ec.clone(), &module, train_config(4), "tiny".into()).unwrap();
    let start_loops = t.loops();
    let first = t.train_step(&data(), 0).unwrap();
    // The taped loops from the SVD init reproduce the dense window: no distillation error.
    assert!(first.distill < 1e-8, "{first:?}");
    assert!(first.grad_norm.is_finite() && first.sampled.is_none());
    for _ in 1..4 {
        t.train_step(&data(), 0).unwrap();
    }
    let trained = t.module().unwrap();
    assert_ne!(
        trained.block.decoder().unwrap().w_up,
        module.block.decoder().unwrap().w_up
    );
    let moved = t
        .loops()
        .iter()
        .any(|(n, v)| start_loops.get(n).is_some_and(|s| s != v));
    assert!(moved, "the adapters train");

    // Saved and resumed: the same block and adapters, and the next step is the same step.
    let dir = TempDir::new("relaxed-train");
    t.save(dir.path()).unwrap();
    let saved = t.loops();
    let mut resumed = Trainer::resume(&w, dir.path()).unwrap();
    assert_eq!(resumed.loops(), saved);
    let a = t.train_step(&data(), 0).unwrap();
    let b = resumed.train_step(&data(), 0).unwrap();
    assert_eq!(a.loss, b.loss);
    // The checkpoint loads as the merged dense model; only as that.
    let (m, meta, loops) = load_relaxed_for(dir.path(), &w.config, Path::new("tiny")).unwrap();
    assert_eq!(meta.elm, ec);
    assert_eq!(loops, saved);
    let _ = merged_model(w.clone(), &ec, m.block.decoder().unwrap(), &loops).unwrap();
    let e = load_module_for(dir.path(), &w.config, Path::new("tiny"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("relaxed recursive module"), "{e}");
}

#[test]
fn a_checkpoint_holds_what_the_accounting_counts() {
    let w = tiny_weights(Arch::Qwen2, 6, 31);
    let ec = relaxed(2);
    let (module, loops) = shared_and_loops(&w, &ec);
    let stored: usize = loops.values().map(|v| v.len()).sum();
    assert_eq!(stored, loop_params(&w.config, &ec));
    let p = param_report(&w.config, &ec);
    assert_eq!(p.module, module.num_params() + stored);
    assert_eq!(p.module, block_params(&w.config) + stored);
    assert_eq!(
        p.elm_total,
        p.dense_total - M * block_params(&w.config) + p.module
    );
    // Written and read back strictly; a missing adapter is named.
    let dir = TempDir::new("relaxed-ckpt");
    save_loops(dir.path(), &loops).unwrap();
    let meta = ModuleMeta {
        format: MODULE_FORMAT.into(),
        elm: ec.clone(),
        model_config: w.config.clone(),
        base_model: "tiny".into(),
        heal: None,
    };
    save_module(dir.path(), &module, &meta).unwrap();
    let (_, _, back) = load_relaxed_for(dir.path(), &w.config, Path::new("tiny")).unwrap();
    assert_eq!(back, loops);
    let mut short = loops.clone();
    let (gone, _) = lora_names(LOOPS_PREFIX, 2, "wv");
    short.remove(&gone);
    save_loops(dir.path(), &short).unwrap();
    let e = load_relaxed_for(dir.path(), &w.config, Path::new("tiny"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains(&gone) && e.contains("loops.safetensors"), "{e}");
}

#[test]
fn relaxed_layouts_that_cannot_exist_are_refused_by_name() {
    let w = tiny_weights(Arch::Llama, 6, 31);
    let cases = [
        (
            ElmConfig {
                injection: true,
                ..relaxed(2)
            },
            "injection",
        ),
        (
            ElmConfig {
                fixed_iterations: Some(2),
                ..relaxed(2)
            },
            "fixed_iterations",
        ),
        (
            ElmConfig {
                fixed_iterations: None,
                ..relaxed(2)
            },
            "fixed_iterations",
        ),
        (
            ElmConfig {
                block: elm::equilibrium::BlockKind::Ffn,
                ..relaxed(2)
            },
            "block",
        ),
        (relaxed(0), "rank"),
        (relaxed(10_000), "rank"),
    ];
    for (ec, needle) in cases {
        let e = ec.validate(&w.config).err().unwrap().to_string();
        assert!(e.contains(needle) && e.contains("relaxed"), "{needle}: {e}");
    }
    // Training options a fixed stack of adapted loops has no use for.
    let ec = relaxed(2);
    let module = init_module(&w, &ec, BlockInit::Average).unwrap();
    let bad = TrainConfig {
        heal: Some(elm::lora::LoraSpec::default()),
        ..train_config(2)
    };
    let e = Trainer::new(&w, ec, &module, bad, "tiny".into())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("heal") && e.contains("relaxed"), "{e}");
}
