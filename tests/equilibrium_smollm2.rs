//! The ELM on the real SmolLM2-135M checkpoint (kept to a few seconds): compress M = 8 layers,
//! check the accounting against the loaded arrays, train two steps, generate without error.

mod common;

use common::real_model;
use elm::data::{tokenize_example, Example, QaExample};
use elm::equilibrium::accounting::{kv_report, param_report};
use elm::equilibrium::infer::{generate_greedy, ElmModel, ElmSession, InferenceConfig, KvMode};
use elm::equilibrium::train::Trainer;
use elm::equilibrium::{ElmConfig, ElmModule, TrainConfig};
use elm::eval::gsm8k::{qa_prompt, stop_ids, QaLayout};
use elm::model::load_pretrained;
use elm::solver::{RowStatus, SolverConfig, StopCriteria};

#[path = "../examples/support/adaptive_picard.rs"]
mod adaptive_picard;

#[test]
fn smollm2_compress_train_generate() {
    let Some(path) = real_model() else { return };
    let (dense, tok) = load_pretrained(&path).unwrap();
    assert_eq!(dense.config.num_layers, 30);
    let ec = ElmConfig::new(12, 8);
    let module = ElmModule::init(&dense, &ec).unwrap();
    let rep = param_report(&dense.config, &ec);
    assert_eq!(rep.dense_total, dense.num_params());
    let removed: usize = dense.layers[12..20].iter().map(|l| l.num_params()).sum();
    assert_eq!(
        rep.elm_total,
        dense.num_params() - removed + module.num_params()
    );
    let kv = kv_report(&dense.config, &ec, 1, 1024, 8);
    assert!((kv.one_step_ratio - 23.0 / 30.0).abs() < 1e-12);

    // Two training steps on two chat-formatted GSM8K-style examples.
    let ex = [
        ("What is 3 + 4?", "3 + 4 = 7\n#### 7"),
        (
            "Tom has 5 apples and eats 2. How many are left?",
            "5 - 2 = 3\n#### 3",
        ),
    ];
    let layout = QaLayout::of(&tok);
    assert_eq!(
        layout,
        QaLayout::Chat,
        "SmolLM2-Instruct has a chat template"
    );
    let prompt = |q: &str| layout.prompt(&tok, q);
    let answer = |a: &str| layout.answer(a);
    let enc = |s: &str| tok.encode(s, false);
    let data: Vec<_> = ex
        .iter()
        .map(|(q, a)| {
            let e = Example::Qa(QaExample {
                question: q.to_string(),
                answer: a.to_string(),
            });
            tokenize_example(&e, 64, &prompt, &answer, &enc).unwrap()
        })
        .collect();
    let cfg = TrainConfig {
        steps: 2,
        batch_size: 2,
        seq_len: 64,
        ..TrainConfig::default()
    };
    let mut trainer =
        Trainer::new(&dense, ec.clone(), &module, cfg, path.display().to_string()).unwrap();
    let pad = tok.eos_id().unwrap();
    for _ in 0..2 {
        let log = trainer.train_step(&data, pad).unwrap();
        assert!(log.loss.is_finite() && log.grad_norm.is_finite(), "{log:?}");
    }
    let trained = trainer.module().unwrap();
    // The trainer holds its borrow of `dense` (its frozen weights' registration) until dropped.
    drop(trainer);
    assert_ne!(
        trained.projection, module.projection,
        "training changed the module"
    );

    // Generate a few tokens with the trained module.
    let model = ElmModel::new(dense, ec, trained).unwrap();
    let cfg = InferenceConfig {
        solver: SolverConfig::anderson(),
        stop: StopCriteria::absolute(0.5, 8),
        kv_mode: KvMode::OneStep,
        adaptive_prefill: true,
        ..InferenceConfig::default()
    };
    let ids = tok
        .encode(&qa_prompt(&tok, "What is 2 + 2?"), false)
        .unwrap();
    let mut s = ElmSession::new(&model, cfg, 1, ids.len() + 8).unwrap();
    let out = generate_greedy(&mut s, std::slice::from_ref(&ids), 4, &stop_ids(&tok)).unwrap();
    assert!(!out[0].is_empty());
    assert_eq!(
        s.kv_bytes(),
        kv_report(
            model.config(),
            model.elm_config().unwrap(),
            1,
            ids.len() + 8,
            1
        )
        .one_step
    );
    assert!(s
        .decode_stats
        .iter()
        .all(|st| st.iterations >= 2 && st.iterations <= 9));
    eprintln!("ELM output: {:?}", tok.decode(&out[0]).unwrap());
}

/// A solver written outside the library (`examples/support/adaptive_picard.rs`) decodes an ELM
/// cut from the real checkpoint through `InferenceConfig`: every token converges, and at a tight
/// tolerance the greedy tokens are Anderson's (both reach the same fixed points).
#[test]
fn a_solver_written_outside_the_library_decodes_the_real_elm() {
    let Some(path) = real_model() else { return };
    let (dense, tok) = load_pretrained(&path).unwrap();
    let ec = ElmConfig::new(12, 8);
    let module = ElmModule::init(&dense, &ec).unwrap();
    let model = ElmModel::new(dense, ec, module).unwrap();
    let prompt = tok.encode("The capital of France is", true).unwrap();
    let stop = StopCriteria::absolute(1e-3, 200);
    let mut tokens = vec![];
    for solver in [
        SolverConfig::custom(adaptive_picard::AdaptivePicard::default()),
        SolverConfig::anderson(),
    ] {
        let name = solver.name();
        let cfg = InferenceConfig::new(solver, stop.clone());
        let mut s = ElmSession::new(&model, cfg, 1, prompt.len() + 8).unwrap();
        let out = generate_greedy(&mut s, std::slice::from_ref(&prompt), 6, &[]).unwrap();
        assert_eq!(out[0].len(), 6, "{name}");
        let stats = s.prefill_stats.iter().chain(&s.decode_stats);
        for st in stats {
            assert_eq!(st.status, RowStatus::Converged, "{name}: {st:?}");
        }
        println!("{name}: {:?} {:?}", out[0], tok.decode(&out[0]).unwrap());
        tokens.push(out[0].clone());
    }
    assert_eq!(tokens[0], tokens[1]);
}
