//! CUDA backend tests.
//!
//! Always run (no GPU needed): driver probing never panics and yields typed errors, the kernel
//! sources are embedded, NVRTC compiles every kernel (when libnvrtc is loadable), and the stub
//! build returns the "built without the `cuda` feature" error.
//!
//! GPU tests (every kernel vs a CPU reference written here; tiny random Llama/Qwen2 and SmolLM2
//! logits GPU vs CPU; greedy continuations) run when `is_available()`; otherwise they print a
//! `skipped <test>` line and return. The SmolLM2 ones also need the real model
//! (`common::real_model`).

mod common;

use elm::cuda::{self, AttnHeads, CudaModel, GpuDevice, GpuKernels, GpuModel};
use elm::model::{Arch, ModelConfig, ModelWeights};
use elm::ElmError;
use ndarray::{Array1, Array2};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// Seeded random weights with O(1) activations (1/sqrt(fan_in) scaling), so logits are spread
/// out and greedy choices are not near-ties.
fn fan_in_scaled_weights(cfg: &ModelConfig, seed: u64) -> ModelWeights {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut mat = |r: usize, c: usize| {
        let s = 1.0 / (c as f32).sqrt();
        Array2::from_shape_simple_fn((r, c), || rng.gen_range(-1.0f32..1.0) * s * 1.7)
    };
    let (c, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    let (hd, kvd) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let embed = mat(v, c) * (c as f32).sqrt();
    let mut layers = Vec::new();
    for _ in 0..cfg.num_layers {
        let vec = |m: Array2<f32>| {
            let n = m.len();
            m.into_shape_with_order(n).unwrap()
        };
        let wq = mat(hd, c);
        let wk = mat(kvd, c);
        let wv = mat(kvd, c);
        let wo = mat(c, hd);
        let bias = cfg.attention_bias;
        let bq = bias.then(|| vec(mat(1, hd)));
        let bk = bias.then(|| vec(mat(1, kvd)));
        let bv = bias.then(|| vec(mat(1, kvd)));
        let attn_norm = vec(mat(1, c)).mapv(|x| 1.0 + x * 0.3);
        let mlp_norm = vec(mat(1, c)).mapv(|x| 1.0 + x * 0.3);
        layers.push(elm::model::LayerWeights {
            attn_norm,
            wq,
            wk,
            wv,
            wo,
            bq,
            bk,
            bv,
            mlp_norm,
            w_gate: mat(i, c),
            w_up: mat(i, c),
            w_down: mat(c, i),
            gemma: None,
        });
    }
    let final_norm = Array1::from_elem(c, 1.0f32);
    let lm_head = (!cfg.tie_word_embeddings).then(|| mat(v, c));
    ModelWeights {
        config: cfg.clone(),
        embed,
        layers,
        final_norm,
        lm_head,
    }
}

fn random_vec(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Max abs diff and that diff relative to max |reference|; prints both, asserts rel < tol.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length mismatch");
    let mut max_abs = 0.0f64;
    let mut max_ref = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "{what}: non-finite output {g}");
        max_abs = max_abs.max((g as f64 - w as f64).abs());
        max_ref = max_ref.max((w as f64).abs());
    }
    let rel = max_abs / max_ref.max(1e-30);
    eprintln!("{what}: max abs diff {max_abs:.3e}, rel (to max |ref|) {rel:.3e}");
    assert!(
        rel < tol,
        "{what}: max abs diff {max_abs:.3e}, rel {rel:.3e} >= tol {tol:.1e}"
    );
}

/// Whether a `libcuda` file is visible in the usual library directories or LD_LIBRARY_PATH
/// (independent of the backend's own probe).
fn libcuda_visible() -> bool {
    let mut dirs: Vec<std::path::PathBuf> = [
        "/usr/lib",
        "/usr/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/lib64/stubs",
        "/usr/lib/wsl/lib",
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/lib",
    ]
    .iter()
    .map(std::path::PathBuf::from)
    .collect();
    if let Ok(p) = std::env::var("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    dirs.iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("libcuda.so"))
        })
    })
}

// ---------------------------------------------------------------------------------------------
// Always-run tests
// ---------------------------------------------------------------------------------------------

#[test]
fn is_available_never_panics_and_agrees_with_device_count() {
    let avail = cuda::is_available();
    let count = cuda::device_count();
    eprintln!("is_available = {avail}, device_count = {count:?}");
    assert_eq!(avail, matches!(count, Ok(n) if n > 0));
    if !cuda::ENABLED || !libcuda_visible() {
        assert!(
            !avail,
            "no libcuda visible / stub build, yet is_available() is true"
        );
        match count {
            Err(ElmError::Cuda(_)) => {}
            other => panic!("expected ElmError::Cuda, got {other:?}"),
        }
    }
}

#[test]
fn cuda_model_new_without_gpu_is_a_typed_error() {
    if !common::optional(
        "a machine without a GPU",
        !cuda::is_available(),
        "a GPU is present",
    ) {
        return;
    }
    let w = fan_in_scaled_weights(&ModelConfig::tiny(Arch::Llama), 1);
    let err = CudaModel::new(&w, 0, 2, 16).expect_err("no GPU, yet CudaModel::new succeeded");
    let msg = match &err {
        ElmError::Cuda(m) => m.clone(),
        other => panic!("expected ElmError::Cuda, got {other:?}"),
    };
    eprintln!("CudaModel::new error: {err}");
    if !cuda::ENABLED {
        assert!(msg.contains("built without the `cuda` feature"), "{msg}");
    } else if !libcuda_visible() {
        assert!(msg.contains("no CUDA driver"), "{msg}");
    }
    // The device handle and the benchmark fail the same way.
    assert!(matches!(cuda::CudaDevice::new(0), Err(ElmError::Cuda(_))));
    let spec = cuda::bench::BenchSpec {
        label: "tiny".into(),
        ordinal: 0,
        prefill_len: 4,
        decode_prompt_len: 4,
        decode_steps: 2,
        decode_batches: vec![1],
        prefill_reps: 1,
        tf32: false,
        seed: 0,
    };
    assert!(matches!(
        cuda::bench::run_bench(&w, &spec),
        Err(ElmError::Cuda(_))
    ));
}

