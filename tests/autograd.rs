//! Tape core and elementary ops: every op is checked against f64 central differences
//! (relative ∞-norm error < 1e-6), plus the engine's semantics (frozen leaves, no_grad,
//! accumulation over fan-out, custom ops, freeing, errors).

use elm::autograd::{gradcheck, Tape, Var};
use elm::Result;
use ndarray::{ArrayD, IxDyn, ShapeBuilder};
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
    assert!(
        r.max_abs_grad > 1e-3,
        "{name}: vacuous check, all gradients ~0: {r}"
    );
    assert!(r.max_rel_err < 1e-6, "{name}: {r}");
}

#[test]
fn gradcheck_elementwise_broadcast() {
    let mut rng = StdRng::seed_from_u64(1);
    let a = rand_arr(&mut rng, &[2, 3, 4]);
    let b = rand_arr(&mut rng, &[3, 1]);
    let c = rand_arr(&mut rng, &[4]);
    check("add", |t, v| t.add(v[0], v[1]), &[a.clone(), b.clone()]);
    check("sub", |t, v| t.sub(v[0], v[1]), &[a.clone(), c.clone()]);
    check("mul", |t, v| t.mul(v[0], v[1]), &[a.clone(), b.clone()]);
    check(
        "mul_same",
        |t, v| t.mul(v[0], v[1]),
        &[a.clone(), a.mapv(|x| x + 0.5)],
    );
    check(
        "scale",
        |t, v| Ok(t.scale(v[0], 1.7)),
        std::slice::from_ref(&a),
    );
    check(
        "add_scalar_neg",
        |t, v| {
            let y = t.add_scalar(v[0], 0.3);
            Ok(t.neg(y))
        },
        std::slice::from_ref(&a),
    );
    check("tanh", |t, v| Ok(t.tanh(v[0])), std::slice::from_ref(&a));
    check("exp", |t, v| Ok(t.exp(v[0])), std::slice::from_ref(&a));
    check("silu", |t, v| Ok(t.silu(v[0])), &[a.mapv(|x| 3.0 * x)]);
    check(
        "softmax",
        |t, v| Ok(t.softmax(v[0])),
        &[a.mapv(|x| 2.0 * x)],
    );
}

#[test]
fn gradcheck_reductions_and_shapes() {
    let mut rng = StdRng::seed_from_u64(2);
    let a = rand_arr(&mut rng, &[2, 3, 4]);
    check("sum", |t, v| Ok(t.sum(v[0])), std::slice::from_ref(&a));
    check("mean", |t, v| Ok(t.mean(v[0])), std::slice::from_ref(&a));
    check(
        "sum_axis1",
        |t, v| t.sum_axis(v[0], 1),
        std::slice::from_ref(&a),
    );
    check(
        "sum_squares",
        |t, v| Ok(t.sum_squares(v[0])),
        std::slice::from_ref(&a),
    );
    check(
        "reshape",
        |t, v| {
            let r = t.reshape(v[0], &[6, 4])?;
            let w = t.constant(ArrayD::from_shape_fn(IxDyn(&[6, 4]), |i| {
                (i[0] * 4 + i[1]) as f64
            }));
            t.mul(r, w)
        },
        std::slice::from_ref(&a),
    );
    let b = rand_arr(&mut rng, &[2, 3, 2]);
    check(
        "concat_last",
        |t, v| {
            let c = t.concat_last(&[v[0], v[1]])?;
            Ok(t.tanh(c))
        },
        &[a.clone(), b],
    );
    check(
        "slice_last",
        |t, v| t.slice_last(v[0], 1, 3),
        std::slice::from_ref(&a),
    );
}

