//! The one optimiser config of every trainer (the ELM, LoRA SFT, the GPPO / enumeration
//! candidates): AdamW's moments and decay, the global-norm clip and the warm-up + cosine
//! schedule, with one set of defaults, one validation and one conversion to [`AdamWConfig`] /
//! [`ScheduleConfig`]. Each trainer's config holds it under the key `optim`.

use std::path::Path;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::adamw::AdamWConfig;
use super::schedule::ScheduleConfig;
use crate::error::{ElmError, Result};
use crate::io::read_json;

/// AdamW + clip + schedule settings (paper defaults: lr 2e-4, β (0.9, 0.95), ε 1e-8, decoupled
/// weight decay 0.02 off norms and biases, clip 0.1, 10 % linear warm-up then cosine to 1 % of
/// the peak).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimConfig {
    /// Peak learning rate.
    #[serde(default = "d_lr")]
    pub lr: f32,
    #[serde(default = "d_betas")]
    pub betas: [f32; 2],
    #[serde(default = "d_eps")]
    pub eps: f32,
    /// Decoupled weight decay; not applied to norms or biases.
    #[serde(default = "d_wd")]
    pub weight_decay: f32,
    /// Global gradient-norm clip.
    #[serde(default = "d_clip")]
    pub clip: f32,
    /// Linear warm-up over this fraction of steps, then cosine decay.
    #[serde(default = "d_warmup")]
    pub warmup_frac: f32,
    /// Cosine decay ends at this fraction of the peak lr.
    #[serde(default = "d_min_lr")]
    pub min_lr_frac: f32,
}

fn d_lr() -> f32 {
    2e-4
}
fn d_betas() -> [f32; 2] {
    [0.9, 0.95]
}
fn d_eps() -> f32 {
    1e-8
}
fn d_wd() -> f32 {
    0.02
}
fn d_clip() -> f32 {
    0.1
}
fn d_warmup() -> f32 {
    0.1
}
fn d_min_lr() -> f32 {
    0.01
}

crate::default_from_empty_json!(OptimConfig);

/// The keys of [`OptimConfig`]: before it existed they stood at the top of each trainer's
/// config (and of the candidates' `candidate` object).
pub const OPTIM_KEYS: [&str; 7] = [
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "clip",
    "warmup_frac",
    "min_lr_frac",
];

impl OptimConfig {
    /// Finite non-negative rates, β in [0, 1), fractions in [0, 1]. Errors name the key as
    /// `optim.<key>`.
    pub fn validate(&self) -> Result<()> {
        for (f, v) in [
            ("optim.lr", self.lr),
            ("optim.eps", self.eps),
            ("optim.weight_decay", self.weight_decay),
            ("optim.clip", self.clip),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ElmError::config(
                    f,
                    format!("must be finite and >= 0, got {v}"),
                ));
            }
        }
        if !self.betas.iter().all(|b| (0.0..1.0).contains(b)) {
            return Err(ElmError::config("optim.betas", "each must be in [0, 1)"));
        }
        if !(0.0..=1.0).contains(&self.warmup_frac) || !(0.0..=1.0).contains(&self.min_lr_frac) {
            return Err(ElmError::config(
                "optim.warmup_frac/min_lr_frac",
                "must be in [0, 1]",
            ));
        }
        Ok(())
    }

    /// The AdamW settings (the rest of [`AdamWConfig`] at its defaults: no decay on rank-1
    /// tensors, norms and biases).
    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig {
            beta1: self.betas[0] as f64,
            beta2: self.betas[1] as f64,
            eps: self.eps as f64,
            weight_decay: self.weight_decay as f64,
            ..AdamWConfig::default()
        }
    }

    /// Warm-up + cosine over `total_steps`, checked.
    pub fn schedule(&self, total_steps: usize) -> Result<ScheduleConfig> {
        let sched = ScheduleConfig::warmup_cosine(
            self.lr as f64,
            total_steps,
            self.warmup_frac as f64,
            self.min_lr_frac as f64,
        );
        sched.validate()?;
        Ok(sched)
    }

    /// For a config whose `optim` defaults differ from [`OptimConfig::default`] (the
    /// candidates keep the official GPPO code's weight decay): `#[serde(deserialize_with)]`
    /// glue that fills the keys a file leaves out from `defaults`, not from the global ones.
    pub fn deserialize_over<'de, D: Deserializer<'de>>(
        defaults: OptimConfig,
        d: D,
    ) -> std::result::Result<OptimConfig, D::Error> {
        let given = serde_json::Map::<String, Value>::deserialize(d)?;
        let mut merged = serde_json::to_value(defaults).map_err(D::Error::custom)?;
        if let Value::Object(m) = &mut merged {
            m.extend(given);
        }
        OptimConfig::deserialize(merged).map_err(D::Error::custom)
    }
}

/// Reads a trainer's config file. A key that moved into `optim` (given where it stood before,
/// at the top of the file or of one of `sections`, such as GPPO's `candidate`) is refused
/// naming the key and its new place, before serde would call it merely unknown.
pub fn read_config_file<T: DeserializeOwned>(path: &Path, sections: &[&str]) -> Result<T> {
    let value: Value = read_json(path)?;
    let places = std::iter::once(("", Some(&value)))
        .chain(sections.iter().map(|s| (*s, value.get(s))))
        .filter_map(|(name, v)| Some((name, v?.as_object()?)));
    for (section, object) in places {
        if let Some(key) = OPTIM_KEYS.iter().find(|k| object.contains_key(**k)) {
            let (old, new) = if section.is_empty() {
                (key.to_string(), format!("optim.{key}"))
            } else {
                (format!("{section}.{key}"), format!("{section}.optim.{key}"))
            };
            return Err(ElmError::config(
                old,
                format!(
                    "the optimiser settings moved into one `optim` object: write it as `{new}`"
                ),
            )
            .in_file(path));
        }
    }
    // Read again as `T` (not converted from `value`): the reader names a wrong-typed value's key
    // from its line and column, which a `Value` no longer has.
    read_json(path)
}
