//! GGUF bytes → `GgufFile::open` → everything a loader reads: every metadata value through
//! every typed accessor, every tensor's info, raw bytes and dequantized values (tensors above
//! `MAX_TENSOR_BYTES` skipped), the model config, the dense and quantized loaders, and the
//! reader of quantized-ELM GGUFs (`elm quantize`). Property: typed errors only (no panic), no
//! allocation beyond libFuzzer's `-malloc_limit_mb`, no hang beyond `-timeout`.
#![no_main]

use elm::equilibrium::quant_gguf::read_quant_gguf_with;
use elm::formats::gguf::{GgufFile, GgufValue};
use elm::formats::{config_from_gguf, load_gguf_quant, load_gguf_weights, stored_linear_format};
use elm::quant::{WeightStorage, WriteFormat};
use elm_fuzz::{input_file, MAX_TENSOR_BYTES};
use libfuzzer_sys::fuzz_target;

fn touch_value(v: &GgufValue) {
    let _ = (v.type_id(), v.as_int(), v.as_f64(), v.as_str(), v.as_bool());
    if let Some(items) = v.as_array() {
        items.iter().for_each(touch_value);
    }
}

fn touch_metadata(g: &GgufFile) {
    let _ = (g.version(), g.alignment(), g.data_start(), g.path());
    for (key, value) in g.metadata() {
        touch_value(value);
        // The same entry (by address: a NaN value is not equal to itself).
        let found = g.get(key).expect("a listed metadata key is found");
        assert!(std::ptr::eq(found, value), "lookup of metadata `{key}`");
        let _ = g.get_usize(key);
        let _ = g.get_f64(key);
        let _ = g.get_str(key);
        let _ = g.get_bool(key);
        let _ = g.get_str_array(key);
        let _ = g.get_int_array(key);
        let _ = g.get_f32_array(key);
    }
    let _ = g.get_usize("no such key");
}

fn touch_tensors(g: &GgufFile) {
    let mut total = 0u64;
    for t in g.tensors() {
        let info = g
            .tensor_info(&t.name)
            .expect("a listed tensor is found by name");
        assert_eq!(info, t);
        let _ = (info.shape(), info.num_elements());
        let f32_bytes = info.num_elements().saturating_mul(4);
        match info.num_bytes() {
            // A type without a dequantizer: every read is a typed error.
            None => {
                assert!(g.tensor_bytes(&t.name).is_err());
                assert!(g.tensor_f32(&t.name).is_err());
                assert!(g.take_tensor_f32(&t.name).is_err());
            }
            Some(n) if n > MAX_TENSOR_BYTES || f32_bytes > MAX_TENSOR_BYTES => continue,
            Some(n) => {
                total += n;
                let bytes = g.tensor_bytes(&t.name).expect("range checked at open");
                assert_eq!(bytes.len() as u64, n, "tensor `{}`", t.name);
                let a = g.tensor_f32(&t.name);
                let b = g.take_tensor_f32(&t.name);
                if let (Ok(a), Ok(b)) = (&a, &b) {
                    // Bit patterns: NaNs in the file stay NaNs in both.
                    let bits = |x: &ndarray::ArrayD<f32>| {
                        x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    };
                    assert_eq!(a.shape(), b.shape());
                    assert_eq!(
                        bits(a),
                        bits(b),
                        "tensor_f32 vs take_tensor_f32 of `{}`",
                        t.name
                    );
                }
                let copied = g.take_tensor_bytes(&t.name).expect("range checked at open");
                assert_eq!(copied.len() as u64, n);
                if info.ne.len() == 2 {
                    let _ = g.tensor_f32_2d(&t.name);
                }
                for storage in [
                    WeightStorage::F32,
                    WeightStorage::Auto,
                    WeightStorage::Quant(WriteFormat::Q8_0),
                ] {
                    let cols = info.shape().last().copied().unwrap_or(0);
                    let _ = stored_linear_format(g, &t.name, cols, storage);
                }
            }
        }
    }
    let _ = g.tensor_bytes("no such tensor");
    if total <= MAX_TENSOR_BYTES {
        let _ = g.tensor_data();
    }
}

fuzz_target!(|data: &[u8]| {
    elm_fuzz::guarded(|| {
        let path = input_file("input.gguf", data);
        let Ok(mut gguf) = GgufFile::open(&path) else {
            return;
        };
        touch_metadata(&gguf);
        touch_tensors(&gguf);
        // The loaders read only tensors whose shape matches the config, and every tensor's range
        // was checked against the file at open: what they allocate is bounded by the input.
        if config_from_gguf(&gguf).is_ok() {
            let _ = load_gguf_weights(&gguf);
            let _ = load_gguf_quant(&gguf, WeightStorage::Auto);
            let _ = load_gguf_quant(&gguf, WeightStorage::Quant(WriteFormat::Q4_1));
        }
        if gguf.get("elm.format").is_some() {
            let _ = read_quant_gguf_with(&path, WeightStorage::Auto);
        }
        gguf.release_all();
        gguf.release_metadata();
        assert!(gguf.metadata().is_empty());
        touch_tensors(&gguf);
    });
});
