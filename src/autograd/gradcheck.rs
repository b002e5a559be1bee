//! Gradient checking: tape gradients vs central finite differences in `f64`.

use ndarray::{ArrayD, IxDyn};
use rand::{rngs::StdRng, Rng, SeedableRng};

use super::{Tape, Var};
use crate::error::{ElmError, Result};

/// Outcome of [`gradcheck`].
#[derive(Clone, Debug)]
pub struct GradcheckReport {
    /// `max_i |analytic_i − numeric_i|` over all checked elements of all inputs.
    pub max_abs_err: f64,
    /// Largest per-input relative error `max|a − n| / max(max|n|, 1e-6)` (∞-norm relative error).
    pub max_rel_err: f64,
    /// `(max_abs_err, rel_err)` per input.
    pub per_input: Vec<(f64, f64)>,
    /// Largest |numeric gradient| seen (to spot vacuous checks where everything is 0).
    pub max_abs_grad: f64,
    /// Number of scalar derivatives compared.
    pub checked: usize,
}

impl std::fmt::Display for GradcheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "gradcheck: {} derivatives, max abs err {:.3e}, max rel err {:.3e}, max |grad| {:.3e}, per input {:?}",
            self.checked, self.max_abs_err, self.max_rel_err, self.max_abs_grad, self.per_input
        )
    }
}

/// Compares tape gradients of `f` with central differences (step `eps`) at `inputs`.
///
/// `f` builds the graph on a fresh tape from the inputs (registered as params, in order)
/// and returns its output. A non-scalar output `y` is reduced to `Σ r ⊙ y` with a fixed
/// seeded random `r`, so every output element contributes.
pub fn gradcheck<F>(f: F, inputs: &[ArrayD<f64>], eps: f64) -> Result<GradcheckReport>
where
    F: Fn(&mut Tape<f64>, &[Var]) -> Result<Var>,
{
    let eval = |xs: &[ArrayD<f64>]| -> Result<(Tape<f64>, Vec<Var>, Var)> {
        let mut tape = Tape::<f64>::new();
        let vars: Vec<Var> = xs.iter().map(|x| tape.param(x.clone())).collect();
        let out = f(&mut tape, &vars)?;
        Ok((tape, vars, out))
    };
    let (mut tape, vars, out) = eval(inputs)?;
    let out_shape = tape.value(out).shape().to_vec();
    let mut rng = StdRng::seed_from_u64(0x9eed);
    let proj = ArrayD::from_shape_fn(IxDyn(&out_shape), |_| rng.gen_range(-1.0..1.0));
    let mut grads = tape.backward_from(out, proj.clone())?;
    let objective = |xs: &[ArrayD<f64>]| -> Result<f64> {
        let (tape, _, out) = eval(xs)?;
        let v = tape.value(out);
        if v.shape() != proj.shape() {
            return Err(ElmError::shape(
                "gradcheck",
                "output shape changed under perturbation",
            ));
        }
        Ok((v * &proj).sum())
    };

    let mut report = GradcheckReport {
        max_abs_err: 0.0,
        max_rel_err: 0.0,
        per_input: Vec::new(),
        max_abs_grad: 0.0,
        checked: 0,
    };
    let mut xs: Vec<ArrayD<f64>> = inputs.to_vec();
    for (k, &v) in vars.iter().enumerate() {
        let analytic = grads
            .take(v)
            .unwrap_or_else(|| ArrayD::zeros(inputs[k].raw_dim()));
        let mut max_abs: f64 = 0.0;
        let mut max_num: f64 = 0.0;
        for idx in 0..inputs[k].len() {
            let orig = xs[k].as_slice_mut().expect("standard layout input")[idx];
            xs[k].as_slice_mut().unwrap()[idx] = orig + eps;
            let fp = objective(&xs)?;
            xs[k].as_slice_mut().unwrap()[idx] = orig - eps;
            let fm = objective(&xs)?;
            xs[k].as_slice_mut().unwrap()[idx] = orig;
            let num = (fp - fm) / (2.0 * eps);
            let ana = analytic
                .as_slice()
                .map(|s| s[idx])
                .unwrap_or_else(|| *analytic.iter().nth(idx).unwrap());
            max_abs = max_abs.max((num - ana).abs());
            max_num = max_num.max(num.abs());
            report.checked += 1;
        }
        let rel = max_abs / max_num.max(1e-6);
        report.per_input.push((max_abs, rel));
        report.max_abs_err = report.max_abs_err.max(max_abs);
        report.max_rel_err = report.max_rel_err.max(rel);
        report.max_abs_grad = report.max_abs_grad.max(max_num);
    }
    Ok(report)
}
