//! GGUF → [`ModelWeights`] (HF layout) for Llama and Qwen2 files written by llama.cpp's
//! `convert_hf_to_gguf.py`.
//!
//! Tensor names (`blk.{i}.*`) map to HF names as in llama.cpp's tensor map. Llama
//! files store the Q/K projection rows permuted for ggml's *interleaved* RoPE
//! (pairs `(2i, 2i+1)`); we undo that so the weights use HF's *half-split* RoPE
//! (pairs `(i, i + D/2)`). Qwen2 files use NeoX (half-split) RoPE and are not permuted.

use std::collections::HashSet;

use ndarray::{Array1, Array2, Axis};

use super::gguf::{qformat_of, GgufFile};
use crate::error::{ElmError, Result};
use crate::model_data::config::LayerAttention;
use crate::model_data::weights::Gemma3Block;
use crate::model_data::{Arch, LayerWeights, ModelConfig, ModelWeights};
use crate::model_data::{QFfn, QLayer, QuantWeights};
use crate::quant::{Linear, QFormat, QMatrix, WeightStorage, WriteFormat};

/// GGUF metadata key of a saved quantized ELM's [`crate::equilibrium::ElmConfig`] (JSON); a file
/// with it is not a dense model (see `elm::quant_gguf`).
pub const ELM_CONFIG_KEY: &str = "elm.config";

/// Reads the model hyper-parameters from `{arch}.*` / `tokenizer.ggml.*` metadata.
///
/// Rejects metadata that would change the math we implement (RoPE scaling, partial
/// rotary dims, unequal K/V head sizes) with a `Config` error naming the key.
/// Every error names the file (a `Config` error of a bad value included: `--json` prints it as
/// the error's `file`).
pub fn config_from_gguf(gguf: &GgufFile) -> Result<ModelConfig> {
    read_config(gguf).map_err(|e| e.in_file(gguf.path()))
}

