//! Elementary tape ops: arithmetic with broadcasting, reductions, shape ops, matmuls,
//! pointwise nonlinearities and softmax. Layer-level ops (RMSNorm, RoPE, attention, losses)
//! live in `crate::nn` and wrap plain forward/backward pairs.

use ndarray::{concatenate, s, Array2, ArrayD, ArrayView2, Axis, Ix2, IxDyn, Slice};

use super::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// Numpy broadcasting of two shapes.
pub fn broadcast_shape(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(ElmError::shape(
                op,
                format!("cannot broadcast {a:?} with {b:?}"),
            ));
        };
    }
    Ok(out)
}

/// Sums `g` down to `shape` (the reverse of broadcasting `shape` up to `g.shape()`).
pub fn sum_to_shape<T: AdFloat>(g: &ArrayD<T>, shape: &[usize]) -> ArrayD<T> {
    if g.shape() == shape {
        return g.clone();
    }
    let mut r = g.clone();
    while r.ndim() > shape.len() {
        r = r.sum_axis(Axis(0));
    }
    for (ax, &d) in shape.iter().enumerate() {
        if d == 1 && r.shape()[ax] != 1 {
            r = r.sum_axis(Axis(ax)).insert_axis(Axis(ax));
        }
    }
    r
}

/// Views `a` (`[..., K]`, standard layout) as a 2-D `[rows, K]` matrix.
pub fn as_2d<T: AdFloat>(a: &ArrayD<T>) -> ArrayView2<'_, T> {
    let k = *a.shape().last().unwrap_or(&1);
    let rows = a.len().checked_div(k).unwrap_or(0);
    a.view()
        .into_shape_with_order((rows, k))
        .expect("as_2d needs a standard-layout array")
}

/// Owned standard-layout copy if needed (ops below assume C order).
pub fn standard<T: AdFloat>(a: ArrayD<T>) -> ArrayD<T> {
    if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    }
}

/// Reshapes a 2-D `[rows, N]` result back to `[lead..., N]`.
fn from_2d<T: AdFloat>(m: Array2<T>, lead: &[usize]) -> ArrayD<T> {
    let n = m.ncols();
    let mut shape = lead.to_vec();
    shape.push(n);
    standard(m.into_dyn())
        .into_shape_with_order(IxDyn(&shape))
        .expect("from_2d reshape")
}

impl<T: AdFloat> Tape<T> {
    fn binary_broadcast(
        &mut self,
        op: &'static str,
        a: Var,
        b: Var,
        f: impl Fn(&ArrayD<T>, &ArrayD<T>) -> ArrayD<T>,
    ) -> Result<(ArrayD<T>, Vec<usize>, Vec<usize>)> {
        let (va, vb) = (self.value(a), self.value(b));
        broadcast_shape(op, va.shape(), vb.shape())?;
        Ok((f(va, vb), va.shape().to_vec(), vb.shape().to_vec()))
    }

    /// `a + b` with numpy broadcasting.
    pub fn add(&mut self, a: Var, b: Var) -> Result<Var> {
        let (v, sa, sb) = self.binary_broadcast("add", a, b, |x, y| x + y)?;
        Ok(self.push_op(&[a, b], v, 0, move |g, needs| {
            Ok(vec![
                needs[0].then(|| sum_to_shape(g, &sa)),
                needs[1].then(|| sum_to_shape(g, &sb)),
            ])
        }))
    }

    /// `a - b` with numpy broadcasting.
    pub fn sub(&mut self, a: Var, b: Var) -> Result<Var> {
        let (v, sa, sb) = self.binary_broadcast("sub", a, b, |x, y| x - y)?;
        Ok(self.push_op(&[a, b], v, 0, move |g, needs| {
            Ok(vec![
                needs[0].then(|| sum_to_shape(g, &sa)),
                needs[1].then(|| sum_to_shape(&g.mapv(|x| -x), &sb)),
            ])
        }))
    }

    /// `a * b` (elementwise) with numpy broadcasting.
    pub fn mul(&mut self, a: Var, b: Var) -> Result<Var> {
        let (v, sa, sb) = self.binary_broadcast("mul", a, b, |x, y| x * y)?;
        let (va, vb) = (self.shared(a), self.shared(b));
        Ok(self.push_op(&[a, b], v, 0, move |g, needs| {
            Ok(vec![
                needs[0].then(|| sum_to_shape(&(g * &*vb), &sa)),
                needs[1].then(|| sum_to_shape(&(g * &*va), &sb)),
            ])
        }))
    }

