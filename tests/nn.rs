//! Layer ops of `elm::nn`: f64 gradchecks (relative ∞-norm error < 1e-6) for every op,
//! plus analytic properties that pin the forward passes (RoPE rotation/relative position,
//! causal masking, GQA head sharing, CE of uniform logits, ignore index, masks).

use elm::autograd::{gradcheck, Tape, Var};
use elm::nn::{self, RopeLayout, IGNORE_INDEX};
use elm::Result;
use ndarray::{s, ArrayD, IxDyn};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn rand_arr(rng: &mut StdRng, shape: &[usize]) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(shape), |_| rng.gen_range(-1.0..1.0))
}

fn check<F>(name: &str, f: F, inputs: &[ArrayD<f64>])
where
    F: Fn(&mut Tape<f64>, &[Var]) -> Result<Var>,
{
    let r = gradcheck(f, inputs, 1e-6).expect("gradcheck ran");
    println!("{name}: {r}");
    assert!(r.max_abs_grad > 1e-3, "{name}: vacuous check: {r}");
    assert!(r.max_rel_err < 1e-6, "{name}: {r}");
}

fn max_abs_diff(a: &ArrayD<f64>, b: &ArrayD<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn gradcheck_rms_norm() {
    let mut rng = StdRng::seed_from_u64(10);
    let x = rand_arr(&mut rng, &[2, 3, 6]);
    let g = rand_arr(&mut rng, &[6]).mapv(|v| 1.0 + 0.5 * v);
    check(
        "rms_norm",
        |t, v| nn::rms_norm(t, v[0], v[1], 1e-5),
        &[x, g],
    );
}

#[test]
fn rms_norm_matches_definition() {
    let x = ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![3.0, 4.0]).unwrap();
    let g = ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.0, 2.0]).unwrap();
    let (y, _) = nn::rmsnorm::forward(&x, &g, 0.0).unwrap();
    // rms = sqrt((9 + 16) / 2)
    let r = (12.5f64).sqrt();
    assert!((y[[0, 0]] - 3.0 / r).abs() < 1e-15 && (y[[0, 1]] - 8.0 / r).abs() < 1e-15);
}

#[test]
fn gradcheck_swiglu_and_embedding() {
    let mut rng = StdRng::seed_from_u64(11);
    let gate = rand_arr(&mut rng, &[2, 3, 5]).mapv(|v| 3.0 * v);
    let up = rand_arr(&mut rng, &[2, 3, 5]);
    check("swiglu", |t, v| nn::swiglu(t, v[0], v[1]), &[gate, up]);
    let table = rand_arr(&mut rng, &[7, 4]);
    let ids = [3usize, 0, 3, 6, 1, 3];
    check(
        "embedding",
        |t, v| nn::embedding(t, v[0], &ids, &[2, 3]),
        std::slice::from_ref(&table),
    );
    let mut tape = Tape::<f64>::new();
    let tv = tape.param(table);
    assert!(
        nn::embedding(&mut tape, tv, &[7], &[1]).is_err(),
        "id out of range"
    );
    assert!(
        nn::embedding(&mut tape, tv, &[1, 2], &[3]).is_err(),
        "ids vs shape"
    );
}

#[test]
fn gradcheck_rope_both_layouts() {
    let mut rng = StdRng::seed_from_u64(12);
    let x = rand_arr(&mut rng, &[2, 3, 2, 8]);
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        check(
            &format!("rope {layout:?}"),
            |t, v| nn::rope(t, v[0], 10000.0, 5, layout),
            std::slice::from_ref(&x),
        );
    }
}

