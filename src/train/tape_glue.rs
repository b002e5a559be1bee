//! Glue between [`ParamStore`] and the autograd tape.

use super::params::{ParamGrads, ParamStore};
use crate::autograd::{Gradients, Tape, Var};
use crate::{ElmError, Result};

/// The tape handles of one registration of a [`ParamStore`], aligned with the store's order.
#[derive(Clone, Debug)]
pub struct ParamVars {
    vars: Vec<Var>,
}

impl ParamVars {
    /// The Var of parameter number `i` (store order).
    pub fn var(&self, i: usize) -> Var {
        self.vars[i]
    }
    /// All Vars, store order.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }
}

impl ParamStore {
    /// Registers every tensor on `tape`: trainable ones as `param` (they receive gradients),
    /// frozen ones as `constant`. Copies the values (the tape owns its leaves).
    pub fn register(&self, tape: &mut Tape<f32>) -> ParamVars {
        let vars = (0..self.len())
            .map(|i| {
                let v = self.value(i).clone();
                if self.is_trainable(i) {
                    tape.param(v)
                } else {
                    tape.constant(v)
                }
            })
            .collect();
        ParamVars { vars }
    }

    /// Takes the gradients of the registered parameters out of `grads` (store order; `None` for
    /// frozen parameters and for parameters the loss does not depend on). Shapes are checked.
    pub fn collect_grads(
        &self,
        vars: &ParamVars,
        grads: &mut Gradients<f32>,
    ) -> Result<ParamGrads> {
        if vars.vars.len() != self.len() {
            return Err(ElmError::shape(
                "ParamStore::collect_grads",
                format!("{} vars for {} parameters", vars.vars.len(), self.len()),
            ));
        }
        let mut out = Vec::with_capacity(self.len());
        for (i, &v) in vars.vars.iter().enumerate() {
            let g = if self.is_trainable(i) {
                grads.take(v)
            } else {
                None
            };
            if let Some(g) = &g {
                if g.shape() != self.value(i).shape() {
                    return Err(ElmError::tensor(
                        self.name(i),
                        format!(
                            "gradient shape {:?} != parameter shape {:?}",
                            g.shape(),
                            self.value(i).shape()
                        ),
                    ));
                }
            }
            out.push(g);
        }
        Ok(ParamGrads::new(out))
    }
}
