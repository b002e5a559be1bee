//! `elm::search`: PPO-clip and advantage normalisation against a hand computation and finite
//! differences, Spearman against the textbook formula, the reward model's held-out NLL against
//! the ELM inference path, and a tiny model built so the right window is known (two identity
//! layers): GPPO's θ concentrates there, the enumeration ranks it first, and so do the metrics.
//! GPPO resume = uninterrupted; bad input is a typed error.

mod common;

use elm::compress::{BoundaryStates, Calibration};
use elm::data::TokenSequence;
use elm::equilibrium::config::ElmConfig;
use elm::equilibrium::infer::{ElmModel, InferenceConfig};
use elm::eval::{teacher_forced_nll, ScoredSequence};
use elm::model::{Arch, ModelConfig, ModelWeights};
use elm::search::candidate::{CandidateConfig, Candidates, TeacherBatch};
use elm::search::policy::{
    advantages, entropy, log_softmax, ppo_objective, softmax, PolicyState, Transition,
};
use elm::search::report::{against_truth, ranks, spearman, Placement, WhereToPrune};
use elm::search::{
    enumerate, metric_choice, where_to_prune, EnumConfig, Gppo, GppoConfig, Selector,
};
use elm::train::OptimConfig;
use rand::{rngs::StdRng, SeedableRng};

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn advantages_are_group_normalised_with_the_unbiased_std() {
    // rewards 1, 2, 3, 6: mean 3, unbiased variance (4 + 1 + 0 + 9) / 3 = 14/3.
    let a = advantages(&[1.0, 2.0, 3.0, 6.0]);
    let sd = (14.0f64 / 3.0).sqrt();
    let want = [-2.0 / sd, -1.0 / sd, 0.0, 3.0 / sd];
    for (g, w) in a.iter().zip(want) {
        assert!(close(*g, w, 1e-7), "{a:?}");
    }
    // Equal rewards: no signal.
    assert!(advantages(&[2.0, 2.0, 2.0]).iter().all(|x| x.abs() < 1e-6));
}

#[test]
fn ppo_clip_matches_a_hand_computation_and_finite_differences() {
    // θ = (ln 2, 0, 0): π = (1/2, 1/4, 1/4).
    let theta = [2f64.ln(), 0.0, 0.0];
    let p = softmax(&theta);
    assert!(close(p[0], 0.5, 1e-12) && close(p[1], 0.25, 1e-12));
    let q = 0.25f64.ln();
    // Transition 1: action 0 sampled at π_old = 1/4 → ρ = 2, clipped to 1.2 (ε = 0.2).
    // Transition 2: action 1 sampled at π_old = 1/4 → ρ = 1.
    // Transition 3: action 0 sampled at π_old = 1/4 → ρ = 2, with a negative advantage.
    let batch = [
        Transition {
            action: 0,
            reward: 0.0,
            old_logp: q,
        },
        Transition {
            action: 1,
            reward: 0.0,
            old_logp: q,
        },
        Transition {
            action: 0,
            reward: 0.0,
            old_logp: q,
        },
    ];
    let adv = [1.0, 0.5, -1.0];
    let (obj, grad) = ppo_objective(&theta, &batch, &adv, 0.2, 0.0);
    // min(2·1, 1.2·1) = 1.2; min(1·0.5, 1·0.5) = 0.5; min(2·(−1), 1.2·(−1)) = −2.
    let want = (1.2 + 0.5 - 2.0) / 3.0;
    assert!(close(obj, want, 1e-12), "{obj} vs {want}");
    // Gradient by hand: term 1 is clipped (0); term 2: A ρ (e_1 − π) = 0.5·(−1/2, 3/4, −1/4);
    // term 3: A ρ (e_0 − π) = −1·2·(1/2, −1/4, −1/4); all over 3.
    let g2 = [0.5 * -0.5, 0.5 * 0.75, 0.5 * -0.25];
    let g3 = [-2.0 * 0.5, -2.0 * -0.25, -2.0 * -0.25];
    for j in 0..3 {
        let w = (g2[j] + g3[j]) / 3.0;
        assert!(close(grad[j], w, 1e-12), "grad {grad:?}");
    }
    // Finite differences, with an entropy bonus too (away from the clip kinks).
    for beta in [0.0, 0.3] {
        let (_, g) = ppo_objective(&theta, &batch, &adv, 0.2, beta);
        for j in 0..3 {
            let h = 1e-6;
            let mut tp = theta;
            tp[j] += h;
            let mut tm = theta;
            tm[j] -= h;
            let fd = (ppo_objective(&tp, &batch, &adv, 0.2, beta).0
                - ppo_objective(&tm, &batch, &adv, 0.2, beta).0)
                / (2.0 * h);
            assert!(close(g[j], fd, 1e-6), "β {beta}, θ_{j}: {} vs {fd}", g[j]);
        }
    }
    // The entropy term is −Σ p log p.
    let h: f64 = p.iter().map(|x| -x * x.ln()).sum();
    assert!(close(entropy(&theta), h, 1e-12));
    let lp = log_softmax(&theta);
    assert!(close(lp[0], 0.5f64.ln(), 1e-12));
}