#[test]
fn gradcheck_matmuls() {
    let mut rng = StdRng::seed_from_u64(3);
    let a = rand_arr(&mut rng, &[3, 5]);
    let b = rand_arr(&mut rng, &[5, 2]);
    check("matmul", |t, v| t.matmul(v[0], v[1]), &[a, b]);
    let a = rand_arr(&mut rng, &[2, 3, 4]);
    let b = rand_arr(&mut rng, &[2, 4, 5]);
    check("bmm", |t, v| t.bmm(v[0], v[1]), &[a, b]);
    let x = rand_arr(&mut rng, &[2, 3, 4]);
    let w = rand_arr(&mut rng, &[5, 4]);
    let bias = rand_arr(&mut rng, &[5]);
    check(
        "matmul_t+bias",
        |t, v| t.matmul_t(v[0], v[1], Some(v[2])),
        &[x.clone(), w.clone(), bias],
    );
    check("matmul_t", |t, v| t.matmul_t(v[0], v[1], None), &[x, w]);
}

/// The implicit-layer map the `grad` module differentiates: z = tanh(W z + U x + b).
#[test]
fn gradcheck_implicit_layer_map() {
    let mut rng = StdRng::seed_from_u64(4);
    let z = rand_arr(&mut rng, &[3, 6]);
    let x = rand_arr(&mut rng, &[3, 4]);
    let w = rand_arr(&mut rng, &[6, 6]).mapv(|v| 0.3 * v);
    let u = rand_arr(&mut rng, &[6, 4]);
    let b = rand_arr(&mut rng, &[6]);
    check(
        "tanh(Wz+Ux+b)",
        |t, v| {
            let wz = t.matmul_t(v[0], v[2], None)?;
            let ux = t.matmul_t(v[1], v[3], Some(v[4]))?;
            let s = t.add(wz, ux)?;
            Ok(t.tanh(s))
        },
        &[z, x, w, u, b],
    );
}

#[test]
fn frozen_leaves_get_no_gradient_but_pass_it_through() {
    let mut t = Tape::<f64>::new();
    let x = t.param(ArrayD::from_elem(IxDyn(&[2, 3]), 0.5));
    let w = t.constant(ArrayD::from_elem(IxDyn(&[4, 3]), 2.0));
    assert!(!t.requires_grad(w));
    let y = t.matmul_t(x, w, None).unwrap();
    assert!(t.requires_grad(y));
    let l = t.sum(y);
    let g = t.backward(l).unwrap();
    assert!(g.get(w).is_none(), "a constant must not receive a gradient");
    // d/dx Σ (x Wᵀ) = Σ_rows W = 4 * 2.0 per element.
    let gx = g.get(x).unwrap();
    assert!(gx.iter().all(|&v| (v - 8.0).abs() < 1e-12), "{gx:?}");
}

#[test]
fn only_constants_means_no_grad_and_no_vjp() {
    let mut t = Tape::<f32>::new();
    let a = t.constant(ArrayD::from_elem(IxDyn(&[3]), 1.0));
    let b = t.tanh(a);
    assert!(!t.requires_grad(b));
    let s = t.sum(b);
    let g = t.backward(s).unwrap();
    assert!(g.is_empty());
}

#[test]
fn no_grad_scope_records_nothing() {
    let mut t = Tape::<f32>::new();
    let p = t.param(ArrayD::from_elem(IxDyn(&[3]), 1.0));
    let y = t.no_grad(|t| t.tanh(p));
    assert!(!t.requires_grad(y));
    assert!(t.grad_enabled());
    let z = t.tanh(p);
    assert!(t.requires_grad(z));
}