    /// `s * x` for a scalar constant `s`.
    pub fn scale(&mut self, x: Var, s: T) -> Var {
        let v = self.value(x) * s;
        self.push_op(&[x], v, 0, move |g, _| Ok(vec![Some(g * s)]))
    }

    /// `x + c` for a scalar constant `c`.
    pub fn add_scalar(&mut self, x: Var, c: T) -> Var {
        let v = self.value(x) + c;
        self.push_op(&[x], v, 0, move |g, _| Ok(vec![Some(g.clone())]))
    }

    /// `1 / x` elementwise (an exact zero gives ±∞, as in IEEE arithmetic).
    pub fn recip(&mut self, x: Var) -> Var {
        let xs = self.shared(x);
        let v = xs.mapv(|a| T::one() / a);
        self.push_op(&[x], v, 0, move |g, _| {
            // d(1/x) = −1/x² dx
            Ok(vec![Some(
                ndarray::Zip::from(g)
                    .and(&*xs)
                    .map_collect(|&g, &a| -g / (a * a)),
            )])
        })
    }

    /// `-x`.
    pub fn neg(&mut self, x: Var) -> Var {
        self.scale(x, -T::one())
    }

    /// Sum of all elements → shape `[]`.
    pub fn sum(&mut self, x: Var) -> Var {
        let xv = self.value(x);
        let shape = xv.shape().to_vec();
        let v = ArrayD::from_elem(IxDyn(&[]), xv.sum());
        self.push_op(&[x], v, 0, move |g, _| {
            let g0 = *g.iter().next().unwrap();
            Ok(vec![Some(ArrayD::from_elem(IxDyn(&shape), g0))])
        })
    }

    /// Mean of all elements → shape `[]`.
    pub fn mean(&mut self, x: Var) -> Var {
        let n = self.value(x).len().max(1);
        let s = self.sum(x);
        self.scale(s, T::one() / T::of(n as f64))
    }

    /// Sum over one axis (removed from the shape).
    pub fn sum_axis(&mut self, x: Var, axis: usize) -> Result<Var> {
        let xv = self.value(x);
        if axis >= xv.ndim() {
            return Err(ElmError::shape(
                "sum_axis",
                format!("axis {axis} of {:?}", xv.shape()),
            ));
        }
        let shape = xv.shape().to_vec();
        let v = xv.sum_axis(Axis(axis));
        Ok(self.push_op(&[x], v, 0, move |g, _| {
            let g = g.clone().insert_axis(Axis(axis));
            Ok(vec![Some(g.broadcast(IxDyn(&shape)).unwrap().to_owned())])
        }))
    }

    /// Sum of squares of all elements → shape `[]` (e.g. weight-decay or residual terms).
    pub fn sum_squares(&mut self, x: Var) -> Var {
        let xs = self.shared(x);
        let v = ArrayD::from_elem(IxDyn(&[]), xs.iter().map(|&a| a * a).sum::<T>());
        self.push_op(&[x], v, 0, move |g, _| {
            let g0 = *g.iter().next().unwrap();
            Ok(vec![Some(xs.mapv(|a| (a + a) * g0))])
        })
    }

    /// Same data, new shape (element count must match).
    pub fn reshape(&mut self, x: Var, shape: &[usize]) -> Result<Var> {
        let xv = self.value(x);
        let old = xv.shape().to_vec();
        if shape.iter().product::<usize>() != xv.len() {
            return Err(ElmError::shape(
                "reshape",
                format!("cannot reshape {old:?} to {shape:?}"),
            ));
        }
        let v = standard(xv.clone())
            .into_shape_with_order(IxDyn(shape))
            .map_err(|e| ElmError::shape("reshape", e.to_string()))?;
        Ok(self.push_op(&[x], v, 0, move |g, _| {
            Ok(vec![Some(
                standard(g.clone())
                    .into_shape_with_order(IxDyn(&old))
                    .map_err(|e| ElmError::shape("reshape backward", e.to_string()))?,
            )])
        }))
    }

    /// Elementwise `tanh`.
    pub fn tanh(&mut self, x: Var) -> Var {
        let v = self.value(x).mapv(|a| a.tanh());
        // Backward from the output: d tanh = 1 - y².
        let y = std::sync::Arc::new(v.clone());
        let bytes = super::array_bytes(&v);
        self.push_op(&[x], v, bytes, move |g, _| {
            let mut d = g.clone();
            d.zip_mut_with(&*y, |gi, &yi| *gi *= T::one() - yi * yi);
            Ok(vec![Some(d)])
        })
    }