#[test]
fn ppo_update_moves_probability_to_the_better_action() {
    let mut pol = PolicyState::uniform(3);
    let lp = log_softmax(&pol.theta);
    let batch: Vec<Transition> = [(0, 1.0), (1, 0.0), (2, 0.0), (0, 1.2), (1, -0.1)]
        .iter()
        .map(|&(a, r)| Transition {
            action: a,
            reward: r,
            old_logp: lp[a],
        })
        .collect();
    pol.ppo_update(
        &batch,
        2,
        0.5,
        0.0,
        &elm::train::AdamWConfig::default(),
        0.1,
    )
    .unwrap();
    let p = softmax(&pol.theta);
    assert!(
        p[0] > 1.0 / 3.0 + 0.01 && p[0] > p[1] && p[0] > p[2],
        "{p:?}"
    );
}

#[test]
fn spearman_matches_the_textbook_formula() {
    // No ties: ρ = 1 − 6 Σ d² / (n (n² − 1)); here d = (0, 1, −1, 0) → 1 − 12/60 = 0.8.
    let r = spearman(&[1.0, 2.0, 3.0, 4.0], &[10.0, 30.0, 20.0, 40.0]).unwrap();
    assert!(close(r, 0.8, 1e-12), "{r}");
    assert!(close(
        spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]).unwrap(),
        -1.0,
        1e-12
    ));
    assert_eq!(ranks(&[5.0, 1.0, 5.0]), vec![2.5, 1.0, 2.5]);
    assert!(spearman(&[1.0, 1.0], &[1.0, 2.0]).is_none());
}

/// A report over four starts whose policy, enumeration and choice are known, against a
/// ground truth where start 1 is best and start 3 worst.
fn report_with(probs: Vec<f64>, choice: usize) -> WhereToPrune {
    WhereToPrune {
        num_layers: 6,
        num_replaced: 2,
        enum_ranking: vec![1, 3],
        enum_nll: vec![(1, 2.0), (3, 5.0)],
        enum_nll_interval: vec![None, None],
        dense_nll: 1.0,
        gppo: Some(Placement {
            method: "gppo".into(),
            choice,
            choice_on_grid: choice,
            enum_rank: 1,
            nll_gap: 0.0,
        }),
        gppo_spearman: None,
        gppo_probs: Some(probs),
        metrics: vec![],
    }
}

