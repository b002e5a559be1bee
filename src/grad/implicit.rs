//! [`ImplicitLayer`] and [`implicit_forward`]: put a fixed point `z* = f(z*, x; θ)` on the tape
//! with the backward pass chosen by a [`GradientRule`].

use std::sync::{Arc, Mutex};

use ndarray::{Array2, ArrayD, ArrayView2, ArrayViewMut2, Axis, IxDyn, Zip};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::rule::{BackwardFailure, DeqConfig, GradientRule};
use crate::autograd::{AdFloat, Tape, Var};
use crate::solver::{
    FixedPointMap, FnMap, LinearOperator, LinearSolverConfig, MapError, RowOutcome, RowStatus,
    SolverError, SolverFloat,
};
use crate::{ElmError, Result};

/// Scalars the gradient rules run on: tape scalars that the solvers also accept (`f32`, `f64`).
pub trait GradFloat: AdFloat + SolverFloat {}
impl<T: AdFloat + SolverFloat> GradFloat for T {}

/// The parameters of an implicit layer as one typed set of tape handles (a struct with a field
/// per parameter; see [`crate::param_set!`]). Its field order is the one order in which the
/// gradient rules move the parameters between tapes.
pub trait ParamSet: Clone + 'static {
    /// Every handle, in the set's fixed order.
    fn vars(&self) -> Vec<Var>;
    /// The same set over other handles given in [`ParamSet::vars`] order (e.g. the leaves of a
    /// scratch tape).
    fn with_vars(&self, vars: &[Var]) -> Result<Self>;
}

/// A plain list, for quick experiments (positions instead of names).
impl ParamSet for Vec<Var> {
    fn vars(&self) -> Vec<Var> {
        self.clone()
    }
    fn with_vars(&self, vars: &[Var]) -> Result<Self> {
        check_param_count(vars.len(), self.len())?;
        Ok(vars.to_vec())
    }
}

/// Errors unless `got == want` (used by [`ParamSet::with_vars`] implementations).
pub fn check_param_count(got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(ElmError::shape(
            "ParamSet::with_vars",
            format!("{got} handles for a set of {want} parameters"),
        ))
    }
}

