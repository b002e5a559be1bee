//! Runs the `elm` binary. Every step is one `elm ... --json` call; its JSON object is kept
//! verbatim for `summary.json` and decoded into the library's report type its table reads, so
//! a renamed or missing key stops the run with an error naming the command and the key.

use std::path::{Path, PathBuf};
use std::process::Command;

use elm::gemm::Precision;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ReproError;

/// Fixed-point solvers compared in every section, in table order.
pub use elm::solver::BUILTIN_SOLVERS as SOLVERS;

/// One step's output: the JSON as printed (for `summary.json`) and the part a table reads.
pub struct StepOutput<T> {
    pub raw: Value,
    pub typed: T,
}

/// The `elm` command line at a fixed binary path.
pub struct ElmCli {
    bin: PathBuf,
    precision: Precision,
}

/// `elm` subcommands whose large products run a model (training, scoring, calibration,
/// generation): the ones a scale's [`Precision`] applies to. The others keep f32: `bench`
/// reports the f32 engine's speed, `spectral` takes central differences that bf16 rounding
/// would swamp, and `solve`, `study` and `sweep` are the solver tables' small problems.
const MODEL_COMMANDS: [&str; 7] = [
    "compress", "train", "lora", "eval", "search", "prune", "generate",
];

impl ElmCli {
    pub fn new(bin: PathBuf) -> Self {
        ElmCli {
            bin,
            precision: Precision::F32,
        }
    }

    /// Runs the model commands ([`MODEL_COMMANDS`]) with `--precision precision`.
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The arguments `run` passes for `args` at `precision`: the global `--precision` first
    /// where it applies.
    fn full_args(precision: Precision, args: &[String]) -> Vec<String> {
        let applies = args
            .first()
            .is_some_and(|c| MODEL_COMMANDS.contains(&c.as_str()));
        let mut full = Vec::with_capacity(args.len() + 2);
        let flag = match precision {
            Precision::F32 => None,
            Precision::Bf16 => Some("bf16"),
        };
        if let (true, Some(name)) = (applies, flag) {
            full.extend(["--precision".to_string(), name.to_string()]);
        }
        full.extend_from_slice(args);
        full
    }

    /// Runs `elm <args> --json` and decodes its one JSON object as `T`.
    pub fn run<T: DeserializeOwned>(&self, args: &[String]) -> Result<StepOutput<T>, ReproError> {
        self.run_at(self.precision, args)
    }

    /// [`ElmCli::run`] with every product in f32 whatever the run's precision (the check of
    /// what bf16 changes in a score).
    pub fn run_f32<T: DeserializeOwned>(
        &self,
        args: &[String],
    ) -> Result<StepOutput<T>, ReproError> {
        self.run_at(Precision::F32, args)
    }

    fn run_at<T: DeserializeOwned>(
        &self,
        precision: Precision,
        args: &[String],
    ) -> Result<StepOutput<T>, ReproError> {
        let args = Self::full_args(precision, args);
        let command = format!("elm {} --json", args.join(" "));
        let out = Command::new(&self.bin)
            .args(&args)
            .arg("--json")
            .output()
            .map_err(|source| ReproError::Spawn {
                bin: self.bin.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(ReproError::CommandFailed {
                command,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        decode(&command, &out.stdout)
    }
}

/// Parses `stdout` of `command` as one JSON object, then as `T`.
pub fn decode<T: DeserializeOwned>(
    command: &str,
    stdout: &[u8],
) -> Result<StepOutput<T>, ReproError> {
    let raw: Value = serde_json::from_slice(stdout).map_err(|source| ReproError::NotJson {
        command: command.to_string(),
        source,
    })?;
    let typed = T::deserialize(&raw).map_err(|source| ReproError::Schema {
        command: command.to_string(),
        source,
    })?;
    Ok(StepOutput { raw, typed })
}

/// Owned argument list from string slices.
pub fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// A path as a command-line argument.
pub fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

/// For steps whose output goes to `summary.json` only: any JSON object is accepted.
#[derive(Deserialize)]
pub struct Unread {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Needs {
        #[allow(dead_code)]
        accuracy: f64,
    }

    #[test]
    fn precision_goes_to_model_commands_only() {
        let bf16 = Precision::Bf16;
        assert_eq!(
            ElmCli::full_args(bf16, &args(&["eval", "--limit", "3"])),
            args(&["--precision", "bf16", "eval", "--limit", "3"])
        );
        assert_eq!(
            ElmCli::full_args(bf16, &args(&["spectral", "--limit", "3"])),
            args(&["spectral", "--limit", "3"])
        );
        assert_eq!(
            ElmCli::full_args(Precision::F32, &args(&["train"])),
            args(&["train"])
        );
    }

    #[test]
    fn missing_key_names_the_command_and_the_key() {
        let err = decode::<Needs>("elm eval --json", br#"{"acc": 0.5}"#)
            .err()
            .expect("a missing key must be an error")
            .to_string();
        assert!(err.contains("`elm eval --json`"), "{err}");
        assert!(err.contains("missing field `accuracy`"), "{err}");
    }

    #[test]
    fn extra_keys_are_ignored_and_raw_is_kept() {
        let step = decode::<Needs>("elm eval --json", br#"{"accuracy": 0.5, "n": 2}"#).unwrap();
        assert_eq!(step.typed.accuracy, 0.5);
        assert_eq!(step.raw["n"], 2);
    }

    #[test]
    fn non_json_output_is_an_error() {
        let err = decode::<Unread>("elm solve --json", b"converged").err();
        assert!(matches!(err, Some(ReproError::NotJson { .. })));
    }
}
