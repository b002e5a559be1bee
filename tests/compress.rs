//! `elm::compress`: every selection metric and training-free method checked against an
//! independent reference (a numpy fixture, an explicit formula, an SVD least-squares solve, a
//! model built so that the right answer is known), plus the CLI end to end on SmolLM2.

mod common;

use std::sync::Arc;

use elm::compress::methods::{
    delete_layers, mlp_split, rdsc_merge, replace_me_map, shortened_plus_select,
};
use elm::compress::metrics::{
    angular_distance, block_influence, lowest, removal_nll, taylor_importance, taylor_sums,
    window_cosine, window_removal_nll,
};
use elm::compress::{prune, BoundaryStates, Calibration, PruneMethod, PruneOptions};
use elm::error::ElmError;
use elm::model::dense_pass::run_dense_layers;
use elm::model::tape::ModelTensors;
use elm::model::{Arch, ModelConfig, ModelWeights};
use ndarray::{s, Array2, Array3, ArrayD, IxDyn};
use ndarray_linalg::LeastSquaresSvd;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn calibration(chunks: usize, t: usize, seed: u64) -> Calibration {
    let mut rng = StdRng::seed_from_u64(seed);
    let ids = (0..chunks * t)
        .map(|_| rng.gen_range(3..64u32))
        .collect::<Vec<_>>();
    Calibration::from_token_stream([ids], None, t, chunks * t).unwrap()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn metrics_match_the_numpy_reference() {
    let text = include_str!("fixtures/compress/metrics_ref.json");
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).unwrap();
    let flat: Vec<f32> = serde_json::from_value(v["states"].clone()).unwrap();
    let per = shape[1] * shape[2] * shape[3];
    let states = BoundaryStates {
        states: (0..shape[0])
            .map(|i| {
                Array3::from_shape_vec(
                    (shape[1], shape[2], shape[3]),
                    flat[i * per..(i + 1) * per].to_vec(),
                )
                .unwrap()
            })
            .collect(),
    };
    let m = v["m"].as_u64().unwrap() as usize;
    let want = |k: &str| -> Vec<f64> { serde_json::from_value(v[k].clone()).unwrap() };
    let check = |name: &str, got: Vec<f64>, want: Vec<f64>| {
        assert_eq!(got.len(), want.len(), "{name}");
        for (g, w) in got.iter().zip(&want) {
            assert!(close(*g, *w, 1e-12), "{name}: {got:?} vs {want:?}");
        }
    };
    check(
        "block influence",
        block_influence(&states),
        want("block_influence"),
    );
    check(
        "window cosine",
        window_cosine(&states, m).unwrap(),
        want("window_cosine"),
    );
    check(
        "angular distance",
        angular_distance(&states, m).unwrap(),
        want("angular_distance"),
    );
    assert!(window_cosine(&states, 0).is_err());
    assert!(angular_distance(&states, shape[0] - 1).is_err());
}

/// A block whose attention and MLP outputs are zero is the identity: removing it leaves the
/// calibration NLL exactly as it was. On text sampled from the model itself (so that the dense
/// model is the distribution the NLL measures and every real change costs KL > 0) the one-shot
/// PPL criterion must rank it least important.
#[test]
fn one_shot_ppl_ranks_an_identity_block_least_important() {
    let mut w = common::tiny_weights(Arch::Llama, 6, 3);
    for l in &mut w.layers {
        // Larger branches make every real block matter for the output distribution.
        l.wo *= 3.0;
        l.w_down *= 3.0;
    }
    w.layers[2].wo.fill(0.0);
    w.layers[2].w_down.fill(0.0);
    let dense = elm::model::Transformer::new(w.clone()).unwrap();
    let prompts: Vec<Vec<u32>> = (0..8).map(|i| vec![3 + i as u32]).collect();
    let sampling = elm::model::generate::SamplingConfig {
        max_new_tokens: 31,
        temperature: 1.0,
        seed: 5,
        ..Default::default()
    };
    let g = elm::model::generate::generate(&dense, &prompts, &sampling, None, |_, _| {}).unwrap();
    let texts = prompts.iter().zip(&g.tokens).map(|(p, t)| {
        let mut s = p.clone();
        s.extend(t);
        s
    });
    let calib = Calibration::from_token_stream(texts, None, 32, 8 * 32).unwrap();
    assert_eq!(calib.chunks.len(), 8);
    let states = BoundaryStates::collect(&w, &calib, 2).unwrap();
    let nll = window_removal_nll(&w, &states, &calib, 1, 2).unwrap();
    let dense = removal_nll(&w, &states, &calib, 0, 0, 2).unwrap();
    println!("dense NLL {dense:.6}; without each block {nll:?}");
    assert!(close(nll[2], dense, 1e-6), "{} vs {dense}", nll[2]);
    assert_eq!(lowest(&nll, 1), vec![2]);
    // Shortened-LLaMA deletes it first.
    let pruned = prune(
        &w,
        &calib,
        &states,
        &PruneOptions {
            method: PruneMethod::ShortenedPpl,
            num_replaced: 1,
            start: None,
            batch: 2,
        },
    )
    .unwrap();
    assert_eq!(pruned.report.removed_layers, vec![2]);
    assert_eq!(pruned.weights.config.num_layers, 5);
    // And ShortGPT's Block Influence of the identity block is 0.
    let bi = block_influence(&states);
    assert!(bi[2].abs() < 1e-6, "{bi:?}");
    assert_eq!(lowest(&bi, 1), vec![2]);
}

