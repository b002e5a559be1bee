//! LoRA linear: `y = x Wᵀ + b + s · (x Aᵀ) Bᵀ` with a frozen or trainable base `W`.

use ndarray::ArrayD;

use crate::autograd::ops::{linear_backward, linear_forward};
use crate::autograd::{AdFloat, Tape, Var};
use crate::error::Result;

/// Kept for backward: the low-rank activation `x Aᵀ: [..., r]`.
#[derive(Clone, Debug)]
pub struct LoraCache<T> {
    pub xa: ArrayD<T>,
}

/// `x: [..., K]`, `w: [N, K]`, `bias: [N]`, `a: [r, K]`, `b: [N, r]` → `([..., N], cache)`.
pub fn forward<T: AdFloat>(
    x: &ArrayD<T>,
    w: &ArrayD<T>,
    bias: Option<&ArrayD<T>>,
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    scale: T,
) -> Result<(ArrayD<T>, LoraCache<T>)> {
    let base = linear_forward(x, w, bias)?;
    let xa = linear_forward(x, a, None)?;
    let low = linear_forward(&xa, b, None)?;
    if low.shape() != base.shape() {
        return Err(crate::error::ElmError::shape(
            "lora",
            format!("low-rank path {:?} vs base {:?}", low.shape(), base.shape()),
        ));
    }
    Ok((base + low * scale, LoraCache { xa }))
}

/// Gradients `[dx, dw, dbias, da, db]`, each only when `needs` says so.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: AdFloat>(
    x: &ArrayD<T>,
    w: &ArrayD<T>,
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    scale: T,
    cache: &LoraCache<T>,
    dy: &ArrayD<T>,
    needs: [bool; 5],
) -> [Option<ArrayD<T>>; 5] {
    let [nx, nw, nbias, na, nb] = needs;
    let (dx_base, dw, dbias) = linear_backward(x, w, dy, nx, nw, nbias);
    let dys = dy * scale;
    // low = xa · Bᵀ: d xa = s·dy·B, dB = s·dyᵀ·xa.
    let (dxa, db, _) = linear_backward(&cache.xa, b, &dys, nx || na, nb, false);
    let (dx_low, da) = match &dxa {
        Some(dxa) => {
            let (dxl, da, _) = linear_backward(x, a, dxa, nx, na, false);
            (dxl, da)
        }
        None => (None, None),
    };
    let dx = match (dx_base, dx_low) {
        (Some(p), Some(q)) => Some(p + q),
        (p, _) => p,
    };
    [dx, dw, dbias, da, db]
}

/// Tape op for [`forward`]. Typically `w` (and `bias`) are constants and `a`, `b` params.
pub fn lora_linear<T: AdFloat>(
    tape: &mut Tape<T>,
    x: Var,
    w: Var,
    bias: Option<Var>,
    a: Var,
    b: Var,
    scale: T,
) -> Result<Var> {
    let (xs, ws, as_, bs) = (
        tape.shared(x),
        tape.shared(w),
        tape.shared(a),
        tape.shared(b),
    );
    let biass = bias.map(|v| tape.shared(v));
    let (y, cache) = forward(&xs, &ws, biass.as_deref(), &as_, &bs, scale)?;
    drop(biass);
    let bytes = cache.xa.len() * std::mem::size_of::<T>();
    let mut inputs = vec![x, w, a, b];
    inputs.extend(bias);
    let has_bias = bias.is_some();
    Ok(tape.push_op(&inputs, y, bytes, move |dy, needs| {
        let nbias = has_bias && needs[4];
        let [dx, dw, dbias, da, db] = backward(
            &xs,
            &ws,
            &as_,
            &bs,
            scale,
            &cache,
            dy,
            [needs[0], needs[1], nbias, needs[2], needs[3]],
        );
        let mut out = vec![dx, dw, da, db];
        if has_bias {
            out.push(dbias);
        }
        Ok(out)
    }))
}
