//! GPPO's reward model, also the model the enumeration trains: for each candidate start `l`,
//! an injection projection `P_l` (paper init: `W_z = 0.1·U(±1/√2C)`, `W_h = I`, `b = 0`) and a
//! LoRA on layer `l`, whose (frozen, LoRA-adapted) block is the shared fixed-point block. The
//! candidate ELM runs exactly `M` iterations from `z = 0`:
//! `z ← block_l+LoRA(W_z z + W_h h_l + b)`, trained by backprop through all of them on
//! `ce_weight·CE + distill_weight·MSE(z, h_{l+M})`.
//!
//! The teacher's hidden states (`h_0 … h_N` of the dense model) do not depend on the
//! candidate: [`TeacherBatch`] computes them once per batch and every candidate reuses them.

use std::sync::Arc;

use ndarray::{s, Array1, Array2, Array3, ArrayD, Axis, IxDyn};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::autograd::{Tape, Var};
use crate::data::{make_batch, Batch, TokenSequence};
use crate::equilibrium::module::{ElmModule, ProjectionWeights};
use crate::error::{ElmError, Result};
use crate::lora::LoraSpec;
use crate::model::dense_pass::{embed, head_logits, run_dense_layers};
use crate::model::lora_adapter::{
    block_lora, insert_adapters, lora_block_forward, merge_layer, LoraRun,
};
use crate::model::tape::{block_forward, BlockTensors, BlockVars};
use crate::model::{ModelConfig, ModelWeights};
use crate::train::{AdamW, OptimConfig, ParamGrads, ParamStore};

/// Settings of the candidate ELMs (shared by GPPO and the enumeration).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateConfig {
    /// Window length M.
    pub num_replaced: usize,
    #[serde(default)]
    pub lora: LoraSpec,
    #[serde(default = "d_batch")]
    pub batch_size: usize,
    #[serde(default = "crate::train::defaults::seq_len")]
    pub seq_len: usize,
    /// AdamW, clip and schedule (see [`OptimConfig`]); keys a file leaves out take the
    /// candidates' own defaults ([`candidate_optim`]).
    #[serde(
        default = "candidate_optim",
        deserialize_with = "deserialize_candidate_optim"
    )]
    pub optim: OptimConfig,
    #[serde(default = "one")]
    pub ce_weight: f32,
    #[serde(default = "one")]
    pub distill_weight: f32,
    /// `W_z` init scale (0.1 in the paper).
    #[serde(default = "d_wz")]
    pub wz_scale: f32,
    /// Seeds the data order, the inits and the dropout masks.
    #[serde(default)]
    pub seed: u64,
}

fn d_batch() -> usize {
    1
}
/// The shared defaults but for the weight decay: the official GPPO code builds its AdamW
/// without a `weight_decay` argument, so PyTorch's default 0.01 applies there.
pub fn candidate_optim() -> OptimConfig {
    OptimConfig {
        weight_decay: 0.01,
        ..OptimConfig::default()
    }
}

fn deserialize_candidate_optim<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<OptimConfig, D::Error> {
    OptimConfig::deserialize_over(candidate_optim(), d)
}

fn one() -> f32 {
    1.0
}
fn d_wz() -> f32 {
    0.1
}

impl CandidateConfig {
    /// Paper defaults for windows of `m` layers.
    pub fn new(m: usize) -> Self {
        serde_json::from_value(serde_json::json!({ "num_replaced": m }))
            .expect("defaults deserialize")
    }

    /// `1 ≤ M < N`, positive sizes, finite rates, a LoRA that fits the layers.
    pub fn validate(&self, model: &ModelConfig) -> Result<()> {
        let n = model.num_layers;
        if self.num_replaced == 0 || self.num_replaced >= n {
            return Err(ElmError::config(
                "num_replaced",
                format!(
                    "window of M = {} layers in a model of {n} layers (need 1 <= M < {n})",
                    self.num_replaced
                ),
            ));
        }
        for (f, v) in [("batch_size", self.batch_size), ("seq_len", self.seq_len)] {
            if v == 0 {
                return Err(ElmError::config(f, "must be > 0"));
            }
        }
        for (f, v) in [
            ("ce_weight", self.ce_weight),
            ("distill_weight", self.distill_weight),
            ("wz_scale", self.wz_scale),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ElmError::config(
                    f,
                    format!("must be finite and >= 0, got {v}"),
                ));
            }
        }
        self.optim.validate()?;
        self.lora.validate(model)
    }

    /// Number of candidate starts `N − M + 1`.
    pub fn num_starts(&self, model: &ModelConfig) -> usize {
        model.num_layers + 1 - self.num_replaced
    }
}