/// NLL of a model with nothing removed equals the dense model's own teacher-forced NLL.
#[test]
fn removal_nll_without_removal_is_the_dense_nll() {
    let w = common::tiny_weights(Arch::Llama, 3, 5);
    let calib = calibration(2, 10, 2);
    let states = BoundaryStates::collect(&w, &calib, 1).unwrap();
    let got = removal_nll(&w, &states, &calib, 0, 0, 1).unwrap();
    let t = elm::model::Transformer::new(w.clone()).unwrap();
    let (mut sum, mut n) = (0.0, 0);
    for c in &calib.chunks {
        let (nll, count) = t.sequence_nll(c).unwrap();
        sum += nll;
        n += count;
    }
    assert!(
        close(got, sum / n as f64, 1e-5),
        "{got} vs {}",
        sum / n as f64
    );
}

#[test]
fn la_co_merge_follows_the_rdsc_formula() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let mut cfg = ModelConfig::tiny(arch);
        cfg.num_layers = 5;
        let w = ModelWeights::random(&cfg, 9);
        let merged = rdsc_merge(&w.layers[1..4]).unwrap();
        // θ* = θ_1 + (θ_2 − θ_1) + (θ_3 − θ_1), element by element.
        let formula = |pick: fn(&elm::model::LayerWeights) -> &Array2<f32>| {
            let (a, b, c) = (pick(&w.layers[1]), pick(&w.layers[2]), pick(&w.layers[3]));
            Array2::from_shape_fn(a.dim(), |ix| a[ix] + (b[ix] - a[ix]) + (c[ix] - a[ix]))
        };
        let diff = |x: &Array2<f32>, y: &Array2<f32>| {
            x.iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0f32, f32::max)
        };
        assert!(diff(&merged.wq, &formula(|l| &l.wq)) < 1e-5);
        assert!(diff(&merged.wo, &formula(|l| &l.wo)) < 1e-5);
        assert!(diff(&merged.w_down, &formula(|l| &l.w_down)) < 1e-5);
        assert!(diff(&merged.w_gate, &formula(|l| &l.w_gate)) < 1e-5);
        assert_eq!(
            merged.attn_norm, w.layers[1].attn_norm,
            "norms stay the first layer's"
        );
        if let (Some(m), Some(a), Some(b), Some(c)) = (
            &merged.bq,
            &w.layers[1].bq,
            &w.layers[2].bq,
            &w.layers[3].bq,
        ) {
            let want = a + &(b - a) + &(c - a);
            assert!(m.iter().zip(&want).all(|(p, q)| (p - q).abs() < 1e-5));
        }
        // The LaCo method keeps the merged layer at the window start and drops the rest.
        let calib = calibration(2, 8, 3);
        let states = BoundaryStates::collect(&w, &calib, 2).unwrap();
        let out = prune(
            &w,
            &calib,
            &states,
            &PruneOptions {
                method: PruneMethod::LaCo,
                num_replaced: 3,
                start: Some(1),
                batch: 2,
            },
        )
        .unwrap();
        assert_eq!(out.report.removed_layers, vec![2, 3]);
        assert_eq!(out.weights.layers.len(), 3);
        assert_eq!(out.weights.layers[1].wq, merged.wq);
    }
}

