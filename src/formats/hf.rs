//! Hugging Face checkpoint directories: `config.json` + `model.safetensors`, or sharded
//! `*.safetensors` listed in `model.safetensors.index.json`.
//!
//! Loading is strict: every tensor must be used, none may be missing, and every shape
//! is checked against the config. F32/F16/BF16 are converted to f32.
//!
//! `config.json` keys are sorted into three groups:
//! - mapped into [`ModelConfig`] (see [`config_from_hf_json`]);
//! - [`HARMLESS_KEYS`]: bookkeeping that cannot change the forward pass, ignored;
//! - keys that *would* change the math are accepted only at their neutral value
//!   (`hidden_act = "silu"`, `rope_scaling = null`, `use_sliding_window = false`, ...);
//!   anything else, and any unknown key, is a `Config` error naming the key.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use ndarray::{Array1, Array2, ArrayD};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::{json, Map, Value};

use crate::error::{ElmError, Result};
use crate::io::write_atomic;
use crate::model_data::family::{BiasRule, Family, WindowRules};
use crate::model_data::weights::Gemma3Block;
use crate::model_data::{Arch, LayerWeights, ModelConfig, ModelWeights};

/// `config.json` keys that do not affect the forward pass and are ignored.
pub const HARMLESS_KEYS: &[&str] = &[
    "_name_or_path",
    "architectures",
    "auto_map",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "initializer_range",
    "use_cache",
    "pad_token_id",
    "model_type",
    "is_llama_config",
    "pretraining_tp",
    "max_window_layers",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "tokenizer_class",
];

fn json_err(path: &Path, msg: impl Into<String>) -> ElmError {
    ElmError::Json {
        what: path.display().to_string(),
        msg: msg.into(),
    }
}