/// Declares a [`ParamSet`] struct whose fields are tape handles, written once:
/// `elm::param_set! { pub struct TanhParams { w, u, b } }` gives `TanhParams { w: Var, u: Var,
/// b: Var }` with the order `w, u, b`.
#[macro_export]
macro_rules! param_set {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($(#[$fmeta:meta])* $field:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug)]
        $vis struct $name { $($(#[$fmeta])* pub $field: $crate::autograd::Var),+ }
        impl $crate::grad::ParamSet for $name {
            fn vars(&self) -> Vec<$crate::autograd::Var> {
                vec![$(self.$field),+]
            }
            fn with_vars(&self, vars: &[$crate::autograd::Var]) -> $crate::Result<Self> {
                $crate::grad::check_param_count(vars.len(), self.vars().len())?;
                let mut it = vars.iter().copied();
                Ok($name { $($field: it.next().unwrap_or(self.$field)),+ })
            }
        }
    };
}

/// A fixed-point layer `z ↦ f(z, x; θ)`. Implement [`ImplicitLayer::forward`] once; everything
/// else (solver map, gradient rules) is derived from it.
pub trait ImplicitLayer<T: AdFloat> {
    /// The layer's parameters (θ) as typed tape handles.
    type Params: ParamSet;

    /// One application of `f` on the tape. `z` has the state shape `[B, ...]` (batch first),
    /// `x` is the injected input. Must return a Var with the shape of `z`.
    fn forward(&self, tape: &mut Tape<T>, z: Var, x: Var, params: &Self::Params) -> Result<Var>;

    /// `f` without recording (used by the forward solver and gradient-free iterations);
    /// `values[i]` is the value of `params.vars()[i]`. Default: [`ImplicitLayer::forward`] on a
    /// scratch tape under `no_grad`, sharing `x` and the values without copying them. Override
    /// with a faster path if you have one.
    fn eval(
        &self,
        z: ArrayD<T>,
        x: &Arc<ArrayD<T>>,
        params: &Self::Params,
        values: &[Arc<ArrayD<T>>],
    ) -> Result<ArrayD<T>> {
        let mut tape = Tape::<T>::new();
        tape.no_grad(|t| {
            let zv = t.constant(z);
            let xv = t.constant_shared(x.clone());
            let vars: Vec<Var> = values
                .iter()
                .map(|p| t.constant_shared(p.clone()))
                .collect();
            let out = self.forward(t, zv, xv, &params.with_vars(&vars)?)?;
            Ok(t.value(out).clone())
        })
    }
}

/// What the backward pass of the [`GradientRule::Implicit`] rule did (filled when the tape's
/// backward reaches the fixed-point node, also when it then returns an error).
#[derive(Clone, Debug, Serialize)]
pub struct BackwardReport {
    /// Adjoint method: the fixed-point solver's name, or `gmres`, `bicgstab`, `neumann`, `cgnr`.
    pub solver: &'static str,
    /// Largest per-row adjoint iteration count (VJP evaluations; for `cgnr`, products: VJPs
    /// and central-difference `J·v`, two forward passes each).
    pub iterations: usize,
    /// Batched VJP evaluations of the adjoint solve (the final VJP w.r.t. x and θ is not
    /// counted; for `cgnr`, VJPs and `J·v` products together).
    pub vjp_evals: usize,
    /// Largest per-row absolute adjoint residual `‖Jᵀu + g − u‖₂`.
    pub residual: f64,
    /// Largest per-row relative adjoint residual (see the rule's `stop` for its denominator).
    pub rel_residual: f64,
    /// Per-row outcomes of the adjoint solve: status, VJP evaluations, residuals (empty when
    /// the solve itself errored).
    pub rows: Vec<RowOutcome>,
    /// The rule's policy for rows that did not converge.
    pub on_failure: BackwardFailure,
    /// Rows whose adjoint solve did not converge (every row when the solve errored as a whole).
    pub failed_rows: Vec<usize>,
    /// Rows that fell back to the JFB gradient (`u = g`; policy `jfb`).
    pub fallback_rows: usize,
    /// Rows that kept the solver's unconverged iterate (policy `keep`).
    pub kept_rows: usize,
    /// Peak bytes of the scratch tapes used for the VJPs.
    pub scratch_peak_bytes: usize,
    /// True when `f` was recorded once and replayed for every adjoint VJP (`vjp_retain`); false
    /// when the layer's graph is not replayable and each VJP re-ran the forward.
    pub replayed_graph: bool,
    /// Why the adjoint solve failed as a whole (every row then uses the JFB gradient).
    pub error: Option<String>,
}

impl BackwardReport {
    /// True when every row's adjoint solve converged (no fallback, no kept iterate).
    pub fn converged(&self) -> bool {
        self.error.is_none() && self.failed_rows.is_empty()
    }
}

/// Shared slot the implicit backward writes its [`BackwardReport`] into.
#[derive(Clone, Debug, Default)]
pub struct BackwardSlot(Arc<Mutex<Option<BackwardReport>>>);

impl BackwardSlot {
    /// The report, once the tape's backward has run through the fixed-point node.
    pub fn get(&self) -> Option<BackwardReport> {
        self.0.lock().ok().and_then(|g| g.clone())
    }
    fn set(&self, r: BackwardReport) {
        if let Ok(mut g) = self.0.lock() {
            *g = Some(r);
        }
    }
}

/// What [`implicit_forward`] did.
#[derive(Clone, Debug)]
pub struct GradReport {
    /// Rule name (see [`GradientRule::name`]).
    pub rule: &'static str,
    /// Iterations on the forward path: solver iterations (largest over rows) for
    /// `jfb`/`implicit`/`phantom`,
    /// `k` for `unroll`, gradient-free + differentiable iterations for `stochastic_jfb`.
    pub forward_iterations: usize,
    /// Batched evaluations of `f` without tape (solver map calls or gradient-free iterations).
    pub nograd_evals: usize,
    /// Differentiable applications of `f` recorded on the tape.
    pub tape_applications: usize,
    /// Largest per-row forward residual: the solver's `‖f(z)−z‖₂` for `jfb`/`implicit`/`phantom`;
    /// for the iterated rules the last step's `‖z_last − z_prev‖₂`.
    pub forward_residual: f64,
    /// Per-row outcomes of the forward solve (`jfb`/`implicit`/`phantom` only).
    pub forward_rows: Option<Vec<RowOutcome>>,
    /// `(gradient-free, differentiable)` iteration counts drawn by `stochastic_jfb`.
    pub sampled: Option<(usize, usize)>,
    /// Filled by the backward pass of `implicit`.
    pub backward: BackwardSlot,
    /// The differentiable iterates on the tape, first to last (the last is the returned
    /// state): what [`super::fixed_point_correction`] weighs. The iterated rules (`unroll`,
    /// `stochastic_jfb`, `phantom`) give one per taped step; `jfb` its one application;
    /// `implicit` none besides the output.
    pub taped_iterates: Vec<Var>,
}

impl GradReport {
    /// True when the forward solve (if any) converged on every row.
    pub fn forward_converged(&self) -> bool {
        self.forward_rows
            .as_ref()
            .is_none_or(|r| r.iter().all(|o| o.status == RowStatus::Converged))
    }
}

/// Batch size and flattened row width of a state shape `[B, ...]`.
fn batch_dims(shape: &[usize]) -> Result<(usize, usize)> {
    if shape.len() < 2 {
        return Err(ElmError::shape(
            "implicit_forward",
            format!("state must be [B, ...] with at least 2 axes, got {shape:?}"),
        ));
    }
    Ok((shape[0], shape[1..].iter().product()))
}

/// `max` that propagates NaN (a NaN residual must not be hidden by the fold).
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// Row-wise max of `‖a[b] − c[b]‖₂` (f64), for states of shape `[B, ...]`.
fn max_row_diff<T: AdFloat>(a: &ArrayD<T>, c: &ArrayD<T>) -> f64 {
    (0..a.shape()[0])
        .map(|i| {
            a.index_axis(Axis(0), i)
                .iter()
                .zip(c.index_axis(Axis(0), i).iter())
                .map(|(&p, &q)| {
                    let d = (p - q).to_f64().unwrap_or(f64::NAN);
                    d * d
                })
                .sum::<f64>()
                .sqrt()
        })
        .fold(0.0, nan_max)
}

fn to_rows<T: AdFloat>(a: &ArrayD<T>, b: usize, d: usize) -> Result<ArrayView2<'_, T>> {
    a.view().into_shape_with_order((b, d)).map_err(|e| {
        ElmError::shape(
            "implicit_forward",
            format!("cannot view {:?} as [{b}, {d}]: {e}", a.shape()),
        )
    })
}

/// The layer's `f` at fixed `x, θ` as a solver map on `[B, D]` rows (evaluates every row).
struct LayerMap<'a, T: GradFloat, L: ImplicitLayer<T>> {
    layer: &'a L,
    x: Arc<ArrayD<T>>,
    params: &'a L::Params,
    values: Vec<Arc<ArrayD<T>>>,
    shape: Vec<usize>,
}

impl<T: GradFloat, L: ImplicitLayer<T>> FixedPointMap<T> for LayerMap<'_, T, L> {
    fn dim(&self) -> usize {
        self.shape[1..].iter().product()
    }
    fn eval(
        &mut self,
        z: ArrayView2<T>,
        _active: &[bool],
        mut out: ArrayViewMut2<T>,
    ) -> std::result::Result<(), MapError> {
        let zs = z
            .to_owned()
            .into_shape_with_order(IxDyn(&self.shape))
            .map_err(|e| ElmError::shape("LayerMap", e.to_string()))?;
        let y = self.layer.eval(zs, &self.x, self.params, &self.values)?;
        if y.shape() != self.shape.as_slice() {
            return Err(ElmError::shape(
                "ImplicitLayer::forward",
                format!(
                    "output shape {:?} != state shape {:?}",
                    y.shape(),
                    self.shape
                ),
            )
            .into());
        }
        out.assign(&to_rows(&y, z.nrows(), z.ncols())?);
        Ok(())
    }
}

/// Runs the forward solver on the layer's map from `z0`; returns `z*` (state shape) + the solution.
fn solve_forward<T: GradFloat, L: ImplicitLayer<T>>(
    layer: &L,
    x: Arc<ArrayD<T>>,
    params: &L::Params,
    values: Vec<Arc<ArrayD<T>>>,
    z0: &ArrayD<T>,
    deq: &DeqConfig,
) -> Result<(ArrayD<T>, Vec<RowOutcome>, usize)> {
    let shape = z0.shape().to_vec();
    let (b, d) = batch_dims(&shape)?;
    let mut map = LayerMap {
        layer,
        x,
        params,
        values,
        shape: shape.clone(),
    };
    let z0_std = z0.as_standard_layout().into_owned();
    let solver = deq.forward_solver.build::<T>();
    let sol = solver.solve(&mut map, to_rows(&z0_std, b, d)?, &deq.forward_stop)?;
    let z = sol
        .z
        .into_shape_with_order(IxDyn(&shape))
        .map_err(|e| ElmError::shape("implicit_forward", e.to_string()))?;
    Ok((z, sol.rows, sol.map_evals))
}

/// [`implicit_forward_with_rng`] with the `stochastic_jfb` draws taken from a fresh
/// `StdRng::seed_from_u64(seed)`: every call draws the same iteration counts. For training use
/// [`ImplicitDriver`], which keeps one seeded stream across calls.
pub fn implicit_forward<T: GradFloat, L: ImplicitLayer<T> + Clone + 'static>(
    tape: &mut Tape<T>,
    layer: &L,
    x: Var,
    params: &L::Params,
    z0: &ArrayD<T>,
    deq: &DeqConfig,
) -> Result<(Var, GradReport)> {
    let mut rng = StdRng::seed_from_u64(deq.gradient.seed());
    implicit_forward_with_rng(tape, layer, x, params, z0, deq, &mut rng)
}