#[test]
fn rope_is_a_rotation_with_relative_positions() {
    let mut rng = StdRng::seed_from_u64(13);
    let d = 8;
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        // q·k after RoPE depends only on the position difference.
        let q = rand_arr(&mut rng, &[1, 1, 1, d]);
        let k = rand_arr(&mut rng, &[1, 1, 1, d]);
        let dot_at = |pq: usize, pk: usize| -> f64 {
            let qr = nn::rope::rotate(&q, 100.0, pq, layout, false).unwrap();
            let kr = nn::rope::rotate(&k, 100.0, pk, layout, false).unwrap();
            (&qr * &kr).sum()
        };
        assert!((dot_at(7, 3) - dot_at(14, 10)).abs() < 1e-12, "{layout:?}");
        assert!(
            (dot_at(7, 3) - dot_at(3, 7)).abs() > 1e-6,
            "{layout:?}: not trivially symmetric"
        );
        // Position 0 is the identity; norms are preserved.
        let r0 = nn::rope::rotate(&q, 100.0, 0, layout, false).unwrap();
        assert!(max_abs_diff(&r0, &q) < 1e-15);
        let r9 = nn::rope::rotate(&q, 100.0, 9, layout, false).unwrap();
        assert!(((&r9 * &r9).sum() - (&q * &q).sum()).abs() < 1e-12);
    }
    // The two layouts are the same rotation under the channel permutation
    // interleaved[2i + j] = half_split[i + j·D/2].
    let x = rand_arr(&mut rng, &[1, 2, 1, d]);
    let perm: Vec<usize> = (0..d).map(|c| (c % 2) * (d / 2) + c / 2).collect();
    let xi = ArrayD::from_shape_fn(IxDyn(&[1, 2, 1, d]), |i| x[[i[0], i[1], i[2], perm[i[3]]]]);
    let yh = nn::rope::rotate(&x, 10000.0, 4, RopeLayout::HalfSplit, false).unwrap();
    let yi = nn::rope::rotate(&xi, 10000.0, 4, RopeLayout::Interleaved, false).unwrap();
    let yh_perm =
        ArrayD::from_shape_fn(IxDyn(&[1, 2, 1, d]), |i| yh[[i[0], i[1], i[2], perm[i[3]]]]);
    assert!(max_abs_diff(&yh_perm, &yi) < 1e-14);
    // Analytic: first plane at position p rotates by angle p (θ_0 = 1).
    let mut e = ArrayD::zeros(IxDyn(&[1, 1, 1, d]));
    e[[0, 0, 0, 0]] = 1.0;
    let y = nn::rope::rotate(&e, 10000.0, 2, RopeLayout::HalfSplit, false).unwrap();
    assert!(
        (y[[0, 0, 0, 0]] - 2f64.cos()).abs() < 1e-15
            && (y[[0, 0, 0, d / 2]] - 2f64.sin()).abs() < 1e-15
    );
}

#[test]
fn gradcheck_attention_gqa() {
    let mut rng = StdRng::seed_from_u64(14);
    let (b, t, h, kv, d) = (2, 4, 4, 2, 4);
    let q = rand_arr(&mut rng, &[b, t, h, d]);
    let k = rand_arr(&mut rng, &[b, t, kv, d]);
    let v = rand_arr(&mut rng, &[b, t, kv, d]);
    check(
        "attention",
        |tp, x| nn::attention(tp, x[0], x[1], x[2], None, None),
        &[q.clone(), k.clone(), v.clone()],
    );
    let kp = rand_arr(&mut rng, &[b, 3, kv, d]);
    let vp = rand_arr(&mut rng, &[b, 3, kv, d]);
    check(
        "attention+prefix",
        |tp, x| nn::attention(tp, x[0], x[1], x[2], Some((x[3], x[4])), None),
        &[q, k, v, kp, vp],
    );
}