fn read_config(gguf: &GgufFile) -> Result<ModelConfig> {
    if gguf.get(ELM_CONFIG_KEY).is_some() {
        return Err(ElmError::format(
            gguf.path(),
            format!(
                "holds an ELM (`{ELM_CONFIG_KEY}` metadata, written by `elm quantize --elm`), \
                 not a dense model: pass it as `--elm FILE` (ElmModel::load_with)"
            ),
        ));
    }
    let arch_name = gguf.get_str("general.architecture")?;
    let arch = Arch::from_gguf_name(arch_name).ok_or_else(|| {
        ElmError::Unsupported(format!(
            "general.architecture `{arch_name}` (supported: {})",
            Arch::supported(|f| f.gguf_name)
        ))
    })?;
    let family = arch.family();
    let key = |k: &str| format!("{arch_name}.{k}");
    let hidden_size = gguf.get_usize(&key("embedding_length"))?;
    let num_heads = gguf.get_usize(&key("attention.head_count"))?;
    let num_kv_heads = match gguf.get(&key("attention.head_count_kv")) {
        Some(_) => gguf.get_usize(&key("attention.head_count_kv"))?,
        None => num_heads,
    };
    if num_heads == 0 {
        return Err(ElmError::config(key("attention.head_count"), "must be > 0"));
    }
    let head_dim = match gguf.get(&key("attention.key_length")) {
        Some(_) => gguf.get_usize(&key("attention.key_length"))?,
        None => hidden_size / num_heads,
    };
    if let Some(v) = gguf.get(&key("attention.value_length")) {
        if v.as_int() != Some(head_dim as i128) {
            return Err(ElmError::config(
                key("attention.value_length"),
                format!("{v:?} differs from key_length {head_dim}; unsupported"),
            ));
        }
    }
    if let Some(v) = gguf.get(&key("rope.dimension_count")) {
        if v.as_int() != Some(head_dim as i128) {
            return Err(ElmError::config(
                key("rope.dimension_count"),
                format!("{v:?} != head_dim {head_dim}: partial rotary embeddings are unsupported"),
            ));
        }
    }
    if let Some(v) = gguf.get(&key("rope.scaling.type")) {
        if v.as_str() != Some("none") {
            return Err(ElmError::config(
                key("rope.scaling.type"),
                format!("{v:?}: RoPE scaling is unsupported"),
            ));
        }
    }
    let vocab_size = match gguf.get(&key("vocab_size")) {
        Some(_) => gguf.get_usize(&key("vocab_size"))?,
        None => gguf.get_str_array("tokenizer.ggml.tokens")?.len(),
    };
    let opt_usize = |k: &str| -> Result<Option<usize>> {
        match gguf.get(k) {
            None => Ok(None),
            Some(_) => Ok(Some(gguf.get_usize(k)?)),
        }
    };
    // Token ids are u32 everywhere downstream: a larger one is refused, never truncated.
    let opt_id = |k: &str| -> Result<Option<u32>> {
        opt_usize(k)?
            .map(|id| {
                u32::try_from(id).map_err(|_| {
                    ElmError::format(gguf.path(), format!("metadata `{k}` = {id} exceeds u32"))
                })
            })
            .transpose()
    };
    let config = ModelConfig {
        arch,
        vocab_size,
        hidden_size,
        intermediate_size: gguf.get_usize(&key("feed_forward_length"))?,
        num_layers: gguf.get_usize(&key("block_count"))?,
        num_heads,
        num_kv_heads,
        head_dim,
        rope_theta: match gguf.get(&key("rope.freq_base")) {
            Some(_) => gguf.get_f64(&key("rope.freq_base"))? as f32,
            None => 10000.0,
        },
        rms_norm_eps: gguf.get_f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
        max_position_embeddings: gguf.get_usize(&key("context_length"))?,
        tie_word_embeddings: gguf.tensor_info("output.weight").is_none(),
        attention_bias: gguf.tensor_info("blk.0.attn_q.bias").is_some(),
        bos_token_id: opt_id("tokenizer.ggml.bos_token_id")?,
        eos_token_id: opt_id("tokenizer.ggml.eos_token_id")?,
        // A family with local layers needs a window: 0 there is an invalid file (validate
        // refuses it), not "no window". llama.cpp gives the others no sliding attention, and 0
        // is what their writers store for "off".
        sliding_window: match family.windows {
            Some(_) => opt_usize(&key("attention.sliding_window"))?,
            None => opt_usize(&key("attention.sliding_window"))?.filter(|&w| w > 0),
        },
        // What the metadata does not carry, the family's rules say (llama.cpp hard-codes them).
        sliding_window_pattern: match family.windows {
            Some(rules) => Some(
                opt_usize(&key("attention.sliding_window_pattern"))?
                    .unwrap_or(rules.default_pattern),
            ),
            None => None,
        },
        rope_local_theta: match gguf.get(&key("rope.freq_base_swa")) {
            Some(_) => Some(gguf.get_f64(&key("rope.freq_base_swa"))? as f32),
            None => family.windows.map(|rules| rules.default_local_theta),
        },
    };
    // Name the file and the GGUF key the field came from, not only our field name.
    config.validate().map_err(|e| match e {
        ElmError::Config { field, msg } => {
            let gguf_key = match field.as_str() {
                "hidden_size" => key("embedding_length"),
                "intermediate_size" => key("feed_forward_length"),
                "num_layers" => key("block_count"),
                "num_heads" => key("attention.head_count"),
                "num_kv_heads" => key("attention.head_count_kv"),
                "head_dim" => key("attention.key_length"),
                "rope_theta" => key("rope.freq_base"),
                "rms_norm_eps" => key("attention.layer_norm_rms_epsilon"),
                "vocab_size" => key("vocab_size"),
                "max_position_embeddings" => key("context_length"),
                _ => String::new(),
            };
            let field = if gguf_key.is_empty() {
                field
            } else {
                format!("{field} (GGUF key {gguf_key})")
            };
            ElmError::config(field, msg).in_file(gguf.path())
        }
        e => e.in_file(gguf.path()),
    })?;
    Ok(config)
}