#[test]
fn fan_out_gradients_accumulate() {
    // f(x) = Σ x*x + 3 Σ x → df/dx = 2x + 3.
    let mut t = Tape::<f64>::new();
    let xv = ArrayD::from_shape_vec(IxDyn(&[3]), vec![1.0, -2.0, 0.5]).unwrap();
    let x = t.param(xv.clone());
    let sq = t.mul(x, x).unwrap();
    let s1 = t.sum(sq);
    let x3 = t.scale(x, 3.0);
    let s2 = t.sum(x3);
    let l = t.add(s1, s2).unwrap();
    let g = t.backward(l).unwrap();
    let want = xv.mapv(|v| 2.0 * v + 3.0);
    assert_eq!(g.get(x).unwrap(), &want);
    // Accumulation across steps into an external buffer.
    let mut acc = ArrayD::zeros(IxDyn(&[3]));
    g.accumulate_into(x, &mut acc).unwrap();
    g.accumulate_into(x, &mut acc).unwrap();
    assert_eq!(acc, want.mapv(|v| 2.0 * v));
}

#[test]
fn custom_op_and_backward_from_seed() {
    // custom op y = x³ with its own VJP; seed s gives 3x²·s.
    let mut t = Tape::<f64>::new();
    let xv = ArrayD::from_shape_vec(IxDyn(&[2]), vec![2.0, -1.0]).unwrap();
    let x = t.param(xv.clone());
    let xc = xv.clone();
    let y = t.custom(
        &[x],
        xv.mapv(|v| v * v * v),
        Box::new(move |g| Ok(vec![Some(g * &xc.mapv(|v| 3.0 * v * v))])),
    );
    let seed = ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.0, 10.0]).unwrap();
    let g = t.backward_from(y, seed).unwrap();
    assert_eq!(g.get(x).unwrap().as_slice().unwrap(), &[12.0, 30.0]);
}

#[test]
fn retain_grad_reports_intermediate_gradient() {
    let mut t = Tape::<f64>::new();
    let x = t.param(ArrayD::from_elem(IxDyn(&[2]), 1.0));
    let h = t.scale(x, 2.0);
    t.retain_grad(h);
    let y = t.scale(h, 5.0);
    let l = t.sum(y);
    let g = t.backward(l).unwrap();
    assert!(g.get(h).unwrap().iter().all(|&v| v == 5.0));
    assert!(g.get(x).unwrap().iter().all(|&v| v == 10.0));
}

#[test]
fn backward_frees_intermediates_and_refuses_second_pass() {
    let mut t = Tape::<f32>::new();
    let x = t.param(ArrayD::from_elem(IxDyn(&[1000]), 0.1));
    let mut h = x;
    for _ in 0..10 {
        h = t.tanh(h);
    }
    let l = t.sum(h);
    let live_before = t.live_bytes();
    // 1 leaf + 10 tanh outputs + 10 tanh caches, each 4000 bytes, plus the scalar.
    assert!(live_before >= 21 * 4000, "{live_before}");
    let _ = t.backward(l).unwrap();
    assert!(t.try_value(h).is_err(), "intermediate should be freed");
    assert!(t.try_value(x).is_ok(), "leaves stay");
    assert!(t.try_value(l).is_ok(), "the output stays");
    assert!(
        t.live_bytes() <= 4000 + 64,
        "live after backward: {}",
        t.live_bytes()
    );
    assert!(t.peak_bytes() >= live_before);
    assert!(
        t.backward(l).is_err(),
        "second backward through a consumed graph"
    );
}

#[test]
fn shape_errors_are_typed() {
    let mut t = Tape::<f32>::new();
    let a = t.param(ArrayD::zeros(IxDyn(&[2, 3])));
    let b = t.param(ArrayD::zeros(IxDyn(&[4])));
    assert!(t.add(a, b).is_err());
    assert!(t.matmul_t(a, b, None).is_err());
    assert!(t.reshape(a, &[5]).is_err());
    assert!(t.slice_last(a, 2, 4).is_err());
    assert!(t.backward(a).is_err(), "non-scalar loss");
    assert!(
        t.backward_from(a, ArrayD::zeros(IxDyn(&[3]))).is_err(),
        "wrong seed shape"
    );
}

