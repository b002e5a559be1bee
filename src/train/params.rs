//! [`ParamStore`]: the named, ordered f32 parameters that persist across training steps, and
//! [`ParamGrads`]: their gradients for one step (aligned with the store's order).
//!
//! The tape is define-by-run, so each step registers the store on a fresh tape
//! ([`ParamStore::register`]), runs forward/backward, collects gradients
//! ([`ParamStore::collect_grads`]) and lets the optimiser update the store in place.

use std::collections::HashMap;
use std::path::Path;

use ndarray::ArrayD;

use crate::io::tensor_file::{load_f32_tensors, save_f32_tensors};
use crate::{ElmError, Result};

/// Metadata key holding the JSON list of parameter names in store order.
const META_ORDER: &str = "elm.param_order";
/// Metadata key holding the JSON list of frozen parameter names.
const META_FROZEN: &str = "elm.frozen";

/// Named f32 tensors in insertion order, each trainable or frozen.
#[derive(Clone, Debug, Default)]
pub struct ParamStore {
    names: Vec<String>,
    values: Vec<ArrayD<f32>>,
    trainable: Vec<bool>,
    index: HashMap<String, usize>,
}

impl ParamStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a parameter. Duplicate names or non-finite values are rejected.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        value: ArrayD<f32>,
        trainable: bool,
    ) -> Result<usize> {
        let name = name.into();
        if self.index.contains_key(&name) {
            return Err(ElmError::tensor(name, "duplicate parameter name"));
        }
        if value.iter().any(|x| !x.is_finite()) {
            return Err(ElmError::NonFinite(format!("parameter `{name}`")));
        }
        let i = self.names.len();
        self.index.insert(name.clone(), i);
        self.names.push(name);
        self.values.push(value);
        self.trainable.push(trainable);
        Ok(i)
    }

    /// Number of parameters (tensors).
    pub fn len(&self) -> usize {
        self.names.len()
    }
    /// True when the store holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
    /// Total number of scalars in trainable tensors.
    pub fn num_trainable_scalars(&self) -> usize {
        self.values
            .iter()
            .zip(&self.trainable)
            .filter(|(_, &t)| t)
            .map(|(v, _)| v.len())
            .sum()
    }
    /// Index of a parameter by name.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }
    /// Parameter names in store order.
    pub fn names(&self) -> &[String] {
        &self.names
    }
    /// Name of parameter `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }
    /// Value of parameter `i`.
    pub fn value(&self, i: usize) -> &ArrayD<f32> {
        &self.values[i]
    }
    /// Mutable value of parameter `i` (the optimiser writes through this).
    pub fn value_mut(&mut self, i: usize) -> &mut ArrayD<f32> {
        &mut self.values[i]
    }
    /// Value by name.
    pub fn get(&self, name: &str) -> Option<&ArrayD<f32>> {
        self.index_of(name).map(|i| &self.values[i])
    }
    /// Whether parameter `i` is trained (else frozen).
    pub fn is_trainable(&self, i: usize) -> bool {
        self.trainable[i]
    }
    /// Freezes or unfreezes a parameter by name.
    pub fn set_trainable(&mut self, name: &str, trainable: bool) -> Result<()> {
        let i = self
            .index_of(name)
            .ok_or_else(|| ElmError::tensor(name, "no such parameter"))?;
        self.trainable[i] = trainable;
        Ok(())
    }

    /// Saves all tensors (order and frozen flags in the metadata) to a safetensors file, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let tensors: Vec<(String, &ArrayD<f32>)> =
            self.names.iter().cloned().zip(self.values.iter()).collect();
        let frozen: Vec<&String> = self
            .names
            .iter()
            .zip(&self.trainable)
            .filter(|(_, &t)| !t)
            .map(|(n, _)| n)
            .collect();
        let mut meta = HashMap::new();
        meta.insert(
            META_ORDER.to_string(),
            serde_json::to_string(&self.names).expect("names serialise"),
        );
        meta.insert(
            META_FROZEN.to_string(),
            serde_json::to_string(&frozen).expect("names serialise"),
        );
        save_f32_tensors(path.as_ref(), &tensors, meta)
    }

    /// Loads a store written by [`ParamStore::save`] (a plain safetensors file without our
    /// metadata loads too: sorted by name, all trainable).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let mut file = load_f32_tensors(path)?;
        let order: Vec<String> = match file.metadata.get(META_ORDER) {
            Some(s) => serde_json::from_str(s)
                .map_err(|e| ElmError::format(path, format!("metadata `{META_ORDER}`: {e}")))?,
            None => {
                let mut names: Vec<String> = file.tensors.keys().cloned().collect();
                names.sort();
                names
            }
        };
        let frozen: Vec<String> = match file.metadata.get(META_FROZEN) {
            Some(s) => serde_json::from_str(s)
                .map_err(|e| ElmError::format(path, format!("metadata `{META_FROZEN}`: {e}")))?,
            None => Vec::new(),
        };
        if order.len() != file.tensors.len() {
            return Err(ElmError::format(
                path,
                format!(
                    "metadata lists {} parameters but the file holds {} tensors",
                    order.len(),
                    file.tensors.len()
                ),
            ));
        }
        let mut store = ParamStore::new();
        for name in order {
            let value = file.tensors.remove(&name).ok_or_else(|| {
                ElmError::tensor(
                    &name,
                    format!("{}: listed in metadata but missing", path.display()),
                )
            })?;
            let trainable = !frozen.contains(&name);
            store.insert(name, value, trainable)?;
        }
        Ok(store)
    }

    /// Overwrites the values of this store with those in `path`; every name must exist in both with
    /// the same shape (the trainable flags of `self` are kept).
    pub fn load_values_from(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let other = ParamStore::load(path)?;
        if other.len() != self.len() {
            return Err(ElmError::format(
                path,
                format!("{} tensors, expected {}", other.len(), self.len()),
            ));
        }
        for (i, name) in self.names.iter().enumerate() {
            let v = other
                .get(name)
                .ok_or_else(|| ElmError::tensor(name, format!("missing in {}", path.display())))?;
            if v.shape() != self.values[i].shape() {
                return Err(ElmError::tensor(
                    name,
                    format!(
                        "{}: shape {:?}, expected {:?}",
                        path.display(),
                        v.shape(),
                        self.values[i].shape()
                    ),
                ));
            }
        }
        for (i, name) in self.names.clone().iter().enumerate() {
            self.values[i] = other.get(name).expect("checked above").clone();
        }
        Ok(())
    }
}

