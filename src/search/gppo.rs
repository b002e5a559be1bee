//! GPPO: a categorical policy `softmax(θ)`, `θ ∈ R^{N−M+1}` (zeros = uniform), over the start
//! layer of the replaced window. Every step samples a start `l`, trains candidate `l` of the
//! reward model ([`super::candidate`]) one SFT step on the next batch and records the reward
//! `−CE`; once `update_every` (p) transitions are buffered, `ppo_epochs` (q) clipped-PPO epochs
//! on them with group-normalised advantages update θ, and the buffer is cleared. The chosen
//! start is `argmax θ`.
//!
//! Seeded and resumable: the batch order, the action draws and the dropout masks are pure
//! functions of `(seed, step)`; a checkpoint holds the candidates, their AdamW state, θ with its
//! Adam state, the pending buffer and the trace. Files: `step-<k>/{params,optimizer}.safetensors`,
//! then `gppo_state.json` (the commit point).

use std::path::Path;

use rand::{rngs::StdRng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::data::{batch_indices, TokenSequence};
use crate::error::{ElmError, Result};
use crate::io::run_dir::{begin_step, commit_step, read_state};
use crate::io::write_json_atomic;
use crate::model::{ModelConfig, ModelWeights};
use crate::train::step_seed;
use crate::train::{load_params_and_optimizer, save_params_and_optimizer, ScheduleConfig};
use crate::train::{read_config_file, run_steps, AdamWConfig, LoopEvent};

use super::candidate::{CandidateConfig, CandidateStep, Candidates, TeacherBatch};
use super::policy::{log_softmax, sample, softmax, PolicyState, Transition};

/// `elm search --method gppo` settings (reference: p = 10, q = 2, ε = 0.5, no entropy term).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GppoConfig {
    pub candidate: CandidateConfig,
    /// Reward-model steps (one sampled candidate each).
    pub steps: usize,
    /// p: a policy update after every p transitions.
    #[serde(default = "d_p")]
    pub update_every: usize,
    /// q: PPO epochs per update.
    #[serde(default = "d_q")]
    pub ppo_epochs: usize,
    /// PPO clip ε.
    #[serde(default = "d_eps")]
    pub clip_eps: f64,
    /// Entropy bonus β (0 = none, as the reference).
    #[serde(default)]
    pub entropy_coef: f64,
    /// Adam learning rate of θ.
    #[serde(default = "d_policy_lr")]
    pub policy_lr: f64,
    /// The Adam rule of θ: the crate's one optimiser config. By default β1 0.9, β2 0.999, ε 1e-8
    /// and no decay (elm's choice, with `policy_lr` 0.05 held constant); the official code steps
    /// θ with `AdamW(betas=(0.9, 0.95))`, torch's default decay 0.01 and the reward model's
    /// cosine schedule from 2e-4, and a config can set those betas and that decay here. Left
    /// out of a written config while it is the default, so the settings (and stage keys) of
    /// earlier runs read the same.
    #[serde(
        default = "d_policy_optim",
        skip_serializing_if = "is_default_policy_optim"
    )]
    pub policy_optim: AdamWConfig,
    /// Resumable checkpoint every this many steps (0 = only at the end).
    #[serde(default = "d_ckpt")]
    pub checkpoint_every: usize,
}

fn d_p() -> usize {
    10
}
fn d_q() -> usize {
    2
}
fn d_eps() -> f64 {
    0.5
}
fn d_policy_optim() -> AdamWConfig {
    AdamWConfig::default()
}
fn is_default_policy_optim(c: &AdamWConfig) -> bool {
    *c == d_policy_optim()
}
fn d_policy_lr() -> f64 {
    0.05
}
fn d_ckpt() -> usize {
    20
}

impl GppoConfig {
    /// Defaults for windows of `m` layers and `steps` steps.
    pub fn new(m: usize, steps: usize) -> Self {
        serde_json::from_value(serde_json::json!({
            "candidate": { "num_replaced": m },
            "steps": steps,
        }))
        .expect("defaults deserialize")
    }
    pub fn from_file(path: &Path) -> Result<Self> {
        read_config_file(path, &["candidate"])
    }
    /// Positive steps, p and q; ε in (0, 1]; finite rates; a valid candidate config.
    pub fn validate(&self, model: &ModelConfig) -> Result<()> {
        if self.steps == 0 {
            return Err(ElmError::config("steps", "must be > 0"));
        }
        if self.update_every == 0 {
            return Err(ElmError::config(
                "update_every",
                "p must be >= 1 (a policy update after every p steps)",
            ));
        }
        if self.ppo_epochs == 0 {
            return Err(ElmError::config(
                "ppo_epochs",
                "q must be >= 1 (PPO epochs per update)",
            ));
        }
        if !(self.clip_eps > 0.0 && self.clip_eps <= 1.0) {
            return Err(ElmError::config(
                "clip_eps",
                format!("must be in (0, 1], got {}", self.clip_eps),
            ));
        }
        for (f, v) in [
            ("entropy_coef", self.entropy_coef),
            ("policy_lr", self.policy_lr),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ElmError::config(
                    f,
                    format!("must be finite and >= 0, got {v}"),
                ));
            }
        }
        self.policy_optim.validate()?;
        self.candidate.validate(model)
    }
}