    /// Elementwise `exp`.
    pub fn exp(&mut self, x: Var) -> Var {
        let v = self.value(x).mapv(|a| a.exp());
        let y = std::sync::Arc::new(v.clone());
        let bytes = super::array_bytes(&v);
        self.push_op(&[x], v, bytes, move |g, _| Ok(vec![Some(g * &*y)]))
    }

    /// Elementwise SiLU `x·σ(x)`.
    pub fn silu(&mut self, x: Var) -> Var {
        let xs = self.shared(x);
        let v = xs.mapv(silu_scalar);
        self.push_op(&[x], v, 0, move |g, _| {
            let mut d = g.clone();
            d.zip_mut_with(&*xs, |gi, &xi| *gi *= silu_grad_scalar(xi));
            Ok(vec![Some(d)])
        })
    }

    /// Softmax over the last axis.
    pub fn softmax(&mut self, x: Var) -> Var {
        let v = softmax_last(self.value(x));
        let y = std::sync::Arc::new(v.clone());
        let bytes = super::array_bytes(&v);
        self.push_op(&[x], v, bytes, move |g, _| {
            Ok(vec![Some(softmax_last_backward(&y, g))])
        })
    }

    /// `a · b` for 2-D `a: [M, K]`, `b: [K, N]` → `[M, N]`.
    pub fn matmul(&mut self, a: Var, b: Var) -> Result<Var> {
        let (va, vb) = (self.shared(a), self.shared(b));
        let (a2, b2) = match (
            va.view().into_dimensionality::<Ix2>(),
            vb.view().into_dimensionality::<Ix2>(),
        ) {
            (Ok(x), Ok(y)) if x.ncols() == y.nrows() => (x, y),
            _ => {
                return Err(ElmError::shape(
                    "matmul",
                    format!("need [M,K]·[K,N], got {:?}·{:?}", va.shape(), vb.shape()),
                ))
            }
        };
        let v = T::matmul(&a2.view(), &b2.view()).into_dyn();
        Ok(self.push_op(&[a, b], v, 0, move |g, needs| {
            let g2 = g.view().into_dimensionality::<Ix2>().unwrap();
            let a2 = va.view().into_dimensionality::<Ix2>().unwrap();
            let b2 = vb.view().into_dimensionality::<Ix2>().unwrap();
            Ok(vec![
                needs[0].then(|| T::matmul(&g2.view(), &b2.t()).into_dyn()),
                needs[1].then(|| T::matmul(&a2.t(), &g2.view()).into_dyn()),
            ])
        }))
    }

    /// Batched matmul: `a: [B, M, K]`, `b: [B, K, N]` → `[B, M, N]`.
    pub fn bmm(&mut self, a: Var, b: Var) -> Result<Var> {
        let (va, vb) = (self.shared(a), self.shared(b));
        let (sa, sb) = (va.shape(), vb.shape());
        if sa.len() != 3 || sb.len() != 3 || sa[0] != sb[0] || sa[2] != sb[1] {
            return Err(ElmError::shape(
                "bmm",
                format!("need [B,M,K]·[B,K,N], got {sa:?}·{sb:?}"),
            ));
        }
        let v = bmm_raw(&va, &vb, false, false);
        Ok(self.push_op(&[a, b], v, 0, move |g, needs| {
            Ok(vec![
                needs[0].then(|| bmm_raw(g, &vb, false, true)),
                needs[1].then(|| bmm_raw(&va, g, true, false)),
            ])
        }))
    }

    /// Linear layer `x · Wᵀ (+ b)`: `x: [..., K]`, `w: [N, K]` (PyTorch layout), `b: [N]` → `[..., N]`.
    pub fn matmul_t(&mut self, x: Var, w: Var, bias: Option<Var>) -> Result<Var> {
        let (xs, ws) = (self.shared(x), self.shared(w));
        let bs = bias.map(|b| self.shared(b));
        let v = crate::autograd::ops::linear_forward(&xs, &ws, bs.as_deref())?;
        let mut inputs = vec![x, w];
        inputs.extend(bias);
        Ok(self.push_op(&inputs, v, 0, move |g, needs| {
            let (dx, dw, db) =
                linear_backward(&xs, &ws, g, needs[0], needs[1], needs.get(2) == Some(&true));
            let mut out = vec![dx, dw];
            if needs.len() == 3 {
                out.push(db);
            }
            Ok(out)
        }))
    }

