//! Each table of a run as Markdown (the cells' formats are [`crate::markdown`]'s). Every
//! function takes the rows it prints, never the whole [`crate::tables::Tables`], so the README
//! writer above this file decides which tables a page holds and in what order.

use elm::eval::stats::Spread;
use elm::search::report::{Placement, WhereToPrune};
use elm::solver::{SolverKind, BUILTIN_SOLVERS};

use crate::markdown::{
    count, float, iv, mib, opt, pct, signed, signed_float, Table, NOT_APPLICABLE, NOT_RECORDED,
};
use crate::rows::{
    BenchFigures, CollapseRow, Controls, Curves, FullTest, FullyTrained, GradRow, Grid, GridDepth,
    GridRow, Interval, KvRow, MainRow, PrecisionRow, Seeds, SolverRow, SpectralRow, SpeedRow,
    SweepRow, TrainedStart, TrainedWindow, PAPER_PROBLEMS,
};
use crate::runs::RhoSweep;
use crate::solvers::CanonicalRow;
use crate::stage::seconds;

/// Table 1's controls at the headline window, each paired with the headline ELM.
pub fn controls_table(c: &Controls) -> String {
    let mut t = Table::new(&[
        "control",
        "row of table 1",
        "params",
        "minus the ELM (paired)",
        "reading",
    ]);
    for r in &c.rows {
        t.row(&[
            r.control.clone(),
            r.model.clone(),
            r.params.to_string(),
            signed(&r.minus_elm),
            gap_reading(&r.minus_elm, "the control").to_string(),
        ]);
    }
    format!(
        "Controls at the headline window ({}), the same budget, each paired with `{}` ({} parameters) over the same test problems:\n\n{}",
        c.window_choice,
        c.elm,
        c.elm_params,
        t.into_markdown()
    )
}

/// Table 1b: the headline rows and the controls on the whole test set (table 1 scores a
/// seeded sample of `sample` of them).
pub fn full_test_table(f: &FullTest, sample: usize) -> String {
    let mut t = Table::new(&[
        "row of table 1",
        "why it is here",
        "answer NLL",
        "minus the ELM (paired)",
        "reading",
    ]);
    t.row(&[
        f.elm.clone(),
        "the headline ELM".into(),
        iv(&f.elm_answer_nll),
        NOT_APPLICABLE.into(),
        "the reference of this table".into(),
    ]);
    for r in &f.rows {
        t.row(&[
            r.model.clone(),
            r.role.clone(),
            iv(&r.answer_nll),
            signed(&r.minus_elm),
            gap_reading(&r.minus_elm, "it").to_string(),
        ]);
    }
    format!(
        "### Table 1b — the headline rows and the controls on all {} test problems\n\n\
         The same models as table 1, scored again on every GSM8K test problem (table 1 scores a \
         seeded sample of {}), each paired with the headline ELM over all of them:\n\n{}",
        f.problems,
        sample,
        t.into_markdown()
    )
}

/// What a paired "X minus the ELM" interval of answer NLL says (lower NLL is better).
pub fn gap_reading(d: &Interval, other: &str) -> String {
    if d.lo > 0.0 {
        "the ELM is better (interval above 0)".to_string()
    } else if d.hi < 0.0 {
        format!("{other} is better (interval below 0)")
    } else {
        "not separable at this sample (interval holds 0)".to_string()
    }
}

/// Table 10: the collapse diagnosis.
pub fn collapse_table(rows: &[CollapseRow]) -> String {
    let mut t = Table::new(&[
        "start (layers)",
        "distillation recipe",
        "RMS of h entering / leaving",
        "first step: distillation MSE",
        "first CE",
        "last step: distillation MSE / CE",
        "held-out distill MSE after",
        "ρ at z*: mean / max",
        "answer NLL",
        "ΔNLL vs dense",
    ]);
    let ce = |c: Option<f64>| c.map_or_else(|| "n/a".to_string(), float);
    for r in rows {
        t.row(&[
            format!("{} ({}–{})", r.start, r.start, r.start + r.m - 1),
            r.recipe.clone(),
            format!("{} / {}", float(r.rms_entering), float(r.rms_leaving)),
            float(r.first_distill),
            ce(r.first_ce),
            format!("{} / {}", float(r.final_distill), ce(r.final_ce)),
            float(r.held_out_distill),
            format!("{} / {}", float(r.mean_radius), float(r.max_radius)),
            iv(&r.answer_nll),
            signed(&r.delta_nll),
        ]);
    }
    t.into_markdown()
}

