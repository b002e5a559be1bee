//! Tests for `elm::train`: AdamW vs closed-form / hand-written f64 references, clipping,
//! schedule values at key steps, state round-trips and typed errors on bad files.

mod common;

use common::TempDir;
use elm::train::{AdamW, AdamWConfig, ParamGrads, ParamStore, ScheduleConfig};
use elm::ElmError;
use ndarray::{arr1, arr2, ArrayD, IxDyn, ShapeBuilder};

fn assert_close(what: &str, got: f64, want: f64, rel: f64) {
    let diff = (got - want).abs();
    let r = diff / want.abs().max(1e-12);
    assert!(
        r <= rel || diff <= 1e-12,
        "{what}: got {got}, want {want}, abs diff {diff:e}, rel diff {r:e}"
    );
}

/// Textbook AdamW (Loshchilov & Hutter, decoupled, PyTorch form) for one scalar, in f64,
/// written independently of the library code.
fn reference_adamw(
    p0: f64,
    grads: &[f64],
    lr: &[f64],
    b1: f64,
    b2: f64,
    eps: f64,
    wd: f64,
) -> Vec<f64> {
    let (mut p, mut m, mut v) = (p0, 0.0, 0.0);
    let mut out = vec![];
    for (t, (&g, &lr)) in grads.iter().zip(lr).enumerate() {
        let t = (t + 1) as i32;
        p *= 1.0 - lr * wd;
        m = b1 * m + (1.0 - b1) * g;
        v = b2 * v + (1.0 - b2) * g * g;
        let mhat = m / (1.0 - b1.powi(t));
        let vhat = v / (1.0 - b2.powi(t));
        p -= lr * mhat / (vhat.sqrt() + eps);
        out.push(p);
    }
    out
}

fn store_with(names: &[(&str, ArrayD<f32>)]) -> ParamStore {
    let mut s = ParamStore::new();
    for (n, v) in names {
        s.insert(*n, v.clone(), true).unwrap();
    }
    s
}

#[test]
fn the_vector_step_is_the_textbook_rule_in_f64() {
    // A plain f64 vector (GPPO's policy logits) steps by the same config as the tensors:
    // against the independent reference, descending and (gradient negated) ascending.
    let grads = [0.3, -1.2, 0.05, 2.0];
    let lrs = [0.1, 0.05, 0.02, 0.01];
    for wd in [0.0, 0.01] {
        let cfg = AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: wd,
            ..Default::default()
        };
        let want = reference_adamw(1.5, &grads, &lrs, 0.9, 0.95, 1e-8, wd);
        for ascend in [false, true] {
            let (mut p, mut m, mut v) = ([1.5f64], [0.0f64], [0.0f64]);
            for (t, (&g, &lr)) in grads.iter().zip(&lrs).enumerate() {
                let g = if ascend { -g } else { g };
                cfg.step_vector(&mut p, (&mut m, &mut v), t as u64, &[g], lr, ascend)
                    .unwrap();
                assert_close(
                    &format!("wd {wd} ascend {ascend} step {t}"),
                    p[0],
                    want[t],
                    1e-12,
                );
            }
        }
    }
    let err = AdamWConfig::default()
        .step_vector(
            &mut [0.0],
            (&mut [0.0], &mut [0.0]),
            0,
            &[f64::NAN],
            0.1,
            false,
        )
        .unwrap_err();
    assert!(matches!(err, ElmError::NonFinite(_)), "{err}");
}

