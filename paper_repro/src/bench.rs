//! Dense model speed on this machine (`elm bench`): bandwidth and sgemm rooflines, prefill and
//! decode throughput.

use std::path::Path;

use serde::Deserialize;

use crate::elm_cli::{args, path_arg, ElmCli};
use crate::error::ReproError;
use crate::markdown::{float, Table};
use crate::summary::Summary;

/// The metrics of `elm bench --json` (`elm::model::bench::BenchReport`) the table lists.
#[derive(Debug, Deserialize)]
struct BenchOutput {
    decode_b1_mean_tok_s: f64,
    decode_b1_tok_s: f64,
    decode_b1_vs_roofline: f64,
    decode_b8_mean_tok_s: f64,
    decode_b8_tok_s: f64,
    decode_roofline_tok_s: f64,
    decode_steps: usize,
    decode_weight_bytes_per_step: usize,
    /// Required key; null where the OS reports no load average.
    #[serde(deserialize_with = "Option::deserialize")]
    load_average_1m: Option<f64>,
    openblas_threads: usize,
    prefill_gflop_s: f64,
    prefill_tok_s: f64,
    prefill_tokens: usize,
    prefill_vs_sgemm_peak: f64,
    rayon_threads: usize,
    read_bandwidth_gb_s: f64,
    sgemm_gflop_s: f64,
    sgemm_n: usize,
}

impl BenchOutput {
    /// `(metric, value)` rows, by metric name; no row for an absent load average.
    fn rows(&self) -> Vec<(&'static str, String)> {
        let mut rows = vec![
            ("decode_b1_mean_tok_s", float(self.decode_b1_mean_tok_s)),
            ("decode_b1_tok_s", float(self.decode_b1_tok_s)),
            ("decode_b1_vs_roofline", float(self.decode_b1_vs_roofline)),
            ("decode_b8_mean_tok_s", float(self.decode_b8_mean_tok_s)),
            ("decode_b8_tok_s", float(self.decode_b8_tok_s)),
            ("decode_roofline_tok_s", float(self.decode_roofline_tok_s)),
            ("decode_steps", self.decode_steps.to_string()),
            (
                "decode_weight_bytes_per_step",
                self.decode_weight_bytes_per_step.to_string(),
            ),
        ];
        if let Some(load) = self.load_average_1m {
            rows.push(("load_average_1m", float(load)));
        }
        rows.extend([
            ("openblas_threads", self.openblas_threads.to_string()),
            ("prefill_gflop_s", float(self.prefill_gflop_s)),
            ("prefill_tok_s", float(self.prefill_tok_s)),
            ("prefill_tokens", self.prefill_tokens.to_string()),
            ("prefill_vs_sgemm_peak", float(self.prefill_vs_sgemm_peak)),
            ("rayon_threads", self.rayon_threads.to_string()),
            ("read_bandwidth_gb_s", float(self.read_bandwidth_gb_s)),
            ("sgemm_gflop_s", float(self.sgemm_gflop_s)),
            ("sgemm_n", self.sgemm_n.to_string()),
        ]);
        rows
    }
}

/// Benchmarks `model`; returns the Markdown section.
pub fn section(elm: &ElmCli, model: &Path, summary: &mut Summary) -> Result<String, ReproError> {
    let step = elm.run::<BenchOutput>(&args(&["bench", "--model", &path_arg(model)]))?;
    let mut table = Table::new(&["metric", "value"]);
    for (metric, value) in step.typed.rows() {
        table.row(&[metric.to_string(), value]);
    }
    summary.push("bench", &[], step.raw);
    Ok(format!(
        "## Dense model speed (`elm bench`)\n\n{}",
        table.into_markdown()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library's report, serialized as `elm bench --json` prints it, must decode.
    #[test]
    fn library_bench_report_decodes() {
        let report = elm::model::bench::BenchReport {
            read_bandwidth_gb_s: 20.0,
            sgemm_n: 512,
            sgemm_gflop_s: 100.0,
            prefill_tokens: 128,
            prefill_tok_s: 300.0,
            prefill_gflop_s: 50.0,
            prefill_vs_sgemm_peak: 0.5,
            decode_steps: 16,
            decode_b1_tok_s: 40.0,
            decode_b1_mean_tok_s: 35.0,
            decode_b8_tok_s: 200.0,
            decode_b8_mean_tok_s: 180.0,
            decode_weight_bytes_per_step: 100_000_000,
            decode_roofline_tok_s: 200.0,
            decode_b1_vs_roofline: 0.2,
            rayon_threads: 2,
            load_average_1m: None,
            openblas_threads: 1,
        };
        let value = serde_json::to_value(&report).unwrap();
        let decoded = BenchOutput::deserialize(&value).unwrap();
        // Every number of the report is a row (the table used to list them all).
        let numbers = value.as_object().unwrap().values();
        assert_eq!(
            decoded.rows().len(),
            numbers.filter(|v| v.is_number()).count()
        );
        let names: Vec<_> = decoded.rows().iter().map(|(name, _)| *name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "rows are listed by metric name");
    }
}