#[test]
fn a_selector_is_read_against_the_fully_trained_starts() {
    let truth = [(0, 3.0), (1, 1.0), (2, 2.0), (3, 4.0)];
    // A policy ordered as the truth (most mass on the best start): ρ = 1; the enumeration
    // agrees on its two starts; the choice is the best start, so no start beats it.
    let good = against_truth(&report_with(vec![0.2, 0.4, 0.3, 0.1], 1), &truth).unwrap();
    assert!(close(good.policy_spearman.unwrap(), 1.0, 1e-12));
    assert!(close(good.proxy_spearman.unwrap(), 1.0, 1e-12));
    assert_eq!(good.share_better_than_choice, Some(0.0));
    assert!(close(good.random_nll, 2.5, 1e-12));
    assert_eq!(good.uniform, 0.25);
    // The uniform policy: entropy ratio exactly 1 and no rank correlation (constant); a
    // choice of the worst start has three of four starts better.
    let flat = against_truth(&report_with(vec![0.25; 4], 3), &truth).unwrap();
    assert!(close(flat.policy_entropy_ratio.unwrap(), 1.0, 1e-12));
    assert!(flat.policy_spearman.is_none());
    assert_eq!(flat.share_better_than_choice, Some(0.75));
    assert_eq!(flat.choice_nll, Some(4.0));
    // Entropy of (0.2, 0.4, 0.3, 0.1) over ln 4, by hand.
    let h = -(0.2f64 * 0.2f64.ln() + 0.4 * 0.4f64.ln() + 0.3 * 0.3f64.ln() + 0.1 * 0.1f64.ln());
    assert!(close(
        good.policy_entropy_ratio.unwrap(),
        h / 4f64.ln(),
        1e-12
    ));
    assert!(against_truth(&report_with(vec![0.25; 4], 3), &[]).is_none());
}

/// A model whose layers `[2, 4)` are identities (zero attention and MLP outputs) and whose
/// other layers are amplified, so that replacing any other window costs something: the right
/// window (start 2, M = 2) is known by construction.
fn identity_window_model() -> ModelWeights {
    let mut cfg = ModelConfig::tiny(Arch::Llama);
    cfg.num_layers = 6;
    let mut w = ModelWeights::random(&cfg, 3);
    for l in &mut w.layers {
        l.wo *= 3.0;
        l.w_down *= 3.0;
    }
    for l in 2..4 {
        w.layers[l].wo.fill(0.0);
        w.layers[l].w_down.fill(0.0);
    }
    w
}

/// Text sampled from the model itself, so the dense model is what the CE measures.
fn sampled_text(w: &ModelWeights, n: usize, len: usize, seed: u64) -> Vec<Vec<u32>> {
    let dense = elm::model::Transformer::new(w.clone()).unwrap();
    let prompts: Vec<Vec<u32>> = (0..n).map(|i| vec![3 + (i as u32 * 7) % 60]).collect();
    let sampling = elm::model::generate::SamplingConfig {
        max_new_tokens: len - 1,
        temperature: 1.0,
        seed,
        ..Default::default()
    };
    let g = elm::model::generate::generate(&dense, &prompts, &sampling, None, |_, _| {}).unwrap();
    prompts
        .iter()
        .zip(&g.tokens)
        .map(|(p, t)| {
            let mut s = p.clone();
            s.extend(t);
            s
        })
        .collect()
}

fn sequences(texts: &[Vec<u32>]) -> Vec<TokenSequence> {
    texts
        .iter()
        .map(|t| TokenSequence {
            tokens: t.clone(),
            loss_mask: (0..t.len()).map(|i| i >= 4).collect(),
        })
        .collect()
}

fn cand_cfg() -> CandidateConfig {
    CandidateConfig {
        lora: elm::lora::LoraSpec {
            rank: 4,
            alpha: 4.0,
            dropout: 0.0,
        },
        batch_size: 2,
        seq_len: 32,
        optim: OptimConfig {
            lr: 3e-3,
            clip: 1.0,
            warmup_frac: 0.0,
            ..elm::search::candidate::candidate_optim()
        },
        ..CandidateConfig::new(2)
    }
}

