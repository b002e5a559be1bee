//! AdamW (Loshchilov & Hutter) with decoupled weight decay, PyTorch semantics:
//!
//! ```text
//! p ← p − lr·wd·p                     (only for tensors not excluded from decay)
//! m ← β1·m + (1−β1)·g
//! v ← β2·v + (1−β2)·g²
//! p ← p − lr · (m / (1−β1ᵗ)) / (sqrt(v / (1−β2ᵗ)) + ε)
//! ```
//! `t` counts the steps *this tensor* received a gradient (a tensor without gradient in a step
//! is left untouched, moments included). Moments are stored in f32 and the update is computed in
//! f32, as PyTorch does: `p ← p − (lr·wd·p + (lr/(1−β1ᵗ)) · m / (√v/√(1−β2ᵗ) + ε))` (the scalars
//! in f64). f64 division and square root over millions of parameters made the update
//! compute-bound (several milliseconds per step for a 4M-parameter module); in f32 it runs at
//! the speed of memory. The decay is subtracted as `lr·wd·p`, not applied as a factor
//! `1 − lr·wd`: in f32 that factor would round `lr·wd` to a multiple of 2⁻²⁴ (at the end of a
//! cosine schedule, lr·wd ≈ 4e-8 became 6e-8, and below 3e-8 the decay vanished).

use std::collections::HashMap;
use std::path::Path;

use ndarray::ArrayD;
use serde::{Deserialize, Serialize};

use super::params::{ParamGrads, ParamStore};
use crate::io::tensor_file::{load_f32_tensors, save_f32_tensors};
use crate::io::write_atomic;
use crate::{ElmError, Result};

fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}
fn default_true() -> bool {
    true
}
fn default_patterns() -> Vec<String> {
    vec!["norm".into(), "bias".into()]
}

/// AdamW hyper-parameters (the learning rate comes from the schedule at each step).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    /// First-moment decay β1.
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    /// Second-moment decay β2.
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    /// Denominator ε.
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// Decoupled weight decay coefficient (multiplied by the step's lr).
    #[serde(default)]
    pub weight_decay: f64,
    /// Exclude tensors of rank ≤ 1 (biases, norm gains) from weight decay.
    #[serde(default = "default_true")]
    pub no_decay_rank1: bool,
    /// Exclude tensors whose name contains any of these substrings from weight decay.
    #[serde(default = "default_patterns")]
    pub no_decay_patterns: Vec<String>,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: default_beta1(),
            beta2: default_beta2(),
            eps: default_eps(),
            weight_decay: 0.0,
            no_decay_rank1: true,
            no_decay_patterns: default_patterns(),
        }
    }
}

impl AdamWConfig {
    /// Checks ranges: β ∈ [0, 1), ε > 0, wd ≥ 0.
    pub fn validate(&self) -> Result<()> {
        for (field, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(ElmError::config(
                    field,
                    format!("must be in [0, 1), got {b}"),
                ));
            }
        }
        if self.eps.is_nan() || self.eps <= 0.0 {
            return Err(ElmError::config(
                "eps",
                format!("must be > 0, got {}", self.eps),
            ));
        }
        if !self.weight_decay.is_finite() || self.weight_decay < 0.0 {
            return Err(ElmError::config(
                "weight_decay",
                format!("must be ≥ 0, got {}", self.weight_decay),
            ));
        }
        Ok(())
    }

    /// One step of this rule on a plain f64 vector that lives outside a [`ParamStore`] (a
    /// policy's logits, say): `moments` are its `(m, v)` and `t` the steps taken before this
    /// one. `ascend` climbs the gradient instead of descending it. The update is the textbook
    /// form `p ∓= lr·m̂/(√v̂ + ε)` with bias-corrected moments, after a decoupled decay
    /// `p −= lr·wd·p` (no exclusions: a vector is one tensor).
    pub fn step_vector(
        &self,
        params: &mut [f64],
        (m, v): (&mut [f64], &mut [f64]),
        t: u64,
        grad: &[f64],
        lr: f64,
        ascend: bool,
    ) -> Result<()> {
        if grad.len() != params.len() || m.len() != params.len() || v.len() != params.len() {
            return Err(ElmError::shape(
                "AdamWConfig::step_vector",
                format!(
                    "{} gradients, {} and {} moments for {} parameters",
                    grad.len(),
                    m.len(),
                    v.len(),
                    params.len()
                ),
            ));
        }
        if grad.iter().any(|g| !g.is_finite()) {
            return Err(ElmError::NonFinite("gradient of a vector parameter".into()));
        }
        let (b1, b2) = (self.beta1, self.beta2);
        let t = (t + 1) as i32;
        let sign = if ascend { 1.0 } else { -1.0 };
        for (j, &g) in grad.iter().enumerate() {
            if self.weight_decay != 0.0 {
                params[j] -= lr * self.weight_decay * params[j];
            }
            m[j] = b1 * m[j] + (1.0 - b1) * g;
            v[j] = b2 * v[j] + (1.0 - b2) * g * g;
            let mh = m[j] / (1.0 - b1.powi(t));
            let vh = v[j] / (1.0 - b2.powi(t));
            params[j] += sign * lr * mh / (vh.sqrt() + self.eps);
        }
        Ok(())
    }

    /// Whether weight decay applies to a tensor with this name and rank.
    pub fn decays(&self, name: &str, rank: usize) -> bool {
        if self.weight_decay == 0.0 || (self.no_decay_rank1 && rank <= 1) {
            return false;
        }
        !self
            .no_decay_patterns
            .iter()
            .any(|p| name.contains(p.as_str()))
    }
}