#[test]
fn adamw_constant_gradient_matches_closed_form() {
    // With a constant gradient g, bias correction makes m̂ = g and v̂ = g² exactly, so each step
    // moves p by −lr·g/(|g|+ε) (no decay) — a closed form independent of β1, β2.
    let cfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut opt = AdamW::new(cfg).unwrap();
    let mut store = store_with(&[("w", arr2(&[[1.0f32, -2.0], [0.5, 3.0]]).into_dyn())]);
    let g = arr2(&[[0.3f32, -0.7], [2.0, 1e-3]]).into_dyn();
    let lr = 0.01;
    for t in 1..=3 {
        opt.step(&mut store, &ParamGrads::new(vec![Some(g.clone())]), lr)
            .unwrap();
        let w = store.get("w").unwrap();
        for ((&p, &p0), &gi) in w.iter().zip([1.0f64, -2.0, 0.5, 3.0].iter()).zip(g.iter()) {
            let gi = gi as f64;
            let want = p0 - t as f64 * lr * gi / (gi.abs() + 1e-8);
            assert_close(&format!("step {t}"), p as f64, want, 1e-6);
        }
    }
    assert_eq!(opt.steps_of("w"), 3);
}

#[test]
fn adamw_three_steps_vs_reference_with_and_without_decay() {
    let grads = [[0.5f64, -1.5, 0.25], [-0.2, 0.8, 0.0], [1.0, -0.1, 3.0]];
    let lrs = [1e-2, 5e-3, 2e-2];
    let (b1, b2, eps, wd) = (0.9, 0.95, 1e-6, 0.1);
    let cfg = AdamWConfig {
        beta1: b1,
        beta2: b2,
        eps,
        weight_decay: wd,
        ..Default::default()
    };
    let mut opt = AdamW::new(cfg).unwrap();
    // "w" (rank 2) decays; "b" (rank 1) and "ln.norm_w" (rank 2, name pattern) do not.
    let p0 = [0.7f64, -0.4, 1.2];
    let mat =
        ArrayD::from_shape_vec(IxDyn(&[1, 3]), p0.iter().map(|&x| x as f32).collect()).unwrap();
    let mut store = store_with(&[
        ("w", mat.clone()),
        ("b", arr1(&[0.7f32, -0.4, 1.2]).into_dyn()),
        ("ln.norm_w", mat.clone()),
    ]);
    for (s, g) in grads.iter().enumerate() {
        let ga =
            ArrayD::from_shape_vec(IxDyn(&[1, 3]), g.iter().map(|&x| x as f32).collect()).unwrap();
        let gb = ga.clone().into_shape_with_order(IxDyn(&[3])).unwrap();
        let pg = ParamGrads::new(vec![Some(ga.clone()), Some(gb), Some(ga)]);
        opt.step(&mut store, &pg, lrs[s]).unwrap();
    }
    for j in 0..3 {
        let gj: Vec<f64> = grads.iter().map(|g| g[j]).collect();
        let with_wd = reference_adamw(p0[j], &gj, &lrs, b1, b2, eps, wd)[2];
        let no_wd = reference_adamw(p0[j], &gj, &lrs, b1, b2, eps, 0.0)[2];
        assert!(
            (with_wd - no_wd).abs() > 1e-4,
            "test must distinguish decay from none"
        );
        assert_close(
            "w (decayed)",
            store.get("w").unwrap()[[0, j]] as f64,
            with_wd,
            1e-5,
        );
        assert_close(
            "b (rank-1, excluded)",
            store.get("b").unwrap()[[j]] as f64,
            no_wd,
            1e-5,
        );
        assert_close(
            "ln.norm_w (pattern, excluded)",
            store.get("ln.norm_w").unwrap()[[0, j]] as f64,
            no_wd,
            1e-5,
        );
    }
}

