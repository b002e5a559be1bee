//! [`SolverConfig`]: which fixed-point solver, with its config (serde-(de)serialisable with the
//! `serde` feature; unknown keys are rejected at every level); [`SolverKind`], the one list of
//! the built-in solvers; and [`CustomSolver`], which lets any [`FixedPointSolver`] stand wherever
//! a config is taken.
//!
//! A new built-in solver is its own file (`<name>.rs`: its config struct, its
//! [`crate::IterationRule`] and [`crate::RuleSolver`]); here a [`SolverKind`] variant (added to
//! [`SolverKind::ALL`]) and a [`SolverConfig`] variant with their arms in the exhaustive matches
//! (the compiler lists the missing ones); and its `mod`/`pub use` lines in `lib.rs`: everything
//! else (the CLI's `--solver`, the benches, the tests, paper_repro) reads [`BUILTIN_SOLVERS`].

use std::sync::Arc;

use super::{FixedPointSolver, SolverFloat};
use crate::anderson::{Anderson, AndersonConfig};
use crate::broyden::{Broyden, BroydenConfig};
use crate::error::{Result, SolverError};
use crate::kinds::builtin_kinds;
use crate::options::{OutputOptions, StopCriteria};
use crate::picard::{Picard, PicardConfig};

builtin_kinds! {
    /// The built-in solvers: the one list that [`BUILTIN_SOLVERS`], [`SolverConfig::by_name`]
    /// and command lines read, in the order the CLI, the benches, the tests and paper_repro list
    /// them. A new built-in solver is a line here, a variant of [`SolverConfig`], and their arms
    /// in the exhaustive matches below (the compiler lists the missing ones).
    pub enum SolverKind {
        Picard => "picard",
        Anderson => "anderson",
        Broyden => "broyden",
    }
    unknown: |name: &str| {
        SolverError::config(
            "kind",
            format!(
                "unknown solver `{name}` (expected {})",
                BUILTIN_SOLVERS.join("|")
            ),
        )
    };
}

impl SolverKind {
    /// The solver with its default config.
    pub fn default_config(self) -> SolverConfig {
        match self {
            SolverKind::Picard => SolverConfig::picard(),
            SolverKind::Anderson => SolverConfig::anderson(),
            SolverKind::Broyden => SolverConfig::broyden(),
        }
    }
}

/// The built-in solvers by name ([`SolverKind::NAMES`]), in the order the CLI, the benches, the
/// tests and paper_repro list them. [`SolverConfig::by_name`] builds each one's default config.
pub const BUILTIN_SOLVERS: [&str; SolverKind::ALL.len()] = SolverKind::NAMES;

/// Any solver's config: the algorithm and what a solve reports, never when it stops (that is a
/// [`StopCriteria`] passed with each solve). JSON form `{"kind": "anderson", "history": 5}`.
/// [`SolverConfig::Custom`] carries a solver written outside this crate; it has no JSON form
/// to read (it is supplied in code) and is written as `{"kind": "custom", "name": ...}`.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)
)]
pub enum SolverConfig {
    Picard(PicardConfig),
    Anderson(AndersonConfig),
    Broyden(BroydenConfig),
    /// Any [`FixedPointSolver`] of the user's, for `f32` and `f64` states.
    Custom(CustomSolver),
}

impl Default for SolverConfig {
    fn default() -> Self {
        SolverConfig::anderson()
    }
}

