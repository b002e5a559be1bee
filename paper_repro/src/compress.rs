//! ELM compression accounting (`elm compress`): parameters and KV-cache bytes of the ELM that
//! replaces layers `[start, start + m)` by one fixed-point module, against the dense model.

use std::path::Path;

use serde::Deserialize;

use crate::elm_cli::{args, path_arg, ElmCli};
use crate::error::ReproError;
use crate::summary::Summary;

/// The keys of `elm compress --json` the section reads.
#[derive(Debug, Deserialize)]
struct CompressOutput {
    params: ParamCounts,
    kv: KvBytes,
}

/// The fields of `elm::elm::accounting::ParamReport` the section reads.
#[derive(Debug, Deserialize)]
struct ParamCounts {
    num_layers: usize,
    dense_total: usize,
    elm_total: usize,
    reduction_total: f64,
    dense_non_embedding: usize,
    elm_non_embedding: usize,
    reduction_non_embedding: f64,
}

/// The fields of `elm::elm::accounting::KvReport` the section reads.
#[derive(Debug, Deserialize)]
struct KvBytes {
    context: usize,
    batch: usize,
    dense: usize,
    one_step: usize,
    one_step_ratio: f64,
    multi_step_iterations: usize,
    multi_step: usize,
    multi_step_ratio: f64,
}

/// The section's Markdown and the dense layer count the evaluation table needs.
pub struct Compressed {
    pub markdown: String,
    pub num_layers: usize,
}

/// Writes the initial ELM checkpoint to `checkpoint`; returns the accounting section.
pub fn section(
    elm: &ElmCli,
    model: &Path,
    start: usize,
    m: usize,
    checkpoint: &Path,
    summary: &mut Summary,
) -> Result<Compressed, ReproError> {
    let step = elm.run::<CompressOutput>(&args(&[
        "compress",
        "--model",
        &path_arg(model),
        "--start",
        &start.to_string(),
        "--m",
        &m.to_string(),
        "--out",
        &path_arg(checkpoint),
        // This run owns the directory: a rerun replaces it (elm refuses that without --force).
        "--force",
    ]))?;
    summary.push("elm_compress", &[], step.raw);
    let CompressOutput { params: p, kv } = step.typed;
    let markdown = format!(
        "## ELM: layers [{start}, {}) replaced by one fixed-point module\n\n\
         | parameters | dense | ELM | reduction |\n|---|---|---|---|\n\
         | total | {} | {} | {:.1}% |\n| non-embedding | {} | {} | {:.1}% |\n\n\
         KV cache at {} tokens (batch {}): dense {} B, one-step {} B ({:.3} of dense), \
         multi-step with {} iterations {} B ({:.3} of dense).\n\n",
        start + m,
        p.dense_total,
        p.elm_total,
        100.0 * p.reduction_total,
        p.dense_non_embedding,
        p.elm_non_embedding,
        100.0 * p.reduction_non_embedding,
        kv.context,
        kv.batch,
        kv.dense,
        kv.one_step,
        kv.one_step_ratio,
        kv.multi_step_iterations,
        kv.multi_step,
        kv.multi_step_ratio,
    );
    Ok(Compressed {
        markdown,
        num_layers: p.num_layers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elm_cli::decode;
    use elm::elm::accounting::{kv_report, param_report};
    use elm::elm::ElmConfig;
    use elm::model::{Arch, ModelConfig};

    fn smollm2_135m() -> ModelConfig {
        ModelConfig {
            arch: Arch::Llama,
            vocab_size: 49152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_layers: 30,
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            rope_theta: 100_000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            attention_bias: false,
            bos_token_id: Some(1),
            eos_token_id: Some(2),
        }
    }

    /// The library's reports, shaped as `elm compress --json` prints them, must decode.
    #[test]
    fn library_accounting_reports_decode() {
        let cfg = smollm2_135m();
        let elm_cfg = ElmConfig::new(12, 8);
        let printed = serde_json::json!({
            "out": "ck",
            "params": param_report(&cfg, &elm_cfg),
            "kv": kv_report(&cfg, &elm_cfg, 1, 1024, 8),
        });
        let step = decode::<CompressOutput>("elm compress", printed.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(step.typed.params.num_layers, 30);
        assert!((step.typed.kv.one_step_ratio - 23.0 / 30.0).abs() < 1e-12);
    }

    #[test]
    fn missing_nested_key_is_named() {
        let cfg = smollm2_135m();
        let elm_cfg = ElmConfig::new(12, 8);
        let printed = serde_json::json!({
            "params": {"num_layers": 30},
            "kv": kv_report(&cfg, &elm_cfg, 1, 1024, 8),
        });
        let err = decode::<CompressOutput>("elm compress --m 8", printed.to_string().as_bytes())
            .err()
            .expect("incomplete accounting must be an error")
            .to_string();
        assert!(err.contains("missing field `dense_total`"), "{err}");
        assert!(err.contains("`elm compress --m 8`"), "{err}");
    }
}