/// LaCo's search against a direct replay of its rule: every candidate model built whole (RDSC
/// merges put in place, merged-away layers deleted) and run from the embeddings, the same
/// top-down walk and threshold grid. Same threshold and merges, same similarities, and the
/// pruned model's final states are that similar to the dense ones.
#[test]
fn la_co_search_replays_its_rule() {
    use elm::compress::methods::{laco_search, mean_flat_cosine, LACO_MERGE_SIZE, LACO_SAMPLES};
    let build = |w: &ModelWeights, merges: &[(usize, usize)]| {
        let mut base = w.clone();
        let mut removed = vec![];
        for &(l, k) in merges {
            base.layers[l] = rdsc_merge(&w.layers[l..l + k]).unwrap();
            removed.extend(l + 1..l + k);
        }
        delete_layers(&base, &removed).unwrap()
    };
    for (layers, m, seed) in [(12usize, 4usize, 5u64), (10, 3, 8)] {
        let w = common::tiny_weights(Arch::Llama, layers, seed);
        let calib = calibration(7, 8, seed);
        let states = BoundaryStates::collect(&w, &calib, 3).unwrap();
        let found = laco_search(&w, &states, m).unwrap();
        eprintln!("{layers} layers, M = {m}: {found:?}");
        // The replay: final states of whole candidate models on the first LACO_SAMPLES chunks.
        let chunks: Vec<Vec<u32>> = calib.chunks[..LACO_SAMPLES].to_vec();
        let x0 = elm::model::dense_pass::embed(&w, &chunks).unwrap();
        let dense = run_dense_layers(&w, x0.clone(), 0..layers).unwrap();
        let sim = |merges: &[(usize, usize)]| {
            let p = build(&w, merges);
            let n = p.config.num_layers;
            mean_flat_cosine(&run_dense_layers(&p, x0.clone(), 0..n).unwrap(), &dense)
        };
        let c = LACO_MERGE_SIZE;
        let mut grid: Vec<f64> = (0..19).map(|i| (95 - 5 * i) as f64 / 100.0).collect();
        grid.push(-1.0);
        let mut replay = None;
        for t in grid {
            let (mut merges, mut sims, mut removed, mut top) = (vec![], vec![], 0usize, layers);
            let mut l = layers - c;
            while removed < m {
                let k = c.min(m - removed + 1);
                l = l.min(top - k);
                if l < 1 {
                    break;
                }
                let mut cand = merges.clone();
                cand.push((l, k));
                let v = sim(&cand);
                if v > t {
                    (merges, top) = (cand, l);
                    sims.push(v);
                    removed += k - 1;
                    if l < c {
                        break;
                    }
                    l -= c;
                } else {
                    l -= 1;
                }
            }
            if removed == m {
                replay = Some((t, merges, sims));
                break;
            }
        }
        let (t, merges, sims) = replay.expect("the replay reaches M");
        assert_eq!(found.threshold, t, "{layers} layers, M = {m}");
        assert_eq!(found.merges, merges);
        for (a, b) in found.similarities.iter().zip(&sims) {
            assert!(close(*a, *b, 1e-4), "{a} vs {b}");
        }
        // prune() builds the same model: RDSC layers in place, merged-away layers gone.
        let out = prune(
            &w,
            &calib,
            &states,
            &PruneOptions {
                method: PruneMethod::LaCoSearch,
                num_replaced: m,
                start: None,
                batch: 2,
            },
        )
        .unwrap();
        let want = build(&w, &merges);
        assert_eq!(out.weights.layers.len(), layers - m);
        for (a, b) in out.weights.layers.iter().zip(&want.layers) {
            assert_eq!(a.wq, b.wq);
            assert_eq!(a.w_down, b.w_down);
        }
        assert_eq!(out.report.removed_layers.len(), m);
        assert_eq!(out.report.scores, found.similarities);
    }
}