/// For every HF half-split row of a `[n_head * D, ..]` Q/K tensor, the GGUF
/// interleaved-RoPE row holding it: within each head, HF row `s * D/2 + i` is GGUF
/// row `2i + s` (`s ∈ {0, 1}`), llama.cpp's `permute` (convert_hf_to_gguf.py).
fn gguf_row_of_hf_row(rows: usize, n_head: usize) -> Vec<usize> {
    assert!(
        n_head > 0 && rows.is_multiple_of(n_head) && (rows / n_head).is_multiple_of(2),
        "rows {rows}, heads {n_head}"
    );
    let d = rows / n_head;
    let half = d / 2;
    (0..rows)
        .map(|hf_row| {
            let (h, r) = (hf_row / d, hf_row % d);
            let (s, i) = (r / half, r % half);
            h * d + 2 * i + s
        })
        .collect()
}

/// Inverse of llama.cpp's `permute`: GGUF interleaved-RoPE row order → HF half-split
/// order, for a `[n_head * D, C]` Q or K weight (or a `[n_head * D, 1]` bias).
pub fn unpermute_rope_rows(w: &Array2<f32>, n_head: usize) -> Array2<f32> {
    w.select(Axis(0), &gguf_row_of_hf_row(w.nrows(), n_head))
}

/// llama.cpp's `permute`: HF half-split row order → GGUF interleaved order
/// (inverse of [`unpermute_rope_rows`]).
pub fn permute_rope_rows(w: &Array2<f32>, n_head: usize) -> Array2<f32> {
    let mut hf_row_of_gguf_row = vec![0; w.nrows()];
    for (hf_row, gguf_row) in gguf_row_of_hf_row(w.nrows(), n_head)
        .into_iter()
        .enumerate()
    {
        hf_row_of_gguf_row[gguf_row] = hf_row;
    }
    w.select(Axis(0), &hf_row_of_gguf_row)
}

/// Pulls tensors out of a GGUF file by name, checking shapes, and remembers which
/// names were used so that leftovers can be reported as unexpected.
/// `(b_q, b_k, b_v)` of one layer.
pub(crate) type AttentionBiases = (
    Option<Array1<f32>>,
    Option<Array1<f32>>,
    Option<Array1<f32>>,
);

/// How [`Taker::linear`] stores the `[_, cols]` matrix `name` under `storage`: `(keep,
/// requantize)`, the file's block format when its blocks are kept as stored (`auto`, or
/// `--weights` naming the file's own format, and whole blocks per row), else the format it is
/// quantized to (`None`: f32). One rule for loading a matrix and for naming, without reading
/// it, the format a dropped layer would have had ([`stored_linear_format`]).
fn linear_storage(
    gguf: &GgufFile,
    name: &str,
    cols: usize,
    storage: WeightStorage,
) -> (Option<QFormat>, Option<WriteFormat>) {
    let file_format = gguf.tensor_info(name).and_then(|i| qformat_of(i.ggml_type));
    let (keep, requantize) = match storage {
        WeightStorage::F32 => (None, None),
        WeightStorage::Auto => (file_format, file_format.map(QFormat::write_format)),
        WeightStorage::Quant(f) => (file_format.filter(|&ff| ff == QFormat::from(f)), Some(f)),
    };
    (
        keep.filter(|f| cols.is_multiple_of(f.block_elems())),
        requantize,
    )
}

/// The block format matrix `name` (`cols` wide) gets when loaded under `storage` (`None`:
/// f32), without reading its data.
pub fn stored_linear_format(
    gguf: &GgufFile,
    name: &str,
    cols: usize,
    storage: WeightStorage,
) -> Option<WriteFormat> {
    match linear_storage(gguf, name, cols, storage) {
        (Some(kept), _) => Some(kept.write_format()),
        (None, requantize) => requantize,
    }
}

pub(crate) struct Taker<'a> {
    gguf: &'a GgufFile,
    used: HashSet<String>,
}

impl<'a> Taker<'a> {
    pub(crate) fn new(gguf: &'a GgufFile) -> Self {
        Taker {
            gguf,
            used: HashSet::new(),
        }
    }

