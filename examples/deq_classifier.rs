//! An implicit-layer (DEQ) classifier on two noisy spirals, trained once per gradient rule.
//!
//! Model: `z* = tanh(W z* + U x + b)` (hidden H), logits = `z* Vᵀ + c`, cross-entropy loss;
//! AdamW + warmup/cosine + global-norm clipping from `elm::train`. After each step `W` is
//! rescaled to spectral norm ≤ 0.9 so the layer stays a contraction (fixed point unique, every
//! rule well defined). Test accuracy is measured at the solved fixed point for every rule.
//!
//! `--solver NAME` picks the forward solver and the implicit rule's backward solver: a built-in
//! (`picard`, `anderson`, `broyden`) or `adaptive-picard`, a solver written outside the library
//! (`support/adaptive_picard.rs`); with it the implicit rules run it forward and backward.
//!
//! `--check` fails the run unless every rule ends above 75% test accuracy (CI runs it so).
//!
//! `cargo run --release --example deq_classifier [-- --json] [--steps N] [--seed S] [--solver NAME] [--jac-weight PERMILLE] [--fpc-gamma PERCENT] [--check]`

#[path = "support/adaptive_picard.rs"]
mod adaptive_picard;
#[path = "support/args.rs"]
mod args;

use std::time::Instant;

use elm::autograd::{Tape, Var};
use elm::grad::{
    fixed_point_correction, jacobian_penalty, DeqConfig, FixedPointCorrection, GradientRule,
    ImplicitDriver, ImplicitLayer, JacobianPenalty,
};
use elm::solver::{SolverConfig, StopCriteria};
use elm::train::{AdamW, AdamWConfig, ParamStore, ScheduleConfig};
use ndarray::{Array2, ArrayD, Axis};
use rand::Rng;
use rand_distr::{Distribution, Normal};

const HIDDEN: usize = 32;
const N_POINTS: usize = 384;
const CLASSES: usize = 2;

elm::param_set! {
    /// W [H, H], U [H, 2], b [H].
    struct TanhParams { w, u, b }
}

/// z = tanh(z·Wᵀ + x·Uᵀ + b).
#[derive(Clone)]
struct TanhDeq;

impl ImplicitLayer<f32> for TanhDeq {
    type Params = TanhParams;
    fn forward(&self, t: &mut Tape<f32>, z: Var, x: Var, p: &TanhParams) -> elm::Result<Var> {
        let wz = t.matmul_t(z, p.w, None)?; // [B, H]
        let ux = t.matmul_t(x, p.u, Some(p.b))?; // [B, H]
        let s = t.add(wz, ux)?;
        Ok(t.tanh(s))
    }
}

/// Two interleaved spirals with Gaussian noise: x [N, 2], labels [N].
fn spirals(n: usize, noise: f32, rng: &mut impl Rng) -> (Array2<f32>, Vec<usize>) {
    let normal = Normal::new(0.0f32, noise).unwrap();
    let mut x = Array2::zeros((n, 2));
    let mut y = vec![0; n];
    for i in 0..n {
        let class = i % 2;
        let t: f32 = rng.gen_range(0.0..1.0f32).sqrt() * 3.0 * std::f32::consts::PI;
        let sign = if class == 0 { 1.0 } else { -1.0 };
        let r = t / (3.0 * std::f32::consts::PI) * 2.0;
        x[[i, 0]] = sign * r * t.cos() + normal.sample(rng);
        x[[i, 1]] = sign * r * t.sin() + normal.sample(rng);
        y[i] = class;
    }
    (x, y)
}

/// Mean softmax cross-entropy of logits [B, C] against labels, as a custom tape op.
fn cross_entropy(t: &mut Tape<f32>, logits: Var, labels: &[usize]) -> Var {
    let l = t
        .value(logits)
        .clone()
        .into_dimensionality::<ndarray::Ix2>()
        .expect("[B, C] logits");
    let b = l.nrows() as f32;
    let mut probs = l.clone();
    let mut loss = 0.0f32;
    for (mut row, &y) in probs.axis_iter_mut(Axis(0)).zip(labels) {
        let max = row.fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        row.mapv_inplace(|v| (v - max).exp());
        let sum = row.sum();
        row /= sum;
        loss -= row[y].max(1e-30).ln();
    }
    let labels = labels.to_vec();
    t.custom(
        &[logits],
        ArrayD::from_elem(vec![], loss / b),
        Box::new(move |g: &ArrayD<f32>| {
            let g = *g.iter().next().unwrap();
            let mut d = probs;
            for (mut row, &y) in d.axis_iter_mut(Axis(0)).zip(&labels) {
                row[y] -= 1.0;
            }
            Ok(vec![Some((d * (g / b)).into_dyn())])
        }),
    )
}