/// Maps an HF `config.json` object to a [`ModelConfig`].
pub fn config_from_hf_json(value: &Value) -> Result<ModelConfig> {
    let obj = value
        .as_object()
        .ok_or_else(|| ElmError::config("config.json", "top level must be a JSON object"))?;
    let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let usize_key = |k: &str| -> Result<Option<usize>> {
        match get(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                ElmError::config(k, format!("expected a non-negative integer, found {v}"))
            }),
        }
    };
    let need = |k: &str| -> Result<usize> {
        usize_key(k)?.ok_or_else(|| ElmError::config(k, "missing from config.json"))
    };
    let f32_key = |k: &str| -> Result<Option<f32>> {
        match get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| ElmError::config(k, format!("expected a number, found {v}"))),
        }
    };
    let bool_key = |k: &str| -> Result<Option<bool>> {
        match get(k) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| ElmError::config(k, format!("expected a bool, found {v}"))),
        }
    };
    // A token id may be an int or (Llama-3 style) a list; we keep the first.
    let token_id = |k: &str| -> Result<Option<u32>> {
        match get(k) {
            None => Ok(None),
            Some(Value::Array(a)) if a.is_empty() => Ok(None),
            Some(Value::Array(a)) => a[0].as_u64().map(|x| Some(x as u32)).ok_or_else(|| {
                ElmError::config(k, format!("expected integer ids, found {}", a[0]))
            }),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as u32))
                .ok_or_else(|| ElmError::config(k, format!("expected an integer id, found {v}"))),
        }
    };

    let arch = match get("model_type").and_then(Value::as_str) {
        Some(name) => Arch::from_hf_model_type(name).ok_or_else(|| {
            ElmError::config(
                "model_type",
                format!(
                    "`{name}` is unsupported ({})",
                    Arch::supported(|f| f.hf_model_type)
                ),
            )
        })?,
        None => return Err(ElmError::config("model_type", "missing from config.json")),
    };
    let family = arch.family();

    let mapped: &[&str] = &[
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rope_theta",
        "rms_norm_eps",
        "max_position_embeddings",
        "tie_word_embeddings",
        "attention_bias",
        "bos_token_id",
        "eos_token_id",
    ];
    if obj.contains_key("fixed_point_layer_idx") {
        return Err(ElmError::config(
            "fixed_point_layer_idx",
            "an ELM in the official code's integrated format, not a dense model: give it as --elm",
        ));
    }
    let windows = match family.windows {
        Some(rules) => Some(window_attention(obj, family, rules)?),
        None => None,
    };
    // Keys that change the math, accepted only at their neutral value.
    for (key, v) in obj {
        let k = key.as_str();
        if mapped.contains(&k) || HARMLESS_KEYS.contains(&k) {
            continue;
        }
        if family.hf_extra_keys.contains(&k) {
            continue;
        }
        let neutral = match k {
            "hidden_act" => v.as_str() == Some(family.hf_activation.1),
            "rope_scaling" | "quantization_config" => v.is_null(),
            "rope_parameters" => v.is_null() || rope_parameters_neutral(v),
            "use_sliding_window" | "mlp_bias" | "rope_interleaved" => v.as_bool() == Some(false),
            // Only active when use_sliding_window is true (checked above).
            "sliding_window" => {
                v.is_null() || obj.get("use_sliding_window").and_then(Value::as_bool) == Some(false)
            }
            "attention_dropout" | "hidden_dropout" => v.as_f64() == Some(0.0),
            "layer_types" => v
                .as_array()
                .is_some_and(|a| a.iter().all(|x| x.as_str() == Some("full_attention"))),
            _ => {
                return Err(ElmError::config(
                    k,
                    "unknown config.json key (not mapped, not in the harmless allow-list)",
                ))
            }
        };
        if !neutral {
            return Err(ElmError::config(
                k,
                format!("value {v} changes the model math and is unsupported"),
            ));
        }
    }

    let hidden_size = need("hidden_size")?;
    let num_heads = need("num_attention_heads")?;
    if num_heads == 0 {
        return Err(ElmError::config("num_attention_heads", "must be > 0"));
    }
    let rope_theta = match f32_key("rope_theta")? {
        Some(t) => t,
        None => get("rope_parameters")
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .map_or(10000.0, |t| t as f32),
    };
    let config = ModelConfig {
        arch,
        vocab_size: need("vocab_size")?,
        hidden_size,
        intermediate_size: need("intermediate_size")?,
        num_layers: need("num_hidden_layers")?,
        num_heads,
        num_kv_heads: usize_key("num_key_value_heads")?.unwrap_or(num_heads),
        head_dim: usize_key("head_dim")?.unwrap_or(hidden_size / num_heads),
        rope_theta,
        rms_norm_eps: f32_key("rms_norm_eps")?.unwrap_or(1e-6),
        max_position_embeddings: need("max_position_embeddings")?,
        tie_word_embeddings: bool_key("tie_word_embeddings")?.unwrap_or(false),
        attention_bias: match family.attention_bias {
            BiasRule::Always => true,
            BiasRule::Optional => bool_key("attention_bias")?.unwrap_or(false),
        },
        bos_token_id: token_id("bos_token_id")?,
        eos_token_id: token_id("eos_token_id")?,
        sliding_window: windows.map(|w| w.window),
        sliding_window_pattern: windows.map(|w| w.pattern),
        rope_local_theta: windows.map(|w| w.local_theta),
    };
    if let Some(q) = usize_key("query_pre_attn_scalar")? {
        // Gemma 3 scales scores by `query_pre_attn_scalar^-½`; we (and llama.cpp) by `D^-½`.
        if q != config.head_dim {
            return Err(ElmError::config(
                "query_pre_attn_scalar",
                format!("{q} differs from head_dim {}: unsupported", config.head_dim),
            ));
        }
    }
    if family.attention_bias == BiasRule::Always && bool_key("attention_bias")? == Some(false) {
        return Err(ElmError::config(
            "attention_bias",
            format!("{} always uses q/k/v biases", family.display_name),
        ));
    }
    config.validate()?;
    Ok(config)
}

/// A windowed family's sliding window, local/global pattern and local RoPE base.
#[derive(Clone, Copy)]
struct WindowAttention {
    window: usize,
    pattern: usize,
    local_theta: f32,
}