    /// The first tensor of the file no `take` used, as an `unexpected tensor` error.
    pub(crate) fn finish(&self) -> Result<()> {
        match self
            .gguf
            .tensors()
            .iter()
            .find(|x| !self.used.contains(&x.name))
        {
            Some(extra) => Err(ElmError::tensor(
                &extra.name,
                format!("unexpected tensor in {}", self.gguf.path().display()),
            )),
            None => Ok(()),
        }
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Array2<f32>> {
        let info = self.gguf.tensor_info(name).ok_or_else(|| {
            ElmError::tensor(name, format!("missing from {}", self.gguf.path().display()))
        })?;
        if info.shape() != [rows, cols] {
            return Err(ElmError::tensor(
                name,
                format!(
                    "shape {:?} (HF order; GGUF ne {:?}) but the config implies [{rows}, {cols}]",
                    info.shape(),
                    info.ne
                ),
            ));
        }
        self.used.insert(name.to_string());
        let w = self.gguf.take_tensor_f32(name)?;
        check_finite(name, w.as_slice())?;
        Ok(w.into_dimensionality().expect("2 dims checked"))
    }

    /// Marks every tensor of block `layer` as used without reading it: a model that drops the
    /// layer (an ELM's replaced window) never faults its bytes in.
    pub(crate) fn skip_layer(&mut self, layer: usize) {
        let prefix = format!("blk.{layer}.");
        for t in self.gguf.tensors() {
            if t.name.starts_with(&prefix) {
                self.used.insert(t.name.clone());
            }
        }
    }

    /// A `[rows, cols]` matrix in the storage `storage` asks for: a quantized tensor of the
    /// wanted (or, with `Auto`, any supported) block format is copied as raw blocks;
    /// anything else is dequantized and, if a block format is wanted, quantized again.
    /// `rope_heads`: undo llama.cpp's Q/K row permutation (whole rows, so exact on blocks).
    pub(crate) fn linear(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        storage: WeightStorage,
        rope_heads: Option<usize>,
    ) -> Result<Linear> {
        let (keep, requantize) = linear_storage(self.gguf, name, cols, storage);
        let permute = |w: Array2<f32>| match rope_heads {
            Some(h) => unpermute_rope_rows(&w, h),
            None => w,
        };
        match (keep, requantize) {
            (Some(f), _) => {
                let info = self.gguf.tensor_info(name).expect("format read above");
                if info.shape() != [rows, cols] {
                    // Same message as the f32 path.
                    return self.matrix(name, rows, cols).map(Linear::F32);
                }
                self.used.insert(name.to_string());
                let blocks = self.gguf.take_tensor_bytes(name)?;
                let q = QMatrix::from_blocks(f, rows, cols, blocks)
                    .map_err(|e| ElmError::tensor(name, e.to_string()))?;
                Ok(Linear::Quant(match rope_heads {
                    Some(h) => q.select_rows(&gguf_row_of_hf_row(rows, h))?,
                    None => q,
                }))
            }
            (None, Some(f)) => Ok(Linear::Quant(QMatrix::quantize(
                permute(self.matrix(name, rows, cols)?).view(),
                f,
            ))),
            (None, None) => Ok(Linear::F32(permute(self.matrix(name, rows, cols)?))),
        }
    }

    /// The q/k/v biases of one layer (`name` maps `attn_q.bias` etc. to its tensor name), `None`
    /// without attention bias; for Llama the q/k rows go back from llama.cpp's rope order to HF's.
    pub(crate) fn attention_biases(
        &mut self,
        cfg: &ModelConfig,
        name: impl Fn(&str) -> String,
    ) -> Result<AttentionBiases> {
        if !cfg.attention_bias {
            return Ok((None, None, None));
        }
        let (h, kv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let unrope = |b: Array1<f32>, heads: usize| {
            if cfg.family().gguf_permutes_qk_rows {
                unpermute_rope_rows(&b.insert_axis(Axis(1)), heads).remove_axis(Axis(1))
            } else {
                b
            }
        };
        Ok((
            Some(unrope(self.vector(&name("attn_q.bias"), h * d)?, h)),
            Some(unrope(self.vector(&name("attn_k.bias"), kv * d)?, kv)),
            Some(self.vector(&name("attn_v.bias"), kv * d)?),
        ))
    }

    /// One block for the inference path (`name` maps `attn_q.weight` etc. to its tensor name),
    /// its matrices stored as `storage` says; for Llama the q/k rows go back from llama.cpp's
    /// rope order to HF's.
    pub(crate) fn qlayer(
        &mut self,
        cfg: &ModelConfig,
        name: impl Fn(&str) -> String,
        storage: WeightStorage,
        attention: LayerAttention,
    ) -> Result<QLayer> {
        let c = cfg.hidden_size;
        let (h, kv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let rope = |heads: usize| cfg.family().gguf_permutes_qk_rows.then_some(heads);
        let (bq, bk, bv) = self.attention_biases(cfg, &name)?;
        let ffn = self.qffn(cfg, &name, storage)?;
        Ok(QLayer {
            attn_norm: self.vector(&name("attn_norm.weight"), c)?,
            wq: self.linear(&name("attn_q.weight"), h * d, c, storage, rope(h))?,
            wk: self.linear(&name("attn_k.weight"), kv * d, c, storage, rope(kv))?,
            wv: self.linear(&name("attn_v.weight"), kv * d, c, storage, None)?,
            wo: self.linear(&name("attn_output.weight"), c, h * d, storage, None)?,
            bq,
            bk,
            bv,
            mlp_norm: ffn.mlp_norm,
            w_gate: ffn.w_gate,
            w_up: ffn.w_up,
            w_down: ffn.w_down,
            gemma: self.gemma_block(cfg, &name, attention)?,
        })
    }

    /// A Gemma 3 block's extra norms (`attn_q_norm`, `attn_k_norm`, `post_attention_norm`,
    /// `post_ffw_norm`, stored with the `1 +` of Gemma's RMSNorm already added by llama.cpp's
    /// converter), and how its layer attends; `None` for other families.
    pub(crate) fn gemma_block(
        &mut self,
        cfg: &ModelConfig,
        name: impl Fn(&str) -> String,
        attention: LayerAttention,
    ) -> Result<Option<Gemma3Block>> {
        if !cfg.has_gemma_norms() {
            return Ok(None);
        }
        let (c, d) = (cfg.hidden_size, cfg.head_dim);
        Ok(Some(Gemma3Block {
            q_norm: self.vector(&name("attn_q_norm.weight"), d)?,
            k_norm: self.vector(&name("attn_k_norm.weight"), d)?,
            post_attn_norm: self.vector(&name("post_attention_norm.weight"), c)?,
            post_mlp_norm: self.vector(&name("post_ffw_norm.weight"), c)?,
            attention,
        }))
    }

    /// A feed-forward-only block for the inference path: the `ffn_*` tensors of a block.
    pub(crate) fn qffn(
        &mut self,
        cfg: &ModelConfig,
        name: impl Fn(&str) -> String,
        storage: WeightStorage,
    ) -> Result<QFfn> {
        let (c, i_dim) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(QFfn {
            mlp_norm: self.vector(&name("ffn_norm.weight"), c)?,
            w_gate: self.linear(&name("ffn_gate.weight"), i_dim, c, storage, None)?,
            w_up: self.linear(&name("ffn_up.weight"), i_dim, c, storage, None)?,
            w_down: self.linear(&name("ffn_down.weight"), c, i_dim, storage, None)?,
        })
    }

    pub(crate) fn vector(&mut self, name: &str, len: usize) -> Result<Array1<f32>> {
        let info = self.gguf.tensor_info(name).ok_or_else(|| {
            ElmError::tensor(name, format!("missing from {}", self.gguf.path().display()))
        })?;
        if info.shape() != [len] {
            return Err(ElmError::tensor(
                name,
                format!("shape {:?} but the config implies [{len}]", info.shape()),
            ));
        }
        self.used.insert(name.to_string());
        let v = self.gguf.take_tensor_f32(name)?;
        check_finite(name, v.as_slice())?;
        Ok(v.into_dimensionality().expect("1 dim checked"))
    }
}

/// Refuses a tensor holding NaN or ∞ where it enters as f32: one pass over values just
/// decoded, cheap beside the decoding. Without it a NaN weight quantized for `--weights q8_0`
/// becomes 0 and the model prints plausible tokens; kept as f32 it makes every logit NaN.
/// (Tensors kept in their blocks are not decoded at load; a NaN scale there shows as
/// non-finite logits, which the sampler and `logits` refuse.)
fn check_finite(name: &str, values: Option<&[f32]>) -> Result<()> {
    let Some(values) = values else { return Ok(()) };
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(ElmError::tensor(
            name,
            format!(
                "element {i} is {} (a corrupt or invalid model file)",
                values[i]
            ),
        )),
    }
}

/// Loads every weight of a Llama/Qwen2 GGUF into dense f32 HF-layout [`ModelWeights`].
///
/// Strict: every tensor in the file must be used; a missing, unexpected or mis-shaped
/// tensor is a `Tensor` error naming it.
pub fn load_gguf_weights(gguf: &GgufFile) -> Result<ModelWeights> {
    let config = config_from_gguf(gguf)?;
    let (c, i_dim, v) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
    );
    let (h, kv, d) = (config.num_heads, config.num_kv_heads, config.head_dim);
    let permuted = config.family().gguf_permutes_qk_rows;
    let mut t = Taker {
        gguf,
        used: HashSet::new(),
    };

    let embed = t.matrix("token_embd.weight", v, c)?;
    let final_norm = t.vector("output_norm.weight", c)?;
    let lm_head = if config.tie_word_embeddings {
        None
    } else {
        Some(t.matrix("output.weight", v, c)?)
    };

    let mut layers = Vec::with_capacity(config.num_layers);
    for l in 0..config.num_layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        let mut wq = t.matrix(&n("attn_q.weight"), h * d, c)?;
        let mut wk = t.matrix(&n("attn_k.weight"), kv * d, c)?;
        if permuted {
            wq = unpermute_rope_rows(&wq, h);
            wk = unpermute_rope_rows(&wk, kv);
        }
        let (bq, bk, bv) = t.attention_biases(&config, n)?;
        layers.push(LayerWeights {
            attn_norm: t.vector(&n("attn_norm.weight"), c)?,
            wq,
            wk,
            wv: t.matrix(&n("attn_v.weight"), kv * d, c)?,
            wo: t.matrix(&n("attn_output.weight"), c, h * d)?,
            bq,
            bk,
            bv,
            mlp_norm: t.vector(&n("ffn_norm.weight"), c)?,
            w_gate: t.matrix(&n("ffn_gate.weight"), i_dim, c)?,
            w_up: t.matrix(&n("ffn_up.weight"), i_dim, c)?,
            w_down: t.matrix(&n("ffn_down.weight"), c, i_dim)?,
            gemma: t.gemma_block(&config, n, config.layer_attention(l))?,
        });
    }

