//! Inference path on tiny random Llama / Qwen2 models:
//! - every forward vs a naive f64 full-recompute reference written here (plain loops,
//!   HF `rotate_half` RoPE, no cache, no BLAS);
//! - KV-cached decode == full recompute; batched (different lengths) == unbatched; decode at
//!   a long context (attention split over the thread team) == the prefill of the sequence;
//! - uncommitted block calls, masked decode, hidden states, cache bytes, typed errors.

mod common;

use common::tiny_transformer;
use elm::model::{
    block_forward_cached, block_forward_rows, Arch, KvCache, LayerKv, ModelConfig, ModelWeights,
    Scratch, Transformer,
};
use elm::ElmError;
use ndarray::{s, Array2, Array3, ArrayView2};

/// Naive f64 forward: logits `[T, V]` of one sequence, recomputed from scratch.
fn naive_logits(w: &ModelWeights, tokens: &[u32]) -> Array2<f64> {
    let cfg = &w.config;
    let (c, h, kv, d) = (
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
    );
    let t = tokens.len();
    let f = |a: &ndarray::Array2<f32>| a.mapv(|v| v as f64);
    let fv = |a: &ndarray::Array1<f32>| a.mapv(|v| v as f64);
    let rms = |x: &Array2<f64>, g: &ndarray::Array1<f32>| {
        let mut y = x.clone();
        for mut row in y.rows_mut() {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / c as f64;
            let inv = 1.0 / (ms + cfg.rms_norm_eps as f64).sqrt();
            for (v, &gi) in row.iter_mut().zip(g) {
                *v *= inv * gi as f64;
            }
        }
        y
    };
    let lin = |x: &Array2<f64>, w: &ndarray::Array2<f32>, b: &Option<ndarray::Array1<f32>>| {
        let mut y = x.dot(&f(w).t());
        if let Some(b) = b {
            y += &fv(b);
        }
        y
    };
    let rope = |x: &mut Array2<f64>, heads: usize| {
        for p in 0..t {
            for hh in 0..heads {
                let mut row = x.slice_mut(s![p, hh * d..(hh + 1) * d]);
                let orig = row.to_owned();
                for i in 0..d {
                    // HF: x * cos + rotate_half(x) * sin, rotate_half = cat(-x2, x1).
                    let j = i % (d / 2);
                    let ang = p as f64 * (cfg.rope_theta as f64).powf(-2.0 * j as f64 / d as f64);
                    let rot = if i < d / 2 {
                        -orig[i + d / 2]
                    } else {
                        orig[i - d / 2]
                    };
                    row[i] = orig[i] * ang.cos() + rot * ang.sin();
                }
            }
        }
    };
    let mut x = Array2::from_shape_fn((t, c), |(p, ci)| w.embed[[tokens[p] as usize, ci]] as f64);
    for lw in &w.layers {
        let xn = rms(&x, &lw.attn_norm);
        let mut q = lin(&xn, &lw.wq, &lw.bq);
        let mut k = lin(&xn, &lw.wk, &lw.bk);
        let v = lin(&xn, &lw.wv, &lw.bv);
        rope(&mut q, h);
        rope(&mut k, kv);
        let mut att = Array2::<f64>::zeros((t, h * d));
        for hh in 0..h {
            let g = hh / (h / kv);
            for i in 0..t {
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..d)
                            .map(|e| q[[i, hh * d + e]] * k[[j, g * d + e]])
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for (j, s) in scores.iter().enumerate() {
                    let p = (s - m).exp() / z;
                    for e in 0..d {
                        att[[i, hh * d + e]] += p * v[[j, g * d + e]];
                    }
                }
            }
        }
        x = x + lin(&att, &lw.wo, &None);
        let xn = rms(&x, &lw.mlp_norm);
        let gt = lin(&xn, &lw.w_gate, &None);
        let up = lin(&xn, &lw.w_up, &None);
        let act = ndarray::Zip::from(&gt)
            .and(&up)
            .map_collect(|&g, &u| g / (1.0 + (-g).exp()) * u);
        x = x + lin(&act, &lw.w_down, &None);
    }
    let xn = rms(&x, &w.final_norm);
    xn.dot(&f(w.lm_head()).t())
}

