//! SwiGLU gating `silu(gate) ⊙ up` (the Llama MLP nonlinearity).

use ndarray::{ArrayD, Zip};

use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// `gate, up: [..., I]` → `silu(gate) ⊙ up`. Backward needs only the inputs (no cache).
pub fn forward<T: AdFloat>(gate: &ArrayD<T>, up: &ArrayD<T>) -> Result<ArrayD<T>> {
    if gate.shape() != up.shape() {
        return Err(ElmError::shape(
            "swiglu",
            format!("gate {:?} vs up {:?}", gate.shape(), up.shape()),
        ));
    }
    let s = sigmoid(gate);
    Ok(Zip::from(gate)
        .and(&s)
        .and(up)
        .map_collect(|&g, &s, &u| g * s * u))
}

/// `σ(gate)`, elementwise (vectorised for f32).
fn sigmoid<T: AdFloat>(gate: &ArrayD<T>) -> ArrayD<T> {
    let mut s = crate::autograd::ops::standard(gate.clone());
    T::sigmoid_in_place(s.as_slice_mut().expect("standard layout is contiguous"));
    s
}

/// Returns `(d_gate, d_up)`.
pub fn backward<T: AdFloat>(
    gate: &ArrayD<T>,
    up: &ArrayD<T>,
    dy: &ArrayD<T>,
) -> (ArrayD<T>, ArrayD<T>) {
    let s = sigmoid(gate);
    // d/dg [g·σ(g)] = σ(g)·(1 + g·(1 − σ(g))).
    let dgate = Zip::from(gate)
        .and(&s)
        .and(up)
        .and(dy)
        .map_collect(|&g, &s, &u, &d| d * u * s * (T::one() + g * (T::one() - s)));
    let dup = Zip::from(gate)
        .and(&s)
        .and(dy)
        .map_collect(|&g, &s, &d| d * g * s);
    (dgate, dup)
}

/// Tape op for [`forward`].
pub fn swiglu<T: AdFloat>(tape: &mut Tape<T>, gate: Var, up: Var) -> Result<Var> {
    let (gs, us) = (tape.shared(gate), tape.shared(up));
    let y = forward(&gs, &us)?;
    Ok(tape.push_op(&[gate, up], y, 0, move |dy, needs| {
        let (dg, du) = backward(&gs, &us, dy);
        Ok(vec![needs[0].then_some(dg), needs[1].then_some(du)])
    }))
}
