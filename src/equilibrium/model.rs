//! [`ElmModel`]: a dense model with a window of layers replaced by the fixed-point module (or
//! the dense model itself), in f32 or quantized ([`ElmWeights`]), and its loading.

use std::path::Path;

use ndarray::{Array1, Array3};

use crate::error::{ElmError, Result};
use crate::formats::tokenizer::Tokenizer;
use crate::model::{
    config_and_layer_format, embed_tokens, load_inference_checked, load_inference_layers,
    load_pretrained, load_pretrained_checked, BeforeWeights, BlockWeights, DecoderWeights,
    ModelConfig, ModelWeights,
};
use crate::model_data::{QLayer, QuantWeights};
use crate::quant::{Linear, LinearRef, WeightStorage, WriteFormat};

use super::config::ElmConfig;
use super::inference_config::Depth;
use super::interchange::{self, ExportParts, OfficialSettings};
use super::map::ModuleView;
use super::module::{load_module_for, load_relaxed_for, ElmModule};
use super::quant_module::{QuantElm, QuantModule};

/// A relaxed recursive checkpoint `dir` as the f32 dense model its loops merge into
/// ([`super::relaxed::merged_model`]): a fixed stack of `M` layers runs exactly as a dense
/// model's window, with one KV cache per loop and no solve.
fn load_relaxed_merged(model: &Path, dir: &Path) -> Result<(ModelWeights, Tokenizer)> {
    let (weights, tok) = load_pretrained(model)?;
    let (module, meta, loops) = load_relaxed_for(dir, &weights.config, model)?;
    let shared = module.block.decoder().ok_or_else(|| {
        ElmError::config("block", "a relaxed recursive module needs a decoder block")
            .in_file(dir.join(super::module::META_FILE))
    })?;
    let merged = super::relaxed::merged_model(weights, &meta.elm, shared, &loops)?;
    Ok((merged, tok))
}

/// The tensors an [`ElmModel`] runs on. Inference reads them only through [`ElmModel`]'s
/// accessors (kept layer by slot, module view, embedding, final norm, LM head), one path for
/// both forms.
#[derive(Clone, Debug)]
pub enum ElmWeights {
    /// f32 tensors: the whole dense model (the replaced layers too: training's teacher and the
    /// module's initialisation read them) and the module.
    F32 {
        dense: ModelWeights,
        module: Option<ElmModule>,
    },
    /// Inference only: the kept layers, embedding, head and module as quantized (or f32)
    /// matrices; the replaced layers are not resident.
    Quant(QuantElm),
}

/// A dense model with layers `[l, l+M)` replaced by a fixed-point module, or (when it has no
/// [`ElmConfig`]) the dense model itself, run by the same code.
#[derive(Clone, Debug)]
pub struct ElmModel {
    elm: Option<ElmConfig>,
    weights: ElmWeights,
}

impl ElmModel {
    pub fn dense(weights: ModelWeights) -> Self {
        weights.back_with_huge_pages();
        ElmModel {
            elm: None,
            weights: ElmWeights::F32 {
                dense: weights,
                module: None,
            },
        }
    }
    pub fn new(weights: ModelWeights, cfg: ElmConfig, module: ElmModule) -> Result<Self> {
        cfg.validate(&weights.config)?;
        Ok(ElmModel {
            elm: Some(cfg),
            weights: ElmWeights::F32 {
                dense: weights,
                module: Some(module),
            },
        })
    }

    /// The inference-only quantized form: the kept layers of `dense` (quantized as loaded,
    /// e.g. by [`load_inference`]) and the module quantized to `module_format` (`None`: the
    /// format of the layer it replaced, f32 if that is f32).
    pub fn quantized(
        dense: QuantWeights,
        elm: Option<(ElmConfig, &ElmModule)>,
        module_format: Option<WriteFormat>,
    ) -> Result<Self> {
        let format = match &elm {
            None => None,
            Some((cfg, _)) => {
                cfg.validate(&dense.config)?;
                module_format.or(match dense.layers.get(cfg.start_layer) {
                    Some(QLayer {
                        wq: Linear::Quant(q),
                        ..
                    }) => Some(q.format().write_format()),
                    _ => None,
                })
            }
        };
        let mut dense = dense;
        if let Some((cfg, _)) = &elm {
            let window = cfg.start_layer..cfg.end_layer();
            dense.layers = std::mem::take(&mut dense.layers)
                .into_iter()
                .enumerate()
                .filter_map(|(i, l)| (!window.contains(&i)).then_some(l))
                .collect();
        }
        let module = elm.as_ref().map(|(_, m)| QuantModule::from_f32(m, format));
        ElmModel::from_quant(elm.map(|(c, _)| c), QuantElm { dense, module })
    }