/// max |a - b| / max(|b|, 1) with a readable failure message.
fn assert_close(what: &str, a: ArrayView2<f32>, b: ArrayView2<f64>, tol: f64) {
    assert_eq!(a.dim(), b.dim(), "{what}: shapes");
    let mut max_abs = 0.0f64;
    let mut max_rel = 0.0f64;
    for (&x, &y) in a.iter().zip(b.iter()) {
        let diff = (x as f64 - y).abs();
        max_abs = max_abs.max(diff);
        max_rel = max_rel.max(diff / y.abs().max(1.0));
    }
    assert!(
        max_rel <= tol,
        "{what}: max abs diff {max_abs:.3e}, max rel diff {max_rel:.3e} > {tol:.1e}"
    );
}

fn f64v(a: ArrayView2<f32>) -> Array2<f64> {
    a.mapv(|v| v as f64)
}

const TOL: f64 = 2e-5;

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 17, 3, 60, 9, 33, 1],
        vec![11, 2],
        vec![40, 41, 42, 7, 8],
    ]
}

#[test]
fn forward_logits_match_naive_f64_reference() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let m = tiny_transformer(arch, 4, 7);
        for p in prompts() {
            let got = m.forward_logits(std::slice::from_ref(&p)).unwrap();
            let want = naive_logits(&m.weights, &p);
            assert_close(
                &format!("{arch:?} forward_logits"),
                got.slice(s![0, .., ..]),
                want.view(),
                TOL,
            );
        }
    }
}

#[test]
fn cached_decode_equals_full_recompute() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let m = tiny_transformer(arch, 4, 11);
        let seq: Vec<u32> = vec![3, 14, 15, 9, 26, 53, 58, 9, 7, 9, 32, 38];
        let prompt_len = 4;
        let mut cache = m.new_cache(1, seq.len()).unwrap();
        let mut logits = m
            .prefill(&[seq[..prompt_len].to_vec()], &mut cache)
            .unwrap();
        for pos in prompt_len..=seq.len() {
            let want = naive_logits(&m.weights, &seq[..pos]);
            assert_close(
                &format!("{arch:?} cached step at length {pos}"),
                logits.view(),
                want.slice(s![pos - 1..pos, ..]),
                TOL,
            );
            if pos < seq.len() {
                logits = m.decode_step(&[seq[pos]], &mut cache).unwrap();
            }
        }
        assert_eq!(cache.lens(), &[seq.len()]);
    }
}

/// A decode step past ~1,000 cached tokens has enough attention work to split its
/// (sequence, head) pairs over the thread team; each step's logits must equal the last row of
/// a prefill of the whole sequence (sgemm attention), for two ragged sequences of which one
/// sits a step out, with Gemma 3's sliding window too.
#[test]
fn long_context_decode_splits_attention_and_equals_prefill() {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Gemma3] {
        let cfg = ModelConfig {
            num_layers: 2,
            max_position_embeddings: 1200,
            ..ModelConfig::tiny(arch)
        };
        let m = Transformer::new(ModelWeights::random(&cfg, 41)).unwrap();
        let prompt_lens = [1100usize, 1050];
        let (seqs, prompts) = random_sequences(&mut rng, [1104, 1051], prompt_lens);
        let mut cache = m.new_cache(2, 1200).unwrap();
        m.prefill(&prompts, &mut cache).unwrap();
        let mut logits = Array2::zeros((2, cfg.vocab_size));
        for step in 0..4 {
            // Sequence 1 takes only the first step.
            let active = [true, step == 0];
            let tokens: Vec<u32> = (0..2)
                .map(|b| seqs[b][(prompt_lens[b] + step).min(seqs[b].len() - 1)])
                .collect();
            m.decode_step_into(&tokens, &active, &mut cache, &mut logits)
                .unwrap();
            for b in 0..2 {
                if !active[b] {
                    continue;
                }
                let len = prompt_lens[b] + step + 1;
                let mut single = m.new_cache(1, 1200).unwrap();
                let whole = m.prefill(&[seqs[b][..len].to_vec()], &mut single).unwrap();
                assert_close(
                    &format!("{arch:?} sequence {b} at length {len}"),
                    logits.slice(s![b..b + 1, ..]),
                    f64v(whole.view()).view(),
                    TOL,
                );
            }
        }
        assert_eq!(cache.lens(), &[1104, 1051]);
    }
}