/// Puts the fixed point of `layer` (from the detached start `z0`, shape `[B, ...]`) on `tape` and
/// returns it as a Var whose backward implements `rule`, plus a [`GradReport`].
/// `x` and `params` may be params or constants; gradients reach those that require them.
/// `deq` gives the rule, the forward solver and its stop criteria (used by `jfb` / `implicit`).
pub fn implicit_forward_with_rng<T: GradFloat, L: ImplicitLayer<T> + Clone + 'static>(
    tape: &mut Tape<T>,
    layer: &L,
    x: Var,
    params: &L::Params,
    z0: &ArrayD<T>,
    deq: &DeqConfig,
    rng: &mut StdRng,
) -> Result<(Var, GradReport)> {
    deq.validate()?;
    let rule = &deq.gradient;
    batch_dims(z0.shape())?;
    if z0.iter().any(|v| !v.is_finite()) {
        return Err(ElmError::NonFinite(
            "implicit_forward: initial state z0".into(),
        ));
    }
    let x_val = tape.shared(x);
    let param_vars = params.vars();
    let p_vals: Vec<Arc<ArrayD<T>>> = param_vars.iter().map(|&p| tape.shared(p)).collect();
    let mut report = GradReport {
        rule: rule.name(),
        forward_iterations: 0,
        nograd_evals: 0,
        tape_applications: 0,
        forward_residual: f64::NAN,
        forward_rows: None,
        sampled: None,
        backward: BackwardSlot::default(),
        taped_iterates: Vec::new(),
    };
    // Differentiable iterations from a detached start; returns the last output.
    let unroll =
        |tape: &mut Tape<T>, start: ArrayD<T>, n: usize, report: &mut GradReport| -> Result<Var> {
            let mut z = tape.constant(start);
            let mut prev_val: Option<Arc<ArrayD<T>>> = None;
            for _ in 0..n {
                prev_val = Some(tape.shared(z));
                z = layer.forward(tape, z, x, params)?;
                check_state_shape(tape.value(z), z0.shape())?;
                report.taped_iterates.push(z);
            }
            report.tape_applications += n;
            if let Some(p) = prev_val {
                report.forward_residual = max_row_diff(tape.value(z), &p);
            }
            Ok(z)
        };
    match rule {
        GradientRule::Unroll { k } => {
            report.forward_iterations = *k;
            let z = unroll(tape, z0.clone(), *k, &mut report)?;
            Ok((z, report))
        }
        GradientRule::StochasticJfb { no_grad, grad, .. } => {
            let free = rng.gen_range(no_grad[0]..=no_grad[1]);
            let taped = rng.gen_range(grad[0]..=grad[1]);
            let mut z = z0.clone();
            for _ in 0..free {
                z = layer.eval(z, &x_val, params, &p_vals)?;
                check_state_shape(&z, z0.shape())?;
            }
            report.nograd_evals = free;
            report.sampled = Some((free, taped));
            report.forward_iterations = free + taped;
            let out = unroll(tape, z, taped, &mut report)?;
            Ok((out, report))
        }
        GradientRule::Jfb => {
            let (z_star, rows, evals) = solve_forward(layer, x_val, params, p_vals, z0, deq)?;
            fill_forward(&mut report, rows, evals);
            let zc = tape.constant(z_star);
            let out = layer.forward(tape, zc, x, params)?;
            check_state_shape(tape.value(out), z0.shape())?;
            report.tape_applications = 1;
            report.taped_iterates.push(out);
            Ok((out, report))
        }
        GradientRule::Phantom { k, tau } => {
            let (z_star, rows, evals) = solve_forward(layer, x_val, params, p_vals, z0, deq)?;
            fill_forward(&mut report, rows, evals);
            let mut z = tape.constant(z_star);
            for _ in 0..*k {
                let fz = layer.forward(tape, z, x, params)?;
                check_state_shape(tape.value(fz), z0.shape())?;
                z = if *tau == 1.0 {
                    fz
                } else {
                    // The damped step (1 − τ) z + τ f(z): its Jacobian (1−τ)I + τJ is what the
                    // phantom gradient sums powers of.
                    let kept = tape.scale(z, T::of(1.0 - tau));
                    let moved = tape.scale(fz, T::of(*tau));
                    tape.add(kept, moved)?
                };
                report.taped_iterates.push(z);
            }
            report.tape_applications = *k;
            Ok((z, report))
        }
        GradientRule::Implicit {
            solver,
            stop,
            on_failure,
        } => {
            let (z_star, rows, evals) =
                solve_forward(layer, x_val.clone(), params, p_vals.clone(), z0, deq)?;
            fill_forward(&mut report, rows, evals);
            let mut inputs = vec![x];
            inputs.extend_from_slice(&param_vars);
            let needs: Vec<bool> = inputs.iter().map(|&v| tape.requires_grad(v)).collect();
            let ctx = AdjointCtx {
                layer: layer.clone(),
                z_star: Arc::new(z_star.clone()),
                x: x_val,
                params: params.clone(),
                values: p_vals,
                needs,
                solver: solver.clone(),
                stop: stop.clone(),
                on_failure: *on_failure,
                slot: report.backward.clone(),
            };
            let out = tape.custom(
                &inputs,
                z_star,
                Box::new(move |g: &ArrayD<T>| ctx.backward(g)),
            );
            report.taped_iterates.push(out);
            Ok((out, report))
        }
    }
}