/// `elm compress --block-init la-co`: the module's block is the RDSC merge of the window, its
/// projection the usual init; the default keeps a copy of the first replaced layer.
#[test]
fn la_co_block_init_is_the_merged_window() {
    use elm::compress::{init_module, BlockInit};
    let w = common::tiny_weights(Arch::Llama, 6, 4);
    let ec = elm::equilibrium::ElmConfig::new(1, 3);
    let plain = elm::equilibrium::ElmModule::init(&w, &ec).unwrap();
    let laco = init_module(&w, &ec, BlockInit::LaCo).unwrap();
    let merged = rdsc_merge(&w.layers[1..4]).unwrap();
    let block = laco.block.decoder().unwrap();
    assert_eq!(block.wq, merged.wq);
    assert_eq!(block.w_down, merged.w_down);
    assert_ne!(block.wq, w.layers[1].wq);
    let p = (laco.projection().unwrap(), plain.projection().unwrap());
    assert_eq!(p.0.w_z, p.1.w_z);
    let first = init_module(&w, &ec, BlockInit::FirstLayer).unwrap();
    assert_eq!(first.block.decoder().unwrap().wq, w.layers[1].wq);
    assert!(matches!(
        "merge".parse::<BlockInit>(),
        Err(ElmError::Config { .. })
    ));
}

/// ReplaceMe's map from the f64 normal equations equals LAPACK's SVD least-squares solution of
/// the same problem, and the folded model computes `mid + Mo·T` in the layer before the window.
#[test]
fn replace_me_map_is_the_least_squares_solution() {
    let w = common::tiny_weights(Arch::Llama, 6, 11);
    let calib = calibration(6, 16, 4); // 96 tokens > C = 32: a full-rank problem
    let states = BoundaryStates::collect(&w, &calib, 3).unwrap();
    let (start, m) = (2, 3);
    let t = replace_me_map(&w, &states, start, m, 4).unwrap();
    // The same problem assembled here and solved by SVD.
    let (mid, mo) = mlp_split(&w, start - 1, states.states[start - 1].clone()).unwrap();
    // The split is the block: mid + Mo equals the inference path's h_start.
    let h = &mid + &mo;
    let err = (&h - &states.states[start])
        .mapv(f32::abs)
        .fold(0.0f32, |a, &b| a.max(b));
    assert!(err < 1e-4, "mid + Mo vs h_start: {err}");
    let c = w.config.hidden_size;
    let rows = |a: &Array3<f32>| a.to_shape((a.len() / c, c)).unwrap().mapv(f64::from);
    let target = rows(&states.states[start + m]) - rows(&mid);
    let svd = rows(&mo).least_squares(&target).unwrap().solution;
    let rel = (&t - &svd).mapv(f64::abs).fold(0.0f64, |a, &b| a.max(b))
        / svd.mapv(f64::abs).fold(0.0f64, |a, &b| a.max(b));
    // Normal equations square the condition number, so the maps agree to ~cond²·ε, while
    // both reach the least-squares minimum to first order.
    assert!(rel < 1e-5, "normal equations vs SVD: rel {rel:e}");
    let residual = |x: &Array2<f64>| (rows(&mo).dot(x) - &target).mapv(|v| v * v).sum().sqrt();
    let (r_ne, r_svd) = (residual(&t), residual(&svd));
    println!("ReplaceMe: map rel diff {rel:e}, residual {r_ne:.12} vs SVD {r_svd:.12}");
    assert!(close(r_ne, r_svd, 1e-10), "{r_ne} vs {r_svd}");
    // Folded into layer start−1: its output is now mid + Mo·T.
    let out = prune(
        &w,
        &calib,
        &states,
        &PruneOptions {
            method: PruneMethod::ReplaceMeLs,
            num_replaced: m,
            start: Some(start),
            batch: 4,
        },
    )
    .unwrap();
    assert_eq!(out.report.removed_layers, vec![2, 3, 4]);
    assert_eq!(out.report.added_params, 0);
    let got = run_dense_layers(&out.weights, states.states[start - 1].clone(), 1..2).unwrap();
    let want = rows(&mid) + rows(&mo).dot(&t);
    let got = rows(&got);
    let err = (&got - &want).mapv(f64::abs).fold(0.0f64, |a, &b| a.max(b));
    assert!(err < 1e-3, "folded layer vs mid + Mo·T: {err}");
    // Removing nothing before layer 0 is impossible for ReplaceMe.
    assert!(replace_me_map(&w, &states, 0, 2, 4).is_err());
}