/// Reads (and checks) a windowed family's keys (its `hf_extra_keys`): the window; the pattern (`layer i` global
/// iff `(i + 1) % pattern == 0`) from `sliding_window_pattern` or `layer_types`, which must
/// agree when both are given; the local layers' RoPE base; and the keys that must hold
/// Gemma 3's defaults (GELU-tanh, no soft-capping, causal attention).
fn window_attention(
    obj: &Map<String, Value>,
    family: &Family,
    rules: WindowRules,
) -> Result<WindowAttention> {
    let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let window = get("sliding_window")
        .and_then(Value::as_u64)
        .ok_or_else(|| {
            ElmError::config(
                "sliding_window",
                format!("a {} config needs a window", family.display_name),
            )
        })? as usize;
    let layers = get("num_hidden_layers")
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    let stated = get("sliding_window_pattern")
        .or_else(|| get("_sliding_window_pattern"))
        .map(|v| {
            v.as_u64()
                .filter(|&p| p > 0)
                .map(|p| p as usize)
                .ok_or_else(|| {
                    ElmError::config(
                        "sliding_window_pattern",
                        format!("expected a positive integer, found {v}"),
                    )
                })
        })
        .transpose()?;
    let from_types = match get("layer_types") {
        None => None,
        Some(v) => {
            let types = v.as_array().filter(|a| a.len() == layers).ok_or_else(|| {
                ElmError::config("layer_types", format!("expected {layers} layer types"))
            })?;
            let global: Vec<bool> = types
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(true),
                    Some("sliding_attention") => Ok(false),
                    _ => Err(ElmError::config(
                        "layer_types",
                        format!("unknown layer type {t}"),
                    )),
                })
                .collect::<Result<_>>()?;
            let p = global.iter().position(|&g| g).map_or(layers + 1, |i| i + 1);
            if global
                .iter()
                .enumerate()
                .any(|(i, &g)| g != (i + 1).is_multiple_of(p))
            {
                return Err(ElmError::config(
                    "layer_types",
                    "not one global layer every `pattern` layers (unsupported layout)",
                ));
            }
            Some(p)
        }
    };
    let pattern = match (stated, from_types) {
        (Some(a), Some(b)) if a != b && b <= layers => {
            return Err(ElmError::config(
                "layer_types",
                format!("says a global layer every {b}, sliding_window_pattern says {a}"),
            ))
        }
        (Some(a), _) => a,
        (None, Some(b)) => b,
        (None, None) => rules.default_pattern,
    };
    let local_theta = match get("rope_local_base_freq") {
        None => rules.default_local_theta,
        Some(v) => v.as_f64().ok_or_else(|| {
            ElmError::config(
                "rope_local_base_freq",
                format!("expected a number, found {v}"),
            )
        })? as f32,
    };
    let own_activation = |v: &Value| v.as_str() == Some(family.hf_activation.1);
    let absent = |_: &Value| false;
    let off = |v: &Value| v.as_bool() == Some(false);
    type Check<'a> = (&'a str, &'a dyn Fn(&Value) -> bool);
    let checks: [Check; 5] = [
        ("use_bidirectional_attention", &off),
        ("hidden_activation", &own_activation),
        ("hidden_act", &own_activation),
        ("final_logit_softcapping", &absent),
        ("attn_logit_softcapping", &absent),
    ];
    for (k, ok) in checks {
        if let Some(v) = get(k) {
            if !ok(v) {
                return Err(ElmError::config(
                    k,
                    format!("value {v} changes the model math and is unsupported"),
                ));
            }
        }
    }
    Ok(WindowAttention {
        window,
        pattern,
        local_theta,
    })
}

/// `rope_parameters` (newer transformers) is neutral when it only says "default" RoPE.
fn rope_parameters_neutral(v: &Value) -> bool {
    v.as_object().is_some_and(|m| {
        m.iter().all(|(k, x)| match k.as_str() {
            "rope_type" | "type" => x.as_str() == Some("default"),
            "rope_theta" => x.is_number(),
            _ => false,
        })
    })
}

