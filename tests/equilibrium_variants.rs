//! The module's variants on the one ELM path — no injection (`u = z` from `z⁰ = h`) and a fixed
//! number of applications — against independent dense references: LLM-Streamline's replacement
//! layer (one application, no injection) is the dense model without the rest of the window, and a
//! looped layer (K applications, multi-step KV) is the dense model with that layer repeated K times.

mod common;

use common::{ragged_prompts, tiny_weights, TempDir};
use elm::compress::methods::delete_layers;
use elm::data::TokenSequence;
use elm::equilibrium::accounting::{
    block_params, ffn_params, kv_report, layer_kv_bytes, module_params, param_report,
};
use elm::equilibrium::config::TrainConfig;
use elm::equilibrium::infer::{generate_greedy, ElmModel, ElmSession, InferenceConfig, KvMode};
use elm::equilibrium::module::{load_module, save_module, ModuleMeta, MODULE_FORMAT};
use elm::equilibrium::train::Trainer;
use elm::equilibrium::{BlockKind, ElmConfig, ElmModule, ModuleBlock};
use elm::grad::{DeqConfig, GradientRule};
use elm::model::generate::{generate, SamplingConfig};
use elm::model::{Arch, LayerWeights, ModelConfig, ModelWeights, Transformer};
use elm::solver::SolverConfig;
use elm::train::OptimConfig;
use ndarray::Array2;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn variant(w: &ModelWeights, injection: bool, k: usize) -> ElmModel {
    variant_of(w, injection, k, BlockKind::Decoder)
}

fn variant_of(w: &ModelWeights, injection: bool, k: usize, block: BlockKind) -> ElmModel {
    let ec = ElmConfig {
        injection,
        fixed_iterations: Some(k),
        block,
        ..ElmConfig::new(1, 3)
    };
    let module = ElmModule::init(w, &ec).unwrap();
    ElmModel::new(w.clone(), ec, module).unwrap()
}

/// `module` saved as a checkpoint in a fresh temp dir named after `what` (removed on drop).
fn saved(
    module: &ElmModule,
    ec: &ElmConfig,
    cfg: &ModelConfig,
    what: &str,
) -> (TempDir, ModuleMeta) {
    let dir = TempDir::new(&format!("{what}-ckpt"));
    let meta = ModuleMeta {
        format: MODULE_FORMAT.into(),
        elm: ec.clone(),
        model_config: cfg.clone(),
        base_model: "tiny".into(),
        heal: None,
    };
    save_module(&dir, module, &meta).unwrap();
    (dir, meta)
}

fn max_abs(a: &Array2<f32>, b: &Array2<f32>) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Prefill logits and 5 greedy tokens of `model` vs the dense reference `reference`.
fn assert_same_as_dense(model: &ElmModel, reference: ModelWeights, mode: KvMode, what: &str) {
    let ps = ragged_prompts();
    let cfg = InferenceConfig {
        solver: SolverConfig::picard(),
        kv_mode: mode,
        ..InferenceConfig::default()
    };
    let dense = Transformer::new(reference).unwrap();
    let mut cache = dense.new_cache(ps.len(), 32).unwrap();
    let want = dense.prefill(&ps, &mut cache).unwrap();
    let mut s = ElmSession::new(model, cfg.clone(), ps.len(), 32).unwrap();
    let got = s.prefill(&ps).unwrap();
    let d = max_abs(&got, &want);
    assert!(d < 1e-4, "{what}: prefill logits differ by {d}");
    let mut s = ElmSession::new(model, cfg, ps.len(), 32).unwrap();
    let ours = generate_greedy(&mut s, &ps, 5, &[]).unwrap();
    let sampling = SamplingConfig {
        max_new_tokens: 5,
        ..SamplingConfig::default()
    };
    let theirs = generate(&dense, &ps, &sampling, None, |_, _| {}).unwrap();
    assert_eq!(ours, theirs.tokens, "{what}: greedy continuations");
}

#[test]
fn streamline_layer_is_the_dense_model_without_the_rest_of_the_window() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let w = tiny_weights(arch, 6, 31);
        let reference = delete_layers(&w, &[2, 3]).unwrap();
        for mode in [KvMode::OneStep, KvMode::MultiStep] {
            assert_same_as_dense(
                &variant(&w, false, 1),
                reference.clone(),
                mode,
                "streamline",
            );
            // ELM's own one-iteration ablation at init: f(W_h·h + b) with W_h = I, b = 0.
            assert_same_as_dense(&variant(&w, true, 1), reference.clone(), mode, "elm k=1");
        }
    }
}

