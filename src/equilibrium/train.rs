//! Training the fixed-point module: `L = λ_ce·CE + λ_distill·MSE(z*, h_{l+M})`.
//!
//! Only the module is trainable. The frozen front (layers `[0, l)`) and the distillation
//! target (dense layers `[l, l+M)`) are computed without a tape; the module's fixed point is
//! put on the tape by a [`GradientRule`] (stochastic JFB by default); when `λ_ce > 0` the
//! frozen back layers, final norm and LM head run on the tape as constants so the CE gradient
//! reaches the module through them.
//!
//! Resumability: everything random is a pure function of `(seed, step)` — the batch order
//! ([`batch_indices`]) and the gradient rule's draws (a fresh RNG seeded from
//! `(seed, step)`) — so a checkpoint only needs the parameters, the AdamW state and the step.
//! A checkpoint directory holds `step-<k>/{params,optimizer}.safetensors`, then
//! `train_state.json` (written last, atomically: the commit point), then `elm.json` +
//! `module.safetensors` (the latest module, loadable with `--elm DIR`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ndarray::{Array3, ArrayD, IxDyn};
use rand::{rngs::StdRng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::autograd::{Tape, Var};
use crate::error::{ElmError, Result};
use crate::grad::{implicit_forward_with_rng, DeqConfig, GradientRule, SpectralNorm};
use crate::model::tape::{block_forward, BlockTensors, BlockVars};
use crate::model::{ModelConfig, ModelWeights};
use crate::solver::{SolverConfig, StopCriteria};
use crate::train::{AdamW, ParamStore, ScheduleConfig};

use super::checkpoint::TensorMap;
use super::config::{DistillScale, ElmConfig, TrainConfig};
use super::infer::solve_sequences;
use super::map::ElmLayer;
use super::module::{
    save_module, ElmModule, ElmParams, ModuleMeta, HEAL_FILE, HEAL_PREFIX, MODULE_FORMAT,
};
use super::relaxed::LOOPS_PREFIX;
pub use super::teacher_cache::{TeacherCache, TeacherCacheStats};
use crate::data::{batch_indices, make_batch, Batch, TokenSequence};
use crate::io::read_json;
use crate::io::run_dir::{begin_step, commit_step, read_state};
use crate::io::write_json_atomic;
use crate::model::dense_pass::{embed, run_dense_layers};
use crate::train::{load_params_and_optimizer, save_params_and_optimizer, step_seed};
use crate::train::{run_steps, LoopEvent};

/// The module's parameters registered on `tape`, typed (store order = [`ElmParams`] order).
fn params_on_tape(cfg: &ModelConfig, elm: &ElmConfig, vars: &[Var]) -> Result<ElmParams<Var>> {
    let mut i = 0;
    ElmParams::shapes(cfg, elm).try_map(|name, _| {
        let v = vars
            .get(i)
            .copied()
            .ok_or_else(|| ElmError::tensor(name, "not registered"))?;
        i += 1;
        Ok(v)
    })
}

/// The shared block of a relaxed recursive module (a decoder block: `ElmConfig::validate`).
fn relaxed_shared_block(module: &ElmModule) -> Result<&crate::model::LayerWeights> {
    module.block.decoder().ok_or_else(|| {
        ElmError::config(
            "relaxed",
            "a relaxed recursive module needs a decoder block",
        )
    })
}

/// The training options a relaxed recursive module has no meaning for, refused by name: it is
/// a fixed stack (no iterates to correct, no fixed point to measure) whose loops are adapted,
/// not healed after.
fn refuse_with_relaxed(cfg: &TrainConfig) -> Result<()> {
    let refuse = |field: &str| {
        Err(ElmError::config(
            field,
            "not available for a relaxed recursive module (a fixed stack of adapted loops)",
        ))
    };
    if cfg.heal.is_some() {
        return refuse("heal");
    }
    if cfg.spectral_norm.is_some() {
        return refuse("spectral_norm");
    }
    if !cfg.jacobian_penalty.is_off() {
        return refuse("jacobian_penalty");
    }
    if !cfg.fixed_point_correction.is_off() {
        return refuse("fixed_point_correction");
    }
    if cfg.spectral_every > 0 {
        return refuse("spectral_every");
    }
    Ok(())
}

/// Seeds the heal's adapter init and dropout masks apart from the module's draws.
const HEAL_SEED: u64 = 0x4EA1_0000_0000_0001;

/// The layers a heal adapts: every layer after the window (an error when there is none).
fn healed_layers(elm: &ElmConfig, cfg: &ModelConfig) -> Result<std::ops::Range<usize>> {
    let r = elm.end_layer()..cfg.num_layers;
    if r.is_empty() {
        return Err(ElmError::config(
            "heal",
            format!(
                "the window ends at the last layer ({}): no layer after it to heal",
                cfg.num_layers - 1
            ),
        ));
    }
    Ok(r)
}

/// Store names of a heal's adapters, in [`crate::model::lora_adapter::insert_adapters`]' order.
fn heal_names(elm: &ElmConfig, cfg: &ModelConfig) -> Result<Vec<String>> {
    let mut names = vec![];
    for l in healed_layers(elm, cfg)? {
        for t in crate::model::lora_adapter::TARGETS {
            let (a, b) = crate::model::lora_adapter::lora_names(HEAL_PREFIX, l, t);
            names.extend([a, b]);
        }
    }
    Ok(names)
}

/// Loss terms and settings of one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepLog {
    pub step: usize,
    pub lr: f64,
    pub lambda_ce: f32,
    pub lambda_distill: f32,
    pub distill: f64,
    /// `None` while λ_ce = 0 (CE not computed).
    pub ce: Option<f64>,
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// `(gradient-free, differentiable)` iterations drawn by stochastic JFB.
    pub sampled: Option<(usize, usize)>,
    pub tokens: usize,
    /// Wall seconds of the step (0 in states written before it was recorded): summed over the
    /// history, the compute of a run across resumes.
    #[serde(default)]
    pub seconds: f64,
    /// The Jacobian regulariser's estimate of `‖∂φ/∂z‖²_F / D` (unweighted), when it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jacobian: Option<f64>,
    /// ρ(∂φ/∂z) at the fixed point of the step's batch, on the steps `spectral_every` picks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spectral_radius: Option<f64>,
}

