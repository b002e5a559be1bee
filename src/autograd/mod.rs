//! Reverse-mode automatic differentiation over `ndarray` (define-by-run).
//!
//! Build a fresh [`Tape`] per step: register leaves with [`Tape::param`] (receives a
//! gradient) or [`Tape::constant`] (frozen), apply ops (methods in [`ops`], layer ops in
//! `crate::nn`), then call [`Tape::backward`]. Each op records a vector-Jacobian product
//! (VJP) closure that owns exactly what its backward needs (shared `Arc` handles to input
//! values, plus small caches). During backward every closure is consumed (and so freed)
//! as soon as it has run, and the value of an intermediate node is dropped once every
//! consumer has been processed; [`Tape::peak_bytes`] reports the high-water mark.
//!
//! Reading a freed intermediate with [`Tape::value`] after backward panics (use
//! [`Tape::try_value`], read it before backward, or set [`Tape::retain_values`]).
//! [`Tape::vjp_retain`] instead runs a VJP without consuming or freeing anything, so one
//! recorded graph serves many seeds (adjoint iterations of implicit layers).
//!
//! Gradients only flow where needed: a node requires a gradient iff one of its inputs
//! does, and every built-in VJP skips the input gradients nobody asked for, so frozen
//! layers (constants) pass gradients to their inputs without computing weight gradients.

pub mod gradcheck;
pub mod ops;

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;

use ndarray::ArrayD;

use crate::error::{ElmError, Result};

pub use gradcheck::{gradcheck, GradcheckReport};

/// Scalar types the tape differentiates: `f32` for training, `f64` for gradient checks.
pub trait AdFloat:
    num_traits::Float
    + ndarray::LinalgScalar
    + ndarray::ScalarOperand
    + Send
    + Sync
    + Debug
    + std::fmt::Display
    + std::iter::Sum
    + std::ops::AddAssign
    + std::ops::SubAssign
    + std::ops::MulAssign
    + std::ops::DivAssign
    + 'static
{
    /// Lossless-enough conversion from `f64` constants (eps, scales).
    fn of(x: f64) -> Self {
        <Self as num_traits::NumCast>::from(x).expect("f64 constant fits in AdFloat")
    }
    /// Conversion from `f32` (model weights are stored as `f32`).
    fn of_f32(x: f32) -> Self {
        <Self as num_traits::NumCast>::from(x).expect("f32 value fits in AdFloat")
    }
    /// `a · b`: BLAS through `ndarray` by default; `f32` (training) takes
    /// [`crate::gemm`]'s kernel, `f64` (gradient checks) stays on BLAS.
    fn matmul(
        a: &ndarray::ArrayView2<Self>,
        b: &ndarray::ArrayView2<Self>,
    ) -> ndarray::Array2<Self> {
        a.dot(b)
    }
    /// `x ← e^x` over a slice (f32: [`crate::simd::exp_in_place`], vectorised).
    fn exp_in_place(xs: &mut [Self]) {
        xs.iter_mut().for_each(|x| *x = x.exp());
    }
    /// `x ← 1 / (1 + e^-x)` over a slice (f32: [`crate::simd::sigmoid_in_place`]).
    fn sigmoid_in_place(xs: &mut [Self]) {
        xs.iter_mut()
            .for_each(|x| *x = Self::one() / (Self::one() + (-*x).exp()));
    }
    /// [`Self::matmul`] in the type's own precision even under `--precision bf16`: the
    /// attention's score and value products, which the bf16 mode keeps in f32 (as its
    /// quality table was measured).
    fn matmul_full_precision(
        a: &ndarray::ArrayView2<Self>,
        b: &ndarray::ArrayView2<Self>,
    ) -> ndarray::Array2<Self> {
        a.dot(b)
    }
}
impl AdFloat for f32 {
    fn matmul(a: &ndarray::ArrayView2<f32>, b: &ndarray::ArrayView2<f32>) -> ndarray::Array2<f32> {
        crate::gemm::matmul(a, b)
    }
    fn matmul_full_precision(
        a: &ndarray::ArrayView2<f32>,
        b: &ndarray::ArrayView2<f32>,
    ) -> ndarray::Array2<f32> {
        crate::gemm::matmul_f32(a, b)
    }
    fn exp_in_place(xs: &mut [f32]) {
        crate::simd::exp_in_place(xs)
    }
    fn sigmoid_in_place(xs: &mut [f32]) {
        crate::simd::sigmoid_in_place(xs)
    }
}
impl AdFloat for f64 {}

/// Handle to a node on a [`Tape`]. Only meaningful for the tape that created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Var(usize);