/// A padded batch and the dense model's residual stream on it: `states[i]` = input of layer
/// `i` (`h_0` = embeddings, `h_N` = last layer's output), each `[B, T, C]`.
#[derive(Clone, Debug)]
pub struct TeacherBatch {
    pub batch: Batch,
    pub states: Vec<Array3<f32>>,
}

impl TeacherBatch {
    /// Runs the dense model once over `seqs` (no tape), keeping every boundary up to `upto`
    /// (inclusive; `None` = all `N + 1`).
    pub fn new(
        dense: &ModelWeights,
        seqs: &[&TokenSequence],
        pad_id: u32,
        upto: Option<usize>,
    ) -> Result<Self> {
        let batch = make_batch(seqs, pad_id);
        let n = dense.config.num_layers;
        let upto = upto.unwrap_or(n).min(n);
        let mut x = embed(dense, &batch.tokens)?;
        let mut states = Vec::with_capacity(upto + 1);
        states.push(x.clone());
        for l in 0..upto {
            x = run_dense_layers(dense, x, l..l + 1)?;
            states.push(x.clone());
        }
        Ok(TeacherBatch { batch, states })
    }

    fn valid(&self) -> Vec<bool> {
        self.batch.valid.iter().flatten().copied().collect()
    }

    fn targets(&self) -> Vec<i64> {
        self.batch
            .targets
            .iter()
            .flatten()
            .map(|t| t.map_or(-1, |v| v as i64))
            .collect()
    }
}

/// Losses of one candidate step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateStep {
    pub start: usize,
    pub ce: f64,
    pub distill: f64,
    pub loss: f64,
    pub grad_norm: f64,
}

/// The candidates' trainable parameters (projections and LoRAs) and their optimiser.
pub struct Candidates<'a> {
    pub dense: &'a ModelWeights,
    pub cfg: CandidateConfig,
    blocks: Vec<BlockTensors<f32>>,
    final_norm: Arc<ArrayD<f32>>,
    lm_head: Arc<ArrayD<f32>>,
    pub store: ParamStore,
    pub opt: AdamW,
}

/// Store names of candidate `l`'s projection.
pub fn projection_names(l: usize) -> [String; 3] {
    [
        format!("adaptor.{l}.w_z"),
        format!("adaptor.{l}.w_h"),
        format!("adaptor.{l}.bias"),
    ]
}

impl<'a> Candidates<'a> {
    /// Fresh parameters for candidate starts `starts` (each `< N − M + 1`).
    pub fn new(dense: &'a ModelWeights, cfg: CandidateConfig, starts: &[usize]) -> Result<Self> {
        cfg.validate(&dense.config)?;
        let k = cfg.num_starts(&dense.config);
        let c = dense.config.hidden_size;
        let mut store = ParamStore::new();
        for &l in starts {
            if l >= k {
                return Err(ElmError::config(
                    "start",
                    format!(
                        "start layer {l} + M = {} exceeds the model's {} layers",
                        l + cfg.num_replaced,
                        dense.config.num_layers
                    ),
                ));
            }
            let bound = 1.0 / ((2 * c) as f32).sqrt();
            let mut rng = StdRng::seed_from_u64(cfg.seed ^ (l as u64).wrapping_mul(0xA5A5_1234));
            let wz = ArrayD::from_shape_simple_fn(IxDyn(&[c, c]), || {
                cfg.wz_scale * rng.gen_range(-bound..bound)
            });
            let [nz, nh, nb] = projection_names(l);
            store.insert(nz, wz, true)?;
            store.insert(nh, Array2::<f32>::eye(c).into_dyn(), true)?;
            store.insert(nb, ArrayD::zeros(IxDyn(&[c])), true)?;
            insert_adapters(&mut store, &dense.config, &cfg.lora, "", [l], cfg.seed)?;
        }
        let opt = AdamW::new(cfg.optim.adamw())?;
        Self::with_state(dense, cfg, store, opt)
    }

    /// Candidates from saved parameters and optimiser state.
    pub fn with_state(
        dense: &'a ModelWeights,
        cfg: CandidateConfig,
        store: ParamStore,
        opt: AdamW,
    ) -> Result<Self> {
        cfg.validate(&dense.config)?;
        let mc = &dense.config;
        Ok(Candidates {
            blocks: dense
                .layers
                .iter()
                .map(|l| BlockTensors::from_weights(l, mc))
                .collect(),
            final_norm: Arc::new(dense.final_norm.clone().into_dyn()),
            lm_head: Arc::new(dense.lm_head().clone().into_dyn()),
            dense,
            cfg,
            store,
            opt,
        })
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.store
            .index_of(name)
            .ok_or_else(|| ElmError::tensor(name, "no such candidate parameter"))
    }

