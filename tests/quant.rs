//! Quantized inference (`elm::quant`): every kernel against the
//! dequantize-then-f32 reference, on random blocks (extreme scales, odd lengths) and the real
//! checkpoint's first layer; the real model quantized against its f32 path (logits, greedy).

mod common;

use elm::model::generate::{generate, SamplingConfig};
use elm::model::ops::linears_into;
use elm::model::{
    load_inference, ModelConfig, ModelWeights, QFormat, QMatrix, QuantWeights, Transformer,
    WeightStorage, WriteFormat,
};
use elm::quant::{detected_kernel, qmatmul_rows, ActQuant, Kernel, QActs};
use elm::quant::{Layout, LinearRef};
use ndarray::{Array2, ArrayView2};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// The byte offsets of a block's f16 scales (set to finite values by [`random_blocks`]; the
/// rest of a block is random bytes: every packed scale, min, value and high bit).
fn f16_fields(format: QFormat) -> &'static [usize] {
    match format {
        QFormat::Q8_0 | QFormat::Q4_0 | QFormat::Q5_0 => &[0],
        QFormat::Q4_1 | QFormat::Q5_1 | QFormat::Q4K | QFormat::Q5K => &[0, 2],
        QFormat::Q2K => &[80, 82],
        QFormat::Q3K => &[108],
        QFormat::Q6K => &[208],
    }
}

/// `(rows, cols)` shapes to test `format` on: odd lengths for the formats elm writes
/// (zero-padded tails), whole blocks for the ones it only reads (as a GGUF stores them).
fn shapes(format: QFormat) -> Vec<(usize, usize)> {
    match (
        format.block_elems(),
        QFormat::from(format.write_format()) == format,
    ) {
        (32, true) => vec![(1, 32), (37, 96), (5, 100), (64, 576), (3, 1)],
        (32, false) => vec![(1, 32), (37, 96), (64, 576)],
        _ => vec![(1, 256), (37, 512), (6, 768)],
    }
}

/// Every kernel this CPU runs (each held to the same reference). The machines here have
/// AVX-512 VNNI: where the CPU reports it, its kernel must be there and be the one chosen.
fn kernels() -> Vec<Kernel> {
    let k: Vec<Kernel> = Kernel::ALL
        .into_iter()
        .filter(|k| k.is_available())
        .collect();
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512vl") {
        assert_eq!(k[0], Kernel::Avx512Vnni, "{k:?}");
        if std::env::var_os("ELM_QKERNEL").is_none() {
            assert_eq!(detected_kernel(), Kernel::Avx512Vnni);
        }
    }
    k
}