#[test]
fn vjp_retain_replays_the_graph() {
    // f(z) = tanh(W z + b): record once, take many VJPs uᵀ ∂f/∂z (implicit-layer use).
    let mut rng = StdRng::seed_from_u64(5);
    let mut t = Tape::<f64>::new();
    let z = t.param(rand_arr(&mut rng, &[2, 4]));
    let w = t.constant(rand_arr(&mut rng, &[4, 4]));
    let b = t.constant(rand_arr(&mut rng, &[4]));
    let wz = t.matmul_t(z, w, Some(b)).unwrap();
    let f = t.tanh(wz);
    let (u1, u2) = (rand_arr(&mut rng, &[2, 4]), rand_arr(&mut rng, &[2, 4]));
    let g1 = t.vjp_retain(f, u1.clone()).unwrap().take(z).unwrap();
    let g1_again = t.vjp_retain(f, u1.clone()).unwrap().take(z).unwrap();
    assert_eq!(g1, g1_again);
    let g2 = t.vjp_retain(f, u2.clone()).unwrap().take(z).unwrap();
    let g12 = t.vjp_retain(f, &u1 + &u2).unwrap().take(z).unwrap();
    let lin = (&g12 - &(&g1 + &g2))
        .mapv(f64::abs)
        .fold(0.0, |a: f64, &x| a.max(x));
    assert!(lin < 1e-14, "VJP must be linear in the seed: {lin:.3e}");
    // Analytic: uᵀ diag(1 − f²) W.
    let fv = t.value(f).clone();
    let wv = t
        .value(w)
        .clone()
        .into_dimensionality::<ndarray::Ix2>()
        .unwrap();
    let d = (&u1 * &fv.mapv(|y| 1.0 - y * y))
        .into_dimensionality::<ndarray::Ix2>()
        .unwrap();
    let want = d.dot(&wv).into_dyn();
    let err = (&want - &g1)
        .mapv(f64::abs)
        .fold(0.0, |a: f64, &x| a.max(x));
    assert!(err < 1e-14, "vs analytic: {err:.3e}");
    // A consuming backward still works afterwards.
    let g_final = t.backward_from(f, u1).unwrap().take(z).unwrap();
    assert_eq!(g_final, g1);
}

#[test]
fn vjp_retain_rejects_run_once_custom_ops() {
    let mut t = Tape::<f64>::new();
    let x = t.param(ArrayD::from_elem(IxDyn(&[2]), 1.0));
    let y = t.custom(
        &[x],
        ArrayD::from_elem(IxDyn(&[2]), 2.0),
        Box::new(|g| Ok(vec![Some(g * 2.0)])),
    );
    assert!(t
        .vjp_retain(y, ArrayD::from_elem(IxDyn(&[2]), 1.0))
        .is_err());
    let z = t.custom_reusable(
        &[x],
        ArrayD::from_elem(IxDyn(&[2]), 3.0),
        Box::new(|g| Ok(vec![Some(g * 3.0)])),
    );
    for _ in 0..2 {
        let g = t
            .vjp_retain(z, ArrayD::from_elem(IxDyn(&[2]), 1.0))
            .unwrap();
        assert!(g.get(x).unwrap().iter().all(|&v| v == 3.0));
    }
}

/// `select_rows` (a row picked twice, one never): finite differences, and its backward adds
/// both picks at the source row.
#[test]
fn gradcheck_select_rows() {
    let mut rng = StdRng::seed_from_u64(9);
    let a = rand_arr(&mut rng, &[2, 3, 4]);
    check(
        "select_rows",
        |t, v| {
            let r = t.select_rows(v[0], &[5, 0, 5, 2])?;
            Ok(t.tanh(r))
        },
        std::slice::from_ref(&a),
    );
    let mut t = Tape::<f64>::new();
    let x = t.param(a.clone());
    assert!(t.select_rows(x, &[6]).is_err(), "row 6 of 6 rows");
    let r = t.select_rows(x, &[1, 1]).unwrap();
    assert_eq!(t.value(r).shape(), &[2, 4]);
    let s = t.sum(r);
    let g = t.backward(s).unwrap();
    let gx = g.get(x).unwrap();
    // Row 1 of [6, 4] is (batch 0, position 1): picked twice, so its gradient is 2.
    assert!(gx
        .iter()
        .enumerate()
        .all(|(i, &v)| v == if i / 4 == 1 { 2.0 } else { 0.0 }));
}

