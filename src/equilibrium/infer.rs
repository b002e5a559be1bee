//! ELM inference, one file per job: [`InferenceConfig`] ([`super::inference_config`]),
//! [`ElmModel`] and its loading ([`super::model`]), the quantized module ([`super::quant_module`]),
//! [`ElmSession`] ([`super::session`]), the fixed-point map ([`super::fixed_point`]),
//! [`solve_sequences`] ([`super::sequences`]) and the decoders ([`super::decode`]). This module
//! gathers their public items under one path.

pub use super::decode::{generate_greedy, generate_greedy_until, ElmDecoder, SessionRecord};
pub use super::inference_config::{InferenceConfig, KvMode};
pub use super::model::ElmModel;
pub use super::quant_module::{QuantElm, QuantModule, QuantProjection};
pub use super::sequences::solve_sequences;
pub use super::session::{ElmSession, FpStat};
pub use crate::quant::ActQuant;