/// Per-tensor optimiser state.
#[derive(Clone, Debug)]
struct Moments {
    step: u64,
    m: ArrayD<f32>,
    v: ArrayD<f32>,
}

/// The AdamW optimiser: config + per-tensor moments keyed by parameter name.
#[derive(Clone, Debug)]
pub struct AdamW {
    config: AdamWConfig,
    state: HashMap<String, Moments>,
}

/// JSON side of a saved optimiser state.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateJson {
    format: String,
    config: AdamWConfig,
    /// name → number of steps applied to that tensor.
    steps: Vec<(String, u64)>,
}

const STATE_FORMAT: &str = "elm.adamw.v1";

impl AdamW {
    /// A fresh optimiser (no moments yet). Invalid hyper-parameters → `ElmError::Config`.
    pub fn new(config: AdamWConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            config,
            state: HashMap::new(),
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// Steps applied so far to the named tensor (0 if never updated).
    pub fn steps_of(&self, name: &str) -> u64 {
        self.state.get(name).map_or(0, |s| s.step)
    }

    /// First and second moments of the named tensor, if it was ever updated.
    pub fn moments_of(&self, name: &str) -> Option<(&ArrayD<f32>, &ArrayD<f32>)> {
        self.state.get(name).map(|s| (&s.m, &s.v))
    }

    /// Bytes of the moments this optimiser will allocate at its first update of `store`'s
    /// trainable tensors that have none yet (two f32 tensors each): memory a run needs later.
    pub fn unallocated_state_bytes(&self, store: &ParamStore) -> u64 {
        (0..store.len())
            .filter(|&i| store.is_trainable(i) && !self.state.contains_key(store.name(i)))
            .map(|i| 2 * 4 * store.value(i).len() as u64)
            .sum()
    }

    /// One AdamW update of every trainable tensor that has a gradient, with learning rate `lr`.
    /// Non-finite gradients or lr → error before anything is modified.
    pub fn step(&mut self, store: &mut ParamStore, grads: &ParamGrads, lr: f64) -> Result<()> {
        if grads.grads.len() != store.len() {
            return Err(ElmError::shape(
                "AdamW::step",
                format!(
                    "{} gradients for {} parameters",
                    grads.grads.len(),
                    store.len()
                ),
            ));
        }
        if !lr.is_finite() || lr < 0.0 {
            return Err(ElmError::InvalidArgument(format!("AdamW::step: lr = {lr}")));
        }
        for (i, g) in grads.grads.iter().enumerate() {
            if let Some(g) = g {
                if g.shape() != store.value(i).shape() {
                    return Err(ElmError::tensor(
                        store.name(i),
                        format!(
                            "gradient shape {:?} != parameter shape {:?}",
                            g.shape(),
                            store.value(i).shape()
                        ),
                    ));
                }
                if !crate::autograd::all_finite(g) {
                    return Err(ElmError::NonFinite(format!(
                        "gradient of `{}`",
                        store.name(i)
                    )));
                }
            }
        }
        let c = &self.config;
        let (b1, b2, eps) = (c.beta1, c.beta2, c.eps);
        for (i, g) in grads.grads.iter().enumerate() {
            let Some(g) = g else { continue };
            if !store.is_trainable(i) {
                continue;
            }
            let name = store.name(i).to_string();
            let rank = store.value(i).ndim();
            let lr_wd = if c.decays(&name, rank) {
                (lr * c.weight_decay) as f32
            } else {
                0.0
            };
            let st = self.state.entry(name).or_insert_with(|| Moments {
                step: 0,
                m: ArrayD::zeros(g.raw_dim()),
                v: ArrayD::zeros(g.raw_dim()),
            });
            st.step += 1;
            let t = st.step as i32;
            let bc1 = 1.0 - b1.powi(t);
            let bc2 = 1.0 - b2.powi(t);
            let (b1f, b2f) = (b1 as f32, b2 as f32);
            let (one_b1, one_b2) = ((1.0 - b1) as f32, (1.0 - b2) as f32);
            let step_size = (lr / bc1) as f32;
            let inv_sqrt_bc2 = (1.0 / bc2.sqrt()) as f32;
            let eps32 = eps as f32;
            let update = |p: &mut f32, m: &mut f32, v: &mut f32, g: f32| {
                let m_new = b1f * *m + one_b1 * g;
                let v_new = b2f * *v + one_b2 * g * g;
                *m = m_new;
                *v = v_new;
                let denom = v_new.sqrt() * inv_sqrt_bc2 + eps32;
                *p -= lr_wd * *p + step_size * m_new / denom;
            };
            let p = store.value_mut(i);
            // `as_slice` is `Some` only for arrays in standard (row-major, contiguous) order,
            // so the four slices index the same elements.
            match (
                p.as_slice_mut(),
                st.m.as_slice_mut(),
                st.v.as_slice_mut(),
                g.as_slice(),
            ) {
                // Elementwise and independent: split over the cores in fixed chunks (the
                // result does not depend on the split), each chunk a loop the compiler
                // vectorises.
                (Some(p), Some(m), Some(v), Some(g)) => {
                    use rayon::prelude::*;
                    const CHUNK: usize = 1 << 14;
                    p.par_chunks_mut(CHUNK)
                        .zip(m.par_chunks_mut(CHUNK))
                        .zip(v.par_chunks_mut(CHUNK))
                        .zip(g.par_chunks(CHUNK))
                        .for_each(|(((p, m), v), g)| {
                            for (((p, m), v), &g) in p.iter_mut().zip(m).zip(v).zip(g) {
                                update(p, m, v, g);
                            }
                        });
                }
                _ => ndarray::Zip::from(store.value_mut(i))
                    .and(&mut st.m)
                    .and(&mut st.v)
                    .and(g)
                    .for_each(|p, m, v, &g| update(p, m, v, g)),
            }
        }
        Ok(())
    }

    /// Saves the state: moments to `path` (safetensors, tensors `m.<name>` / `v.<name>`) and the
    /// config + step counts to `path` with extension `.json`. Both written atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let mut names: Vec<&String> = self.state.keys().collect();
        names.sort();
        let mut tensors = Vec::with_capacity(2 * names.len());
        for n in &names {
            let s = &self.state[*n];
            tensors.push((format!("m.{n}"), &s.m));
            tensors.push((format!("v.{n}"), &s.v));
        }
        let json = StateJson {
            format: STATE_FORMAT.into(),
            config: self.config.clone(),
            steps: names
                .iter()
                .map(|n| ((*n).clone(), self.state[*n].step))
                .collect(),
        };
        let json_path = path.with_extension("json");
        let text = serde_json::to_string_pretty(&json).map_err(|e| ElmError::Json {
            what: json_path.display().to_string(),
            msg: e.to_string(),
        })?;
        let mut meta = HashMap::new();
        meta.insert("format".to_string(), STATE_FORMAT.to_string());
        save_f32_tensors(path, &tensors, meta)?;
        write_atomic(&json_path, text.as_bytes())
    }