/// `train_state.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainState {
    pub format: String,
    /// Steps completed.
    pub step: usize,
    pub train: TrainConfig,
    pub elm: ElmConfig,
    pub model_config: ModelConfig,
    pub base_model: String,
    /// Sub-directory with this step's parameters and optimiser state.
    pub step_dir: String,
    pub history: Vec<StepLog>,
}

pub const TRAIN_FORMAT: &str = "elm-train-v1";
pub const STATE_FILE: &str = "train_state.json";

crate::impl_run_state!(TrainState, format: TRAIN_FORMAT, model: ModelConfig);
crate::impl_checkpointed!(Trainer<'_>, STATE_FILE);

/// What [`Trainer::loss_and_grads`] computed besides the gradients.
struct StepTerms {
    distill: f64,
    ce: Option<f64>,
    loss: f64,
    jacobian: Option<f64>,
    sampled: Option<(usize, usize)>,
    tokens: usize,
    tape_peak_bytes: usize,
}

/// A training run in progress.
pub struct Trainer<'a> {
    dense: &'a ModelWeights,
    pub elm: ElmConfig,
    pub cfg: TrainConfig,
    base_model: String,
    store: ParamStore,
    opt: AdamW,
    sched: ScheduleConfig,
    deq: DeqConfig,
    layer: ElmLayer,
    back: Vec<BlockTensors<f32>>,
    final_norm: Arc<ArrayD<f32>>,
    lm_head: Arc<ArrayD<f32>>,
    pub step: usize,
    pub history: Vec<StepLog>,
    teacher_cache: Option<TeacherCache>,
    /// The dense model, the back layers and the head, none of which training changes: their
    /// packed forms are reused across steps.
    frozen: crate::gemm::FrozenWeights<'a>,
    /// Per store index: the power-iteration state of a spectrally normalised matrix
    /// (`cfg.spectral_norm`), `None` for everything else.
    spectral: Vec<Option<SpectralNorm>>,
}

/// Power-iteration states of a run with spectral normalisation, `step-*/spectral_norm.json`
/// (JSON: f64 vectors read back bit for bit, so a resumed run continues exactly).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpectralState {
    /// Parameter name → `(u, v, target)` (the target differs per matrix when `relative`).
    vectors: std::collections::BTreeMap<String, (Vec<f64>, Vec<f64>, f64)>,
}

const SPECTRAL_FILE: &str = "spectral_norm.json";

/// What [`Trainer::run`] reports as it goes.
#[derive(Clone, Debug)]
pub enum TrainEvent<'a> {
    /// Held-out distillation MSE before the first step of this run.
    EvalBefore(f64),
    /// A step finished.
    Step(&'a StepLog),
    /// A resumable checkpoint was written after `step` steps.
    Checkpoint { step: usize },
    /// Held-out distillation MSE after the last step.
    EvalAfter(f64),
}

/// Held-out data and solver of [`Trainer::run`]'s before/after distillation evaluation.
pub struct HeldOut<'d> {
    pub sequences: &'d [TokenSequence],
    pub solver: SolverConfig,
    pub stop: StopCriteria,
}

impl<'d> HeldOut<'d> {
    /// `sequences` solved by Anderson to relative residual 1e-3, at most 16 iterations.
    pub fn new(sequences: &'d [TokenSequence]) -> Self {
        HeldOut {
            sequences,
            solver: SolverConfig::anderson(),
            stop: StopCriteria::relative(1e-3, 16),
        }
    }
}

/// What a [`Trainer::run`] did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainOutcome {
    /// Steps completed in total (resumed runs included).
    pub steps: usize,
    pub steps_this_run: usize,
    /// Wall time of this run's steps and checkpoints (evaluation excluded).
    pub seconds: f64,
    /// Wall time of every step of the run, this process's and those of the runs it resumed
    /// (the steps' recorded seconds; steps a killed run lost after its last checkpoint are not
    /// counted, their redoing is).
    pub seconds_all_runs: f64,
    /// Training tokens (valid, non-padding) of every step of the run, resumed runs included.
    pub tokens: usize,
    /// Training sequences.
    pub sequences: usize,
    pub distill_before: Option<f64>,
    pub distill_after: Option<f64>,
    pub held_out_examples: usize,
    pub last: Option<StepLog>,
    /// The run's first step, and its first with a cross-entropy term (λ_ce starts at 0): the
    /// losses a collapsing recipe shows from the start.
    #[serde(default)]
    pub first: Option<StepLog>,
    #[serde(default)]
    pub first_with_ce: Option<StepLog>,
    /// RMS of the teacher's hidden states entering and leaving the window over the held-out
    /// problems' valid tokens: the scale an unnormalised distillation MSE carries.
    #[serde(default)]
    pub window_rms: Option<WindowRms>,
}

/// RMS over valid tokens and channels of the dense model's hidden state entering the replaced
/// window (`h_l`) and leaving it (`h_{l+M}`, the distillation target).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowRms {
    pub entering: f64,
    pub leaving: f64,
}