/// Layer `l` of `w` with its attention output projection zeroed: the decoder layer then adds
/// only its MLP branch, `x + MLP(RMSNorm(x))`, which is what a feed-forward-only block is.
fn mlp_only(w: &ModelWeights, l: usize) -> LayerWeights {
    let mut layer = w.layers[l].clone();
    layer.wo.fill(0.0);
    layer
}

#[test]
fn streamline_ffn_is_the_dense_model_with_the_first_layers_mlp_alone() {
    // Reference: the dense transformer (independent code) with the rest of the window deleted
    // and layer 1's attention silenced; the ELM side runs the attention-free block kernel.
    for arch in [Arch::Llama, Arch::Qwen2] {
        let w = tiny_weights(arch, 6, 31);
        let mut reference = delete_layers(&w, &[2, 3]).unwrap();
        reference.layers[1] = mlp_only(&w, 1);
        let ffn = variant_of(&w, false, 1, BlockKind::Ffn);
        for mode in [KvMode::OneStep, KvMode::MultiStep] {
            assert_same_as_dense(&ffn, reference.clone(), mode, "streamline ffn");
        }
        // Looped three times: the MLP half repeated.
        let mut looped = w.clone();
        looped.layers = vec![
            w.layers[0].clone(),
            mlp_only(&w, 1),
            mlp_only(&w, 1),
            mlp_only(&w, 1),
            w.layers[4].clone(),
            w.layers[5].clone(),
        ];
        let ffn3 = variant_of(&w, false, 3, BlockKind::Ffn);
        assert_same_as_dense(&ffn3, looped, KvMode::MultiStep, "looped ffn");
    }
}

#[test]
fn ffn_module_holds_no_kv_and_counts_only_its_mlp() {
    let w = tiny_weights(Arch::Qwen2, 6, 31);
    let cfg = &w.config;
    let model = variant_of(&w, true, 2, BlockKind::Ffn);
    let (ec, module) = (
        model.elm_config().unwrap(),
        model.f32_weights().unwrap().1.unwrap(),
    );
    let (c, i) = (cfg.hidden_size, cfg.intermediate_size);
    let mlp = c + 3 * c * i;
    assert_eq!(ffn_params(cfg), mlp);
    assert_eq!(module.num_params(), mlp + 2 * c * c + c);
    assert_eq!(param_report(cfg, ec).module, module.num_params());
    // The session allocates K/V for the kept layers only, as the report says, in both modes.
    for (mode, iterations) in [(KvMode::OneStep, 1), (KvMode::MultiStep, 2)] {
        let icfg = InferenceConfig {
            kv_mode: mode,
            ..InferenceConfig::default()
        };
        let mut s = ElmSession::new(&model, icfg, 2, 16).unwrap();
        s.prefill(&[vec![5, 6, 7], vec![8, 9]]).unwrap();
        let rep = kv_report(cfg, ec, 2, 16, iterations);
        assert_eq!(s.kv_bytes(), rep.one_step, "{mode:?}");
        assert_eq!(rep.one_step, rep.multi_step);
        assert_eq!(
            rep.one_step,
            (cfg.num_layers - 3) * layer_kv_bytes(cfg, 2, 16)
        );
        // Positions still advance (the capacity check holds for every block).
        assert_eq!(s.lens(), vec![3, 2]);
    }
    // Checkpoint: only the MLP tensors, and elm.json names the kind.
    let (dir, meta) = saved(module, ec, cfg, "ffn");
    let json = std::fs::read_to_string(dir.join("elm.json")).unwrap();
    assert!(json.contains("\"block\": \"ffn\""), "{json}");
    let (back, meta_back) = load_module(&dir).unwrap();
    assert_eq!(meta_back, meta);
    let (f, g) = (back.block.ffn().unwrap(), module.block.ffn().unwrap());
    assert_eq!(
        (&f.w_gate, &f.w_up, &f.w_down),
        (&g.w_gate, &g.w_up, &g.w_down)
    );
    // The same tensors read as a decoder module: refused, naming the first missing tensor.
    let mut wrong = meta.clone();
    wrong.elm.block = BlockKind::Decoder;
    elm::io::write_json_atomic(&dir.join("elm.json"), &wrong).unwrap();
    let e = load_module(&dir).unwrap_err().to_string();
    assert!(e.contains("block.attn_norm"), "{e}");
    // An unknown kind in elm.json is a config error naming the field.
    let bad = json.replace("\"ffn\"", "\"mlp\"");
    std::fs::write(dir.join("elm.json"), bad).unwrap();
    let e = load_module(&dir).unwrap_err().to_string();
    assert!(e.contains("mlp"), "{e}");
    assert!("attention".parse::<BlockKind>().is_err());
}