    /// Concatenates along the last axis (all other dims equal).
    pub fn concat_last(&mut self, xs: &[Var]) -> Result<Var> {
        if xs.is_empty() {
            return Err(ElmError::InvalidArgument(
                "concat_last of zero arrays".into(),
            ));
        }
        let vals: Vec<_> = xs.iter().map(|&x| self.shared(x)).collect();
        let nd = vals[0].ndim();
        if nd == 0 {
            return Err(ElmError::shape("concat_last", "cannot concat scalars"));
        }
        let views: Vec<_> = vals.iter().map(|a| a.view()).collect();
        let v = concatenate(Axis(nd - 1), &views).map_err(|e| {
            ElmError::shape(
                "concat_last",
                format!(
                    "{e}: shapes {:?}",
                    vals.iter().map(|a| a.shape().to_vec()).collect::<Vec<_>>()
                ),
            )
        })?;
        let widths: Vec<usize> = vals.iter().map(|a| a.shape()[nd - 1]).collect();
        drop(vals);
        Ok(self.push_op(xs, standard(v), 0, move |g, needs| {
            let mut start = 0;
            let mut out = Vec::with_capacity(widths.len());
            for (i, &w) in widths.iter().enumerate() {
                let part = g.slice_axis(Axis(nd - 1), Slice::from(start..start + w));
                out.push(needs[i].then(|| part.to_owned()));
                start += w;
            }
            Ok(out)
        }))
    }

    /// Rows `rows` of `x` `[..., C]` seen as `[N, C]` (N = the product of the leading axes):
    /// `[R, C]`. The backward adds each row's gradient back at its source row (a row may repeat).
    /// Lets a loss run only where it is supervised (e.g. the LM head at answer tokens).
    pub fn select_rows(&mut self, x: Var, rows: &[usize]) -> Result<Var> {
        let xv = self.value(x);
        let shape = xv.shape().to_vec();
        let c = shape.last().copied().unwrap_or(0);
        let n = xv.len().checked_div(c).unwrap_or(0);
        if shape.is_empty() {
            return Err(ElmError::shape("select_rows", "a scalar has no rows"));
        }
        if let Some(&bad) = rows.iter().find(|&&r| r >= n) {
            return Err(ElmError::shape(
                "select_rows",
                format!("row {bad} of {n} rows (shape {shape:?})"),
            ));
        }
        let flat = xv
            .to_shape((n, c))
            .map_err(|e| ElmError::shape("select_rows", e.to_string()))?;
        let v = flat.select(Axis(0), rows).into_dyn();
        let rows = rows.to_vec();
        Ok(self.push_op(&[x], v, 0, move |g, _| {
            // [N, C] of zeros, then each selected row's gradient added back.
            let mut d = ndarray::Array2::<T>::zeros((n, c));
            let g2 = g
                .to_shape((rows.len(), c))
                .map_err(|e| ElmError::shape("select_rows backward", e.to_string()))?;
            for (i, &r) in rows.iter().enumerate() {
                let mut dst = d.row_mut(r);
                dst += &g2.row(i);
            }
            let d = d
                .into_shape_with_order(IxDyn(&shape))
                .map_err(|e| ElmError::shape("select_rows backward", e.to_string()))?;
            Ok(vec![Some(d)])
        }))
    }

    /// `x[..., start..end]` along the last axis.
    pub fn slice_last(&mut self, x: Var, start: usize, end: usize) -> Result<Var> {
        let xv = self.value(x);
        let nd = xv.ndim();
        if nd == 0 || start > end || end > xv.shape()[nd - 1] {
            return Err(ElmError::shape(
                "slice_last",
                format!("range {start}..{end} of shape {:?}", xv.shape()),
            ));
        }
        let shape = xv.shape().to_vec();
        let v = xv
            .slice_axis(Axis(nd - 1), Slice::from(start..end))
            .to_owned();
        Ok(self.push_op(&[x], v, 0, move |g, _| {
            let mut d = ArrayD::zeros(IxDyn(&shape));
            d.slice_axis_mut(Axis(nd - 1), Slice::from(start..end))
                .assign(g);
            Ok(vec![Some(d)])
        }))
    }
}

/// `x · Wᵀ (+ b)` on plain arrays: `x: [..., K]`, `w: [N, K]`, `b: [N]` → `[..., N]`.
pub fn linear_forward<T: AdFloat>(
    x: &ArrayD<T>,
    w: &ArrayD<T>,
    b: Option<&ArrayD<T>>,
) -> Result<ArrayD<T>> {
    let xk = x.shape().last().copied().unwrap_or(0);
    let ok = x.ndim() >= 1
        && w.ndim() == 2
        && w.shape()[1] == xk
        && b.is_none_or(|b| b.shape() == [w.shape()[0]]);
    if !ok {
        return Err(ElmError::shape(
            "linear",
            format!(
                "x {:?} · Wᵀ with W {:?}, bias {:?}",
                x.shape(),
                w.shape(),
                b.map(|b| b.shape().to_vec())
            ),
        ));
    }
    let xs;
    let x = if x.is_standard_layout() {
        x
    } else {
        xs = standard(x.clone());
        &xs
    };
    let w2 = w.view().into_dimensionality::<Ix2>().unwrap();
    let mut y = T::matmul(&as_2d(x), &w2.t());
    if let Some(b) = b {
        let b1 = b.view().into_dimensionality::<ndarray::Ix1>().unwrap();
        y += &b1;
    }
    Ok(from_2d(y, &x.shape()[..x.ndim() - 1]))
}