fn check_state_shape<T>(y: &ArrayD<T>, want: &[usize]) -> Result<()> {
    if y.shape() != want {
        return Err(ElmError::shape(
            "ImplicitLayer::forward",
            format!("output shape {:?} != state shape {:?}", y.shape(), want),
        ));
    }
    Ok(())
}

fn fill_forward(report: &mut GradReport, rows: Vec<RowOutcome>, evals: usize) {
    report.forward_iterations = rows.iter().map(|r| r.iterations).max().unwrap_or(0);
    report.forward_residual = rows.iter().map(|r| r.residual).fold(0.0, nan_max);
    report.nograd_evals = evals;
    report.forward_rows = Some(rows);
}

/// Everything the IFT backward needs, captured at forward time.
struct AdjointCtx<T: GradFloat, L: ImplicitLayer<T>> {
    layer: L,
    z_star: Arc<ArrayD<T>>,
    x: Arc<ArrayD<T>>,
    params: L::Params,
    /// Values of `params.vars()`, in that order.
    values: Vec<Arc<ArrayD<T>>>,
    /// Whether x and each param (in that order) need a gradient.
    needs: Vec<bool>,
    solver: LinearSolverConfig,
    stop: crate::solver::StopCriteria,
    on_failure: BackwardFailure,
    slot: BackwardSlot,
}

