//! The f32 GEMM on the shapes an ELM training step and prefill run (SmolLM2-135M, 256 tokens),
//! our AVX-512 kernel against the linked BLAS in the same run, with the measured FMA peak:
//! GFLOP/s and fraction of peak per shape, as JSON.
//! `cargo run --release --example gemm_bench -- [--reps N] [--only TEXT]` (`--only`: the shapes
//! whose name contains TEXT, e.g. `head`).
#[path = "support/args.rs"]
mod args;

use std::time::Instant;

use elm::gemm::{has_avx512_bf16, peak_fma_gflops_per_core, sgemm_with, GemmKernel};
use ndarray::Array2;
use rand::{rngs::StdRng, Rng, SeedableRng};

fn main() -> elm::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args::flag(&args, "--reps", 10)?;
    // Empty: every shape (every name contains "").
    let only: String = args::flag(&args, "--only", String::new())?;
    // BLAS keeps its own threads here (one per core unless OPENBLAS_NUM_THREADS says).
    let threads = rayon::current_num_threads();
    let peak = peak_fma_gflops_per_core() * threads as f64;
    let mut rng = StdRng::seed_from_u64(0);
    // (name, M, K, N, B transposed): y = x·Wᵀ, dx = g·W, dW = gᵀ·x of a [256, 576] x [1536, 576] layer.
    let shapes = [
        ("x·Wᵀ qkv/o [256,576]x[576,576]", 256, 576, 576, true),
        ("x·Wᵀ up/gate [256,576]x[576,1536]", 256, 576, 1536, true),
        ("x·Wᵀ down [256,1536]x[1536,576]", 256, 1536, 576, true),
        ("g·W dx up [256,1536]x[1536,576]", 256, 1536, 576, false),
        ("gᵀ·x dW up [1536,256]x[256,576]", 1536, 256, 576, false),
        ("head [75,576]x[576,49152]", 75, 576, 49152, true),
    ];
    let mut rows = vec![];
    for (name, m, k, n, bt) in shapes {
        if !name.contains(only.as_str()) {
            continue;
        }
        let a = Array2::from_shape_fn((m, k), |_| rng.gen_range(-1.0f32..1.0));
        let b_store = if bt {
            Array2::from_shape_fn((n, k), |_| rng.gen_range(-1.0f32..1.0))
        } else {
            Array2::from_shape_fn((k, n), |_| rng.gen_range(-1.0f32..1.0))
        };
        let b = if bt { b_store.t() } else { b_store.view() };
        let mut c = Array2::<f32>::zeros((m, n));
        // Warm-up for 100 ms (threads woken, clocks up), then at least `reps` calls and at
        // least 300 ms: a few-millisecond window is at the mercy of the VM's scheduling.
        let mut time = |kernel| {
            let mut run = || sgemm_with(kernel, 1.0, &a.view(), &b, 0.0, &mut c.view_mut());
            let warm = Instant::now();
            while warm.elapsed().as_secs_f64() < 0.1 {
                run();
            }
            let t = Instant::now();
            let mut calls = 0;
            while calls < reps || t.elapsed().as_secs_f64() < 0.3 {
                run();
                calls += 1;
            }
            (2 * m * n * k * calls) as f64 / t.elapsed().as_secs_f64() / 1e9
        };
        // OpenBLAS's idle threads keep spinning for a while after a call and would take a
        // core from the next kernel's threads: ours run first, and every kernel starts after
        // a pause long enough for both thread pools to go to sleep.
        let mut timed = |kernel| {
            std::thread::sleep(std::time::Duration::from_millis(300));
            time(kernel)
        };
        let ours = timed(GemmKernel::Avx512);
        // bf16 dot products do two multiply-adds per f32 lane: its peak is twice the FMA one.
        let bf16 = has_avx512_bf16().then(|| timed(GemmKernel::Avx512Bf16));
        let blas = timed(GemmKernel::Blas);
        // B a weight registered as frozen (packed once, as for training's frozen layers and in
        // evaluation); the dW product's B is an activation, never frozen.
        let weight = !name.starts_with("gᵀ·x");
        let (frozen_f32, frozen_bf16) = if weight {
            let mut frozen = elm::gemm::FrozenWeights::new();
            frozen.borrow(&b_store);
            let f32 = timed(GemmKernel::Avx512);
            let bf16 = has_avx512_bf16().then(|| timed(GemmKernel::Avx512Bf16));
            (Some(f32), bf16)
        } else {
            (None, None)
        };
        rows.push(serde_json::json!({
            "shape": name, "blas_gflop_s": blas, "avx512_gflop_s": ours,
            "ratio": ours / blas, "avx512_fraction_of_peak": ours / peak,
            "avx512_bf16_gflop_s": bf16,
            "bf16_fraction_of_bf16_peak": bf16.map(|g| g / (2.0 * peak)),
            "avx512_frozen_b_gflop_s": frozen_f32,
            "avx512_frozen_b_fraction_of_peak": frozen_f32.map(|g| g / peak),
            "avx512_bf16_frozen_b_gflop_s": frozen_bf16,
            "bf16_frozen_b_fraction_of_bf16_peak": frozen_bf16.map(|g| g / (2.0 * peak)),
        }));
    }
    println!(
        "{}",
        serde_json::json!({"threads": threads, "peak_fma_gflop_s": peak, "shapes": rows})
    );
    Ok(())
}
