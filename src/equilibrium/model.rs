//! [`ElmModel`]: a dense model with a window of layers replaced by the fixed-point module (or
//! the dense model itself), in f32 or quantized, and its loading.

use std::path::Path;

use crate::error::{ElmError, Result};
use crate::io::tokenizer::Tokenizer;
use crate::model::quant::{Linear, QFormat, QLayer, QuantWeights, WeightStorage};
use crate::model::{load_inference, load_pretrained, ModelConfig, ModelWeights};

use super::config::ElmConfig;
use super::module::{load_module_for, ElmModule, ModuleBlock};
use super::quant_module::{empty2, empty_layer, QuantElm, QuantModule};

/// A dense model with layers `[l, l+M)` replaced by a fixed-point module, or (when `elm` is
/// `None`) the dense model itself, run by the same code.
///
/// With `quant` set (see [`ElmModel::quantized`]) inference runs on the quantized matrices
/// there, and `weights` / the module in `elm` keep only the config and the ELM layout
/// (their tensors are empty), so only what runs is resident.
pub struct ElmModel {
    pub weights: ModelWeights,
    pub elm: Option<(ElmConfig, ElmModule)>,
    pub quant: Option<QuantElm>,
}

impl ElmModel {
    pub fn dense(weights: ModelWeights) -> Self {
        ElmModel {
            weights,
            elm: None,
            quant: None,
        }
    }
    pub fn new(weights: ModelWeights, cfg: ElmConfig, module: ElmModule) -> Result<Self> {
        cfg.validate(&weights.config)?;
        Ok(ElmModel {
            weights,
            elm: Some((cfg, module)),
            quant: None,
        })
    }

    /// The inference-only quantized form: the kept layers of `dense` (quantized as loaded,
    /// e.g. by [`load_inference`]) and the module quantized to `module_format` (`None`: the
    /// format of the layer it replaced, f32 if that is f32).
    pub fn quantized(
        dense: QuantWeights,
        elm: Option<(ElmConfig, &ElmModule)>,
        module_format: Option<QFormat>,
    ) -> Result<Self> {
        let config = dense.config.clone();
        let (kept, module): (Vec<usize>, _) = match &elm {
            None => ((0..config.num_layers).collect(), None),
            Some((cfg, m)) => {
                cfg.validate(&config)?;
                let format = module_format.or(match dense.layers.get(cfg.start_layer) {
                    Some(QLayer {
                        wq: Linear::Quant(q),
                        ..
                    }) => Some(q.format()),
                    _ => None,
                });
                let kept = (0..cfg.start_layer)
                    .chain(cfg.end_layer()..config.num_layers)
                    .collect();
                (kept, Some(QuantModule::from_f32(m, format)))
            }
        };
        let mut dense = dense;
        dense.layers = std::mem::take(&mut dense.layers)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| kept.contains(i))
            .map(|(_, l)| l)
            .collect();
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
        let shell = ModelWeights {
            config: config.clone(),
            embed: empty2(),
            layers: vec![],
            final_norm: ndarray::Array1::zeros(0),
            lm_head: None,
        };
        let shell_module = |kind| ElmModule {
            block: ModuleBlock::of_layer(&empty_layer(), kind),
            projection: None,
        };
        Ok(ElmModel {
            weights: shell,
            elm: elm.map(|c| {
                let m = shell_module(c.block);
                (c, m)
            }),
            quant: Some(quant),
        })
    }

    /// Loads like [`Self::load`] with the matrices stored as `storage` says (f32: exactly
    /// [`Self::load`]; otherwise [`Self::quantized`] on [`load_inference`]'s weights).
    pub fn load_with(
        model: &Path,
        elm: Option<&Path>,
        storage: WeightStorage,
    ) -> Result<(Self, Tokenizer)> {
        if let Some(file) = elm.filter(|p| p.is_file()) {
            // A deployable file from `elm quantize`: it holds the whole model.
            return ElmModel::load_quant_gguf_with(file, storage);
        }
        if storage == WeightStorage::F32 {
            return Self::load(model, elm);
        }
        let (dense, tok) = load_inference(model, storage)?;
        let module_format = match storage {
            WeightStorage::Quant(f) => Some(f),
            _ => None,
        };
        let loaded = match elm {
            None => ElmModel::quantized(dense, None, module_format)?,
            Some(dir) => {
                let (module, meta) = load_module_for(dir, &dense.config, model)?;
                ElmModel::quantized(dense, Some((meta.elm, &module)), module_format)?
            }
        };
        Ok((loaded, tok))
    }

    /// Bytes of weights held for inference (f32 tensors, or the quantized ones).
    pub fn weight_bytes(&self) -> usize {
        match &self.quant {
            Some(q) => {
                q.dense.embed.bytes()
                    + q.dense.layers.iter().map(QLayer::bytes).sum::<usize>()
                    + q.dense.final_norm.len() * 4
                    + q.dense.lm_head.as_ref().map_or(0, Linear::bytes)
                    + q.module.as_ref().map_or(0, QuantModule::bytes)
            }
            None => {
                4 * (self.weights.num_params()
                    + self.elm.as_ref().map_or(0, |(_, m)| m.num_params()))
            }
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
        let (weights, tok) = load_pretrained(model)?;
        let loaded = match elm {
            None => ElmModel::dense(weights),
            Some(dir) => {
                let (module, meta) = load_module_for(dir, &weights.config, model)?;
                ElmModel::new(weights, meta.elm, module)?
            }
        };
        Ok((loaded, tok))
    }
    pub fn config(&self) -> &ModelConfig {
        &self.weights.config
    }
    /// Indices of the dense layers that are kept, in order.
    pub fn kept_layers(&self) -> Vec<usize> {
        ElmConfig::kept_layers(
            self.elm.as_ref().map(|(c, _)| c),
            self.weights.config.num_layers,
        )
    }

    /// Writes this quantized model (see [`ElmModel::quantized`] / [`ElmModel::load_with`]) and
    /// `tokenizer` as one GGUF file at `path` ([`super::quant_gguf`]); returns the bytes written.
    pub fn save_quant_gguf(&self, path: &Path, tokenizer: &Tokenizer) -> Result<u64> {
        let q = self.quant.as_ref().ok_or_else(|| {
            ElmError::InvalidArgument(
                "save_quant_gguf: the model holds f32 weights; load it quantized \
                 (ElmModel::load_with with a block format, or ElmModel::quantized)"
                    .into(),
            )
        })?;
        super::quant_gguf::write_quant_gguf(path, self.elm.as_ref().map(|(c, _)| c), q, tokenizer)
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