impl<T: GradFloat, L: ImplicitLayer<T>> AdjointCtx<T, L> {
    /// `f(z*, x, θ)` on a scratch tape; `z` differentiable iff `z_grad`, x/θ per `xp_grad`.
    fn scratch(&self, z_grad: bool, xp_grad: bool) -> Result<(Tape<T>, Var, Vec<Var>, Var)> {
        self.scratch_at(self.z_star.clone(), z_grad, xp_grad)
    }

    /// [`AdjointCtx::scratch`] at the state `z` instead of `z*`.
    fn scratch_at(
        &self,
        z: Arc<ArrayD<T>>,
        z_grad: bool,
        xp_grad: bool,
    ) -> Result<(Tape<T>, Var, Vec<Var>, Var)> {
        let mut t = Tape::<T>::new();
        let zv = if z_grad {
            t.param_shared(z)
        } else {
            t.constant_shared(z)
        };
        let mut leaves = Vec::with_capacity(1 + self.values.len());
        for (i, a) in std::iter::once(&self.x)
            .chain(self.values.iter())
            .enumerate()
        {
            leaves.push(if xp_grad && self.needs[i] {
                t.param_shared(a.clone())
            } else {
                t.constant_shared(a.clone())
            });
        }
        let params = self.params.with_vars(&leaves[1..])?;
        let y = self.layer.forward(&mut t, zv, leaves[0], &params)?;
        Ok((t, zv, leaves, y))
    }