pub fn precision_table(rows: &[PrecisionRow]) -> String {
    let mut t = Table::new(&[
        "model",
        "answer NLL, bf16 products (the run's)",
        "answer NLL, f32 products",
        "bf16 − f32, paired",
        "mean solver iterations bf16 / f32",
    ]);
    for r in rows {
        t.row(&[
            r.model.clone(),
            iv(&r.bf16),
            iv(&r.f32),
            signed(&r.bf16_minus_f32),
            format!("{} / {}", float(r.bf16_iterations), float(r.f32_iterations)),
        ]);
    }
    t.into_markdown()
}

pub fn main_table(rows: &[MainRow]) -> String {
    let mut t = Table::new(&[
        "model",
        "kind",
        "params",
        "non-emb. params",
        "KV bytes @1k",
        "own training tokens",
        "own compute",
        "answer NLL",
        "ΔNLL vs dense",
        "ΔNLL vs ELM",
        "flexible EM",
        "strict EM",
        "cut off by the budget",
        "RP (flexible)",
    ]);
    for r in rows {
        t.row(&[
            r.model.clone(),
            r.kind.clone(),
            r.params.to_string(),
            r.non_embedding_params.to_string(),
            r.kv_bytes_1k.to_string(),
            r.train_tokens.to_string(),
            seconds(r.train_seconds),
            iv(&r.answer_nll),
            opt(&r.delta_nll, signed),
            opt(&r.delta_nll_vs_elm, signed),
            opt(&r.flexible_em, iv),
            opt(&r.strict_em, iv),
            match (&r.truncated, &r.flexible_em) {
                (Some(c), _) => iv(c),
                (None, Some(_)) => NOT_RECORDED.to_string(),
                (None, None) => NOT_APPLICABLE.to_string(),
            },
            opt(&r.rp_flexible, iv),
        ]);
    }
    t.into_markdown()
}

/// Table 1 in the five columns a reader of the repository's README needs (the whole table is
/// on the run's page).
pub fn main_table_short(rows: &[MainRow]) -> String {
    let mut t = Table::new(&[
        "model",
        "params",
        "answer NLL",
        "ΔNLL vs ELM",
        "flexible EM",
    ]);
    for r in rows {
        t.row(&[
            r.model.clone(),
            r.params.to_string(),
            iv(&r.answer_nll),
            opt(&r.delta_nll_vs_elm, signed),
            opt(&r.flexible_em, iv),
        ]);
    }
    t.into_markdown()
}

pub fn kv_table(rows: &[KvRow]) -> String {
    let mut t = Table::new(&[
        "M",
        "KV mode",
        "KV bytes (allocated)",
        "dense bytes",
        "ratio vs dense",
        "flexible EM",
        "strict EM",
        "mean it/token",
        "layer evals/token",
    ]);
    for r in rows {
        t.row(&[
            r.m.to_string(),
            r.mode.clone(),
            r.kv_bytes.to_string(),
            r.dense_kv_bytes.to_string(),
            format!("{:.3}", r.ratio_vs_dense),
            iv(&r.flexible_em),
            iv(&r.strict_em),
            float(r.mean_iterations),
            float(r.layer_evals_per_token),
        ]);
    }
    t.into_markdown()
}

pub fn solver_table(rows: &[SolverRow]) -> String {
    let mut t = Table::new(&[
        "M (training steps)",
        "solver",
        "δ",
        "mean it",
        "max it",
        "block evals/token",
        "layer evals/token",
        "compute saved vs Picard",
        "answer NLL",
        "ΔNLL vs dense",
    ]);
    for r in rows {
        t.row(&[
            format!("{} ({})", r.m, r.steps),
            r.solver.clone(),
            float(r.tol),
            float(r.mean_iterations),
            r.max_iterations.to_string(),
            float(r.block_evals_per_token),
            float(r.layer_evals_per_token),
            pct(r.compute_saved_vs_picard),
            iv(&r.answer_nll),
            signed(&r.delta_nll),
        ]);
    }
    t.into_markdown()
}