    /// One SFT step of candidate `l` on `teacher` with learning rate `lr`; `rng` draws the
    /// LoRA dropout masks.
    pub fn train_step(
        &mut self,
        l: usize,
        teacher: &TeacherBatch,
        lr: f64,
        rng: &mut StdRng,
    ) -> Result<CandidateStep> {
        let m = self.cfg.num_replaced;
        let n = self.dense.config.num_layers;
        if l + m > n || teacher.states.len() <= l + m {
            return Err(ElmError::InvalidArgument(format!(
                "candidate {l}: teacher states stop at boundary {} (need {})",
                teacher.states.len().saturating_sub(1),
                l + m
            )));
        }
        let [nz, nh, nb] = projection_names(l);
        let (iz, ih, ib) = (self.index(&nz)?, self.index(&nh)?, self.index(&nb)?);
        let mut tape = Tape::<f32>::new();
        let mut vars: Vec<Option<Var>> = vec![None; self.store.len()];
        let prefix = format!("layers.{l}.");
        for (i, v) in vars.iter_mut().enumerate() {
            let name = self.store.name(i);
            if i == iz || i == ih || i == ib || name.starts_with(&prefix) {
                *v = Some(tape.param(self.store.value(i).clone()));
            }
        }
        let (wz, wh, bias) = (vars[iz].unwrap(), vars[ih].unwrap(), vars[ib].unwrap());
        let lora = block_lora(&self.store, &vars, "", l);
        let block = BlockVars::register(&mut tape, &self.blocks[l], false);
        let h = tape.constant(teacher.states[l].clone().into_dyn());
        let mut run = LoraRun {
            scale: self.cfg.lora.scale(),
            dropout: self.cfg.lora.dropout,
            rng: Some(rng),
        };
        let inj = tape.matmul_t(h, wh, Some(bias))?;
        let mut z: Option<Var> = None;
        for _ in 0..m {
            // z⁰ = 0: the first iteration's W_z·z term is zero (and so is its gradient).
            let u = match z {
                Some(z) => {
                    let a = tape.matmul_t(z, wz, None)?;
                    tape.add(a, inj)?
                }
                None => inj,
            };
            z = Some(lora_block_forward(&mut tape, &block, &lora, u, &mut run)?);
        }
        let z = z.expect("M >= 1");
        let valid = teacher.valid();
        let target = tape.constant(teacher.states[l + m].clone().into_dyn());
        let mse = crate::nn::masked_mse(&mut tape, z, target, &valid)?;
        let targets = teacher.targets();
        // A batch whose answers all lie past `seq_len` trains on the distillation term alone
        // (CE logged as 0: the CE of zero tokens is undefined).
        let (ce_term, ce_v) = if targets.iter().any(|&t| t != -1) {
            let mut x = z;
            for bt in &self.blocks[l + m..] {
                let bv = BlockVars::register(&mut tape, bt, false);
                x = block_forward(&mut tape, &bv, x, 0)?;
            }
            let fnorm = tape.constant_shared(self.final_norm.clone());
            let head = tape.constant_shared(self.lm_head.clone());
            let eps = self.dense.config.rms_norm_eps;
            // Final norm, LM head and CE at answer tokens only.
            let (ce, _) =
                crate::nn::supervised_cross_entropy(&mut tape, x, &targets, -1, |t, x| {
                    let nx = crate::nn::rms_norm(t, x, fnorm, eps)?;
                    t.matmul_t(nx, head, None)
                })?;
            let ce_v = tape.scalar(ce) as f64;
            (Some(tape.scale(ce, self.cfg.ce_weight)), ce_v)
        } else {
            (None, 0.0)
        };
        let mse_v = tape.scalar(mse) as f64;
        let b = tape.scale(mse, self.cfg.distill_weight);
        let loss = match ce_term {
            Some(a) => tape.add(a, b)?,
            None => b,
        };
        let loss_v = tape.scalar(loss) as f64;
        if !loss_v.is_finite() {
            return Err(ElmError::NonFinite(format!("candidate {l} loss")));
        }
        let mut grads = tape.backward(loss)?;
        let g: Vec<_> = vars.iter().map(|v| v.and_then(|v| grads.take(v))).collect();
        let mut pg = ParamGrads::new(g);
        let grad_norm = pg.clip_global_norm(self.cfg.optim.clip as f64)?;
        self.opt.step(&mut self.store, &pg, lr)?;
        Ok(CandidateStep {
            start: l,
            ce: ce_v,
            distill: mse_v,
            loss: loss_v,
            grad_norm,
        })
    }

