//! One memory estimate per command, checked against the memory available before its work
//! starts (issue 29): a command that cannot fit is refused at once with the parts it would
//! need, instead of being killed by the kernel an hour in.
//!
//! An estimate is what the command holds for its whole life (the runtime, the model file it
//! maps, what it has loaded) plus the largest of its transient phases (a decode's KV cache and
//! activations, a training step's tape, a merge). What is already loaded is read from the heap
//! counters ([`crate::heap::CountingAlloc`], installed by the `elm` binary) rather than
//! predicted; what lies ahead is predicted from the shapes, or measured on one probe sequence
//! and scaled (a training step, whose tape no formula here would track as the code changes).
//! `scripts/memory-table.sh` compares every estimate with the measured peak RSS.

use std::path::Path;

use serde::Serialize;

use crate::data::TokenSequence;
use crate::error::Result;
use crate::model::ModelConfig;

/// Resident bytes of the process before any model is loaded: the binary, its shared
/// libraries, thread stacks and the allocator's arenas (measured: `elm` at startup holds
/// 10–14 MB; rounded up so small commands are not underestimated).
pub const RUNTIME_BYTES: u64 = 16 << 20;

/// One named share of an estimate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryPart {
    pub name: String,
    pub bytes: u64,
}

/// A transient phase: its parts are live together, and freed before the next phase.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryPhase {
    pub name: String,
    pub parts: Vec<MemoryPart>,
}

/// Sum of `parts`, saturating (a saturated estimate is still refused).
fn total(parts: &[MemoryPart]) -> u64 {
    parts.iter().fold(0u64, |a, p| a.saturating_add(p.bytes))
}

impl MemoryPhase {
    /// Sum of the phase's parts.
    pub fn bytes(&self) -> u64 {
        total(&self.parts)
    }
}

/// What a command needs at its peak: everything held plus its largest phase.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryEstimate {
    /// The command (`generate`, `eval`, `train`, `lora`).
    pub command: String,
    /// Held for the command's whole life.
    pub held: Vec<MemoryPart>,
    pub phases: Vec<MemoryPhase>,
    /// `held` + the largest phase.
    pub total_bytes: u64,
}

fn parts(list: &[(&str, u64)]) -> Vec<MemoryPart> {
    list.iter()
        .map(|&(name, bytes)| MemoryPart {
            name: name.to_string(),
            bytes,
        })
        .collect()
}

impl MemoryEstimate {
    /// An estimate of `command` holding `held` throughout.
    pub fn new(command: &str, held: &[(&str, u64)]) -> Self {
        let mut e = MemoryEstimate {
            command: command.to_string(),
            held: parts(held),
            phases: vec![],
            total_bytes: 0,
        };
        e.total_bytes = e.compute_total();
        e
    }

    /// The start every command's estimate shares: the runtime and what it has `loaded` held
    /// throughout, and the `model_file` mapped while it was read.
    pub fn loaded_model(command: &str, loaded: u64, model_file: u64) -> Self {
        MemoryEstimate::new(command, &[("runtime", RUNTIME_BYTES), ("loaded", loaded)])
            .with_phase("loading", &[("model file", model_file)])
    }

    /// Adds a part held throughout.
    pub fn with_held(mut self, name: &str, bytes: u64) -> Self {
        self.held.extend(parts(&[(name, bytes)]));
        self.total_bytes = self.compute_total();
        self
    }

    /// Adds a transient phase.
    pub fn with_phase(mut self, name: &str, list: &[(&str, u64)]) -> Self {
        self.phases.push(MemoryPhase {
            name: name.to_string(),
            parts: parts(list),
        });
        self.total_bytes = self.compute_total();
        self
    }

    fn compute_total(&self) -> u64 {
        let held = total(&self.held);
        let phase = self
            .phases
            .iter()
            .map(MemoryPhase::bytes)
            .max()
            .unwrap_or(0);
        held.saturating_add(phase)
    }

    /// The phase that sets the peak.
    pub fn peak_phase(&self) -> Option<&MemoryPhase> {
        self.phases.iter().max_by_key(|p| p.bytes())
    }

    /// One line for a person: the total and its parts, in MiB.
    pub fn summary(&self) -> String {
        let mib = |b: u64| format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64);
        let mut s = format!("{} for `{}`: ", mib(self.total_bytes), self.command);
        let held: Vec<String> = self
            .held
            .iter()
            .map(|p| format!("{} {}", p.name, mib(p.bytes)))
            .collect();
        s.push_str(&held.join(" + "));
        if let Some(p) = self.peak_phase() {
            let inner: Vec<String> = p
                .parts
                .iter()
                .map(|q| format!("{} {}", q.name, mib(q.bytes)))
                .collect();
            s.push_str(&format!(" + {} ({})", p.name, inner.join(", ")));
        }
        s
    }

    /// Refuses the command when its estimate exceeds the memory available
    /// ([`crate::limits::mem_budget`]), naming the estimate's parts.
    pub fn check(&self) -> Result<()> {
        crate::limits::check_alloc(
            &format!("memory estimate ({})", self.summary()),
            self.total_bytes as u128,
        )
    }
}

/// Heap bytes live now when [`crate::heap::CountingAlloc`] counts them, else `fallback` (the
/// caller's prediction of what it has loaded).
pub fn loaded_bytes_or(fallback: u64) -> u64 {
    crate::heap::counters().map_or(fallback, |c| c.live_bytes as u64)
}

