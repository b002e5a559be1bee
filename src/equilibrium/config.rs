//! Typed configs of the ELM method (serde, unknown keys rejected).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};
use crate::model::ModelConfig;
use crate::train::{read_config_file, OptimConfig};

/// Which layers are replaced and how the module is initialised.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElmConfig {
    /// First replaced layer `l`.
    pub start_layer: usize,
    /// Number of replaced layers `M`: layers `[l, l+M)` become one fixed-point module.
    pub num_replaced: usize,
    /// Seed of `W_z`'s random init.
    #[serde(default)]
    pub init_seed: u64,
    /// `W_z = wz_scale × (default nn.Linear init)`; 0.1 in the paper.
    #[serde(default = "default_wz_scale")]
    pub wz_scale: f32,
    /// Input injection `u = W_z·z + W_h·h + b` iterated from `z⁰ = 0` (the ELM); `false`: no
    /// projection, `u = z` iterated from `z⁰ = h` (the no-injection ablation, a looped layer,
    /// LLM-Streamline's replacement layer with one iteration).
    #[serde(default = "yes")]
    pub injection: bool,
    /// `Some(K)`: exactly `K` applications of the block, at training (unrolled) and inference
    /// (no solver, no tolerance) — the fixed-unroll ablation and the looped/Streamline
    /// baselines; `None`: solved to tolerance (the ELM).
    #[serde(default)]
    pub fixed_iterations: Option<usize>,
    /// The module's block: a decoder block (the ELM, default) or a feed-forward-only block
    /// (LLM-Streamline's FFN replacement). Left out of `elm.json` when it is the default, so
    /// the files of decoder modules are as before.
    #[serde(default, skip_serializing_if = "BlockKind::is_decoder")]
    pub block: BlockKind,
    /// Relaxed Recursive Transformers (Bae et al., ICLR 2025): the shared block gets one LoRA
    /// per loop, so loop `k` runs `W + B_k A_k` on each of the block's seven linear maps. It
    /// needs `fixed_iterations = Some(M)` (loop `k` is initialised from replaced layer `l + k`),
    /// no injection and a decoder block. Absent from `elm.json` when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relaxed: Option<RelaxedLoops>,
}

/// The per-loop LoRA of a relaxed recursive module (see [`ElmConfig::relaxed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaxedLoops {
    /// Rank `r` of every loop's adapters (the paper's scaling α = r: `W + B A` unscaled).
    pub rank: usize,
}

/// The kind of block a module weight-ties.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockKind {
    /// Attention + SwiGLU MLP, initialised from the first replaced layer.
    #[default]
    Decoder,
    /// `x + MLP(RMSNorm(x))` only, initialised from the first replaced layer's MLP half; it
    /// needs no KV cache.
    Ffn,
}

impl BlockKind {
    pub fn is_decoder(&self) -> bool {
        *self == BlockKind::Decoder
    }
    /// Whether the block attends (and so keeps a KV cache).
    pub fn has_attention(&self) -> bool {
        self.is_decoder()
    }
}

impl std::str::FromStr for BlockKind {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "decoder" => Ok(BlockKind::Decoder),
            "ffn" => Ok(BlockKind::Ffn),
            other => Err(ElmError::config(
                "block",
                format!("unknown block kind `{other}` (expected decoder or ffn)"),
            )),
        }
    }
}

fn yes() -> bool {
    true
}

fn default_wz_scale() -> f32 {
    0.1
}

