//! GeGLU gating `gelu_tanh(gate) ⊙ up` (the Gemma 3 MLP nonlinearity), with GELU's tanh
//! approximation `gelu(g) = ½·g·(1 + tanh(u))`, `u = √(2/π)·(g + 0.044715·g³)` (PyTorch's
//! `gelu(approximate="tanh")`, ggml's `gelu`). [`gelu_tanh`] is the one definition: the
//! inference path's `crate::model::ops::geglu_tanh_inplace` calls it too.

use ndarray::{ArrayD, Zip};

use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// `√(2/π)`, written out in f64 so the f64 gradient checks see the exact constant.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const CUBIC: f64 = 0.044_715;

/// `tanh(√(2/π)·(g + 0.044715·g³))`.
#[inline(always)]
fn tanh_of_arg<T: AdFloat>(g: T) -> T {
    (T::of(SQRT_2_OVER_PI) * g * (T::one() + T::of(CUBIC) * g * g)).tanh()
}

/// GELU's tanh approximation at one point.
#[inline]
pub fn gelu_tanh<T: AdFloat>(g: T) -> T {
    T::of(0.5) * g * (T::one() + tanh_of_arg(g))
}

/// `(gelu(g), d gelu / d g)` at one point.
fn gelu_and_slope<T: AdFloat>(g: T) -> (T, T) {
    let (c, a, half) = (T::of(SQRT_2_OVER_PI), T::of(CUBIC), T::of(0.5));
    let th = tanh_of_arg(g);
    let value = half * g * (T::one() + th);
    // d/dg: ½(1 + t) + ½·g·(1 − t²)·√(2/π)·(1 + 3a·g²).
    let slope = half * (T::one() + th)
        + half * g * (T::one() - th * th) * c * (T::one() + T::of(3.0) * a * g * g);
    (value, slope)
}

/// `gate, up: [..., I]` → `gelu_tanh(gate) ⊙ up`. Backward needs only the inputs (no cache).
pub fn forward<T: AdFloat>(gate: &ArrayD<T>, up: &ArrayD<T>) -> Result<ArrayD<T>> {
    if gate.shape() != up.shape() {
        return Err(ElmError::shape(
            "geglu",
            format!("gate {:?} vs up {:?}", gate.shape(), up.shape()),
        ));
    }
    Ok(Zip::from(gate)
        .and(up)
        .map_collect(|&g, &u| gelu_tanh(g) * u))
}

/// Returns `(d_gate, d_up)` for upstream `dy` (same shape as the inputs).
pub fn backward<T: AdFloat>(
    gate: &ArrayD<T>,
    up: &ArrayD<T>,
    dy: &ArrayD<T>,
) -> (ArrayD<T>, ArrayD<T>) {
    let dgate = Zip::from(gate)
        .and(up)
        .and(dy)
        .map_collect(|&g, &u, &d| d * u * gelu_and_slope(g).1);
    let dup = Zip::from(gate)
        .and(dy)
        .map_collect(|&g, &d| d * gelu_tanh(g));
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