impl Var {
    /// Position of the node on its tape (creation order).
    pub fn index(self) -> usize {
        self.0
    }
}

/// A VJP closure: maps the gradient of the node's output to one optional gradient per input.
pub type VjpFn<T> = Box<dyn FnOnce(&ArrayD<T>) -> Result<Vec<Option<ArrayD<T>>>>>;

/// A VJP closure that can run many times (see [`Tape::vjp_retain`]).
pub type ReusableVjpFn<T> = Box<dyn Fn(&ArrayD<T>) -> Result<Vec<Option<ArrayD<T>>>>>;

enum Vjp<T> {
    Once(VjpFn<T>),
    Reusable(ReusableVjpFn<T>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeKind {
    Param,
    Constant,
    Op,
}

struct Node<T: AdFloat> {
    /// `None` once backward has freed an intermediate value.
    value: Option<Arc<ArrayD<T>>>,
    inputs: Vec<Var>,
    vjp: Option<Vjp<T>>,
    requires_grad: bool,
    kind: NodeKind,
    /// Bytes held by the VJP closure beyond shared input values (e.g. attention probabilities).
    cache_bytes: usize,
    /// True once backward ran through this node (its closure is gone).
    consumed: bool,
}

/// A define-by-run autograd tape.
pub struct Tape<T: AdFloat = f32> {
    nodes: Vec<Node<T>>,
    grad_enabled: bool,
    retain_values: bool,
    retained_grads: HashSet<Var>,
    live_bytes: usize,
    peak_bytes: usize,
}

impl<T: AdFloat> Default for Tape<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Bytes of an array's elements.
pub fn array_bytes<T>(a: &ArrayD<T>) -> usize {
    a.len() * std::mem::size_of::<T>()
}

impl<T: AdFloat> Tape<T> {
    /// An empty tape with gradient recording on.
    pub fn new() -> Self {
        Tape {
            nodes: Vec::new(),
            grad_enabled: true,
            retain_values: false,
            retained_grads: HashSet::new(),
            live_bytes: 0,
            peak_bytes: 0,
        }
    }

    /// Number of nodes recorded so far.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when no node has been recorded.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn add_live(&mut self, bytes: usize) {
        self.live_bytes += bytes;
        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
    }

    fn sub_live(&mut self, bytes: usize) {
        self.live_bytes = self.live_bytes.saturating_sub(bytes);
    }

    fn push_leaf(&mut self, value: Arc<ArrayD<T>>, kind: NodeKind) -> Var {
        self.add_live(array_bytes(&value));
        self.nodes.push(Node {
            value: Some(value),
            inputs: Vec::new(),
            vjp: None,
            requires_grad: kind == NodeKind::Param,
            kind,
            cache_bytes: 0,
            consumed: false,
        });
        Var(self.nodes.len() - 1)
    }

    /// A leaf that receives a gradient (a trainable parameter, or an input whose
    /// gradient the caller wants).
    pub fn param(&mut self, value: ArrayD<T>) -> Var {
        self.push_leaf(Arc::new(value), NodeKind::Param)
    }

    /// A leaf without gradient (frozen weights, data).
    pub fn constant(&mut self, value: ArrayD<T>) -> Var {
        self.push_leaf(Arc::new(value), NodeKind::Constant)
    }

    /// Like [`Tape::param`] but shares an existing array instead of copying it.
    pub fn param_shared(&mut self, value: Arc<ArrayD<T>>) -> Var {
        self.push_leaf(value, NodeKind::Param)
    }

    /// Like [`Tape::constant`] but shares an existing array (e.g. frozen model weights
    /// registered every step without a copy).
    pub fn constant_shared(&mut self, value: Arc<ArrayD<T>>) -> Var {
        self.push_leaf(value, NodeKind::Constant)
    }

    /// A constant holding `v`'s current value: stops gradient flow.
    pub fn detach(&mut self, v: Var) -> Var {
        let value = self.shared(v);
        self.constant_shared(value)
    }

    /// The value of a node.
    ///
    /// # Panics
    /// If backward has already freed this intermediate value (read values before
    /// `backward`, or call [`Tape::retain_values`]). Use [`Tape::try_value`] to get an error.
    pub fn value(&self, v: Var) -> &ArrayD<T> {
        match self.try_value(v) {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        }
    }

    /// The value of a node, or an error if backward has freed it.
    pub fn try_value(&self, v: Var) -> Result<&ArrayD<T>> {
        let node = self
            .nodes
            .get(v.0)
            .ok_or_else(|| ElmError::InvalidArgument(format!("{v:?} is not on this tape")))?;
        node.value.as_deref().ok_or_else(|| {
            ElmError::InvalidArgument(format!(
                "value of {v:?} was freed by backward (read it before backward or enable retain_values)"
            ))
        })
    }

    /// A shared handle to a node's value (no copy). Panics like [`Tape::value`].
    pub fn shared(&self, v: Var) -> Arc<ArrayD<T>> {
        self.try_value(v).expect("value available");
        self.nodes[v.0].value.clone().unwrap()
    }

    /// Scalar value of a one-element node (e.g. a loss).
    pub fn scalar(&self, v: Var) -> T {
        let a = self.value(v);
        assert_eq!(a.len(), 1, "scalar() on a node of shape {:?}", a.shape());
        *a.iter().next().unwrap()
    }

    /// Whether gradients flow into this node.
    pub fn requires_grad(&self, v: Var) -> bool {
        self.nodes[v.0].requires_grad
    }

    /// Whether this node is a parameter leaf.
    pub fn is_param(&self, v: Var) -> bool {
        self.nodes[v.0].kind == NodeKind::Param
    }

    /// Also report the gradient of a non-leaf node in the [`Gradients`] of the next backward.
    pub fn retain_grad(&mut self, v: Var) {
        self.retained_grads.insert(v);
    }

    /// Keep intermediate values after backward (costs memory; default off).
    pub fn retain_values(&mut self, keep: bool) {
        self.retain_values = keep;
    }

    /// Whether ops currently record VJPs.
    pub fn grad_enabled(&self) -> bool {
        self.grad_enabled
    }

    /// Runs `f` with recording off: ops inside produce constants (no VJP, no caches).
    pub fn no_grad<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let prev = self.grad_enabled;
        self.grad_enabled = false;
        let r = f(self);
        self.grad_enabled = prev;
        r
    }

