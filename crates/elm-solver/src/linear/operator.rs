//! [`LinearOperator`]: how a method sees `A` (products `A v`, and `Aᵀ v` where offered), and
//! the operators the crate provides (closures, a dense matrix).

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

use crate::error::{MapError, Result, SolverError};
use crate::SolverFloat;

/// A batched linear operator `x ↦ A x`, applied row by row (each row its own system).
pub trait LinearOperator<T: SolverFloat> {
    /// Row width D.
    fn dim(&self) -> usize;
    /// `out[b] = A x[b]` for every row b with `active[b]`; other rows may be left untouched.
    /// x, out: `[B, D]`. The error is the operator's own, boxed: the solve returns it unchanged
    /// inside [`SolverError::Map`].
    fn apply(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError>;
    /// Whether [`LinearOperator::apply_transpose`] is offered (CGNR needs it).
    fn has_transpose(&self) -> bool {
        false
    }
    /// `out[b] = Aᵀ x[b]` for every active row; only where [`LinearOperator::has_transpose`].
    fn apply_transpose(
        &mut self,
        _x: ArrayView2<T>,
        _active: &[bool],
        _out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        Err(SolverError::InvalidArgument("this operator offers no products with Aᵀ".into()).into())
    }
}

/// A [`LinearOperator`] from a closure over the whole batch: `f(x [B, D], active [B], out [B, D])`.
pub struct FnOperator<F> {
    dim: usize,
    f: F,
}

impl<F> FnOperator<F> {
    /// Wraps `f` as an operator on rows of width `dim`.
    pub fn new(dim: usize, f: F) -> Self {
        FnOperator { dim, f }
    }
}

impl<T, F> LinearOperator<T> for FnOperator<F>
where
    T: SolverFloat,
    F: FnMut(ArrayView2<T>, &[bool], ArrayViewMut2<T>) -> Result<(), MapError>,
{
    fn dim(&self) -> usize {
        self.dim
    }
    fn apply(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        (self.f)(x, active, out)
    }
}

/// A [`LinearOperator`] with products by `A` and by `Aᵀ`, from two closures of
/// [`FnOperator`]'s form: what CGNR needs.
pub struct FnOperatorPair<F, G> {
    dim: usize,
    f: F,
    ft: G,
}

impl<F, G> FnOperatorPair<F, G> {
    /// `f` applies `A`, `ft` applies `Aᵀ`, on rows of width `dim`.
    pub fn new(dim: usize, f: F, ft: G) -> Self {
        FnOperatorPair { dim, f, ft }
    }
}

impl<T, F, G> LinearOperator<T> for FnOperatorPair<F, G>
where
    T: SolverFloat,
    F: FnMut(ArrayView2<T>, &[bool], ArrayViewMut2<T>) -> Result<(), MapError>,
    G: FnMut(ArrayView2<T>, &[bool], ArrayViewMut2<T>) -> Result<(), MapError>,
{
    fn dim(&self) -> usize {
        self.dim
    }
    fn apply(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        (self.f)(x, active, out)
    }
    fn has_transpose(&self) -> bool {
        true
    }
    fn apply_transpose(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        (self.ft)(x, active, out)
    }
}

/// A dense `A [D, D]` applied to each active row (`out[b] = A x[b]`, f64 sums, no BLAS, so a
/// row's product never depends on the batch around it).
pub struct MatrixOperator<T> {
    a: Array2<T>,
}

impl<T: SolverFloat> MatrixOperator<T> {
    /// Refuses a non-square or empty `a`.
    pub fn new(a: Array2<T>) -> Result<Self> {
        if a.nrows() != a.ncols() || a.nrows() == 0 {
            return Err(SolverError::shape(
                "MatrixOperator",
                format!("A must be square and non-empty, got {:?}", a.dim()),
            ));
        }
        Ok(MatrixOperator { a })
    }
}

impl<T: SolverFloat> LinearOperator<T> for MatrixOperator<T> {
    fn dim(&self) -> usize {
        self.a.nrows()
    }
    fn apply(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        self.product(false, x, active, out)
    }
    fn has_transpose(&self) -> bool {
        true
    }
    fn apply_transpose(
        &mut self,
        x: ArrayView2<T>,
        active: &[bool],
        out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        self.product(true, x, active, out)
    }
}

impl<T: SolverFloat> MatrixOperator<T> {
    /// `out[b] = A x[b]`, or `Aᵀ x[b]` when `transpose`, for the active rows.
    fn product(
        &self,
        transpose: bool,
        x: ArrayView2<T>,
        active: &[bool],
        mut out: ArrayViewMut2<T>,
    ) -> Result<(), MapError> {
        let a = if transpose { self.a.t() } else { self.a.view() };
        let d = self.a.nrows();
        if x.ncols() != d || out.dim() != x.dim() || active.len() != x.nrows() {
            return Err(SolverError::shape(
                "MatrixOperator",
                format!("x {:?}, out {:?} for A [{d}, {d}]", x.dim(), out.dim()),
            )
            .into());
        }
        for (b, _) in active.iter().enumerate().filter(|(_, &a)| a) {
            let xr = x.row(b);
            for i in 0..d {
                let s: f64 = a
                    .row(i)
                    .iter()
                    .zip(xr.iter())
                    .map(|(&aik, &xk)| aik.widen() * xk.widen())
                    .sum();
                out[[b, i]] = T::narrow(s);
            }
        }
        Ok(())
    }
}