pub fn grad_table(rows: &[GradRow]) -> String {
    let mut t = Table::new(&[
        "gradient rule",
        "steps",
        "s/step",
        "tokens/s",
        "peak RSS (MiB)",
        "teacher cache hits/misses",
        "held-out distill MSE",
        "answer NLL",
        "ΔNLL vs dense",
    ]);
    for r in rows {
        t.row(&[
            r.rule.clone(),
            r.steps.to_string(),
            float(r.seconds_per_step),
            float(r.tokens_per_s),
            mib(r.peak_rss_bytes),
            format!("{}/{}", r.teacher_cache_hits, r.teacher_cache_misses),
            float(r.distill_after),
            iv(&r.answer_nll),
            signed(&r.delta_nll),
        ]);
    }
    t.into_markdown()
}

pub fn sweep_table(rows: &[SweepRow]) -> String {
    let mut t = Table::new(&[
        "M",
        "method",
        "params",
        "non-emb. params",
        "KV bytes @1k",
        "answer NLL",
        "ΔNLL vs dense",
    ]);
    for r in rows {
        t.row(&[
            r.m.to_string(),
            r.method.clone(),
            r.params.to_string(),
            r.non_embedding_params.to_string(),
            r.kv_bytes_1k.to_string(),
            iv(&r.answer_nll),
            signed(&r.delta_nll),
        ]);
    }
    t.into_markdown()
}

pub fn canonical_table(rows: &[CanonicalRow]) -> String {
    let mut t = Table::new(&[
        "problem",
        "solver",
        "converged",
        "iterations",
        "map evals",
        "residual",
        "error vs exact",
        "seconds",
    ]);
    for r in rows {
        t.row(&r.cells());
    }
    t.into_markdown()
}

pub fn spectral_table(rows: &[SpectralRow]) -> String {
    let mut t = Table::new(&[
        "model",
        "M",
        "sequences",
        "mean ρ",
        "min ρ",
        "max ρ",
        "max ‖φ(z*)−z*‖/‖z*‖",
    ]);
    for r in rows {
        t.row(&[
            r.model.clone(),
            r.m.to_string(),
            r.sequences.to_string(),
            float(r.mean_radius),
            float(r.min_radius),
            float(r.max_radius),
            float(r.max_rel_residual),
        ]);
    }
    t.into_markdown()
}

