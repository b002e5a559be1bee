//! Dense model speed on this machine (`elm bench`): bandwidth and sgemm rooflines, prefill and
//! decode throughput.

use elm::model::bench::BenchReport;

use crate::elm_cli::{args, path_arg, Unread};
use crate::error::ReproError;
use crate::report::BenchFigures;
use crate::runs::Ctx;

/// The figures the training-throughput section compares against.
pub fn figures(b: &BenchReport) -> BenchFigures {
    BenchFigures {
        sgemm_gflop_s: b.sgemm_gflop_s,
        prefill_tok_s: b.prefill_tok_s,
        prefill_gflop_s: b.prefill_gflop_s,
        decode_b1_tok_s: b.decode_b1_tok_s,
    }
}

/// `elm bench --model MODEL --json` as a cached stage.
pub fn run(ctx: &mut Ctx<'_>) -> Result<BenchReport, ReproError> {
    let config = serde_json::json!({"model": ctx.model_id, "bench": 1});
    let a = args(&["bench", "--model", &path_arg(&ctx.model)]);
    let elm = ctx.elm;
    Ok(ctx
        .stages
        .run::<_, BenchReport>("bench", &config, 60.0, |_| Ok(elm.run::<Unread>(&a)?.raw))?
        .value)
}