#[test]
fn window_methods_choose_by_their_metric() {
    let w = common::tiny_weights(Arch::Llama, 6, 13);
    let calib = calibration(3, 10, 5);
    let states = BoundaryStates::collect(&w, &calib, 3).unwrap();
    let m = 2;
    let opts = |method| PruneOptions {
        method,
        num_replaced: m,
        start: None,
        batch: 3,
    };
    let ang = angular_distance(&states, m).unwrap();
    let del = prune(&w, &calib, &states, &opts(PruneMethod::WindowDelete)).unwrap();
    let s = del.report.start.unwrap();
    assert_eq!(s, lowest(&ang, 1)[0]);
    assert_eq!(del.report.removed_layers, vec![s, s + 1]);
    assert_eq!(del.report.scores, ang);
    let cosine = window_cosine(&states, m).unwrap();
    let laco = prune(&w, &calib, &states, &opts(PruneMethod::LaCo)).unwrap();
    let best = laco.report.start.unwrap();
    assert!(cosine.iter().all(|&c| c <= cosine[best]));
    let short = prune(&w, &calib, &states, &opts(PruneMethod::ShortGpt)).unwrap();
    let mut want = lowest(&block_influence(&states), m);
    want.sort_unstable();
    assert_eq!(short.report.removed_layers, want);
    // Accounting: deleting 2 of 6 layers removes exactly their parameters and K/V.
    let per_layer = w.layers[0].num_params();
    assert_eq!(
        short.report.dense_params - short.report.params,
        2 * per_layer
    );
    assert_eq!(
        short.report.kv_bytes_1k * 6,
        short.report.dense_kv_bytes_1k * 4
    );
}

/// Mean next-token CE of the calibration chunks through the tape-free f64 forward
/// (`run_layers_plain`, then the final norm, the LM head and a log-sum-exp written out here):
/// no tape, no backward.
fn plain_ce_f64(mt: &ModelTensors<f64>, calib: &Calibration) -> f64 {
    let cfg = &mt.config;
    let (n, t, c) = (calib.chunks.len(), calib.seq_len(), cfg.hidden_size);
    let x = ArrayD::from_shape_fn(IxDyn(&[n, t, c]), |ix| {
        mt.embed[[calib.chunks[ix[0]][ix[1]] as usize, ix[2]].as_slice()]
    });
    let h = mt.run_layers_plain(0..cfg.num_layers, &x, 0).unwrap();
    let (hn, _) = elm::nn::rmsnorm::forward(&h, &mt.final_norm, cfg.rms_norm_eps as f64).unwrap();
    let head = mt.lm_head.as_ref().unwrap_or(&mt.embed);
    let logits = elm::autograd::ops::linear_forward(&hn, head, None).unwrap();
    let logits = logits.into_dimensionality::<ndarray::Ix3>().unwrap();
    let mut sum = 0.0;
    for i in 0..n {
        for j in 0..t - 1 {
            let row = logits.slice(s![i, j, ..]);
            let max = row.fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let lse = max + row.iter().map(|&z| (z - max).exp()).sum::<f64>().ln();
            sum += lse - row[calib.chunks[i][j + 1] as usize];
        }
    }
    sum / (n * (t - 1)) as f64
}

/// `mt` with parameter `name` of layer `layer` scaled by `factor`.
fn scale_param(mt: &ModelTensors<f64>, layer: usize, name: &str, factor: f64) -> ModelTensors<f64> {
    let mut out = mt.clone();
    out.layers[layer] = mt.layers[layer].map(|n, a| {
        if n == name {
            Arc::new(a.as_ref() * factor)
        } else {
            a.clone()
        }
    });
    out
}