impl ElmConfig {
    pub fn new(start_layer: usize, num_replaced: usize) -> Self {
        ElmConfig {
            start_layer,
            num_replaced,
            init_seed: 0,
            wz_scale: default_wz_scale(),
            injection: true,
            fixed_iterations: None,
            block: BlockKind::Decoder,
            relaxed: None,
        }
    }
    /// One past the last replaced layer: `l + M` (saturating: [`ElmConfig::validate`] refuses
    /// configs where it overflows, before any layer is indexed).
    pub fn end_layer(&self) -> usize {
        self.start_layer.saturating_add(self.num_replaced)
    }
    /// Indices of the dense layers an ELM of layout `elm` keeps (every layer without one), in
    /// the order they run, for a model of `num_layers` layers.
    pub fn kept_layers(elm: Option<&ElmConfig>, num_layers: usize) -> Vec<usize> {
        match elm {
            None => (0..num_layers).collect(),
            Some(e) => (0..e.start_layer)
                .chain(e.end_layer()..num_layers)
                .collect(),
        }
    }
    /// Checks `1 <= M` and `l + M <= N` (without overflow), and that the block kind exists for
    /// the model's family.
    pub fn validate(&self, model: &ModelConfig) -> Result<()> {
        if model.has_gemma_norms() && self.block == BlockKind::Ffn {
            return Err(ElmError::Unsupported(
                "an FFN-only module block on a Gemma 3 model: its MLP half needs the post-MLP \
                 norm, which the feed-forward-only block does not carry; use `block: decoder`"
                    .into(),
            ));
        }
        if self.num_replaced == 0 {
            return Err(ElmError::config("num_replaced", "must be >= 1"));
        }
        let end = crate::limits::checked_add("start_layer", self.start_layer, self.num_replaced)?;
        if end > model.num_layers {
            return Err(ElmError::config(
                "start_layer",
                format!(
                    "layers [{}, {}) exceed the model's {} layers",
                    self.start_layer,
                    self.end_layer(),
                    model.num_layers
                ),
            ));
        }
        if !self.wz_scale.is_finite() {
            return Err(ElmError::config("wz_scale", "must be finite"));
        }
        if let Some(k) = self.fixed_iterations {
            crate::limits::check_max_iter("fixed_iterations", k)?;
        }
        if let Some(relaxed) = &self.relaxed {
            // Loop k starts from layer l + k: one loop per replaced layer, nothing injected.
            if self.fixed_iterations != Some(self.num_replaced) {
                return Err(ElmError::config(
                    "relaxed",
                    format!(
                        "a relaxed recursive module loops once per replaced layer: needs \
                         fixed_iterations = {} (M), got {:?}",
                        self.num_replaced, self.fixed_iterations
                    ),
                ));
            }
            if self.injection {
                return Err(ElmError::config(
                    "relaxed",
                    "a relaxed recursive module has no input injection: set injection = false",
                ));
            }
            if self.block != BlockKind::Decoder {
                return Err(ElmError::config(
                    "relaxed",
                    "a relaxed recursive module adapts a decoder block's seven linear maps: \
                     use block = decoder",
                ));
            }
            crate::model::lora_adapter::LoraSpec {
                rank: relaxed.rank,
                alpha: relaxed.rank as f32,
                dropout: 0.0,
            }
            .validate(model)
            .map_err(|e| ElmError::config("relaxed.rank", e.to_string()))?;
        }
        Ok(())
    }

    /// Whether the module is a relaxed recursive one (per-loop adapters).
    pub fn is_relaxed(&self) -> bool {
        self.relaxed.is_some()
    }
}

/// What the distillation MSE is measured against before λ_distill weighs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DistillScale {
    /// The plain MSE `mean((z* − h_{l+M})²)`: the paper's loss.
    #[default]
    Absolute,
    /// The MSE divided by the teacher's mean square `mean(h_{l+M}²)` over the batch's real
    /// tokens (a relative error, about 1 for a module that outputs zeros). Why: the residual
    /// stream's scale differs by orders of magnitude between families (Gemma 3 multiplies the
    /// embedding by √C: its MSE starts near 5e4, where SmolLM2's ends near 15), and an absolute
    /// MSE that large drowns the CE term (≈ 2–7) that λ_ce ramps in.
    TeacherMeanSquare,
}

impl DistillScale {
    pub fn is_absolute(&self) -> bool {
        *self == DistillScale::Absolute
    }
}

/// How the CE weight λ_ce and distillation weight λ_distill evolve with training progress.
///
/// λ_ce = 0 while `progress < ce_start`, then `ce_max · sin(π/2 · (p − ce_start)/(ce_end − ce_start))`
/// up to `ce_end`, then `ce_max`. λ_distill is constant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LambdaSchedule {
    #[serde(default = "one")]
    pub distill: f32,
    /// What the distillation MSE is divided by (absent from the serialised config while
    /// absolute, so existing runs keep their keys).
    #[serde(default, skip_serializing_if = "DistillScale::is_absolute")]
    pub distill_scale: DistillScale,
    #[serde(default = "one")]
    pub ce_max: f32,
    /// Fraction of training at which the CE ramp starts (paper: 0.5).
    #[serde(default = "half")]
    pub ce_start: f32,
    /// Fraction of training at which the CE ramp reaches `ce_max`.
    #[serde(default = "one")]
    pub ce_end: f32,
}

fn one() -> f32 {
    1.0
}
fn half() -> f32 {
    0.5
}

impl Default for LambdaSchedule {
    fn default() -> Self {
        LambdaSchedule {
            distill: 1.0,
            distill_scale: DistillScale::Absolute,
            ce_max: 1.0,
            ce_start: 0.5,
            ce_end: 1.0,
        }
    }
}

impl LambdaSchedule {
    /// `(λ_ce, λ_distill)` at `step` of `total` steps (progress = step / total).
    pub fn at(&self, step: usize, total: usize) -> (f32, f32) {
        let p = if total == 0 {
            1.0
        } else {
            step as f32 / total as f32
        };
        let ce = if p < self.ce_start {
            0.0
        } else if p >= self.ce_end || self.ce_end <= self.ce_start {
            self.ce_max
        } else {
            let x = (p - self.ce_start) / (self.ce_end - self.ce_start);
            self.ce_max * (std::f32::consts::FRAC_PI_2 * x).sin()
        };
        (ce, self.distill)
    }
}