impl<'a> Trainer<'a> {
    /// A fresh run from an initial module.
    pub fn new(
        dense: &'a ModelWeights,
        elm: ElmConfig,
        module: &ElmModule,
        cfg: TrainConfig,
        base_model: String,
    ) -> Result<Self> {
        let mut store = ParamStore::new();
        for (name, value) in module.params(&dense.config).named() {
            store.insert(name, value.to_owned(), true)?;
        }
        // A relaxed recursive module's loop adapters after the module's parameters
        // (`params_on_tape` reads those by position), from the paper's SVD init.
        if elm.is_relaxed() {
            let shared = relaxed_shared_block(module)?;
            let mut init = super::relaxed::svd_init(dense, &elm, shared)?;
            // In `loop_shapes` order: what `resume` expects the saved store to hold.
            for (name, _) in super::relaxed::loop_shapes(&dense.config, &elm)? {
                let value = init
                    .remove(&name)
                    .ok_or_else(|| ElmError::tensor(&name, "missing from the SVD init"))?;
                store.insert(name, value, true)?;
            }
        }
        // The heal's adapters after the module's parameters (`params_on_tape` reads those by
        // position), B = 0: the healed model starts as the unhealed one.
        if let Some(spec) = &cfg.heal {
            spec.validate(&dense.config)
                .map_err(|e| ElmError::config("heal", e.to_string()))?;
            crate::model::lora_adapter::insert_adapters(
                &mut store,
                &dense.config,
                spec,
                HEAL_PREFIX,
                healed_layers(&elm, &dense.config)?,
                cfg.seed ^ HEAL_SEED,
            )?;
        }
        let opt = AdamW::new(cfg.optim.adamw())?;
        Self::build(dense, elm, cfg, base_model, store, opt, 0, vec![])
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        dense: &'a ModelWeights,
        elm: ElmConfig,
        cfg: TrainConfig,
        base_model: String,
        store: ParamStore,
        opt: AdamW,
        step: usize,
        history: Vec<StepLog>,
    ) -> Result<Self> {
        cfg.validate()?;
        elm.validate(&dense.config)?;
        if elm.is_relaxed() {
            refuse_with_relaxed(&cfg)?;
        }
        if let Some(spec) = &cfg.heal {
            spec.validate(&dense.config)
                .map_err(|e| ElmError::config("heal", e.to_string()))?;
            healed_layers(&elm, &dense.config)?;
        }
        let sched = cfg.optim.schedule(cfg.steps)?;
        let deq = match elm.fixed_iterations {
            // Exactly K applications: the only faithful gradient is through all of them.
            Some(k) => {
                let rule = GradientRule::Unroll { k };
                if cfg.deq.as_ref().is_some_and(|d| d.gradient != rule) {
                    return Err(ElmError::config(
                        "deq",
                        format!(
                            "the module applies its block exactly {k} times (fixed_iterations) and trains by unrolling them: drop `deq` or use {{\"kind\": \"unroll\", \"k\": {k}}}"
                        ),
                    ));
                }
                DeqConfig::new(rule)
            }
            None => cfg.deq(elm.num_replaced),
        };
        deq.validate()?;
        let mc = &dense.config;
        let spectral = match &cfg.spectral_norm {
            None => vec![None; store.len()],
            Some(sn) => (0..store.len())
                .map(|i| {
                    let w = store.value(i);
                    // The matrices that act on the state z: not the heal's adapters, and not
                    // the injection's W_h (it maps h, so it does not bear on contraction).
                    let name = store.name(i);
                    if name.starts_with(HEAL_PREFIX) || name == "p.w_h" || w.ndim() != 2 {
                        return Ok(None);
                    }
                    let state = SpectralNorm::warm_start(w, sn, cfg.seed ^ i as u64)?;
                    Ok(Some(state))
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let back: Vec<BlockTensors<f32>> = (elm.end_layer()..mc.num_layers)
            .map(|l| BlockTensors::from_weights(&dense.layers[l], mc))
            .collect();
        let lm_head = Arc::new(dense.lm_head().clone().into_dyn());
        let mut frozen = dense.frozen();
        frozen.share(&lm_head);
        for bt in &back {
            bt.map(|_, w| {
                frozen.share(w);
            });
        }
        Ok(Trainer {
            dense,
            frozen,
            layer: ElmLayer::new(mc, &elm),
            back,
            final_norm: Arc::new(dense.final_norm.clone().into_dyn()),
            lm_head,
            elm,
            cfg,
            base_model,
            store,
            opt,
            sched,
            deq,
            step,
            history,
            teacher_cache: None,
            spectral,
        })
    }

    /// Reads and writes the teacher's states of every batch in `dir` (see [`TeacherCache`]).
    pub fn set_teacher_cache(&mut self, dir: PathBuf) -> Result<()> {
        self.teacher_cache = Some(TeacherCache::new(dir, self.dense, &self.base_model)?);
        Ok(())
    }

    /// What the teacher cache did this run, `None` without one.
    pub fn teacher_cache_stats(&self) -> Option<TeacherCacheStats> {
        self.teacher_cache.as_ref().map(|c| c.stats)
    }

    /// [`Self::dense_targets`] through the teacher cache when one is set.
    fn teacher(&mut self, batch: &Batch) -> Result<(Array3<f32>, Array3<f32>)> {
        let Some(mut cache) = self.teacher_cache.take() else {
            return self.dense_targets(batch);
        };
        let width = self.dense.config.hidden_size;
        let out = cache.states(&self.elm, batch, width, || self.dense_targets(batch));
        self.teacher_cache = Some(cache);
        out
    }

    /// The current module.
    pub fn module(&self) -> Result<ElmModule> {
        let map: TensorMap = self
            .store
            .names()
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.starts_with(HEAL_PREFIX) && !n.starts_with(LOOPS_PREFIX))
            .map(|(i, n)| {
                let w = self.store.value(i);
                let value = match &self.spectral[i] {
                    // As the next step would use it: its power iterations on the current W.
                    Some(sn) => {
                        let mut next = sn.clone();
                        next.update(w)?;
                        next.normalised_value(w)?
                    }
                    None => w.clone(),
                };
                Ok((n.clone(), value))
            })
            .collect::<Result<_>>()?;
        ElmModule::from_tensors(
            map,
            &self.dense.config,
            &self.elm,
            Path::new("<param store>"),
        )
    }

    /// The loop adapters of a relaxed recursive module as they stand (empty for another module).
    pub fn loops(&self) -> TensorMap {
        self.store
            .names()
            .iter()
            .enumerate()
            .filter(|(_, n)| n.starts_with(LOOPS_PREFIX))
            .map(|(i, n)| (n.clone(), self.store.value(i).clone()))
            .collect()
    }

    /// Replaces the loop adapters the run starts from (a relaxed checkpoint's, instead of the
    /// SVD init): every adapter, with its shape, and nothing else. Only before the first step.
    pub fn with_loops(mut self, loops: TensorMap) -> Result<Self> {
        let shapes = super::relaxed::loop_shapes(&self.dense.config, &self.elm)?;
        if self.step != 0 || loops.len() != shapes.len() {
            return Err(ElmError::InvalidArgument(format!(
                "with_loops: {} adapters for a run at step {} that has {}",
                loops.len(),
                self.step,
                shapes.len()
            )));
        }
        for (name, shape) in shapes {
            let v = loops
                .get(&name)
                .ok_or_else(|| ElmError::tensor(&name, "missing loop adapter"))?;
            if v.shape() != shape.as_slice() {
                return Err(ElmError::tensor(
                    &name,
                    format!("shape {:?}, expected {shape:?}", v.shape()),
                ));
            }
            let i = self
                .store
                .index_of(&name)
                .ok_or_else(|| ElmError::tensor(&name, "not in the run's store"))?;
            self.store.value_mut(i).assign(v);
        }
        Ok(self)
    }

    /// Loop `k`'s layer for every loop of a relaxed module: the shared block with its adapters
    /// merged (what inference runs).
    fn relaxed_layers(&self) -> Result<Vec<crate::model::LayerWeights>> {
        let module = self.module()?;
        let shared = relaxed_shared_block(&module)?;
        let loops = self.loops();
        (0..self.elm.num_replaced)
            .map(|k| super::relaxed::merged_loop(shared, &loops, &self.elm, k))
            .collect()
    }

    /// The relaxed recursive window on the tape: from `z = h` `[B, T, C]`, loop `k` applies the
    /// shared block with loop `k`'s adapters, attending as layer `l + k` does.
    fn relaxed_window(
        &self,
        tape: &mut Tape<f32>,
        params: &ElmParams<Var>,
        all: &[Option<Var>],
        h: Var,
    ) -> Result<Var> {
        use crate::model::lora_adapter::{block_lora, lora_block_forward, LoraRun};
        let relaxed =
            self.elm.relaxed.as_ref().ok_or_else(|| {
                ElmError::InvalidArgument("the module has no relaxed loops".into())
            })?;
        let shared = params.block.decoder().ok_or_else(|| {
            ElmError::config(
                "relaxed",
                "a relaxed recursive module needs a decoder block",
            )
        })?;
        let spec = super::relaxed::loop_spec(relaxed);
        let mut run = LoraRun {
            scale: spec.scale(),
            dropout: 0.0,
            rng: None,
        };
        let mut z = h;
        for k in 0..self.elm.num_replaced {
            let lora = block_lora(&self.store, all, LOOPS_PREFIX, k);
            if lora.iter().any(Option::is_none) {
                return Err(ElmError::tensor(
                    format!("{LOOPS_PREFIX}layers.{k}"),
                    "a loop adapter is missing from the run's store",
                ));
            }
            let mut block = shared.clone();
            block.spec = crate::model::tape::BlockSpec::of_layer(
                &self.dense.config,
                self.elm.start_layer + k,
            );
            z = lora_block_forward(tape, &block, &lora, z, &mut run)?;
        }
        Ok(z)
    }

    /// Dense activations entering layer l and layer l+M, `[B, T, C]` each (no tape).
    pub fn dense_targets(&self, batch: &Batch) -> Result<(Array3<f32>, Array3<f32>)> {
        let x = embed(self.dense, &batch.tokens)?;
        let h = run_dense_layers(self.dense, x, 0..self.elm.start_layer)?;
        let target = run_dense_layers(
            self.dense,
            h.clone(),
            self.elm.start_layer..self.elm.end_layer(),
        )?;
        Ok((h, target))
    }

    /// ρ(∂φ/∂z) of the current module at the fixed point of `batch`'s first sequence (its
    /// real tokens), solved to relative residual 1e-4 (see [`super::spectral`]).
    fn batch_spectral_radius(&mut self, batch: &Batch) -> Result<f64> {
        let (h, _) = self.teacher(batch)?;
        let len = batch
            .valid
            .first()
            .map_or(0, |v| v.iter().filter(|&&x| x).count());
        let h = h.slice(ndarray::s![0..1, 0..len.max(1), ..]).to_owned();
        let module = self.module()?;
        let cfg = &self.dense.config;
        let z_star = solve_sequences(
            &self.elm,
            &module,
            cfg,
            h.view(),
            &crate::solver::SolverConfig::anderson(),
            &crate::solver::StopCriteria::relative(1e-4, 50),
        )?;
        let power = super::spectral::PowerIteration::default();
        let (rho, _) =
            super::spectral::spectral_radius_at(&module, cfg, h.view(), &z_star, &power)?;
        Ok(rho)
    }

    /// One optimisation step on batch `self.step` of `data`.
    pub fn train_step(&mut self, data: &[TokenSequence], pad_id: u32) -> Result<StepLog> {
        let t0 = Instant::now();
        let idx = batch_indices(data.len(), self.cfg.batch_size, self.step, self.cfg.seed);
        let seqs: Vec<&TokenSequence> = idx.iter().map(|&i| &data[i]).collect();
        let batch = make_batch(&seqs, pad_id);
        let (h, target) = self.teacher(&batch)?;
        // This step's power iterations, on the matrices as the last update left them.
        for (i, sn) in self.spectral.iter_mut().enumerate() {
            if let Some(sn) = sn {
                sn.update(self.store.value(i))?;
            }
        }
        let lambdas = self.cfg.lambda.at(self.step, self.cfg.steps);
        let (terms, mut pg) = self.loss_and_grads(&batch, h, target, self.step, lambdas)?;
        let grad_norm = pg.clip_global_norm(self.cfg.optim.clip as f64)?;
        let lr = self.sched.lr_at(self.step);
        self.opt.step(&mut self.store, &pg, lr)?;
        let every = self.cfg.spectral_every;
        let spectral_radius = if every > 0 && self.step.is_multiple_of(every) {
            Some(self.batch_spectral_radius(&batch)?)
        } else {
            None
        };
        let log = StepLog {
            step: self.step,
            lr,
            lambda_ce: lambdas.0,
            lambda_distill: lambdas.1,
            distill: terms.distill,
            ce: terms.ce,
            loss: terms.loss,
            grad_norm,
            sampled: terms.sampled,
            tokens: terms.tokens,
            seconds: t0.elapsed().as_secs_f64(),
            jacobian: terms.jacobian,
            spectral_radius,
        };
        self.step += 1;
        self.history.push(log.clone());
        Ok(log)
    }

    /// The step's loss on a tape and the gradients of the trainable parameters (unclipped):
    /// everything of a step that does not change the run.
    fn loss_and_grads(
        &self,
        batch: &Batch,
        h: Array3<f32>,
        target: Array3<f32>,
        step: usize,
        (lambda_ce, lambda_distill): (f32, f32),
    ) -> Result<(StepTerms, crate::train::ParamGrads)> {
        let (bs, t, c) = h.dim();
        let valid: Vec<bool> = batch.valid.iter().flatten().copied().collect();
        let mut tape = Tape::<f32>::new();
        let vars = self.store.register(&mut tape);
        // Spectrally normalised matrices enter the layer as c·W/σ̂(W), differentiable in W.
        let module_vars = vars
            .vars()
            .iter()
            .zip(&self.spectral)
            .map(|(&v, sn)| match sn {
                Some(sn) => sn.normalise(&mut tape, v),
                None => Ok(v),
            })
            .collect::<Result<Vec<Var>>>()?;
        let params = params_on_tape(&self.dense.config, &self.elm, &module_vars)?;
        // The module's matrices stay fixed through this step's solve and backward (the update
        // comes after): each is packed once per step instead of once per product.
        let mut step_frozen = crate::gemm::FrozenWeights::new();
        for &v in &module_vars {
            let w = tape.shared(v);
            if w.ndim() == 2 {
                step_frozen.share(&w);
            }
        }
        // With injection the iteration starts at 0 (h enters through P); without, at h itself.
        let z0 = if self.elm.injection {
            ArrayD::<f32>::zeros(IxDyn(&[bs, t, c]))
        } else {
            h.clone().into_dyn()
        };
        let hv = tape.constant(h.into_dyn());
        // The rule's own seed drives its draws (the default rule is seeded by `cfg.seed`).
        let mut rng = StdRng::seed_from_u64(step_seed(self.deq.gradient.seed(), step));
        let (z, rep) = if self.elm.is_relaxed() {
            // A fixed stack of M loops, each with its adapters: backpropagated through all.
            let all: Vec<Option<Var>> = vars.vars().iter().map(|v| Some(*v)).collect();
            (self.relaxed_window(&mut tape, &params, &all, hv)?, None)
        } else {
            let (z, rep) = implicit_forward_with_rng(
                &mut tape,
                &self.layer,
                hv,
                &params,
                &z0,
                &self.deq,
                &mut rng,
            )?;
            (z, Some(rep))
        };
        let distill_divisor = match self.cfg.lambda.distill_scale {
            DistillScale::Absolute => 1.0,
            DistillScale::TeacherMeanSquare => {
                // `[B, T, C]` rows in the order of `valid`'s `[B][T]` flags.
                let (sum, rows) = target
                    .rows()
                    .into_iter()
                    .zip(&valid)
                    .filter(|(_, &v)| v)
                    .fold((0.0f64, 0usize), |(s, n), (row, _)| {
                        (
                            s + row.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>(),
                            n + 1,
                        )
                    });
                let ms = sum / (rows * c).max(1) as f64;
                // An all-zero target (or a batch of no real token) has no scale to divide by.
                if ms > 0.0 && ms.is_finite() {
                    ms as f32
                } else {
                    1.0
                }
            }
        };
        let tv = tape.constant(target.into_dyn());
        let mse = crate::nn::masked_mse(&mut tape, z, tv, &valid)?;
        // Logged: the last iterate's loss, comparable with or without the correction.
        let distill = tape.scalar(mse) as f64;
        let fpc = &self.cfg.fixed_point_correction;
        let mse = if fpc.is_off() {
            mse
        } else {
            // `build` refuses the correction for a relaxed module, which has no iterates.
            let iterates = rep.as_ref().map_or(&[][..], |r| &r.taped_iterates[..]);
            crate::grad::fixed_point_correction(&mut tape, iterates, fpc, |t, zi| {
                crate::nn::masked_mse(t, zi, tv, &valid)
            })?
        };
        let mut loss = tape.scale(mse, lambda_distill / distill_divisor);
        let mut jacobian = None;
        let reg = &self.cfg.jacobian_penalty;
        if !reg.is_off() {
            // At the step's state (detached): the penalty shapes θ, not the iterate.
            let zs = tape.value(z).clone();
            let pen = crate::grad::jacobian_penalty(
                &mut tape,
                &self.layer,
                &zs,
                hv,
                &params,
                reg,
                &mut rng,
            )?;
            jacobian = Some(tape.scalar(pen) as f64);
            let w = tape.scale(pen, reg.weight as f32);
            loss = tape.add(loss, w)?;
        }
        let mut ce_val = None;
        // A batch whose answers all lie past `seq_len` has nothing for the CE term: the step
        // trains on the distillation term alone (the CE of zero tokens is undefined).
        if lambda_ce > 0.0 && batch.has_targets() {
            let mut x = z;
            match &self.cfg.heal {
                None => {
                    for bt in &self.back {
                        let bv = BlockVars::register(&mut tape, bt, false);
                        x = block_forward(&mut tape, &bv, x, 0)?;
                    }
                }
                Some(spec) => {
                    use crate::model::lora_adapter::{block_lora, lora_block_forward, LoraRun};
                    let all: Vec<Option<Var>> = vars.vars().iter().map(|v| Some(*v)).collect();
                    let mut heal_rng =
                        StdRng::seed_from_u64(step_seed(self.cfg.seed ^ HEAL_SEED, step));
                    let mut run = LoraRun {
                        scale: spec.scale(),
                        dropout: spec.dropout,
                        rng: Some(&mut heal_rng),
                    };
                    for (i, bt) in self.back.iter().enumerate() {
                        let bv = BlockVars::register(&mut tape, bt, false);
                        let lora =
                            block_lora(&self.store, &all, HEAL_PREFIX, self.elm.end_layer() + i);
                        x = lora_block_forward(&mut tape, &bv, &lora, x, &mut run)?;
                    }
                }
            }
            let fnorm = tape.constant_shared(self.final_norm.clone());
            let head = tape.constant_shared(self.lm_head.clone());
            let targets: Vec<i64> = batch
                .targets
                .iter()
                .flatten()
                .map(|t| t.map_or(-1, |v| v as i64))
                .collect();
            let eps = self.dense.config.rms_norm_eps;
            // Final norm, LM head and CE at answer tokens only (the head is the largest matmul).
            let (ce, _) =
                crate::nn::supervised_cross_entropy(&mut tape, x, &targets, -1, |t, x| {
                    let n = crate::nn::rms_norm(t, x, fnorm, eps)?;
                    t.matmul_t(n, head, None)
                })?;
            ce_val = Some(tape.scalar(ce) as f64);
            let w = tape.scale(ce, lambda_ce);
            loss = tape.add(loss, w)?;
        }
        let loss_val = tape.scalar(loss) as f64;
        if !loss_val.is_finite() {
            return Err(ElmError::NonFinite(format!("training loss at step {step}")));
        }
        let mut grads = tape.backward(loss)?;
        let pg = self.store.collect_grads(&vars, &mut grads)?;
        let terms = StepTerms {
            distill,
            ce: ce_val,
            loss: loss_val,
            jacobian,
            sampled: rep.and_then(|r| r.sampled),
            tokens: valid.iter().filter(|v| **v).count(),
            tape_peak_bytes: tape.peak_bytes(),
        };
        Ok((terms, pg))
    }

    /// Distillation MSE of the module's fixed point (solved with `solver` until `stop`) vs the
    /// dense `h_{l+M}` over the valid tokens of `seqs` (evaluated `batch` sequences at a time).
    pub fn eval_distill(
        &self,
        seqs: &[TokenSequence],
        pad_id: u32,
        solver: &SolverConfig,
        stop: &StopCriteria,
    ) -> Result<f64> {
        if self.elm.is_relaxed() {
            let layers = self.relaxed_layers()?;
            return eval_distill_layers(
                self.dense,
                &self.elm,
                &layers,
                seqs,
                pad_id,
                self.cfg.batch_size,
            );
        }
        let module = self.module()?;
        eval_distill(
            self.dense,
            &self.elm,
            &module,
            seqs,
            pad_id,
            self.cfg.batch_size,
            solver,
            stop,
        )
    }

    /// Trains until `cfg.steps` (continuing a resumed run), writing a resumable checkpoint into
    /// `out` every `cfg.checkpoint_every` steps and at the end; with `held_out`, measures the
    /// distillation MSE before and after. `on_event` sees every step (progress bars, logs).
    pub fn run(
        &mut self,
        data: &[TokenSequence],
        pad_id: u32,
        out: &Path,
        held_out: Option<&HeldOut<'_>>,
        mut on_event: impl FnMut(TrainEvent<'_>),
    ) -> Result<TrainOutcome> {
        // Refused here too (run_steps refuses it as well), before the held-out evaluation.
        if data.is_empty() {
            return Err(ElmError::InvalidArgument(
                "training data has no usable sequence".into(),
            ));
        }
        let held_out = held_out.filter(|h| !h.sequences.is_empty());
        let eval = |t: &Self| -> Result<Option<f64>> {
            held_out
                .map(|h| t.eval_distill(h.sequences, pad_id, &h.solver, &h.stop))
                .transpose()
        };
        let distill_before = eval(self)?;
        if let Some(d) = distill_before {
            on_event(TrainEvent::EvalBefore(d));
        }
        let looped = run_steps(
            self,
            data,
            out,
            |t, data| t.train_step(data, pad_id),
            |e| match e {
                LoopEvent::Step(log) => on_event(TrainEvent::Step(log)),
                LoopEvent::Checkpoint { step } => on_event(TrainEvent::Checkpoint { step }),
            },
        )?;
        let seconds = looped.seconds;
        let distill_after = eval(self)?;
        if let Some(d) = distill_after {
            on_event(TrainEvent::EvalAfter(d));
        }
        let window_rms = held_out
            .map(|h| {
                window_rms(
                    self.dense,
                    &self.elm,
                    h.sequences,
                    pad_id,
                    self.cfg.batch_size,
                )
            })
            .transpose()?;
        Ok(TrainOutcome {
            steps: self.step,
            steps_this_run: looped.steps_this_run,
            seconds,
            seconds_all_runs: self.history.iter().map(|s| s.seconds).sum(),
            tokens: self.history.iter().map(|s| s.tokens).sum(),
            sequences: data.len(),
            distill_before,
            distill_after,
            held_out_examples: held_out.map_or(0, |h| h.sequences.len()),
            last: self.history.last().cloned(),
            first: self.history.first().cloned(),
            first_with_ce: self.history.iter().find(|s| s.ce.is_some()).cloned(),
            window_rms,
        })
    }

    /// Writes a resumable checkpoint into `dir` (see module doc).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let step = begin_step(dir, self.step)?;
        let sd = &step.path;
        save_params_and_optimizer(sd, &self.store, &self.opt)?;
        if self.cfg.spectral_norm.is_some() {
            let vectors = self
                .spectral
                .iter()
                .enumerate()
                .filter_map(|(i, sn)| {
                    let sn = sn.as_ref()?;
                    let (u, v) = sn.vectors();
                    let entry = (u.to_vec(), v.to_vec(), sn.target);
                    Some((self.store.name(i).to_string(), entry))
                })
                .collect();
            write_json_atomic(&sd.join(SPECTRAL_FILE), &SpectralState { vectors })?;
        }
        let state = TrainState {
            format: TRAIN_FORMAT.into(),
            step: self.step,
            train: self.cfg.clone(),
            elm: self.elm.clone(),
            model_config: self.dense.config.clone(),
            base_model: self.base_model.clone(),
            step_dir: step.name.clone(),
            history: self.history.clone(),
        };
        commit_step(dir, &step, STATE_FILE, &state)?;
        if self.cfg.heal.is_some() {
            // Before elm.json names it, so that a loadable checkpoint always has its heal.
            let heal: TensorMap = self
                .store
                .names()
                .iter()
                .enumerate()
                .filter(|(_, n)| n.starts_with(HEAL_PREFIX))
                .map(|(i, n)| (n.clone(), self.store.value(i).clone()))
                .collect();
            super::checkpoint::save_tensors(&dir.join(HEAL_FILE), &heal, None)?;
        }
        if self.elm.is_relaxed() {
            // Before elm.json names a relaxed module, so that a loadable one has its loops.
            super::relaxed::save_loops(dir, &self.loops())?;
        }
        let meta = ModuleMeta {
            format: MODULE_FORMAT.into(),
            elm: self.elm.clone(),
            model_config: self.dense.config.clone(),
            base_model: self.base_model.clone(),
            heal: self.cfg.heal.clone(),
        };
        save_module(dir, &self.module()?, &meta)
    }

    /// Resumes from `dir/train_state.json` with the run's own config (the lr schedule and
    /// the λ schedule depend on the total step count, so it cannot change on resume).
    pub fn resume(dense: &'a ModelWeights, dir: &Path) -> Result<Self> {
        let sp: PathBuf = dir.join(STATE_FILE);
        let (state, sd): (TrainState, _) = read_state(dir, STATE_FILE, &dense.config)?;
        // A hand-edited state is refused naming the file before anything is sized from it.
        state
            .train
            .validate()
            .and_then(|()| state.elm.validate(&dense.config))
            .map_err(|e| e.in_file(&sp))?;
        let mut expected: Vec<String> = ElmParams::shapes(&dense.config, &state.elm)
            .named()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        if state.elm.is_relaxed() {
            let loops = super::relaxed::loop_shapes(&dense.config, &state.elm)?;
            expected.extend(loops.into_iter().map(|(n, _)| n));
        }
        if state.train.heal.is_some() {
            expected.extend(heal_names(&state.elm, &dense.config)?);
        }
        let (store, opt) = load_params_and_optimizer(&sd, &expected, "parameter")?;
        let mut trainer = Self::build(
            dense,
            state.elm,
            state.train,
            state.base_model,
            store,
            opt,
            state.step,
            state.history,
        )?;
        if let Some(cfg) = trainer.cfg.spectral_norm.clone() {
            let path = sd.join(SPECTRAL_FILE);
            let saved: SpectralState = read_json(&path)?;
            for (i, sn) in trainer.spectral.iter_mut().enumerate() {
                let Some(sn) = sn else { continue };
                let name = trainer.store.name(i);
                let (u, v, target) = saved.vectors.get(name).ok_or_else(|| {
                    ElmError::format(&path, format!("no singular vectors for `{name}`"))
                })?;
                let (want_u, want_v) = (sn.vectors().0.len(), sn.vectors().1.len());
                if u.len() != want_u || v.len() != want_v {
                    return Err(ElmError::format(
                        &path,
                        format!(
                            "`{name}`: vectors of {} and {}, expected {want_u} and {want_v}",
                            u.len(),
                            v.len()
                        ),
                    ));
                }
                *sn = SpectralNorm::from_vectors(
                    u.clone().into(),
                    v.clone().into(),
                    *target,
                    cfg.iterations,
                )
                .map_err(|e| e.in_file(&path))?;
            }
            if saved.vectors.len() != trainer.spectral.iter().flatten().count() {
                return Err(ElmError::format(&path, "unexpected parameter names"));
            }
        }
        Ok(trainer)
    }
}

impl crate::memory::StepMemory for Trainer<'_> {
    /// With the CE term on (it needs the most): teacher, solve, tape and backward.
    fn probe_step_bytes(&self, longest: &TokenSequence, pad_id: u32) -> Result<u64> {
        let batch = make_batch(&[longest], pad_id);
        crate::memory::scaled_step_peak(self.cfg.batch_size, || {
            let (h, target) = self.dense_targets(&batch)?;
            let (terms, _) = self.loss_and_grads(&batch, h, target, self.step, (1.0, 1.0))?;
            Ok(terms.tape_peak_bytes)
        })
    }

    fn unallocated_optimizer_bytes(&self) -> u64 {
        self.opt.unallocated_state_bytes(&self.store)
    }

    fn packed_weight_bytes(&self) -> u64 {
        self.frozen.packed_bytes()
    }
}

/// One batch of `seqs` and the dense model's hidden states entering the window (`h_l`) and
/// leaving it (`h_{l+M}`, the distillation target), each `[B, T, C]`.
fn window_states(
    dense: &ModelWeights,
    elm: &ElmConfig,
    seqs: &[TokenSequence],
    pad_id: u32,
) -> Result<(Batch, Array3<f32>, Array3<f32>)> {
    let refs: Vec<&TokenSequence> = seqs.iter().collect();
    let b = make_batch(&refs, pad_id);
    let x = embed(dense, &b.tokens)?;
    let h = run_dense_layers(dense, x, 0..elm.start_layer)?;
    let target = run_dense_layers(dense, h.clone(), elm.start_layer..elm.end_layer())?;
    Ok((b, h, target))
}

/// [`WindowRms`] of the dense model over the valid tokens of `seqs`.
pub fn window_rms(
    dense: &ModelWeights,
    elm: &ElmConfig,
    seqs: &[TokenSequence],
    pad_id: u32,
    batch: usize,
) -> Result<WindowRms> {
    let (mut sum_in, mut sum_out, mut n) = (0.0f64, 0.0f64, 0usize);
    for chunk in seqs.chunks(batch.max(1)) {
        let (b, h, target) = window_states(dense, elm, chunk, pad_id)?;
        let c = h.shape()[2];
        for (bi, row) in b.valid.iter().enumerate() {
            for (ti, _) in row.iter().enumerate().filter(|(_, v)| **v) {
                for ch in 0..c {
                    sum_in += f64::from(h[[bi, ti, ch]]).powi(2);
                    sum_out += f64::from(target[[bi, ti, ch]]).powi(2);
                }
                n += c;
            }
        }
    }
    let rms = |s: f64| if n == 0 { 0.0 } else { (s / n as f64).sqrt() };
    Ok(WindowRms {
        entering: rms(sum_in),
        leaving: rms(sum_out),
    })
}

/// See [`Trainer::eval_distill`].
#[allow(clippy::too_many_arguments)] // the model, the module, the data and the solve
pub fn eval_distill(
    dense: &ModelWeights,
    elm: &ElmConfig,
    module: &ElmModule,
    seqs: &[TokenSequence],
    pad_id: u32,
    batch: usize,
    solver: &SolverConfig,
    stop: &StopCriteria,
) -> Result<f64> {
    window_distill(dense, elm, seqs, pad_id, batch, |h| {
        solve_sequences(elm, module, &dense.config, h.view(), solver, stop)
    })
}

/// [`eval_distill`] of a window run as fixed `layers` (a relaxed module's merged loops).
fn eval_distill_layers(
    dense: &ModelWeights,
    elm: &ElmConfig,
    layers: &[crate::model::LayerWeights],
    seqs: &[TokenSequence],
    pad_id: u32,
    batch: usize,
) -> Result<f64> {
    window_distill(dense, elm, seqs, pad_id, batch, |h| {
        crate::model::dense_pass::run_layers(&dense.config, layers.iter(), h)
    })
}

/// Distillation MSE over the valid tokens of `seqs` (`batch` sequences at a time) of what
/// `window` makes of the dense `h_l` against the dense `h_{l+M}`.
fn window_distill(
    dense: &ModelWeights,
    elm: &ElmConfig,
    seqs: &[TokenSequence],
    pad_id: u32,
    batch: usize,
    window: impl Fn(Array3<f32>) -> Result<Array3<f32>>,
) -> Result<f64> {
    let (mut sum, mut n) = (0.0, 0usize);
    for chunk in seqs.chunks(batch.max(1)) {
        let (b, h, target) = window_states(dense, elm, chunk, pad_id)?;
        let z = window(h)?;
        let valid: Vec<bool> = b.valid.iter().flatten().copied().collect();
        // f64 so the sum over many tokens loses nothing.
        let (mse, count) = crate::nn::loss::masked_mse_forward(
            &z.mapv(f64::from).into_dyn(),
            &target.mapv(f64::from).into_dyn(),
            &valid,
        )?;
        sum += mse * count as f64;
        n += count;
    }
    Ok(if n == 0 { 0.0 } else { sum / n as f64 })
}