#[test]
fn candidate_heldout_nll_equals_the_elm_inference_path() {
    let w = identity_window_model();
    let texts = sampled_text(&w, 4, 16, 1);
    let seqs = sequences(&texts);
    let mut c = Candidates::new(&w, cand_cfg(), &[1]).unwrap();
    // Train a few steps so the LoRA (merged with α/r) and the projection are not at init.
    let mut rng = StdRng::seed_from_u64(0);
    let refs: Vec<&TokenSequence> = seqs.iter().collect();
    let tb = TeacherBatch::new(&w, &refs, 0, None).unwrap();
    for _ in 0..5 {
        c.train_step(1, &tb, 1e-2, &mut rng).unwrap();
    }
    let (sum, count) = c.heldout_nll(1, &[tb]).unwrap();
    // Reference: the candidate as an ELM with exactly M iterations, scored by eval's
    // teacher-forced NLL (its own session, solver and head).
    let ec = ElmConfig {
        fixed_iterations: Some(2),
        ..ElmConfig::new(1, 2)
    };
    let model = ElmModel::new(w.clone(), ec, c.module(1).unwrap()).unwrap();
    let scored: Vec<ScoredSequence> = seqs
        .iter()
        .enumerate()
        .map(|(i, s)| ScoredSequence {
            id: i.to_string(),
            tokens: s.tokens.clone(),
            first_scored: 4,
        })
        .collect();
    let run = teacher_forced_nll(&model, &InferenceConfig::default(), &scored, 2, |_| {}).unwrap();
    let (rs, rc) = run
        .items
        .iter()
        .fold((0.0, 0.0), |(s, c), i| (s + i.value, c + i.weight));
    assert_eq!(count as f64, rc);
    assert!(close(sum, rs, 1e-4), "candidate {sum} vs ELM path {rs}");
}

#[test]
fn gppo_and_enumeration_find_the_identity_window() {
    let w = identity_window_model();
    let texts = sampled_text(&w, 24, 24, 2);
    let seqs = sequences(&texts[..16]);
    let held = sequences(&texts[16..]);

    // Enumeration: every start, same short budget, ranked by held-out answer NLL.
    let ecfg = EnumConfig {
        candidate: cand_cfg(),
        steps: 6,
        every: 1,
    };
    let e = enumerate(&w, &ecfg, &seqs, &held, 0, None, |_, _| {}, |_| {}).unwrap();
    println!("enumeration {:?}", e.entries);
    assert_eq!(e.entries.len(), 5);
    assert_eq!(e.ranking()[0], 2, "{:?}", e.entries);
    // Each start's interval over the held-out problems brackets its NLL.
    for en in &e.entries {
        let (lo, hi) = en.nll_interval.expect("recorded");
        assert!(lo <= en.nll && en.nll <= hi && lo < hi, "{en:?}");
    }

    // GPPO from a uniform policy.
    let mut gcfg = GppoConfig {
        candidate: cand_cfg(),
        steps: 80,
        update_every: 8,
        ppo_epochs: 4,
        clip_eps: 0.5,
        entropy_coef: 0.0,
        policy_lr: 0.3,
        policy_optim: elm::train::AdamWConfig::default(),
        checkpoint_every: 0,
    };
    gcfg.candidate.seed = 4;
    let tmp = common::TempDir::new("gppo-known");
    let dir = tmp.join("run");
    let mut g = Gppo::new(&w, gcfg, "tiny".into()).unwrap();
    let out = g.run(&seqs, 0, &dir, |_| {}).unwrap();
    println!(
        "θ {:?}\nπ {:?}\ncounts {:?}",
        out.theta, out.probs, out.action_counts
    );
    assert_eq!(out.chosen_start, 2, "{:?}", out.probs);
    assert!(
        out.probs[2] > 0.5,
        "π concentrates on the identity window: {:?}",
        out.probs
    );
    assert_eq!(out.trace.len(), 10);

    // The metric selectors see the identity window too; the report places every choice.
    let calib = Calibration::from_token_stream(texts.clone(), None, 24, 24 * 24).unwrap();
    let states = BoundaryStates::collect(&w, &calib, 4).unwrap();
    let metrics: Vec<_> = Selector::ALL
        .into_iter()
        .map(|s| metric_choice(&w, &calib, &states, s, 2, 4).unwrap())
        .collect();
    for m in &metrics {
        assert_eq!(m.choice, 2, "{:?}: {:?}", m.method, m.scores);
    }
    let r = where_to_prune(&e, Some(&out), &metrics).unwrap();
    assert_eq!(r.gppo.as_ref().unwrap().enum_rank, 1);
    assert!(r.metrics.iter().all(|p| p.enum_rank == 1));
    assert!(r.gppo_spearman.is_some());
}