#[test]
fn batched_prefill_and_decode_equal_unbatched() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let m = tiny_transformer(arch, 4, 13);
        let ps = prompts();
        let cont: Vec<Vec<u32>> = vec![vec![4, 5, 6], vec![7, 8, 9], vec![10, 11, 12]];
        let mut cache = m.new_cache(3, 16).unwrap();
        let mut batched = vec![m.prefill(&ps, &mut cache).unwrap()];
        for step in 0..3 {
            let toks: Vec<u32> = cont.iter().map(|c| c[step]).collect();
            batched.push(m.decode_step(&toks, &mut cache).unwrap());
        }
        assert_eq!(cache.lens(), &[10, 5, 8]);
        for (b, p) in ps.iter().enumerate() {
            let mut single = m.new_cache(1, 16).unwrap();
            let mut l = m.prefill(std::slice::from_ref(p), &mut single).unwrap();
            for step in 0..=3 {
                let want = f64v(l.view());
                // Batch 1 runs the row-sequential matvec, batch 3 sgemm: equal up to
                // f32 rounding, i.e. the bound each path meets against f64 (TOL).
                assert_close(
                    &format!("{arch:?} seq {b} step {step}"),
                    batched[step].slice(s![b..b + 1, ..]),
                    want.view(),
                    TOL,
                );
                if step < 3 {
                    l = m.decode_step(&[cont[b][step]], &mut single).unwrap();
                }
            }
        }
    }
}

#[test]
fn chunked_prefill_equals_single_prefill() {
    let m = tiny_transformer(Arch::Qwen2, 4, 17);
    let seq: Vec<u32> = (0..12).map(|i| (i * 7 % 64) as u32).collect();
    let mut one = m.new_cache(1, 12).unwrap();
    let want = m.prefill(std::slice::from_ref(&seq), &mut one).unwrap();
    let mut two = m.new_cache(1, 12).unwrap();
    m.prefill(&[seq[..5].to_vec()], &mut two).unwrap();
    let got = m.prefill(&[seq[5..].to_vec()], &mut two).unwrap();
    assert_close(
        "chunked prefill",
        got.view(),
        f64v(want.view()).view(),
        1e-5,
    );
}

#[test]
fn masked_decode_leaves_inactive_sequences_untouched() {
    let m = tiny_transformer(Arch::Llama, 4, 19);
    let ps = prompts();
    let mut cache = m.new_cache(3, 16).unwrap();
    m.prefill(&ps, &mut cache).unwrap();
    let mut logits = Array2::zeros((3, 64));
    m.decode_step_into(&[4, 5, 6], &[true, false, true], &mut cache, &mut logits)
        .unwrap();
    assert_eq!(cache.lens(), &[8, 2, 6]);
    // The inactive sequence continues exactly as if the step never happened.
    let l2 = m.decode_step(&[1, 9, 2], &mut cache).unwrap();
    let mut single = m.new_cache(1, 16).unwrap();
    m.prefill(&[ps[1].clone()], &mut single).unwrap();
    let want = m.decode_step(&[9], &mut single).unwrap();
    assert_close(
        "masked decode",
        l2.slice(s![1..2, ..]),
        f64v(want.view()).view(),
        1e-5,
    );
    let mut single0 = m.new_cache(1, 16).unwrap();
    m.prefill(&[ps[0].clone()], &mut single0).unwrap();
    let want0 = m.decode_step(&[4], &mut single0).unwrap();
    assert_close(
        "active row",
        logits.slice(s![0..1, ..]),
        f64v(want0.view()).view(),
        1e-5,
    );
}