/// Bad weights / sizes are reported as typed errors before any device work (so also here).
#[cfg(feature = "cuda")]
#[test]
fn cuda_model_new_rejects_bad_weights_and_sizes() {
    let good = fan_in_scaled_weights(&ModelConfig::tiny(Arch::Qwen2), 3);
    let mut bad = good.clone();
    bad.layers[1].wq = Array2::zeros((5, 7));
    match CudaModel::new(&bad, 0, 1, 8) {
        Err(ElmError::Tensor { name, msg }) => {
            assert_eq!(name, "layers.1.wq");
            assert!(msg.contains("config requires (32, 32)"), "{msg}");
        }
        other => panic!("expected a Tensor error, got {other:?}"),
    }
    let mut bad = good.clone();
    bad.layers[0].bk = Some(Array1::zeros(3));
    assert!(matches!(
        CudaModel::new(&bad, 0, 1, 8),
        Err(ElmError::Tensor { name, .. }) if name == "layers.0.bk"
    ));
    let mut bad = good.clone();
    bad.layers.pop();
    assert!(matches!(
        CudaModel::new(&bad, 0, 1, 8),
        Err(ElmError::Config { field, .. }) if field == "num_layers"
    ));
    // A Gemma 3 layer without its q/k norms and post-norms is refused, not run as a Llama block.
    let mut gemma = ModelWeights::random(&ModelConfig::tiny(Arch::Gemma3), 3);
    gemma.layers[1].gemma = None;
    assert!(matches!(
        CudaModel::new(&gemma, 0, 1, 8),
        Err(ElmError::Tensor { name, .. }) if name == "layers.1.attn_q_norm"
    ));
    assert!(matches!(
        CudaModel::new(&good, 0, 0, 8),
        Err(ElmError::InvalidArgument(_))
    ));
    assert!(matches!(
        CudaModel::new(&good, 0, 1, 1_000_000),
        Err(ElmError::InvalidArgument(m)) if m.contains("max_seq")
    ));
}

#[test]
fn cuda_types_are_send() {
    fn send<T: Send>() {}
    send::<CudaModel>();
    send::<cuda::CudaDevice>();
    send::<cuda::GpuBuffer<f32>>();
}

#[test]
fn kernel_sources_are_embedded_and_match_kernels_dir() {
    use cuda::{Kernel, KernelFile};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    assert!(!KernelFile::ALL.is_empty());
    for file in KernelFile::ALL {
        let source = file.source();
        assert!(!source.trim().is_empty(), "{file} is empty");
        assert!(!source.contains("#include"), "{file} has an #include");
        assert!(file.kernels().count() > 0, "{file} defines no kernel");
        for k in file.kernels() {
            let decl = format!("void {k}(");
            assert!(
                source.contains(&decl) && source.contains("extern \"C\" __global__"),
                "{file}: kernel {k} not defined as extern \"C\" __global__"
            );
            assert_eq!(k.file(), file);
        }
        // Embedded = the shared header, a newline, then the file (see src/cuda/sources.rs).
        let common = std::fs::read_to_string(dir.join("common.cuh")).unwrap();
        let on_disk = std::fs::read_to_string(dir.join(file.name())).unwrap();
        assert_eq!(
            format!("{common}\n{on_disk}"),
            source,
            "{file}: embedded text differs from kernels/common.cuh + the file on disk"
        );
    }
    // Every kernel is defined by its file, and every file is in the list.
    for k in Kernel::ALL {
        assert!(KernelFile::ALL.contains(&k.file()), "{k}");
        assert!(k.file().kernels().any(|x| x == k), "{k}");
    }
    // Every .cu file in kernels/ is embedded.
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".cu") {
            assert!(
                KernelFile::ALL.iter().any(|f| f.name() == name),
                "kernels/{name} is not embedded"
            );
        }
    }
    // Every `extern "C" __global__` function of a file is a listed kernel.
    for file in KernelFile::ALL {
        let src = file.source();
        for (i, _) in src.match_indices("__global__") {
            let rest = &src[i..];
            let name = rest
                .split('(')
                .next()
                .and_then(|head| head.split_whitespace().last())
                .unwrap();
            assert!(
                file.kernels().any(|k| k.name() == name),
                "{file}: kernel {name} is not in cuda::Kernel"
            );
        }
    }
}

#[test]
fn kernel_registry_round_trips_names() {
    use cuda::{Kernel, KernelFile};
    use elm::registry::Registry;
    for k in Kernel::ALL {
        assert_eq!(Kernel::from_name(k.name()), Some(k));
        assert_eq!(k.to_string(), k.name());
    }
    for f in KernelFile::ALL {
        assert_eq!(KernelFile::from_name(f.name()), Some(f));
        assert_eq!(f.to_string(), f.name());
    }
    let names = Kernel::names();
    let unique: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "kernel names are unique");
}