/// Rescales W (in the store) to spectral norm ≤ `max` (power iteration, seeded start).
fn project_spectral(w: &mut ArrayD<f32>, max: f32) {
    let w2 = w
        .view()
        .into_dimensionality::<ndarray::Ix2>()
        .unwrap()
        .to_owned();
    let mut v = ndarray::Array1::from_elem(w2.ncols(), 1.0f32 / (w2.ncols() as f32).sqrt());
    let mut sigma = 0.0;
    for _ in 0..30 {
        let u = w2.dot(&v);
        let wtu = w2.t().dot(&u);
        let n = wtu.dot(&wtu).sqrt();
        if n == 0.0 {
            return;
        }
        sigma = (u.dot(&u)).sqrt();
        v = wtu / n;
    }
    if sigma > max {
        w.mapv_inplace(|a| a * (max / sigma));
    }
}

struct RuleResult {
    name: String,
    rule_json: serde_json::Value,
    train_acc: f64,
    test_acc: f64,
    seconds: f64,
    peak_tape_bytes: usize,
    peak_scratch_bytes: usize,
    mean_fwd_iters: f64,
    mean_bwd_iters: f64,
    final_loss: f64,
}

/// Short human label of a rule for the table.
fn label(rule: &GradientRule) -> String {
    match rule {
        GradientRule::Unroll { k } => format!("unroll k={k}"),
        GradientRule::Jfb => "jfb".into(),
        GradientRule::StochasticJfb { no_grad, grad, .. } => {
            format!("sjfb m~U{no_grad:?} n~U{grad:?}")
        }
        GradientRule::Implicit { solver, stop, .. } => {
            format!("implicit/{} rel_tol={:e}", solver.name(), stop.rel_tol)
        }
        GradientRule::Phantom { k, tau } => format!("phantom k={k} tau={tau}"),
    }
}

fn accuracy(store: &ParamStore, x: &Array2<f32>, y: &[usize], deq: &DeqConfig) -> elm::Result<f64> {
    let mut tape = Tape::<f32>::new();
    let (w, u, b, v, c) = (0, 1, 2, 3, 4);
    let mut constant = |i: usize| tape.constant(store.value(i).clone());
    let params = TanhParams {
        w: constant(w),
        u: constant(u),
        b: constant(b),
    };
    let xv = tape.constant(x.clone().into_dyn());
    let z0 = ArrayD::zeros(vec![x.nrows(), HIDDEN]);
    let jfb = DeqConfig {
        gradient: GradientRule::Jfb,
        ..deq.clone()
    };
    let (z, _) = elm::grad::implicit_forward(&mut tape, &TanhDeq, xv, &params, &z0, &jfb)?;
    let vv = tape.constant(store.value(v).clone());
    let cv = tape.constant(store.value(c).clone());
    let logits = tape.matmul_t(z, vv, Some(cv))?;
    let l = tape.value(logits);
    let correct = l
        .axis_iter(Axis(0))
        .zip(y)
        .filter(|(row, &yy)| (row[1] > row[0]) == (yy == 1))
        .count();
    Ok(correct as f64 / y.len() as f64)
}