#[test]
fn adamw_skips_missing_grads_and_frozen_params() {
    let mut store = ParamStore::new();
    store.insert("a", arr1(&[1.0f32]).into_dyn(), true).unwrap();
    store
        .insert("frozen", arr1(&[2.0f32]).into_dyn(), false)
        .unwrap();
    let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
    let g = Some(arr1(&[1.0f32]).into_dyn());
    opt.step(&mut store, &ParamGrads::new(vec![None, g]), 0.1)
        .unwrap();
    assert_eq!(store.get("a").unwrap()[[0]], 1.0);
    assert_eq!(store.get("frozen").unwrap()[[0]], 2.0);
    assert_eq!(opt.steps_of("a"), 0);
    // Non-finite gradient → typed error, nothing modified.
    let bad = ParamGrads::new(vec![Some(arr1(&[f32::NAN]).into_dyn()), None]);
    assert!(matches!(
        opt.step(&mut store, &bad, 0.1),
        Err(ElmError::NonFinite(_))
    ));
    assert_eq!(store.get("a").unwrap()[[0]], 1.0);
    // Wrong gradient shape → typed error.
    let wrong = ParamGrads::new(vec![Some(arr1(&[1.0f32, 2.0]).into_dyn()), None]);
    assert!(matches!(
        opt.step(&mut store, &wrong, 0.1),
        Err(ElmError::Tensor { .. })
    ));
}

#[test]
fn global_norm_clipping() {
    // Norm of ([3], [4, 0]) is 5; clipping to 1 scales by 1/(5+1e-6).
    let mut g = ParamGrads::new(vec![
        Some(arr1(&[3.0f32]).into_dyn()),
        None,
        Some(arr1(&[4.0f32, 0.0]).into_dyn()),
    ]);
    let n = g.clip_global_norm(1.0).unwrap();
    assert_close("norm", n, 5.0, 1e-7);
    let c = 1.0 / (5.0 + 1e-6);
    assert_close(
        "g0",
        g.grads[0].as_ref().unwrap()[[0]] as f64,
        3.0 * c,
        1e-6,
    );
    assert_close(
        "g2",
        g.grads[2].as_ref().unwrap()[[0]] as f64,
        4.0 * c,
        1e-6,
    );
    assert_close("clipped norm", g.global_norm(), 1.0, 1e-6);
    // Below the threshold: untouched.
    let mut h = ParamGrads::new(vec![Some(arr1(&[0.3f32, 0.4]).into_dyn())]);
    assert_close("norm", h.clip_global_norm(1.0).unwrap(), 0.5, 1e-7);
    assert_eq!(h.grads[0].as_ref().unwrap()[[0]], 0.3);
    // NaN → typed error; bad threshold → config error.
    let mut bad = ParamGrads::new(vec![Some(arr1(&[f32::NAN]).into_dyn())]);
    assert!(matches!(
        bad.clip_global_norm(1.0),
        Err(ElmError::NonFinite(_))
    ));
    assert!(matches!(
        h.clip_global_norm(0.0),
        Err(ElmError::Config { .. })
    ));
}

#[test]
fn global_norm_and_clipping_of_large_tensors_match_f64_sums() {
    // Sizes that span several of the norm's parallel chunks and leave a remainder of its
    // eight-lane loop; one tensor in Fortran order (read in memory order, not logical order).
    let mut k = 0u64;
    let mut next = || {
        k += 1;
        ((k.wrapping_mul(2654435761) % 20001) as f32 - 10000.0) * 1e-3
    };
    let a = ArrayD::from_shape_simple_fn(IxDyn(&[100_003]), &mut next);
    let b = ArrayD::from_shape_simple_fn(IxDyn(&[301, 257]), &mut next);
    let mut b_view = ArrayD::zeros(IxDyn(&[301, 257]).f()); // Fortran order in memory
    b_view.assign(&b);
    assert!(!b_view.is_standard_layout() && b_view.as_slice_memory_order().is_some());
    let want_sq: f64 = a
        .iter()
        .chain(b.iter())
        .map(|&x| (x as f64) * (x as f64))
        .sum();
    let mut g = ParamGrads::new(vec![Some(a.clone()), None, Some(b_view)]);
    assert_close("norm", g.global_norm(), want_sq.sqrt(), 1e-12);
    let max = want_sq.sqrt() / 4.0;
    g.clip_global_norm(max).unwrap();
    let c = (max / (want_sq.sqrt() + 1e-6)) as f32;
    for (got, &x) in g.grads[0].as_ref().unwrap().iter().zip(a.iter()) {
        assert_eq!(*got, x * c);
    }
    for (got, &x) in g.grads[2].as_ref().unwrap().iter().zip(b.iter()) {
        assert_eq!(*got, x * c);
    }
}