#[test]
fn nvrtc_compiles_every_kernel() {
    match cuda::compile_all_kernels() {
        Ok(n) => {
            assert_eq!(n, cuda::KernelFile::ALL.len());
            eprintln!("NVRTC compiled {n} kernel files");
        }
        Err(ElmError::Cuda(m)) if !cuda::ENABLED => {
            assert!(m.contains("built without the `cuda` feature"), "{m}");
        }
        Err(ElmError::Cuda(m)) if m.contains("libnvrtc.so) not found") => {
            common::optional("NVRTC", false, m);
        }
        Err(e) => panic!("NVRTC failed: {e}"),
    }
}

#[test]
fn device_spec_parses_cpu_cuda_and_ordinals() {
    use cuda::DeviceSpec;
    assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
    assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
    assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
    for bad in ["gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA:1", ""] {
        match bad.parse::<DeviceSpec>() {
            Err(ElmError::Config { field, msg }) => {
                assert_eq!(field, "device");
                assert!(msg.contains(bad), "{msg}");
            }
            other => panic!("`{bad}`: expected a Config error, got {other:?}"),
        }
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn stub_returns_built_without_feature_errors() {
    let want = "built without the `cuda` feature";
    let check = |what: &str, e: ElmError| match e {
        ElmError::Cuda(m) => assert!(m.contains(want), "{what}: {m}"),
        other => panic!("{what}: expected ElmError::Cuda, got {other:?}"),
    };
    assert!(!cuda::is_available());
    check("device_count", cuda::device_count().unwrap_err());
    check("CudaDevice::new", cuda::CudaDevice::new(0).unwrap_err());
    check(
        "compile_all_kernels",
        cuda::compile_all_kernels().unwrap_err(),
    );
    let w = fan_in_scaled_weights(&ModelConfig::tiny(Arch::Qwen2), 2);
    check("CudaModel::new", CudaModel::new(&w, 0, 1, 8).unwrap_err());
}

// ---------------------------------------------------------------------------------------------
// CPU references
// ---------------------------------------------------------------------------------------------

fn rmsnorm_ref(x: &[f32], w: &[f32], rows: usize, eps: f32) -> Vec<f32> {
    let cols = w.len();
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for c in 0..cols {
            out[r * cols + c] = (row[c] as f64 * inv * w[c] as f64) as f32;
        }
    }
    out
}

/// RoPE on `[rows, heads, d]`, angles in f64.
fn rope_ref(
    x: &[f32],
    pos: &[u32],
    heads: usize,
    d: usize,
    theta: f32,
    interleaved: bool,
) -> Vec<f32> {
    let mut out = x.to_vec();
    let half = d / 2;
    for (r, &p) in pos.iter().enumerate() {
        for h in 0..heads {
            let base = (r * heads + h) * d;
            for i in 0..half {
                let inv = 1.0 / (theta as f64).powf(2.0 * i as f64 / d as f64);
                let (s, c) = (p as f64 * inv).sin_cos();
                let (a, b) = if interleaved {
                    (base + 2 * i, base + 2 * i + 1)
                } else {
                    (base + i, base + i + half)
                };
                let (x1, x2) = (x[a] as f64, x[b] as f64);
                out[a] = (x1 * c - x2 * s) as f32;
                out[b] = (x2 * c + x1 * s) as f32;
            }
        }
    }
    out
}

/// Causal GQA attention for one query row: `q [H, D]`, keys/values as closures `(j, kv_head) -> &[f32; D]`.
fn attend_ref<'a>(
    q: &[f32],
    len: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    key: impl Fn(usize, usize) -> &'a [f32],
    val: impl Fn(usize, usize) -> &'a [f32],
) -> Vec<f32> {
    let mut out = vec![0.0f32; heads * d];
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    for h in 0..heads {
        let g = h / group;
        let qh = &q[h * d..(h + 1) * d];
        let scores: Vec<f64> = (0..len)
            .map(|j| {
                key(j, g)
                    .iter()
                    .zip(qh)
                    .map(|(&k, &q)| k as f64 * q as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for dd in 0..d {
            let acc: f64 = (0..len).map(|j| e[j] * val(j, g)[dd] as f64).sum();
            out[h * d + dd] = (acc / z) as f32;
        }
    }
    out
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn rmsnorm_rows(x: &Array2<f32>, w: &Array1<f32>, eps: f32) -> Array2<f32> {
    let (rows, _) = x.dim();
    let v = rmsnorm_ref(
        x.as_standard_layout().as_slice().unwrap(),
        w.as_slice().unwrap(),
        rows,
        eps,
    );
    Array2::from_shape_vec(x.dim(), v).unwrap()
}

/// Plain CPU Llama/Qwen2 forward of one full sequence (no cache); logits at the last position.
fn cpu_last_logits(w: &ModelWeights, tokens: &[u32]) -> Vec<f32> {
    let cfg = &w.config;
    let (t, c) = (tokens.len(), cfg.hidden_size);
    let (h, kv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let mut x = Array2::<f32>::zeros((t, c));
    for (i, &tok) in tokens.iter().enumerate() {
        x.row_mut(i).assign(&w.embed.row(tok as usize));
    }
    let pos: Vec<u32> = (0..t as u32).collect();
    for lw in &w.layers {
        let xn = rmsnorm_rows(&x, &lw.attn_norm, cfg.rms_norm_eps);
        let proj = |wm: &Array2<f32>, b: &Option<Array1<f32>>| {
            let mut y = xn.dot(&wm.t());
            if let Some(b) = b {
                y += b;
            }
            y.as_standard_layout().into_owned()
        };
        let q = proj(&lw.wq, &lw.bq);
        let k = proj(&lw.wk, &lw.bk);
        let v = proj(&lw.wv, &lw.bv);
        let q = rope_ref(q.as_slice().unwrap(), &pos, h, d, cfg.rope_theta, false);
        let k = rope_ref(k.as_slice().unwrap(), &pos, kv, d, cfg.rope_theta, false);
        let v = v.as_slice().unwrap();
        let mut attn = Array2::<f32>::zeros((t, h * d));
        for i in 0..t {
            let o = attend_ref(
                &q[i * h * d..(i + 1) * h * d],
                i + 1,
                h,
                kv,
                d,
                |j, g| &k[(j * kv + g) * d..(j * kv + g + 1) * d],
                |j, g| &v[(j * kv + g) * d..(j * kv + g + 1) * d],
            );
            attn.row_mut(i).assign(&Array1::from(o));
        }
        x = x + attn.dot(&lw.wo.t());
        let xn = rmsnorm_rows(&x, &lw.mlp_norm, cfg.rms_norm_eps);
        let gate = xn.dot(&lw.w_gate.t());
        let up = xn.dot(&lw.w_up.t());
        let act = ndarray::Zip::from(&gate)
            .and(&up)
            .map_collect(|&g, &u| silu(g) * u);
        x = x + act.dot(&lw.w_down.t());
    }
    let last = x.row(t - 1).to_owned().insert_axis(ndarray::Axis(0));
    let last = rmsnorm_rows(&last, &w.final_norm, cfg.rms_norm_eps);
    last.dot(&w.lm_head().t()).into_raw_vec_and_offset().0
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// A tiny model from tests/fixtures/cuda/tiny_models.json (written by tests/fixtures/gen/ref_cuda_tiny.py)
/// with its float64 numpy logits `[prompt][step][V]` and greedy continuations `[prompt][step]`.
struct FixtureModel {
    weights: ModelWeights,
    logits: Vec<Vec<Vec<f32>>>,
    greedy: Vec<Vec<u32>>,
}

fn load_fixture() -> (Vec<Vec<u32>>, Vec<FixtureModel>) {
    use serde_json::Value;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cuda/tiny_models.json");
    let root: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let v1 = |v: &Value| -> Array1<f32> {
        Array1::from(serde_json::from_value::<Vec<f32>>(v.clone()).unwrap())
    };
    let v2 = |v: &Value| -> Array2<f32> {
        let rows: Vec<Vec<f32>> = serde_json::from_value(v.clone()).unwrap();
        let (r, c) = (rows.len(), rows[0].len());
        Array2::from_shape_vec((r, c), rows.concat()).unwrap()
    };
    let opt1 = |v: &Value| (!v.is_null()).then(|| v1(v));
    let prompts: Vec<Vec<u32>> = serde_json::from_value(root["prompts"].clone()).unwrap();
    let models = root["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let config: ModelConfig = serde_json::from_value(m["config"].clone()).unwrap();
            let w = &m["weights"];
            let layers = w["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| elm::model::LayerWeights {
                    attn_norm: v1(&l["attn_norm"]),
                    wq: v2(&l["wq"]),
                    wk: v2(&l["wk"]),
                    wv: v2(&l["wv"]),
                    wo: v2(&l["wo"]),
                    bq: opt1(&l["bq"]),
                    bk: opt1(&l["bk"]),
                    bv: opt1(&l["bv"]),
                    mlp_norm: v1(&l["mlp_norm"]),
                    w_gate: v2(&l["w_gate"]),
                    w_up: v2(&l["w_up"]),
                    w_down: v2(&l["w_down"]),
                    gemma: None,
                })
                .collect();
            let weights = ModelWeights {
                config,
                embed: v2(&w["embed"]),
                layers,
                final_norm: v1(&w["final_norm"]),
                lm_head: (!w["lm_head"].is_null()).then(|| v2(&w["lm_head"])),
            };
            FixtureModel {
                weights,
                logits: serde_json::from_value(m["logits"].clone()).unwrap(),
                greedy: serde_json::from_value(m["greedy"].clone()).unwrap(),
            }
        })
        .collect();
    (prompts, models)
}

/// The CPU reference used by the GPU tests is itself checked against an independent numpy
/// float64 forward (tests/fixtures/gen/ref_cuda_tiny.py).
#[test]
fn cpu_reference_matches_numpy_fixture() {
    let (prompts, models) = load_fixture();
    for m in &models {
        let arch = m.weights.config.arch;
        for (b, prompt) in prompts.iter().enumerate() {
            let mut seq = prompt.clone();
            for (step, want) in m.logits[b].iter().enumerate() {
                let got = cpu_last_logits(&m.weights, &seq);
                assert_close(
                    &format!("cpu ref {arch:?} prompt {b} step {step}"),
                    &got,
                    want,
                    1e-5,
                );
                if step < m.greedy[b].len() {
                    assert_eq!(
                        argmax(&got),
                        m.greedy[b][step],
                        "{arch:?} prompt {b} step {step}"
                    );
                    seq.push(m.greedy[b][step]);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GPU tests (skip without a device)
// ---------------------------------------------------------------------------------------------

fn gpu() -> Option<cuda::CudaDevice> {
    if !cuda::is_available() {
        let why = match cuda::device_count() {
            Err(e) => e.to_string(),
            Ok(n) => format!("{n} devices"),
        };
        common::optional("a CUDA device", false, why);
        return None;
    }
    Some(cuda::CudaDevice::new(0).expect("CudaDevice::new(0)"))
}

#[test]
fn gpu_rmsnorm_rope_swiglu_add_bias_embedding_match_cpu() {
    let Some(dev) = gpu() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(10);

    // RMSNorm: 7 rows x 300 cols (not a multiple of the block size).
    let (rows, cols) = (7, 300);
    let x = random_vec(&mut rng, rows * cols);
    let w = random_vec(&mut rng, cols);
    let (xd, wd) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap());
    let mut out = dev.zeros::<f32>(rows * cols).unwrap();
    dev.rmsnorm(&xd, &wd, &mut out, rows, 1e-5).unwrap();
    assert_close(
        "rmsnorm",
        &dev.download(&out).unwrap(),
        &rmsnorm_ref(&x, &w, rows, 1e-5),
        1e-5,
    );

    // RoPE both layouts, positions up to ~900 (angles are computed in double on the device).
    let (heads, d) = (3, 16);
    let pos: Vec<u32> = (0..rows as u32).map(|r| r * 150 + 1).collect();
    let xr = random_vec(&mut rng, rows * heads * d);
    let pos_d = dev.upload(&pos).unwrap();
    for (style, inter) in [
        (cuda::RopeStyle::HalfSplit, false),
        (cuda::RopeStyle::Interleaved, true),
    ] {
        let mut xd = dev.upload(&xr).unwrap();
        dev.rope(&mut xd, &pos_d, rows, heads, d, 10000.0, style)
            .unwrap();
        assert_close(
            &format!("rope {style:?}"),
            &dev.download(&xd).unwrap(),
            &rope_ref(&xr, &pos, heads, d, 10000.0, inter),
            1e-5,
        );
    }

    // SwiGLU, residual add, bias add.
    let n = 1000;
    let (g, u) = (random_vec(&mut rng, n), random_vec(&mut rng, n));
    let (gd, ud) = (dev.upload(&g).unwrap(), dev.upload(&u).unwrap());
    let mut od = dev.zeros::<f32>(n).unwrap();
    dev.swiglu(&gd, &ud, &mut od).unwrap();
    let want: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| silu(a) * b).collect();
    assert_close("swiglu", &dev.download(&od).unwrap(), &want, 1e-5);

    let mut xd = dev.upload(&g).unwrap();
    dev.add(&mut xd, &ud).unwrap();
    let want: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| a + b).collect();
    assert_close("add", &dev.download(&xd).unwrap(), &want, 1e-6);

    let (br, bc) = (10, 100);
    let bias = random_vec(&mut rng, bc);
    let mut xd = dev.upload(&g).unwrap();
    dev.add_bias(&mut xd, &dev.upload(&bias).unwrap(), br)
        .unwrap();
    let want: Vec<f32> = (0..br * bc).map(|i| g[i] + bias[i % bc]).collect();
    assert_close("add_bias", &dev.download(&xd).unwrap(), &want, 1e-6);

    // Embedding gather (+ out-of-range token is a typed error, not a device fault).
    let (vocab, dim) = (50, 24);
    let table = random_vec(&mut rng, vocab * dim);
    let td = dev.upload(&table).unwrap();
    let toks = [3u32, 0, 49, 3, 17];
    let mut ed = dev.zeros::<f32>(toks.len() * dim).unwrap();
    dev.embedding(&td, dim, &toks, &mut ed).unwrap();
    let want: Vec<f32> = toks
        .iter()
        .flat_map(|&t| table[t as usize * dim..(t as usize + 1) * dim].to_vec())
        .collect();
    assert_close("embedding", &dev.download(&ed).unwrap(), &want, 1e-12);
    assert!(matches!(
        dev.embedding(&td, dim, &[50], &mut dev.zeros::<f32>(dim).unwrap()),
        Err(ElmError::InvalidArgument(_))
    ));
}

/// Runs without a GPU: the head layout's widths, and a typed error (naming the kernel) for K/V
/// heads that do not divide the query heads, before anything reaches a device.
#[test]
fn attention_heads_widths_and_grouping_check() {
    let gqa = AttnHeads {
        n_heads: 4,
        n_kv_heads: 1,
        head_dim: 256,
    };
    assert_eq!((gqa.q_width(), gqa.kv_width()), (1024, 256));
    assert!(gqa.check("attention_prefill").is_ok());
    for n_kv_heads in [0, 3] {
        let bad = AttnHeads { n_kv_heads, ..gqa };
        let msg = bad.check("attention_decode").unwrap_err().to_string();
        assert!(
            msg.contains("attention_decode") && msg.contains("query heads"),
            "{msg}"
        );
    }
}

#[test]
fn gpu_attention_prefill_and_decode_match_cpu() {
    let Some(dev) = gpu() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(11);
    let (t, h, kv, d) = (37, 6, 2, 32);
    let heads = AttnHeads {
        n_heads: h,
        n_kv_heads: kv,
        head_dim: d,
    };
    let q = random_vec(&mut rng, t * h * d);
    let kk = random_vec(&mut rng, t * kv * d);
    let vv = random_vec(&mut rng, t * kv * d);
    let mut out = dev.zeros::<f32>(t * h * d).unwrap();
    dev.attention_prefill(
        &dev.upload(&q).unwrap(),
        &dev.upload(&kk).unwrap(),
        &dev.upload(&vv).unwrap(),
        &mut out,
        t,
        heads,
    )
    .unwrap();
    let mut want = Vec::new();
    for i in 0..t {
        want.extend(attend_ref(
            &q[i * h * d..(i + 1) * h * d],
            i + 1,
            h,
            kv,
            d,
            |j, g| &kk[(j * kv + g) * d..(j * kv + g + 1) * d],
            |j, g| &vv[(j * kv + g) * d..(j * kv + g + 1) * d],
        ));
    }
    assert_close(
        "attention_prefill",
        &dev.download(&out).unwrap(),
        &want,
        1e-5,
    );

    // Decode against a cache [B=3, KV, T_max=50, D]; rows hit different slots and lengths.
    let (b, t_max) = (3, 50);
    let kc = random_vec(&mut rng, b * kv * t_max * d);
    let vc = random_vec(&mut rng, b * kv * t_max * d);
    let slots = [2u32, 0, 1, 2];
    let positions = [49u32, 0, 17, 5];
    let qd = random_vec(&mut rng, slots.len() * h * d);
    let mut out = dev.zeros::<f32>(slots.len() * h * d).unwrap();
    dev.attention_decode(
        &dev.upload(&qd).unwrap(),
        &dev.upload(&kc).unwrap(),
        &dev.upload(&vc).unwrap(),
        &mut out,
        &slots,
        &positions,
        heads,
        t_max,
    )
    .unwrap();
    let at = |s: usize, g: usize, j: usize| ((s * kv + g) * t_max + j) * d;
    let mut want = Vec::new();
    for (r, (&s, &p)) in slots.iter().zip(&positions).enumerate() {
        let (s, len) = (s as usize, p as usize + 1);
        want.extend(attend_ref(
            &qd[r * h * d..(r + 1) * h * d],
            len,
            h,
            kv,
            d,
            |j, g| &kc[at(s, g, j)..at(s, g, j) + d],
            |j, g| &vc[at(s, g, j)..at(s, g, j) + d],
        ));
    }
    assert_close(
        "attention_decode",
        &dev.download(&out).unwrap(),
        &want,
        1e-5,
    );
    // Position beyond the cache is rejected on the host.
    assert!(dev
        .attention_decode(
            &dev.upload(&qd[..h * d]).unwrap(),
            &dev.upload(&kc).unwrap(),
            &dev.upload(&vc).unwrap(),
            &mut dev.zeros::<f32>(h * d).unwrap(),
            &[0],
            &[50],
            heads,
            t_max
        )
        .is_err());
}

#[test]
fn gpu_softmax_argmax_sample_match_cpu() {
    let Some(dev) = gpu() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(12);
    let (rows, cols) = (5, 3001);
    let x: Vec<f32> = random_vec(&mut rng, rows * cols)
        .iter()
        .map(|v| v * 8.0)
        .collect();
    let xd = dev.upload(&x).unwrap();
    let temperature = 0.7f32;
    let mut pd = dev.zeros::<f32>(rows * cols).unwrap();
    dev.softmax(&xd, &mut pd, rows, temperature).unwrap();
    let mut want = vec![0.0f32; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let m = row
            .iter()
            .map(|&v| v as f64 / temperature as f64)
            .fold(f64::MIN, f64::max);
        let z: f64 = row
            .iter()
            .map(|&v| (v as f64 / temperature as f64 - m).exp())
            .sum();
        for c in 0..cols {
            want[r * cols + c] =
                ((x[r * cols + c] as f64 / temperature as f64 - m).exp() / z) as f32;
        }
    }
    let probs = dev.download(&pd).unwrap();
    assert_close("softmax", &probs, &want, 1e-5);

    let mut ad = dev.zeros::<u32>(rows).unwrap();
    dev.argmax(&xd, &mut ad, rows).unwrap();
    let want_arg: Vec<u32> = (0..rows)
        .map(|r| argmax(&x[r * cols..(r + 1) * cols]))
        .collect();
    assert_eq!(dev.download(&ad).unwrap(), want_arg, "argmax");

    // Inverse-CDF sampling vs an f64 CPU walk over the GPU's own probabilities.
    let uniforms: Vec<f32> = (0..rows).map(|_| rng.gen_range(0.0f32..1.0)).collect();
    let mut sd = dev.zeros::<u32>(rows).unwrap();
    dev.sample(&pd, &dev.upload(&uniforms).unwrap(), &mut sd, rows)
        .unwrap();
    let got = dev.download(&sd).unwrap();
    for r in 0..rows {
        let row = &probs[r * cols..(r + 1) * cols];
        let total: f64 = row.iter().map(|&p| p as f64).sum();
        let target = uniforms[r] as f64 * total;
        let mut acc = 0.0;
        let mut want = cols - 1;
        for (i, &p) in row.iter().enumerate() {
            acc += p as f64;
            if acc > target {
                want = i;
                break;
            }
        }
        assert_eq!(
            got[r] as usize, want,
            "sample row {r} (u = {})",
            uniforms[r]
        );
    }
}

#[test]
fn gpu_matmul_projection_anderson_match_cpu() {
    let Some(mut dev) = gpu() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(13);
    let (rows, z_dim, h_dim, out_dim) = (9, 96, 80, 70);
    let z = random_vec(&mut rng, rows * z_dim);
    let hh = random_vec(&mut rng, rows * h_dim);
    let wz = random_vec(&mut rng, out_dim * z_dim);
    let wh = random_vec(&mut rng, out_dim * h_dim);
    let b = random_vec(&mut rng, out_dim);
    let mut want = vec![0.0f32; rows * out_dim];
    for r in 0..rows {
        for o in 0..out_dim {
            let mut acc = b[o] as f64;
            for i in 0..z_dim {
                acc += z[r * z_dim + i] as f64 * wz[o * z_dim + i] as f64;
            }
            for i in 0..h_dim {
                acc += hh[r * h_dim + i] as f64 * wh[o * h_dim + i] as f64;
            }
            want[r * out_dim + o] = acc as f32;
        }
    }
    for (tf32, tol) in [(false, 1e-5), (true, 5e-3)] {
        dev.set_tf32(tf32).unwrap();
        let mut od = dev.zeros::<f32>(rows * out_dim).unwrap();
        let bd = dev.upload(&b).unwrap();
        dev.fixed_point_projection(
            &dev.upload(&z).unwrap(),
            &dev.upload(&hh).unwrap(),
            &dev.upload(&wz).unwrap(),
            &dev.upload(&wh).unwrap(),
            Some(&bd),
            &mut od,
            rows,
            z_dim,
            h_dim,
            out_dim,
        )
        .unwrap();
        assert_close(
            &format!("fixed_point_projection (tf32 = {tf32})"),
            &dev.download(&od).unwrap(),
            &want,
            tol,
        );
    }
    dev.set_tf32(false).unwrap();

    // Anderson mixing.
    let (m, n) = (4, 513);
    let xh = random_vec(&mut rng, m * n);
    let fh = random_vec(&mut rng, m * n);
    let alpha = [0.4f32, -0.1, 0.5, 0.2];
    let beta = 0.8f32;
    let mut od = dev.zeros::<f32>(n).unwrap();
    dev.anderson_mix(
        &dev.upload(&xh).unwrap(),
        &dev.upload(&fh).unwrap(),
        &dev.upload(&alpha).unwrap(),
        &mut od,
        beta,
    )
    .unwrap();
    let want: Vec<f32> = (0..n)
        .map(|j| {
            (0..m)
                .map(|i| {
                    alpha[i] as f64
                        * ((1.0 - beta as f64) * xh[i * n + j] as f64
                            + beta as f64 * fh[i * n + j] as f64)
                })
                .sum::<f64>() as f32
        })
        .collect();
    assert_close("anderson_mix", &dev.download(&od).unwrap(), &want, 1e-5);
}

/// Prefill 3 prompts of different lengths, then greedy-decode; every step's logits must match a
/// CPU full recompute, and the greedy tokens must be identical.
fn check_model_vs_cpu(name: &str, w: &ModelWeights, prompts: &[Vec<u32>], steps: usize, tol: f64) {
    let max_seq = prompts.iter().map(Vec::len).max().unwrap() + steps + 1;
    let mut model = CudaModel::new(w, 0, prompts.len(), max_seq).expect("CudaModel::new");
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    let mut logits = model.prefill(prompts).unwrap();
    for step in 0..=steps {
        let mut next = Vec::new();
        for (b, seq) in seqs.iter().enumerate() {
            let want = cpu_last_logits(w, seq);
            let got = logits.row(b).to_vec();
            assert_close(
                &format!("{name} seq {b} step {step} logits"),
                &got,
                &want,
                tol,
            );
            let g = argmax(&got);
            assert_eq!(
                g,
                argmax(&want),
                "{name}: greedy token differs at seq {b} step {step}"
            );
            next.push(g);
        }
        if step == steps {
            break;
        }
        for (seq, &t) in seqs.iter_mut().zip(&next) {
            seq.push(t);
        }
        logits = model.decode(&next).unwrap();
    }
    assert_eq!(
        model.seq_lens(),
        seqs.iter().map(Vec::len).collect::<Vec<_>>()
    );
    // Decoding past max_seq is a typed error, not a device fault.
    let mut full = CudaModel::new(w, 0, 1, 3).unwrap();
    full.prefill(&[vec![1, 2, 3]]).unwrap();
    assert!(matches!(
        full.decode(&[4]),
        Err(ElmError::InvalidArgument(_))
    ));
}

#[test]
fn gpu_tiny_llama_and_qwen2_logits_match_cpu() {
    if gpu().is_none() {
        return;
    }
    let prompts = vec![
        vec![1u32, 5, 9, 33, 2, 60, 7],
        vec![4u32],
        vec![8u32, 8, 3, 41],
    ];
    for arch in [Arch::Llama, Arch::Qwen2] {
        let cfg = ModelConfig::tiny(arch);
        let w = fan_in_scaled_weights(&cfg, 20 + arch as u64);
        check_model_vs_cpu(&format!("tiny {arch:?}"), &w, &prompts, 6, 1e-4);
    }
}

/// GPU prefill + greedy decode against the numpy fixture's logits and tokens directly.
#[test]
fn gpu_fixture_models_match_numpy() {
    if gpu().is_none() {
        return;
    }
    let (prompts, models) = load_fixture();
    for m in &models {
        let arch = m.weights.config.arch;
        let steps = m.greedy[0].len();
        let max_seq = prompts.iter().map(Vec::len).max().unwrap() + steps;
        let mut model = CudaModel::new(&m.weights, 0, prompts.len(), max_seq).unwrap();
        let mut logits = model.prefill(&prompts).unwrap();
        for step in 0..=steps {
            for b in 0..prompts.len() {
                let got = logits.row(b).to_vec();
                let what = format!("gpu {arch:?} prompt {b} step {step}");
                assert_close(&what, &got, &m.logits[b][step], 1e-4);
            }
            if step == steps {
                break;
            }
            let next: Vec<u32> = (0..prompts.len())
                .map(|b| argmax(&logits.row(b).to_vec()))
                .collect();
            let want: Vec<u32> = m.greedy.iter().map(|g| g[step]).collect();
            assert_eq!(next, want, "{arch:?}: greedy tokens at step {step}");
            logits = model.decode(&next).unwrap();
        }
        // reset + re-prefill reproduces the first logits.
        model.reset();
        assert!(model.seq_lens().is_empty());
        let again = model.prefill(&prompts).unwrap();
        for b in 0..prompts.len() {
            assert_close(
                &format!("gpu {arch:?} re-prefill {b}"),
                &again.row(b).to_vec(),
                &m.logits[b][0],
                1e-4,
            );
        }
    }
}

#[test]
fn gpu_smollm2_logits_and_greedy_match_cpu() {
    if gpu().is_none() {
        return;
    }
    let Some(path) = common::real_model() else {
        return;
    };
    let w = elm::formats::load_gguf_model(&path).expect("load SmolLM2");
    // Arbitrary fixed token ids (< vocab): the comparison needs no tokenizer.
    let prompts = vec![
        vec![1u32, 4093, 198, 1780, 314, 216, 34, 31],
        vec![1u32, 504, 3458, 28],
    ];
    check_model_vs_cpu("SmolLM2-135M", &w, &prompts, 8, 5e-4);
}

/// The GPU path against the crate's CPU inference path (`model::Transformer`, KV-cached):
/// prefill with different prompt lengths, then greedy decode fed with the CPU's tokens.
fn check_vs_transformer(
    name: &str,
    w: &ModelWeights,
    prompts: &[Vec<u32>],
    steps: usize,
    tol: f64,
) {
    let cpu = elm::model::Transformer::new(w.clone()).expect("Transformer::new");
    let max_seq = prompts.iter().map(Vec::len).max().unwrap() + steps;
    let mut cache = cpu.new_cache(prompts.len(), max_seq).unwrap();
    let mut gpu = CudaModel::new(w, 0, prompts.len(), max_seq).expect("CudaModel::new");
    let mut want = cpu.prefill(prompts, &mut cache).unwrap();
    let mut got = gpu.prefill(prompts).unwrap();
    for step in 0..=steps {
        let mut next = Vec::new();
        for b in 0..prompts.len() {
            let (g, c) = (got.row(b).to_vec(), want.row(b).to_vec());
            assert_close(
                &format!("{name} vs Transformer seq {b} step {step}"),
                &g,
                &c,
                tol,
            );
            assert_eq!(
                argmax(&g),
                argmax(&c),
                "{name}: greedy differs, seq {b} step {step}"
            );
            next.push(argmax(&c));
        }
        if step == steps {
            break;
        }
        want = cpu.decode_step(&next, &mut cache).unwrap();
        got = gpu.decode(&next).unwrap();
    }
}

#[test]
fn gpu_matches_model_transformer() {
    if gpu().is_none() {
        return;
    }
    let prompts = vec![vec![3u32, 9, 27, 1, 50], vec![7u32, 7], vec![60u32]];
    for arch in [Arch::Llama, Arch::Qwen2] {
        let w = fan_in_scaled_weights(&ModelConfig::tiny(arch), 40 + arch as u64);
        check_vs_transformer(&format!("tiny {arch:?}"), &w, &prompts, 8, 1e-4);
    }
}

/// Gemma 3's block on the GPU (q/k head norms, post-norms, GeGLU, the √C embedding scale, a
/// local layer's window and RoPE base) against the CPU inference path, which is held to
/// llama.cpp (tests/model_gemma3.rs). The tiny config's local layers see 2 keys: prompts of 5
/// tokens and 8 decode steps run well past the window in prefill and in decode.
#[test]
fn gpu_matches_model_transformer_on_tiny_gemma3() {
    if gpu().is_none() {
        return;
    }
    let prompts = vec![vec![3u32, 9, 27, 1, 50], vec![7u32, 7], vec![60u32]];
    let cfg = ModelConfig::tiny(Arch::Gemma3);
    assert!(cfg.layer_attention(0).window.is_some() && cfg.layer_attention(1).window.is_none());
    for seed in [41, 42] {
        let w = ModelWeights::random(&cfg, seed);
        check_vs_transformer(
            &format!("tiny Gemma 3 (seed {seed})"),
            &w,
            &prompts,
            8,
            1e-4,
        );
    }
    // A control: the same weights with the window removed give other logits, so the test above
    // really exercises the windowed attention.
    let w = ModelWeights::random(&cfg, 41);
    let mut wide = w.clone();
    wide.config.sliding_window = None;
    for l in &mut wide.layers {
        if let Some(g) = &mut l.gemma {
            g.attention.window = None;
            g.attention.rope_theta = wide.config.rope_theta;
        }
    }
    wide.config.rope_local_theta = None;
    let long = vec![vec![3u32, 9, 27, 1, 50, 11, 12]];
    let mut a = CudaModel::new(&w, 0, 1, 8).unwrap();
    let mut b = CudaModel::new(&wide, 0, 1, 8).unwrap();
    let (la, lb) = (a.prefill(&long).unwrap(), b.prefill(&long).unwrap());
    let diff = la
        .iter()
        .zip(&lb)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(
        diff > 1e-2,
        "the window changed nothing: max |Δlogit| {diff}"
    );
}

/// The real Gemma 3 270M on the GPU against the CPU path. Optional even under
/// ELM_REQUIRE_REAL_MODEL: the 253 MB checkpoint cannot travel to the lent GPU machine (64 MiB
/// per call), so there it is absent by design.
#[test]
fn gpu_matches_model_transformer_on_gemma3_270m() {
    if gpu().is_none() {
        return;
    }
    let path = elm::formats::models_dir().join(elm::formats::GEMMA3_GGUF);
    if !common::optional("the real Gemma 3 model", path.is_file(), path.display()) {
        return;
    }
    let (w, _tok) = elm::model::load_pretrained(&path).expect("load Gemma 3");
    let prompts = vec![vec![2u32, 9259, 236764, 1902], vec![2u32, 818]];
    check_vs_transformer("Gemma 3 270M", &w, &prompts, 16, 5e-4);
}

#[test]
fn gpu_matches_model_transformer_on_smollm2() {
    if gpu().is_none() {
        return;
    }
    let Some(path) = common::real_model() else {
        return;
    };
    let (w, _tok) = elm::model::load_pretrained(&path).expect("load SmolLM2");
    let prompts = vec![vec![1u32, 9690, 198, 2683, 314, 253], vec![1u32, 30, 31]];
    check_vs_transformer("SmolLM2-135M", &w, &prompts, 16, 5e-4);
}