fn train(
    rule: GradientRule,
    solver: &SolverConfig,
    (jacobian, correction): (&JacobianPenalty, &FixedPointCorrection),
    steps: usize,
    seed: u64,
    data: &(Array2<f32>, Vec<usize>, Array2<f32>, Vec<usize>),
) -> elm::Result<RuleResult> {
    let (xtr, ytr, xte, yte) = data;
    let mut rng = elm::train::seeded_rng(seed);
    let init = |r: usize, c: usize, scale: f32, rng: &mut rand::rngs::StdRng| {
        let n = Normal::new(0.0f32, scale).unwrap();
        ArrayD::from_shape_fn(vec![r, c], |_| n.sample(rng))
    };
    let mut store = ParamStore::new();
    let mut w0 = init(HIDDEN, HIDDEN, 1.0 / (HIDDEN as f32).sqrt(), &mut rng);
    project_spectral(&mut w0, 0.5);
    store.insert("deq.w", w0, true)?;
    store.insert("deq.u", init(HIDDEN, 2, 1.5, &mut rng), true)?;
    store.insert("deq.bias", ArrayD::zeros(vec![HIDDEN]), true)?;
    store.insert(
        "head.v",
        init(CLASSES, HIDDEN, 1.0 / (HIDDEN as f32).sqrt(), &mut rng),
        true,
    )?;
    store.insert("head.bias", ArrayD::zeros(vec![CLASSES]), true)?;

    let mut opt = AdamW::new(AdamWConfig {
        beta1: 0.9,
        beta2: 0.99,
        weight_decay: 1e-4,
        ..Default::default()
    })?;
    let sched = ScheduleConfig::warmup_cosine(2e-2, steps, 0.05, 0.05);
    let deq = DeqConfig::new(rule.clone()).with_forward(
        solver.clone(),
        StopCriteria {
            rel_tol: 1e-5,
            max_iter: 60,
            ..Default::default()
        },
    );
    let mut driver = ImplicitDriver::<f32>::new(deq.clone())?;
    let (mut peak, mut scratch, mut fwd_iters, mut bwd_iters, mut last_loss) =
        (0, 0, 0usize, 0usize, 0.0);
    let start = Instant::now();
    for step in 0..steps {
        let mut tape = Tape::<f32>::new();
        let vars = store.register(&mut tape);
        let x = tape.constant(xtr.clone().into_dyn());
        let z0 = ArrayD::zeros(vec![xtr.nrows(), HIDDEN]);
        let params = TanhParams {
            w: vars.var(0),
            u: vars.var(1),
            b: vars.var(2),
        };
        let (z, report) = driver.forward(&mut tape, &TanhDeq, x, &params, &z0)?;
        let head = |t: &mut Tape<f32>, zi| {
            let logits = t.matmul_t(zi, vars.var(3), Some(vars.var(4)))?;
            Ok(cross_entropy(t, logits, ytr))
        };
        let mut loss = head(&mut tape, z)?;
        last_loss = tape.scalar(loss) as f64;
        if !correction.is_off() {
            // The classifier loss on every taped iterate, the later ones weighted more.
            loss = fixed_point_correction(&mut tape, &report.taped_iterates, correction, head)?;
        }
        if !jacobian.is_off() {
            // Hutchinson ‖∂f/∂z‖²_F at the fixed point: keeps the map contractive.
            let zs = tape.value(z).clone();
            let pen = jacobian_penalty(&mut tape, &TanhDeq, &zs, x, &params, jacobian, &mut rng)?;
            let w = tape.scale(pen, jacobian.weight as f32);
            loss = tape.add(loss, w)?;
        }
        let mut g = tape.backward(loss)?;
        peak = peak.max(tape.peak_bytes());
        fwd_iters += report.forward_iterations;
        if let Some(b) = report.backward.get() {
            bwd_iters += b.iterations;
            scratch = scratch.max(b.scratch_peak_bytes);
        }
        let mut grads = store.collect_grads(&vars, &mut g)?;
        grads.clip_global_norm(5.0)?;
        opt.step(&mut store, &grads, sched.lr_at(step))?;
        project_spectral(store.value_mut(0), 0.9);
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(RuleResult {
        name: label(&rule),
        rule_json: serde_json::to_value(&rule).expect("rule serialises"),
        train_acc: accuracy(&store, xtr, ytr, &deq)?,
        test_acc: accuracy(&store, xte, yte, &deq)?,
        seconds,
        peak_tape_bytes: peak,
        peak_scratch_bytes: scratch,
        mean_fwd_iters: fwd_iters as f64 / steps as f64,
        mean_bwd_iters: bwd_iters as f64 / steps as f64,
        final_loss: last_loss,
    })
}

fn main() -> elm::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let arg = |name: &str, default: u64| -> elm::Result<u64> { args::flag(&args, name, default) };
    let steps = arg("--steps", 200)? as usize;
    let seed = arg("--seed", 0)?;
    let solver = match args.iter().position(|a| a == "--solver") {
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some("adaptive-picard") => {
                SolverConfig::custom(adaptive_picard::AdaptivePicard::default())
            }
            Some(name) => SolverConfig::by_name(name)?,
            None => return Err(elm::ElmError::config("--solver", "expects a solver name")),
        },
        None => SolverConfig::anderson(),
    };
    // `--jac-weight W` (per mille, an integer like the other flags): the Hutchinson Jacobian
    // regulariser at weight W / 1000.
    let jacobian = JacobianPenalty {
        weight: arg("--jac-weight", 0)? as f64 / 1000.0,
        ..JacobianPenalty::default()
    };
    // `--fpc-gamma G` (per cent): the fixed-point correction loss with γ = G / 100 (0 = off).
    let correction = FixedPointCorrection {
        gamma: arg("--fpc-gamma", 0)? as f64 / 100.0,
    };
    correction.validate()?;
    let mut rng = elm::train::seeded_rng(seed);
    let (xtr, ytr) = spirals(N_POINTS, 0.08, &mut rng);
    let (xte, yte) = spirals(N_POINTS, 0.08, &mut rng);
    let data = (xtr, ytr, xte, yte);

    // The implicit rule's backward solver: Anderson and Broyden by default, the chosen one else.
    let backward = if args.iter().any(|a| a == "--solver") {
        vec![solver.clone()]
    } else {
        vec![SolverConfig::anderson(), SolverConfig::broyden()]
    };
    let mut rules = vec![
        GradientRule::Unroll { k: 20 },
        GradientRule::Jfb,
        GradientRule::sjfb_default(8, seed),
    ];
    rules.extend(
        backward
            .into_iter()
            .map(|b| GradientRule::implicit(b, 1e-4, 60)),
    );
    let mut results = vec![];
    for rule in rules {
        if !json {
            eprintln!("training with {} ...", rule.name());
        }
        results.push(train(
            rule,
            &solver,
            (&jacobian, &correction),
            steps,
            seed,
            &data,
        )?);
    }
    if json {
        let rows: Vec<_> = results
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name, "rule": r.rule_json,
                    "train_acc": r.train_acc, "test_acc": r.test_acc, "train_seconds": r.seconds,
                    "peak_tape_bytes": r.peak_tape_bytes, "peak_scratch_tape_bytes": r.peak_scratch_bytes,
                    "mean_forward_iters": r.mean_fwd_iters, "mean_backward_iters": r.mean_bwd_iters,
                    "final_train_loss": r.final_loss,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "steps": steps, "seed": seed, "solver": solver.name(), "hidden": HIDDEN, "n_train": N_POINTS, "n_test": N_POINTS, "results": rows })
        );
    } else {
        println!("two spirals, {steps} steps, hidden {HIDDEN}, {N_POINTS} train / {N_POINTS} test points, seed {seed}");
        println!(
            "{:<28} {:>6} {:>6} {:>7} {:>9} {:>11} {:>6} {:>6} {:>7}",
            "rule",
            "train",
            "test",
            "time s",
            "tape KiB",
            "scratch KiB",
            "fwd it",
            "bwd it",
            "loss"
        );
        for r in &results {
            println!(
                "{:<28} {:>6.3} {:>6.3} {:>7.2} {:>9.1} {:>11.1} {:>6.1} {:>6.1} {:>7.4}",
                r.name,
                r.train_acc,
                r.test_acc,
                r.seconds,
                r.peak_tape_bytes as f64 / 1024.0,
                r.peak_scratch_bytes as f64 / 1024.0,
                r.mean_fwd_iters,
                r.mean_bwd_iters,
                r.final_loss
            );
        }
    }
    if args.iter().any(|a| a == "--check") {
        if let Some(bad) = results.iter().find(|r| r.test_acc < 0.75) {
            return Err(elm::ElmError::InvalidArgument(format!(
                "{} with solver {} reached test accuracy {:.3} < 0.75",
                bad.name,
                solver.name(),
                bad.test_acc
            )));
        }
    }
    Ok(())
}