/// One reward-model step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GppoStepLog {
    pub step: usize,
    pub lr: f64,
    pub action: usize,
    pub reward: f64,
    pub old_logp: f64,
    pub candidate: CandidateStep,
}

/// One policy update of the trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdate {
    /// Reward-model steps done when the update ran.
    pub step: usize,
    pub theta: Vec<f64>,
    pub probs: Vec<f64>,
    pub actions: Vec<usize>,
    pub mean_reward: f64,
    /// The PPO objective before the update.
    pub objective: f64,
}

/// `gppo_state.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GppoState {
    pub format: String,
    pub step: usize,
    pub config: GppoConfig,
    pub model_config: ModelConfig,
    pub base_model: String,
    pub step_dir: String,
    pub policy: PolicyState,
    pub buffer: Vec<Transition>,
    pub trace: Vec<PolicyUpdate>,
    pub history: Vec<GppoStepLog>,
}

pub const GPPO_FORMAT: &str = "elm-gppo-v1";

crate::impl_run_state!(GppoState, format: GPPO_FORMAT, model: ModelConfig);
crate::impl_checkpointed!(Gppo<'_>, GPPO_STATE_FILE);
pub const GPPO_STATE_FILE: &str = "gppo_state.json";

/// What a GPPO run found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GppoOutcome {
    pub num_replaced: usize,
    pub steps: usize,
    /// Steps and wall time of this invocation of [`Gppo::run`] (0 in the `gppo_trace.json`
    /// that checkpoints write; the run's own report has them).
    pub steps_this_run: usize,
    pub seconds: f64,
    /// `argmax θ` (first on ties).
    pub chosen_start: usize,
    pub theta: Vec<f64>,
    pub probs: Vec<f64>,
    /// How often each start was sampled.
    pub action_counts: Vec<usize>,
    /// Mean reward (−CE) per start over the samples it got (`None`: never sampled).
    pub mean_reward: Vec<Option<f64>>,
    pub trace: Vec<PolicyUpdate>,
}

/// What [`Gppo::run`] reports as it goes.
#[derive(Clone, Debug)]
pub enum GppoEvent<'a> {
    Step(&'a GppoStepLog),
    Update(&'a PolicyUpdate),
    Checkpoint { step: usize },
}

/// A GPPO run in progress.
pub struct Gppo<'a> {
    pub cands: Candidates<'a>,
    pub cfg: GppoConfig,
    base_model: String,
    sched: ScheduleConfig,
    pub policy: PolicyState,
    pub buffer: Vec<Transition>,
    pub trace: Vec<PolicyUpdate>,
    pub history: Vec<GppoStepLog>,
    pub step: usize,
}