    if let Some(extra) = gguf.tensors().iter().find(|x| !t.used.contains(&x.name)) {
        return Err(ElmError::tensor(
            &extra.name,
            format!(
                "unexpected tensor in {} (not part of a {:?} model with this config)",
                gguf.path().display(),
                config.arch
            ),
        ));
    }

    Ok(ModelWeights {
        config,
        embed,
        layers,
        final_norm,
        lm_head,
    })
}

/// Loads a Llama/Qwen2 GGUF for the inference path with its matrices stored as `storage`
/// says (`Auto`: quantized tensors stay in their blocks, never expanded to f32). Strict like
/// [`load_gguf_weights`].
pub fn load_gguf_quant(gguf: &GgufFile, storage: WeightStorage) -> Result<QuantWeights> {
    load_gguf_quant_layers(gguf, config_from_gguf(gguf)?, storage, &|_| true)
}

/// [`load_gguf_quant`] of the model `config` describes (read from the file's metadata, which
/// the caller may have released since), keeping only the blocks `keep` accepts (in order;
/// `layers` then holds those alone): the others are checked to be in the file but never read,
/// so their bytes never become resident (an ELM's replaced window).
pub fn load_gguf_quant_layers(
    gguf: &GgufFile,
    config: ModelConfig,
    storage: WeightStorage,
    keep: &dyn Fn(usize) -> bool,
) -> Result<QuantWeights> {
    let (c, v) = (config.hidden_size, config.vocab_size);
    let mut t = Taker {
        gguf,
        used: HashSet::new(),
    };
    let embed = t.linear("token_embd.weight", v, c, storage, None)?;
    let final_norm = t.vector("output_norm.weight", c)?;
    let lm_head = if config.tie_word_embeddings {
        None
    } else {
        Some(t.linear("output.weight", v, c, storage, None)?)
    };
    let mut layers = Vec::with_capacity(config.num_layers);
    for l in 0..config.num_layers {
        if !keep(l) {
            t.skip_layer(l);
            continue;
        }
        let name = |s: &str| format!("blk.{l}.{s}");
        layers.push(t.qlayer(&config, name, storage, config.layer_attention(l))?);
    }
    gguf.release_all();
    if let Some(extra) = gguf.tensors().iter().find(|x| !t.used.contains(&x.name)) {
        return Err(ElmError::tensor(
            &extra.name,
            format!("unexpected tensor in {}", gguf.path().display()),
        ));
    }
    Ok(QuantWeights {
        config,
        embed,
        layers,
        final_norm,
        lm_head,
    })
}