    /// Candidate `l` as an ELM module (LoRA merged into layer `l` with `α/r`, projection `P_l`);
    /// run with `fixed_iterations = M` it is the model [`Self::train_step`] trains.
    pub fn module(&self, l: usize) -> Result<ElmModule> {
        let [nz, nh, nb] = projection_names(l);
        let two = |n: &str| -> Result<Array2<f32>> {
            self.store
                .value(self.index(n)?)
                .clone()
                .into_dimensionality()
                .map_err(|e| ElmError::tensor(n, e.to_string()))
        };
        let bias: Array1<f32> = self
            .store
            .value(self.index(&nb)?)
            .clone()
            .into_dimensionality()
            .map_err(|e| ElmError::tensor(&nb, e.to_string()))?;
        Ok(ElmModule {
            block: crate::equilibrium::ModuleBlock::Decoder(merge_layer(
                &self.dense.layers[l],
                &self.store,
                &self.cfg.lora,
                "",
                l,
            )?),
            projection: Some(ProjectionWeights {
                w_z: two(&nz)?,
                w_h: two(&nh)?,
                bias,
            }),
        })
    }

    /// Summed answer NLL (nats) and scored-token count of candidate `l` (no tape, no dropout,
    /// the merged module, exactly M iterations from 0) on held-out teacher batches.
    pub fn heldout_nll(&self, l: usize, held: &[TeacherBatch]) -> Result<(f64, usize)> {
        Ok(self
            .heldout_nll_rows(l, held)?
            .into_iter()
            .fold((0.0, 0), |(s, c), (rs, rc)| (s + rs, c + rc)))
    }

    /// [`Candidates::heldout_nll`] per held-out sequence (batch by batch, row by row): what an
    /// interval over problems resamples.
    pub fn heldout_nll_rows(&self, l: usize, held: &[TeacherBatch]) -> Result<Vec<(f64, usize)>> {
        let module = self.module(l)?;
        let m = self.cfg.num_replaced;
        let cfg = &self.dense.config;
        let mut rows = vec![];
        for tb in held {
            let h = tb.states.get(l).ok_or_else(|| {
                ElmError::InvalidArgument(format!("held-out states stop before layer {l}"))
            })?;
            let mut z = Array3::<f32>::zeros(h.dim());
            for _ in 0..m {
                z = module.apply(cfg, z.view(), h.view())?;
            }
            let out = run_dense_layers(self.dense, z, l + m..cfg.num_layers)?;
            rows.extend(answer_nll_rows(self.dense, &out, &tb.batch)?);
        }
        Ok(rows)
    }
}

/// Summed NLL (nats, f64) and count of `batch`'s CE targets given the last layer's output
/// `hidden [B, T, C]` (final norm + LM head at the scored positions only).
pub fn answer_nll_of_hidden(
    weights: &ModelWeights,
    hidden: &Array3<f32>,
    batch: &Batch,
) -> Result<(f64, usize)> {
    Ok(answer_nll_rows(weights, hidden, batch)?
        .into_iter()
        .fold((0.0, 0), |(s, c), (rs, rc)| (s + rs, c + rc)))
}

/// [`answer_nll_of_hidden`] per row of the batch (`(0, 0)` for a row with no target).
pub fn answer_nll_rows(
    weights: &ModelWeights,
    hidden: &Array3<f32>,
    batch: &Batch,
) -> Result<Vec<(f64, usize)>> {
    let (b, t, c) = hidden.dim();
    if batch.targets.len() != b || batch.seq_len != t {
        return Err(ElmError::shape(
            "answer_nll_of_hidden",
            format!(
                "hidden {:?} vs batch {}x{}",
                hidden.dim(),
                batch.targets.len(),
                batch.seq_len
            ),
        ));
    }
    let mut out = Vec::with_capacity(b);
    for (r, tg) in batch.targets.iter().enumerate() {
        let pos: Vec<usize> = (0..t).filter(|&p| tg[p].is_some()).collect();
        if pos.is_empty() {
            out.push((0.0, 0));
            continue;
        }
        let mut rows = Array2::<f32>::zeros((pos.len(), c));
        for (k, &p) in pos.iter().enumerate() {
            rows.row_mut(k).assign(&hidden.slice(s![r, p, ..]));
        }
        let logits = head_logits(weights, rows.view());
        let mut sum = 0.0;
        for (k, row) in logits.axis_iter(Axis(0)).enumerate() {
            let target = tg[pos[k]].expect("scored position");
            sum += crate::eval::nll::token_nll(row, target);
        }
        out.push((sum, pos.len()));
    }
    Ok(out)
}
