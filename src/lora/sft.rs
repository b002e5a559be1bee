//! LoRA SFT of the dense model: adapters on q, k, v, o, gate, up, down of every layer, CE on
//! the answer tokens only, AdamW with warm-up + cosine, then merged into the weights with the
//! `α/r` scaling ("tuned dense").
//!
//! Resumability follows [`crate::equilibrium::train`]: the batch order and the dropout masks are pure
//! functions of `(seed, step)`, so a checkpoint is the adapters, the AdamW state and the step.
//! A run directory holds `step-<k>/{params,optimizer}.safetensors`, then `lora_state.json`
//! (written last, atomically: the commit point).

use std::path::Path;
use std::time::Instant;

use rand::{rngs::StdRng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::autograd::{Tape, Var};
use crate::data::{batch_indices, make_batch, Batch, TokenSequence};
use crate::error::{ElmError, Result};
use crate::io::run_dir::{begin_step, commit_step, read_state};
use crate::model::tape::{ModelTensors, ModelVars, Trainable};
use crate::model::{ModelConfig, ModelWeights};
use crate::train::step_seed;
use crate::train::{
    load_params_and_optimizer, read_config_file, save_params_and_optimizer, AdamW, OptimConfig,
    ParamStore, ScheduleConfig,
};
use crate::train::{run_steps, LoopEvent};

use crate::model::lora_adapter::{
    block_lora, insert_adapters, lora_block_forward, merge_model, LoraRun, LoraSpec,
};

/// `elm lora` settings (paper: r = α = 16, dropout 0.05, lr 2e-4, AdamW (0.9, 0.95), wd 0.02,
/// clip 0.1; warm-up then cosine to 1 % of the peak).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    #[serde(default)]
    pub lora: LoraSpec,
    #[serde(default = "crate::train::defaults::steps")]
    pub steps: usize,
    #[serde(default = "d_batch")]
    pub batch_size: usize,
    /// Sequences are truncated to this many tokens.
    #[serde(default = "crate::train::defaults::seq_len")]
    pub seq_len: usize,
    /// AdamW, clip and schedule (see [`OptimConfig`]).
    #[serde(default)]
    pub optim: OptimConfig,
    /// Seeds the data order, the adapters' init and the dropout masks.
    #[serde(default)]
    pub seed: u64,
    /// Resumable checkpoint every this many steps (0 = only at the end).
    #[serde(default = "crate::train::defaults::checkpoint_every")]
    pub checkpoint_every: usize,
}

fn d_batch() -> usize {
    1
}

crate::default_from_empty_json!(LoraConfig);

impl LoraConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        read_config_file(path, &[])
    }
    /// Positive counts, finite non-negative rates, `lora` valid for `model`.
    pub fn validate(&self, model: &ModelConfig) -> Result<()> {
        for (f, v) in [
            ("steps", self.steps),
            ("batch_size", self.batch_size),
            ("seq_len", self.seq_len),
        ] {
            if v == 0 {
                return Err(ElmError::config(f, "must be > 0"));
            }
        }
        self.optim.validate()?;
        self.lora.validate(model)
    }
}

/// One step's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraStepLog {
    pub step: usize,
    pub lr: f64,
    /// Mean CE over the batch's answer tokens (0 with `tokens` 0: a batch without answer
    /// tokens, no update).
    pub ce: f64,
    pub grad_norm: f64,
    pub tokens: usize,
    /// Wall seconds of the step (0 in states written before it was recorded).
    #[serde(default)]
    pub seconds: f64,
}

/// `lora_state.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraState {
    pub format: String,
    pub step: usize,
    pub config: LoraConfig,
    pub model_config: ModelConfig,
    pub base_model: String,
    pub step_dir: String,
    pub history: Vec<LoraStepLog>,
}

pub const LORA_FORMAT: &str = "elm-lora-v1";

crate::impl_run_state!(LoraState, format: LORA_FORMAT, model: ModelConfig);
crate::impl_checkpointed!(LoraTrainer<'_>, LORA_STATE_FILE);
pub const LORA_STATE_FILE: &str = "lora_state.json";

/// What a LoRA run reports: its steps and checkpoints, as the one loop does.
pub type LoraEvent<'a> = LoopEvent<'a, LoraStepLog>;

/// A LoRA SFT run in progress.
pub struct LoraTrainer<'a> {
    dense: &'a ModelWeights,
    tensors: ModelTensors<f32>,
    /// `tensors`, which training never changes (the adapters live in `store`): their packed
    /// forms are reused across steps.
    frozen: crate::gemm::FrozenWeights<'static>,
    pub cfg: LoraConfig,
    base_model: String,
    store: ParamStore,
    opt: AdamW,
    sched: ScheduleConfig,
    pub step: usize,
    pub history: Vec<LoraStepLog>,
}