/// Gradients of one step, aligned with a [`ParamStore`]'s order (`None` = no gradient).
#[derive(Clone, Debug, Default)]
pub struct ParamGrads {
    /// One entry per parameter, store order.
    pub grads: Vec<Option<ArrayD<f32>>>,
}

impl ParamGrads {
    /// Wraps a gradient list aligned with a store.
    pub fn new(grads: Vec<Option<ArrayD<f32>>>) -> Self {
        Self { grads }
    }

    /// Global L2 norm over all present gradients, accumulated in f64.
    pub fn global_norm(&self) -> f64 {
        self.grads
            .iter()
            .flatten()
            .map(sum_of_squares)
            .sum::<f64>()
            .sqrt()
    }

    /// Global-norm clipping (PyTorch `clip_grad_norm_` convention): when the norm exceeds
    /// `max_norm`, every gradient is scaled by `max_norm / (norm + 1e-6)`. Returns the norm before
    /// clipping. A non-finite norm is an error (the step should be skipped, not applied).
    pub fn clip_global_norm(&mut self, max_norm: f64) -> Result<f64> {
        if max_norm.is_nan() || max_norm <= 0.0 {
            return Err(ElmError::config(
                "clip.max_norm",
                format!("must be > 0, got {max_norm}"),
            ));
        }
        let norm = self.global_norm();
        if !norm.is_finite() {
            return Err(ElmError::NonFinite("gradient global norm".into()));
        }
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            let c = coef as f32;
            for g in self.grads.iter_mut().flatten() {
                match g.as_slice_memory_order_mut() {
                    Some(xs) => {
                        use rayon::prelude::*;
                        xs.par_chunks_mut(CHUNK)
                            .for_each(|xs| xs.iter_mut().for_each(|x| *x *= c));
                    }
                    None => g.mapv_inplace(|x| x * c),
                }
            }
        }
        Ok(norm)
    }
}

/// Elements per parallel chunk of the gradient passes (fixed, so sums do not depend on the
/// number of threads).
const CHUNK: usize = 1 << 15;

/// `Σ x²` in f64: [`crate::simd::sum_of_squares`] per fixed chunk (a single running sum is a
/// chain of dependent additions, a millisecond per million elements), chunks on both cores.
/// The order is fixed, so the result is.
fn sum_of_squares(g: &ArrayD<f32>) -> f64 {
    use rayon::prelude::*;
    match g.as_slice_memory_order() {
        Some(xs) => {
            let parts: Vec<f64> = xs
                .par_chunks(CHUNK)
                .map(crate::simd::sum_of_squares::<f32, f64>)
                .collect();
            parts.iter().sum()
        }
        None => g.iter().map(|&x| (x as f64) * (x as f64)).sum(),
    }
}
