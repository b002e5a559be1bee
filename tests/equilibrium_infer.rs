//! ELM inference on tiny random models: init reproduces layer l, converged one-step ==
//! multi-step == full recompute, batched == unbatched, exact KV bytes, parameter counts.

mod common;

use common::tiny_weights;
use elm::equilibrium::accounting::{kv_report, layer_kv_bytes, param_report};
use elm::equilibrium::infer::{
    generate_greedy, generate_greedy_until, ElmModel, ElmSession, InferenceConfig, KvMode,
};
use elm::equilibrium::{ElmConfig, ElmModule};
use elm::model::{block_forward_cached, Arch, LayerKv, Scratch};
use elm::solver::{SolverConfig, StopCriteria};
use ndarray::{Array2, Array3};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn elm_model(arch: Arch) -> ElmModel {
    let (w, ec) = (tiny_weights(arch, 5, 11), ElmConfig::new(1, 3));
    let module = ElmModule::init(&w, &ec).unwrap();
    ElmModel::new(w, ec, module).unwrap()
}

fn infer(solver: SolverConfig, tol: f64, mode: KvMode) -> InferenceConfig {
    InferenceConfig {
        solver,
        stop: StopCriteria::absolute(tol, 60),
        kv_mode: mode,
        adaptive_prefill: true,
        ..InferenceConfig::default()
    }
}

fn max_abs_diff(a: &Array2<f32>, b: &Array2<f32>) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn prompts() -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(3);
    [5usize, 9, 3]
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(3..64)).collect())
        .collect()
}

#[test]
fn first_iteration_reproduces_layer_l() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let (w, ec) = (tiny_weights(arch, 5, 11), ElmConfig::new(1, 3));
        let cfg = &w.config;
        let module = ElmModule::init(&w, &ec).unwrap();
        let mut rng = StdRng::seed_from_u64(5);
        let h =
            Array3::from_shape_simple_fn((2, 6, cfg.hidden_size), || rng.gen_range(-2.0f32..2.0));
        let mut kv = LayerKv::new(cfg, 2, 16).unwrap();
        let mut scratch = Scratch::new(cfg, 16);
        let dense = block_forward_cached(
            &w.layers[ec.start_layer],
            cfg,
            h.view(),
            &mut kv,
            false,
            &mut scratch,
        )
        .unwrap();
        let z0 = Array2::<f32>::zeros((12, cfg.hidden_size));
        let h2 = h.to_shape((12, cfg.hidden_size)).unwrap();
        let u = module
            .inject(z0.view(), h2.view())
            .into_shape_with_order((2, 6, cfg.hidden_size))
            .unwrap();
        let first =
            block_forward_cached(&module.block, cfg, u.view(), &mut kv, false, &mut scratch)
                .unwrap();
        let diff = (&first - &dense)
            .mapv(f32::abs)
            .fold(0.0f32, |a, &b| a.max(b));
        assert!(diff <= 1e-6, "{arch:?}: max abs diff {diff}");
        // W_z is the scaled default init: nonzero, |w| <= 0.1/sqrt(2C), seeded.
        let bound = 0.1 / ((2 * cfg.hidden_size) as f32).sqrt();
        let w_z = &module.projection().unwrap().w_z;
        assert!(w_z.iter().all(|v| v.abs() <= bound) && w_z.iter().any(|v| *v != 0.0));
        let again = ElmModule::init(&w, &ec).unwrap();
        assert_eq!(again.projection, module.projection);
        let other = ElmModule::init(
            &w,
            &ElmConfig {
                init_seed: 1,
                ..ec.clone()
            },
        )
        .unwrap();
        assert_ne!(other.projection().unwrap().w_z, *w_z);
    }
}