#[test]
fn uncommitted_block_calls_do_not_extend_history() {
    let cfg = ModelConfig::tiny(Arch::Qwen2);
    let w = ModelWeights::random(&cfg, 23);
    let lw = &w.layers[0];
    let mut scratch = Scratch::new(&cfg, 16);
    let x0 = Array3::from_shape_fn((2, 3, cfg.hidden_size), |(b, t, c)| {
        ((b * 31 + t * 7 + c) as f32 * 0.37).sin()
    });
    let x1 = x0.mapv(|v| v * 0.5 + 0.1);
    let x_new = x0.mapv(|v| v.cos());

    // Reference: commit x0, then run x_new committed.
    let mut ref_cache = LayerKv::new(&cfg, 2, 16).unwrap();
    block_forward_cached(lw, &cfg, x0.view(), &mut ref_cache, true, &mut scratch).unwrap();
    let want_y1 =
        block_forward_cached(lw, &cfg, x1.view(), &mut ref_cache, true, &mut scratch).unwrap();
    let want_next =
        block_forward_cached(lw, &cfg, x_new.view(), &mut ref_cache, true, &mut scratch).unwrap();

    // Fixed-point style: several uncommitted iterates, then the final one committed.
    let mut cache = LayerKv::new(&cfg, 2, 16).unwrap();
    block_forward_cached(lw, &cfg, x0.view(), &mut cache, true, &mut scratch).unwrap();
    for it in 0..3 {
        let xi = x0.mapv(|v| v * it as f32);
        block_forward_cached(lw, &cfg, xi.view(), &mut cache, false, &mut scratch).unwrap();
        assert_eq!(cache.lens(), &[3, 3]);
        assert_eq!(cache.pending(), &[3, 3]);
    }
    let y1 = block_forward_cached(lw, &cfg, x1.view(), &mut cache, false, &mut scratch).unwrap();
    cache.commit();
    assert_eq!(cache.lens(), &[6, 6]);
    let next =
        block_forward_cached(lw, &cfg, x_new.view(), &mut cache, true, &mut scratch).unwrap();
    let flat = |a: &Array3<f32>| {
        a.clone()
            .into_shape_with_order((6, cfg.hidden_size))
            .unwrap()
    };
    assert_close(
        "final iterate",
        flat(&y1).view(),
        f64v(flat(&want_y1).view()).view(),
        1e-6,
    );
    assert_close(
        "after commit",
        flat(&next).view(),
        f64v(flat(&want_next).view()).view(),
        1e-6,
    );
}