    /// `out = J v` at `z*` by central differences, `(f(z* + εv) − f(z* − εv)) / 2ε` with
    /// `ε = ∛eps · (1 + ‖z*‖∞) / ‖v‖∞`: truncation and rounding errors balanced, relative
    /// error about `eps^{2/3}` (1e-5 in f32, 1e-11 in f64) for a smooth layer.
    fn jv(&self, v: ArrayView2<T>, mut out: ArrayViewMut2<T>, b: usize, d: usize) -> Result<()> {
        let vmax = v.iter().fold(0.0f64, |m, x| m.max(x.widen().abs()));
        if vmax == 0.0 {
            out.fill(T::zero());
            return Ok(());
        }
        let zmax = self
            .z_star
            .iter()
            .fold(0.0f64, |m, x| m.max(x.widen().abs()));
        let eps = T::epsilon().widen().cbrt() * (1.0 + zmax) / vmax;
        let v = v
            .to_owned()
            .into_shape_with_order(IxDyn(self.z_star.shape()))
            .map_err(|e| ElmError::shape("adjoint", e.to_string()))?;
        let at = |sign: f64| -> Result<ArrayD<T>> {
            let step = T::narrow(sign * eps);
            let z = &*self.z_star + &(&v * step);
            let (t, _, _, y) = self.scratch_at(Arc::new(z), false, false)?;
            Ok(t.value(y).clone())
        };
        let (plus, minus) = (at(1.0)?, at(-1.0)?);
        let jv = (plus - minus).mapv(|x| T::narrow(x.widen() / (2.0 * eps)));
        let jv = jv.as_standard_layout().into_owned();
        out.assign(&to_rows(&jv, b, d)?);
        Ok(())
    }