#[test]
fn schedule_values_at_key_steps() {
    let s = ScheduleConfig {
        peak_lr: 2e-4,
        warmup_steps: 10,
        total_steps: 110,
        final_lr_frac: 0.01,
    };
    s.validate().unwrap();
    assert_close("s=0", s.lr_at(0), 2e-4 / 10.0, 1e-12);
    assert_close("s=4", s.lr_at(4), 2e-4 * 5.0 / 10.0, 1e-12);
    assert_close("s=W-1", s.lr_at(9), 2e-4, 1e-12);
    assert_close("s=W", s.lr_at(10), 2e-4, 1e-12);
    // Half-way through the cosine: cos(π/2) = 0 → floor + half the range.
    assert_close("mid", s.lr_at(60), 2e-4 * (0.01 + 0.99 * 0.5), 1e-12);
    // A quarter: ½(1 + cos(π/4)).
    let q = 0.5 * (1.0 + (std::f64::consts::PI / 4.0).cos());
    assert_close("quarter", s.lr_at(35), 2e-4 * (0.01 + 0.99 * q), 1e-12);
    assert_close("end", s.lr_at(110), 2e-6, 1e-12);
    assert_close("after end", s.lr_at(1000), 2e-6, 1e-12);
    // Monotone non-increasing after warmup.
    for k in 10..120 {
        assert!(s.lr_at(k + 1) <= s.lr_at(k) + 1e-18);
    }
    let f = ScheduleConfig::warmup_cosine(1.0, 200, 0.1, 0.0);
    assert_eq!(f.warmup_steps, 20);
    assert_close(
        "no warmup",
        ScheduleConfig {
            peak_lr: 1.0,
            warmup_steps: 0,
            total_steps: 5,
            final_lr_frac: 0.0,
        }
        .lr_at(0),
        1.0,
        1e-12,
    );
    assert!(ScheduleConfig {
        peak_lr: 1.0,
        warmup_steps: 6,
        total_steps: 5,
        final_lr_frac: 0.0
    }
    .validate()
    .is_err());
    assert!(ScheduleConfig {
        peak_lr: 1.0,
        warmup_steps: 0,
        total_steps: 5,
        final_lr_frac: 1.5
    }
    .validate()
    .is_err());
}