pub fn speed_table(rows: &[SpeedRow], bench: &Option<BenchFigures>) -> String {
    let mut t = Table::new(&[
        "training",
        "steps",
        "tokens",
        "seconds",
        "tokens/s",
        "× dense prefill tok/s",
        "teacher cache hits/misses",
        "teacher computed (s)",
        "cache saved (s)",
        "peak RSS (MiB)",
    ]);
    for r in rows {
        t.row(&[
            r.training.clone(),
            r.steps.to_string(),
            r.tokens.to_string(),
            float(r.seconds),
            float(r.tokens_per_s),
            bench.as_ref().map_or_else(
                || NOT_APPLICABLE.into(),
                |b| format!("{:.3}", r.tokens_per_s / b.prefill_tok_s),
            ),
            format!("{}/{}", r.teacher_cache_hits, r.teacher_cache_misses),
            r.teacher_computed_seconds
                .map_or_else(|| NOT_RECORDED.into(), float),
            r.teacher_saved_seconds
                .map_or_else(|| NOT_RECORDED.into(), float),
            mib(r.peak_rss_bytes),
        ]);
    }
    t.into_markdown()
}
/// Table 6: each selector's window placed in the enumeration of trained windows.
pub fn where_table(w: &WhereToPrune, budget: &serde_json::Value) -> String {
    let mut s = format!(
        "On the LoRA-tuned dense model, M = {}. Enumeration: every start ≡ 0 mod {} (and the last) trained {} steps as a GPPO candidate \
         (projection + LoRA on the kept layer, fixed iterations), scored by answer NLL on {} GSM8K validation problems (never test problems) \
         (dense: {}); GPPO: {} steps. Rank 1 is the enumeration's best window; the gap is that window's NLL minus the best's.\n\n\
         | selector | chosen start (layers) | best enumerated start by the selector's own score | its rank of {} | its NLL gap (nats/token) |\n|---|---|---|---|---|\n",
        w.num_replaced,
        budget["enum_every"],
        budget["enum_steps"],
        budget["enum_eval"],
        float(w.dense_nll),
        budget["gppo_steps"],
        w.enum_ranking.len(),
    );
    let mut row = |p: &Placement| {
        s += &format!(
            "| {} | {} ([{}, {})) | {} | {} | {} |\n",
            p.method,
            p.choice,
            p.choice,
            p.choice + w.num_replaced,
            p.choice_on_grid,
            p.enum_rank,
            float(p.nll_gap)
        );
    };
    if let Some(g) = &w.gppo {
        row(g);
    }
    for p in &w.metrics {
        row(p);
    }
    match w.gppo_spearman {
        Some(r) => {
            s += &format!(
                "\nSpearman ρ between GPPO's policy logits and −NLL over the enumerated starts: {}.\n",
                float(r)
            )
        }
        None if w.gppo.is_some() => {
            s += "\nGPPO's policy is still uniform (fewer steps than one policy update): its choice is the first of tied starts, \
                  and no rank correlation exists.\n"
        }
        None => {}
    }
    let mut by_start = w.enum_nll.clone();
    by_start.sort_by_key(|e| e.0);
    s += &format!(
        "\nEnumerated answer NLL by start: {}.\n\n![where to prune](plots/where_to_prune.svg)\n",
        by_start
            .iter()
            .map(|(st, n)| format!("{st}: {}", float(*n)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    s
}

/// Table 6's check: do the enumeration's short candidates rank fully trained ELMs?
/// Table 6b: the fully trained starts and where each selector's choice lands among them.
pub fn fully_trained_table(f: &FullyTrained, m: usize) -> String {
    let mut t = Table::new(&["start (layers)", "validation answer NLL", "rank"]);
    let mut starts: Vec<&TrainedStart> = f.starts.iter().collect();
    starts.sort_by_key(|r| r.start);
    for r in starts {
        t.row(&[
            format!("{} ({}–{})", r.start, r.start, r.start + m - 1),
            iv(&r.validation_nll),
            format!("{} of {}", r.rank, f.starts.len()),
        ]);
    }
    let mut p = Table::new(&[
        "selector",
        "chosen start",
        "trained start it is read at",
        "its rank among the trained starts",
        "validation NLL gap to the best",
    ]);
    for r in &f.placements {
        p.row(&[
            r.method.clone(),
            r.choice.to_string(),
            r.trained_start.to_string(),
            format!("{} of {}", r.rank, f.starts.len()),
            signed_float(r.nll_gap),
        ]);
    }
    format!("{}\n{}", t.into_markdown(), p.into_markdown())
}

pub fn trained_windows_table(rows: &[TrainedWindow], w: &WhereToPrune) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\nFully trained ELMs (the main results' budget, Anderson δ = 0.5) at the windows the pipeline considers, against the rank \
         the enumeration's short candidates gave their start (of {}):\n\n| start (layers) | why this window | answer NLL | enumeration rank |\n|---|---|---|---|\n",
        w.enum_ranking.len()
    );
    let mut sorted = rows.to_vec();
    sorted.sort_by(|a, b| a.answer_nll.value.total_cmp(&b.answer_nll.value));
    for r in &sorted {
        s += &format!(
            "| {} ([{}, {})) | {} | {} | {} |\n",
            r.start,
            r.start,
            r.start + w.num_replaced,
            r.why,
            iv(&r.answer_nll),
            r.enum_rank
                .map_or_else(|| "not enumerated".to_string(), |k| k.to_string())
        );
    }
    s
}
/// Table 8: the points, then each curve's trend against the reference ELM.
pub fn curves_table(c: &Curves) -> String {
    let mut t = Table::new(&[
        "model",
        "steps",
        "training tokens",
        "compute",
        "answer NLL",
        "minus the reference ELM (paired)",
    ]);
    for p in &c.points {
        t.row(&[
            p.series.clone(),
            p.steps.to_string(),
            count(p.tokens as f64),
            seconds(p.compute_seconds),
            iv(&p.answer_nll),
            opt(&p.minus_elm, signed),
        ]);
    }
    let mut tr = Table::new(&[
        "model",
        "answer NLL per doubling of tokens",
        "gap at the smallest budget",
        "gap at the largest budget",
        "gap, smallest to largest budget",
        "last segment (two largest budgets): sign of the gap's slope only",
    ]);
    for r in &c.trends {
        tr.row(&[
            r.series.clone(),
            signed_float(r.slope_per_doubling),
            opt(&r.gap_smallest, signed),
            opt(&r.gap_largest, signed),
            r.verdict.clone(),
            r.gap_last_segment_slope.map_or_else(
                || NOT_APPLICABLE.into(),
                |v| {
                    if v > 0.0 {
                        "rising (+)".to_string()
                    } else if v < 0.0 {
                        "falling (−)".to_string()
                    } else {
                        "flat (0)".to_string()
                    }
                },
            ),
        ]);
    }
    // The series trained only at the smaller budgets stop here (`None`: every series has the
    // reference's budgets).
    let budgets = |series: &str| c.points.iter().filter(|p| p.series == series).count();
    let others_stop = c
        .points
        .iter()
        .filter(|p| budgets(&p.series) < budgets(&c.reference))
        .map(|p| p.steps)
        .max()
        .map_or_else(String::new, |n| {
            format!("; the other series stop at {n} steps")
        });
    let mut s = format!(
        "Gaps are each model's answer NLL minus that of **{}** trained with the same number of steps (positive: the ELM is better). \
         The NLL trend is a least-squares line of each curve's own NLL against log2(tokens) through its budgets ({} for the reference ELM, \
         the best healed baseline and the tuned dense model, spanning {:.0} doublings{}); no line is fitted through a gap, which rises and \
         falls (the verdict below reads it budget by budget), and nothing is extrapolated beyond them. The last column gives \
         only the sign of the gap's change between the two largest budgets (rising: the gap grows in the ELM's favour). The paper's \
         budget (two epochs of MetaMathQA, {} problems seen) lies {:.1} doublings beyond the largest budget here.\n\n{}\n{}",
        c.reference,
        budgets(&c.reference),
        curve_span(c),
        others_stop,
        count(PAPER_PROBLEMS),
        c.doublings_to_paper,
        t.into_markdown(),
        tr.into_markdown()
    );
    if let Some(v) = curves_verdict(c) {
        s += &format!("\n{v}\n");
    }
    s
}

/// Doublings between the smallest and the largest budget of the reference curve.
fn curve_span(c: &Curves) -> f64 {
    let toks: Vec<f64> = c
        .points
        .iter()
        .filter(|p| p.series == c.reference)
        .map(|p| p.tokens as f64)
        .collect();
    elm::eval::stats::spread(&toks).map_or(0.0, |s| (s.max / s.min.max(1.0)).log2())
}

/// Whether a paired gap (X minus the ELM; lower NLL is better) is sure, in the curves' words.
pub fn gap_sureness(i: &Interval) -> &'static str {
    if i.lo > 0.0 {
        "the ELM is surely better"
    } else if i.hi < 0.0 {
        "the ELM is surely worse"
    } else {
        "not distinguishable"
    }
}

/// `series`' paired gap to the reference ELM at each budget it was trained at, by steps.
pub fn gap_by_budget(c: &Curves, series: &str) -> Vec<(usize, Interval)> {
    let mut v: Vec<(usize, Interval)> = c
        .points
        .iter()
        .filter(|p| p.series == series)
        .filter_map(|p| p.minus_elm.map(|g| (p.steps, g)))
        .collect();
    v.sort_by_key(|(steps, _)| *steps);
    v
}

/// The series the curves' verdict reads: the first with gaps besides the reference (the best
/// healed baseline).
pub fn curves_rival(c: &Curves) -> Option<&str> {
    c.trends
        .iter()
        .find(|r| r.series != c.reference)
        .map(|r| r.series.as_str())
}

/// The sentence a reader looks for: the best baseline's paired gap to the ELM at every budget,
/// read from the largest budget back, and how it moves from one budget to the next (point
/// estimates; no line is fitted through the curve, which need not be straight).
pub fn curves_verdict(c: &Curves) -> Option<String> {
    let series = curves_rival(c)?;
    let gaps = gap_by_budget(c, series);
    let (last_steps, last) = *gaps.last()?;
    // The budget where the ELM leads by most (the top of the hump, when there is one).
    let (peak_steps, peak) = *gaps.iter().max_by(|a, b| a.1.value.total_cmp(&b.1.value))?;
    let by_budget = gaps
        .iter()
        .map(|(n, g)| format!("{n} steps {}", signed(g)))
        .collect::<Vec<_>>()
        .join(", ");
    let segments = gaps
        .windows(2)
        .map(|w| {
            format!(
                "{}→{}: {}",
                w[0].0,
                w[1].0,
                signed_float(w[1].1.value - w[0].1.value)
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "**Verdict:** against {series}, at the largest budget ({last_steps} steps) the gap is {} ({}); the ELM's lead is largest at \
         {peak_steps} steps ({}, {}). The gap by budget ({series} minus the ELM trained with the same steps, paired; above 0: the ELM is better): {by_budget}. \
         From one budget to the next it moves by {segments} (point estimates). No line is fitted through the budgets and nothing is \
         extrapolated past {last_steps} steps.",
        signed(&last),
        gap_sureness(&last),
        signed(&peak),
        gap_sureness(&peak),
    ))
}

/// Table 9: every seed, then the spread over seeds beside the intervals over problems.
pub fn seeds_table(s: &Seeds) -> String {
    let mut t = Table::new(&[
        "model",
        "seed",
        "answer NLL",
        "minus the ELM (paired, same seed)",
    ]);
    for r in &s.rows {
        t.row(&[
            r.series.clone(),
            r.seed.to_string(),
            iv(&r.answer_nll),
            opt(&r.minus_elm, signed),
        ]);
    }
    let spread = |x: &Spread| {
        format!(
            "{} ± {} ({} … {})",
            float(x.mean),
            float(x.sd),
            float(x.min),
            float(x.max)
        )
    };
    let mut u = Table::new(&[
        "model",
        "seeds",
        "answer NLL: mean ± sd (min … max) over seeds",
        "minus the ELM: mean ± sd (min … max)",
        "verdict",
    ]);
    for r in &s.summaries {
        u.row(&[
            r.series.clone(),
            r.answer_nll.n.to_string(),
            spread(&r.answer_nll),
            r.minus_elm
                .as_ref()
                .map_or_else(|| NOT_APPLICABLE.into(), spread),
            r.verdict.clone(),
        ]);
    }
    format!(
        "Each model trained again with another seed (data order, LoRA init, dropout masks) at the main budget; the compressed \
         models are cut from the same LoRA-tuned dense model (seed 0). \"Surely\" better or worse needs every seed's paired \
         interval over problems to exclude 0 on the same side.\n\n{}\n{}",
        t.into_markdown(),
        u.into_markdown()
    )
}
/// `anderson` → `Anderson`.
fn capitalised(name: &str) -> String {
    let mut chars = name.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
}

/// Table 7c: map evaluations against ρ at the middle tolerance of the sweep, where each trained
/// ELM sits on that axis, and what the solver ablation measured on the real module.
pub fn rho_sweep_table(r: &RhoSweep, solver: &[SolverRow]) -> String {
    let tols = &r.config.rel_tols;
    let Some(&tol) = tols.get(tols.len() / 2) else {
        return String::new();
    };
    let at = |rho: f64, name: &str| {
        r.rows
            .iter()
            .find(|x| x.rho == rho && x.rel_tol == tol && x.solver == name)
    };
    // Every built-in solver has a column (a new one cannot drop out of the table): Picard's
    // evaluations, the others' with what they save against it.
    let (picard, anderson) = (SolverKind::Picard.name(), SolverKind::Anderson.name());
    let accelerated: Vec<&str> = BUILTIN_SOLVERS
        .iter()
        .copied()
        .filter(|&n| n != picard)
        .collect();
    let mut header = vec![
        "ρ".to_string(),
        format!("{} evaluations", capitalised(picard)),
    ];
    header.extend(
        accelerated
            .iter()
            .map(|n| format!("{} evaluations (saved)", capitalised(n))),
    );
    let mut t = Table::new(&header.iter().map(String::as_str).collect::<Vec<_>>());
    for &rho in &r.config.rhos {
        let cell = |name: &str| {
            at(rho, name).map_or_else(
                || NOT_APPLICABLE.to_string(),
                |x| {
                    format!(
                        "{} ({})",
                        float(x.mean_evaluations),
                        pct(x.saving_vs_picard)
                    )
                },
            )
        };
        let mut row = vec![
            float(rho),
            at(rho, picard).map_or_else(|| NOT_APPLICABLE.into(), |x| float(x.mean_evaluations)),
        ];
        row.extend(accelerated.iter().map(|n| cell(n)));
        t.row(&row);
    }
    // Each trained ELM at the nearest swept ρ.
    let mut marks = String::new();
    for (name, rho) in &r.marks {
        let nearest = r
            .config
            .rhos
            .iter()
            .copied()
            .min_by(|a, b| (a - rho).abs().total_cmp(&(b - rho).abs()));
        if let Some(x) = nearest.and_then(|n| at(n, anderson)) {
            marks += &format!(
                "- {name}: ρ = {} → nearest swept ρ {}: Anderson saves {} of Picard's evaluations.\n",
                float(*rho),
                float(x.rho),
                pct(x.saving_vs_picard)
            );
        }
    }
    let measured: Vec<String> = solver
        .iter()
        .filter(|s| s.solver == anderson)
        .map(|s| format!("{} at δ = {}", pct(s.compute_saved_vs_picard), s.tol))
        .collect();
    format!(
        "Map evaluations of each solver to relative residual {tol:e} on `z = A z + b` (A symmetric, eigenvalues evenly \
         over [−ρ, ρ], dimension {}, {} right-hand sides; `elm sweep`), against ρ:\n\n{}\nThe trained maps of table 7b on that axis:\n\n{marks}\n\
         On the real module (table 3) Anderson saved {} of the block evaluations. On this problem Anderson first saves \
         at least the paper's 38.6% of compute at ρ = {}: a trained map well below that ρ leaves acceleration little \
         to save, whatever the solver.\n",
        r.config.dim,
        r.config.batch,
        t.into_markdown(),
        if measured.is_empty() {
            NOT_APPLICABLE.to_string()
        } else {
            measured.join(", ")
        },
        r.config
            .rhos
            .iter()
            .copied()
            .find(|&rho| at(rho, anderson).is_some_and(|x| x.saving_vs_picard >= crate::paper::ANDERSON_SAVING))
            .map_or_else(|| "none of the swept values".to_string(), float)
    )
}

/// A grid depth in words: `K = 4`, `solved (δ = 0.5)`.
pub fn depth_label(d: &GridDepth) -> String {
    match d {
        GridDepth::Fixed(k) => format!("K = {k}"),
        GridDepth::Solved { tol, .. } => format!("solved (δ = {tol})"),
    }
}

/// Table 11: every cell of the train-K × test-K grid.
pub fn grid_table(g: &Grid) -> String {
    let mut t = Table::new(&[
        "trained",
        "tested",
        "validation NLL",
        "validation evals/token",
        "test answer NLL",
        "test block evals/token",
        "minus the solved ELM (paired)",
        "minus the same module as trained (paired)",
    ]);
    for r in &g.rows {
        t.row(&[
            depth_label(&r.trained),
            depth_label(&r.tested),
            float(r.validation_nll),
            float(r.validation_evals),
            iv(&r.answer_nll),
            float(r.block_evals_per_token),
            signed(&r.minus_elm),
            opt(&r.minus_as_trained, signed),
        ]);
    }
    let cap = g.rows.iter().find_map(|r| match r.tested {
        GridDepth::Solved { max_iter, .. } => Some(max_iter),
        GridDepth::Fixed(_) => None,
    });
    format!(
        "Layers {}–{} (the headline window), the main budget. Trained: the module looped K times with injection \
         (unrolled), or solved (the ELM: Anderson, δ = 0.5). Tested: K' applications from z⁰ = 0, or solved by Anderson to \
         δ{}. Validation: {} problems (what the sentence below chooses by); test: the first {} problems of the test sample. \
         \"The solved ELM\" is the module trained and tested solved at δ = 0.5.\n\n{}{}",
        g.layers.0,
        g.layers.1,
        cap.map_or_else(String::new, |c| format!(" (at most {c} evaluations per token)")),
        g.validation_problems,
        g.test_problems,
        t.into_markdown(),
        grid_sentence(g).map_or_else(String::new, |s| format!("\n{s}\n")),
    )
}

/// The grid's answer to "is the equilibrium worth solving?", chosen on validation only: the
/// fixed loop (any trained K, any tested K') with the lowest validation NLL among those that
/// spend no more block evaluations per token than the solved ELM does on validation (rounded
/// up), against the solved ELM on test; then what deeper testing does to loops and to the ELM.
pub fn grid_sentence(g: &Grid) -> Option<String> {
    let elm_depth = |r: &GridRow| matches!(r.trained, GridDepth::Solved { .. });
    let elm = g
        .rows
        .iter()
        .find(|r| elm_depth(r) && r.tested == r.trained)?;
    let budget = elm.validation_evals.ceil();
    let chosen = g
        .rows
        .iter()
        .filter(|r| matches!(r.tested, GridDepth::Fixed(k) if k as f64 <= budget))
        .min_by(|a, b| a.validation_nll.total_cmp(&b.validation_nll))?;
    let verdict = if chosen.minus_elm.lo > 0.0 {
        "the solve beats a fixed loop at matched compute"
    } else if chosen.minus_elm.hi < 0.0 {
        "a fixed loop beats the solve at matched compute"
    } else {
        "the solve does not beat a fixed loop at matched compute (not separable at this sample)"
    };
    let mut s = format!(
        "**Is the equilibrium worth solving?** At this window and budget {verdict}: the loop trained at {} and tested at {} \
         (the lowest validation NLL among fixed loops with at most {budget} block evaluations per token, the solved ELM's {:.1} on \
         validation rounded up) minus the solved ELM, paired on test: {}.",
        depth_label(&chosen.trained),
        depth_label(&chosen.tested),
        elm.validation_evals,
        signed(&chosen.minus_elm),
    );
    let deepest = g
        .rows
        .iter()
        .filter_map(|r| match r.tested {
            GridDepth::Fixed(k) => Some(k),
            GridDepth::Solved { .. } => None,
        })
        .max()?;
    let extrapolations: Vec<String> = g
        .rows
        .iter()
        .filter(|r| {
            matches!((r.trained, r.tested), (GridDepth::Fixed(k), GridDepth::Fixed(kk)) if kk == deepest && k < kk)
        })
        .filter_map(|r| {
            r.minus_as_trained
                .as_ref()
                .map(|d| format!("{} {}", depth_label(&r.trained), signed(d)))
        })
        .collect();
    if !extrapolations.is_empty() {
        s += &format!(
            " Tested at K' = {deepest} instead of their own K, minus as trained (paired; above 0: worse): {}.",
            extrapolations.join(", ")
        );
    }
    let tighter: Vec<String> = g
        .rows
        .iter()
        .filter(|r| {
            elm_depth(r) && matches!(r.tested, GridDepth::Solved { .. }) && r.tested != r.trained
        })
        .filter_map(|r| {
            r.minus_as_trained.as_ref().map(|d| {
                format!(
                    "{} minus δ = 0.5: {} at {:.1} block evaluations per token",
                    depth_label(&r.tested),
                    signed(d),
                    r.block_evals_per_token
                )
            })
        })
        .collect();
    if !tighter.is_empty() {
        s += &format!(
            " The ELM with a tighter tolerance (the property DEQ papers claim: more compute, a better answer): {}.",
            tighter.join("; ")
        );
    }
    Some(s)
}

/// GPPO and the short-training enumeration against table 6b's fully trained starts (the only
/// ground truth): rank correlations, how far the policy is from uniform, and whether its
/// choice beats a start drawn at random.
pub fn against_truth_reading(w: &WhereToPrune, f: &FullyTrained) -> Option<String> {
    let a = elm::search::report::against_truth(w, &f.validation_truth())?;
    let rho = |x: Option<f64>| x.map_or_else(|| NOT_APPLICABLE.to_string(), |v| format!("{v:+.3}"));
    let mut s = format!(
        "**Against the ground truth** ({} fully trained starts, validation NLL): GPPO's policy ranks the starts with Spearman ρ = {} \
         (a start's probability against its negated NLL; GPPO's own ρ, {}, is against the short-training enumeration, whose ρ with \
         full training is {} over the starts it enumerated).",
        a.starts,
        rho(a.policy_spearman),
        rho(w.gppo_spearman),
        rho(a.proxy_spearman),
    );
    if let (Some(h), Some(m)) = (a.policy_entropy_ratio, a.policy_max) {
        s += &format!(
            " The policy is close to uniform: its entropy is {:.3} of the uniform policy's, its largest probability {:.3} against 1/{} = {:.3}.",
            h,
            m,
            (1.0 / a.uniform).round(),
            a.uniform
        );
    }
    if let (Some(g), Some(c), Some(share)) = (&w.gppo, a.choice_nll, a.share_better_than_choice) {
        let beats = if c < a.random_nll {
            "GPPO's choice beats a window drawn at random at this budget"
        } else {
            "GPPO's choice does not beat a window drawn at random at this budget"
        };
        s += &format!(
            " Its choice, start {}, scores {} after full training, against {} expected of a start drawn at random (the mean over \
             starts); {} of the starts are better: {beats}.",
            g.choice,
            float(c),
            float(a.random_nll),
            pct(share),
        );
    }
    Some(s)
}