    fn backward(self, g: &ArrayD<T>) -> Result<Vec<Option<ArrayD<T>>>> {
        let shape = self.z_star.shape().to_vec();
        let (b, d) = batch_dims(&shape)?;
        let g_std = g.as_standard_layout().into_owned();
        let g_rows = to_rows(&g_std, b, d)?.to_owned();
        let mut vjp = AdjointVjp {
            retained: Some(self.scratch(true, false)?),
            ctx: &self,
            scratch_peak: 0,
            shape: shape.clone(),
            b,
            d,
        };
        let method = self.solver.name();
        // (u [B, D], per-row outcomes, batched VJPs), or why the solve failed as a whole.
        let solve: std::result::Result<(Array2<T>, Vec<RowOutcome>, usize), SolverError> =
            match &self.solver {
                LinearSolverConfig::FixedPoint(cfg) => {
                    // u ↦ Jᵀu + g from u₀ = g, as the rule has always solved it.
                    let mut map = FnMap::new(
                        d,
                        |u: ArrayView2<T>,
                         _active: &[bool],
                         mut out: ArrayViewMut2<T>|
                         -> std::result::Result<(), MapError> {
                            vjp.jt(u, out.view_mut())?;
                            out += &g_rows;
                            Ok(())
                        },
                    );
                    cfg.build::<T>()
                        .solve(&mut map, g_rows.view(), &self.stop)
                        .map(|s| (s.z, s.rows, s.map_evals))
                }
                linear => {
                    // (I − Jᵀ) u = g from u₀ = 0, whose residual g needs no VJP.
                    let mut op = AdjointOperator {
                        vjp: &mut vjp,
                        b,
                        d,
                    };
                    let u0 = Array2::<T>::zeros((b, d));
                    linear
                        .solve(&mut op, g_rows.view(), u0.view(), &self.stop)
                        .map(|s| (s.x, s.rows, s.applications))
                }
            };
        let (scratch_peak, replayed_graph) = (vjp.scratch_peak, vjp.retained.is_some());
        let mut report = BackwardReport {
            solver: method,
            iterations: 0,
            vjp_evals: 0,
            residual: f64::NAN,
            rel_residual: f64::NAN,
            rows: Vec::new(),
            on_failure: self.on_failure,
            failed_rows: Vec::new(),
            fallback_rows: 0,
            kept_rows: 0,
            scratch_peak_bytes: scratch_peak,
            replayed_graph,
            error: None,
        };
        // Rows without a converged adjoint start at u = g (JFB) and change only as the policy says.
        let mut u = g_rows.clone();
        let mut refused: Vec<usize> = Vec::new();
        match solve {
            Ok((x, rows, evals)) => {
                for (i, r) in rows.iter().enumerate() {
                    if r.status == RowStatus::Converged {
                        u.row_mut(i).assign(&x.row(i));
                    } else {
                        report.failed_rows.push(i);
                    }
                }
                match self.on_failure {
                    BackwardFailure::Jfb => report.fallback_rows = report.failed_rows.len(),
                    BackwardFailure::Error => refused = report.failed_rows.clone(),
                    BackwardFailure::Keep => {
                        for &i in &report.failed_rows {
                            if x.row(i).iter().all(|v| v.is_finite()) {
                                u.row_mut(i).assign(&x.row(i));
                                report.kept_rows += 1;
                            } else {
                                refused.push(i);
                            }
                        }
                    }
                }
                report.iterations = rows.iter().map(|r| r.iterations).max().unwrap_or(0);
                report.vjp_evals = evals;
                report.residual = rows.iter().map(|r| r.residual).fold(0.0, nan_max);
                report.rel_residual = rows.iter().map(|r| r.rel_residual).fold(0.0, nan_max);
                report.rows = rows;
            }
            Err(e) => {
                report.error = Some(e.to_string());
                report.failed_rows = (0..b).collect();
                if self.on_failure != BackwardFailure::Jfb {
                    // No iterate to keep or refuse row by row: the solve's own error.
                    self.slot.set(report);
                    return Err(ElmError::from(e));
                }
                report.fallback_rows = b;
            }
        }
        if !refused.is_empty() {
            let detail = describe_rows(&report.rows, &refused);
            self.slot.set(report);
            return Err(ElmError::BackwardSolve {
                method: method.to_string(),
                rows: refused,
                detail,
            });
        }
        // Final VJP w.r.t. x and θ with seed u.
        let (mut t, _, leaves, y) = self.scratch(false, true)?;
        let seed = u
            .into_shape_with_order(IxDyn(&shape))
            .map_err(|e| ElmError::shape("adjoint", e.to_string()))?;
        let mut grads = t.backward_from(y, seed)?;
        report.scratch_peak_bytes = report.scratch_peak_bytes.max(t.peak_bytes());
        self.slot.set(report);
        Ok(leaves
            .iter()
            .enumerate()
            .map(|(i, &v)| if self.needs[i] { grads.take(v) } else { None })
            .collect())
    }
}

/// `row 2: MaxIter after 3 VJPs, rel. residual 1.2e-2; ...` for the first few of `which`.
fn describe_rows(rows: &[RowOutcome], which: &[usize]) -> String {
    const SHOWN: usize = 4;
    let mut parts: Vec<String> = which
        .iter()
        .take(SHOWN)
        .filter_map(|&i| rows.get(i).map(|r| (i, r)))
        .map(|(i, r)| {
            format!(
                "row {i}: {:?} after {} VJPs, rel. residual {:.3e}",
                r.status, r.iterations, r.rel_residual
            )
        })
        .collect();
    if which.len() > SHOWN {
        parts.push(format!("{} more", which.len() - SHOWN));
    }
    parts.join("; ")
}

/// The adjoint system's `A = I − Jᵀ` for the linear solvers, with `Aᵀ = I − J` through
/// [`AdjointCtx::jv`] for CGNR.
struct AdjointOperator<'v, 'a, T: GradFloat, L: ImplicitLayer<T>> {
    vjp: &'v mut AdjointVjp<'a, T, L>,
    b: usize,
    d: usize,
}

