//! RMSNorm: `y = x / sqrt(mean(x²) + eps) ⊙ g` over the last axis.

use ndarray::{ArrayD, Axis};

use crate::autograd::ops::standard;
use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// What backward needs besides `x` and `g`: one reciprocal RMS per row.
#[derive(Clone, Debug)]
pub struct RmsNormCache<T> {
    /// `[rows]`, `1 / sqrt(mean(x²) + eps)`.
    pub rstd: Vec<T>,
}

fn check<T: AdFloat>(x: &ArrayD<T>, g: &ArrayD<T>) -> Result<usize> {
    let c = x.shape().last().copied().unwrap_or(0);
    if x.ndim() == 0 || g.shape() != [c] {
        return Err(ElmError::shape(
            "rms_norm",
            format!("x {:?} needs gain [{c}], got {:?}", x.shape(), g.shape()),
        ));
    }
    Ok(c)
}

/// `x: [..., C]`, `g: [C]` → `(y: [..., C], cache)`.
pub fn forward<T: AdFloat>(
    x: &ArrayD<T>,
    g: &ArrayD<T>,
    eps: T,
) -> Result<(ArrayD<T>, RmsNormCache<T>)> {
    let c = check(x, g)?;
    let mut y = standard(x.clone());
    let nd = y.ndim();
    let gs = g.as_slice().expect("contiguous gain");
    let mut rstd = Vec::with_capacity(y.len() / c.max(1));
    for mut row in y.lanes_mut(Axis(nd - 1)) {
        // `y` is in standard layout (`standard` above), so every row is a slice.
        let sq = match row.as_slice() {
            Some(r) => crate::simd::sum_of_squares::<T, T>(r),
            None => row.iter().map(|&v| v * v).sum::<T>(),
        };
        let ms = sq / T::of(c as f64);
        let r = T::one() / (ms + eps).sqrt();
        rstd.push(r);
        for (v, &gi) in row.iter_mut().zip(gs) {
            *v = *v * r * gi;
        }
    }
    Ok((y, RmsNormCache { rstd }))
}

/// Returns `(dx, dg)`: `dx_j = r·(dy_j g_j − x_j r² mean_i(dy_i g_i x_i))`, `dg = Σ_rows dy ⊙ x ⊙ r`.
pub fn backward<T: AdFloat>(
    x: &ArrayD<T>,
    g: &ArrayD<T>,
    cache: &RmsNormCache<T>,
    dy: &ArrayD<T>,
) -> (ArrayD<T>, ArrayD<T>) {
    let c = g.len();
    let nd = x.ndim();
    let gs = g.as_slice().expect("contiguous gain");
    let mut dx = standard(dy.clone());
    let mut dg = vec![T::zero(); c];
    let inv_c = T::one() / T::of(c as f64);
    for ((mut drow, xrow), &r) in dx
        .lanes_mut(Axis(nd - 1))
        .into_iter()
        .zip(x.lanes(Axis(nd - 1)))
        .zip(&cache.rstd)
    {
        let dot = match (drow.as_slice(), xrow.as_slice()) {
            (Some(d), Some(xr)) => crate::simd::dot3(d, gs, xr),
            _ => drow
                .iter()
                .zip(xrow.iter())
                .zip(gs)
                .fold(T::zero(), |s, ((&d, &xi), &gi)| s + d * gi * xi),
        };
        for ((&d, &xi), dgi) in drow.iter().zip(xrow.iter()).zip(dg.iter_mut()) {
            *dgi += d * xi * r;
        }
        let k = r * r * dot * inv_c;
        for ((d, &xi), &gi) in drow.iter_mut().zip(xrow.iter()).zip(gs) {
            *d = r * (*d * gi - xi * k);
        }
    }
    (dx, ArrayD::from_shape_vec(vec![c], dg).unwrap())
}

/// Tape op for [`forward`]: `x: [..., C]`, `gain: [C]`.
pub fn rms_norm<T: AdFloat>(tape: &mut Tape<T>, x: Var, gain: Var, eps: T) -> Result<Var> {
    let (xs, gs) = (tape.shared(x), tape.shared(gain));
    let (y, cache) = forward(&xs, &gs, eps)?;
    let bytes = cache.rstd.len() * std::mem::size_of::<T>();
    Ok(tape.push_op(&[x, gain], y, bytes, move |dy, needs| {
        let (dx, dg) = backward(&xs, &gs, &cache, dy);
        Ok(vec![needs[0].then_some(dx), needs[1].then_some(dg)])
    }))
}