/// Backward of [`linear_forward`]: returns `(dx, dW, db)`, each only when requested.
#[allow(clippy::type_complexity)]
pub fn linear_backward<T: AdFloat>(
    x: &ArrayD<T>,
    w: &ArrayD<T>,
    g: &ArrayD<T>,
    want_x: bool,
    want_w: bool,
    want_b: bool,
) -> (Option<ArrayD<T>>, Option<ArrayD<T>>, Option<ArrayD<T>>) {
    let gs = standard(g.clone());
    let g2 = as_2d(&gs);
    let w2 = w.view().into_dimensionality::<Ix2>().unwrap();
    let dx = want_x.then(|| from_2d(T::matmul(&g2, &w2), &x.shape()[..x.ndim() - 1]));
    let dw = want_w.then(|| {
        let xs = standard(x.clone());
        T::matmul(&g2.t(), &as_2d(&xs)).into_dyn()
    });
    let db = want_b.then(|| g2.sum_axis(Axis(0)).into_dyn());
    (dx, dw, db)
}

/// Batched matmul on plain 3-D arrays with optional transposes of the last two axes.
pub fn bmm_raw<T: AdFloat>(a: &ArrayD<T>, b: &ArrayD<T>, ta: bool, tb: bool) -> ArrayD<T> {
    let a3 = a.view().into_dimensionality::<ndarray::Ix3>().unwrap();
    let b3 = b.view().into_dimensionality::<ndarray::Ix3>().unwrap();
    let m = if ta { a3.shape()[2] } else { a3.shape()[1] };
    let n = if tb { b3.shape()[1] } else { b3.shape()[2] };
    let batch = a3.shape()[0];
    let mut out = ndarray::Array3::<T>::zeros((batch, m, n));
    for i in 0..batch {
        let ai = a3.slice(s![i, .., ..]);
        let bi = b3.slice(s![i, .., ..]);
        let ai = if ta { ai.reversed_axes() } else { ai };
        let bi = if tb { bi.reversed_axes() } else { bi };
        out.slice_mut(s![i, .., ..]).assign(&ai.dot(&bi));
    }
    out.into_dyn()
}

/// `x·σ(x)`.
pub fn silu_scalar<T: AdFloat>(x: T) -> T {
    x / (T::one() + (-x).exp())
}

/// `d/dx [x·σ(x)] = σ(x)·(1 + x·(1 − σ(x)))`.
pub fn silu_grad_scalar<T: AdFloat>(x: T) -> T {
    let s = T::one() / (T::one() + (-x).exp());
    s * (T::one() + x * (T::one() - s))
}

/// Numerically stable softmax over the last axis.
pub fn softmax_last<T: AdFloat>(x: &ArrayD<T>) -> ArrayD<T> {
    let mut y = standard(x.clone());
    let nd = y.ndim();
    if nd == 0 {
        return y.mapv(|_| T::one());
    }
    for mut row in y.lanes_mut(Axis(nd - 1)) {
        let m = row.fold(T::neg_infinity(), |a, &b| a.max(b));
        row.mapv_inplace(|v| (v - m).exp());
        let s = row.sum();
        row.mapv_inplace(|v| v / s);
    }
    y
}

/// Softmax VJP over the last axis: `dx = y ⊙ (g − Σ g⊙y)`.
pub fn softmax_last_backward<T: AdFloat>(y: &ArrayD<T>, g: &ArrayD<T>) -> ArrayD<T> {
    let nd = y.ndim();
    let mut d = standard(g.clone());
    if nd == 0 {
        return d.mapv(|_| T::zero());
    }
    for (mut drow, yrow) in d
        .lanes_mut(Axis(nd - 1))
        .into_iter()
        .zip(y.lanes(Axis(nd - 1)))
    {
        let dot: T = drow.iter().zip(yrow.iter()).map(|(&a, &b)| a * b).sum();
        drow.zip_mut_with(&yrow, |di, &yi| *di = yi * (*di - dot));
    }
    d
}