#[test]
fn block_on_a_subset_of_sequences_equals_full_batch_and_leaves_others_alone() {
    let cfg = ModelConfig::tiny(Arch::Llama);
    let w = ModelWeights::random(&cfg, 29);
    let lw = &w.layers[0];
    let mut scratch = Scratch::new(&cfg, 16);
    let c = cfg.hidden_size;
    let hist = Array3::from_shape_fn((3, 4, c), |(b, t, k)| {
        ((b * 13 + t * 5 + k) as f32 * 0.21).sin()
    });
    let x = Array3::from_shape_fn((3, 2, c), |(b, t, k)| {
        ((b * 7 + t * 3 + k) as f32 * 0.4).cos()
    });

    // Reference: all three sequences, committed history then 2 uncommitted new tokens.
    let mut full = LayerKv::new(&cfg, 3, 16).unwrap();
    block_forward_cached(lw, &cfg, hist.view(), &mut full, true, &mut scratch).unwrap();
    let want = block_forward_cached(lw, &cfg, x.view(), &mut full, false, &mut scratch).unwrap();

    // Subset: sequences 2 and 0 (in that order) only; sequence 1 keeps its pending K/V.
    let mut part = LayerKv::new(&cfg, 3, 16).unwrap();
    block_forward_cached(lw, &cfg, hist.view(), &mut part, true, &mut scratch).unwrap();
    block_forward_cached(lw, &cfg, x.view(), &mut part, false, &mut scratch).unwrap();
    let before = part.clone();
    let mut xs = ndarray::concatenate![
        ndarray::Axis(0),
        x.slice(s![2..3, .., ..]),
        x.slice(s![0..1, .., ..])
    ];
    block_forward_rows(
        lw,
        &cfg,
        xs.view_mut(),
        &[2, 0],
        &[2, 1],
        &mut part,
        false,
        &mut scratch,
    )
    .unwrap();
    let flat = |a: ndarray::ArrayView2<f32>| a.to_owned();
    assert_close(
        "subset row 0 = sequence 2",
        flat(xs.slice(s![0, .., ..])).view(),
        f64v(want.slice(s![2, .., ..])).view(),
        1e-5,
    );
    assert_close(
        "subset row 1 = sequence 0, first token",
        flat(xs.slice(s![1, 0..1, ..])).view(),
        f64v(want.slice(s![0, 0..1, ..])).view(),
        1e-5,
    );
    assert_eq!(part.lens(), &[4, 4, 4]);
    assert_eq!(part.pending(), &[1, 2, 2]);
    assert_eq!(
        part.k.slice(s![1, .., .., ..]),
        before.k.slice(s![1, .., .., ..]),
        "sequence 1 not in the call: its cache must be untouched"
    );

    // copy_pending_from: sequence 0's single pending token lands in another cache.
    let mut other = LayerKv::new(&cfg, 3, 16).unwrap();
    block_forward_cached(lw, &cfg, hist.view(), &mut other, true, &mut scratch).unwrap();
    other.copy_pending_from(&part, 0).unwrap();
    assert_eq!(other.pending(), &[1, 0, 0]);
    assert_eq!(
        other.k.slice(s![0, .., 4, ..]),
        part.k.slice(s![0, .., 4, ..])
    );
    other.commit();
    assert_eq!(other.lens(), &[5, 4, 4]);
    // Mismatched committed lengths are refused.
    assert!(other.copy_pending_from(&part, 0).is_err());

    // Bad sequence ids are typed errors.
    for ids in [&[0usize, 0][..], &[0, 3][..], &[0][..]] {
        let e = block_forward_rows(
            lw,
            &cfg,
            xs.view_mut(),
            ids,
            &[1; 2][..ids.len()],
            &mut part,
            false,
            &mut scratch,
        )
        .unwrap_err();
        assert!(
            matches!(e, ElmError::InvalidArgument(_) | ElmError::Shape { .. }),
            "{e}"
        );
    }
}

#[test]
fn forward_hidden_states_compose_to_logits() {
    let m = tiny_transformer(Arch::Llama, 4, 29);
    let toks = vec![vec![1u32, 2, 3, 4, 5, 6], vec![9, 8, 7, 6, 5, 4]];
    let hs = m.forward_hidden(&toks).unwrap();
    assert_eq!(hs.len(), m.config().num_layers + 1);
    // hs[0] is the embedding.
    assert_eq!(hs[0].slice(s![1, 2, ..]), m.weights.embed.row(7));
    // run_layers over a sub-range reproduces the stored states.
    let mut cache = KvCache::new(m.config(), 2, 6).unwrap();
    let mid = m.run_layers(1..3, hs[1].view(), &mut cache).unwrap();
    let diff = (&mid - &hs[3])
        .mapv(f32::abs)
        .fold(0.0f32, |a, &b| a.max(b));
    assert!(
        diff < 1e-5,
        "run_layers(1..3) vs hidden state 3: max abs diff {diff:e}"
    );
    let last = hs.last().unwrap().slice(s![0, .., ..]).to_owned();
    let got = m.logits_from_hidden(last.view());
    let want = naive_logits(&m.weights, &toks[0]);
    assert_close("logits_from_hidden(final)", got.view(), want.view(), TOL);
}