/// The `config.json` we write for a [`ModelConfig`] (readable by transformers).
pub fn config_to_hf_json(c: &ModelConfig) -> Value {
    let family = c.family();
    let (model_type, class) = (family.hf_model_type, family.hf_class);
    let mut v = json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "rope_theta": c.rope_theta,
        "rope_scaling": null,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "torch_dtype": "float32",
    });
    let (act_key, act) = family.hf_activation;
    v[act_key] = json!(act);
    if family.attention_bias == BiasRule::Optional {
        v["attention_bias"] = json!(c.attention_bias);
    }
    if family.windows.is_some() {
        let obj = v.as_object_mut().expect("an object");
        obj.insert("sliding_window".into(), json!(c.sliding_window));
        obj.insert(
            "layer_types".into(),
            json!((0..c.num_layers)
                .map(|l| match c.layer_attention(l).window {
                    Some(_) => "sliding_attention",
                    None => "full_attention",
                })
                .collect::<Vec<_>>()),
        );
        // Stated as well as implied by `layer_types`: when no layer of the model is global,
        // the types cannot tell the pattern (the hf_config fuzz target's round trip).
        obj.insert(
            "sliding_window_pattern".into(),
            json!(c.sliding_window_pattern),
        );
        obj.insert("rope_local_base_freq".into(), json!(c.rope_local_theta));
        obj.insert("query_pre_attn_scalar".into(), json!(c.head_dim));
        obj.insert("final_logit_softcapping".into(), Value::Null);
        obj.insert("attn_logit_softcapping".into(), Value::Null);
    }
    v
}

/// The HF tensor names of a model with this config, with their `[shape]`.
fn expected_tensors(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (cd, i, v) = (c.hidden_size, c.intermediate_size, c.vocab_size);
    let (hd, kvd) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let mut out = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, cd]),
        ("model.norm.weight".to_string(), vec![cd]),
    ];
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, cd]));
    }
    for l in 0..c.num_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        out.push((p("input_layernorm.weight"), vec![cd]));
        out.push((p("self_attn.q_proj.weight"), vec![hd, cd]));
        out.push((p("self_attn.k_proj.weight"), vec![kvd, cd]));
        out.push((p("self_attn.v_proj.weight"), vec![kvd, cd]));
        out.push((p("self_attn.o_proj.weight"), vec![cd, hd]));
        if c.attention_bias {
            out.push((p("self_attn.q_proj.bias"), vec![hd]));
            out.push((p("self_attn.k_proj.bias"), vec![kvd]));
            out.push((p("self_attn.v_proj.bias"), vec![kvd]));
        }
        out.push((p("post_attention_layernorm.weight"), vec![cd]));
        if c.has_gemma_norms() {
            out.push((p("pre_feedforward_layernorm.weight"), vec![cd]));
            out.push((p("post_feedforward_layernorm.weight"), vec![cd]));
            out.push((p("self_attn.q_norm.weight"), vec![c.head_dim]));
            out.push((p("self_attn.k_norm.weight"), vec![c.head_dim]));
        }
        out.push((p("mlp.gate_proj.weight"), vec![i, cd]));
        out.push((p("mlp.up_proj.weight"), vec![i, cd]));
        out.push((p("mlp.down_proj.weight"), vec![cd, i]));
    }
    out
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

fn open_shard(path: &Path) -> Result<Shard> {
    let file = fs::File::open(path).map_err(|e| ElmError::io(path, e))?;
    // SAFETY: read-only map, dropped before returning from the loader.
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ElmError::io(path, e))?;
    Ok(Shard {
        path: path.to_path_buf(),
        mmap,
    })
}

/// Converts one safetensors tensor to f32 values (row-major).
fn view_to_f32(name: &str, view: &TensorView<'_>) -> Result<Vec<f32>> {
    let values = decode_view(name, view)?;
    // NaN or ∞ weights are an invalid model: refused where they enter (see gguf_model).
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(ElmError::tensor(
            name,
            format!(
                "element {i} is {} (a corrupt or invalid model file)",
                values[i]
            ),
        ));
    }
    Ok(values)
}