/// Writes dense weights as an F32 GGUF v3 in llama.cpp's layout (tensor names,
/// `{arch}.*` metadata, Q/K rows permuted for Llama): the inverse of
/// [`load_gguf_weights`]. Used for tiny test models and tools; atomic.
pub fn save_gguf_model(weights: &ModelWeights, path: impl AsRef<std::path::Path>) -> Result<()> {
    use super::gguf::{write_gguf, GgufTensorData};
    let cfg = &weights.config;
    cfg.validate()?;
    let meta = arch_metadata(cfg);
    let permuted = cfg.family().gguf_permutes_qk_rows;
    let mat = |name: String, w: &Array2<f32>| {
        let w = w.as_standard_layout();
        GgufTensorData::f32(&name, w.shape(), w.as_slice().expect("standard layout"))
    };
    let vec1 = |name: String, v: &Array1<f32>| GgufTensorData::f32(&name, &[v.len()], &v.to_vec());
    let rope_rows = |w: &Array2<f32>, heads: usize| {
        if permuted {
            permute_rope_rows(w, heads)
        } else {
            w.clone()
        }
    };
    let rope_vec = |b: &Array1<f32>, heads: usize| {
        rope_rows(&b.clone().insert_axis(Axis(1)), heads).remove_axis(Axis(1))
    };
    let mut tensors = vec![
        mat("token_embd.weight".into(), &weights.embed),
        vec1("output_norm.weight".into(), &weights.final_norm),
    ];
    if let Some(head) = &weights.lm_head {
        tensors.push(mat("output.weight".into(), head));
    }
    for (l, lw) in weights.layers.iter().enumerate() {
        let n = |s: &str| format!("blk.{l}.{s}");
        tensors.push(vec1(n("attn_norm.weight"), &lw.attn_norm));
        tensors.push(mat(n("attn_q.weight"), &rope_rows(&lw.wq, cfg.num_heads)));
        tensors.push(mat(
            n("attn_k.weight"),
            &rope_rows(&lw.wk, cfg.num_kv_heads),
        ));
        tensors.push(mat(n("attn_v.weight"), &lw.wv));
        tensors.push(mat(n("attn_output.weight"), &lw.wo));
        if let Some(b) = &lw.bq {
            tensors.push(vec1(n("attn_q.bias"), &rope_vec(b, cfg.num_heads)));
        }
        if let Some(b) = &lw.bk {
            tensors.push(vec1(n("attn_k.bias"), &rope_vec(b, cfg.num_kv_heads)));
        }
        if let Some(b) = &lw.bv {
            tensors.push(vec1(n("attn_v.bias"), b));
        }
        tensors.push(vec1(n("ffn_norm.weight"), &lw.mlp_norm));
        tensors.push(mat(n("ffn_gate.weight"), &lw.w_gate));
        tensors.push(mat(n("ffn_up.weight"), &lw.w_up));
        tensors.push(mat(n("ffn_down.weight"), &lw.w_down));
        if let Some(g) = &lw.gemma {
            tensors.push(vec1(n("attn_q_norm.weight"), &g.q_norm));
            tensors.push(vec1(n("attn_k_norm.weight"), &g.k_norm));
            tensors.push(vec1(n("post_attention_norm.weight"), &g.post_attn_norm));
            tensors.push(vec1(n("post_ffw_norm.weight"), &g.post_mlp_norm));
        }
    }
    write_gguf(path, &meta, &tensors)
}