#[test]
fn cache_bytes_are_exact_and_subsets_allowed() {
    let cfg = ModelConfig::tiny(Arch::Llama);
    let full = KvCache::new(&cfg, 3, 10).unwrap();
    let per_layer = 2 * 3 * cfg.num_kv_heads * 10 * cfg.head_dim * 4;
    assert_eq!(full.bytes(), cfg.num_layers * per_layer);
    let subset = KvCache::with_layers(&cfg, 2, 3, 10).unwrap();
    assert_eq!(subset.layers.len(), 2);
    assert_eq!(subset.bytes(), 2 * per_layer);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let m = tiny_transformer(Arch::Llama, 4, 31);
    let mut cache = m.new_cache(1, 4).unwrap();
    assert!(matches!(
        m.prefill(&[vec![1, 2, 3, 4, 5]], &mut cache),
        Err(ElmError::InvalidArgument(_))
    ));
    assert_eq!(cache.lens(), &[0], "failed prefill must not commit");
    assert!(matches!(
        m.prefill(&[vec![64]], &mut cache),
        Err(ElmError::InvalidArgument(_))
    ));
    assert!(matches!(
        m.prefill(&[vec![]], &mut cache),
        Err(ElmError::InvalidArgument(_))
    ));
    assert!(matches!(
        m.prefill(&[vec![1], vec![2]], &mut cache),
        Err(ElmError::Shape { .. })
    ));
    m.prefill(&[vec![1, 2, 3, 4]], &mut cache).unwrap();
    assert!(matches!(
        m.decode_step(&[1], &mut cache),
        Err(ElmError::InvalidArgument(_))
    ));
    assert!(KvCache::new(m.config(), 0, 4).is_err());

    let mut w = ModelWeights::random(&ModelConfig::tiny(Arch::Qwen2), 1);
    w.layers[2].wk = Array2::zeros((3, 3));
    match Transformer::new(w) {
        Err(ElmError::Tensor { name, .. }) => assert_eq!(name, "layers.2.wk"),
        other => panic!("expected tensor error, got {other:?}"),
    }
    let mut w = ModelWeights::random(&ModelConfig::tiny(Arch::Qwen2), 1);
    w.layers[0].bq = None;
    assert!(matches!(Transformer::new(w), Err(ElmError::Tensor { .. })));
}

/// The training path (`model::tape`, f32 tape) and the inference path give the same
/// logits and hidden states for the same weights.
#[test]
fn training_path_equals_inference_path() {
    use elm::autograd::Tape;
    use elm::model::tape::{ModelTensors, ModelVars, Trainable};
    // Gemma 3's tiny model attends through a window of 2 on its local layers: both paths
    // read the window from the one block description.
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Gemma3] {
        let m = tiny_transformer(arch, 4, 37);
        let toks = vec![vec![3u32, 1, 4, 1, 5, 9, 2], vec![6, 5, 3, 5, 8, 9, 7]];
        let (b, t) = (toks.len(), toks[0].len());
        let ids: Vec<usize> = toks.concat().iter().map(|&i| i as usize).collect();
        let tensors = ModelTensors::<f32>::from_weights(&m.weights).unwrap();
        let mut tape = Tape::<f32>::new();
        let vars = ModelVars::register(&mut tape, &tensors, &Trainable::none());
        let logits_var = vars.forward_logits(&mut tape, &ids, b, t).unwrap();
        let v = m.config().vocab_size;
        let train = tape
            .value(logits_var)
            .clone()
            .into_shape_with_order((b * t, v))
            .unwrap();
        let infer = m
            .forward_logits(&toks)
            .unwrap()
            .into_shape_with_order((b * t, v))
            .unwrap();
        assert_close(
            &format!("{arch:?} tape vs inference logits"),
            infer.view(),
            f64v(train.view()).view(),
            1e-5,
        );
        let hs = vars.hidden_states(&mut tape, &ids, b, t).unwrap();
        let ours = m.forward_hidden(&toks).unwrap();
        for (l, (hv, h)) in hs.iter().zip(&ours).enumerate() {
            let tape_h = tape
                .value(*hv)
                .clone()
                .into_shape_with_order((b * t, m.config().hidden_size))
                .unwrap();
            let h = h
                .clone()
                .into_shape_with_order((b * t, m.config().hidden_size))
                .unwrap();
            assert_close(
                &format!("{arch:?} hidden state {l}"),
                h.view(),
                f64v(tape_h.view()).view(),
                1e-5,
            );
        }
    }
}

#[test]
fn sequence_nll_matches_naive_log_softmax() {
    let m = tiny_transformer(Arch::Qwen2, 4, 41);
    let seq: Vec<u32> = vec![5, 9, 13, 2, 60, 61, 7, 7, 30];
    let (nll, count) = m.sequence_nll(&seq).unwrap();
    let logits = naive_logits(&m.weights, &seq);
    let want: f64 = (1..seq.len())
        .map(|t| {
            let row = logits.row(t - 1);
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            lse - row[seq[t] as usize]
        })
        .sum();
    assert_eq!(count, seq.len() - 1);
    assert!(
        (nll - want).abs() < 1e-4 * want.abs(),
        "nll {nll} vs naive {want} (abs diff {:.3e})",
        (nll - want).abs()
    );
    assert!(m.sequence_nll(&[1]).is_err());
}