#[test]
fn attention_is_causal_and_shares_kv_heads() {
    let mut rng = StdRng::seed_from_u64(15);
    let (t, h, kv, d) = (5, 4, 2, 4);
    let q = rand_arr(&mut rng, &[1, t, h, d]);
    let k = rand_arr(&mut rng, &[1, t, kv, d]);
    let v = rand_arr(&mut rng, &[1, t, kv, d]);
    let (out, _) = nn::attention::forward(&q, &k, &v, None).unwrap();
    // Position 0 sees only key 0: out = v[0] of its KV head.
    for hi in 0..h {
        let want = v.slice(s![0, 0, hi / 2, ..]).to_owned();
        let got = out.slice(s![0, 0, hi, ..]).to_owned();
        assert!((&want - &got).iter().all(|e| e.abs() < 1e-15));
    }
    // Changing the last key/value leaves earlier outputs unchanged.
    let mut k2 = k.clone();
    let mut v2 = v.clone();
    k2.slice_mut(s![0, t - 1, .., ..]).fill(5.0);
    v2.slice_mut(s![0, t - 1, .., ..]).fill(-5.0);
    let (out2, _) = nn::attention::forward(&q, &k2, &v2, None).unwrap();
    let early = |o: &ArrayD<f64>| o.slice(s![.., ..t - 1, .., ..]).to_owned().into_dyn();
    assert!(max_abs_diff(&early(&out), &early(&out2)) < 1e-15);
    assert!(max_abs_diff(&out, &out2) > 1e-3);
    // Explicit reference for the last position of head 3 (KV head 1).
    let qh = q.slice(s![0, t - 1, 3, ..]);
    let scores: Vec<f64> = (0..t)
        .map(|si| (&qh * &k.slice(s![0, si, 1, ..])).sum() / (d as f64).sqrt())
        .collect();
    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
    let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
    let mut want = ndarray::Array1::<f64>::zeros(d);
    for (si, sc) in scores.iter().enumerate() {
        want = want + v.slice(s![0, si, 1, ..]).to_owned() * ((sc - m).exp() / z);
    }
    let got = out.slice(s![0, t - 1, 3, ..]).to_owned();
    assert!((&want - &got).iter().all(|e| e.abs() < 1e-14));
    // A KV prefix equals running on the concatenated sequence and keeping the last rows.
    let (full, _) = nn::attention::forward(&q, &k, &v, None).unwrap();
    let q_tail = q.slice(s![.., 2.., .., ..]).to_owned().into_dyn();
    let (tail, _) = nn::attention::forward(&q_tail, &k, &v, None).unwrap();
    let full_tail = full.slice(s![.., 2.., .., ..]).to_owned().into_dyn();
    assert!(max_abs_diff(&tail, &full_tail) < 1e-14);
    // Bad shapes are typed errors.
    assert!(nn::attention::forward(
        &q,
        &k.slice(s![.., ..2, .., ..]).to_owned().into_dyn(),
        &v,
        None
    )
    .is_err());
}

#[test]
fn gradcheck_cross_entropy_with_ignore() {
    let mut rng = StdRng::seed_from_u64(16);
    let logits = rand_arr(&mut rng, &[2, 3, 5]).mapv(|x| 2.0 * x);
    let targets = [1i64, IGNORE_INDEX, 4, 0, IGNORE_INDEX, 2];
    check(
        "cross_entropy",
        |t, v| nn::cross_entropy(t, v[0], &targets, IGNORE_INDEX),
        std::slice::from_ref(&logits),
    );
    // Ignored rows get exactly zero gradient.
    let mut tape = Tape::<f64>::new();
    let l = tape.param(logits.clone());
    let loss = nn::cross_entropy(&mut tape, l, &targets, IGNORE_INDEX).unwrap();
    let g = tape.backward(loss).unwrap();
    let g = g.get(l).unwrap();
    assert!(g.slice(s![0, 1, ..]).iter().all(|&x| x == 0.0));
    assert!(g.slice(s![1, 1, ..]).iter().all(|&x| x == 0.0));
    // Mean over the 4 counted tokens, by hand.
    let mut want = 0.0;
    for (r, &tg) in targets.iter().enumerate() {
        if tg == IGNORE_INDEX {
            continue;
        }
        let row = logits.slice(s![r / 3, r % 3, ..]);
        want += row.iter().map(|x| x.exp()).sum::<f64>().ln() - row[tg as usize];
    }
    let (got, counted) = nn::loss::cross_entropy_forward(&logits, &targets, IGNORE_INDEX).unwrap();
    assert_eq!(counted, 4);
    assert!((got - want / 4.0).abs() < 1e-14);
    // Uniform logits → ln V.
    let (u, _) =
        nn::loss::cross_entropy_forward(&ArrayD::<f64>::zeros(IxDyn(&[1, 5])), &[3], IGNORE_INDEX)
            .unwrap();
    assert!((u - 5f64.ln()).abs() < 1e-15);
    assert!(nn::loss::cross_entropy_forward(&logits, &[5, 0, 0, 0, 0, 0], IGNORE_INDEX).is_err());
    assert!(nn::loss::cross_entropy_forward(&logits, &[0, 0], IGNORE_INDEX).is_err());
}