#[test]
fn gppo_resume_equals_uninterrupted() {
    let w = identity_window_model();
    let texts = sampled_text(&w, 8, 16, 3);
    let seqs = sequences(&texts);
    let cfg = GppoConfig {
        candidate: CandidateConfig {
            lora: elm::lora::LoraSpec {
                rank: 2,
                alpha: 4.0,
                dropout: 0.1,
            },
            ..cand_cfg()
        },
        steps: 12,
        update_every: 3,
        ppo_epochs: 2,
        clip_eps: 0.2,
        entropy_coef: 0.01,
        policy_lr: 0.1,
        policy_optim: elm::train::AdamWConfig::default(),
        checkpoint_every: 0,
    };
    let tmp = common::TempDir::new("gppo-resume");
    let (d1, d2) = (tmp.join("full"), tmp.join("part"));
    let mut full = Gppo::new(&w, cfg.clone(), "t".into()).unwrap();
    let a = full.run(&seqs, 0, &d1, |_| {}).unwrap();
    // Interrupted after 7 steps (a partial PPO buffer pending), resumed.
    let mut part = Gppo::new(&w, cfg, "t".into()).unwrap();
    for _ in 0..7 {
        part.train_step(&seqs, 0).unwrap();
    }
    part.save(&d2).unwrap();
    assert_eq!(part.buffer.len(), 1);
    drop(part);
    let mut resumed = Gppo::resume(&w, &d2).unwrap();
    let b = resumed.run(&seqs, 0, &d2, |_| {}).unwrap();
    assert_eq!(a.action_counts, b.action_counts);
    for (x, y) in a.theta.iter().zip(&b.theta) {
        assert!(close(*x, *y, 1e-12), "{:?} vs {:?}", a.theta, b.theta);
    }
    for i in 0..full.cands.store.len() {
        assert_eq!(full.cands.store.value(i), resumed.cands.store.value(i));
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let w = identity_window_model();
    let n = w.config.num_layers;
    let msg = |c: GppoConfig| Gppo::new(&w, c, "t".into()).err().unwrap().to_string();
    let base = GppoConfig {
        candidate: cand_cfg(),
        ..GppoConfig::new(2, 10)
    };
    let mut c = base.clone();
    c.candidate.num_replaced = n;
    assert!(msg(c).contains("num_replaced"));
    let mut c = base.clone();
    c.steps = 0;
    assert!(msg(c).contains("steps"));
    let mut c = base.clone();
    c.update_every = 0;
    assert!(msg(c).contains("update_every"));
    let mut c = base.clone();
    c.ppo_epochs = 0;
    assert!(msg(c).contains("ppo_epochs"));
    let mut c = base.clone();
    c.candidate.lora.rank = 64;
    assert!(msg(c).contains("rank"));
    let mut c = base.clone();
    c.clip_eps = 0.0;
    assert!(msg(c).contains("clip_eps"));
    let e = EnumConfig {
        candidate: cand_cfg(),
        steps: 0,
        every: 1,
    };
    assert!(e.validate(&w.config).is_err());
    assert!(serde_json::from_str::<GppoConfig>(
        r#"{"candidate": {"num_replaced": 2}, "steps": 3, "update_evry": 2}"#
    )
    .is_err());
    assert!(Candidates::new(&w, cand_cfg(), &[5]).is_err());
}

#[test]
fn report_places_off_grid_choices_on_the_best_enumerated_start() {
    use elm::search::enumerate::{EnumEntry, Enumeration};
    use elm::search::report::MetricChoice;
    // Enumerated every 2nd start of 5 (0, 2, 4); NLL makes 4 best, then 0, then 2.
    let entry = |start, nll| EnumEntry {
        start,
        nll,
        nll_interval: None,
        nll_init: nll,
        train_ce_last: nll,
        seconds: 0.0,
    };
    let e = Enumeration {
        config: EnumConfig {
            candidate: cand_cfg(),
            steps: 1,
            every: 2,
        },
        num_layers: 6,
        held_out_examples: 1,
        held_out_tokens: 1,
        dense_nll: 0.5,
        entries: vec![entry(0, 1.2), entry(2, 1.5), entry(4, 1.0)],
    };
    assert_eq!(e.ranking(), vec![4, 0, 2]);
    // A lower-is-better metric whose best start (1) was not enumerated: on the grid its best
    // is 2 (score 0.2 < 0.3 at 0, 0.9 at 4), which ranks 3rd, 0.5 nats behind the best.
    let mc = MetricChoice {
        method: Selector::Bi,
        scores: vec![0.3, 0.1, 0.2, 0.8, 0.9],
        lower_is_better: true,
        choice: 1,
    };
    let r = where_to_prune(&e, None, &[mc]).unwrap();
    let p = &r.metrics[0];
    assert_eq!((p.choice, p.choice_on_grid, p.enum_rank), (1, 2, 3));
    assert!(close(p.nll_gap, 0.5, 1e-12));
    assert!(r.gppo.is_none() && r.gppo_spearman.is_none());
}

/// A resumed GPPO run reads θ, Adam's moments and the buffered rewards back from JSON: every
/// f64 must come back bit for bit, or the resumed run drifts from the uninterrupted one
/// (serde_json's default float parser can be off by one ulp; `float_roundtrip` is exact).
#[test]
fn policy_state_json_round_trip_keeps_every_bit() {
    use rand::Rng;
    let dir = common::TempDir::new("policy_json");
    let mut rng = StdRng::seed_from_u64(5);
    let mut draw = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                let x: f64 = rng.gen_range(-1.0..1.0);
                x * 10f64.powi(rng.gen_range(-12..12))
            })
            .collect()
    };
    let state = PolicyState {
        theta: draw(4000),
        m: draw(4000),
        v: draw(4000).into_iter().map(f64::abs).collect(),
        t: 7,
    };
    let path = dir.path().join("policy.json");
    elm::io::atomic::write_json_atomic(&path, &state).unwrap();
    let back: PolicyState = elm::io::read_json(&path).unwrap();
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (name, a, b) in [
        ("theta", &state.theta, &back.theta),
        ("m", &state.m, &back.m),
        ("v", &state.v, &back.v),
    ] {
        let differ = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            bits(a),
            bits(b),
            "{name}: {differ} of {} values changed",
            a.len()
        );
    }
}

/// Every selector round-trips through its name (`FromStr`, `Display`) and JSON, and every
/// `elm search --method` through its name, iterating the library's lists.
#[test]
fn every_selector_and_search_method_round_trips_through_its_name() {
    use elm::registry::Registry;
    use elm::search::{SearchMethod, Selector};
    for s in Selector::ALL {
        assert_eq!(s.name().parse::<Selector>().unwrap(), s);
        assert_eq!(s.to_string(), s.name());
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, format!("\"{}\"", s.name()));
        assert_eq!(serde_json::from_str::<Selector>(&json).unwrap(), s);
    }
    for m in SearchMethod::all() {
        assert_eq!(m.name().parse::<SearchMethod>().unwrap(), *m);
    }
    for s in Selector::ALL {
        assert!(SearchMethod::all().contains(&SearchMethod::Metric(s)));
    }
    let names = SearchMethod::names();
    let unique: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(unique.len(), names.len());
    let e = "nope".parse::<SearchMethod>().unwrap_err().to_string();
    assert!(
        e.contains("(gppo | enumerate | report | cosine | bi | angular | ppl)"),
        "{e}"
    );
}