#[test]
fn dense_session_matches_layerwise_recompute_and_decode_matches_prefill() {
    // The dense path through ElmSession (no module): cached decode == full prefill logits.
    let w = tiny_weights(Arch::Qwen2, 5, 11);
    let model = ElmModel::dense(w);
    let seq: Vec<u32> = vec![4, 8, 15, 16, 23, 42, 7];
    let mut full = ElmSession::new(&model, InferenceConfig::default(), 1, 32).unwrap();
    let want = full.prefill(std::slice::from_ref(&seq)).unwrap();
    let mut inc = ElmSession::new(&model, InferenceConfig::default(), 1, 32).unwrap();
    inc.prefill(&[seq[..3].to_vec()]).unwrap();
    let mut got = Array2::zeros((1, 1));
    for &t in &seq[3..] {
        got = inc.decode_step(&[t]).unwrap();
    }
    let d = max_abs_diff(&got, &want);
    assert!(d < 1e-4, "decode vs prefill max abs diff {d}");
}

#[test]
fn converged_one_step_multi_step_and_recompute_agree() {
    // 1e-5, not 1e-6: an f32 iterate's absolute residual bottoms out near 1e-6, and where exactly
    // depends on the BLAS kernels. Debian's OpenBLAS 0.3.21 does not know a newer Intel Xeon and
    // runs its generic (Prescott) kernels there; Picard then stalled at 1.05e-6 (with
    // OPENBLAS_CORETYPE=SkylakeX it converged), so 1e-6 tested rounding.
    let tol = 1e-5;
    for arch in [Arch::Llama, Arch::Qwen2] {
        let model = elm_model(arch);
        let seq: Vec<u32> = vec![3, 17, 29, 5, 44, 61, 12, 8];
        for solver in [
            SolverConfig::picard(),
            SolverConfig::anderson(),
            SolverConfig::broyden(),
        ] {
            let name = solver.name();
            let mut full =
                ElmSession::new(&model, infer(solver.clone(), tol, KvMode::OneStep), 1, 32)
                    .unwrap();
            let want = full.prefill(std::slice::from_ref(&seq)).unwrap();
            for mode in [KvMode::OneStep, KvMode::MultiStep] {
                let mut s =
                    ElmSession::new(&model, infer(solver.clone(), tol, mode), 1, 32).unwrap();
                s.prefill(&[seq[..3].to_vec()]).unwrap();
                let mut got = Array2::zeros((1, 1));
                for &t in &seq[3..] {
                    got = s.decode_step(&[t]).unwrap();
                }
                let d = max_abs_diff(&got, &want);
                eprintln!(
                    "{arch:?} {name} {mode:?}: diff {d}, iters {:?}",
                    s.decode_stats
                        .iter()
                        .map(|x| x.iterations)
                        .collect::<Vec<_>>()
                );
                assert!(
                    d < 1e-3,
                    "{arch:?} {name} {mode:?}: decode vs recompute max abs diff {d}"
                );
                assert!(
                    s.decode_stats
                        .iter()
                        .all(|st| st.status == elm::solver::RowStatus::Converged),
                    "{arch:?} {name} {mode:?}: {:?}",
                    s.decode_stats
                );
                if mode == KvMode::MultiStep {
                    assert!(
                        s.fp_caches() > 1,
                        "multi-step allocates one cache per iteration"
                    );
                }
            }
        }
    }
}

#[test]
fn loose_tolerance_makes_modes_differ_but_stay_close() {
    // Not converged: multi-step attends to intermediate iterates, one-step to final ones.
    let model = elm_model(Arch::Llama);
    let seq: Vec<u32> = vec![3, 17, 29, 5, 44, 61];
    let run = |mode| {
        let mut cfg = infer(SolverConfig::picard(), 0.0, mode);
        cfg.stop.max_iter = 2;
        let mut s = ElmSession::new(&model, cfg, 1, 16).unwrap();
        s.prefill(&[seq[..2].to_vec()]).unwrap();
        let mut got = Array2::zeros((1, 1));
        for &t in &seq[2..] {
            got = s.decode_step(&[t]).unwrap();
        }
        assert!(
            s.decode_stats.iter().all(|st| st.iterations == 3),
            "{:?}",
            s.decode_stats
        );
        got
    };
    let d = max_abs_diff(&run(KvMode::OneStep), &run(KvMode::MultiStep));
    assert!(
        d > 0.0 && d < 1.0,
        "one-step vs multi-step at 2 iterations: {d}"
    );
}

