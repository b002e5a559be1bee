//! Bytes → one of the library's own tensor files (optimiser state, `ParamStore`, ELM
//! checkpoints: safetensors of named f32 tensors, `io::tensor_file`) → `load_f32_tensors`,
//! then `ParamStore::load` (which also parses the order/frozen metadata JSON).
//! Property: typed errors only; every loaded tensor has as many values as its shape says.
#![no_main]

use elm::io::tensor_file::load_f32_tensors;
use elm::train::ParamStore;
use elm_fuzz::input_file;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    elm_fuzz::guarded(|| {
        let path = input_file("input.safetensors", data);
        if let Ok(file) = load_f32_tensors(&path) {
            for t in file.tensors.values() {
                assert_eq!(t.len(), t.shape().iter().product::<usize>());
            }
            let _ = ParamStore::load(&path);
        }
    });
});
