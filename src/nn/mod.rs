//! Neural-network layers as plain `forward(...) -> (out, cache)` / `backward(cache, dout)`
//! pairs on `ndarray` (usable without a tape, e.g. for no-grad inference of frozen layers),
//! each wrapped by a tape op of the same name.
//!
//! Shapes: `B` batch, `T` current tokens, `P` prefix tokens, `S = P + T`, `C` channels,
//! `H` query heads, `KV` key/value heads, `D` head dim, `V` vocabulary, `r` LoRA rank.

pub mod attention;
pub mod embedding;
pub mod geglu;
pub mod lora;
pub mod loss;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;

pub use attention::attention;
pub use embedding::embedding;
pub use geglu::geglu;
pub use lora::lora_linear;
pub use loss::{cross_entropy, masked_mse, supervised_cross_entropy, IGNORE_INDEX};
pub use rmsnorm::rms_norm;
pub use rope::{rope, RopeLayout};
pub use swiglu::swiglu;

use crate::autograd::{AdFloat, Tape, Var};
use crate::error::Result;

/// Linear layer `x · Wᵀ (+ b)` (`x: [..., K]`, `w: [N, K]`); same as [`Tape::matmul_t`].
pub fn linear<T: AdFloat>(tape: &mut Tape<T>, x: Var, w: Var, bias: Option<Var>) -> Result<Var> {
    tape.matmul_t(x, w, bias)
}