/// Batch-1 linear layers split over rayon when OpenBLAS is single-threaded (the CLI
/// default); both paths agree with an f64 product.
#[test]
fn single_row_linear_matches_f64_for_both_blas_thread_settings() {
    use elm::model::ops::{blas_threads, linear_into, set_blas_threads};
    let w = Array2::from_shape_fn((700, 33), |(i, j)| {
        ((i * 13 + j * 7) % 17) as f32 * 0.1 - 0.8
    });
    let x = Array2::from_shape_fn((1, 33), |(_, j)| (j as f32 * 0.3).sin());
    let want = f64v(x.view()).dot(&f64v(w.view()).t());
    let before = blas_threads();
    for threads in [1, 2] {
        set_blas_threads(threads);
        let mut y = Array2::zeros((1, 700));
        linear_into(x.view(), w.view(), None, y.view_mut());
        assert_close(
            &format!("linear, {threads} BLAS threads"),
            y.view(),
            want.view(),
            1e-6,
        );
    }
    set_blas_threads(before);
}

/// Two random sequences of `lens` tokens (ids 3..64) and their first `prompt_lens` tokens.
fn random_sequences(
    rng: &mut impl rand::Rng,
    lens: [usize; 2],
    prompt_lens: [usize; 2],
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let seqs: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(3..64)).collect())
        .collect();
    let prompts = seqs
        .iter()
        .zip(prompt_lens)
        .map(|(s, n)| s[..n].to_vec())
        .collect();
    (seqs, prompts)
}

/// A tiny Gemma 3 (a local layer, then a global one) with room for long prompts and local
/// window `window`.
fn windowed_gemma(window: usize, max_seq: usize) -> ModelConfig {
    ModelConfig {
        num_layers: 2,
        max_position_embeddings: max_seq,
        sliding_window: Some(window),
        ..ModelConfig::tiny(Arch::Gemma3)
    }
}

/// The sliding cache of a local layer (`Transformer::new_cache`) keeps `window − 1 +
/// PREFILL_CHUNK` positions instead of all of them, and gives the full cache's logits past
/// the window: a chunked prefill of two ragged prompts longer than two chunks, then decode
/// steps of which one sequence takes only the first.
#[test]
fn sliding_window_cache_equals_the_full_cache_past_the_window() {
    use elm::model::PREFILL_CHUNK;
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(57);
    for window in [2usize, 40] {
        let cfg = windowed_gemma(window, 1600);
        let m = Transformer::new(ModelWeights::random(&cfg, 43)).unwrap();
        let prompt_lens = [1300usize, 900];
        let (seqs, prompts) = random_sequences(&mut rng, [1310, 905], prompt_lens);
        let mut sliding = m.new_cache(2, 1600).unwrap();
        let mut full = KvCache::new(&cfg, 2, 1600).unwrap();
        assert_eq!(sliding.layers[0].window(), Some(window));
        assert_eq!(sliding.layers[0].slots(), window - 1 + PREFILL_CHUNK);
        assert_eq!(
            sliding.layers[1].window(),
            None,
            "the global layer keeps everything"
        );
        assert!(sliding.bytes() < full.bytes());
        let a = m.prefill(&prompts, &mut sliding).unwrap();
        let b = m.prefill(&prompts, &mut full).unwrap();
        assert_close(
            &format!("window {window}: prefill"),
            a.view(),
            f64v(b.view()).view(),
            TOL,
        );
        // The local layer dropped what no query can see any more: before the third chunk
        // (positions 1024..1300) it kept the last window − 1 positions before 1024.
        assert_eq!(sliding.layers[0].first()[0], 1024 + 1 - window);
        let mut la = Array2::zeros((2, cfg.vocab_size));
        let mut lb = Array2::zeros((2, cfg.vocab_size));
        for step in 0..10 {
            let active = [true, step == 0];
            let tokens: Vec<u32> = (0..2)
                .map(|b| seqs[b][(prompt_lens[b] + step).min(seqs[b].len() - 1)])
                .collect();
            m.decode_step_into(&tokens, &active, &mut sliding, &mut la)
                .unwrap();
            m.decode_step_into(&tokens, &active, &mut full, &mut lb)
                .unwrap();
            for (b, &on) in active.iter().enumerate() {
                if on {
                    assert_close(
                        &format!("window {window}: sequence {b}, decode step {step}"),
                        la.slice(s![b..b + 1, ..]),
                        f64v(lb.slice(s![b..b + 1, ..])).view(),
                        TOL,
                    );
                }
            }
        }
        assert_eq!(sliding.lens(), &[1310, 901]);
        assert_eq!(
            sliding.layers[0].slots(),
            window - 1 + PREFILL_CHUNK,
            "no growth"
        );
    }
}