#[test]
fn configs_reject_unknown_keys_and_bad_values() {
    let ok: AdamWConfig =
        serde_json::from_str(r#"{"beta1":0.9,"beta2":0.95,"weight_decay":0.02}"#).unwrap();
    assert_eq!(ok.eps, 1e-8);
    assert!(ok.no_decay_rank1);
    assert!(serde_json::from_str::<AdamWConfig>(r#"{"beta1":0.9,"betta2":0.95}"#).is_err());
    assert!(serde_json::from_str::<ScheduleConfig>(
        r#"{"peak_lr":1,"warmup_steps":1,"total_steps":2,"floor":0}"#
    )
    .is_err());
    assert!(matches!(
        AdamW::new(AdamWConfig {
            beta1: 1.0,
            ..Default::default()
        }),
        Err(ElmError::Config { .. })
    ));
    assert!(matches!(
        AdamW::new(AdamWConfig {
            eps: 0.0,
            ..Default::default()
        }),
        Err(ElmError::Config { .. })
    ));
}

#[test]
fn optimizer_state_round_trip_continues_identically() {
    let dir = TempDir::new("state");
    let path = dir.join("opt.safetensors");
    let cfg = AdamWConfig {
        beta1: 0.8,
        beta2: 0.9,
        eps: 1e-7,
        weight_decay: 0.05,
        ..Default::default()
    };
    let mut store = store_with(&[
        ("w", arr2(&[[0.1f32, 0.2], [0.3, 0.4]]).into_dyn()),
        ("b", arr1(&[0.5f32, -0.5]).into_dyn()),
    ]);
    let grads = |k: f32| {
        ParamGrads::new(vec![
            Some(arr2(&[[k, -k], [0.5 * k, 2.0]]).into_dyn()),
            Some(arr1(&[k * k, 1.0 - k]).into_dyn()),
        ])
    };
    let mut opt = AdamW::new(cfg.clone()).unwrap();
    opt.step(&mut store, &grads(0.3), 0.01).unwrap();
    opt.step(&mut store, &grads(-0.7), 0.01).unwrap();
    opt.save(&path).unwrap();
    store.save(dir.join("params.safetensors")).unwrap();
    assert!(dir.join("opt.json").exists());

    let mut loaded = AdamW::load(&path).unwrap();
    let mut store2 = ParamStore::load(dir.join("params.safetensors")).unwrap();
    loaded.check_against(&store2).unwrap();
    assert_eq!(loaded.config(), &cfg);
    assert_eq!(loaded.steps_of("w"), 2);
    assert_eq!(store2.names(), store.names());
    opt.step(&mut store, &grads(1.1), 0.02).unwrap();
    loaded.step(&mut store2, &grads(1.1), 0.02).unwrap();
    for n in ["w", "b"] {
        assert_eq!(
            store.get(n).unwrap(),
            store2.get(n).unwrap(),
            "param {n} after resume"
        );
        assert_eq!(
            opt.moments_of(n).unwrap().1,
            loaded.moments_of(n).unwrap().1,
            "v of {n}"
        );
    }
    // No temp files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn corrupt_or_missing_state_files_give_typed_errors() {
    let dir = TempDir::new("corrupt");
    let path = dir.join("opt.safetensors");
    // Missing entirely → Io naming the json path.
    match AdamW::load(&path) {
        Err(ElmError::Io { path: p, .. }) => assert!(p.ends_with("opt.json")),
        other => panic!("expected Io error, got {other:?}"),
    }
    let mut store = store_with(&[("w", arr2(&[[1.0f32, 2.0]]).into_dyn())]);
    let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
    opt.step(
        &mut store,
        &ParamGrads::new(vec![Some(arr2(&[[1.0f32, 1.0]]).into_dyn())]),
        0.1,
    )
    .unwrap();
    opt.save(&path).unwrap();
    let good = std::fs::read(&path).unwrap();
    // Truncated safetensors → Format naming the file.
    std::fs::write(&path, &good[..good.len() - 3]).unwrap();
    match AdamW::load(&path) {
        Err(ElmError::Format { path: p, .. }) => assert!(p.ends_with("opt.safetensors")),
        other => panic!("expected Format error, got {other:?}"),
    }
    // Garbage header.
    std::fs::write(&path, b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage").unwrap();
    assert!(matches!(AdamW::load(&path), Err(ElmError::Format { .. })));
    std::fs::write(&path, &good).unwrap();
    AdamW::load(&path).unwrap();
    // JSON with an unknown key → Json error.
    let jp = dir.join("opt.json");
    let text = std::fs::read_to_string(&jp).unwrap();
    std::fs::write(&jp, text.replacen('{', "{\"surprise\": 1,", 1)).unwrap();
    assert!(matches!(AdamW::load(&path), Err(ElmError::Json { .. })));
    std::fs::write(&jp, "{not json").unwrap();
    assert!(matches!(AdamW::load(&path), Err(ElmError::Json { .. })));
    // State for a parameter with another shape → Tensor error on check.
    std::fs::write(&jp, &text).unwrap();
    let loaded = AdamW::load(&path).unwrap();
    let other = store_with(&[("w", arr2(&[[1.0f32], [2.0]]).into_dyn())]);
    assert!(matches!(
        loaded.check_against(&other),
        Err(ElmError::Tensor { .. })
    ));
    // ParamStore: missing file and truncated file.
    assert!(matches!(
        ParamStore::load(dir.join("nope.safetensors")),
        Err(ElmError::Io { .. })
    ));
    let sp = dir.join("p.safetensors");
    store.save(&sp).unwrap();
    let b = std::fs::read(&sp).unwrap();
    std::fs::write(&sp, &b[..b.len() / 2]).unwrap();
    assert!(matches!(
        ParamStore::load(&sp),
        Err(ElmError::Format { .. })
    ));
}

#[test]
fn param_store_round_trip_keeps_order_and_frozen_flags() {
    let dir = TempDir::new("store");
    let mut s = ParamStore::new();
    s.insert("z.last", arr1(&[1.0f32, 2.0, 3.0]).into_dyn(), true)
        .unwrap();
    s.insert("a.first", arr2(&[[4.0f32, 5.0]]).into_dyn(), false)
        .unwrap();
    s.insert("m.mid", ArrayD::from_elem(IxDyn(&[2, 1, 2]), 0.25f32), true)
        .unwrap();
    assert!(matches!(
        s.insert("a.first", arr1(&[0.0f32]).into_dyn(), true),
        Err(ElmError::Tensor { .. })
    ));
    assert!(matches!(
        s.insert("nan", arr1(&[f32::NAN]).into_dyn(), true),
        Err(ElmError::NonFinite(_))
    ));
    let p = dir.join("s.safetensors");
    s.save(&p).unwrap();
    let l = ParamStore::load(&p).unwrap();
    assert_eq!(l.names(), s.names());
    for i in 0..3 {
        assert_eq!(l.value(i), s.value(i));
        assert_eq!(l.is_trainable(i), s.is_trainable(i));
    }
    let mut t = s.clone();
    t.value_mut(0).fill(9.0);
    t.load_values_from(&p).unwrap();
    assert_eq!(t.value(0), s.value(0));
    let mut wrong = ParamStore::new();
    wrong
        .insert("z.last", arr1(&[1.0f32]).into_dyn(), true)
        .unwrap();
    wrong
        .insert("a.first", arr1(&[1.0f32]).into_dyn(), true)
        .unwrap();
    wrong
        .insert("m.mid", arr1(&[1.0f32]).into_dyn(), true)
        .unwrap();
    assert!(matches!(
        wrong.load_values_from(&p),
        Err(ElmError::Tensor { .. })
    ));
}

#[test]
fn store_registers_on_tape_and_adamw_minimises_a_quadratic() {
    use elm::autograd::Tape;
    // L = ‖w − t‖² with a frozen offset: AdamW must drive w to t; the frozen tensor never moves
    // and receives no gradient.
    let target = arr1(&[1.5f32, -0.5, 0.25]).into_dyn();
    let mut store = ParamStore::new();
    store
        .insert("w", arr1(&[0.0f32, 0.0, 0.0]).into_dyn(), true)
        .unwrap();
    store
        .insert("offset", arr1(&[0.1f32, 0.1, 0.1]).into_dyn(), false)
        .unwrap();
    let mut opt = AdamW::new(AdamWConfig::default()).unwrap();
    let sched = ScheduleConfig {
        peak_lr: 0.05,
        warmup_steps: 5,
        total_steps: 400,
        final_lr_frac: 0.01,
    };
    let mut first_loss = None;
    let mut loss_val = 0.0;
    for step in 0..400 {
        let mut tape = Tape::<f32>::new();
        let vars = store.register(&mut tape);
        assert!(tape.requires_grad(vars.var(0)) && !tape.requires_grad(vars.var(1)));
        let t = tape.constant(target.clone());
        let shifted = tape.add(vars.var(0), vars.var(1)).unwrap();
        let d = tape.sub(shifted, t).unwrap();
        let loss = tape.sum_squares(d);
        loss_val = tape.scalar(loss);
        first_loss.get_or_insert(loss_val);
        let mut g = tape.backward(loss).unwrap();
        let grads = store.collect_grads(&vars, &mut g).unwrap();
        assert!(grads.grads[0].is_some() && grads.grads[1].is_none());
        opt.step(&mut store, &grads, sched.lr_at(step)).unwrap();
    }
    assert!(
        loss_val < 1e-6 * first_loss.unwrap(),
        "loss {loss_val} from {first_loss:?}"
    );
    for (w, t) in store.get("w").unwrap().iter().zip(target.iter()) {
        assert!((w + 0.1 - t).abs() < 1e-3, "w {w} + 0.1 vs target {t}");
    }
    assert_eq!(
        store.get("offset").unwrap(),
        &arr1(&[0.1f32, 0.1, 0.1]).into_dyn()
    );
}

/// The one optimiser config: the defaults every trainer shares, its AdamW and schedule, a file
/// that still has a key at its old place refused naming the key and where it moved, and the
/// candidates' own weight-decay default kept for keys a file leaves out.
#[test]
fn one_optimiser_config_for_every_trainer() {
    use elm::equilibrium::TrainConfig;
    use elm::lora::LoraConfig;
    use elm::search::candidate::{candidate_optim, CandidateConfig};
    use elm::search::GppoConfig;
    use elm::train::{OptimConfig, OPTIM_KEYS};
    let d = OptimConfig::default();
    assert_eq!(TrainConfig::default().optim, d);
    assert_eq!(LoraConfig::default().optim, d);
    assert_eq!(
        (d.lr, d.betas, d.eps, d.weight_decay, d.clip),
        (2e-4, [0.9, 0.95], 1e-8, 0.02, 0.1)
    );
    let a = d.adamw();
    assert_eq!(
        (a.beta1, a.beta2, a.eps, a.weight_decay),
        (
            0.9f32 as f64,
            0.95f32 as f64,
            1e-8f32 as f64,
            0.02f32 as f64
        )
    );
    let s = d.schedule(100).unwrap();
    assert_eq!((s.warmup_steps, s.total_steps), (10, 100));
    assert_close("peak lr", s.lr_at(10), 2e-4f32 as f64, 1e-12);
    // The candidates keep the official GPPO code's decay (PyTorch's AdamW default) unless told.
    assert_eq!(CandidateConfig::new(8).optim, candidate_optim());
    assert_eq!(candidate_optim().weight_decay, 0.01);
    let c: CandidateConfig =
        serde_json::from_str(r#"{"num_replaced": 8, "optim": {"lr": 5e-4}}"#).unwrap();
    assert_eq!(
        c.optim,
        OptimConfig {
            lr: 5e-4,
            ..candidate_optim()
        }
    );
    let e = serde_json::from_str::<CandidateConfig>(r#"{"num_replaced": 8, "optim": {"lrr": 1}}"#)
        .unwrap_err();
    assert!(e.to_string().contains("lrr"), "{e}");
    // Validation names the key at its place.
    let bad = OptimConfig {
        clip: -1.0,
        ..OptimConfig::default()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("optim.clip"));
    // Old files: every moved key, at the top and inside GPPO's `candidate`.
    let dir = TempDir::new("optim-moved");
    for key in OPTIM_KEYS {
        let p = dir.join("train.json");
        std::fs::write(&p, format!(r#"{{"steps": 3, "{key}": 1}}"#)).unwrap();
        let e = TrainConfig::from_file(&p).unwrap_err().to_string();
        assert!(
            e.contains(&format!("`{key}`"))
                && e.contains(&format!("optim.{key}"))
                && e.contains("train.json"),
            "{e}"
        );
        let e = LoraConfig::from_file(&p).unwrap_err().to_string();
        assert!(e.contains(&format!("optim.{key}")), "{e}");
        let p = dir.join("gppo.json");
        std::fs::write(
            &p,
            format!(r#"{{"candidate": {{"num_replaced": 8, "{key}": 1}}, "steps": 3}}"#),
        )
        .unwrap();
        let e = GppoConfig::from_file(&p).unwrap_err().to_string();
        assert!(
            e.contains(&format!("candidate.{key}"))
                && e.contains(&format!("candidate.optim.{key}")),
            "{e}"
        );
    }
    // The new place reads.
    let p = dir.join("ok.json");
    std::fs::write(&p, r#"{"steps": 3, "optim": {"lr": 1e-3, "clip": 1.0}}"#).unwrap();
    let t = TrainConfig::from_file(&p).unwrap();
    assert_eq!(
        (t.optim.lr, t.optim.clip, t.optim.weight_decay),
        (1e-3, 1.0, 0.02)
    );
}

/// A trainer that only counts: what the one loop does around its steps.
struct Counter {
    step: usize,
    total: usize,
    every: usize,
    saves: std::cell::RefCell<Vec<usize>>,
}

impl elm::train::Checkpointed for Counter {
    const STATE_FILE: &'static str = "counter_state.json";
    fn steps_done(&self) -> usize {
        self.step
    }
    fn steps_total(&self) -> usize {
        self.total
    }
    fn checkpoint_every(&self) -> usize {
        self.every
    }
    fn save(&self, dir: &std::path::Path) -> elm::Result<()> {
        self.saves.borrow_mut().push(self.step);
        std::fs::write(dir.join(Self::STATE_FILE), self.step.to_string()).unwrap();
        Ok(())
    }
}

#[test]
fn the_one_loop_saves_the_start_every_k_steps_and_the_end() {
    use elm::train::{run_steps, LoopEvent};
    let dir = TempDir::new("run-steps");
    let mut t = Counter {
        step: 0,
        total: 7,
        every: 3,
        saves: Default::default(),
    };
    let mut events = vec![];
    let data = [10u32, 20];
    let out = run_steps(
        &mut t,
        &data,
        dir.path(),
        |t, d| {
            t.step += 1;
            Ok(d[t.step % 2])
        },
        |e| match e {
            LoopEvent::Step(v) => events.push(format!("step {v}")),
            LoopEvent::Checkpoint { step } => events.push(format!("checkpoint {step}")),
        },
    )
    .unwrap();
    // The starting point, steps 3 and 6, and the end (7); no second save at 7.
    assert_eq!(*t.saves.borrow(), vec![0, 3, 6, 7]);
    assert_eq!(out.steps_this_run, 7);
    assert_eq!(events.iter().filter(|e| e.starts_with("step")).count(), 7);
    assert_eq!(
        events
            .iter()
            .filter(|e| e.starts_with("checkpoint"))
            .collect::<Vec<_>>(),
        ["checkpoint 3", "checkpoint 6", "checkpoint 7"]
    );
    // Resumed (state committed, steps taken): no new starting point, and only what is left.
    t.total = 9;
    t.saves.borrow_mut().clear();
    let out = run_steps(
        &mut t,
        &data,
        dir.path(),
        |t, _| {
            t.step += 1;
            Ok(())
        },
        |_| {},
    )
    .unwrap();
    assert_eq!(*t.saves.borrow(), vec![9]);
    assert_eq!(out.steps_this_run, 2);
    // No data: refused before anything is written.
    let empty = TempDir::new("run-steps-empty");
    let mut fresh = Counter {
        step: 0,
        total: 2,
        every: 1,
        saves: Default::default(),
    };
    let err = run_steps(
        &mut fresh,
        &[] as &[u32],
        empty.path(),
        |_, _| Ok(()),
        |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("no usable sequence"), "{err}");
    assert!(fresh.saves.borrow().is_empty());
}
