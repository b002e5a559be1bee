//! The two small implicit layers the backward-solver example and tests use, whose Jacobians are
//! known exactly: `z = z·Wᵀ + x·Uᵀ + b` (`J = W`) and `z = tanh(z·Wᵀ + x·Uᵀ + b)`
//! (`J = diag(1 − z²) W`). Included with `#[path]` by examples/backward_solvers.rs and
//! tests/grad_krylov.rs.

use elm::autograd::{AdFloat, Tape, Var};
use elm::grad::ImplicitLayer;

elm::param_set! {
    /// W [D, D], U [D, Dx], b [D].
    pub struct Params { w, u, b }
}

/// z = z·Wᵀ + x·Uᵀ + b.
#[derive(Clone)]
pub struct LinearDeq;

impl<T: AdFloat> ImplicitLayer<T> for LinearDeq {
    type Params = Params;
    fn forward(&self, t: &mut Tape<T>, z: Var, x: Var, p: &Params) -> elm::Result<Var> {
        let wz = t.matmul_t(z, p.w, None)?;
        let ux = t.matmul_t(x, p.u, Some(p.b))?;
        t.add(wz, ux)
    }
}

/// z = tanh(z·Wᵀ + x·Uᵀ + b).
#[derive(Clone)]
#[allow(dead_code)] // the example uses the linear layer only
pub struct TanhDeq;

impl<T: AdFloat> ImplicitLayer<T> for TanhDeq {
    type Params = Params;
    fn forward(&self, t: &mut Tape<T>, z: Var, x: Var, p: &Params) -> elm::Result<Var> {
        let wz = t.matmul_t(z, p.w, None)?;
        let ux = t.matmul_t(x, p.u, Some(p.b))?;
        let s = t.add(wz, ux)?;
        Ok(t.tanh(s))
    }
}
