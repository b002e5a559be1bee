//! Dense model speed on this machine (`elm bench`): bandwidth and sgemm rooflines, prefill and
//! decode throughput.

use elm::model::bench::BenchReport;

use crate::elm_cli::{args, path_arg, Unread};
use crate::error::ReproError;
use crate::runs::Ctx;

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
