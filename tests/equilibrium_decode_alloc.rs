//! The ELM decode session reuses every buffer of its fixed-point solve: heap allocations per
//! decoded token (counted by a global allocator) are those of the dense decode path that
//! both share (token ids, embedding, the returned logits), whatever the solver and however
//! many iterations it takes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use elm::equilibrium::infer::{ElmModel, ElmSession, InferenceConfig, KvMode};
use elm::equilibrium::{ElmConfig, ElmModule};
use elm::model::{Arch, ModelConfig, ModelWeights};
use elm::solver::{SolverConfig, StopCriteria};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Allocations per decoded token after warm-up, and block evaluations per token.
fn per_token(model: &ElmModel, solver: SolverConfig, tol: f64, batch: usize) -> (f64, f64) {
    let cfg = InferenceConfig {
        solver,
        stop: StopCriteria::absolute(tol, 40),
        kv_mode: KvMode::OneStep,
        adaptive_prefill: true,
        ..InferenceConfig::default()
    };
    let mut s = ElmSession::new(model, cfg, batch, 96).unwrap();
    let prompts: Vec<Vec<u32>> = (0..batch as u32).map(|b| vec![3 + b, 5, 7, 9]).collect();
    s.prefill(&prompts).unwrap();
    let step = |s: &mut ElmSession, t: u32| {
        let toks: Vec<u32> = (0..batch as u32).map(|b| 10 + (t + b) % 50).collect();
        s.decode_step(&toks).unwrap();
    };
    for t in 0..4 {
        step(&mut s, t);
    }
    let n = 32;
    let before_stats = s.decode_stats.len();
    let a0 = ALLOCS.load(Ordering::Relaxed);
    for t in 0..n {
        step(&mut s, 4 + t);
    }
    let allocs = (ALLOCS.load(Ordering::Relaxed) - a0) as f64 / n as f64;
    let evals: usize = s.decode_stats[before_stats..]
        .iter()
        .map(|st| st.iterations)
        .sum();
    (allocs, evals as f64 / (n as usize * batch) as f64)
}

#[test]
fn elm_decode_allocates_no_more_than_dense_decode() {
    for arch in [Arch::Llama, Arch::Qwen2] {
        let mut cfg = ModelConfig::tiny(arch);
        cfg.num_layers = 5;
        let w = ModelWeights::random(&cfg, 11);
        let ec = ElmConfig::new(1, 3);
        let module = ElmModule::init(&w, &ec).unwrap();
        let dense = ElmModel::dense(w.clone());
        let elm = ElmModel::new(w, ec, module).unwrap();
        for batch in [1, 3] {
            let (dense_allocs, _) = per_token(&dense, SolverConfig::picard(), 1e-3, batch);
            for solver in [
                SolverConfig::picard(),
                SolverConfig::anderson(),
                SolverConfig::broyden(),
            ] {
                let mut seen = vec![];
                for tol in [1e-1, 1e-4] {
                    let (allocs, evals) = per_token(&elm, solver.clone(), tol, batch);
                    // The decode statistics vector grows by doubling: < 1 allocation per token.
                    assert!(
                        allocs < dense_allocs + 1.0,
                        "{arch:?} batch {batch} {} δ={tol}: {allocs} allocations per token \
                         ({evals} block evaluations) vs the dense decode's {dense_allocs}",
                        solver.name()
                    );
                    seen.push(evals);
                }
                // The tighter tolerance took more iterations, at the same allocation count.
                assert!(seen[1] > seen[0], "{arch:?} {}: {seen:?}", solver.name());
            }
        }
    }
}