impl<T: GradFloat, L: ImplicitLayer<T>> LinearOperator<T> for AdjointOperator<'_, '_, T, L> {
    fn dim(&self) -> usize {
        self.d
    }
    fn apply(
        &mut self,
        u: ArrayView2<T>,
        _active: &[bool],
        mut out: ArrayViewMut2<T>,
    ) -> std::result::Result<(), MapError> {
        self.vjp.jt(u, out.view_mut())?;
        Zip::from(&mut out).and(&u).for_each(|o, &ui| *o = ui - *o);
        Ok(())
    }
    fn has_transpose(&self) -> bool {
        true
    }
    fn apply_transpose(
        &mut self,
        v: ArrayView2<T>,
        _active: &[bool],
        mut out: ArrayViewMut2<T>,
    ) -> std::result::Result<(), MapError> {
        self.vjp.ctx.jv(v, out.view_mut(), self.b, self.d)?;
        Zip::from(&mut out).and(&v).for_each(|o, &vi| *o = vi - *o);
        Ok(())
    }
}

/// `u ↦ Jᵀu` at `z*` for a batch of adjoint rows: `f` recorded once on a scratch tape (only z
/// differentiable) and replayed with `vjp_retain`; a layer whose graph cannot be replayed (a
/// run-once custom op) gets a fresh scratch forward + consuming backward per product instead.
struct AdjointVjp<'a, T: GradFloat, L: ImplicitLayer<T>> {
    ctx: &'a AdjointCtx<T, L>,
    retained: Option<(Tape<T>, Var, Vec<Var>, Var)>,
    scratch_peak: usize,
    shape: Vec<usize>,
    b: usize,
    d: usize,
}

impl<T: GradFloat, L: ImplicitLayer<T>> AdjointVjp<'_, T, L> {
    /// `out = Jᵀu`, u and out `[B, D]` (the tape's VJP covers every row of the batch).
    fn jt(&mut self, u: ArrayView2<T>, mut out: ArrayViewMut2<T>) -> Result<()> {
        let seed = u
            .to_owned()
            .into_shape_with_order(IxDyn(&self.shape))
            .map_err(|e| ElmError::shape("adjoint", e.to_string()))?;
        let mut replayed = None;
        if let Some((t, zv, _, y)) = self.retained.as_mut() {
            match t.vjp_retain(*y, seed.clone()) {
                Ok(mut grads) => {
                    self.scratch_peak = self.scratch_peak.max(t.peak_bytes());
                    replayed = Some(grads.take(*zv));
                }
                Err(_) => self.retained = None,
            }
        }
        let jtu = match replayed {
            Some(j) => j,
            None => {
                let (mut t, zv, _, y) = self.ctx.scratch(true, false)?;
                let mut grads = t.backward_from(y, seed)?;
                self.scratch_peak = self.scratch_peak.max(t.peak_bytes());
                grads.take(zv)
            }
        };
        match jtu {
            Some(jtu) => {
                let jtu = jtu.as_standard_layout().into_owned();
                out.assign(&to_rows(&jtu, self.b, self.d)?);
            }
            None => out.fill(T::zero()),
        }
        Ok(())
    }
}

/// Runs a [`DeqConfig`] across training steps with one seeded RNG stream, so `stochastic_jfb`
/// draws fresh, reproducible iteration counts at each call.
pub struct ImplicitDriver<T: GradFloat> {
    deq: DeqConfig,
    rng: StdRng,
    _scalar: std::marker::PhantomData<T>,
}

impl<T: GradFloat> ImplicitDriver<T> {
    /// A driver for `deq` (validated). The RNG is seeded from the rule's seed (0 for rules
    /// without one).
    pub fn new(deq: DeqConfig) -> Result<Self> {
        deq.validate()?;
        let rng = StdRng::seed_from_u64(deq.gradient.seed());
        Ok(Self {
            deq,
            rng,
            _scalar: std::marker::PhantomData,
        })
    }

    /// The rule.
    pub fn rule(&self) -> &GradientRule {
        &self.deq.gradient
    }

    /// [`implicit_forward_with_rng`] with this driver's rule, solver and RNG stream.
    pub fn forward<L: ImplicitLayer<T> + Clone + 'static>(
        &mut self,
        tape: &mut Tape<T>,
        layer: &L,
        x: Var,
        params: &L::Params,
        z0: &ArrayD<T>,
    ) -> Result<(Var, GradReport)> {
        implicit_forward_with_rng(tape, layer, x, params, z0, &self.deq, &mut self.rng)
    }
}