#[test]
fn looped_layer_is_the_layer_repeated() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let w = tiny_weights(arch, 6, 31);
        let mut reference = w.clone();
        // Layers 0, 1, 1, 1, 4, 5: the window [1, 4) becomes layer 1 applied three times.
        reference.layers = vec![
            w.layers[0].clone(),
            w.layers[1].clone(),
            w.layers[1].clone(),
            w.layers[1].clone(),
            w.layers[4].clone(),
            w.layers[5].clone(),
        ];
        // One K/V cache per application, as the repeated layers have.
        assert_same_as_dense(
            &variant(&w, false, 3),
            reference,
            KvMode::MultiStep,
            "looped",
        );
    }
}

#[test]
fn variants_count_their_parameters_and_round_trip_checkpoints() {
    let w = tiny_weights(Arch::Qwen2, 6, 31);
    let cfg = &w.config;
    let looped = variant(&w, false, 2);
    let (ec, module) = (
        looped.elm_config().unwrap(),
        looped.f32_weights().unwrap().1.unwrap(),
    );
    assert!(module.projection.is_none());
    assert_eq!(module.num_params(), block_params(cfg));
    assert_eq!(
        module_params(cfg, false, BlockKind::Decoder),
        block_params(cfg)
    );
    let report = param_report(cfg, ec);
    assert_eq!(report.module, block_params(cfg));
    assert_eq!(report.dense_total - report.elm_total, 2 * block_params(cfg));
    let (dir, meta) = saved(module, ec, cfg, "variant");
    let (back, meta_back) = load_module(&dir).unwrap();
    assert_eq!(meta_back, meta);
    assert!(back.projection.is_none());
    assert_eq!(
        back.block.decoder().unwrap().wq,
        module.block.decoder().unwrap().wq
    );
    // A checkpoint whose elm.json says "injection" but lacks P is rejected, naming the tensor.
    let mut wrong = meta.clone();
    wrong.elm.injection = true;
    elm::io::write_json_atomic(&dir.join("elm.json"), &wrong).unwrap();
    let e = load_module(&dir).unwrap_err().to_string();
    assert!(e.contains("p.w_z"), "{e}");
    assert!(ElmConfig {
        fixed_iterations: Some(0),
        ..ElmConfig::new(1, 2)
    }
    .validate(cfg)
    .is_err());
}

#[test]
fn fixed_iteration_variants_train_by_unrolling() {
    let w = tiny_weights(Arch::Llama, 6, 31);
    let mut rng = StdRng::seed_from_u64(2);
    let data: Vec<TokenSequence> = (0..8)
        .map(|_| {
            let tokens: Vec<u32> = (0..10).map(|_| rng.gen_range(3..64)).collect();
            let loss_mask = (0..10).map(|i| i >= 5).collect();
            TokenSequence { tokens, loss_mask }
        })
        .collect();
    let cfg = TrainConfig {
        steps: 4,
        batch_size: 4,
        seq_len: 10,
        optim: OptimConfig {
            lr: 3e-3,
            clip: 1.0,
            ..OptimConfig::default()
        },
        ..TrainConfig::default()
    };
    let cases = [
        (false, BlockKind::Decoder),
        (true, BlockKind::Decoder),
        (false, BlockKind::Ffn),
    ];
    for (injection, block) in cases {
        let ec = ElmConfig {
            injection,
            fixed_iterations: Some(2),
            block,
            ..ElmConfig::new(1, 3)
        };
        let module = ElmModule::init(&w, &ec).unwrap();
        let mut t = Trainer::new(&w, ec.clone(), &module, cfg.clone(), "tiny".into()).unwrap();
        let first = t.train_step(&data, 0).unwrap();
        assert!(first.loss.is_finite() && first.grad_norm > 0.0, "{first:?}");
        assert_eq!(first.sampled, None, "unrolled, not sampled");
        for _ in 1..4 {
            t.train_step(&data, 0).unwrap();
        }
        let trained = t.module().unwrap();
        let w_up = |m: &ElmModule| match &m.block {
            ModuleBlock::Decoder(b) => b.w_up.clone(),
            ModuleBlock::Ffn(f) => f.w_up.clone(),
        };
        assert_ne!(w_up(&trained), w_up(&module), "{block:?}");
        assert_eq!(trained.block.kind(), block);
        assert_eq!(trained.projection.is_some(), injection);
        // Another rule contradicts a fixed number of applications.
        let bad = TrainConfig {
            deq: Some(DeqConfig::new(GradientRule::Jfb)),
            ..cfg.clone()
        };
        let e = Trainer::new(&w, ec, &module, bad, "tiny".into())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("fixed_iterations"), "{e}");
    }
}