fn decode_view(name: &str, view: &TensorView<'_>) -> Result<Vec<f32>> {
    use rayon::prelude::*;
    let data = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => data
            .par_chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => data
            .par_chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .par_chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(ElmError::Unsupported(format!(
                "tensor `{name}` has dtype {other:?} (supported: F32, F16, BF16)"
            )))
        }
    })
}

/// Reads and parses `dir/config.json`.
pub fn read_hf_config(dir: &Path) -> Result<ModelConfig> {
    let path = dir.join("config.json");
    let text = fs::read_to_string(&path).map_err(|e| ElmError::io(&path, e))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| json_err(&path, e.to_string()))?;
    config_from_hf_json(&value).map_err(|e| e.in_file(&path))
}

/// The safetensors files of a checkpoint directory: `model.safetensors`, or the shards
/// named in `model.safetensors.index.json` (the index's `weight_map` is checked
/// against the shards' contents).
/// `(index path, tensor name -> shard file name)` of a sharded checkpoint.
type ShardIndex = (PathBuf, BTreeMap<String, String>);

fn shard_paths(dir: &Path) -> Result<(Vec<PathBuf>, Option<ShardIndex>)> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = fs::read_to_string(&index).map_err(|e| ElmError::io(&index, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| json_err(&index, e.to_string()))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| json_err(&index, "missing object `weight_map`"))?;
        let mut weight_map = BTreeMap::new();
        for (name, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| json_err(&index, format!("weight_map[`{name}`] is not a string")))?;
            if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                return Err(json_err(
                    &index,
                    format!("shard name `{file}` must be a plain file name"),
                ));
            }
            weight_map.insert(name.clone(), file.to_string());
        }
        let mut files: Vec<PathBuf> = weight_map.values().map(|f| dir.join(f)).collect();
        files.sort();
        files.dedup();
        Ok((files, Some((index, weight_map))))
    } else if single.is_file() {
        Ok((vec![single], None))
    } else {
        Err(ElmError::format(
            dir,
            "no model.safetensors or model.safetensors.index.json in checkpoint directory",
        ))
    }
}

/// Loads an HF Llama/Qwen2 checkpoint directory into dense f32 weights.
pub fn load_hf_model(dir: impl AsRef<Path>) -> Result<ModelWeights> {
    let dir = dir.as_ref();
    let config = read_hf_config(dir)?;
    Ok(load_hf_model_with(dir, config, &[])?.0)
}