/// Largest `steps` a training config accepts.
pub const MAX_TRAIN_STEPS: usize = 100_000_000;

/// Optimisation settings of `elm train` (paper defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
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
    #[serde(default)]
    pub lambda: LambdaSchedule,
    /// Gradient rule, forward solver and its stopping; `None` = [`TrainConfig::deq`]'s default:
    /// stochastic JFB with the paper's ranges for this M (no-grad iterations U[0, M/2], grad
    /// iterations U[1, M/2], seeded by `seed`), forward solver Anderson with relative tolerance
    /// 1e-4 and at most 30 iterations (for the `jfb`/`implicit` rules).
    #[serde(default)]
    pub deq: Option<crate::grad::DeqConfig>,
    /// Seeds the data order (and the default rule's draws).
    #[serde(default)]
    pub seed: u64,
    /// Write a resumable checkpoint every this many steps (0 = only at the end).
    #[serde(default = "crate::train::defaults::checkpoint_every")]
    pub checkpoint_every: usize,
    /// Hutchinson Jacobian regulariser `weight · ‖∂φ/∂z‖²_F / D` at the step's state (off by
    /// default; absent from the serialised config while off, so existing runs keep their keys).
    #[serde(default, skip_serializing_if = "crate::grad::JacobianPenalty::is_off")]
    pub jacobian_penalty: crate::grad::JacobianPenalty,
    /// Fixed-point correction: the distillation loss on every taped iterate, weighted
    /// `γ^(n−1−i)` (off by default; absent from the serialised config while off).
    #[serde(
        default,
        skip_serializing_if = "crate::grad::FixedPointCorrection::is_off"
    )]
    pub fixed_point_correction: crate::grad::FixedPointCorrection,
    /// Log ρ(∂φ/∂z) at the fixed point of the step's batch every this many steps (0 = never;
    /// a solve and 30 Jacobian-vector products, see [`super::spectral`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spectral_every: usize,
    /// ELM + heal: LoRA adapters on every kept layer after the window (all linear maps of
    /// each block), trained jointly with the module by the CE term, saved beside the module
    /// and merged into those layers when the checkpoint is loaded. The layers before the
    /// window stay as they are: they produce the module's input and the distillation targets
    /// (and the teacher cache). Absent (off) by default and from the serialised config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heal: Option<crate::model::lora_adapter::LoraSpec>,
    /// Spectral normalisation of every matrix of the module that acts on the state (all but
    /// the injection's `W_h`; `W → c·W/σ̂(W)`, power iteration
    /// kept across steps and checkpoints): the module trains and is saved with normalised
    /// matrices. Absent (off) by default and from the serialised config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spectral_norm: Option<crate::grad::SpectralNormConfig>,
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}

fn d_batch() -> usize {
    4
}

crate::default_from_empty_json!(TrainConfig);

impl TrainConfig {
    /// The run's [`DeqConfig`](crate::grad::DeqConfig): `deq` when given, else the paper's
    /// default for a module replacing `num_replaced` layers (see the field).
    pub fn deq(&self, num_replaced: usize) -> crate::grad::DeqConfig {
        self.deq.clone().unwrap_or_else(|| {
            crate::grad::DeqConfig::new(crate::grad::GradientRule::sjfb_default(
                num_replaced,
                self.seed,
            ))
            .with_forward(
                crate::solver::SolverConfig::anderson(),
                crate::solver::StopCriteria::relative(1e-4, 30),
            )
        })
    }
    /// Reads a JSON config file; unknown keys are an error naming the file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let cfg: Self = read_config_file(path, &[])?;
        cfg.validate().map_err(|e| e.in_file(path))?;
        Ok(cfg)
    }
    pub fn validate(&self) -> Result<()> {
        let pos = [
            ("steps", self.steps),
            ("batch_size", self.batch_size),
            ("seq_len", self.seq_len),
        ];
        for (f, v) in pos {
            if v == 0 {
                return Err(ElmError::config(f, "must be > 0"));
            }
        }
        // A step count no run reaches is a typo, not a plan: bound the training loop.
        if self.steps > MAX_TRAIN_STEPS {
            return Err(ElmError::config(
                "steps",
                format!("{} exceeds the cap of {MAX_TRAIN_STEPS}", self.steps),
            ));
        }
        crate::limits::checked_product("batch_size", &[self.batch_size, self.seq_len])?;
        self.optim.validate()?;
        self.jacobian_penalty.validate()?;
        if let Some(sn) = &self.spectral_norm {
            sn.validate()?;
        }
        self.fixed_point_correction.validate()?;
        Ok(())
    }
}