    /// A quantized model from its parts: `quant.dense.layers` holds only the kept layers
    /// (all of them without `elm`) and `quant.module` is present exactly when `elm` is.
    pub fn from_quant(elm: Option<ElmConfig>, quant: QuantElm) -> Result<Self> {
        let config = quant.dense.config.clone();
        config.validate()?;
        let kept = match &elm {
            None => config.num_layers,
            Some(cfg) => {
                cfg.validate(&config)?;
                config.num_layers - cfg.num_replaced
            }
        };
        if quant.dense.layers.len() != kept {
            return Err(ElmError::shape(
                "ElmModel::from_quant",
                format!(
                    "{} dense layers for the {kept} kept layers",
                    quant.dense.layers.len()
                ),
            ));
        }
        match (&elm, &quant.module) {
            (Some(_), None) => {
                return Err(ElmError::InvalidArgument(
                    "ElmModel::from_quant: an ELM config without its module".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(ElmError::InvalidArgument(
                    "ElmModel::from_quant: a module without its ELM config".into(),
                ))
            }
            (Some(cfg), Some(m)) if cfg.injection != m.projection.is_some() => {
                return Err(ElmError::config(
                    "injection",
                    format!(
                        "{} but the module {} a projection",
                        cfg.injection,
                        if m.projection.is_some() {
                            "has"
                        } else {
                            "lacks"
                        }
                    ),
                ))
            }
            (Some(cfg), Some(m)) if cfg.block != m.block.kind() => {
                return Err(ElmError::config(
                    "block",
                    format!(
                        "{:?} but the module's block is {:?}",
                        cfg.block,
                        m.block.kind()
                    ),
                ))
            }
            _ => {}
        }
        quant.dense.back_with_huge_pages();
        if let Some(m) = &quant.module {
            crate::model::back_linears_with_huge_pages(
                (m.block.block_ref().linears().into_iter())
                    .chain((m.projection.iter()).flat_map(|p| [p.w_z.as_ref(), p.w_h.as_ref()])),
            );
        }
        Ok(ElmModel {
            elm,
            weights: ElmWeights::Quant(quant),
        })
    }

    /// An ELM trained with the official code, from the integrated directory its
    /// `hf_infer/convert_to_hf.py` writes ([`interchange`]): kept layers and module in f32, the
    /// replaced layers absent; its tokenizer when the directory has one; and how the official
    /// code runs it.
    pub fn import_official(dir: &Path) -> Result<(Self, Option<Tokenizer>, OfficialSettings)> {
        ElmModel::import_official_as(dir, None)
    }

    /// [`Self::import_official`] with the layers and module in `layer_format`.
    fn import_official_as(
        dir: &Path,
        layer_format: Option<WriteFormat>,
    ) -> Result<(Self, Option<Tokenizer>, OfficialSettings)> {
        let parts = interchange::read_official(dir, layer_format)?;
        let model = ElmModel::from_quant(Some(parts.elm), parts.weights)?;
        Ok((model, parts.tokenizer, parts.settings))
    }

    /// Writes this ELM as an official integrated directory ([`interchange::write_official`]):
    /// the official `Qwen2ELMForCausalLM` loads it. `exit_threshold`: its decoding's stopping
    /// residual per token.
    pub fn export_official(
        &self,
        tokenizer: Option<&Tokenizer>,
        exit_threshold: f64,
        dir: &Path,
    ) -> Result<()> {
        let elm = self.elm.clone().ok_or_else(|| {
            ElmError::Unsupported(
                "export to the official format: a dense model has no fixed-point layer".into(),
            )
        })?;
        let parts = match &self.weights {
            ElmWeights::F32 { dense, module } => ExportParts {
                config: dense.config.clone(),
                elm,
                kept: self
                    .kept_layers()
                    .iter()
                    .map(|&i| dense.layers[i].clone())
                    .collect(),
                module: module.clone().expect("an ELM config comes with its module"),
                embed: dense.embed.clone(),
                final_norm: dense.final_norm.clone(),
                lm_head: dense.lm_head.clone(),
            },
            ElmWeights::Quant(q) => ExportParts {
                config: q.dense.config.clone(),
                elm,
                kept: q.dense.layers.iter().map(QLayer::to_f32).collect(),
                module: q
                    .module
                    .as_ref()
                    .expect("an ELM config comes with its module")
                    .to_f32(),
                embed: q.dense.embed.to_f32(),
                final_norm: q.dense.final_norm.clone(),
                lm_head: q.dense.lm_head.as_ref().map(Linear::to_f32),
            },
        };
        interchange::write_official(parts, tokenizer, exit_threshold, dir)
    }

    /// What the module's input `h` and the module need, in f32: the embedding and the layers
    /// before the window as a model of `start_layer` layers, and the module (`None` for a dense
    /// model). Both storage forms have these (an imported official model has no replaced layers).
    pub fn layers_before_window(&self) -> Option<(ModelWeights, ElmModule)> {
        let start = self.elm.as_ref()?.start_layer;
        let (config, embed, front, module) = match &self.weights {
            ElmWeights::F32 { dense, module } => (
                dense.config.clone(),
                dense.embed.clone(),
                dense.layers[..start].to_vec(),
                module.clone()?,
            ),
            ElmWeights::Quant(q) => (
                q.dense.config.clone(),
                q.dense.embed.to_f32(),
                q.dense.layers[..start].iter().map(QLayer::to_f32).collect(),
                q.module.as_ref()?.to_f32(),
            ),
        };
        let final_norm = Array1::ones(config.hidden_size);
        Some((
            ModelWeights {
                config: ModelConfig {
                    num_layers: start,
                    // Tied: no head is carried (nothing past the window runs on this model).
                    tie_word_embeddings: true,
                    ..config
                },
                embed,
                layers: front,
                final_norm,
                lm_head: None,
            },
            module,
        ))
    }

    /// `elm` given as an official integrated directory: the whole model (`--model` is not read).
    fn load_official_dir(dir: &Path, storage: WeightStorage) -> Result<(Self, Tokenizer)> {
        // The transformer layers and the module quantized as requested; the embedding and head
        // stay f32 (as imported).
        let layer_format = storage.forced_format();
        let (model, tok, _) = ElmModel::import_official_as(dir, layer_format)?;
        let tok = tok.ok_or_else(|| {
            ElmError::format(
                dir.join("tokenizer.json"),
                "missing: an official ELM directory needs its tokenizer (convert_to_hf.py copies it)",
            )
        })?;
        Ok((model, tok))
    }

    /// Loads like [`Self::load`] for inference, with the matrices stored as `storage` says.
    /// A module checkpoint that only replaces its window (neither healed nor relaxed) loads
    /// without the window's layers, in any storage f32 included (issue 42: an ELM holds less
    /// than its parent); the dense model and the checkpoints merged in f32 load as
    /// [`Self::load`] does for f32, and otherwise through [`Self::quantized`].
    pub fn load_with(
        model: &Path,
        elm: Option<&Path>,
        storage: WeightStorage,
    ) -> Result<(Self, Tokenizer)> {
        Self::load_with_checked(model, elm, storage, &|_, _| Ok(()))
    }

    /// [`Self::load_with`] with `check` run on the tokenizer and config the model is used with
    /// ([`BeforeWeights`]): before any weight is read for the dense model alone (no `elm`),
    /// where a refusal saves the whole load; with a module, once the model is loaded (the
    /// tokenizer is still built once).
    pub fn load_with_checked(
        model: &Path,
        elm: Option<&Path>,
        storage: WeightStorage,
        check: BeforeWeights,
    ) -> Result<(Self, Tokenizer)> {
        let Some(elm) = elm else {
            return if storage == WeightStorage::F32 {
                let (weights, tok) = load_pretrained_checked(model, check)?;
                Ok((ElmModel::dense(weights), tok))
            } else {
                let (dense, tok) = load_inference_checked(model, storage, &|_| true, check)?;
                let module_format = storage.forced_format();
                Ok((ElmModel::quantized(dense, None, module_format)?, tok))
            };
        };
        let (loaded, tok) = Self::load_module_with(model, elm, storage)?;
        check(&tok, loaded.config())?;
        Ok((loaded, tok))
    }

    /// [`Self::load_with`] of the module checkpoint, official directory or quantized file `elm`.
    fn load_module_with(
        model: &Path,
        elm: &Path,
        storage: WeightStorage,
    ) -> Result<(Self, Tokenizer)> {
        if elm.is_file() {
            // A deployable file from `elm quantize`: it holds the whole model.
            return ElmModel::load_quant_gguf_with(elm, storage);
        }
        if interchange::is_official_dir(elm) {
            return ElmModel::load_official_dir(elm, storage);
        }
        let dir = elm;
        let replaces_only = super::module::read_module_meta(dir)
            .is_ok_and(|m| !m.elm.is_relaxed() && m.heal.is_none());
        if storage == WeightStorage::F32 && !replaces_only {
            return Self::load(model, Some(dir));
        }
        let module_format = storage.forced_format();
        let meta = super::module::read_module_meta(dir)?;
        if meta.elm.is_relaxed() {
            // Merged in f32, then stored as asked (`auto` keeps the merged layers f32).
            let (weights, tok) = load_relaxed_merged(model, dir)?;
            let q = QuantWeights::from_f32(&weights, module_format);
            return Ok((ElmModel::quantized(q, None, module_format)?, tok));
        }
        if meta.heal.is_some() {
            // A healed checkpoint changes the layers after the window: merged in f32, then
            // stored as asked (`auto` keeps them f32: a GGUF's blocks no longer hold them).
            let (mut weights, tok) = load_pretrained(model)?;
            let (module, meta) = load_module_for(dir, &weights.config, model)?;
            super::module::merge_heal(&mut weights, dir, &meta)?;
            let q = QuantWeights::from_f32(&weights, module_format);
            let loaded = ElmModel::quantized(q, Some((meta.elm, &module)), module_format)?;
            return Ok((loaded, tok));
        }
        // The replaced window is never read (issue 42: loading an ELM must not hold the layers
        // it drops, not even for a moment); the module takes the format that window's first
        // layer would have had. It is quantized, and its f32 form dropped, before the dense
        // layers load, so that the f32 copy is never resident beside them.
        let start = meta.elm.start_layer;
        let (config, stored_format) = config_and_layer_format(model, start, storage)?;
        let (f32_module, meta) = load_module_for(dir, &config, model)?;
        let cfg = meta.elm;
        let format = module_format.or(stored_format);
        let module = QuantModule::from_f32(&f32_module, format);
        drop(f32_module);
        let window = cfg.start_layer..cfg.end_layer();
        let (dense, tok) = load_inference_layers(model, storage, &|l| !window.contains(&l))?;
        let quant = QuantElm {
            dense,
            module: Some(module),
        };
        Ok((ElmModel::from_quant(Some(cfg), quant)?, tok))
    }

    /// Bytes of weights held for inference (f32 tensors, or the quantized ones).
    pub fn weight_bytes(&self) -> usize {
        match &self.weights {
            ElmWeights::Quant(q) => {
                q.dense.embed.bytes()
                    + q.dense.layers.iter().map(QLayer::bytes).sum::<usize>()
                    + q.dense.final_norm.len() * 4
                    + q.dense.lm_head.as_ref().map_or(0, Linear::bytes)
                    + q.module.as_ref().map_or(0, QuantModule::bytes)
            }
            ElmWeights::F32 { dense, module } => {
                4 * (dense.num_params() + module.as_ref().map_or(0, ElmModule::num_params))
            }
        }
    }
    /// Bytes of the token embedding and, when untied, the LM head (see
    /// [`DecoderWeights::embedding_bytes`]).
    pub fn embedding_bytes(&self) -> usize {
        match &self.weights {
            ElmWeights::Quant(q) => q.dense.embedding_bytes(),
            ElmWeights::F32 { dense, .. } => dense.embedding_bytes(),
        }
    }
    /// Loads the dense model and its tokenizer and, with `elm`, the module checkpoint (which
    /// must have been cut from a model with the same config).
    ///
    /// `elm` may also be a quantized GGUF from `elm quantize` (see [`super::quant_gguf`]):
    /// that file holds the whole model, loaded with its matrices as stored (`model` is not read).
    pub fn load(model: &Path, elm: Option<&Path>) -> Result<(Self, Tokenizer)> {
        if let Some(file) = elm.filter(|p| p.is_file()) {
            return ElmModel::load_quant_gguf_with(file, WeightStorage::Auto);
        }
        if let Some(dir) = elm.filter(|p| interchange::is_official_dir(p)) {
            return ElmModel::load_official_dir(dir, WeightStorage::F32);
        }
        if let Some(dir) =
            elm.filter(|d| super::module::read_module_meta(d).is_ok_and(|m| m.elm.is_relaxed()))
        {
            let (weights, tok) = load_relaxed_merged(model, dir)?;
            return Ok((ElmModel::dense(weights), tok));
        }
        let (mut weights, tok) = load_pretrained(model)?;
        let loaded = match elm {
            None => ElmModel::dense(weights),
            Some(dir) => {
                let (module, meta) = load_module_for(dir, &weights.config, model)?;
                super::module::merge_heal(&mut weights, dir, &meta)?;
                ElmModel::new(weights, meta.elm, module)?
            }
        };
        Ok((loaded, tok))
    }
    /// The matrices scoring reuses packed while the returned value lives
    /// ([`ModelWeights::frozen_for_scoring`]); none for quantized weights, whose products do
    /// not pack.
    pub fn frozen_for_scoring(&self) -> crate::gemm::FrozenWeights<'_> {
        match &self.weights {
            ElmWeights::F32 { dense, .. } => dense.frozen_for_scoring(),
            ElmWeights::Quant(_) => crate::gemm::FrozenWeights::new(),
        }
    }

    /// The dense model's config (all N layers, the replaced ones included).
    pub fn config(&self) -> &ModelConfig {
        match &self.weights {
            ElmWeights::F32 { dense, .. } => &dense.config,
            ElmWeights::Quant(q) => &q.dense.config,
        }
    }
    /// The model with its module run at `depth` instead of as trained (see [`Depth`]): a
    /// fixed loop solved, or a solved module looped a fixed number of times. A model without a
    /// module, or a relaxed recursive one (its loops differ, so its depth is fixed at M), is
    /// refused unless `depth` is [`Depth::AsTrained`].
    pub fn with_depth(mut self, depth: Depth) -> Result<Self> {
        if depth == Depth::AsTrained {
            return Ok(self);
        }
        let config = self.config().clone();
        let Some(ec) = self.elm.as_mut() else {
            return Err(ElmError::config(
                "depth",
                format!("`{depth}`: the model has no fixed-point module (a dense model or one merged from relaxed loops)"),
            ));
        };
        if ec.relaxed.is_some() {
            return Err(ElmError::config(
                "depth",
                "a relaxed recursive module runs its M distinct loops exactly once each",
            ));
        }
        ec.fixed_iterations = match depth {
            Depth::Fixed(k) => Some(k),
            Depth::Solved | Depth::AsTrained => None,
        };
        ec.validate(&config)?;
        Ok(self)
    }
    /// Which layers the module replaces (`None`: the dense model).
    pub fn elm_config(&self) -> Option<&ElmConfig> {
        self.elm.as_ref()
    }
    pub fn weights(&self) -> &ElmWeights {
        &self.weights
    }
    /// The f32 dense model and module (`None` for a quantized model, which holds neither).
    pub fn f32_weights(&self) -> Option<(&ModelWeights, Option<&ElmModule>)> {
        match &self.weights {
            ElmWeights::F32 { dense, module } => Some((dense, module.as_ref())),
            ElmWeights::Quant(_) => None,
        }
    }
    /// The quantized matrices (`None` for an f32 model).
    pub fn quant_weights(&self) -> Option<&QuantElm> {
        match &self.weights {
            ElmWeights::Quant(q) => Some(q),
            ElmWeights::F32 { .. } => None,
        }
    }
    /// The dense model this one was built on, when its f32 weights are resident (a quantized
    /// model holds only the layers it runs).
    pub fn dense_reference(&self) -> Option<ElmModel> {
        self.f32_weights()
            .map(|(dense, _)| ElmModel::dense(dense.clone()))
    }
    /// Indices of the dense layers that are kept, in order.
    pub fn kept_layers(&self) -> Vec<usize> {
        ElmConfig::kept_layers(self.elm.as_ref(), self.config().num_layers)
    }
    /// Kept dense layers `(before the module, after it)`; the first `front` slots are layers
    /// `0..front`, the rest the last `back` layers.
    pub(crate) fn front_back(&self) -> (usize, usize) {
        let n = self.config().num_layers;
        match &self.elm {
            None => (n, 0),
            Some(ec) => (ec.start_layer, n - ec.end_layer()),
        }
    }
    /// Kept dense layer number `slot` (in run order), whichever form holds it.
    pub(crate) fn kept_layer(&self, slot: usize) -> &dyn BlockWeights {
        match &self.weights {
            ElmWeights::F32 { dense, .. } => {
                let front = self.front_back().0;
                let m = self.elm.as_ref().map_or(0, |e| e.num_replaced);
                &dense.layers[if slot < front { slot } else { slot + m }]
            }
            ElmWeights::Quant(q) => &q.dense.layers[slot],
        }
    }
    /// The module as the no-tape kernels see it (`None` for the dense model).
    pub(crate) fn module_view(&self) -> Option<ModuleView<'_, dyn BlockWeights>> {
        match &self.weights {
            ElmWeights::F32 { module, .. } => module.as_ref().map(ElmModule::view),
            ElmWeights::Quant(q) => q.module.as_ref().map(QuantModule::view),
        }
    }
    /// Token embeddings `[B, T, C]` (right-padded) and each row's length.
    pub(crate) fn embed(&self, tokens: &[impl AsRef<[u32]>]) -> Result<(Array3<f32>, Vec<usize>)> {
        match &self.weights {
            ElmWeights::F32 { dense, .. } => embed_tokens(dense, tokens),
            ElmWeights::Quant(q) => embed_tokens(&q.dense, tokens),
        }
    }
    /// `[C]`
    pub(crate) fn final_norm(&self) -> &Array1<f32> {
        match &self.weights {
            ElmWeights::F32 { dense, .. } => &dense.final_norm,
            ElmWeights::Quant(q) => &q.dense.final_norm,
        }
    }
    /// `[V, C]` (the embedding when tied).
    pub(crate) fn lm_head(&self) -> LinearRef<'_> {
        match &self.weights {
            ElmWeights::F32 { dense, .. } => dense.lm_head_ref(),
            ElmWeights::Quant(q) => q.dense.lm_head_ref(),
        }
    }
    /// Weight bytes one batch-1 decode step reads: every kept layer, the module once per
    /// iteration not counted (see the bench for that), the final norm and the LM head.
    pub fn decode_bytes(&self) -> usize {
        let kept: usize = (0..self.kept_layers().len())
            .map(|slot| self.kept_layer(slot).block_ref().bytes())
            .sum();
        kept + self.final_norm().len() * 4 + self.lm_head().bytes()
    }
    /// Each matrix format held and its bytes (see [`super::quant_gguf::storage_summary`]).
    pub fn storage_summary(&self) -> Vec<(String, usize)> {
        match &self.weights {
            ElmWeights::F32 { .. } => super::quant_gguf::storage_summary(None),
            ElmWeights::Quant(q) => super::quant_gguf::storage_summary(Some(q)),
        }
    }

    /// Writes this quantized model (see [`ElmModel::quantized`] / [`ElmModel::load_with`]) and
    /// `tokenizer` as one GGUF file at `path` ([`super::quant_gguf`]); returns the bytes written.
    pub fn save_quant_gguf(&self, path: &Path, tokenizer: &Tokenizer) -> Result<u64> {
        let ElmWeights::Quant(q) = &self.weights else {
            return Err(ElmError::InvalidArgument(
                "save_quant_gguf: the model holds f32 weights; load it quantized \
                 (ElmModel::load_with with a block format, or ElmModel::quantized)"
                    .into(),
            ));
        };
        super::quant_gguf::write_quant_gguf(path, self.elm.as_ref(), q, tokenizer)
    }
    /// Loads a file written by [`ElmModel::save_quant_gguf`] with its matrices as stored.
    pub fn load_quant_gguf(path: &Path) -> Result<(Self, Tokenizer)> {
        Self::load_quant_gguf_with(path, WeightStorage::Auto)
    }
    /// Loads a file written by [`ElmModel::save_quant_gguf`]: `Auto` keeps every matrix as
    /// stored (blocks byte-for-byte); `Quant(f)` re-quantizes matrices of another format; `F32`
    /// dequantizes. Strict: a wrong `elm.format`, missing or invalid config metadata, or a
    /// missing, mis-shaped or unexpected tensor is an error naming the file and the key or tensor.
    pub fn load_quant_gguf_with(path: &Path, storage: WeightStorage) -> Result<(Self, Tokenizer)> {
        let (elm, quant, tokenizer) = super::quant_gguf::read_quant_gguf_with(path, storage)?;
        let model = ElmModel::from_quant(elm, quant).map_err(|e| e.in_file(path))?;
        Ok((model, tokenizer))
    }
}
