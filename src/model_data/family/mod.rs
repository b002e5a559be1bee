//! One file per model family, as llama.cpp keeps one per architecture: what a family is called
//! in each file format, how those files store what its block computes (row permutations, norm
//! gains), and the rules of its block (activation, extra norms, embedding scale, sliding
//! windows). Every decision that depends on the family reads a [`Family`], reached from
//! [`Arch::family`], the one `match` over [`Arch`]. A new family is a variant of `Arch`
//! (`facts.rs`), a file beside these, and that match arm, which the compiler asks for.
//! `tests/architecture.rs` fails when a family's variant or names appear elsewhere in `src/`.

pub mod facts;
mod gemma3;
mod llama;
mod qwen2;

pub use facts::{Activation, Arch, BiasRule, Family, TinySwitches, TinyWindows, WindowRules};

impl Arch {
    /// Every family, in the order lists and errors name them.
    pub const ALL: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Gemma3];

    /// The family's facts: the one `match` over the families.
    pub fn family(self) -> &'static Family {
        match self {
            Arch::Llama => &llama::FAMILY,
            Arch::Qwen2 => &qwen2::FAMILY,
            Arch::Gemma3 => &gemma3::FAMILY,
        }
    }

    /// The family whose GGUF `general.architecture` is `name`.
    pub fn from_gguf_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.family().gguf_name == name)
    }

    /// The family whose HF `model_type` is `name`.
    pub fn from_hf_model_type(name: &str) -> Option<Arch> {
        Arch::ALL
            .into_iter()
            .find(|a| a.family().hf_model_type == name)
    }

    /// `names(f)` of every family, comma-separated: the supported list errors print.
    pub fn supported(names: impl Fn(&Family) -> &'static str) -> String {
        Arch::ALL
            .iter()
            .map(|a| names(a.family()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
