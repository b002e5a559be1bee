//! Training utilities: the one training loop ([`run_steps`]), [`AdamW`] (decoupled weight decay with exclusions for norms/biases),
//! global-norm gradient clipping ([`ParamGrads::clip_global_norm`]), the warmup + cosine
//! [`ScheduleConfig`], and the [`ParamStore`] of named f32 tensors the tape registers each step.
//! Optimiser state and parameters save to safetensors (+ JSON), written atomically.
//!
//! One training step:
//! ```ignore
//! let mut tape = Tape::<f32>::new();
//! let vars = store.register(&mut tape);           // trainable → param, frozen → constant
//! let loss = my_forward(&mut tape, &vars)?;        // builds the graph
//! let mut grads = tape.backward(loss)?;
//! let mut grads = store.collect_grads(&vars, &mut grads)?;
//! grads.clip_global_norm(1.0)?;
//! opt.step(&mut store, &grads, schedule.lr_at(step))?;
//! ```

mod adamw;
pub mod checkpoint;
pub mod defaults;
mod executor;
mod optim;
mod params;
mod schedule;
mod seed;
mod tape_glue;

pub use adamw::{AdamW, AdamWConfig};
pub use checkpoint::{load_params_and_optimizer, save_params_and_optimizer};
pub use executor::{run_steps, Checkpointed, LoopEvent, LoopOutcome};
pub use optim::{read_config_file, OptimConfig, OPTIM_KEYS};
pub use params::{ParamGrads, ParamStore};
pub use schedule::ScheduleConfig;
pub use seed::step_seed;
pub use tape_glue::ParamVars;

/// The crate's seeded RNG constructor (every random choice in training goes through a seed).
pub fn seeded_rng(seed: u64) -> rand::rngs::StdRng {
    use rand::SeedableRng;
    rand::rngs::StdRng::seed_from_u64(seed)
}
