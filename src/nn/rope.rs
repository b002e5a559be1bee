//! Rotary position embedding on `[B, T, H, D]` tensors.
//!
//! Two pairings of the `D` channels into 2-D planes rotated by `pos · θ_i`,
//! `θ_i = base^(−2i/D)`, `i < D/2`:
//! - [`RopeLayout::HalfSplit`] (HF): pairs `(i, i + D/2)`;
//! - [`RopeLayout::Interleaved`] (GGUF / original Llama): pairs `(2i, 2i+1)`.

use ndarray::{ArrayD, Ix4};

use crate::autograd::ops::standard;
use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// How channels are paired for rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// HF `rotate_half`: pairs `(i, i + D/2)`.
    HalfSplit,
    /// GGUF / GPT-J: pairs `(2i, 2i+1)`.
    Interleaved,
}

/// Rotates `x: [B, T, H, D]` at positions `pos_offset + t`; `inverse` rotates by `−angle`
/// (the exact VJP, since a rotation's transpose is its inverse).
pub fn rotate<T: AdFloat>(
    x: &ArrayD<T>,
    base: f64,
    pos_offset: usize,
    layout: RopeLayout,
    inverse: bool,
) -> Result<ArrayD<T>> {
    let x4 = x.view().into_dimensionality::<Ix4>().map_err(|_| {
        ElmError::shape(
            "rope",
            format!("x must be [B, T, H, D], got {:?}", x.shape()),
        )
    })?;
    let (b, t, h, d) = x4.dim();
    if d % 2 != 0 {
        return Err(ElmError::shape(
            "rope",
            format!("head dim {d} must be even"),
        ));
    }
    let half = d / 2;
    // Angles in f64 so f32 and f64 paths rotate by the same numbers.
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| base.powf(-2.0 * i as f64 / d as f64))
        .collect();
    let mut y = standard(x.clone());
    let ys = y.as_slice_mut().unwrap();
    for ti in 0..t {
        let pos = (pos_offset + ti) as f64;
        let cs: Vec<(T, T)> = inv_freq
            .iter()
            .map(|&f| {
                let a = pos * f;
                let s = if inverse { -a.sin() } else { a.sin() };
                (T::of(a.cos()), T::of(s))
            })
            .collect();
        for bi in 0..b {
            for hi in 0..h {
                let base_idx = ((bi * t + ti) * h + hi) * d;
                let row = &mut ys[base_idx..base_idx + d];
                for (i, &(c, s)) in cs.iter().enumerate() {
                    let (p, q) = match layout {
                        RopeLayout::HalfSplit => (i, i + half),
                        RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    };
                    let (x0, x1) = (row[p], row[q]);
                    row[p] = x0 * c - x1 * s;
                    row[q] = x1 * c + x0 * s;
                }
            }
        }
    }
    Ok(y)
}

/// Tape op: RoPE on `x: [B, T, H, D]` (no cache; backward is the inverse rotation).
pub fn rope<T: AdFloat>(
    tape: &mut Tape<T>,
    x: Var,
    base: f64,
    pos_offset: usize,
    layout: RopeLayout,
) -> Result<Var> {
    let y = rotate(tape.value(x), base, pos_offset, layout, false)?;
    Ok(tape.push_op(&[x], y, 0, move |dy, _| {
        Ok(vec![Some(rotate(dy, base, pos_offset, layout, true)?)])
    }))
}