/// `S_W = Σ W ⊙ ∂CE/∂W` from the f64 tape equals `d/dε CE(W·(1 + ε))` at 0 by a central
/// difference through the tape-free f64 forward, for every weight, norm and bias of every block
/// (Llama: tied head, no biases; Qwen2: untied head, Q/K/V biases), with calibration split into
/// batches of unequal size. The f32 inference path (`run_dense_layers`) agrees too, to f32
/// accuracy, for the matrices of every block.
#[test]
fn taylor_sums_are_the_derivative_of_the_loss_under_weight_scaling() {
    for (arch, seed) in [(Arch::Llama, 21), (Arch::Qwen2, 22)] {
        let mut cfg = ModelConfig::tiny(arch);
        cfg.num_layers = 3;
        let w = ModelWeights::random(&cfg, seed);
        let calib = calibration(5, 12, seed + 1);
        // Batches of 2, 2, 1 chunks: the token weighting makes the sums independent of batch.
        let sums = taylor_sums::<f64>(&w, &calib, 2).unwrap();
        let whole = taylor_sums::<f64>(&w, &calib, 5).unwrap();
        let sums32 = taylor_sums::<f32>(&w, &calib, 2).unwrap();
        let mt = ModelTensors::<f64>::from_weights(&w).unwrap();
        let eps = 1e-4;
        let (mut worst, mut checked) = (0.0f64, 0);
        for (l, block) in sums.iter().enumerate() {
            let names = block.named();
            assert_eq!(names.len(), if arch == Arch::Qwen2 { 12 } else { 9 });
            for (k, (name, &got)) in names.into_iter().enumerate() {
                let plus = plain_ce_f64(&scale_param(&mt, l, name, 1.0 + eps), &calib);
                let minus = plain_ce_f64(&scale_param(&mt, l, name, 1.0 - eps), &calib);
                let fd = (plus - minus) / (2.0 * eps);
                let err = (got - fd).abs() / (1e-6 + fd.abs());
                worst = worst.max(err);
                assert!(
                    err < 1e-6,
                    "{arch:?} layer {l} {name}: tape {got:e} vs finite difference {fd:e}"
                );
                let one_batch = *whole[l].named()[k].1;
                assert!(close(got, one_batch, 1e-9), "{got} vs {one_batch}");
                let f32_tape = *sums32[l].named()[k].1;
                assert!(
                    (f32_tape - got).abs() < 1e-3 * got.abs() + 1e-6,
                    "{arch:?} layer {l} {name}: f32 tape {f32_tape:e} vs f64 {got:e}"
                );
                checked += 1;
            }
        }
        println!(
            "{arch:?}: {checked} sums, worst relative error vs f64 finite difference {worst:e}"
        );
        // The ordinary f32 inference path (residual states, then removal_nll of nothing removed).
        let ce32 = |w: &ModelWeights| {
            let st = BoundaryStates::collect(w, &calib, 5).unwrap();
            removal_nll(w, &st, &calib, 0, 0, 5).unwrap()
        };
        let e32 = 1e-2;
        for (l, block) in sums.iter().enumerate() {
            type Pick = fn(&mut elm::model::LayerWeights) -> &mut Array2<f32>;
            let picks: [(&str, Pick); 3] = [
                ("wq", |x| &mut x.wq),
                ("wo", |x| &mut x.wo),
                ("w_down", |x| &mut x.w_down),
            ];
            for (name, pick) in picks {
                let scaled = |f: f32| {
                    let mut v = w.clone();
                    *pick(&mut v.layers[l]) *= f;
                    ce32(&v)
                };
                let fd = (scaled(1.0 + e32 as f32) - scaled(1.0 - e32 as f32)) / (2.0 * e32);
                let got = *block
                    .named()
                    .into_iter()
                    .find(|(n, _)| *n == name)
                    .unwrap()
                    .1;
                println!("{arch:?} layer {l} {name}: tape {got:.6e}, f32 inference FD {fd:.6e}");
                assert!(
                    (got - fd).abs() < 2e-3 * got.abs() + 1e-5,
                    "{arch:?} layer {l} {name}: tape {got:e} vs f32 inference FD {fd:e}"
                );
            }
        }
        assert_eq!(taylor_importance(&sums).len(), 3);
    }
}

