//! The library refuses what the CLI refuses (tests/refuse.rs fuzzes the CLI): a seeded property
//! test drives the public functions behind the fuzzed flags with the same bad values (impossible
//! layer indices and sizes, zero and overflowing counts, non-finite tolerances and timeouts,
//! prompts past the context, batches past the memory budget). Every call must return a typed
//! error — never `Ok`, never a panic.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use elm::equilibrium::infer::{ElmModel, ElmSession, InferenceConfig};
use elm::equilibrium::{ElmConfig, ElmModule};
use elm::eval::nll::{teacher_forced_nll, ScoredSequence};
use elm::eval::stats::BootstrapConfig;
use elm::eval::task::TaskOptions;
use elm::model::config::Arch;
use elm::model::generate::{generate, SamplingConfig};
use elm::solver::{SolverConfig, StopCriteria};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Sizes the CLI fuzz uses: zero, past any real model, and the overflow edge.
const HUGE: [usize; 3] = [1 << 40, usize::MAX - 1, usize::MAX];

fn pick<T: Copy>(rng: &mut StdRng, v: &[T]) -> T {
    v[rng.gen_range(0..v.len())]
}

#[test]
fn public_functions_refuse_the_cli_fuzz_values() {
    let dense = common::tiny_weights(Arch::Llama, 4, 1);
    let layers = dense.config.num_layers;
    let context = dense.config.max_position_embeddings;
    let model = ElmModel::dense(dense.clone());
    let transformer = common::tiny_transformer(Arch::Llama, 4, 1);
    let mut rng = StdRng::seed_from_u64(
        std::env::var("ELM_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(29),
    );
    let mut counts = [0usize; 7];
    for case in 0..300 {
        let kind = rng.gen_range(0..counts.len());
        counts[kind] += 1;
        let (what, outcome): (String, std::thread::Result<Result<(), elm::ElmError>>) = match kind {
            // compress/train --start/--num-replaced: an impossible window.
            0 => {
                let (start, m) = if rng.gen_bool(0.5) {
                    (pick(&mut rng, &[layers, layers + 1, HUGE[1], HUGE[2]]), 1)
                } else {
                    (0, pick(&mut rng, &[0, layers + 1, HUGE[1], HUGE[2]]))
                };
                let cfg = ElmConfig::new(start, m);
                (
                    format!("ElmModule::init(start {start}, M {m})"),
                    catch_unwind(|| ElmModule::init(&dense, &cfg).map(|_| ())),
                )
            }
            // --max-iter / --abs-tol of every solve.
            1 => {
                let (tol, max_iter) = if rng.gen_bool(0.5) {
                    (0.5, pick(&mut rng, &[0, 1_000_001, HUGE[0], HUGE[2]]))
                } else {
                    (pick(&mut rng, &[f64::NAN, -1.0, f64::INFINITY]), 16)
                };
                let cfg = InferenceConfig::new(
                    SolverConfig::anderson(),
                    StopCriteria::absolute(tol, max_iter),
                );
                (
                    format!("InferenceConfig(tol {tol}, max_iter {max_iter}).validate"),
                    catch_unwind(AssertUnwindSafe(|| cfg.validate())),
                )
            }
            // generate/eval --batch and the context: sessions past the budget or empty.
            2 => {
                let (batch, max_seq) = if rng.gen_bool(0.5) {
                    (pick(&mut rng, &[0, HUGE[0], HUGE[1]]), 16)
                } else {
                    // A session holds a context plus the slot of the last committed token.
                    (1, pick(&mut rng, &[0, context + 2, HUGE[0], HUGE[2]]))
                };
                (
                    format!("ElmSession::new(batch {batch}, max_seq {max_seq})"),
                    catch_unwind(AssertUnwindSafe(|| {
                        ElmSession::new(&model, InferenceConfig::default(), batch, max_seq)
                            .map(|_| ())
                    })),
                )
            }
            // generate --max-new-tokens and prompts: zero, past the context, empty.
            3 => {
                let (prompt_len, max_new) = match rng.gen_range(0..3) {
                    0 => (4, pick(&mut rng, &[0, context, HUGE[2]])),
                    1 => (pick(&mut rng, &[0, context + 1]), 4),
                    _ => (context, 1),
                };
                let prompts = vec![vec![3u32; prompt_len]];
                let cfg = SamplingConfig {
                    max_new_tokens: max_new,
                    ..SamplingConfig::default()
                };
                (
                    format!("generate(prompt {prompt_len} tokens, max_new_tokens {max_new})"),
                    catch_unwind(AssertUnwindSafe(|| {
                        generate(&transformer, &prompts, &cfg, None, |_, _| {}).map(|_| ())
                    })),
                )
            }
            // eval --limit/--batch/--timeout/--bootstrap.
            4 => {
                let mut opts = TaskOptions {
                    limit: None,
                    batch: 8,
                    max_new_tokens: 16,
                    inference: InferenceConfig::default(),
                    bootstrap: BootstrapConfig::default(),
                    timeout_s: 5.0,
                    run_without_sandbox: false,
                };
                let which = rng.gen_range(0..4);
                match which {
                    0 => opts.limit = Some(0),
                    1 => opts.batch = 0,
                    2 => opts.timeout_s = pick(&mut rng, &[f64::NAN, -1.0, 0.0, f64::INFINITY]),
                    _ => opts.bootstrap.resamples = 0,
                }
                (
                    format!("TaskOptions::validate (field {which})"),
                    catch_unwind(AssertUnwindSafe(|| opts.validate())),
                )
            }
            // eval --batch on the NLL path.
            5 => {
                let seqs = vec![ScoredSequence::new("0", &[3, 4], &[5, 6]).unwrap()];
                (
                    "teacher_forced_nll(batch 0)".to_string(),
                    catch_unwind(AssertUnwindSafe(|| {
                        teacher_forced_nll(&model, &InferenceConfig::default(), &seqs, 0, |_| {})
                            .map(|_| ())
                    })),
                )
            }
            // Token ids past the vocabulary (a corrupt prompt file).
            _ => {
                let bad = pick(&mut rng, &[64u32, 1 << 20, u32::MAX]);
                let prompts = vec![vec![3u32, bad]];
                let cfg = SamplingConfig {
                    max_new_tokens: 2,
                    ..SamplingConfig::default()
                };
                (
                    format!("generate(token id {bad})"),
                    catch_unwind(AssertUnwindSafe(|| {
                        generate(&transformer, &prompts, &cfg, None, |_, _| {}).map(|_| ())
                    })),
                )
            }
        };
        match outcome {
            Err(_) => panic!("case {case}: {what} panicked"),
            Ok(Ok(())) => panic!("case {case}: {what} was accepted"),
            Ok(Err(e)) => assert!(
                !e.to_string().is_empty(),
                "case {case}: {what}: empty error"
            ),
        }
    }
    assert!(
        counts.iter().all(|&c| c > 0),
        "every entry point drawn: {counts:?}"
    );
}
