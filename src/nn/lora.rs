//! LoRA linear: `y = x Wᵀ + b + s · (x Aᵀ) Bᵀ` with a frozen or trainable base `W`, and
//! optionally inverted dropout on the low-rank branch's input (PEFT's `lora_dropout`).

use ndarray::ArrayD;
use rand::Rng;

use crate::autograd::ops::{linear_backward, linear_forward};
use crate::autograd::{AdFloat, Tape, Var};
use crate::error::Result;

/// Kept for backward: the low-rank activation `x Aᵀ: [..., r]`.
#[derive(Clone, Debug)]
pub struct LoraCache<T> {
    pub xa: ArrayD<T>,
}

/// Inverted dropout on the low-rank branch's input: element `i` of `x` enters `x Aᵀ` as
/// `x[i] · 1/(1 − p)` when kept, as `x[i] · 0` when dropped (logical element order).
#[derive(Clone, Debug)]
pub struct Dropout<T> {
    keep: Vec<bool>,
    /// `1 / (1 − p)`.
    scale: T,
}

impl<T: AdFloat> Dropout<T> {
    /// A mask for `n` elements with drop probability `p ∈ [0, 1)`: element `i` is kept when the
    /// `i`-th uniform f32 of `rng` is below `1 − p`, the uniform being rand's `Standard` one
    /// (the high 24 bits of a `u32`, times 2⁻²⁴). The words are drawn in one bulk fill, the
    /// same stream as one `rng.gen::<f32>()` per element but without a call per element.
    pub fn draw(rng: &mut impl Rng, n: usize, p: f32) -> Self {
        let keep_p = 1.0 - p;
        let mut words = vec![0u32; n];
        rng.fill(&mut words[..]);
        let unit = 1.0 / (1u32 << 24) as f32;
        Dropout {
            keep: words
                .iter()
                .map(|&w| ((w >> 8) as f32) * unit < keep_p)
                .collect(),
            scale: T::of((1.0 / keep_p) as f64),
        }
    }

    /// Elements of the mask (the size of the input it applies to).
    pub fn len(&self) -> usize {
        self.keep.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
    }

    /// `x ⊙ m`, `m[i] = 1/(1 − p)` or `0`.
    pub fn apply(&self, x: &ArrayD<T>) -> ArrayD<T> {
        let (scale, zero) = (self.scale, T::zero());
        let m = |(&v, &k): (&T, &bool)| v * if k { scale } else { zero };
        let values: Vec<T> = match x.as_slice() {
            Some(xs) => xs.iter().zip(&self.keep).map(m).collect(),
            None => x.iter().zip(&self.keep).map(m).collect(),
        };
        ArrayD::from_shape_vec(x.raw_dim(), values).expect("one value per element")
    }
}

/// `x: [..., K]`, `w: [N, K]`, `bias: [N]`, `a: [r, K]`, `b: [N, r]` → `([..., N], cache)`;
/// with `dropout`, the low-rank branch reads `x ⊙ m` (the base reads `x`).
pub fn forward<T: AdFloat>(
    x: &ArrayD<T>,
    w: &ArrayD<T>,
    bias: Option<&ArrayD<T>>,
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    scale: T,
    dropout: Option<&Dropout<T>>,
) -> Result<(ArrayD<T>, LoraCache<T>)> {
    let base = linear_forward(x, w, bias)?;
    let xa = match dropout {
        Some(d) => {
            check_mask(d, x)?;
            linear_forward(&d.apply(x), a, None)?
        }
        None => linear_forward(x, a, None)?,
    };
    let low = linear_forward(&xa, b, None)?;
    if low.shape() != base.shape() {
        return Err(crate::error::ElmError::shape(
            "lora",
            format!("low-rank path {:?} vs base {:?}", low.shape(), base.shape()),
        ));
    }
    Ok((base + low * scale, LoraCache { xa }))
}

fn check_mask<T: AdFloat>(d: &Dropout<T>, x: &ArrayD<T>) -> Result<()> {
    if d.len() != x.len() {
        return Err(crate::error::ElmError::shape(
            "lora dropout",
            format!(
                "mask of {} elements for an input of shape {:?}",
                d.len(),
                x.shape()
            ),
        ));
    }
    Ok(())
}

/// Gradients `[dx, dw, dbias, da, db]`, each only when `needs` says so (`dropout`: the mask
/// the forward used; `x ⊙ m` is recomputed rather than kept).
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
    dropout: Option<&Dropout<T>>,
) -> [Option<ArrayD<T>>; 5] {
    let [nx, nw, nbias, na, nb] = needs;
    let (dx_base, dw, dbias) = linear_backward(x, w, dy, nx, nw, nbias);
    let dys = dy * scale;
    // low = xa · Bᵀ: d xa = s·dy·B, dB = s·dyᵀ·xa.
    let (dxa, db, _) = linear_backward(&cache.xa, b, &dys, nx || na, nb, false);
    // With dropout, xa = (x ⊙ m) Aᵀ: dA = dxaᵀ (x ⊙ m), dx = (dxa A) ⊙ m.
    let (dx_low, da) = match &dxa {
        Some(dxa) => {
            let xd = dropout.filter(|_| na).map(|d| d.apply(x));
            let (dxl, da, _) = linear_backward(xd.as_ref().unwrap_or(x), a, dxa, nx, na, false);
            let dxl = match dropout {
                Some(d) => dxl.map(|g| d.apply(&g)),
                None => dxl,
            };
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

/// Tape op for [`forward`]. Typically `w` (and `bias`) are constants and `a`, `b` params. With
/// `dropout` the low-rank branch reads `x` through it (one op: the mask is kept as one flag per
/// element instead of an f32 constant and a product node on the tape).
#[allow(clippy::too_many_arguments)]
pub fn lora_linear<T: AdFloat>(
    tape: &mut Tape<T>,
    x: Var,
    w: Var,
    bias: Option<Var>,
    a: Var,
    b: Var,
    scale: T,
    dropout: Option<Dropout<T>>,
) -> Result<Var> {
    let (xs, ws, as_, bs) = (
        tape.shared(x),
        tape.shared(w),
        tape.shared(a),
        tape.shared(b),
    );
    let biass = bias.map(|v| tape.shared(v));
    let (y, cache) = forward(
        &xs,
        &ws,
        biass.as_deref(),
        &as_,
        &bs,
        scale,
        dropout.as_ref(),
    )?;
    drop(biass);
    let bytes = cache.xa.len() * std::mem::size_of::<T>() + dropout.as_ref().map_or(0, |d| d.len());
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
            dropout.as_ref(),
        );
        let mut out = vec![dx, dw, da, db];
        if has_bias {
            out.push(dbias);
        }
        Ok(out)
    }))
}
