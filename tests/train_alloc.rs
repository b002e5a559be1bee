//! Heap use of training steps, counted by `elm::heap::CountingAlloc` as the global allocator:
//! after warm-up, an ELM step and a LoRA step hold no more heap when they end than when they
//! began (nothing leaks or accumulates across steps: the tape, gradients and activations are
//! freed), every step allocates the same volume within 1% (no growth with the step count), and the
//! steady-state volume stays within a fixed multiple of the step's own tape high-water mark.
//! The counts are printed: they are what a per-step arena would remove (not built; see
//! issue 25's closing note).

mod common;

use elm::data::TokenSequence;
use elm::equilibrium::config::{ElmConfig, TrainConfig};
use elm::equilibrium::train::Trainer;
use elm::equilibrium::ElmModule;
use elm::grad::{DeqConfig, GradientRule};
use elm::heap::{counters, CountingAlloc};
use elm::lora::{LoraConfig, LoraTrainer};
use elm::memory::StepMemory;
use elm::model::Arch;

#[global_allocator]
static HEAP: CountingAlloc = CountingAlloc;

/// The counters are process-wide: the tests take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sequences of one length, so every batch has the same shape and every step the same work.
fn data(n: usize) -> Vec<TokenSequence> {
    (0..n)
        .map(|i| {
            let tokens: Vec<u32> = (0..12).map(|j| 3 + ((i * 7 + j * 3) % 60) as u32).collect();
            let loss_mask = (0..12).map(|j| j >= 6).collect();
            TokenSequence { tokens, loss_mask }
        })
        .collect()
}

/// `(allocations, bytes allocated, live-heap change)` of each of `n` calls of `step`.
fn per_step(n: usize, mut step: impl FnMut()) -> Vec<(usize, usize, isize)> {
    (0..n)
        .map(|_| {
            let before = counters().expect("CountingAlloc is the global allocator");
            step();
            let after = counters().unwrap();
            (
                after.allocations - before.allocations,
                after.allocated_bytes - before.allocated_bytes,
                after.live_bytes as isize - before.live_bytes as isize,
            )
        })
        .collect()
}

fn check(what: &str, steps: &[(usize, usize, isize)], tape_peak: usize) {
    println!("{what}: per step (allocations, bytes, live change) {steps:?}; tape peak {tape_peak}");
    let (a0, b0, _) = steps[0];
    // Nothing a step allocates is kept (the optimiser's moments exist after warm-up): the
    // live heap ends where it began, up to rayon's own bookkeeping (a worker's job queue may
    // grow once, a few KiB, on whichever step first needs it).
    let kept: isize = steps.iter().map(|s| s.2).sum();
    assert!(
        kept.unsigned_abs() <= 64 << 10,
        "{what}: the live heap grew by {kept} bytes over {} steps",
        steps.len()
    );
    for &(a, b, _) in steps {
        // The same work allocates the same, up to that bookkeeping: no growth across steps.
        let close = |x: usize, y: usize| x.abs_diff(y) * 100 <= y;
        assert!(close(a, a0) && close(b, b0), "{what}: {steps:?}");
    }
    // Everything a step allocates is a small multiple of what its tape holds at once.
    assert!(
        b0 <= 8 * tape_peak.max(1),
        "{what}: {b0} bytes allocated per step, tape peak {tape_peak}"
    );
}

#[test]
fn an_elm_training_step_frees_everything_it_allocates_and_allocates_the_same_each_time() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    elm::model::ops::set_blas_threads(1);
    let w = common::tiny_weights(Arch::Llama, 5, 3);
    let ec = ElmConfig::new(1, 3);
    let module = ElmModule::init(&w, &ec).unwrap();
    let train = data(8);
    let cfg = TrainConfig {
        steps: 40,
        batch_size: 2,
        seq_len: 16,
        // CE from the start, a fixed number of iterations: every step does the same work.
        lambda: serde_json::from_str(r#"{"ce_start": 0.0, "ce_end": 0.0}"#).unwrap(),
        deq: Some(DeqConfig::new(GradientRule::Unroll { k: 3 })),
        ..TrainConfig::default()
    };
    let mut t = Trainer::new(&w, ec, &module, cfg, "tiny".into()).unwrap();
    for _ in 0..3 {
        t.train_step(&train, 0).unwrap();
    }
    // The step log is the one thing a run keeps per step: room for it up front.
    t.history.reserve(16);
    let steps = per_step(5, || {
        t.train_step(&train, 0).unwrap();
    });
    let tape_peak = t.probe_step_bytes(&train[0], 0).unwrap() as usize;
    check("ELM step", &steps, tape_peak);
}

#[test]
fn a_lora_step_frees_everything_it_allocates_and_allocates_the_same_each_time() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    elm::model::ops::set_blas_threads(1);
    let w = common::tiny_weights(Arch::Llama, 3, 4);
    let cfg = LoraConfig {
        steps: 40,
        seq_len: 16,
        ..LoraConfig::default()
    };
    let mut t = LoraTrainer::new(&w, cfg, "tiny".into()).unwrap();
    let train = data(8);
    for _ in 0..3 {
        t.train_step(&train, 0).unwrap();
    }
    t.history.reserve(16);
    // The step log is the one thing a run keeps per step: room for it up front.
    t.history.reserve(16);
    let steps = per_step(5, || {
        t.train_step(&train, 0).unwrap();
    });
    let tape_peak = t.probe_step_bytes(&train[0], 0).unwrap() as usize;
    check("LoRA step", &steps, tape_peak);
}