/// A block whose o_proj and down_proj are zero is the identity and its weights get no
/// gradient: Taylor+ importance exactly 0. Among the prunable blocks (not the first 4, not the
/// last 2) it is the least important and Shortened-Taylor deletes it, while an identity block
/// inside the protected first 4 keeps its 0 score in the report and is never deleted.
#[test]
fn taylor_plus_ranks_an_identity_block_least_important() {
    let mut w = common::tiny_weights(Arch::Llama, 10, 31);
    for l in [1, 6] {
        w.layers[l].wo.fill(0.0);
        w.layers[l].w_down.fill(0.0);
    }
    let calib = calibration(4, 16, 8);
    let states = BoundaryStates::collect(&w, &calib, 2).unwrap();
    let sums = taylor_sums::<f64>(&w, &calib, 3).unwrap();
    for (name, &s) in sums[6].named() {
        assert_eq!(s, 0.0, "identity block's {name}");
    }
    let imp = taylor_importance(&sums);
    println!("Taylor+ importance: {imp:?}");
    assert_eq!((imp[1], imp[6]), (0.0, 0.0));
    assert!(imp
        .iter()
        .enumerate()
        .all(|(l, &v)| l == 1 || l == 6 || v > 0.0));
    let run = |m| {
        prune(
            &w,
            &calib,
            &states,
            &PruneOptions {
                method: PruneMethod::ShortenedTaylor,
                num_replaced: m,
                start: None,
                batch: 2,
            },
        )
        .unwrap()
    };
    let one = run(1);
    let r = &one.report;
    assert_eq!(r.removed_layers, vec![6]);
    assert_eq!(one.weights.config.num_layers, 9);
    assert_eq!(r.method, PruneMethod::ShortenedTaylor);
    assert!(r.metric.starts_with("taylor+"), "{}", r.metric);
    // Scores of every block, the protected ones included (as shortened-ppl reports them).
    assert_eq!(r.scores.len(), 10);
    assert_eq!((r.scores[1], r.scores[6]), (0.0, 0.0));
    for (a, b) in r.scores.iter().zip(&imp) {
        assert!(close(*a, *b, 1e-3), "f32 {a} vs f64 {b}");
    }
    // Without the "+" rule block 1 would be first.
    assert_eq!(lowest(&r.scores, 1), vec![1]);
    // Two blocks: the identity and the least important other prunable block (4, 5 or 7).
    let two = run(2);
    let next = [4, 5, 7]
        .into_iter()
        .min_by(|&a, &b| imp[a].total_cmp(&imp[b]))
        .unwrap();
    let mut want = vec![6, next];
    want.sort_unstable();
    assert_eq!(two.report.removed_layers, want);
    assert_eq!(shortened_plus_select(&r.scores, 2), want);
}

#[test]
fn bad_requests_are_refused() {
    let w = common::tiny_weights(Arch::Llama, 4, 17);
    let calib = calibration(2, 8, 6);
    let states = BoundaryStates::collect(&w, &calib, 2).unwrap();
    let run = |method, m, start| {
        prune(
            &w,
            &calib,
            &states,
            &PruneOptions {
                method,
                num_replaced: m,
                start,
                batch: 2,
            },
        )
        .err()
        .map(|e| e.to_string())
    };
    let e = run(PruneMethod::ShortGpt, 4, None).unwrap();
    assert!(e.contains("num_replaced"), "{e}");
    assert!(run(PruneMethod::ShortGpt, 0, None).is_some());
    let e = run(PruneMethod::WindowDelete, 2, Some(3)).unwrap();
    assert!(e.contains("start") && e.contains("outside"), "{e}");
    let e = run(PruneMethod::ShortGpt, 2, Some(0)).unwrap();
    assert!(e.contains("start"), "{e}");
    // Shortened-Taylor refuses M >= N with the same typed error as every method
    // (shortened-ppl included); it runs no backward first.
    for method in [PruneMethod::ShortenedTaylor, PruneMethod::ShortenedPpl] {
        let err = prune(
            &w,
            &calib,
            &states,
            &PruneOptions {
                method,
                num_replaced: 4,
                start: None,
                batch: 2,
            },
        )
        .err()
        .expect("M >= N is refused");
        assert!(
            matches!(&err, ElmError::Config { field, .. } if field == "num_replaced"),
            "{err}"
        );
    }
    let e = run(PruneMethod::ShortenedTaylor, 2, Some(0)).unwrap();
    assert!(e.contains("start") && e.contains("selects its own"), "{e}");
    assert_eq!(
        "shortened-taylor".parse::<PruneMethod>().unwrap(),
        PruneMethod::ShortenedTaylor
    );
    // The "+" rule needs N > M + 6; a shallower request drops it (as shortened-ppl always has)
    // rather than failing: with 8 blocks, M = 1 may only take blocks 4 or 5, M = 2 any block.
    let scores = [0.0, 0.1, 0.2, 0.3, 0.9, 0.8, 0.05, 0.01];
    assert_eq!(shortened_plus_select(&scores, 1), vec![5]);
    assert_eq!(shortened_plus_select(&scores, 2), vec![0, 7]);
    let e = "nope".parse::<PruneMethod>().unwrap_err().to_string();
    assert!(
        e.contains("unknown method") && e.contains("short-gpt"),
        "{e}"
    );
    assert!(delete_layers(&w, &[0, 1, 2, 3]).is_err());
    assert!(delete_layers(&w, &[7]).is_err());
    // Calibration with no whole chunk.
    let e = Calibration::from_token_stream([vec![5u32; 3]], None, 8, 64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("fewer than one chunk"), "{e}");
    assert!(Calibration::from_token_stream([vec![5u32; 30]], None, 8, 4).is_err());
}

