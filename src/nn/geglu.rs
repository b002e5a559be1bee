//! GeGLU gating `gelu_tanh(gate) ⊙ up` (the Gemma 3 MLP nonlinearity), with GELU's tanh
//! approximation `gelu(g) = ½·g·(1 + tanh(u))`, `u = √(2/π)·(g + 0.044715·g³)` (PyTorch's
//! `gelu(approximate="tanh")`, ggml's `gelu`). Since `½·(1 + tanh(u)) = σ(2u)`, it is computed
//! as `g·σ(2u)` through [`AdFloat::sigmoid_in_place`] (for f32 the vectorised
//! [`crate::simd::sigmoid_in_place`]; `1 + tanh(u)` would also cancel where `g` is very
//! negative). [`gelu_weights`] is the one definition: the inference path's
//! `crate::model::ops::geglu_tanh_inplace` calls it too.

use ndarray::{ArrayD, Zip};

use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// `√(2/π)`, written out in f64 so the f64 gradient checks see the exact constant.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const CUBIC: f64 = 0.044_715;

/// `2u = 2·√(2/π)·(g + 0.044715·g³)`.
#[inline(always)]
fn twice_arg<T: AdFloat>(g: T) -> T {
    T::of(2.0 * SQRT_2_OVER_PI) * g * (T::one() + T::of(CUBIC) * g * g)
}

/// `σ(2u)` of every gate value into `out` (same length): GELU's weight on `g`,
/// `gelu(g) = g·σ(2u)`.
pub fn gelu_weights<T: AdFloat>(gate: impl IntoIterator<Item = T>, out: &mut [T]) {
    for (o, g) in out.iter_mut().zip(gate) {
        *o = twice_arg(g);
    }
    T::sigmoid_in_place(out);
}

/// `d gelu / d g` from `g` and its weight `s = σ(2u)`:
/// `s + g·s·(1 − s)·2·√(2/π)·(1 + 3·0.044715·g²)`.
fn gelu_slope<T: AdFloat>(g: T, s: T) -> T {
    let du = T::of(2.0 * SQRT_2_OVER_PI) * (T::one() + T::of(3.0 * CUBIC) * g * g);
    s + g * s * (T::one() - s) * du
}

/// `σ(2u)` of every element of `gate`, as an array of its shape.
fn weights_of<T: AdFloat>(gate: &ArrayD<T>) -> ArrayD<T> {
    let mut w = ArrayD::from_elem(gate.raw_dim(), T::zero());
    let out = w.as_slice_mut().expect("a fresh array is contiguous");
    gelu_weights(gate.iter().copied(), out);
    w
}

/// `gate, up: [..., I]` → `gelu_tanh(gate) ⊙ up`. Backward needs only the inputs (no cache).
pub fn forward<T: AdFloat>(gate: &ArrayD<T>, up: &ArrayD<T>) -> Result<ArrayD<T>> {
    if gate.shape() != up.shape() {
        return Err(ElmError::shape(
            "geglu",
            format!("gate {:?} vs up {:?}", gate.shape(), up.shape()),
        ));
    }
    let w = weights_of(gate);
    Ok(Zip::from(gate)
        .and(&w)
        .and(up)
        .map_collect(|&g, &s, &u| g * s * u))
}

/// Returns `(d_gate, d_up)` for upstream `dy` (same shape as the inputs).
pub fn backward<T: AdFloat>(
    gate: &ArrayD<T>,
    up: &ArrayD<T>,
    dy: &ArrayD<T>,
) -> (ArrayD<T>, ArrayD<T>) {
    let w = weights_of(gate);
    let dgate = Zip::from(gate)
        .and(&w)
        .and(up)
        .and(dy)
        .map_collect(|&g, &s, &u, &d| d * u * gelu_slope(g, s));
    let dup = Zip::from(gate)
        .and(&w)
        .and(dy)
        .map_collect(|&g, &s, &d| d * g * s);
    (dgate, dup)
}

/// Tape op for [`forward`].
pub fn geglu<T: AdFloat>(tape: &mut Tape<T>, gate: Var, up: Var) -> Result<Var> {
    let (gs, us) = (tape.shared(gate), tape.shared(up));
    let y = forward(&gs, &us)?;
    Ok(tape.push_op(&[gate, up], y, 0, move |dy, needs| {
        let (dg, du) = backward(&gs, &us, dy);
        Ok(vec![needs[0].then_some(dg), needs[1].then_some(du)])
    }))
}
