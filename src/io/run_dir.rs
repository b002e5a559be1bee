//! The one protocol of a resumable run directory, shared by `elm train`, `elm lora`, GPPO, the
//! enumeration and paper_repro's stages:
//!
//! - **one writer**: [`RunDir::open`] takes the directory's lock ([`DirLock`]) for the
//!   command's whole life;
//! - **fresh, resume or restart**: a fresh run refuses a non-empty directory unless forced; a
//!   resumed run continues from its committed state file; a resumed run that never committed a
//!   checkpoint (a disk full from the start) is started again from the request the fresh run
//!   saved ([`RunRequest`]), since nothing of it was trained;
//! - **atomic step commits**: a checkpoint's tensors go into a new `step-<k>` directory whose
//!   entry (and the run directory's own, in its parent) is fsynced before the state file —
//!   written atomically, the commit point — names it ([`begin_step`], [`commit_step`]); older
//!   step directories are removed only after that;
//! - **stale temporaries**: whatever a killed writer left half-written is removed when the
//!   directory is opened again ([`remove_stale_temps`]).
//!
//! Each trainer supplies only its state (a [`RunState`]); each command's prologue is one
//! [`RunDir::open`] call.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::atomic::{remove_old_step_dirs, remove_stale_temps, sync_dir, write_json_atomic};
use super::dir_lock::DirLock;
use super::json::read_json;
use crate::error::{ElmError, Result};
use crate::limits::check_output_dir;

/// File of a resumable run's request: what a fresh run was asked to do, written before its
/// first checkpoint.
pub const RUN_REQUEST_FILE: &str = "run_request.json";

/// How a command opens its run directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// A new run: the directory must be absent or empty, unless `force`.
    Fresh { force: bool },
    /// Continue the run saved in the directory (`--resume`).
    Resume,
    /// A directory whose earlier contents the command reuses or adds to (paper_repro's
    /// content-addressed results, `search --method report`): locked, never refused.
    Reuse,
}

impl OpenMode {
    /// `--resume` / `--force` as the command line gives them.
    pub fn from_flags(resume: bool, force: bool) -> Self {
        if resume {
            OpenMode::Resume
        } else {
            OpenMode::Fresh { force }
        }
    }
}

/// What kind of run a directory holds: the command that writes it, its state file (the commit
/// point), what the command calls one run (for messages: "run", "search", "enumeration") and
/// the model it runs on (a saved request for another model is refused).
///
/// A command that must load its model only once it holds the directory (so that a second
/// writer is refused before any work) calls [`RunDir::lock`], loads, then [`RunDir::start`];
/// [`RunDir::open`] is the two in one.
#[derive(Clone, Copy, Debug)]
pub struct RunKind<'a, M> {
    pub command: &'a str,
    pub state_file: &'a str,
    pub what: &'a str,
    pub model: &'a M,
}

/// How [`RunDir::open`] found the directory.
#[derive(Debug)]
pub enum RunStart<R> {
    /// A new run.
    Fresh,
    /// `--resume` with a committed state file: the trainer resumes from it.
    Resume,
    /// `--resume` of a run that committed no checkpoint: its saved request, to start it again
    /// exactly as asked. `note` says so (the command shows it).
    Restart { request: R, note: String },
}

/// A locked run directory (see the module doc). Dropping it releases the lock.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    mode: OpenMode,
    lock: Option<DirLock>,
}

impl RunDir {
    /// The prologue of every resumable command: the lock (held by `holder`, usually the command
    /// line), then fresh / resume / restart-from-request as `mode` and the directory say. A
    /// path that exists but is not a directory is refused naming it, before anything is locked.
    pub fn open<R, M>(
        path: &Path,
        mode: OpenMode,
        kind: &RunKind<'_, M>,
        holder: &str,
    ) -> Result<(RunDir, RunStart<R>)>
    where
        R: DeserializeOwned,
        M: Serialize + DeserializeOwned + PartialEq,
    {
        let run = RunDir::lock(path, mode, holder)?;
        let start = run.start(kind)?;
        Ok((run, start))
    }