/// Prefill logits of `model` on the ragged prompts (Picard, one-step KV, δ = 0.5 at most 16).
fn prefill_logits(model: &ElmModel) -> Array2<f32> {
    let ps = ragged_prompts();
    let cfg = InferenceConfig {
        solver: SolverConfig::picard(),
        ..InferenceConfig::default()
    };
    let mut s = ElmSession::new(model, cfg, ps.len(), 32).unwrap();
    s.prefill(&ps).unwrap()
}

#[test]
fn a_module_runs_at_any_test_depth_whatever_it_was_trained_with() {
    use elm::equilibrium::inference_config::Depth;
    let w = tiny_weights(Arch::Llama, 5, 41);
    // The same initial module (its init does not read the depth), built at K = 2 and at K = 5
    // run at depth 2: the same map applied twice, the same logits.
    let at_two = prefill_logits(&variant(&w, true, 2));
    let five_at_two = variant(&w, true, 5).with_depth(Depth::Fixed(2)).unwrap();
    assert_eq!(max_abs(&at_two, &prefill_logits(&five_at_two)), 0.0);
    // A fixed loop solved is the ELM of the same module; an ELM looped K times is the loop.
    let solved_elm = {
        let ec = ElmConfig::new(1, 3);
        let module = ElmModule::init(&w, &ec).unwrap();
        ElmModel::new(w.clone(), ec, module).unwrap()
    };
    let loop_solved = variant(&w, true, 3).with_depth(Depth::Solved).unwrap();
    assert_eq!(
        max_abs(&prefill_logits(&solved_elm), &prefill_logits(&loop_solved)),
        0.0
    );
    let elm_looped = {
        let ec = ElmConfig::new(1, 3);
        let module = ElmModule::init(&w, &ec).unwrap();
        ElmModel::new(w.clone(), ec, module)
            .unwrap()
            .with_depth(Depth::Fixed(2))
            .unwrap()
    };
    assert_eq!(max_abs(&at_two, &prefill_logits(&elm_looped)), 0.0);
    // As trained changes nothing; a model without a module has no depth to set.
    let same = variant(&w, true, 2).with_depth(Depth::AsTrained).unwrap();
    assert_eq!(max_abs(&at_two, &prefill_logits(&same)), 0.0);
    let e = ElmModel::dense(w.clone())
        .with_depth(Depth::Fixed(3))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("depth") && e.contains("no fixed-point module"),
        "{e}"
    );
    // The command-line form: trained, solved, or a count of at least one.
    assert_eq!("trained".parse::<Depth>().unwrap(), Depth::AsTrained);
    assert_eq!("solved".parse::<Depth>().unwrap(), Depth::Solved);
    assert_eq!("8".parse::<Depth>().unwrap(), Depth::Fixed(8));
    for bad in ["0", "-1", "deep", ""] {
        let e = bad.parse::<Depth>().unwrap_err().to_string();
        assert!(e.contains("depth"), "{bad}: {e}");
    }
}

#[test]
fn the_starting_state_is_the_modules_unless_asked_otherwise() {
    use elm::equilibrium::inference_config::{Depth, InitialState};
    let w = tiny_weights(Arch::Llama, 5, 43);
    let logits = |model: &ElmModel, z0: InitialState| {
        let ps = ragged_prompts();
        let cfg = InferenceConfig {
            solver: SolverConfig::picard(),
            z0,
            ..InferenceConfig::default()
        };
        let mut s = ElmSession::new(model, cfg, ps.len(), 32).unwrap();
        s.prefill(&ps).unwrap()
    };
    // With injection the module starts at 0; without, at h: `module` is exactly that start.
    let one_step = variant(&w, true, 1);
    assert_eq!(
        max_abs(
            &logits(&one_step, InitialState::Module),
            &logits(&one_step, InitialState::Zero)
        ),
        0.0
    );
    let looped = variant(&w, false, 2);
    assert_eq!(
        max_abs(
            &logits(&looped, InitialState::Module),
            &logits(&looped, InitialState::Input)
        ),
        0.0
    );
    // One application from another start lands elsewhere; the random start is seeded.
    let one = variant(&w, true, 3).with_depth(Depth::Fixed(1)).unwrap();
    let (zero, input) = (
        logits(&one, InitialState::Zero),
        logits(&one, InitialState::Input),
    );
    assert!(max_abs(&zero, &input) > 1e-4);
    let (r1, r2) = (
        logits(&one, InitialState::Random),
        logits(&one, InitialState::Random),
    );
    assert_eq!(max_abs(&r1, &r2), 0.0);
    assert!(max_abs(&zero, &r1) > 1e-4);
    assert!("sideways".parse::<InitialState>().is_err());
}