/// Random raw blocks: every packed field random, f16 scales over many binades (finite).
fn random_blocks(format: QFormat, rows: usize, cols: usize, rng: &mut StdRng) -> QMatrix {
    let be = format.block_elems();
    let nb = cols.div_ceil(be);
    let bb = format.block_bytes();
    let mut data = vec![0u8; rows * nb * bb];
    // A zero-padded tail is re-quantized below: its new scale `(max − min) / 15` can be
    // three times an old one (offset formats), which must stay within f16.
    let e_max = if cols.is_multiple_of(be) { 15 } else { 13 };
    for blk in data.chunks_exact_mut(bb) {
        rng.fill(blk);
        for &at in f16_fields(format) {
            let e: i32 = rng.gen_range(-14..=e_max);
            let v = rng.gen_range(0.5f32..1.0) * 2f32.powi(e) * if rng.gen() { 1.0 } else { -1.0 };
            blk[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    let m = QMatrix::from_blocks(format, rows, nb * be, data).unwrap();
    match (cols.is_multiple_of(be), format.write_format()) {
        (true, _) => m,
        // Zero-padded tail of each row, as `QMatrix::quantize` writes it (elm's own formats).
        (false, w) if QFormat::from(w) == format => {
            QMatrix::quantize(m.dequantize().slice(ndarray::s![.., ..cols]), w)
        }
        (false, _) => panic!("{format:?} has no zero-padded form"),
    }
}

fn random_x(n: usize, cols: usize, rng: &mut StdRng) -> Array2<f32> {
    Array2::from_shape_fn((n, cols), |(r, _)| {
        // Per-row scale from tiny to huge, and a few exact zeros.
        let s = [1.0f32, 1e-6, 3e4, 0.25][r % 4];
        if rng.gen_range(0..16) == 0 {
            0.0
        } else {
            rng.gen_range(-1.0f32..1.0) * s
        }
    })
}

/// `x_q · W_deqᵀ` in f64 (the exact value the integer kernel computes up to f32 rounding),
/// and `Σ |x_q|·|W_deq|` per output (the scale of its rounding error).
fn reference(w: &QMatrix, xq: ArrayView2<f32>) -> (Array2<f64>, Array2<f64>) {
    let wd = w.dequantize().mapv(|v| v as f64);
    let mut xd = xq.mapv(|v| v as f64);
    // Activations are padded to whole blocks; the weights' padding is zero.
    xd = xd.slice(ndarray::s![.., ..w.cols()]).to_owned();
    let y = xd.dot(&wd.t());
    let mag = xd.mapv(f64::abs).dot(&wd.mapv(f64::abs).t());
    (y, mag)
}

fn assert_close(got: &Array2<f32>, want: &Array2<f64>, mag: &Array2<f64>, what: &str) {
    for ((idx, &g), (&w, &m)) in got.indexed_iter().zip(want.iter().zip(mag.iter())) {
        let err = (g as f64 - w).abs();
        assert!(
            err <= 2e-5 * m + 1e-30,
            "{what} {idx:?}: got {g}, want {w} (|err| {err:e}, scale {m:e})"
        );
    }
}

#[test]
fn kernels_match_dequantized_reference_on_random_blocks() {
    let mut rng = StdRng::seed_from_u64(7);
    for format in QFormat::ALL {
        for (rows, cols) in shapes(format) {
            let w = random_blocks(format, rows, cols, &mut rng);
            for (n, mode) in [1, 2, 3, 5, 8, 13]
                .into_iter()
                .flat_map(|n| ActQuant::ALL.map(|m| (n, m)))
            {
                let x = random_x(n, cols, &mut rng);
                let mut acts = QActs::new(mode);
                acts.quantize(x.view());
                let (want, mag) = reference(&w, acts.dequantize().view());
                let mut by_kernel = vec![];
                for kernel in kernels() {
                    let mut y = Array2::<f32>::from_elem((n, rows), f32::NAN);
                    // SAFETY: `y` is a fresh contiguous `[n, rows]` buffer.
                    unsafe { qmatmul_rows(&w, 0, rows, &acts, y.as_mut_ptr(), rows, kernel) };
                    let what = format!("{format:?} {kernel:?} {mode} [{rows}, {cols}] n={n}");
                    assert_close(&y, &want, &mag, &what);
                    by_kernel.push((kernel, y));
                }
                // On GGUF rows, VNNI's `vpdpbusd` forms the same i32 block sums as AVX2's
                // maddubs + madd, and the f32 arithmetic around them is shared: identical
                // results. (On tiles it scales eight rows' blocks at once, in another order.)
                let of = |k| by_kernel.iter().find(|(kk, _)| *kk == k).map(|(_, y)| y);
                let on_rows = w.layout() == Layout::Rows;
                if let (Some(a), Some(v), true) =
                    (of(Kernel::Avx2), of(Kernel::Avx512Vnni), on_rows)
                {
                    assert_eq!(
                        a, v,
                        "{format:?} {mode} AVX2 vs VNNI [{rows}, {cols}] n={n}"
                    );
                }
                // The public path: team split over rows, bias added.
                let bias = ndarray::Array1::from_shape_fn(rows, |i| i as f32);
                let mut y = Array2::<f32>::zeros((n, rows));
                let mut qx = QActs::new(mode);
                linears_into(
                    x.view(),
                    &mut [(LinearRef::Quant(&w), Some(bias.view()), y.view_mut())],
                    &mut qx,
                );
                let want_b = &want + &bias.mapv(|v| v as f64);
                assert_close(
                    &y,
                    &want_b,
                    &(&mag + 1.0),
                    &format!("{format:?} {mode} split n={n}"),
                );
            }
        }
    }
}

/// The tiled layout (eight rows interleaved for the VNNI kernel): chosen for every 32-element
/// format whose rows fill whole tiles, it holds the GGUF blocks exactly (each row, the whole
/// matrix, the values), and products over any row range, tile edges inside it included,
/// match the reference.
#[test]
fn tiled_layout_holds_the_gguf_blocks_and_any_row_range_matches_the_reference() {
    let mut rng = StdRng::seed_from_u64(11);
    let vnni = detected_kernel() == Kernel::Avx512Vnni;
    let mut tiled_formats = 0;
    let untiled = [QFormat::Q2K, QFormat::Q3K, QFormat::Q5K];
    for format in QFormat::ALL.into_iter().filter(|f| !untiled.contains(f)) {
        // Three blocks per row (K-quants: two super-blocks, sixteen activation blocks).
        let (rows, cols) = (40, if format.block_elems() == 32 { 96 } else { 512 });
        let rows_layout = random_blocks(format, rows, cols, &mut rng).with_layout(Layout::Rows);
        let gguf = rows_layout.gguf_blocks().into_owned();
        let tiled = rows_layout.clone().with_layout(Layout::Tiles);
        assert_eq!(tiled.layout(), Layout::Tiles, "{format:?}");
        assert_eq!(
            tiled.bytes(),
            rows_layout.bytes(),
            "{format:?}: same bytes held"
        );
        assert_ne!(
            tiled.stored(),
            &gguf[..],
            "{format:?}: the tiles are rearranged"
        );
        assert_eq!(tiled.gguf_blocks(), &gguf[..], "{format:?}");
        for r in 0..rows {
            assert_eq!(tiled.row(r), rows_layout.row(r), "{format:?} row {r}");
        }
        assert_eq!(tiled.dequantize(), rows_layout.dequantize(), "{format:?}");
        assert_eq!(
            tiled, rows_layout,
            "{format:?}: equal values whatever the layout"
        );
        let back = tiled.clone().with_layout(Layout::Rows);
        assert_eq!(back.stored(), &gguf[..], "{format:?}: back to rows exactly");
        // Made from blocks, a matrix gets the tiles exactly when the VNNI kernel runs.
        let made = QMatrix::from_blocks(format, rows, cols, gguf.clone()).unwrap();
        let want_layout = if vnni { Layout::Tiles } else { Layout::Rows };
        assert_eq!(made.layout(), want_layout, "{format:?}");
        // A row count off the tile keeps rows.
        let odd = QMatrix::from_blocks(
            format,
            rows - 1,
            cols,
            gguf[..(rows - 1) * gguf.len() / rows].to_vec(),
        );
        assert_eq!(odd.unwrap().layout(), Layout::Rows, "{format:?}");
        for (n, mode) in [(1, ActQuant::Q8), (3, ActQuant::Q8x2), (9, ActQuant::Q8)] {
            let x = random_x(n, cols, &mut rng);
            let mut acts = QActs::new(mode);
            acts.quantize(x.view());
            let (want, mag) = reference(&rows_layout, acts.dequantize().view());
            for kernel in kernels() {
                // Whole tiles, a range with ragged edges, and one inside a single tile.
                for (lo, hi) in [(0, rows), (3, 37), (9, 15)] {
                    let mut y = Array2::<f32>::from_elem((n, rows), f32::NAN);
                    // SAFETY: `y` is a fresh contiguous `[n, rows]` buffer.
                    unsafe { qmatmul_rows(&tiled, lo, hi, &acts, y.as_mut_ptr(), rows, kernel) };
                    let cut = ndarray::s![.., lo..hi];
                    let what = format!("{format:?} tiles {kernel:?} {mode} rows {lo}..{hi} n={n}");
                    assert_close(
                        &y.slice(cut).to_owned(),
                        &want.slice(cut).to_owned(),
                        &mag.slice(cut).to_owned(),
                        &what,
                    );
                    assert!(
                        y.slice(ndarray::s![.., ..lo]).iter().all(|v| v.is_nan()),
                        "{what}: wrote outside"
                    );
                    assert!(
                        y.slice(ndarray::s![.., hi..]).iter().all(|v| v.is_nan()),
                        "{what}: wrote outside"
                    );
                }
            }
        }
        tiled_formats += 1;
    }
    assert_eq!(
        tiled_formats, 7,
        "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q6_K have tiles"
    );
    // The K-quants no model here uses keep rows.
    for format in untiled {
        let k = random_blocks(format, 8, 256, &mut rng).with_layout(Layout::Tiles);
        assert_eq!(k.layout(), Layout::Rows, "{format:?}");
    }
}

#[test]
fn activation_quantization_error_is_within_half_a_step() {
    let mut rng = StdRng::seed_from_u64(3);
    let x = random_x(6, 200, &mut rng);
    let mut acts = QActs::default();
    acts.quantize(x.view());
    let xq = acts.dequantize();
    for r in 0..6 {
        for b in 0..200usize.div_ceil(32) {
            let cols = b * 32..((b + 1) * 32).min(200);
            let amax = cols.clone().map(|c| x[[r, c]].abs()).fold(0f32, f32::max);
            for c in cols {
                let err = (xq[[r, c]] - x[[r, c]]).abs();
                assert!(err <= amax / 127.0 * 0.5 * 1.0001 + 1e-30, "[{r}, {c}]");
            }
        }
    }
}

/// The codes are C's `roundf(x / d)` (ties away from zero, as ggml rounds), on the vector path
/// too: a block whose step is 1 holds exact ties, where rounding to even would differ.
#[test]
fn activation_codes_round_ties_away_from_zero() {
    let mut row = vec![0f32; 64];
    row[0] = 127.0; // d = 1 in the first block
    let ties = [0.5f32, -0.5, 1.5, 2.5, -2.5, 3.5, 126.5, -126.5];
    row[1..1 + ties.len()].copy_from_slice(&ties);
    let mut rng = StdRng::seed_from_u64(5);
    for v in &mut row[32..] {
        *v = rng.gen_range(-3.0f32..3.0);
    }
    let x = Array2::from_shape_vec((1, 64), row.clone()).unwrap();
    let mut acts = QActs::default();
    acts.quantize(x.view());
    let xq = acts.dequantize();
    for (b, block) in row.chunks(32).enumerate() {
        let d = block.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
        let id = 1.0 / d;
        for (i, &v) in block.iter().enumerate() {
            let want = (v * id).round() * d;
            assert_eq!(xq[[0, 32 * b + i]], want, "block {b} value {i}: {v}");
        }
    }
    assert_eq!(xq[[0, 4]], 3.0, "2.5 rounds away from zero");
}

#[test]
fn two_part_activations_are_within_a_127th_of_a_step() {
    // q8x2 quantizes what one 8-bit block leaves (≤ half a step, d₁/2) with a second block:
    // its error is ≤ d₂/2 ≤ (d₁/2)/127/2 = amax/64 516, against amax/254 for q8.
    let mut rng = StdRng::seed_from_u64(5);
    let mut x = random_x(4, 200, &mut rng);
    x[[2, 40]] = 300.0; // an outlier sets its block's scale (LLM hidden states have them)
    let mut acts = QActs::new(ActQuant::Q8x2);
    acts.quantize(x.view());
    let xq = acts.dequantize();
    let mut worst_ratio = 0f32;
    for r in 0..4 {
        for b in 0..200usize.div_ceil(32) {
            let cols = b * 32..((b + 1) * 32).min(200);
            let amax = cols.clone().map(|c| x[[r, c]].abs()).fold(0f32, f32::max);
            for c in cols {
                let err = (xq[[r, c]] - x[[r, c]]).abs();
                assert!(
                    err <= amax * (1.0 / 64516.0 + 1e-6),
                    "[{r}, {c}]: {err} of {amax}"
                );
                worst_ratio = worst_ratio.max(err / amax);
            }
        }
    }
    // Not vacuous: the second part's rounding is visible, well below one 8-bit step.
    assert!(worst_ratio > 1.0 / 64516.0 / 4.0, "{worst_ratio}");
}

#[test]
fn quantize_round_trip_error_is_bounded_per_block() {
    let mut rng = StdRng::seed_from_u64(11);
    for format in WriteFormat::ALL {
        // Extreme but f16-representable scales, and an all-zero row.
        for scale in [1e-3f32, 1.0, 1e3] {
            let mut w = Array2::from_shape_fn((9, 70), |_| rng.gen_range(-1.0f32..1.0) * scale);
            w.row_mut(4).fill(0.0);
            let q = QMatrix::quantize(w.view(), format);
            assert_eq!(q.dim(), (9, 70));
            assert_eq!(q.bytes(), 9 * 3 * QFormat::from(format).block_bytes());
            let back = q.dequantize();
            let steps = match format {
                WriteFormat::Q8_0 => 127.0,
                WriteFormat::Q4_0 => 8.0,
                WriteFormat::Q4_1 => 15.0,
            };
            for (r, (a, b)) in w.rows().into_iter().zip(back.rows()).enumerate() {
                for blk in 0..3 {
                    let cols = blk * 32..((blk + 1) * 32).min(70);
                    let range = cols.clone().map(|c| a[c].abs()).fold(0f32, f32::max) * 2.0;
                    for c in cols {
                        // Half a step, plus the f16 rounding of the scale(s) (≤ 2⁻¹¹ relative).
                        let tol = range / steps * 0.5 * 1.01 + range * 2e-3 + 1e-30;
                        assert!(
                            (a[c] - b[c]).abs() <= tol,
                            "{format:?} scale {scale} [{r}, {c}]: {} vs {}",
                            a[c],
                            b[c]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn quantized_tiny_model_tracks_f32_and_refuses_long_prompts() {
    for arch in [elm::model::Arch::Llama, elm::model::Arch::Qwen2] {
        let cfg = ModelConfig::tiny(arch);
        let w = ModelWeights::random(&cfg, 5);
        let dense = Transformer::new(w.clone()).unwrap();
        let prompt: Vec<u32> = (0..9).map(|i| (i * 7 % cfg.vocab_size) as u32).collect();
        for format in WriteFormat::ALL {
            let qw = QuantWeights::quantize(&w, format);
            // Reference: the same (dequantized) weights on the f32 path, so only the 8-bit
            // activations differ.
            let reference = Transformer::new(qw.to_f32()).unwrap();
            let want = reference
                .forward_logits(std::slice::from_ref(&prompt))
                .unwrap();
            let tol = 0.03;
            let q = Transformer::new(qw).unwrap();
            let got = q.forward_logits(std::slice::from_ref(&prompt)).unwrap();
            let err = (&got - &want).mapv(f32::abs).fold(0f32, |a, &b| a.max(b));
            let scale = want.mapv(f32::abs).fold(0f32, |a, &b| a.max(b));
            assert!(
                err <= tol * scale,
                "{format:?}: max |Δlogit| {err} vs scale {scale}"
            );
            // Decode steps agree with the whole-sequence pass on the same quantized weights.
            let mut cache = q.new_cache(1, prompt.len()).unwrap();
            q.prefill(&[prompt[..4].to_vec()], &mut cache).unwrap();
            let mut last = None;
            for &t in &prompt[4..] {
                last = Some(q.decode_step(&[t], &mut cache).unwrap());
            }
            let step = last.unwrap();
            let full = got.slice(ndarray::s![0, prompt.len() - 1, ..]);
            let d = (&step.row(0) - &full)
                .mapv(f32::abs)
                .fold(0f32, |a, &b| a.max(b));
            assert!(d <= 1e-3 * scale.max(1.0), "{format:?}: decode vs full {d}");
        }
        let long: Vec<u32> = vec![1; cfg.max_position_embeddings + 1];
        let mut cache = dense.new_cache(1, long.len()).unwrap();
        let err = dense.prefill(&[long], &mut cache).unwrap_err().to_string();
        assert!(err.contains("context length"), "{err}");
    }
}

#[test]
fn real_checkpoint_first_layer_kernels_match_dequantized_f32() {
    let Some(path) = common::real_model() else {
        return;
    };
    let gguf = elm::formats::GgufFile::open(&path).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let mut seen = 0;
    for name in [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ] {
        let name = format!("blk.0.{name}.weight");
        let info = gguf.tensor_info(&name).unwrap();
        let Some(format) = elm::formats::qformat_of(info.ggml_type) else {
            continue;
        };
        let shape = info.shape();
        let bytes = gguf.tensor_bytes(&name).unwrap().to_vec();
        let w = QMatrix::from_blocks(format, shape[0], shape[1], bytes).unwrap();
        // The in-memory blocks decode exactly as the file's reference dequantizer.
        assert_eq!(w.dequantize(), gguf.tensor_f32_2d(&name).unwrap(), "{name}");
        let x = random_x(3, shape[1], &mut rng);
        let mut acts = QActs::default();
        acts.quantize(x.view());
        let (want, mag) = reference(&w, acts.dequantize().view());
        for kernel in kernels() {
            let mut y = Array2::<f32>::zeros((3, shape[0]));
            // SAFETY: `y` is a fresh contiguous `[3, rows]` buffer.
            unsafe { qmatmul_rows(&w, 0, shape[0], &acts, y.as_mut_ptr(), shape[0], kernel) };
            assert_close(&y, &want, &mag, &format!("{name} {kernel:?}"));
        }
        seen += 1;
    }
    assert!(
        seen >= 5,
        "the Q4_1 file has quantized first-layer matrices"
    );
}

#[test]
fn real_model_quantized_logits_and_greedy_text_track_f32() {
    let Some(path) = common::real_model() else {
        return;
    };
    let (f32w, _) = elm::model::load_pretrained(&path).unwrap();
    let dense = Transformer::new(f32w).unwrap();
    let (qw, _) = load_inference(&path, WeightStorage::Auto).unwrap();
    assert!(
        qw.bytes() * 4 < dense.weights.num_params() * 4,
        "auto keeps the blocks"
    );
    let quant = Transformer::new(qw).unwrap();
    // The prompts of the f32 reference fixture (tests/model_real.rs).
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/model/smollm2_logits.json")).unwrap();
    let prompts: Vec<Vec<u32>> = fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| serde_json::from_value(c["tokens"].clone()).unwrap())
        .collect();
    let cfg = SamplingConfig {
        max_new_tokens: 16,
        ..SamplingConfig::default()
    };
    let (mut agree, mut total, mut worst) = (0, 0, 0f32);
    for p in prompts {
        // Teacher forcing on the f32 greedy continuation: both models see the same tokens.
        let ga = generate(&dense, std::slice::from_ref(&p), &cfg, None, |_, _| {}).unwrap();
        let seq: Vec<u32> = p.iter().chain(&ga.tokens[0]).copied().collect();
        let a = dense.forward_logits(std::slice::from_ref(&seq)).unwrap();
        let b = quant.forward_logits(std::slice::from_ref(&seq)).unwrap();
        let scale = a.mapv(f32::abs).fold(0f32, |m, &v| m.max(v));
        for t in p.len() - 1..seq.len() - 1 {
            let (ra, rb) = (
                a.slice(ndarray::s![0, t, ..]),
                b.slice(ndarray::s![0, t, ..]),
            );
            let err = (&ra - &rb).mapv(f32::abs).fold(0f32, |m, &v| m.max(v));
            // Only the activations are rounded (8 bits per block of 32); measured up to ≈ 5 %
            // of the largest logit (outlier channels share their block with 31 others).
            assert!(
                err <= 0.08 * scale,
                "position {t}: max |Δlogit| {err} vs {scale}"
            );
            worst = worst.max(err / scale);
            let top = elm::model::generate::argmax(ra);
            let mut sorted: Vec<f32> = ra.to_vec();
            sorted.sort_by(|x, y| y.total_cmp(x));
            let margin = sorted[0] - sorted[1];
            let same = elm::model::generate::argmax(rb) == top;
            // Where the f32 winner leads by more than twice the logit error, the quantized
            // model must pick it too (a smaller lead can flip either way).
            assert!(
                same || margin <= 2.0 * err,
                "position {t}: margin {margin}, err {err}"
            );
            agree += same as usize;
            total += 1;
        }
    }
    eprintln!("greedy agreement {agree}/{total}, worst max|Δlogit|/max|logit| {worst}");
    assert!(agree * 10 >= total * 9, "greedy agreement {agree}/{total}");
}

#[test]
fn quantized_elm_session_tracks_f32_elm_and_holds_fewer_bytes() {
    use elm::equilibrium::infer::{ElmModel, ElmSession, InferenceConfig};
    use elm::equilibrium::{ElmConfig, ElmModule};
    use elm::solver::{SolverConfig, StopCriteria};
    let mut cfg = ModelConfig::tiny(elm::model::Arch::Qwen2);
    cfg.num_layers = 5;
    let w = ModelWeights::random(&cfg, 11);
    let ec = ElmConfig::new(1, 3);
    let module = ElmModule::init(&w, &ec).unwrap();
    // Picard with a fixed iteration count: both runs do the same evaluations.
    let icfg = InferenceConfig::new(SolverConfig::picard(), StopCriteria::absolute(0.0, 6));
    let prompt = vec![vec![3u32, 9, 27, 1, 4]];
    let run = |m: &ElmModel| {
        let mut s = ElmSession::new(m, icfg.clone(), 1, 16).unwrap();
        let mut out = vec![s.prefill(&prompt).unwrap()];
        for t in [5u32, 7, 2] {
            out.push(s.decode_step(&[t]).unwrap());
        }
        out
    };
    let f32_model = ElmModel::new(w.clone(), ec.clone(), module.clone()).unwrap();
    let want = run(&f32_model);
    // All-f32 matrices through the quantized model's code path: the same numbers.
    let same = ElmModel::quantized(
        QuantWeights::from_f32(&w, None),
        Some((ec.clone(), &module)),
        None,
    )
    .unwrap();
    for (a, b) in want.iter().zip(run(&same)) {
        let d = (a - &b).mapv(f32::abs).fold(0f32, |m, &v| m.max(v));
        assert!(d <= 1e-4, "f32 storage through the quantized session: {d}");
    }
    // The variants without injection (z⁰ = h, u = z) and with a fixed iteration count take
    // the same quantized path: f32 storage must again give the f32 variant's numbers.
    let mut looped = ElmConfig::new(1, 3);
    looped.injection = false;
    looped.fixed_iterations = Some(3);
    let lm = ElmModule::init(&w, &looped).unwrap();
    assert!(lm.projection.is_none());
    let want_looped = run(&ElmModel::new(w.clone(), looped.clone(), lm.clone()).unwrap());
    let same_looped =
        ElmModel::quantized(QuantWeights::from_f32(&w, None), Some((looped, &lm)), None).unwrap();
    for (a, b) in want_looped.iter().zip(run(&same_looped)) {
        let d = (a - &b).mapv(f32::abs).fold(0f32, |m, &v| m.max(v));
        assert!(
            d <= 1e-4,
            "looped variant through the quantized session: {d}"
        );
    }
    // Q8_0 everywhere (module included): close to the f32 ELM, and fewer bytes than the dense
    // quantized model in the ratio of the parameter counts (up to the f32 norms).
    let q = ElmModel::quantized(
        QuantWeights::quantize(&w, WriteFormat::Q8_0),
        Some((ec.clone(), &module)),
        None,
    )
    .unwrap();
    for (a, b) in want.iter().zip(run(&q)) {
        let d = (a - &b).mapv(f32::abs).fold(0f32, |m, &v| m.max(v));
        let scale = a.mapv(f32::abs).fold(0f32, |m, &v| m.max(v));
        assert!(
            d <= 0.05 * scale,
            "q8_0 ELM vs f32 ELM: {d} (scale {scale})"
        );
    }
    let dense_q = QuantWeights::quantize(&w, WriteFormat::Q8_0).bytes() as f64;
    let elm_params = (w.num_params() - 3 * w.layers[0].num_params() + module.num_params()) as f64;
    let bound = elm_params / w.num_params() as f64 * dense_q;
    assert!(
        (q.weight_bytes() as f64) <= bound * 1.02,
        "quantized ELM {} bytes vs bound {bound}",
        q.weight_bytes()
    );
}