/// One call of more new tokens than a sliding cache's spare slots grows it; uncommitted calls
/// (a fixed-point solve's iterates) leave the history alone; what the cache dropped cannot be
/// truncated back to; and a block whose window is wider than the cache's (or that has none) is
/// refused rather than given too few keys.
#[test]
fn sliding_cache_grows_keeps_uncommitted_calls_apart_and_refuses_what_it_dropped() {
    let window = 40;
    let cfg = windowed_gemma(window, 2000);
    let w = ModelWeights::random(&cfg, 47);
    let local = &w.layers[0];
    let mut scratch = Scratch::new(&cfg, 2000);
    let x = |t: usize, seed: f32| {
        Array3::from_shape_fn((1, t, cfg.hidden_size), |(_, t, c)| {
            ((t * 13 + c) as f32 * 0.11 + seed).sin()
        })
    };
    let mut sliding = LayerKv::sliding(&cfg, 1, 2000, window).unwrap();
    let mut full = LayerKv::new(&cfg, 1, 2000).unwrap();
    let flat = |a: &Array3<f32>| {
        let t = a.dim().1;
        a.clone()
            .into_shape_with_order((t, cfg.hidden_size))
            .unwrap()
    };
    let mut compare =
        |what: &str, xs: &Array3<f32>, commit: bool, s: &mut LayerKv, f: &mut LayerKv| {
            let a = block_forward_cached(local, &cfg, xs.view(), s, commit, &mut scratch).unwrap();
            let b = block_forward_cached(local, &cfg, xs.view(), f, commit, &mut scratch).unwrap();
            assert_close(what, flat(&a).view(), f64v(flat(&b).view()).view(), TOL);
        };
    compare(
        "700 tokens at once",
        &x(700, 0.0),
        true,
        &mut sliding,
        &mut full,
    );
    assert_eq!(sliding.slots(), 700, "grown to the call");
    for it in 0..3 {
        compare(
            &format!("uncommitted iterate {it}"),
            &x(600, it as f32),
            false,
            &mut sliding,
            &mut full,
        );
        assert_eq!(sliding.lens(), &[700]);
    }
    compare(
        "committed iterate",
        &x(600, 5.0),
        true,
        &mut sliding,
        &mut full,
    );
    assert_eq!(sliding.lens(), &[1300]);
    assert_eq!(sliding.first(), &[700 + 1 - window]);
    compare(
        "after the commit",
        &x(3, 9.0),
        true,
        &mut sliding,
        &mut full,
    );

    // From position 700 on, a query still sees only kept keys (661..); from 650 it would not.
    let err = sliding.truncate(0, 650).unwrap_err().to_string();
    assert!(err.contains("sliding"), "{err}");
    sliding.truncate(0, 700).unwrap();

    let mut narrow = LayerKv::sliding(&cfg, 1, 2000, window - 1).unwrap();
    let err = block_forward_cached(
        local,
        &cfg,
        x(3, 0.0).view(),
        &mut narrow,
        true,
        &mut scratch,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("sliding KV cache of window 39"), "{err}");
    let global = &w.layers[1];
    let err = block_forward_cached(
        global,
        &cfg,
        x(3, 0.0).view(),
        &mut narrow,
        true,
        &mut scratch,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("every earlier key"), "{err}");
}