#[test]
fn gradcheck_masked_mse() {
    let mut rng = StdRng::seed_from_u64(17);
    let p = rand_arr(&mut rng, &[2, 3, 4]);
    let tg = rand_arr(&mut rng, &[2, 3, 4]);
    let mask = [true, false, true, true, false, true];
    check(
        "masked_mse",
        |t, v| nn::masked_mse(t, v[0], v[1], &mask),
        &[p.clone(), tg.clone()],
    );
    let (l, n) = nn::loss::masked_mse_forward(&p, &tg, &mask).unwrap();
    assert_eq!(n, 4);
    let mut want = 0.0;
    for (r, &m) in mask.iter().enumerate() {
        if m {
            want += (&p.slice(s![r / 3, r % 3, ..]) - &tg.slice(s![r / 3, r % 3, ..]))
                .mapv(|x| x * x)
                .sum();
        }
    }
    assert!((l - want / 16.0).abs() < 1e-15);
    assert!(nn::loss::masked_mse_forward(&p, &tg, &mask[..5]).is_err());
}

#[test]
fn gradcheck_lora_linear() {
    let mut rng = StdRng::seed_from_u64(18);
    let x = rand_arr(&mut rng, &[2, 3, 5]);
    let w = rand_arr(&mut rng, &[4, 5]);
    let a = rand_arr(&mut rng, &[2, 5]);
    let b = rand_arr(&mut rng, &[4, 2]);
    let bias = rand_arr(&mut rng, &[4]);
    check(
        "lora+bias",
        |t, v| nn::lora_linear(t, v[0], v[1], Some(v[4]), v[2], v[3], 0.5, None),
        &[x.clone(), w.clone(), a.clone(), b.clone(), bias],
    );
    check(
        "lora",
        |t, v| nn::lora_linear(t, v[0], v[1], None, v[2], v[3], 2.0, None),
        &[x.clone(), w.clone(), a.clone(), b.clone()],
    );
    // Frozen base: only A, B (and x) receive gradients; B = 0 makes it the base layer.
    let mut tape = Tape::<f64>::new();
    let (xv, wv) = (tape.param(x.clone()), tape.constant(w.clone()));
    let (av, bv) = (tape.param(a), tape.param(ArrayD::zeros(IxDyn(&[4, 2]))));
    let y = nn::lora_linear(&mut tape, xv, wv, None, av, bv, 1.0, None).unwrap();
    let base = elm::autograd::ops::linear_forward(&x, &w, None).unwrap();
    assert!(max_abs_diff(tape.value(y), &base) < 1e-15);
    let l = tape.sum(y);
    let g = tape.backward(l).unwrap();
    assert!(g.get(wv).is_none() && g.get(bv).is_some() && g.get(xv).is_some());
}

#[test]
fn dropout_mask_is_one_standard_uniform_per_element() {
    use elm::nn::lora::Dropout;
    let (n, p) = (1003, 0.3f32);
    let mut bulk = StdRng::seed_from_u64(4);
    let mut each = StdRng::seed_from_u64(4);
    let d = Dropout::<f64>::draw(&mut bulk, n, p);
    let m = d.apply(&ArrayD::from_elem(IxDyn(&[n]), 1.0));
    let scale = (1.0 / (1.0 - p)) as f64;
    let mut kept = 0;
    for &v in m.iter() {
        let want = if each.gen::<f32>() < 1.0 - p {
            scale
        } else {
            0.0
        };
        assert_eq!(v, want);
        kept += (v != 0.0) as usize;
    }
    // Both outcomes occur, near the expected share, and both generators end in the same state.
    assert!((600..800).contains(&kept), "{kept} of {n} kept");
    assert_eq!(bulk.gen::<u64>(), each.gen::<u64>());
}

