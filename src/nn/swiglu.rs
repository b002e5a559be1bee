//! SwiGLU gating `silu(gate) ⊙ up` (the Llama MLP nonlinearity).

use ndarray::{ArrayD, Zip};

use crate::autograd::ops::{silu_grad_scalar, silu_scalar};
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
    Ok(Zip::from(gate)
        .and(up)
        .map_collect(|&g, &u| silu_scalar(g) * u))
}

/// Returns `(d_gate, d_up)`.
pub fn backward<T: AdFloat>(
    gate: &ArrayD<T>,
    up: &ArrayD<T>,
    dy: &ArrayD<T>,
) -> (ArrayD<T>, ArrayD<T>) {
    let dgate = Zip::from(gate)
        .and(up)
        .and(dy)
        .map_collect(|&g, &u, &d| d * u * silu_grad_scalar(g));
    let dup = Zip::from(gate)
        .and(dy)
        .map_collect(|&g, &d| d * silu_scalar(g));
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