#[test]
fn batched_decode_equals_unbatched() {
    let model = elm_model(Arch::Qwen2);
    let ps = prompts();
    for mode in [KvMode::OneStep, KvMode::MultiStep] {
        let cfg = infer(SolverConfig::anderson(), 1e-3, mode);
        let mut s = ElmSession::new(&model, cfg.clone(), ps.len(), 32).unwrap();
        let batched = generate_greedy(&mut s, &ps, 6, &[]).unwrap();
        let mut iters_b: Vec<Vec<usize>> = vec![vec![]; ps.len()];
        for st in &s.decode_stats {
            iters_b[st.sequence].push(st.iterations);
        }
        for (i, p) in ps.iter().enumerate() {
            let mut one = ElmSession::new(&model, cfg.clone(), 1, 32).unwrap();
            let single = generate_greedy(&mut one, std::slice::from_ref(p), 6, &[]).unwrap();
            assert_eq!(batched[i], single[0], "{mode:?} sequence {i}");
            let iters: Vec<usize> = one.decode_stats.iter().map(|s| s.iterations).collect();
            assert_eq!(
                iters_b[i], iters,
                "{mode:?} sequence {i}: per-token iterations"
            );
        }
    }
    // Stop tokens end a sequence early and only that sequence.
    let mut s = ElmSession::new(
        &model,
        infer(SolverConfig::picard(), 1e-3, KvMode::OneStep),
        3,
        32,
    )
    .unwrap();
    let free = generate_greedy(&mut s, &ps, 6, &[]).unwrap();
    let stop = free[1][2];
    let mut s = ElmSession::new(
        &model,
        infer(SolverConfig::picard(), 1e-3, KvMode::OneStep),
        3,
        32,
    )
    .unwrap();
    let stopped = generate_greedy(&mut s, &ps, 6, &[stop]).unwrap();
    let cut = free[1].iter().position(|&t| t == stop).unwrap();
    assert_eq!(stopped[1], free[1][..=cut].to_vec());
    assert_eq!(s.lens()[1], ps[1].len() + cut);
    // A stop text ends a sequence at the first token whose decoded text contains it.
    let detok = |ids: &[u32]| -> elm::error::Result<String> {
        Ok(ids.iter().map(|t| format!("<{t}>")).collect())
    };
    let text = format!("<{}><{}>", free[2][1], free[2][2]);
    let mut s = ElmSession::new(
        &model,
        infer(SolverConfig::picard(), 1e-3, KvMode::OneStep),
        3,
        32,
    )
    .unwrap();
    let until = generate_greedy_until(&mut s, &ps, 6, &[], &[text.as_str()], Some(&detok)).unwrap();
    let first = (1..free[2].len())
        .find(|&k| detok(&free[2][..=k]).unwrap().contains(&text))
        .unwrap();
    assert_eq!(until[2], free[2][..=first].to_vec());
    for b in [0, 1] {
        let hit = (0..free[b].len()).find(|&k| detok(&free[b][..=k]).unwrap().contains(&text));
        let want = hit.map_or(free[b].clone(), |k| free[b][..=k].to_vec());
        assert_eq!(until[b], want, "sequence {b}");
    }
}

#[test]
fn kv_bytes_are_exact() {
    let model = elm_model(Arch::Llama);
    let cfg = model.config().clone();
    let ec = model.elm_config().unwrap().clone();
    let (b, t) = (2, 40);
    let per = 2 * b * t * cfg.num_kv_heads * cfg.head_dim * 4;
    assert_eq!(layer_kv_bytes(&cfg, b, t), per);
    let s = ElmSession::new(
        &model,
        infer(SolverConfig::picard(), 0.0, KvMode::OneStep),
        b,
        t,
    )
    .unwrap();
    let rep = kv_report(&cfg, &ec, b, t, 1);
    assert_eq!(s.kv_bytes(), rep.one_step);
    assert_eq!(rep.one_step, (cfg.num_layers - ec.num_replaced + 1) * per);
    assert!((rep.one_step_ratio - 3.0 / 5.0).abs() < 1e-12);
    let dense = model.dense_reference().unwrap();
    let sd = ElmSession::new(&dense, InferenceConfig::default(), b, t).unwrap();
    assert_eq!(sd.kv_bytes(), rep.dense);
    // Multi-step: one extra cache per iteration index reached (max_iter 2 + commit = 3).
    let mut cfgm = infer(SolverConfig::picard(), 0.0, KvMode::MultiStep);
    cfgm.stop.max_iter = 2;
    let mut sm = ElmSession::new(&model, cfgm, b, t).unwrap();
    generate_greedy(&mut sm, &[vec![3, 4], vec![5]], 3, &[]).unwrap();
    assert_eq!(sm.fp_caches(), 3);
    assert_eq!(sm.kv_bytes(), kv_report(&cfg, &ec, b, t, 3).multi_step);
}