    /// How the locked directory starts (see [`RunDir::open`]): fresh, resume from the state
    /// file, or restart from the saved request.
    pub fn start<R, M>(&self, kind: &RunKind<'_, M>) -> Result<RunStart<R>>
    where
        R: DeserializeOwned,
        M: Serialize + DeserializeOwned + PartialEq,
    {
        let path = &self.path;
        Ok(match self.mode {
            OpenMode::Fresh { .. } | OpenMode::Reuse => RunStart::Fresh,
            OpenMode::Resume => {
                // A resumed trainer removes the temporaries of a killed run itself
                // (`read_state`); a restart removes them below.
                if path.join(kind.state_file).exists() {
                    RunStart::Resume
                } else {
                    let request =
                        read_run_request(path, kind.command, kind.model)?.ok_or_else(|| {
                            ElmError::config(
                                "resume",
                                format!(
                                    "no {} or {RUN_REQUEST_FILE} in {}: the {} saved nothing, \
                                     not even its request, so there is nothing to resume; start \
                                     it again (with --force if the directory holds other files)",
                                    kind.state_file,
                                    path.display(),
                                    kind.what
                                ),
                            )
                        })?;
                    // Temporaries of a killed run were never renamed into place: nothing
                    // refers to them.
                    remove_stale_temps(path)?;
                    let note = format!(
                        "{}: no checkpoint was completed; starting the {} again as it was requested",
                        path.display(),
                        kind.what
                    );
                    RunStart::Restart { request, note }
                }
            }
        })
    }

    /// The lock and the fresh-run check alone, for a command that writes a directory it never
    /// resumes (`compress`, `prune`, `import`: [`OpenMode::Fresh`]) or reuses on its own terms
    /// ([`OpenMode::Reuse`]: paper_repro's study, whose stages are content-addressed).
    pub fn lock(path: &Path, mode: OpenMode, holder: &str) -> Result<RunDir> {
        // Nothing to lock, and nothing to resume: `start` then says what is missing.
        let missing =
            std::fs::metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        if mode == OpenMode::Resume && missing {
            return Ok(RunDir {
                path: path.to_path_buf(),
                mode,
                lock: None,
            });
        }
        // A file where the directory belongs is refused naming it before anything is locked
        // (`force: true` waives only the non-empty check, which comes under the lock).
        check_output_dir("out", path, true)?;
        let lock = DirLock::acquire(path, holder)?;
        match mode {
            OpenMode::Fresh { force } => {
                // A new run never silently replaces an existing one (or any other files).
                check_output_dir("out", path, force)?;
                remove_stale_temps(path)?;
            }
            OpenMode::Reuse => {
                remove_stale_temps(path)?;
            }
            // `start` (or the resumed trainer) removes them once it knows there is a run.
            OpenMode::Resume => {}
        }
        Ok(RunDir {
            path: path.to_path_buf(),
            mode,
            lock: Some(lock),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// "took over the lock of process …" when the previous holder died without releasing it.
    pub fn takeover_note(&self) -> Option<String> {
        self.lock.as_ref().and_then(DirLock::takeover_note)
    }

    /// Writes a fresh run's request, once the run has passed every check and before its first
    /// checkpoint, so that a run stopped before that checkpoint can be started again as asked.
    pub fn write_request<M: Serialize, T: Serialize>(
        &self,
        command: &str,
        model: &M,
        request: &T,
    ) -> Result<()> {
        write_run_request(&self.path, command, model, request)
    }
}

/// A fresh run's request (see [`RunDir::open`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest<M, T> {
    /// The command that wrote it (`train`, `lora`, `gppo`, `enumerate`).
    pub command: String,
    /// The model the run was started on.
    pub model_config: M,
    /// The command's settings as the fresh run resolved them.
    pub request: T,
    /// The process-wide settings its numbers depend on (absent in requests written before
    /// they were recorded).
    #[serde(default)]
    pub compute: Option<ComputeSettings>,
}

/// The environment variables that override a process-wide choice of the products: recorded in
/// every run request, so that a run's numbers can be traced to the kernels that made them.
pub const COMPUTE_OVERRIDES: [&str; 5] = [
    "ELM_GEMM",
    "ELM_QKERNEL",
    "ELM_HUGE_PAGES",
    "ELM_KEEP_HEAP",
    "OPENBLAS_NUM_THREADS",
];

/// What the large products of a run were computed with: the precision (`--precision`), the
/// f32 kernel this machine chose, and the overrides in its environment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeSettings {
    pub precision: crate::gemm::Precision,
    /// The kernel large f32 products run ([`crate::gemm::detected_kernel`]).
    pub gemm_kernel: String,
    /// `NAME=value` of each of [`COMPUTE_OVERRIDES`] set in the environment.
    pub overrides: Vec<String>,
}

impl ComputeSettings {
    /// This process's settings now.
    pub fn current() -> Self {
        ComputeSettings {
            precision: crate::gemm::precision(),
            gemm_kernel: crate::gemm::detected_kernel().name().to_string(),
            overrides: COMPUTE_OVERRIDES
                .iter()
                .filter_map(|name| std::env::var(name).ok().map(|v| format!("{name}={v}")))
                .collect(),
        }
    }
}

/// Writes `request` of `command` into run directory `dir` (atomically).
pub fn write_run_request<M: Serialize, T: Serialize>(
    dir: &Path,
    command: &str,
    model_config: &M,
    request: &T,
) -> Result<()> {
    let r = RunRequest {
        command: command.to_string(),
        model_config,
        request,
        compute: Some(ComputeSettings::current()),
    };
    write_json_atomic(&dir.join(RUN_REQUEST_FILE), &r)
}

/// The request of `command` saved in `dir`, `None` when there is none; one written by another
/// command or for another model is refused naming the file.
pub fn read_run_request<T: DeserializeOwned>(
    dir: &Path,
    command: &str,
    model_config: &(impl DeserializeOwned + PartialEq),
) -> Result<Option<T>> {
    read_request_for(dir, command, model_config)
}

/// [`read_run_request`] with the model type named (the public function takes it as `impl`, so
/// that callers name only the request type).
fn read_request_for<T: DeserializeOwned, M: DeserializeOwned + PartialEq>(
    dir: &Path,
    command: &str,
    model_config: &M,
) -> Result<Option<T>> {
    let path = dir.join(RUN_REQUEST_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let r: RunRequest<M, T> = read_json(&path)?;
    if r.command != command {
        return Err(ElmError::format(
            &path,
            format!("a request of `{}`, not `{command}`", r.command),
        ));
    }
    if &r.model_config != model_config {
        return Err(ElmError::config(
            "model",
            format!(
                "{}: the run was started on a different model",
                path.display()
            ),
        ));
    }
    Ok(Some(r.request))
}

/// The committed state of a resumable run: what a trainer writes as its state file.
pub trait RunState: DeserializeOwned {
    /// The format tag this state type writes (`elm-train-v1`, …).
    const FORMAT: &'static str;
    /// What the model must equal for the run to be resumed on it.
    type Model: PartialEq;
    fn format(&self) -> &str;
    fn model(&self) -> &Self::Model;
    /// The `step-<k>` directory holding this state's tensors.
    fn step_dir(&self) -> &str;
}

/// Implements [`RunState`] for a state struct with the fields every trainer's state has:
/// `format: String`, `model_config` (of the model type) and `step_dir: String`.
#[macro_export]
macro_rules! impl_run_state {
    ($state:ty, format: $format:expr, model: $model:ty) => {
        impl $crate::io::run_dir::RunState for $state {
            const FORMAT: &'static str = $format;
            type Model = $model;
            fn format(&self) -> &str {
                &self.format
            }
            fn model(&self) -> &$model {
                &self.model_config
            }
            fn step_dir(&self) -> &str {
                &self.step_dir
            }
        }
    };
}

/// A new checkpoint's directory, made by [`begin_step`] and named by [`commit_step`].
#[derive(Clone, Debug)]
pub struct StepDir {
    pub name: String,
    pub path: PathBuf,
}

/// Creates the step directory of `step` in run directory `dir` and makes its entry durable —
/// and the run directory's own in its parent, on the first save — before any state file can
/// name it.
pub fn begin_step(dir: &Path, step: usize) -> Result<StepDir> {
    let name = format!("step-{step:07}");
    let path = dir.join(&name);
    std::fs::create_dir_all(&path).map_err(|e| ElmError::io(&path, e))?;
    sync_dir(dir)?;
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    sync_dir(parent.unwrap_or(Path::new(".")))?;
    Ok(StepDir { name, path })
}

/// Commits a checkpoint whose tensors are in `step`: writes `state` to `dir/state_file`
/// atomically (the commit point), then removes the older step directories.
pub fn commit_step<S: Serialize>(
    dir: &Path,
    step: &StepDir,
    state_file: &str,
    state: &S,
) -> Result<()> {
    write_json_atomic(&dir.join(state_file), state)?;
    remove_old_step_dirs(dir, &step.name);
    Ok(())
}

/// Reads the committed state `dir/state_file` for a resume: stale temporaries removed first;
/// a state of another format or another model is refused naming the file. Returns the state
/// and the path of its step directory.
pub fn read_state<S: RunState>(
    dir: &Path,
    state_file: &str,
    model: &S::Model,
) -> Result<(S, PathBuf)> {
    let path = dir.join(state_file);
    remove_stale_temps(dir)?;
    let state: S = read_json(&path)?;
    if state.format() != S::FORMAT {
        return Err(ElmError::format(
            &path,
            format!("format `{}`, expected `{}`", state.format(), S::FORMAT),
        ));
    }
    if state.model() != model {
        return Err(ElmError::config(
            "model",
            format!(
                "{}: the run was trained on a different model config",
                path.display()
            ),
        ));
    }
    let step_dir = dir.join(state.step_dir());
    Ok((state, step_dir))
}