impl<'a> Gppo<'a> {
    /// A fresh run: θ = 0, one candidate per start `0..=N−M`.
    pub fn new(dense: &'a ModelWeights, cfg: GppoConfig, base_model: String) -> Result<Self> {
        cfg.validate(&dense.config)?;
        let k = cfg.candidate.num_starts(&dense.config);
        let starts: Vec<usize> = (0..k).collect();
        let cands = Candidates::new(dense, cfg.candidate.clone(), &starts)?;
        Self::build(
            cands,
            cfg,
            base_model,
            PolicyState::uniform(k),
            vec![],
            vec![],
            vec![],
            0,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        cands: Candidates<'a>,
        cfg: GppoConfig,
        base_model: String,
        policy: PolicyState,
        buffer: Vec<Transition>,
        trace: Vec<PolicyUpdate>,
        history: Vec<GppoStepLog>,
        step: usize,
    ) -> Result<Self> {
        let c = &cfg.candidate;
        let sched = c.optim.schedule(cfg.steps)?;
        Ok(Gppo {
            cands,
            cfg,
            base_model,
            sched,
            policy,
            buffer,
            trace,
            history,
            step,
        })
    }

    /// One step: sample a start, train that candidate on batch `self.step`, buffer the
    /// transition; a PPO update when p transitions are buffered.
    pub fn train_step(
        &mut self,
        data: &[TokenSequence],
        pad_id: u32,
    ) -> Result<(GppoStepLog, Option<PolicyUpdate>)> {
        let c = &self.cfg.candidate;
        let mut rng = StdRng::seed_from_u64(step_seed(c.seed ^ 0x6770_706F, self.step));
        let action = sample(&self.policy.theta, &mut rng);
        let old_logp = log_softmax(&self.policy.theta)[action];
        let idx = batch_indices(data.len(), c.batch_size, self.step, c.seed);
        let seqs: Vec<&TokenSequence> = idx.iter().map(|&i| &data[i]).collect();
        let teacher = TeacherBatch::new(
            self.cands.dense,
            &seqs,
            pad_id,
            Some(action + c.num_replaced),
        )?;
        let lr = self.sched.lr_at(self.step);
        let cs = self.cands.train_step(action, &teacher, lr, &mut rng)?;
        let reward = -cs.ce;
        self.buffer.push(Transition {
            action,
            reward,
            old_logp,
        });
        let log = GppoStepLog {
            step: self.step,
            lr,
            action,
            reward,
            old_logp,
            candidate: cs,
        };
        self.step += 1;
        self.history.push(log.clone());
        let mut update = None;
        if self.buffer.len() >= self.cfg.update_every {
            let objective = self.policy.ppo_update(
                &self.buffer,
                self.cfg.ppo_epochs,
                self.cfg.clip_eps,
                self.cfg.entropy_coef,
                &self.cfg.policy_optim,
                self.cfg.policy_lr,
            )?;
            let u = PolicyUpdate {
                step: self.step,
                theta: self.policy.theta.clone(),
                probs: softmax(&self.policy.theta),
                actions: self.buffer.iter().map(|t| t.action).collect(),
                mean_reward: self.buffer.iter().map(|t| t.reward).sum::<f64>()
                    / self.buffer.len() as f64,
                objective,
            };
            self.buffer.clear();
            self.trace.push(u.clone());
            update = Some(u);
        }
        Ok((log, update))
    }

    /// Runs to `cfg.steps`, checkpointing into `out`.
    pub fn run(
        &mut self,
        data: &[TokenSequence],
        pad_id: u32,
        out: &Path,
        mut on_event: impl FnMut(GppoEvent<'_>),
    ) -> Result<GppoOutcome> {
        let looped = run_steps(
            self,
            data,
            out,
            |t, data| t.train_step(data, pad_id),
            |e| match e {
                LoopEvent::Step((log, update)) => {
                    on_event(GppoEvent::Step(log));
                    if let Some(u) = update {
                        on_event(GppoEvent::Update(u));
                    }
                }
                LoopEvent::Checkpoint { step } => on_event(GppoEvent::Checkpoint { step }),
            },
        )?;
        let mut out = self.outcome();
        out.steps_this_run = looped.steps_this_run;
        out.seconds = looped.seconds;
        Ok(out)
    }

    /// The current result (argmax θ, softmax θ, sample counts, the trace).
    pub fn outcome(&self) -> GppoOutcome {
        let k = self.policy.theta.len();
        let mut counts = vec![0usize; k];
        let mut sums = vec![0.0f64; k];
        for h in &self.history {
            counts[h.action] += 1;
            sums[h.action] += h.reward;
        }
        let chosen = crate::compress::metrics::argmax(&self.policy.theta).unwrap_or(0);
        GppoOutcome {
            num_replaced: self.cfg.candidate.num_replaced,
            steps: self.step,
            steps_this_run: 0,
            seconds: 0.0,
            chosen_start: chosen,
            theta: self.policy.theta.clone(),
            probs: softmax(&self.policy.theta),
            mean_reward: counts
                .iter()
                .zip(&sums)
                .map(|(&c, &s)| (c > 0).then(|| s / c as f64))
                .collect(),
            action_counts: counts,
            trace: self.trace.clone(),
        }
    }

    /// Writes a resumable checkpoint into `dir` (and `gppo_trace.json`).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let step = begin_step(dir, self.step)?;
        save_params_and_optimizer(&step.path, &self.cands.store, &self.cands.opt)?;
        let state = GppoState {
            format: GPPO_FORMAT.into(),
            step: self.step,
            config: self.cfg.clone(),
            model_config: self.cands.dense.config.clone(),
            base_model: self.base_model.clone(),
            step_dir: step.name.clone(),
            policy: self.policy.clone(),
            buffer: self.buffer.clone(),
            trace: self.trace.clone(),
            history: self.history.clone(),
        };
        commit_step(dir, &step, GPPO_STATE_FILE, &state)?;
        write_json_atomic(&dir.join("gppo_trace.json"), &self.outcome())
    }

    /// Resumes from `dir/gppo_state.json` with the run's own config.
    pub fn resume(dense: &'a ModelWeights, dir: &Path) -> Result<Self> {
        let (state, sd): (GppoState, _) = read_state(dir, GPPO_STATE_FILE, &dense.config)?;
        let sp = dir.join(GPPO_STATE_FILE);
        state.config.validate(&dense.config)?;
        let k = state.config.candidate.num_starts(&dense.config);
        let fresh = Candidates::new(
            dense,
            state.config.candidate.clone(),
            &(0..k).collect::<Vec<_>>(),
        )?;
        if state.policy.theta.len() != k {
            return Err(ElmError::format(&sp, "θ has the wrong length"));
        }
        let (store, opt) =
            load_params_and_optimizer(&sd, fresh.store.names(), "candidate parameter")?;
        let cands = Candidates::with_state(dense, state.config.candidate.clone(), store, opt)?;
        Self::build(
            cands,
            state.config,
            state.base_model,
            state.policy,
            state.buffer,
            state.trace,
            state.history,
            state.step,
        )
    }
}