    /// Bytes currently held by node values, VJP caches and pending gradients.
    pub fn live_bytes(&self) -> usize {
        self.live_bytes
    }

    /// High-water mark of [`Tape::live_bytes`] over the tape's life (forward and backward).
    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }

    /// Per-input "needs a gradient" flags, used by ops to skip unneeded VJP work.
    pub fn needs(&self, inputs: &[Var]) -> Vec<bool> {
        inputs
            .iter()
            .map(|v| self.nodes[v.0].requires_grad)
            .collect()
    }

    /// Records an op. `vjp(grad_out, needs)` returns one optional gradient per input;
    /// `needs[i]` says whether input `i` requires a gradient (skip the work otherwise).
    /// `cache_bytes` declares memory the closure owns beyond shared input values.
    pub fn push_op<F>(
        &mut self,
        inputs: &[Var],
        value: ArrayD<T>,
        cache_bytes: usize,
        vjp: F,
    ) -> Var
    where
        F: Fn(&ArrayD<T>, &[bool]) -> Result<Vec<Option<ArrayD<T>>>> + 'static,
    {
        let needs = self.needs(inputs);
        let vjp: ReusableVjpFn<T> = Box::new(move |g: &ArrayD<T>| vjp(g, &needs));
        self.push_node(inputs, value, cache_bytes, Vjp::Reusable(vjp))
    }

    fn push_node(
        &mut self,
        inputs: &[Var],
        value: ArrayD<T>,
        cache_bytes: usize,
        vjp: Vjp<T>,
    ) -> Var {
        let requires_grad =
            self.grad_enabled && inputs.iter().any(|v| self.nodes[v.0].requires_grad);
        let vjp = requires_grad.then_some(vjp);
        let cache_bytes = if requires_grad { cache_bytes } else { 0 };
        self.add_live(array_bytes(&value) + cache_bytes);
        self.nodes.push(Node {
            value: Some(Arc::new(value)),
            inputs: inputs.to_vec(),
            vjp,
            requires_grad,
            kind: NodeKind::Op,
            cache_bytes,
            consumed: false,
        });
        Var(self.nodes.len() - 1)
    }

    /// A user op: `value` already computed from `inputs`; `vjp(grad_out)` returns one
    /// `Option<grad>` per input (same shape as that input; `None` = zero).
    pub fn custom(&mut self, inputs: &[Var], value: ArrayD<T>, vjp: VjpFn<T>) -> Var {
        self.push_node(inputs, value, 0, Vjp::Once(vjp))
    }

    /// Like [`Tape::custom`] with a VJP that may run many times, so graphs containing it
    /// support [`Tape::vjp_retain`].
    pub fn custom_reusable(
        &mut self,
        inputs: &[Var],
        value: ArrayD<T>,
        vjp: ReusableVjpFn<T>,
    ) -> Var {
        self.push_node(inputs, value, 0, Vjp::Reusable(vjp))
    }

    /// Drops the tape's reference to an intermediate value during backward
    /// (leaves and the backward root stay; nothing is freed under `retain_values`).
    fn free_value(&mut self, i: usize, out: Var) {
        if self.retain_values || i == out.0 || self.nodes[i].kind != NodeKind::Op {
            return;
        }
        if let Some(v) = self.nodes[i].value.take() {
            self.sub_live(array_bytes(&v));
        }
    }

    /// Backward from a scalar (one-element) loss with seed 1.
    pub fn backward(&mut self, loss: Var) -> Result<Gradients<T>> {
        let shape = self.try_value(loss)?.shape().to_vec();
        if shape.iter().product::<usize>() != 1 {
            return Err(ElmError::shape(
                "backward",
                format!("loss must have one element, got shape {shape:?}"),
            ));
        }
        self.backward_from(loss, ArrayD::from_elem(shape, T::one()))
    }

    /// Vector-Jacobian product: propagates `seed` (same shape as `out`) back to every
    /// parameter leaf (and every node marked with [`Tape::retain_grad`]).
    ///
    /// Consumes the graph below `out`: each VJP closure runs once and is freed; a second
    /// backward through the same nodes is an error (build a fresh tape per step).
    pub fn backward_from(&mut self, out: Var, seed: ArrayD<T>) -> Result<Gradients<T>> {
        self.backward_impl(out, seed, true)
    }

    /// A VJP that leaves the graph intact, so it can run many times on one tape (e.g.
    /// `uᵀ ∂f/∂z` for many `u` in implicit differentiation, with `f` recorded once).
    /// Nothing is freed; every op on the path needs a reusable VJP (all built-in ops
    /// have one; see [`Tape::custom_reusable`]).
    pub fn vjp_retain(&mut self, out: Var, seed: ArrayD<T>) -> Result<Gradients<T>> {
        self.backward_impl(out, seed, false)
    }

    fn backward_impl(&mut self, out: Var, seed: ArrayD<T>, consume: bool) -> Result<Gradients<T>> {
        let out_shape = self.try_value(out)?.shape().to_vec();
        if seed.shape() != out_shape.as_slice() {
            return Err(ElmError::shape(
                "backward_from",
                format!(
                    "seed shape {:?} != output shape {:?}",
                    seed.shape(),
                    out_shape
                ),
            ));
        }
        let mut result = Gradients {
            grads: HashMap::new(),
        };
        if !self.nodes[out.0].requires_grad {
            return Ok(result);
        }
        let mut pending: Vec<Option<ArrayD<T>>> = (0..=out.0).map(|_| None).collect();
        self.add_live(array_bytes(&seed));
        pending[out.0] = Some(seed);
        for i in (0..=out.0).rev() {
            let Some(g) = pending[i].take() else {
                // Off the gradient path: only later VJPs (already run, or holding their own
                // `Arc`) could need this value, so the tape's reference can go.
                if consume {
                    self.free_value(i, out);
                }
                continue;
            };
            let g_bytes = array_bytes(&g);
            let var = Var(i);
            if self.retained_grads.contains(&var) && self.nodes[i].kind == NodeKind::Op {
                result.grads.insert(var, g.clone());
            }
            match self.nodes[i].kind {
                NodeKind::Param => {
                    // Leaf: hand the gradient to the caller (stays counted until returned).
                    result.grads.insert(var, g);
                    continue;
                }
                NodeKind::Constant => {
                    self.sub_live(g_bytes);
                    continue;
                }
                NodeKind::Op => {}
            }
            let node = &mut self.nodes[i];
            if node.consumed {
                return Err(ElmError::InvalidArgument(format!(
                    "backward through {var:?} twice: its graph was already consumed (use a fresh tape, or vjp_retain)"
                )));
            }
            let inputs = node.inputs.clone();
            let input_grads = if consume {
                let Some(vjp) = node.vjp.take() else {
                    self.sub_live(g_bytes);
                    continue;
                };
                node.consumed = true;
                let r = match vjp {
                    Vjp::Once(f) => f(&g)?,
                    Vjp::Reusable(f) => f(&g)?,
                };
                let cache = std::mem::take(&mut self.nodes[i].cache_bytes);
                self.sub_live(cache);
                r
            } else {
                match &node.vjp {
                    None => {
                        self.sub_live(g_bytes);
                        continue;
                    }
                    Some(Vjp::Once(_)) => {
                        return Err(ElmError::InvalidArgument(format!(
                            "vjp_retain through {var:?}: a custom op with a run-once VJP (use custom_reusable)"
                        )))
                    }
                    Some(Vjp::Reusable(f)) => f(&g)?,
                }
            };
            drop(g);
            self.sub_live(g_bytes);
            if input_grads.len() != inputs.len() {
                return Err(ElmError::InvalidArgument(format!(
                    "VJP of {var:?} returned {} gradients for {} inputs",
                    input_grads.len(),
                    inputs.len()
                )));
            }
            for (inp, ig) in inputs.iter().zip(input_grads) {
                let Some(ig) = ig else { continue };
                if !self.nodes[inp.0].requires_grad {
                    continue;
                }
                let want = self.try_value(*inp)?.shape();
                if ig.shape() != want {
                    return Err(ElmError::shape(
                        "backward",
                        format!(
                            "VJP of {var:?} gave gradient shape {:?} for input {inp:?} of shape {:?}",
                            ig.shape(),
                            want
                        ),
                    ));
                }
                if !all_finite(&ig) {
                    return Err(ElmError::NonFinite(format!(
                        "gradient flowing from {var:?} into {inp:?}"
                    )));
                }
                match &mut pending[inp.0] {
                    Some(acc) => *acc += &ig,
                    slot @ None => {
                        self.live_bytes += array_bytes(&ig);
                        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
                        *slot = Some(ig);
                    }
                }
            }
            // Every consumer of node i has index > i and has been processed: free its value.
            if consume {
                self.free_value(i, out);
            }
        }
        // Returned gradients leave the tape's accounting.
        let returned: usize = result.grads.values().map(array_bytes).sum();
        self.sub_live(returned);
        Ok(result)
    }
}