/// Bytes of a model file resident at once while loading: the `*.safetensors` files of a
/// directory whole (mapped and read whole); of a `.gguf` file, at most two of the slices the
/// loader converts before handing their pages back (`crate::io::MappedFile`: the slice being
/// read and the fault-around tail of the one before); 0 where none can be read.
pub fn mapped_model_bytes(path: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    if path.is_dir() {
        std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                    .map(|p| size(&p))
                    .sum()
            })
            .unwrap_or(0)
    } else {
        size(path).min(2 * crate::io::mapped::RELEASE_SLICE_BYTES as u64)
    }
}

/// f32 bytes of a KV cache of `batch` rows × `tokens` positions over every layer.
pub fn kv_cache_bytes(cfg: &ModelConfig, batch: usize, tokens: usize) -> u64 {
    let kv_dim = (cfg.num_kv_heads * cfg.head_dim) as u64;
    4 * 2 * cfg.num_layers as u64 * kv_dim * batch as u64 * tokens as u64
}

/// f32 bytes of the KV cache that generation allocates (`Transformer::new_cache`) for `batch`
/// rows × `tokens` positions: a windowed layer of `cfg`'s pattern holds only
/// [`crate::model::kv_slots`] positions, the others every one.
pub fn generation_kv_cache_bytes(cfg: &ModelConfig, batch: usize, tokens: usize) -> u64 {
    let kv_dim = (cfg.num_kv_heads * cfg.head_dim) as u64;
    let slots: u64 = (0..cfg.num_layers)
        .map(|l| crate::model::kv_slots(cfg.layer_attention(l).window, tokens) as u64)
        .sum();
    4 * 2 * kv_dim * batch as u64 * slots
}

/// f32 bytes live in one layer of a prefill of `tokens` positions, which runs in chunks of
/// [`crate::model::PREFILL_CHUNK`]: a chunk's rows, and their attention scores over the
/// whole context, plus `logit_rows` rows of logits (see [`forward_bytes`]).
pub fn prefill_bytes(cfg: &ModelConfig, batch: usize, tokens: usize, logit_rows: usize) -> u64 {
    layer_bytes(
        cfg,
        batch,
        tokens.min(crate::model::PREFILL_CHUNK),
        tokens,
        logit_rows,
    )
}

/// f32 bytes live in one layer of an untaped forward over `[batch, tokens]` (the residual
/// stream, its norm, q/k/v, the attention scores of one row's heads and the MLP's
/// gate/up/product), plus `logit_rows` rows of logits.
pub fn forward_bytes(cfg: &ModelConfig, batch: usize, tokens: usize, logit_rows: usize) -> u64 {
    layer_bytes(cfg, batch, tokens, tokens, logit_rows)
}

/// f32 bytes live in one layer for `rows` query rows per sequence attending over `keys`
/// positions: the rows' activations, their attention scores, `logit_rows` rows of logits.
fn layer_bytes(
    cfg: &ModelConfig,
    batch: usize,
    rows: usize,
    keys: usize,
    logit_rows: usize,
) -> u64 {
    let (b, r, k) = (batch as u64, rows as u64, keys as u64);
    let c = cfg.hidden_size as u64;
    let i = cfg.intermediate_size as u64;
    let h = cfg.num_heads as u64;
    let per_token = 6 * c + 3 * i;
    4 * (b * r * per_token + h * r * k + logit_rows as u64 * cfg.vocab_size as u64)
}

/// A trainer whose step can be measured before its run (the ELM trainer, the LoRA trainer).
pub trait StepMemory {
    /// Heap bytes one step on a batch of the run's batch size, every row as long as
    /// `longest`, would hold at its peak beyond what the trainer holds already: one sequence
    /// is run without changing the run, and its peak scaled by the batch size (every
    /// `[B, T, ·]` buffer is linear in B at a fixed T). Measured with
    /// [`crate::heap::CountingAlloc`] when it is the global allocator, else the tape's own
    /// high-water mark (a lower bound).
    fn probe_step_bytes(&self, longest: &TokenSequence, pad_id: u32) -> Result<u64>;
    /// Bytes of optimiser state still to be allocated at the first update (a fresh run).
    fn unallocated_optimizer_bytes(&self) -> u64;
    /// Bytes of the packed forms of the frozen weights the trainer's products reuse, as
    /// built so far (after a probe step: all a step builds).
    fn packed_weight_bytes(&self) -> u64;
}

/// What a [`StepMemory::probe_step_bytes`] reports for a probe `step` on one sequence that
/// returns its tape's high-water mark: the heap peak it reached (the tape's mark where
/// [`crate::heap::CountingAlloc`] does not count), times `batch_size`.
/// Frozen weights packed during the probe (the first use of each) stay held, are reported by
/// [`StepMemory::packed_weight_bytes`], and are left out of the step's peak.
pub fn scaled_step_peak(batch_size: usize, step: impl FnOnce() -> Result<usize>) -> Result<u64> {
    let packed_before = crate::gemm::frozen_packed_bytes();
    let (result, heap_peak) = crate::heap::peak_during(step);
    let tape_peak = result?;
    let packed = crate::gemm::frozen_packed_bytes().saturating_sub(packed_before);
    let one = heap_peak.map_or(tape_peak as u64, |p| (p as u64).saturating_sub(packed));
    Ok(one.saturating_mul(batch_size as u64))
}