impl<'a> LoraTrainer<'a> {
    /// A fresh run: adapters on every layer (B = 0, so the model starts as `dense`).
    pub fn new(dense: &'a ModelWeights, cfg: LoraConfig, base_model: String) -> Result<Self> {
        cfg.validate(&dense.config)?;
        let mut store = ParamStore::new();
        insert_adapters(
            &mut store,
            &dense.config,
            &cfg.lora,
            "",
            0..dense.config.num_layers,
            cfg.seed,
        )?;
        let opt = AdamW::new(cfg.optim.adamw())?;
        Self::build(dense, cfg, base_model, store, opt, 0, vec![])
    }

    fn build(
        dense: &'a ModelWeights,
        cfg: LoraConfig,
        base_model: String,
        store: ParamStore,
        opt: AdamW,
        step: usize,
        history: Vec<LoraStepLog>,
    ) -> Result<Self> {
        cfg.validate(&dense.config)?;
        let sched = cfg.optim.schedule(cfg.steps)?;
        let tensors = ModelTensors::from_weights(dense)?;
        Ok(LoraTrainer {
            frozen: tensors.frozen(),
            tensors,
            dense,
            cfg,
            base_model,
            store,
            opt,
            sched,
            step,
            history,
        })
    }

    /// The adapters (names `layers.<l>.<target>.lora_{a,b}`).
    pub fn adapters(&self) -> &ParamStore {
        &self.store
    }

    /// The dense model with the current adapters merged (`W + (α/r)·B A`).
    pub fn merged(&self) -> Result<ModelWeights> {
        merge_model(self.dense, &self.store, &self.cfg.lora, "")
    }

    /// Mean answer-token CE of a padded `batch` under the current adapters, and the tape
    /// gradients when `train` (dropout on, masks from `rng`).
    fn forward(
        &self,
        tape: &mut Tape<f32>,
        batch: &Batch,
        rng: Option<&mut StdRng>,
    ) -> Result<(Var, Vec<Option<Var>>, usize)> {
        let (b, t) = (batch.tokens.len(), batch.seq_len);
        let mv = ModelVars::register(tape, &self.tensors, &Trainable::none());
        let vars = self.store.register(tape);
        let vars: Vec<Option<Var>> = vars.vars().iter().map(|v| Some(*v)).collect();
        let ids: Vec<usize> = batch.tokens.iter().flatten().map(|&x| x as usize).collect();
        let mut x = mv.embed(tape, &ids, b, t)?;
        let mut run = LoraRun {
            scale: self.cfg.lora.scale(),
            dropout: self.cfg.lora.dropout,
            rng,
        };
        for (l, bv) in mv.layers.iter().enumerate() {
            let lora = block_lora(&self.store, &vars, "", l);
            x = lora_block_forward(tape, bv, &lora, x, &mut run)?;
        }
        let targets: Vec<i64> = batch
            .targets
            .iter()
            .flatten()
            .map(|t| t.map_or(-1, |v| v as i64))
            .collect();
        // The head (final norm + LM head) runs at answer tokens only.
        let (ce, n) =
            crate::nn::supervised_cross_entropy(tape, x, &targets, -1, |t, x| mv.head(t, x))?;
        Ok((ce, vars, n))
    }

    /// The dropout masks' generator of step `self.step` (its own stream, apart from the
    /// adapters' init).
    fn dropout_rng(&self) -> StdRng {
        StdRng::seed_from_u64(step_seed(self.cfg.seed ^ 0x10AA, self.step))
    }

    /// One optimisation step on batch `self.step`.
    pub fn train_step(&mut self, data: &[TokenSequence], pad_id: u32) -> Result<LoraStepLog> {
        let t0 = Instant::now();
        let idx = batch_indices(data.len(), self.cfg.batch_size, self.step, self.cfg.seed);
        let seqs: Vec<&TokenSequence> = idx.iter().map(|&i| &data[i]).collect();
        let mut rng = self.dropout_rng();
        let batch = make_batch(&seqs, pad_id);
        // A batch whose answers all lie past `seq_len` holds nothing to fit: the step passes
        // without an update (the schedule moves on), logged with 0 tokens.
        if !batch.has_targets() {
            let log = LoraStepLog {
                step: self.step,
                lr: self.sched.lr_at(self.step),
                ce: 0.0,
                grad_norm: 0.0,
                tokens: 0,
                seconds: t0.elapsed().as_secs_f64(),
            };
            self.step += 1;
            self.history.push(log.clone());
            return Ok(log);
        }
        let mut tape = Tape::<f32>::new();
        let (ce, vars, tokens) = self.forward(&mut tape, &batch, Some(&mut rng))?;
        let ce_val = tape.scalar(ce) as f64;
        if !ce_val.is_finite() {
            return Err(ElmError::NonFinite(format!(
                "LoRA CE at step {}",
                self.step
            )));
        }
        let mut grads = tape.backward(ce)?;
        let g: Vec<_> = vars.iter().map(|v| v.and_then(|v| grads.take(v))).collect();
        let mut pg = crate::train::ParamGrads::new(g);
        let grad_norm = pg.clip_global_norm(self.cfg.optim.clip as f64)?;
        let lr = self.sched.lr_at(self.step);
        self.opt.step(&mut self.store, &pg, lr)?;
        let log = LoraStepLog {
            step: self.step,
            lr,
            ce: ce_val,
            grad_norm,
            tokens,
            seconds: t0.elapsed().as_secs_f64(),
        };
        self.step += 1;
        self.history.push(log.clone());
        Ok(log)
    }

