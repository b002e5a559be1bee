//! The quantized forms of an ELM: [`QuantElm`] (kept dense layers, embedding, head, module)
//! and [`QuantModule`] / [`QuantProjection`].

use crate::model::BlockWeights;
use crate::model_data::{QFfn, QLayer, QuantWeights};
use crate::quant::{Linear, WriteFormat};

use super::map::ModuleView;
use super::module::{ElmModule, ModuleBlock, ProjectionWeights};

/// What a quantized [`ElmModel`] runs on: the kept dense layers (in order, `layers[slot]`),
/// embedding, final norm and LM head, and the fixed-point module, each matrix quantized.
#[derive(Clone, Debug)]
pub struct QuantElm {
    /// `layers` holds only the kept dense layers, in the order they run.
    pub dense: QuantWeights,
    /// The module (`None` for a dense model).
    pub module: Option<QuantModule>,
}

/// The fixed-point module with quantized matrices (`P = [W_z | W_h]` and the block).
#[derive(Clone, Debug)]
pub struct QuantModule {
    pub block: ModuleBlock<QLayer, QFfn>,
    /// The input injection (`None`: `u = z`, as [`ElmModule::projection`]).
    pub projection: Option<QuantProjection>,
}

/// `P = [W_z | W_h]` and `b`, quantized.
#[derive(Clone, Debug)]
pub struct QuantProjection {
    pub w_z: Linear,
    pub w_h: Linear,
    pub bias: ndarray::Array1<f32>,
}

impl QuantProjection {
    pub(crate) fn bytes(&self) -> usize {
        self.w_z.bytes() + self.w_h.bytes() + self.bias.len() * 4
    }
}

impl QuantModule {
    /// The module's matrices quantized to `format` (`None`: kept f32).
    pub fn from_f32(m: &ElmModule, format: Option<WriteFormat>) -> Self {
        QuantModule {
            block: match &m.block {
                ModuleBlock::Decoder(b) => ModuleBlock::Decoder(QLayer::from_f32(b, format)),
                ModuleBlock::Ffn(b) => ModuleBlock::Ffn(QFfn::from_f32(b, format)),
            },
            projection: m.projection.as_ref().map(|p| QuantProjection {
                w_z: Linear::from_f32(&p.w_z, format),
                w_h: Linear::from_f32(&p.w_h, format),
                bias: p.bias.clone(),
            }),
        }
    }

    /// The module with every matrix in f32 (dequantized where it is quantized).
    pub fn to_f32(&self) -> ElmModule {
        ElmModule {
            block: match &self.block {
                ModuleBlock::Decoder(b) => ModuleBlock::Decoder(b.to_f32()),
                ModuleBlock::Ffn(b) => ModuleBlock::Ffn(b.to_f32()),
            },
            projection: self.projection.as_ref().map(|p| ProjectionWeights {
                w_z: p.w_z.to_f32(),
                w_h: p.w_h.to_f32(),
                bias: p.bias.clone(),
            }),
        }
    }

    /// Bytes of weights held.
    pub fn bytes(&self) -> usize {
        self.block.block_ref().bytes() + self.projection.as_ref().map_or(0, QuantProjection::bytes)
    }

    /// The module as the no-tape kernels see it (the path of [`ElmModule`]'s f32 matrices).
    pub(crate) fn view(&self) -> ModuleView<'_, dyn BlockWeights> {
        ModuleView {
            block: &self.block,
            projection: self
                .projection
                .as_ref()
                .map(|p| (p.w_z.as_ref(), p.w_h.as_ref(), p.bias.view())),
        }
    }
}