    /// Loads a state written by [`AdamW::save`]. Missing/corrupt files, unknown JSON keys, missing
    /// moments or m/v shape disagreement → typed errors naming the file and tensor.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let json_path = path.with_extension("json");
        let text = std::fs::read_to_string(&json_path).map_err(|e| ElmError::io(&json_path, e))?;
        let json: StateJson = serde_json::from_str(&text).map_err(|e| ElmError::Json {
            what: json_path.display().to_string(),
            msg: e.to_string(),
        })?;
        if json.format != STATE_FORMAT {
            return Err(ElmError::format(
                &json_path,
                format!("format `{}`, expected `{STATE_FORMAT}`", json.format),
            ));
        }
        json.config.validate()?;
        let mut file = load_f32_tensors(path)?;
        if file.tensors.len() != 2 * json.steps.len() {
            return Err(ElmError::format(
                path,
                format!(
                    "{} tensors, expected {} (m and v for {} parameters)",
                    file.tensors.len(),
                    2 * json.steps.len(),
                    json.steps.len()
                ),
            ));
        }
        let mut state = HashMap::new();
        for (name, step) in json.steps {
            let mut take = |k: String| {
                file.tensors
                    .remove(&k)
                    .ok_or_else(|| ElmError::tensor(&k, format!("missing in {}", path.display())))
            };
            let m = take(format!("m.{name}"))?;
            let v = take(format!("v.{name}"))?;
            if m.shape() != v.shape() {
                return Err(ElmError::tensor(
                    &name,
                    format!(
                        "{}: m shape {:?} != v shape {:?}",
                        path.display(),
                        m.shape(),
                        v.shape()
                    ),
                ));
            }
            if m.iter().chain(v.iter()).any(|x| !x.is_finite()) || v.iter().any(|&x| x < 0.0) {
                return Err(ElmError::tensor(
                    &name,
                    format!("{}: non-finite or negative moments", path.display()),
                ));
            }
            state.insert(name, Moments { step, m, v });
        }
        Ok(Self {
            config: json.config,
            state,
        })
    }

    /// Checks that every saved moment matches a trainable tensor of `store` in shape
    /// (call after [`AdamW::load`] when resuming).
    pub fn check_against(&self, store: &ParamStore) -> Result<()> {
        for (name, s) in &self.state {
            let v = store.get(name).ok_or_else(|| {
                ElmError::tensor(name, "optimiser state for a parameter the store lacks")
            })?;
            if v.shape() != s.m.shape() {
                return Err(ElmError::tensor(
                    name,
                    format!(
                        "optimiser moment shape {:?} != parameter shape {:?}",
                        s.m.shape(),
                        v.shape()
                    ),
                ));
            }
        }
        Ok(())
    }
}