    /// Mean answer-token CE of `seqs` (no dropout), `batch` at a time, on the tape path with
    /// the adapters unmerged (the reference the merge is checked against).
    pub fn eval_ce(&self, seqs: &[TokenSequence], pad_id: u32, batch: usize) -> Result<f64> {
        let (mut sum, mut n) = (0.0f64, 0usize);
        for chunk in seqs.chunks(batch.max(1)) {
            let refs: Vec<&TokenSequence> = chunk.iter().collect();
            let mut tape = Tape::<f32>::new();
            let batch = make_batch(&refs, pad_id);
            let r = tape.no_grad(|tape| self.forward(tape, &batch, None));
            let (ce, _, count) = r?;
            sum += tape.scalar(ce) as f64 * count as f64;
            n += count;
        }
        Ok(sum / n.max(1) as f64)
    }

    /// Trains until `cfg.steps`, checkpointing into `out` every `checkpoint_every` steps and
    /// at the end.
    pub fn run(
        &mut self,
        data: &[TokenSequence],
        pad_id: u32,
        out: &Path,
        mut on_event: impl FnMut(LoraEvent<'_>),
    ) -> Result<f64> {
        let looped = run_steps(
            self,
            data,
            out,
            |t, data| t.train_step(data, pad_id),
            &mut on_event,
        )?;
        Ok(looped.seconds)
    }

    /// Writes a resumable checkpoint into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let step = begin_step(dir, self.step)?;
        save_params_and_optimizer(&step.path, &self.store, &self.opt)?;
        let state = LoraState {
            format: LORA_FORMAT.into(),
            step: self.step,
            config: self.cfg.clone(),
            model_config: self.dense.config.clone(),
            base_model: self.base_model.clone(),
            step_dir: step.name.clone(),
            history: self.history.clone(),
        };
        commit_step(dir, &step, LORA_STATE_FILE, &state)
    }

    /// Resumes from `dir/lora_state.json` with the run's own config.
    pub fn resume(dense: &'a ModelWeights, dir: &Path) -> Result<Self> {
        let (state, sd): (LoraState, _) = read_state(dir, LORA_STATE_FILE, &dense.config)?;
        let mut fresh = ParamStore::new();
        insert_adapters(
            &mut fresh,
            &dense.config,
            &state.config.lora,
            "",
            0..dense.config.num_layers,
            0,
        )?;
        let (store, opt) = load_params_and_optimizer(&sd, fresh.names(), "LoRA parameter")?;
        Self::build(
            dense,
            state.config,
            state.base_model,
            store,
            opt,
            state.step,
            state.history,
        )
    }
}

impl crate::memory::StepMemory for LoraTrainer<'_> {
    /// Forward and backward with dropout on.
    fn probe_step_bytes(&self, longest: &TokenSequence, pad_id: u32) -> Result<u64> {
        let batch = make_batch(&[longest], pad_id);
        let mut rng = self.dropout_rng();
        crate::memory::scaled_step_peak(self.cfg.batch_size, || {
            let mut tape = Tape::<f32>::new();
            let (ce, vars, _) = self.forward(&mut tape, &batch, Some(&mut rng))?;
            let mut grads = tape.backward(ce)?;
            let g: Vec<_> = vars.iter().map(|v| v.and_then(|v| grads.take(v))).collect();
            drop(crate::train::ParamGrads::new(g));
            Ok(tape.peak_bytes())
        })
    }

    fn unallocated_optimizer_bytes(&self) -> u64 {
        self.opt.unallocated_state_bytes(&self.store)
    }

    fn packed_weight_bytes(&self) -> u64 {
        self.frozen.packed_bytes()
    }
}