#[test]
fn parameter_report_matches_allocated_arrays() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let (w, ec) = (tiny_weights(arch, 5, 11), ElmConfig::new(1, 3));
        let module = ElmModule::init(&w, &ec).unwrap();
        let rep = param_report(&w.config, &ec);
        assert_eq!(rep.dense_total, w.num_params(), "{arch:?}");
        let removed: usize = w.layers[ec.start_layer..ec.end_layer()]
            .iter()
            .map(|l| l.num_params())
            .sum();
        assert_eq!(rep.removed, removed);
        assert_eq!(rep.module, module.num_params());
        assert_eq!(
            rep.elm_total,
            w.num_params() - removed + module.num_params()
        );
        let emb = w.embed.len() + w.lm_head.as_ref().map_or(0, |h| h.len());
        assert_eq!(rep.dense_non_embedding, w.num_params() - emb);
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let model = elm_model(Arch::Llama);
    let mut s = ElmSession::new(&model, InferenceConfig::default(), 1, 4).unwrap();
    assert!(s.prefill(&[vec![]]).is_err());
    assert!(s
        .prefill(&[vec![1000]])
        .unwrap_err()
        .to_string()
        .contains("vocab"));
    assert!(s
        .prefill(&[vec![1, 2, 3, 4, 5]])
        .unwrap_err()
        .to_string()
        .contains("max_seq"));
    let e = serde_json::from_str::<InferenceConfig>("{\"stop\": {\"abs_tol\": 0.1}, \"foo\": 1}")
        .unwrap_err();
    assert!(e.to_string().contains("foo"));
    // The old `tol` key is unknown now: stopping is `stop.abs_tol` / `stop.rel_tol`.
    assert!(serde_json::from_str::<InferenceConfig>("{\"tol\": 0.1}").is_err());
    let bad = InferenceConfig {
        stop: StopCriteria::absolute(0.5, 0),
        ..InferenceConfig::default()
    };
    assert!(ElmSession::new(&model, bad, 1, 4).is_err());
    assert!(ElmConfig::new(3, 3).validate(model.config()).is_err());
}

/// The decoder's record reports the bytes the session holds after decoding: multi-step
/// caches are allocated as iterations reach them, so they must be counted at the end, not
/// when the session is created.
#[test]
fn decoder_record_counts_lazily_allocated_multi_step_caches() {
    use elm::equilibrium::infer::ElmDecoder;
    use elm::model::generate::Decoder;
    let model = elm_model(Arch::Llama);
    let cfg = model.config().clone();
    let ec = model.elm_config().unwrap().clone();
    let (b, t) = (1, 16);
    let mut bytes = vec![];
    for mode in [KvMode::OneStep, KvMode::MultiStep] {
        let mut c = infer(SolverConfig::picard(), 0.0, mode);
        c.stop.max_iter = 2;
        let dec = ElmDecoder::new(&model, c).unwrap();
        let mut st = dec.new_state(b, t).unwrap();
        let mut logits = dec.prefill(&[vec![3, 4, 5]], &mut st).unwrap();
        dec.decode_step(&[7], &[true], &mut st, &mut logits)
            .unwrap();
        assert_eq!(dec.record().kv_bytes, st.kv_bytes());
        bytes.push(dec.record().kv_bytes);
    }
    assert_eq!(bytes[0], kv_report(&cfg, &ec, b, t, 1).one_step);
    // max_iter 2 + the commit evaluation = 3 fixed-point caches.
    assert_eq!(bytes[1], kv_report(&cfg, &ec, b, t, 3).multi_step);
}