/// Whether every element is finite. Without the early exit of `iter().all` the loop
/// vectorises; large arrays are split over the cores' [`SpinTeam`](crate::team::SpinTeam)
/// (whose helpers would otherwise wait: this check runs on every gradient a backward pass
/// moves, weight gradients of millions of elements included).
pub fn all_finite<T: AdFloat>(xs: &ArrayD<T>) -> bool {
    /// Below this a fork-join costs more than the second core saves.
    const SPLIT_FROM: usize = 1 << 16;
    let finite = |s: &[T]| s.iter().fold(true, |ok, x| ok & x.is_finite());
    match xs.as_slice_memory_order() {
        Some(s) if s.len() >= SPLIT_FROM => {
            let team = crate::team::SpinTeam::global();
            let part = s.len().div_ceil(team.parts());
            let bad = std::sync::atomic::AtomicBool::new(false);
            team.run(&|p| {
                let chunk = &s[(p * part).min(s.len())..((p + 1) * part).min(s.len())];
                if !finite(chunk) {
                    bad.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
            !bad.into_inner()
        }
        Some(s) => finite(s),
        None => xs.iter().all(|x| x.is_finite()),
    }
}

/// Gradients produced by one backward pass, keyed by [`Var`].
#[derive(Debug)]
pub struct Gradients<T: AdFloat = f32> {
    grads: HashMap<Var, ArrayD<T>>,
}

impl<T: AdFloat> Gradients<T> {
    /// Gradient of `v` (`None` if `v` is not a parameter or received no gradient).
    pub fn get(&self, v: Var) -> Option<&ArrayD<T>> {
        self.grads.get(&v)
    }

    /// Moves the gradient of `v` out.
    pub fn take(&mut self, v: Var) -> Option<ArrayD<T>> {
        self.grads.remove(&v)
    }

    /// Gradient of `v`, or zeros shaped like `like` when no gradient reached it.
    pub fn get_or_zeros(&self, v: Var, like: &[usize]) -> ArrayD<T> {
        self.grads
            .get(&v)
            .cloned()
            .unwrap_or_else(|| ArrayD::zeros(like))
    }

    /// Number of stored gradients.
    pub fn len(&self) -> usize {
        self.grads.len()
    }

    /// True when nothing received a gradient.
    pub fn is_empty(&self) -> bool {
        self.grads.is_empty()
    }

    /// Iterates over `(var, gradient)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&Var, &ArrayD<T>)> {
        self.grads.iter()
    }

    /// Gradient accumulation across steps/micro-batches: `acc += grad(v)` (no-op when absent).
    pub fn accumulate_into(&self, v: Var, acc: &mut ArrayD<T>) -> Result<()> {
        if let Some(g) = self.grads.get(&v) {
            if g.shape() != acc.shape() {
                return Err(ElmError::shape(
                    "accumulate_into",
                    format!("gradient {:?} vs accumulator {:?}", g.shape(), acc.shape()),
                ));
            }
            *acc += g;
        }
        Ok(())
    }
}