impl SolverConfig {
    /// Default Picard (β = 1).
    pub fn picard() -> Self {
        SolverConfig::Picard(PicardConfig::default())
    }
    /// Default Anderson (history 5, λ = 1e-10, β = 1).
    pub fn anderson() -> Self {
        SolverConfig::Anderson(AndersonConfig::default())
    }
    /// Default Broyden (L = 10, no backtracking).
    pub fn broyden() -> Self {
        SolverConfig::Broyden(BroydenConfig::default())
    }
    /// A solver written outside this crate (see [`CustomSolver::new`]).
    pub fn custom<S>(solver: S) -> Self
    where
        S: FixedPointSolver<f32> + FixedPointSolver<f64> + Send + Sync + 'static,
    {
        SolverConfig::Custom(CustomSolver::new(solver))
    }
    /// Default config of the built-in solver `name` (one of [`BUILTIN_SOLVERS`]).
    pub fn by_name(name: &str) -> Result<Self> {
        name.parse::<SolverKind>().map(SolverKind::default_config)
    }
    /// The built-in solver; `None` for a custom one.
    pub fn kind(&self) -> Option<SolverKind> {
        match self {
            SolverConfig::Picard(_) => Some(SolverKind::Picard),
            SolverConfig::Anderson(_) => Some(SolverKind::Anderson),
            SolverConfig::Broyden(_) => Some(SolverKind::Broyden),
            SolverConfig::Custom(_) => None,
        }
    }
    /// Solver name: the built-in's, or the custom solver's own.
    pub fn name(&self) -> &'static str {
        match self {
            SolverConfig::Picard(_) => SolverKind::Picard.name(),
            SolverConfig::Anderson(_) => SolverKind::Anderson.name(),
            SolverConfig::Broyden(_) => SolverKind::Broyden.name(),
            SolverConfig::Custom(c) => c.name(),
        }
    }
    /// Checks every value range (a custom solver checks its own when it solves).
    pub fn validate(&self) -> Result<()> {
        match self {
            SolverConfig::Picard(c) => c.validate(),
            SolverConfig::Anderson(c) => c.validate(),
            SolverConfig::Broyden(c) => c.validate(),
            SolverConfig::Custom(_) => Ok(()),
        }
    }
    /// Mutable output options of a built-in solver; `None` for a custom one (its outputs are its
    /// own business).
    pub fn output_mut(&mut self) -> Option<&mut OutputOptions> {
        match self {
            SolverConfig::Picard(c) => Some(&mut c.output),
            SolverConfig::Anderson(c) => Some(&mut c.output),
            SolverConfig::Broyden(c) => Some(&mut c.output),
            SolverConfig::Custom(_) => None,
        }
    }
    /// Builder-style: replace the output options (no effect on a custom solver).
    pub fn with_output(mut self, output: OutputOptions) -> Self {
        if let Some(o) = self.output_mut() {
            *o = output;
        }
        self
    }
    /// The solver. Configs are validated when `solve` is called (invalid ones return
    /// [`SolverError::Config`] there).
    pub fn build<T: SolverFloat>(&self) -> Box<dyn FixedPointSolver<T>> {
        match self {
            SolverConfig::Picard(c) => Box::new(Picard::new(c.clone())),
            SolverConfig::Anderson(c) => Box::new(Anderson::new(c.clone())),
            SolverConfig::Broyden(c) => Box::new(Broyden::new(c.clone())),
            SolverConfig::Custom(c) => T::custom_solver(c),
        }
    }
}

