//! First byte: which micro model and extras (`elm_fuzz::safetensors_case`); the rest:
//! a `model.safetensors` → `load_hf_model_with` on a folder holding it (the config is given,
//! not read). Property: typed errors only; what loads has the config's shapes.
#![no_main]

use elm::formats::hf::load_hf_model_with;
use elm_fuzz::{input_dir, safetensors_case};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    elm_fuzz::guarded(|| {
        let Some((&selector, file)) = data.split_first() else {
            return;
        };
        let (config, extra) = safetensors_case(selector);
        let dir = input_dir("hf");
        std::fs::write(dir.join("model.safetensors"), file).expect("write the fuzz input");
        if let Ok((w, extras)) = load_hf_model_with(&dir, config.clone(), &extra) {
            assert_eq!(w.config, config);
            assert_eq!(w.layers.len(), config.num_layers);
            assert_eq!(w.embed.dim(), (config.vocab_size, config.hidden_size));
            assert_eq!(extras.len(), extra.len());
            for (name, shape) in &extra {
                assert_eq!(extras[name].len(), shape.iter().product::<usize>());
            }
        }
    });
});