#[test]
fn gradcheck_lora_linear_with_dropout_and_equals_the_unfused_ops() {
    use elm::nn::lora::{lora_linear, Dropout};
    let mut rng = StdRng::seed_from_u64(19);
    let x = rand_arr(&mut rng, &[2, 3, 5]);
    let w = rand_arr(&mut rng, &[4, 5]);
    let a = rand_arr(&mut rng, &[2, 5]);
    let b = rand_arr(&mut rng, &[4, 2]);
    let bias = rand_arr(&mut rng, &[4]);
    let mask = || Dropout::<f64>::draw(&mut StdRng::seed_from_u64(7), 30, 0.4);
    check(
        "lora+dropout+bias",
        |t, v| lora_linear(t, v[0], v[1], Some(v[4]), v[2], v[3], 0.5, Some(mask())),
        &[x.clone(), w.clone(), a.clone(), b.clone(), bias.clone()],
    );
    check(
        "lora+dropout",
        |t, v| lora_linear(t, v[0], v[1], None, v[2], v[3], 2.0, Some(mask())),
        &[x.clone(), w.clone(), a.clone(), b.clone()],
    );
    // The same map written with the tape's primitives: base + s·((x ⊙ m) Aᵀ) Bᵀ.
    let run = |fused: bool| {
        let mut tape = Tape::<f64>::new();
        let v: Vec<Var> = [&x, &w, &a, &b, &bias]
            .iter()
            .map(|t| tape.param((*t).clone()))
            .collect();
        let y = if fused {
            lora_linear(
                &mut tape,
                v[0],
                v[1],
                Some(v[4]),
                v[2],
                v[3],
                0.5,
                Some(mask()),
            )
            .unwrap()
        } else {
            let ones = ArrayD::from_elem(IxDyn(&[2, 3, 5]), 1.0);
            let m = tape.constant(mask().apply(&ones));
            let base = tape.matmul_t(v[0], v[1], Some(v[4])).unwrap();
            let xd = tape.mul(v[0], m).unwrap();
            let xa = tape.matmul_t(xd, v[2], None).unwrap();
            let low = tape.matmul_t(xa, v[3], None).unwrap();
            let low = tape.scale(low, 0.5);
            tape.add(base, low).unwrap()
        };
        let value = tape.value(y).clone();
        let sq = tape.mul(y, y).unwrap();
        let l = tape.sum(sq);
        let g = tape.backward(l).unwrap();
        let grads: Vec<ArrayD<f64>> = v.iter().map(|&p| g.get(p).unwrap().clone()).collect();
        (value, grads)
    };
    let (y0, g0) = run(false);
    let (y1, g1) = run(true);
    assert!(max_abs_diff(&y0, &y1) < 1e-14);
    for (i, (p, q)) in g0.iter().zip(&g1).enumerate() {
        assert!(max_abs_diff(p, q) < 1e-13, "input {i}");
    }
}

/// GeGLU (tanh GELU) against f64 finite differences, over a range that reaches the tanh's
/// saturation, and its values at fixed points against the defining formula evaluated by Python's
/// `math` in float64 (`0.5*x*(1+math.tanh(math.sqrt(2/math.pi)*(x+0.044715*x**3)))`), which
/// catches a wrong constant that a gradient check alone would not.
#[test]
fn gradcheck_geglu_and_gelu_tanh_values() {
    let mut rng = StdRng::seed_from_u64(31);
    let gate = rand_arr(&mut rng, &[2, 3, 6]).mapv(|x| 4.0 * x);
    let up = rand_arr(&mut rng, &[2, 3, 6]);
    check("geglu", |t, v| nn::geglu(t, v[0], v[1]), &[gate, up]);
    // (x, gelu_tanh(x)) printed by the Python expression above.
    let torch: [(f64, f64); 4] = [
        (-3.0, -0.0036373920817729943),
        (-1.0, -0.15880800939172324),
        (0.5, 0.34571400982514394),
        (2.0, 1.954597694087775),
    ];
    let xs = ArrayD::from_shape_vec(IxDyn(&[4]), torch.iter().map(|p| p.0).collect()).unwrap();
    let ones = ArrayD::from_elem(IxDyn(&[4]), 1.0);
    let y = nn::geglu::forward(&xs, &ones).unwrap();
    for (got, (x, want)) in y.iter().zip(torch) {
        assert!(
            (got - want).abs() < 1e-12,
            "gelu_tanh({x}) = {got}, Python {want}"
        );
    }
}

