//! Dense model speed on this machine (`elm bench`): bandwidth and sgemm rooflines, prefill and
//! decode throughput.

use serde::Deserialize;

use crate::elm_cli::{args, path_arg, Unread};
use crate::error::ReproError;
#[cfg(test)]
use crate::markdown::float;
use crate::report::BenchFigures;
use crate::runs::Ctx;

/// The metrics of `elm bench --json` (`elm::model::bench::BenchReport`) the table lists.
#[derive(Debug, Deserialize)]
pub struct BenchOutput {
    pub decode_b1_mean_tok_s: f64,
    pub decode_b1_tok_s: f64,
    pub decode_b1_vs_roofline: f64,
    pub decode_b8_mean_tok_s: f64,
    pub decode_b8_tok_s: f64,
    pub decode_roofline_tok_s: f64,
    pub decode_steps: usize,
    pub decode_weight_bytes_per_step: usize,
    /// Required key; null where the OS reports no load average.
    #[serde(deserialize_with = "Option::deserialize")]
    pub load_average_1m: Option<f64>,
    pub openblas_threads: usize,
    pub prefill_gflop_s: f64,
    pub prefill_tok_s: f64,
    pub prefill_tokens: usize,
    pub prefill_vs_sgemm_peak: f64,
    pub rayon_threads: usize,
    pub read_bandwidth_gb_s: f64,
    pub sgemm_gflop_s: f64,
    pub sgemm_n: usize,
}

#[cfg(test)]
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

/// The figures the training-throughput section compares against.
pub fn figures(b: &BenchOutput) -> BenchFigures {
    BenchFigures {
        sgemm_gflop_s: b.sgemm_gflop_s,
        prefill_tok_s: b.prefill_tok_s,
        prefill_gflop_s: b.prefill_gflop_s,
        decode_b1_tok_s: b.decode_b1_tok_s,
    }
}

/// `elm bench --model MODEL --json` as a cached stage.
pub fn run(ctx: &mut Ctx<'_>) -> Result<BenchOutput, ReproError> {
    let config = serde_json::json!({"model": ctx.model_id, "bench": 1});
    let a = args(&["bench", "--model", &path_arg(&ctx.model)]);
    let elm = ctx.elm;
    Ok(ctx
        .stages
        .run::<_, BenchOutput>("bench", &config, 60.0, |_| Ok(elm.run::<Unread>(&a)?.raw))?
        .value)
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