/// CE at the supervised rows only equals CE over every row with the rest ignored, in value
/// and in gradient (f64), for a row-wise head (norm + matmul).
#[test]
fn supervised_cross_entropy_equals_the_ignoring_one() {
    let mut rng = StdRng::seed_from_u64(10);
    let x = rand_arr(&mut rng, &[2, 3, 4]);
    let w = rand_arr(&mut rng, &[7, 4]);
    let targets = [3i64, -1, 0, -1, -1, 6];
    let run = |selective: bool| {
        let mut t = Tape::<f64>::new();
        let (xv, wv) = (t.param(x.clone()), t.param(w.clone()));
        let head = |t: &mut Tape<f64>, h: Var| {
            let g = t.constant(ArrayD::from_elem(IxDyn(&[4]), 1.0));
            let n = elm::nn::rms_norm(t, h, g, 1e-6)?;
            t.matmul_t(n, wv, None)
        };
        let ce = if selective {
            let (ce, n) =
                elm::nn::supervised_cross_entropy(&mut t, xv, &targets, -1, head).unwrap();
            assert_eq!(n, 3);
            ce
        } else {
            let logits = head(&mut t, xv).unwrap();
            elm::nn::cross_entropy(&mut t, logits, &targets, -1).unwrap()
        };
        let v = t.scalar(ce);
        let g = t.backward(ce).unwrap();
        (v, g.get(xv).unwrap().clone(), g.get(wv).unwrap().clone())
    };
    let (a, b) = (run(true), run(false));
    assert!((a.0 - b.0).abs() < 1e-12, "{} vs {}", a.0, b.0);
    assert!((&a.1 - &b.1).iter().all(|d| d.abs() < 1e-12));
    assert!((&a.2 - &b.2).iter().all(|d| d.abs() < 1e-12));
    let mut t = Tape::<f64>::new();
    let xv = t.param(x.clone());
    let none = elm::nn::supervised_cross_entropy(&mut t, xv, &[-1; 6], -1, |_, h| Ok(h));
    assert!(none.is_err());
}

#[test]
fn all_finite_finds_one_bad_element_wherever_it_lies() {
    // 200,001 elements: split over the cores; 1,000: checked on the caller.
    for n in [200_001usize, 1_000] {
        let good = ArrayD::from_shape_fn(IxDyn(&[n]), |i| (i[0] as f32 * 0.1).sin());
        assert!(elm::autograd::all_finite(&good), "n = {n}");
        for at in [0, n / 2, n - 1] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut x = good.clone();
                x[[at]] = bad;
                assert!(!elm::autograd::all_finite(&x), "n = {n}, {bad} at {at}");
            }
        }
    }
    // The same array in Fortran order (read in memory order), and every other column of it in
    // place (an owned array that is not contiguous: read element by element).
    let mut m = ArrayD::from_shape_fn(IxDyn(&[300, 400]), |i| (i[0] + i[1]) as f64);
    m[[299, 0]] = f64::NAN;
    let mut fortran = ArrayD::zeros(IxDyn(&[300, 400]).f());
    fortran.assign(&m);
    assert!(!fortran.is_standard_layout());
    assert!(!elm::autograd::all_finite(&fortran));
    let mut strided = m.clone();
    strided
        .slice_each_axis_inplace(|ax| ndarray::Slice::new(0, None, 1 + ax.axis.index() as isize));
    assert!(strided.as_slice_memory_order().is_none());
    assert!(!elm::autograd::all_finite(&strided));
}