/// The tensors of an HF-layout checkpoint in `dir` for a model of `config` (its config.json is
/// not read), plus the `extra` tensors a derived format adds (name, shape), returned by name as
/// row-major f32 values. Every strictness of [`load_hf_model`] applies: a missing, unexpected
/// or mis-shaped tensor is an error naming it.
pub fn load_hf_model_with(
    dir: &Path,
    config: ModelConfig,
    extra: &[(String, Vec<usize>)],
) -> Result<(ModelWeights, HashMap<String, Vec<f32>>)> {
    config.validate()?;
    let (files, index) = shard_paths(dir)?;
    let shards = files
        .iter()
        .map(|p| open_shard(p))
        .collect::<Result<Vec<_>>>()?;
    let parsed = shards
        .iter()
        .map(|s| {
            SafeTensors::deserialize(&s.mmap)
                .map_err(|e| ElmError::format(&s.path, format!("invalid safetensors: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;

    // name -> shard index; duplicates across shards are an error.
    let mut location: HashMap<String, usize> = HashMap::new();
    for (si, st) in parsed.iter().enumerate() {
        for name in st.names() {
            if let Some(prev) = location.insert(name.clone(), si) {
                return Err(ElmError::tensor(
                    name,
                    format!(
                        "present in both {} and {}",
                        shards[prev].path.display(),
                        shards[si].path.display()
                    ),
                ));
            }
        }
    }
    if let Some((index_path, weight_map)) = &index {
        for (name, file) in weight_map {
            let actual = location.get(name).map(|&si| &shards[si].path);
            if actual != Some(&dir.join(file)) {
                return Err(ElmError::tensor(
                    name,
                    format!(
                        "{} says it is in {file}, but it is not there",
                        index_path.display()
                    ),
                ));
            }
        }
        if let Some(name) = location.keys().find(|n| !weight_map.contains_key(*n)) {
            return Err(ElmError::tensor(
                name,
                format!("not listed in {}", index_path.display()),
            ));
        }
    }

    let mut expected = expected_tensors(&config);
    expected.extend(extra.iter().cloned());
    let expected_names: HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    // A tied checkpoint may still carry lm_head.weight; accept it only if it is an
    // exact copy of the embedding (otherwise tying would silently change the model).
    let tied_copy = config.tie_word_embeddings && location.contains_key("lm_head.weight");
    let mut sorted_names: Vec<&String> = location.keys().collect();
    sorted_names.sort();
    for name in sorted_names {
        let tolerated = tied_copy && name == "lm_head.weight";
        if !expected_names.contains(name.as_str()) && !tolerated {
            return Err(ElmError::tensor(
                name,
                format!(
                    "unexpected tensor in {} (not part of a {:?} model with this config)",
                    shards[location[name]].path.display(),
                    config.arch
                ),
            ));
        }
    }

    let mut tensors: HashMap<String, Vec<f32>> = HashMap::with_capacity(expected.len());
    for (name, shape) in &expected {
        let si = *location.get(name).ok_or_else(|| {
            ElmError::tensor(name, format!("missing from checkpoint {}", dir.display()))
        })?;
        let view = parsed[si]
            .tensor(name)
            .map_err(|e| ElmError::tensor(name, e.to_string()))?;
        if view.shape() != &shape[..] {
            return Err(ElmError::tensor(
                name,
                format!(
                    "shape {:?} in {} but the config implies {shape:?}",
                    view.shape(),
                    shards[si].path.display()
                ),
            ));
        }
        tensors.insert(name.clone(), view_to_f32(name, &view)?);
    }
    if tied_copy {
        let view = parsed[location["lm_head.weight"]]
            .tensor("lm_head.weight")
            .map_err(|e| ElmError::tensor("lm_head.weight", e.to_string()))?;
        let head = view_to_f32("lm_head.weight", &view)?;
        if head != tensors["model.embed_tokens.weight"] {
            return Err(ElmError::tensor(
                "lm_head.weight",
                "tie_word_embeddings is true but lm_head.weight differs from the embedding",
            ));
        }
    }

    let shapes: HashMap<&str, &Vec<usize>> =
        expected.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let mut take2 = |name: String| -> Array2<f32> {
        let s = shapes[name.as_str()];
        Array2::from_shape_vec((s[0], s[1]), tensors.remove(&name).expect("checked"))
            .expect("shape checked")
    };
    let embed = take2("model.embed_tokens.weight".into());
    let lm_head = (!config.tie_word_embeddings).then(|| take2("lm_head.weight".into()));
    let mut layers = Vec::with_capacity(config.num_layers);
    for l in 0..config.num_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        layers.push(LayerWeights {
            attn_norm: Array1::zeros(0),
            wq: take2(p("self_attn.q_proj.weight")),
            wk: take2(p("self_attn.k_proj.weight")),
            wv: take2(p("self_attn.v_proj.weight")),
            wo: take2(p("self_attn.o_proj.weight")),
            bq: None,
            bk: None,
            bv: None,
            mlp_norm: Array1::zeros(0),
            w_gate: take2(p("mlp.gate_proj.weight")),
            w_up: take2(p("mlp.up_proj.weight")),
            w_down: take2(p("mlp.down_proj.weight")),
            gemma: None,
        });
    }
    let off = norm_offset(config.arch);
    // A vector, plus `plus` (a norm gain's offset, 0 for a bias).
    let mut take1 = |name: String, plus: f32| {
        Array1::from_vec(tensors.remove(&name).expect("checked")).mapv(|w| w + plus)
    };
    for (l, layer) in layers.iter_mut().enumerate() {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        layer.attn_norm = take1(p("input_layernorm.weight"), off);
        if config.has_gemma_norms() {
            layer.mlp_norm = take1(p("pre_feedforward_layernorm.weight"), off);
            layer.gemma = Some(Gemma3Block {
                q_norm: take1(p("self_attn.q_norm.weight"), off),
                k_norm: take1(p("self_attn.k_norm.weight"), off),
                post_attn_norm: take1(p("post_attention_layernorm.weight"), off),
                post_mlp_norm: take1(p("post_feedforward_layernorm.weight"), off),
                attention: config.layer_attention(l),
            });
        } else {
            layer.mlp_norm = take1(p("post_attention_layernorm.weight"), off);
        }
        if config.attention_bias {
            layer.bq = Some(take1(p("self_attn.q_proj.bias"), 0.0));
            layer.bk = Some(take1(p("self_attn.k_proj.bias"), 0.0));
            layer.bv = Some(take1(p("self_attn.v_proj.bias"), 0.0));
        }
    }
    let final_norm = take1("model.norm.weight".into(), off);
    let extras = extra
        .iter()
        .map(|(name, _)| (name.clone(), tensors.remove(name).expect("checked")))
        .collect();

    Ok((
        ModelWeights {
            config,
            embed,
            layers,
            final_norm,
            lm_head,
        },
        extras,
    ))
}

/// Writes `config.json` + `model.safetensors` (F32) into `dir` (created if needed).
/// Each file is written to a temp file and renamed, so readers never see a torn file.
pub fn save_hf_model(weights: &ModelWeights, dir: impl AsRef<Path>) -> Result<()> {
    save_hf_model_with(
        weights,
        dir.as_ref(),
        &[],
        &config_to_hf_json(&weights.config),
    )
}

/// [`save_hf_model`] for a format derived from HF's (the mirror of [`load_hf_model_with`]):
/// `weights`' tensors under their HF names plus the `extra` named tensors, and `config` as
/// `config.json`.
pub fn save_hf_model_with(
    weights: &ModelWeights,
    dir: &Path,
    extra: &[(String, ArrayD<f32>)],
    config: &Value,
) -> Result<()> {
    weights.config.validate()?;
    fs::create_dir_all(dir).map_err(|e| ElmError::io(dir, e))?;
    check_layer_count(weights)?;
    let stored = hf_tensors(weights);
    check_shapes(&weights.config, &stored)?;

    let mut named: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut push = |name: String, shape: &[usize], values: Vec<f32>| {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        named.push((name, shape.to_vec(), bytes));
    };
    for (name, shape, values) in stored {
        push(name, &shape, values);
    }
    for (name, a) in extra {
        push(
            name.clone(),
            a.shape(),
            a.as_standard_layout().iter().copied().collect(),
        );
    }
    let views = named
        .iter()
        .map(|(n, s, b)| {
            TensorView::new(Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| ElmError::tensor(n, e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    let bytes = safetensors::serialize(views, &Some(meta))
        .map_err(|e| ElmError::format(dir.join("model.safetensors"), e.to_string()))?;
    write_atomic(&dir.join("model.safetensors"), &bytes)?;

    let config = serde_json::to_string_pretty(config)
        .map_err(|e| json_err(&dir.join("config.json"), e.to_string()))?;
    write_atomic(&dir.join("config.json"), config.as_bytes())
}

/// Checks that the weights have the config's layer count and head tying before writing them.
fn check_layer_count(w: &ModelWeights) -> Result<()> {
    let c = &w.config;
    if w.layers.len() != c.num_layers {
        return Err(ElmError::config(
            "num_layers",
            format!(
                "config says {} but weights have {} layers",
                c.num_layers,
                w.layers.len()
            ),
        ));
    }
    if w.lm_head.is_some() == c.tie_word_embeddings {
        return Err(ElmError::config(
            "tie_word_embeddings",
            "lm_head must be None exactly when embeddings are tied",
        ));
    }
    Ok(())
}

/// What a Gemma 3 norm gain is stored as in an HF checkpoint: HF's Gemma RMSNorm multiplies by
/// `1 + weight`, while [`LayerWeights`] (like llama.cpp's GGUF) holds the gain itself.
fn norm_offset(arch: Arch) -> f32 {
    arch.family().hf_norm_gain_offset
}

/// `w`'s tensors under their HF names with their shapes and stored values, in the order written.
fn hf_tensors(w: &ModelWeights) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let off = norm_offset(w.config.arch);
    let mat = |a: &Array2<f32>| a.as_standard_layout().iter().copied().collect::<Vec<f32>>();
    let norm = |v: &Array1<f32>| v.iter().map(|g| g - off).collect::<Vec<f32>>();
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = vec![
        (
            "model.embed_tokens.weight".into(),
            w.embed.shape().to_vec(),
            mat(&w.embed),
        ),
        (
            "model.norm.weight".into(),
            w.final_norm.shape().to_vec(),
            norm(&w.final_norm),
        ),
    ];
    if let Some(h) = &w.lm_head {
        out.push(("lm_head.weight".into(), h.shape().to_vec(), mat(h)));
    }
    for (l, lw) in w.layers.iter().enumerate() {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let mut m = |name: &str, a: &Array2<f32>| out.push((p(name), a.shape().to_vec(), mat(a)));
        m("self_attn.q_proj.weight", &lw.wq);
        m("self_attn.k_proj.weight", &lw.wk);
        m("self_attn.v_proj.weight", &lw.wv);
        m("self_attn.o_proj.weight", &lw.wo);
        m("mlp.gate_proj.weight", &lw.w_gate);
        m("mlp.up_proj.weight", &lw.w_up);
        m("mlp.down_proj.weight", &lw.w_down);
        let mut v = |name: String, a: &Array1<f32>, values: Vec<f32>| {
            out.push((p(&name), a.shape().to_vec(), values))
        };
        for (b, n) in [(&lw.bq, "q"), (&lw.bk, "k"), (&lw.bv, "v")] {
            if let Some(b) = b {
                v(format!("self_attn.{n}_proj.bias"), b, b.to_vec());
            }
        }
        v(
            "input_layernorm.weight".into(),
            &lw.attn_norm,
            norm(&lw.attn_norm),
        );
        match &lw.gemma {
            // Gemma 3 names its MLP's input norm `pre_feedforward_layernorm` and uses
            // `post_attention_layernorm` for the norm of the attention output.
            Some(g) => {
                v(
                    "pre_feedforward_layernorm.weight".into(),
                    &lw.mlp_norm,
                    norm(&lw.mlp_norm),
                );
                v("self_attn.q_norm.weight".into(), &g.q_norm, norm(&g.q_norm));
                v("self_attn.k_norm.weight".into(), &g.k_norm, norm(&g.k_norm));
                v(
                    "post_attention_layernorm.weight".into(),
                    &g.post_attn_norm,
                    norm(&g.post_attn_norm),
                );
                v(
                    "post_feedforward_layernorm.weight".into(),
                    &g.post_mlp_norm,
                    norm(&g.post_mlp_norm),
                );
            }
            None => v(
                "post_attention_layernorm.weight".into(),
                &lw.mlp_norm,
                norm(&lw.mlp_norm),
            ),
        }
    }
    out
}

/// Checks the tensors about to be written against the names and shapes `c` implies.
fn check_shapes(c: &ModelConfig, stored: &[(String, Vec<usize>, Vec<f32>)]) -> Result<()> {
    let actual = stored.iter().map(|(n, s, _)| (n.clone(), s.clone()));
    let expected: Map<String, Value> = expected_tensors(c)
        .into_iter()
        .map(|(n, s)| (n, json!(s)))
        .collect();
    if stored.len() != expected.len() {
        return Err(ElmError::config(
            "attention_bias",
            "q/k/v biases or Gemma 3 norms present/absent inconsistently with the config",
        ));
    }
    for (name, shape) in actual {
        match expected.get(&name) {
            Some(s) if *s == json!(shape) => {}
            Some(s) => {
                return Err(ElmError::tensor(
                    &name,
                    format!("shape {shape:?} but the config implies {s}"),
                ))
            }
            None => {
                return Err(ElmError::tensor(
                    &name,
                    "not part of a model with this config",
                ))
            }
        }
    }
    Ok(())
}