#[cfg(feature = "serde")]
impl SolverConfig {
    /// Parses and validates a JSON config.
    pub fn from_json(text: &str) -> Result<Self> {
        let cfg: SolverConfig = serde_json::from_str(text).map_err(|e| SolverError::Json {
            what: "solver config".into(),
            msg: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }
    /// Builder-style: sets the field `key` of a built-in config to `value` (JSON), as in its
    /// JSON form. A key this solver does not have is refused, naming the built-in solvers that
    /// do have it; the result is validated.
    pub fn with_param(self, key: &str, value: serde_json::Value) -> Result<Self> {
        let mut json = serde_json::to_value(&self).map_err(|e| SolverError::Json {
            what: "solver config".into(),
            msg: e.to_string(),
        })?;
        let has = |j: &serde_json::Value| key != "kind" && j.get(key).is_some();
        if !has(&json) || self.kind().is_none() {
            let owners: Vec<&str> = SolverKind::ALL
                .into_iter()
                .filter(|k| serde_json::to_value(k.default_config()).is_ok_and(|j| has(&j)))
                .map(SolverKind::name)
                .collect();
            let this = self.name();
            let msg = if owners.is_empty() {
                format!("no solver has a parameter `{key}`")
            } else {
                format!(
                    "`{key}` is a parameter of {}, not of {this}",
                    owners.join(" and ")
                )
            };
            return Err(SolverError::config(key, msg));
        }
        if value.is_null() {
            // serde_json writes NaN and ±∞ as null.
            return Err(SolverError::config(key, "must be a finite number"));
        }
        let given = value.to_string();
        json[key] = value;
        // A value of the wrong type (a negative count, a string) is the parameter's fault: a
        // config error naming it, not a JSON error.
        let cfg: SolverConfig = serde_json::from_value(json)
            .map_err(|e| SolverError::config(key, format!("invalid value {given}: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }
}

/// A solver written outside this crate, for `f32` and `f64` states: it plugs in wherever a
/// [`SolverConfig`] is taken (training's forward and backward solvers, inference). Cloning
/// shares the solver. Two are equal when they are the same solver.
#[derive(Clone)]
pub struct CustomSolver {
    name: &'static str,
    f32: Arc<dyn FixedPointSolver<f32> + Send + Sync>,
    f64: Arc<dyn FixedPointSolver<f64> + Send + Sync>,
}

impl CustomSolver {
    /// Wraps `solver`, named by its [`FixedPointSolver::name`].
    pub fn new<S>(solver: S) -> Self
    where
        S: FixedPointSolver<f32> + FixedPointSolver<f64> + Send + Sync + 'static,
    {
        let shared = Arc::new(solver);
        CustomSolver {
            name: FixedPointSolver::<f32>::name(&*shared),
            f32: shared.clone(),
            f64: shared,
        }
    }
    /// The solver's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
    pub(crate) fn for_f32(&self) -> Box<dyn FixedPointSolver<f32>> {
        Box::new(Shared(self.f32.clone()))
    }
    pub(crate) fn for_f64(&self) -> Box<dyn FixedPointSolver<f64>> {
        Box::new(Shared(self.f64.clone()))
    }
}

impl PartialEq for CustomSolver {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.f64, &other.f64)
    }
}

impl std::fmt::Debug for CustomSolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CustomSolver").field(&self.name).finish()
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for CustomSolver {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("CustomSolver", 1)?;
        st.serialize_field("name", self.name)?;
        st.end()
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for CustomSolver {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Named {
            name: String,
        }
        let n = Named::deserialize(d)?;
        Err(serde::de::Error::custom(format!(
            "custom solver `{}` is supplied in code (SolverConfig::custom), it cannot be read from JSON",
            n.name
        )))
    }
}

/// A shared solver behind a `Box<dyn FixedPointSolver>`; delegates every method, `solve_in`
/// included, so the solver's own workspace reuse is kept.
struct Shared<T>(Arc<dyn FixedPointSolver<T> + Send + Sync>);

impl<T: SolverFloat> FixedPointSolver<T> for Shared<T> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn solve_observed(
        &self,
        map: &mut dyn crate::FixedPointMap<T>,
        z0: ndarray::ArrayView2<T>,
        stop: &StopCriteria,
        observer: &mut dyn crate::Observer<T>,
    ) -> Result<crate::Solution<T>> {
        self.0.solve_observed(map, z0, stop, observer)
    }
    fn solve_in(
        &self,
        ws: &mut crate::SolveWorkspace<T>,
        map: &mut dyn crate::FixedPointMap<T>,
        z0: ndarray::ArrayView2<T>,
        stop: &StopCriteria,
    ) -> Result<()> {
        self.0.solve_in(ws, map, z0, stop)
    }
}

/// A built-in solver by name with its default config ([`SolverConfig::by_name`]), so command
/// lines parse `--solver` with the crate's own rule.
impl std::str::FromStr for SolverConfig {
    type Err = SolverError;
    fn from_str(name: &str) -> Result<Self> {
        SolverConfig::by_name(name)
    }
}