/// The CLI on the real checkpoint: an HF directory that loads like any model, with the
/// tokenizer (chat template included) of the GGUF it came from.
#[test]
fn prune_cli_writes_a_loadable_model_on_smollm2() {
    let Some(model) = common::real_model() else {
        return;
    };
    let tmp = common::TempDir::new("prune-cli");
    let dir = tmp.join("pruned");
    let data = tmp.join("calib.jsonl");
    std::fs::write(
        &data,
        "{\"question\": \"What is 2 + 3?\", \"answer\": \"2 + 3 = 5\\n#### 5\"}\n\
         {\"text\": \"The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks were striking thirteen.\"}\n"
            .repeat(4),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(["prune", "--model"])
        .arg(&model)
        .args([
            "--method",
            "short-gpt",
            "--num-replaced",
            "8",
            "--calibration",
        ])
        .arg(&data)
        .args(["--calibration-tokens", "128", "--seq-len", "32", "--out"])
        .arg(&dir)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["removed_layers"].as_array().unwrap().len(), 8);
    assert_eq!(v["calibration_tokens"], 128);
    let (pruned, tok) = elm::model::load_pretrained(&dir).unwrap();
    assert_eq!(pruned.config.num_layers, 22);
    assert_eq!(v["params"].as_u64().unwrap() as usize, pruned.num_params());
    let (_, gguf_tok) = elm::model::load_pretrained(&model).unwrap();
    let chat = elm::eval::gsm8k::qa_prompt(&gguf_tok, "What is 7*8?");
    assert_eq!(elm::eval::gsm8k::qa_prompt(&tok, "What is 7*8?"), chat);
    assert_eq!(
        tok.encode(&chat, false).unwrap(),
        gguf_tok.encode(&chat, false).unwrap()
    );
    assert_eq!(tok.eos_id(), gguf_tok.eos_id());
    // The directory exists now: a second run without --force is refused.
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(["prune", "--model"])
        .arg(&model)
        .args(["--method", "la-co", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    // The removed layers' states really are gone: the pruned model's NLL is finite.
    let calib = calibration(1, 16, 7);
    let st = BoundaryStates::collect(&pruned, &calib, 1).unwrap();
    let nll = removal_nll(&pruned, &st, &calib, 0, 0, 1).unwrap();
    assert!(nll.is_finite());
}

/// Every pruning method round-trips through its name (`FromStr`, `Display`) and its JSON form,
/// iterating the library's one list, so a new method is covered without touching this test;
/// `elm prune --help` lists the same names.
#[test]
fn every_prune_method_round_trips_through_its_name_and_json() {
    use elm::registry::Registry;
    assert_eq!(PruneMethod::ALL.len(), PruneMethod::all().len());
    for m in PruneMethod::ALL {
        let name = m.name();
        assert_eq!(name.parse::<PruneMethod>().unwrap(), m, "{name}");
        assert_eq!(m.to_string(), name);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, format!("\"{name}\""), "serde name of {m:?}");
        assert_eq!(serde_json::from_str::<PruneMethod>(&json).unwrap(), m);
    }
    let names = PruneMethod::names();
    let unique: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "method names are unique");
    // The window methods are the ones `--start` may fix.
    let windows: Vec<_> = PruneMethod::ALL
        .into_iter()
        .filter(|m| m.is_window())
        .collect();
    assert_eq!(
        windows,
        [
            PruneMethod::WindowDelete,
            PruneMethod::ReplaceMeLs,
            PruneMethod::LaCo
        ]
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(["prune", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains(&format!("[possible values: {}]", names.join(", "))),
        "{help}"
    );
}
