//! Serde of [`LinearSolverConfig`]: the Krylov kinds through a tagged mirror (unknown keys
//! rejected), every other kind as the [`SolverConfig`] it is.

use serde::de::Error as _;
use serde::{Deserialize, Serialize};

use crate::config::{SolverConfig, BUILTIN_SOLVERS};
use crate::error::{Result, SolverError};
use crate::linear::config::{
    unknown_kind, LinearSolverConfig, BUILTIN_LINEAR_SOLVERS, DEFAULT_GMRES_RESTART,
    DEFAULT_NEUMANN_TERMS,
};

fn default_restart() -> usize {
    DEFAULT_GMRES_RESTART
}
fn default_terms() -> usize {
    DEFAULT_NEUMANN_TERMS
}

/// `Bicgstab {}` is a struct variant so that `deny_unknown_fields` also rejects keys there.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
enum Krylov {
    Gmres {
        #[serde(default = "default_restart")]
        restart: usize,
    },
    Bicgstab {},
    Neumann {
        #[serde(default = "default_terms")]
        terms: usize,
    },
    Cgnr {},
}

impl Serialize for LinearSolverConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            LinearSolverConfig::Gmres { restart } => {
                Krylov::Gmres { restart: *restart }.serialize(s)
            }
            LinearSolverConfig::BiCgStab => Krylov::Bicgstab {}.serialize(s),
            LinearSolverConfig::Neumann { terms } => Krylov::Neumann { terms: *terms }.serialize(s),
            LinearSolverConfig::Cgnr => Krylov::Cgnr {}.serialize(s),
            LinearSolverConfig::FixedPoint(c) => c.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for LinearSolverConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        let kind = v
            .get("kind")
            .and_then(|k| k.as_str())
            .ok_or_else(|| D::Error::custom("linear solver: missing string field `kind`"))?;
        if BUILTIN_LINEAR_SOLVERS.contains(&kind) {
            return match Krylov::deserialize(v).map_err(D::Error::custom)? {
                Krylov::Gmres { restart } => Ok(LinearSolverConfig::Gmres { restart }),
                Krylov::Bicgstab {} => Ok(LinearSolverConfig::BiCgStab),
                Krylov::Neumann { terms } => Ok(LinearSolverConfig::Neumann { terms }),
                Krylov::Cgnr {} => Ok(LinearSolverConfig::Cgnr),
            };
        }
        if !BUILTIN_SOLVERS.contains(&kind) && kind != "custom" {
            return Err(D::Error::custom(unknown_kind(kind)));
        }
        SolverConfig::deserialize(v)
            .map(LinearSolverConfig::FixedPoint)
            .map_err(D::Error::custom)
    }
}

impl LinearSolverConfig {
    /// Parses and validates a JSON config (unknown keys rejected).
    pub fn from_json(text: &str) -> Result<Self> {
        let cfg: LinearSolverConfig =
            serde_json::from_str(text).map_err(|e| SolverError::Json {
                what: "linear solver config".into(),
                msg: e.to_string(),
            })?;
        cfg.validate()?;
        Ok(cfg)
    }
}