/// The `general.architecture` / `{arch}.*` / BOS-EOS metadata llama.cpp reads for `cfg`
/// (what [`config_from_gguf`] parses back).
pub fn arch_metadata(cfg: &ModelConfig) -> Vec<(String, super::gguf::GgufValue)> {
    use super::gguf::{kv, GgufValue as V};
    let arch = cfg.family().gguf_name;
    let k = |s: &str| format!("{arch}.{s}");
    let mut meta = vec![
        kv("general.architecture", V::String(arch.into())),
        kv(&k("vocab_size"), V::U32(cfg.vocab_size as u32)),
        kv(
            &k("context_length"),
            V::U32(cfg.max_position_embeddings as u32),
        ),
        kv(&k("embedding_length"), V::U32(cfg.hidden_size as u32)),
        kv(
            &k("feed_forward_length"),
            V::U32(cfg.intermediate_size as u32),
        ),
        kv(&k("block_count"), V::U32(cfg.num_layers as u32)),
        kv(&k("attention.head_count"), V::U32(cfg.num_heads as u32)),
        kv(
            &k("attention.head_count_kv"),
            V::U32(cfg.num_kv_heads as u32),
        ),
        kv(&k("attention.key_length"), V::U32(cfg.head_dim as u32)),
        kv(&k("attention.value_length"), V::U32(cfg.head_dim as u32)),
        kv(&k("rope.dimension_count"), V::U32(cfg.head_dim as u32)),
        kv(&k("rope.freq_base"), V::F32(cfg.rope_theta)),
        kv(
            &k("attention.layer_norm_rms_epsilon"),
            V::F32(cfg.rms_norm_eps),
        ),
    ];
    if let Some(id) = cfg.bos_token_id {
        meta.push(kv("tokenizer.ggml.bos_token_id", V::U32(id)));
    }
    if let Some(id) = cfg.eos_token_id {
        meta.push(kv("tokenizer.ggml.eos_token_id", V::U32(id)));
    }
    if let Some(w) = cfg.sliding_window {
        meta.push(kv(&k("attention.sliding_window"), V::U32(w as u32)));
    }
    if let Some(p) = cfg.sliding_window_pattern {
        meta.push(kv(&k("attention.sliding_window_pattern"), V::U32(p as u32)));
    }
    if let Some(t) = cfg.rope_local_theta {
        meta.push(kv(&k("rope.freq_base_swa"), V::F32(t)));
    }

    meta
}

