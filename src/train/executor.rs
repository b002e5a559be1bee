//! The one training loop (in the spirit of argmin's executor: the loop is written once, each
//! trainer only steps). Every trainer of the crate — the ELM's, LoRA's, GPPO's — runs here:
//! a fresh run first saves its starting point, then steps until its total, saving a resumable
//! checkpoint every `checkpoint_every` steps and at the end, and tells its observer of every
//! step and checkpoint.

use std::path::Path;
use std::time::Instant;

use crate::error::{ElmError, Result};

/// What the loop needs of a trainer besides its step: where it stands and how it saves.
pub trait Checkpointed {
    /// The file whose presence in a run directory means a checkpoint was committed there (the
    /// run-directory protocol's state file of this trainer).
    const STATE_FILE: &'static str;
    /// Steps completed, resumed runs included.
    fn steps_done(&self) -> usize;
    /// The step count the run trains to.
    fn steps_total(&self) -> usize;
    /// A checkpoint every this many steps (0: only at the end).
    fn checkpoint_every(&self) -> usize;
    /// Writes a resumable checkpoint of the current step into `dir`.
    fn save(&self, dir: &Path) -> Result<()>;
}

/// Implements [`Checkpointed`] for a trainer with the fields every trainer of the crate has
/// (`step`, `cfg.steps`, `cfg.checkpoint_every`) and an inherent `save(&self, dir)`, its state
/// file named by `$state_file`.
#[macro_export]
macro_rules! impl_checkpointed {
    ($ty:ty, $state_file:expr) => {
        impl $crate::train::Checkpointed for $ty {
            const STATE_FILE: &'static str = $state_file;
            fn steps_done(&self) -> usize {
                self.step
            }
            fn steps_total(&self) -> usize {
                self.cfg.steps
            }
            fn checkpoint_every(&self) -> usize {
                self.cfg.checkpoint_every
            }
            fn save(&self, dir: &std::path::Path) -> $crate::error::Result<()> {
                <$ty>::save(self, dir)
            }
        }
    };
}

/// What the loop reports to its observer.
pub enum LoopEvent<'a, L> {
    /// A step completed, with what it logged.
    Step(&'a L),
    /// A resumable checkpoint was written after `step` steps.
    Checkpoint { step: usize },
}

/// What one call of [`run_steps`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopOutcome {
    /// Steps this call took (a resumed run counts only its own).
    pub steps_this_run: usize,
    /// Wall time of those steps and of the checkpoints written.
    pub seconds: f64,
}

/// Runs `trainer` to its total with `step` (one training step on `data`, returning its log),
/// saving into `out`; training data without a usable item is refused before anything is
/// written. A fresh run (no step taken, no committed state in `out`) saves its starting point
/// first: if a later save fails (a full disk at the first checkpoint), a resume still finds a
/// run to continue instead of a directory that is neither resumable nor empty.
pub fn run_steps<T: Checkpointed, D, L>(
    trainer: &mut T,
    data: &[D],
    out: &Path,
    mut step: impl FnMut(&mut T, &[D]) -> Result<L>,
    mut on_event: impl FnMut(LoopEvent<'_, L>),
) -> Result<LoopOutcome> {
    if data.is_empty() {
        return Err(ElmError::InvalidArgument(
            "training data has no usable sequence".into(),
        ));
    }
    if trainer.steps_done() == 0 && !out.join(T::STATE_FILE).exists() {
        trainer.save(out)?;
    }
    let (start, total, every) = (
        trainer.steps_done(),
        trainer.steps_total(),
        trainer.checkpoint_every(),
    );
    let t0 = Instant::now();
    while trainer.steps_done() < total {
        let log = step(trainer, data)?;
        on_event(LoopEvent::Step(&log));
        let done = trainer.steps_done();
        if every > 0 && done.is_multiple_of(every) && done < total {
            trainer.save(out)?;
            on_event(LoopEvent::Checkpoint { step: done });
        }
    }
    trainer.save(out)?;
    on_event(LoopEvent::Checkpoint {
        step: trainer.steps_done(),
    });
    Ok(LoopOutcome {
        steps_this_run: trainer.steps_done() - start,
        seconds: t0.elapsed().as_secs_f64(),
    })
}