/// The f32 GeGLU (vectorised σ) against the defining formula in f64 over a grid through
/// both saturations: within a few ulp times the function's conditioning, where `1 + tanh(u)`
/// in f32 loses every digit for very negative gates; and the inference kernel gives the training
/// forward's values bit for bit (one definition).
#[test]
fn f32_geglu_tracks_the_f64_formula_and_inference_matches_training() {
    let xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 0.0025).collect();
    let gate = ArrayD::from_shape_vec(IxDyn(&[xs.len()]), xs.clone()).unwrap();
    let ones = ArrayD::from_elem(IxDyn(&[xs.len()]), 1.0f32);
    let y = nn::geglu::forward(&gate, &ones).unwrap();
    for (&got, &x) in y.iter().zip(&xs) {
        let x64 = x as f64;
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3));
        // `½·x·(1 + tanh(u))` written without its cancellation (f64's `1 + tanh(u)` is 0
        // below u ≈ −19); the tanh form itself is checked against Python above.
        let want = x64 / (1.0 + (-2.0 * u).exp());
        // σ(2u) ≈ e^{2u} for very negative u amplifies the f32 rounding of u by |2u|: that
        // conditioning, a few ulp each, and f32's smallest normal bound the error.
        let err = (got as f64 - want).abs();
        assert!(
            err <= 1e-6 * (1.0 + 2.0 * u.abs()) * want.abs() + 1e-37,
            "gelu_tanh({x}) = {got}, f64 {want} (|err| {err:e})"
        );
    }
    let mut inference = xs.clone();
    let up: Vec<f32> = xs.iter().map(|x| 1.0 - 0.1 * x).collect();
    elm::model::ops::geglu_tanh_inplace(&mut inference, &up);
    let up_arr = ArrayD::from_shape_vec(IxDyn(&[xs.len()]), up).unwrap();
    let training = nn::geglu::forward(&gate, &up_arr).unwrap();
    assert_eq!(inference, training.into_raw_vec_and_offset().0);
}

/// Sliding-window attention: finite differences (with and without a KV prefix), every query
/// sees exactly its last `w` keys (explicit reference), and a window at least as long as the
/// sequence is plain causal attention.
#[test]
fn windowed_attention_masks_old_keys_and_gradchecks() {
    let mut rng = StdRng::seed_from_u64(32);
    let (b, t, h, kv, d, w) = (1, 6, 2, 1, 4, 3);
    let q = rand_arr(&mut rng, &[b, t, h, d]);
    let k = rand_arr(&mut rng, &[b, t, kv, d]);
    let v = rand_arr(&mut rng, &[b, t, kv, d]);
    check(
        "attention window",
        |tp, x| nn::attention(tp, x[0], x[1], x[2], None, Some(w)),
        &[q.clone(), k.clone(), v.clone()],
    );
    let kp = rand_arr(&mut rng, &[b, 2, kv, d]);
    let vp = rand_arr(&mut rng, &[b, 2, kv, d]);
    check(
        "attention window+prefix",
        |tp, x| nn::attention(tp, x[0], x[1], x[2], Some((x[3], x[4])), Some(w)),
        &[q.clone(), k.clone(), v.clone(), kp, vp],
    );
    let (out, cache) = nn::attention::forward(&q, &k, &v, Some(w)).unwrap();
    for ti in 0..t {
        let first = (ti + 1).saturating_sub(w);
        for hi in 0..h {
            let qh = q.slice(s![0, ti, hi, ..]);
            let sc: Vec<f64> = (first..=ti)
                .map(|si| (&qh * &k.slice(s![0, si, 0, ..])).sum() / (d as f64).sqrt())
                .collect();
            let m = sc.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            let mut want = ndarray::Array1::<f64>::zeros(d);
            for (j, x) in sc.iter().enumerate() {
                want = want + v.slice(s![0, first + j, 0, ..]).to_owned() * ((x - m).exp() / z);
            }
            let got = out.slice(s![0, ti, hi, ..]).to_owned();
            assert!((&want - &got).iter().all(|e| e.abs() < 1e-14));
            // Keys outside the window carry exactly zero probability.
            for si in (0..first).chain(ti + 1..t) {
                assert_eq!(cache.probs[[0, hi, ti, si]], 0.0);
            }
        }
    }
    let (wide, _) = nn::attention::forward(&q, &k, &v, Some(t)).unwrap();
    let (causal, _) = nn::attention::forward(&q, &k, &v, None).unwrap();
    assert!(max_abs_diff(&wide, &causal) == 0.0);
    assert!(nn::attention::forward(&q, &k, &v, Some(0)).is_err());
}

/// Gemma 3's per-head q/k norm is RMSNorm over the last axis of `[B, T, H, D]` with a `[D]`
/// gain: finite differences through the 4-D form.
#[test]
fn gradcheck_rms_norm_per_head() {
    let mut rng = StdRng::seed_from_u64(33);
    let x = rand_arr(&mut rng, &[2, 3, 2, 4]);
    let g = rand_arr(&mut rng, &[4]).mapv(|v| 1.0 + v);
    check(
        "rms_norm per head",
        |t, v| nn::rms_norm(t, v[0], v[1], 1e-6),
        &[x, g],
    );
}