/// HF half-split row order → GGUF interleaved-RoPE order of a quantized Q/K matrix
/// (whole rows move, so it is exact on blocks; inverse of the load-time un-permutation).
pub fn permute_rope_qrows(q: &QMatrix, n_head: usize) -> Result<QMatrix> {
    let mut hf_row_of_gguf_row = vec![0; q.rows()];
    for (hf_row, gguf_row) in gguf_row_of_hf_row(q.rows(), n_head).into_iter().enumerate() {
        hf_row_of_gguf_row[gguf_row] = hf_row;
    }
    q.select_rows(&hf_row_of_gguf_row)
}

/// Writes to `out` a copy of `src` cut to its first block: the same metadata (the tokenizer
/// included) with `{arch}.block_count` = 1, and, as stored, the embedding, the final norm,
/// the head if the file has one, and block 0's tensors. A process that generates with it holds
/// everything a model's process holds except the other blocks: what `elm bench` runs to
/// measure the runtime part of a model's memory (`crate::io::ProcessMemory`).
pub fn write_runtime_probe(src: &GgufFile, out: &std::path::Path) -> Result<()> {
    use super::gguf::{write_gguf, GgufTensorData, GgufValue};
    let block_count = format!("{}.block_count", src.get_str("general.architecture")?);
    let metadata: Vec<(String, GgufValue)> = src
        .metadata()
        .iter()
        .map(|(k, v)| {
            let v = if k == &block_count {
                GgufValue::U32(1)
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect();
    let tensors = src
        .tensors()
        .iter()
        .filter(|t| !t.name.starts_with("blk.") || t.name.starts_with("blk.0."))
        .map(|t| {
            Ok(GgufTensorData {
                name: t.name.clone(),
                shape: t.shape(),
                ggml_type: t.ggml_type,
                data: src.tensor_bytes(&t.name)?.to_vec(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    write_gguf(out, &metadata, &tensors)
}
