//! `OUT/README.md` (every table next to what the paper reports for it, the plots embedded)
//! and the blocks `--readme` writes into the repository's README (the headline, or the `long`
//! run's curves and seeds). The top of the writers: it reads a [`Tables`], lays out the
//! sections and takes each table's Markdown from [`crate::table_markdown`].

use std::path::Path;

use crate::markdown::{float, iv, opt, pct, signed, signed_float, NOT_RECORDED};
use crate::paper;
use crate::rows::{Control, ControlKind, Controls, Interval, SpeedRow, MAIN_ELM_ROW};
use crate::stage::seconds;
use crate::table_markdown::{
    against_truth_reading, canonical_table, collapse_table, controls_table, curves_rival,
    curves_table, curves_verdict, full_test_table, fully_trained_table, gap_by_budget, gap_reading,
    gap_sureness, grad_table, grid_sentence, grid_table, kv_table, main_table, main_table_short,
    precision_table, rho_sweep_table, seeds_table, solver_table, spectral_table, speed_table,
    sweep_table, trained_windows_table, where_table,
};
use crate::tables::{Tables, Written};

/// The model as a reader can find it: its file (or directory) name, not this machine's path.
fn model_label(model: &str) -> String {
    Path::new(model)
        .file_name()
        .map_or_else(|| model.to_string(), |f| f.to_string_lossy().into_owned())
}
/// The command that regenerates the run and the model's size, by the model file: the second
/// family's study has its own script; any other model is the main job's.
fn job_of(model: &str) -> (&'static str, &'static str) {
    match model_label(model).as_str() {
        elm::formats::GEMMA3_GGUF => ("the Gemma 3 study: `bash scripts/gemma3-study.sh`", "270M"),
        elm::formats::SMOLLM2_GGUF => ("the main job: `bash scripts/main.sh`", "135M"),
        _ => ("the main job: `bash scripts/main.sh`", "this size"),
    }
}
/// A section: our table, then the paper's figure it mirrors.
fn section(title: &str, ours: &str, paper: &str) -> String {
    format!("## {title}\n\n{ours}\n**Paper:** {paper}\n\n")
}
/// The budget the verdict leads with: the largest the learning curves trained the best
/// healed baseline and the ELM at (table 8), their gap there and budget by budget; else the
/// one budget of the scale.
fn budget_lead(t: &Tables) -> String {
    let main_steps = &t.limits["main"]["steps"];
    let at_main = format!(
        "At the headline budget ({}), which the controls share",
        budget(&t.limits["main"])
    );
    let Some(c) = &t.curves else {
        return format!(
            "At the one budget this scale trains ({}; the `long` scale's table 8 has the learning curves)",
            budget(&t.limits["main"])
        );
    };
    let Some(series) = curves_rival(c) else {
        return at_main;
    };
    let gaps = gap_by_budget(c, series);
    let Some((last_steps, last)) = gaps.last() else {
        return at_main;
    };
    let by_budget = gaps
        .iter()
        .map(|(n, g)| format!("{n} steps {}", signed(g)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "At the largest budget this study trained ({last_steps} steps, table 8), {series} minus the ELM at the same window is {} ({}). \
         Budget by budget the gap rises and falls, so no single budget speaks for the others: {by_budget} (paired; above 0: the ELM \
         is better; no line is fitted and nothing is extrapolated). The controls below were trained only at {main_steps} steps. {at_main}",
        signed(last),
        gap_sureness(last),
    )
}

/// `s` with its first letter in lower case (a generated sentence continued after a colon).
fn lowercase_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map_or_else(String::new, |f| f.to_lowercase().chain(c).collect())
}

/// Is it the solve? The fixed-depth controls (the same module looped K times, trained and
/// tested at K) against the solved ELM — on the whole test set where the scale scores one —
/// in one sentence whose first words answer, then the train-K × test-K grid's reading.
fn solve_reading(t: &Tables, c: &Controls) -> String {
    let fixed: Vec<(&Control, Interval, usize)> = c
        .rows
        .iter()
        .filter(|r| r.kind == ControlKind::FixedDepth)
        .map(|r| {
            let on_full = t.full_test.as_ref().and_then(|f| {
                f.rows
                    .iter()
                    .find(|x| x.model == r.model)
                    .map(|x| (x.minus_elm, f.problems))
            });
            let (gap, n) = on_full.unwrap_or((
                r.minus_elm,
                t.limits["nll_eval"].as_u64().unwrap_or(0) as usize,
            ));
            (r, gap, n)
        })
        .collect();
    if fixed.is_empty() {
        return String::new();
    }
    let answer = if fixed.iter().any(|(_, g, _)| g.lo > 0.0) {
        "In part: the solved ELM beats at least one fixed loop of the same module"
    } else if fixed.iter().all(|(_, g, _)| g.hi < 0.0) {
        "No: at this budget every fixed loop of the same module beats the solved ELM"
    } else {
        "No: at this budget no fixed loop of the same module is worse than the solved ELM"
    };
    let figures = fixed
        .iter()
        .map(|(r, g, n)| {
            format!(
                "looped {} minus the solved ELM {} ({n} test problems)",
                r.control.trim_start_matches("fixed depth: "),
                signed(g)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let mut s = format!(" Is it the solve? {answer}: {figures}.");
    if fixed.iter().all(|(_, g, _)| g.lo <= 0.0) {
        s += " What the ELM gains over deleting or replacing the layers comes from the weight-tied module with input injection \
              applied a few times, not from solving it to its fixed point.";
    }
    if let Some(g) = &t.grid {
        if let Some(line) = grid_sentence(g) {
            s += &format!(
                " The train-K × test-K grid (table 11, {} test problems): {}",
                g.test_problems,
                lowercase_first(line.trim_start_matches("**Is the equilibrium worth solving?** "))
            );
        }
    }
    s
}

/// The study's verdict, generated from the tables: the largest budget first (the learning
/// curves, where the scale has them), then the comparison at equal parameters at the headline
/// budget and window, whether the solve matters, the prior method, the whole test set, exact
/// match, and what changes it.
fn verdict(t: &Tables) -> Option<String> {
    let c = t.controls.as_ref()?;
    let elm = t.main.iter().find(|r| r.model == c.elm)?;
    let of_kind = |kind: ControlKind| c.rows.iter().filter(move |r| r.kind == kind);
    let equal = of_kind(ControlKind::EqualParameters).next();
    let mut s = format!(
        "**Verdict:** {}, at the best window on validation (layers {}–{}), the ELM's answer NLL on {} GSM8K test problems is {}",
        budget_lead(t),
        c.layers.0,
        c.layers.1,
        t.limits["nll_eval"],
        iv(&elm.answer_nll),
    );
    match equal {
        Some(e) => {
            s += &format!(
                "; the equal-parameter control ({}, {} parameters against the ELM's {}: {:+.1}%, the nearest that deleting whole layers gets \
                 to the ELM's count) minus the ELM, paired: {}, so {}",
                e.model,
                e.params,
                c.elm_params,
                100.0 * (e.params as f64 / c.elm_params.max(1) as f64 - 1.0),
                signed(&e.minus_elm),
                gap_reading(&e.minus_elm, "the control")
            );
        }
        None => s += " (no equal-parameter control at this scale)",
    }
    match &t.seeds {
        Some(seeds) if !seeds.summaries.is_empty() => {
            s += &format!(
                "; over {} seeds (table 9): {}",
                seeds.summaries[0].answer_nll.n,
                seeds
                    .summaries
                    .iter()
                    .filter(|r| r.minus_elm.is_some())
                    .map(|r| format!("{} — {}", r.series, r.verdict))
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        }
        _ => s += "; one seed (the seeds are the `long` scale's table 9)",
    }
    s += ".";
    s += &solve_reading(t, c);
    for r in of_kind(ControlKind::PriorMethod) {
        s += &format!(
            " Why not loop with per-loop LoRA? The closest prior method, {} ({} parameters), minus the ELM: {} ({}).",
            r.control.trim_start_matches("prior method: "),
            r.params,
            signed(&r.minus_elm),
            gap_reading(&r.minus_elm, "the prior method")
        );
    }
    if let Some(w) = &t.same_window {
        s += &format!(
            " Against the best healed baseline at that window, {} minus the ELM: {} ({}).",
            w.baseline,
            signed(&w.delta_baseline_minus_elm),
            gap_reading(&w.delta_baseline_minus_elm, "the baseline")
        );
    }
    if let Some(f) = &t.full_test {
        s += &format!(
            " On all {} test problems (table 1b) the ELM's NLL is {}; minus the ELM, paired: {}.",
            f.problems,
            iv(&f.elm_answer_nll),
            f.rows
                .iter()
                .map(|r| format!(
                    "{} {} ({})",
                    r.role,
                    signed(&r.minus_elm),
                    gap_reading(&r.minus_elm, "it")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    if let Some((d, (a, b))) = t.reference_row().and_then(|d| {
        elm.flexible_em
            .as_ref()
            .zip(d.flexible_em.as_ref())
            .map(|p| (d, p))
    }) {
        if a.lo <= b.hi && b.lo <= a.hi {
            s += &format!(
                " Exact match cannot separate the models at this size: flexible EM {} for the ELM against {} for the tuned dense model \
                 (Wilson 95% intervals over {} test problems overlap); {}.",
                iv(a),
                iv(b),
                t.limits["gsm8k_eval"],
                match (&elm.truncated, &d.truncated) {
                    (Some(x), Some(y)) => format!(
                        "the generation budget ({} new tokens) cut off {} of the ELM's answers and {} of the dense model's",
                        t.limits["em_budget"], iv(x), iv(y)
                    ),
                    _ => format!(
                        "how many answers its {} new tokens cut off was not recorded in this run{}",
                        t.limits["max_new_tokens"],
                        match t.limits.get("generation_budget") {
                            Some(b) if b.is_object() => format!(
                                " (GSM8K's validation reference solutions run to a median of {} and a 99th percentile of {} of this \
                                 model's tokens: `elm eval --max-new-tokens auto` sizes the budget from them)",
                                b["median_tokens"], b["tokens_at_quantile"]
                            ),
                            _ => String::new(),
                        }
                    ),
                }
            );
        }
    }
    if c.elm != MAIN_ELM_ROW {
        if let Some(study) = t.main.iter().find(|r| r.model == MAIN_ELM_ROW) {
            if let Some(d) = &study.delta_nll_vs_elm {
                s += &format!(
                    " What changes it: the window — at the study's default window (layers {}–{}) the ELM's NLL is {}, {} against the headline ELM \
                     (table 1 pairs every other row with the headline ELM: compare them there); the budget — {}.",
                    t.limits["start"],
                    t.limits["start"].as_u64().unwrap_or(0) + t.limits["m"].as_u64().unwrap_or(1) - 1,
                    iv(&study.answer_nll),
                    signed(d),
                    if t.curves.is_some() {
                        "see the first sentence (table 8)"
                    } else {
                        "the `long` scale's learning curves (table 8)"
                    }
                );
            }
        }
    }
    Some(s + "\n\n")
}

/// What number format the run's trainings and evaluations computed in (absent from runs
/// before the setting: f32).
fn precision_note(t: &Tables) -> String {
    match t.limits["precision"].as_str() {
        Some("bf16") => {
            let check = t
                .precision_check
                .iter()
                .map(|r| format!("{} {}", r.model, signed(&r.bf16_minus_f32)))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                " Every training, LoRA run, pruning calibration and evaluation of this run multiplied in bf16 \
                 (AVX-512 BF16 dot products; sums, weights, gradients and optimiser state in f32; `--precision bf16`, \
                 what fits `small` in 90 minutes on 2 cores); the spectral radii and the speed benchmark stay f32. \
                 Scoring in bf16 instead of f32 moves the answer NLL by {} (bf16 − f32, paired; the precision check); what bf16 \
                 training changes: the bf16-quality block of docs/performance.md.",
                if check.is_empty() { "n/a".to_string() } else { check }
            )
        }
        _ => " Every product of this run computed in f32.".into(),
    }
}

/// The headline: the ELM against the dense model and the best baseline.
fn headline(t: &Tables) -> String {
    let dense = t.reference_row();
    // The verdict's ELM (the window chosen on validation) where table 1 has one, so that the
    // headline and the verdict quote one model; else the study's default-window ELM.
    let elm = t
        .controls
        .as_ref()
        .and_then(|c| t.main.iter().find(|r| r.model == c.elm))
        .or_else(|| t.main.iter().find(|r| r.model == MAIN_ELM_ROW));
    let best = t
        .main
        .iter()
        .filter(|r| !r.kind.starts_with("dense") && !r.kind.starts_with("ELM"))
        .min_by(|a, b| a.answer_nll.value.total_cmp(&b.answer_nll.value));
    match (dense, elm) {
        (Some(d), Some(e)) => {
            let mut s = verdict(t).unwrap_or_default();
            s += &format!(
                "**Headline ({} scale, {}):** the ELM ({}) removes {} of the dense model's parameters ({} non-embedding) and {} of its KV cache; \
                 its answer NLL is {} vs the LoRA-tuned dense model's {} (Δ {}, perplexity {:.2} vs {:.2}), flexible exact match {} vs {} (RP {}).",
                t.scale,
                model_label(&t.model),
                e.model,
                pct(1.0 - e.params as f64 / d.params as f64),
                pct(1.0 - e.non_embedding_params as f64 / d.non_embedding_params as f64),
                pct(1.0 - e.kv_bytes_1k as f64 / d.kv_bytes_1k as f64),
                iv(&e.answer_nll),
                iv(&d.answer_nll),
                opt(&e.delta_nll, signed),
                e.answer_nll.value.exp(),
                d.answer_nll.value.exp(),
                opt(&e.flexible_em, iv),
                opt(&d.flexible_em, iv),
                opt(&e.rp_flexible, iv),
            );
            if let Some(b) = best {
                s += &format!(
                    " Lowest test NLL among the other compressed rows (a reading aid; nothing is selected by it): {} ({}), answer NLL {}; \
                     its NLL minus the headline ELM's (table 1's \"ΔNLL vs ELM\"), paired over the same problems: {}.",
                    b.model,
                    b.kind,
                    iv(&b.answer_nll),
                    opt(&b.delta_nll_vs_elm, signed)
                );
            }
            if let Some(w) = &t.same_window {
                if let Some(r) = t.main.iter().find(|r| r.model == w.elm) {
                    let b = t.main.iter().find(|r| r.model == w.baseline);
                    s += &format!(
                        " Method against method at one window: trained with the same budget on layers {}–{} (the layers {} removes), \
                         the ELM reaches answer NLL {} (Δ vs the tuned dense model {}) against that baseline's {}; the baseline's NLL minus this ELM's, paired: {}.",
                        w.layers.0,
                        w.layers.1,
                        w.baseline,
                        iv(&r.answer_nll),
                        opt(&r.delta_nll, signed),
                        b.map_or_else(|| "n/a".to_string(), |b| iv(&b.answer_nll)),
                        signed(&w.delta_baseline_minus_elm),
                    );
                }
            }
            if let Some(h) = &t.healed_elm {
                if let Some(r) = t.main.iter().find(|r| r.model == h.healed) {
                    s += &format!(
                        " ELM + heal (a row no paper has; the module and a LoRA heal of the layers after the window trained together, same budget) on layers {}–{}: answer NLL {}; minus the plain ELM's at that window, paired: {}{}.",
                        h.layers.0,
                        h.layers.1,
                        iv(&r.answer_nll),
                        signed(&h.healed_minus_plain),
                        match (&h.baseline, &h.baseline_minus_healed) {
                            (Some(b), Some(d)) => format!("; {b} minus it: {}", signed(d)),
                            _ => String::new(),
                        }
                    );
                }
            }
            if let Some(v) = t.curves.as_ref().and_then(curves_verdict) {
                s += &format!(
                    " Learning curves (table 8): {}",
                    v.trim_start_matches("**Verdict:** ")
                );
            }
            s += &precision_note(t);
            if let Some(seeds) = &t.seeds {
                for r in &seeds.summaries {
                    if let Some(g) = &r.minus_elm {
                        s += &format!(
                            " Over {} seeds, {} minus {}: {} ± {} (sd): {}.",
                            g.n,
                            r.series,
                            seeds.reference,
                            signed_float(g.mean),
                            float(g.sd),
                            r.verdict
                        );
                    }
                }
            }
            s + "\n\n"
        }
        _ => "The main-results table was not computed in this run (`--only`).\n\n".into(),
    }
}

/// `OUT/README.md`.
pub fn readme(t: &Tables, plots: &Written) -> String {
    let (job, size) = job_of(&t.model);
    let mut s = format!(
        "# ELM study — `{}` scale\n\nRegenerated by `paper_repro --scale {}` ({job}); \
         every figure below comes from `tables.json` of the same run. Model: {}. Compute time of the run's {} distinct \
         stages on this machine: {}{}. Last invocation: {} ({} stages, {} computed, {} read from the stage cache).\n\n",
        t.scale,
        t.scale,
        match &t.model_sha256 {
            Some(sha) => format!("{} (SHA-256 `{sha}`)", model_label(&t.model)),
            None => model_label(&t.model),
        },
        t.stages.iter().map(|s| &s.key).collect::<std::collections::BTreeSet<_>>().len(),
        seconds(unique_stage_seconds(t)),
        grid_seconds(t),
        seconds(t.seconds),
        t.stages.len(),
        t.stages.iter().filter(|s| !s.cached).count(),
        t.stages.iter().filter(|s| s.cached).count(),
    );
    s += &headline(t);
    s += &format!(
        "Budgets: main results {}; ablations {} (see `tables.json` → `limits`). Quality: GSM8K test answer NLL \
         (teacher-forced, nats/token, the primary signal at {size}) on a seeded random sample of {} test problems (tables 3–5: the first {} of the \
         same sample) and exact match (greedy; strict `#### N` / flexible last number) on {} of them. Everything that selects — the best \
         baselines, the headline window, the window searches, the held-out figures during training — reads the validation split \
         (the last 500 problems of GSM8K's train.jsonl, which no training reads; {} of them score a choice), never a test problem. \
         NLL brackets are 95% bootstrap intervals over problems, exact-match brackets Wilson intervals; Δ and RP are paired over the \
         same problems (↑/↓: the interval excludes 0).\n\n",
        budget(&t.limits["main"]),
        budget(&t.limits["study"]),
        t.limits["nll_eval"],
        t.limits["ablation_nll_eval"],
        t.limits["gsm8k_eval"],
        t.limits["validation_eval"],
    );
    s += &section(
        "Table 1 — Main results (paper: main table / `assets/performance.png`)",
        &table_one(t),
        &format!(
            "{} Scale differs: {size} parameters, a few hundred training steps on a CPU; the dense model is \
             LoRA-tuned on GSM8K with the same token budget as each trained compressed model, and, as in the paper, \
             every compressed model is cut from that tuned model, which is the reference of every Δ and RP.",
            paper::MAIN
        ),
    );
    s += &section(
        "Table 2 — One-step vs multi-step KV (paper: one-step KV ablation)",
        &format!(
            "The ELMs are the compression sweep's (table 5) at M = {} from layer {}, trained at the ablation budget ({} steps × {} × {} \
             tokens), not the main-budget ELM of table 1. KV bytes are those the decoding session allocated for one GSM8K question (prompt + new tokens + 1 positions); the dense \
             figure is N × the measured per-layer bytes. Quality: exact match of greedy decoding (teacher-forced NLL does not use the cache).\n\n{}",
            t.limits["kv_ms"]
                .as_array()
                .map(|ms| ms.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(" and "))
                .unwrap_or_default(),
            t.limits["start"],
            t.limits["study"]["steps"],
            t.limits["study"]["batch_size"],
            t.limits["study"]["seq_len"],
            nonempty(&t.kv, kv_table)
        ),
        paper::KV,
    );
    let solver_plot = if plots.solvers {
        "\n![solver ablation](plots/solver_ablation.svg)\n"
    } else {
        ""
    };
    s += &section(
        "Table 3 — Solver ablation (paper: solver comparison and early-exit threshold)",
        &format!(
            "The study's ELM (its M, the main budget) and, where the sweep has one, its ELM at M = 14 (the paper's setting for the \
             38.6% Anderson saving; the ablation budget): teacher-forced GSM8K answer NLL on the ablation tables' sample; δ is the per-token absolute residual tolerance, at most 16 solver iterations per token; the counts below add the commit evaluation at z* (so a row that never meets δ shows 17). Iterations \
             are those of the whole-sequence solve (every position iterated together, as in training), block evaluations per token are \
             the fixed-point block's applications per token.\n\n{}{solver_plot}",
            nonempty(&t.solver, solver_table)
        ),
        paper::SOLVERS,
    );
    if !t.precision_check.is_empty() {
        s += &format!(
            "## Precision check (no counterpart in the paper)\n\nEvery model of this run was trained and scored with bf16 products \
             (f32 sums, weights and optimiser state). Here two of them are scored again with f32 products on the ablation tables' {} test \
             problems and paired with their own bf16 scores on the same problems: the size of what bf16 scoring moves, against the gaps \
             the tables report. What bf16 *training* changes is measured by `scripts/bf16-quality.sh` (docs/performance.md's \
             bf16-quality block).\n\n{}\n",
            t.limits["ablation_nll_eval"],
            precision_table(&t.precision_check)
        );
    }
    s += &section(
        "Table 4 — Gradient rules (paper: SJFB ablation)",
        &format!(
            "Same ELM, data, steps, optimiser and seed; only the gradient rule differs. Peak RSS: the training process's VmHWM (measured, \
             evaluation of the held-out loss included). Every rule reads the same cached teacher states.\n\n{}",
            nonempty(&t.grad, grad_table)
        ),
        paper::GRAD,
    );
    let sweep_plot = if plots.sweep {
        "\n![compression sweep](plots/compression_sweep.svg)\n"
    } else {
        ""
    };
    s += &section(
        "Table 5 — Compression sweep (paper: ratio column of the main table)",
        &format!("ELM (ablation budget, Anderson δ = 0.5) and the strongest training-free baseline of table 1 at each M.\n\n{}{sweep_plot}", nonempty(&t.sweep, sweep_table)),
        paper::SWEEP,
    );
    s += &section(
        "Table 6 — Where to prune (paper: GPPO start-layer study)",
        &t.where_to_prune.as_ref().map_or_else(
            || NOT_COMPUTED.to_string(),
            |w| {
                let mut s = where_table(w, &t.limits["search"])
                    + &trained_windows_table(&t.trained_windows, w);
                if let Some(f) = &t.fully_trained {
                    s += &format!(
                        "\n**Table 6b — every start fully trained.** The ELM trained at the main budget from each start below \
                         and scored on {} validation problems (the ranking a selector should reproduce); then where the enumeration's best start, \
                         GPPO's choice and each selector's land on that ranking.{}\n\n{}\n",
                        t.limits["validation_eval"],
                        if plots.fully_trained {
                            "\n\n![where to prune, fully trained](plots/where_to_prune_trained.svg)"
                        } else {
                            ""
                        },
                        fully_trained_table(f, w.num_replaced)
                    );
                    if let Some(r) = against_truth_reading(w, f) {
                        s += &format!("\n{r}\n");
                    }
                }
                s
            },
        ),
        paper::WHERE,
    );
    let rho = t.rho_sweep.as_ref().map_or_else(String::new, |r| {
        format!(
            "\n**Table 7c — when acceleration pays.** {}\n![rho sweep](plots/rho_sweep.svg)\n",
            rho_sweep_table(r, &t.solver)
        )
    });
    s += &section(
        "Table 7 — Fixed-point solvers on canonical problems, and the spectral radius of the trained maps",
        &format!(
            "{}\nρ(∂φ/∂z) at z* (power iteration on central-difference Jacobian-vector products, 30 iterations, GSM8K test sequences):\n\n{}{rho}",
            nonempty(&t.canonical, canonical_table),
            nonempty(&t.spectral, spectral_table)
        ),
        paper::SPECTRAL,
    );
    if let Some(c) = &t.curves {
        let plots = if plots.curves {
            "\n![learning curves, tokens](plots/curves_tokens.svg)\n![learning curves, compute](plots/curves_seconds.svg)\n"
        } else {
            ""
        };
        s += &section(
            "Table 8 — Learning curves (no counterpart in the paper)",
            &format!("{}{plots}", curves_table(c)),
            paper::CURVES,
        );
    }
    if let Some(seeds) = &t.seeds {
        s += &section(
            "Table 9 — Seeds of the headline rows (no counterpart in the paper)",
            &seeds_table(seeds),
            paper::SEEDS,
        );
    }
    if !t.collapse.is_empty() {
        s += &section(
            "Table 10 — Where a window collapses, diagnosed (no counterpart in the paper)",
            &format!(
                "The ELM trained at the main budget from each start under the two distillation recipes: `absolute` is the paper's \
                 MSE `mean((z* − h_{{l+M}})²)`, `teacher_mean_square` the same divided by the teacher's `mean(h_{{l+M}}²)` over the \
                 batch's tokens. RMS of the dense model's hidden state entering and leaving the window over the validation problems \
                 (the scale an absolute MSE carries); the distillation MSE itself (before either recipe scales it) at the first step and the last, CE at the \
                 first step that has one (λ_ce starts at 0) and the last; the held-out (validation) distillation MSE of the solved \
                 module after training; ρ(∂φ/∂z) at its fixed point over {} test sequences; answer NLL on the ablation tables' \
                 sample. The study's own recipe: `{}`.\n\n{}",
                t.limits["spectral_sequences"],
                t.limits["distill_scale"].as_str().unwrap_or("absolute"),
                collapse_table(&t.collapse)
            ),
            "none: the paper trains one window per model.",
        );
    }
    if let Some(g) = &t.grid {
        s += &section(
            "Table 11 — Is the equilibrium worth solving? Train-K × test-K (no counterpart in the paper)",
            &format!(
                "{}{}",
                if plots.grid {
                    "![train-K × test-K](plots/train_k_test_k.svg)\n\n"
                } else {
                    ""
                },
                grid_table(g)
            ),
            "the paper solves the module at inference and compares with no fixed loop of the same module; DEQ papers claim \
             that a solved module keeps improving with a tighter tolerance while a loop trained at K degrades past K.",
        );
    }
    s += &format!(
        "## Training throughput\n\nMeasured tokens/s of every training of this run (steps of this invocation; a cached training shows the run that \
         computed it). {}\n\n{}{}\n",
        t.bench.as_ref().map_or_else(
            || "No benchmark at this scale.".to_string(),
            |b| format!(
                "`elm bench` on this machine: sgemm {} GFLOP/s, dense prefill {} tok/s ({} GFLOP/s), decode batch 1 {} tok/s. A training token costs the teacher's forward over layers [0, l + M) (skipped on a teacher-cache hit), the solve and the taped backward of the module, and after half of training the back layers and LM head with their backward: expressed in dense-forward FLOPs it is a lower bound on the work done.",
                float(b.sgemm_gflop_s), float(b.prefill_tok_s), float(b.prefill_gflop_s), float(b.decode_b1_tok_s)
            )
        ),
        nonempty(&t.speed, |r| speed_table(r, &t.bench)),
        teacher_cache_savings(&t.speed)
    );
    s += paper::SCALES;
    s
}

/// What the shared teacher cache saved the run's trainings, summed over those whose records
/// say (`SpeedRow::teacher_saved_seconds`).
fn teacher_cache_savings(rows: &[SpeedRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let saved: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.teacher_saved_seconds)
        .collect();
    let unknown = rows.len() - saved.len();
    let total = if saved.is_empty() {
        "No training's record says what the cache saved it".to_string()
    } else {
        format!(
            "Over the {} trainings whose records say, the cache saved {} of teacher compute",
            saved.len(),
            seconds(saved.iter().sum())
        )
    };
    let missing = match unknown {
        0 => String::new(),
        n => format!(
            "; {n} {} \"{NOT_RECORDED}\": the training, or a cache file it read, was written before the seconds were recorded",
            if n == 1 { "says" } else { "say" }
        ),
    };
    format!(
        "\nThe trainings share one cache of the teacher's states (`elm train --teacher-cache`): a batch whose states an earlier \
         training computed over the same window is read, not recomputed, so a training's seconds above (and its \"own compute\" \
         in table 1) leave out the teacher work it read. \"teacher computed\" is what each training spent computing the states \
         it missed; \"cache saved\" is what the states it read cost the training that computed them, minus the time to read \
         them. {total}{missing}.\n"
    )
}

fn budget(v: &serde_json::Value) -> String {
    format!(
        "{} steps × batch {} × {} tokens",
        v["steps"], v["batch_size"], v["seq_len"]
    )
}

/// A section's text when `--only` left its table out (the smoke test looks for `Not computed`
/// to know that every table was filled).
const NOT_COMPUTED: &str = "Not computed in this run (`--only` selected other tables).\n";

/// `f` of a table's rows, or [`NOT_COMPUTED`] when the table has none.
fn nonempty<T>(rows: &[T], f: impl Fn(&[T]) -> String) -> String {
    if rows.is_empty() {
        NOT_COMPUTED.into()
    } else {
        f(rows)
    }
}
pub const HEADLINE_BEGIN: &str = "<!-- headline:begin -->";
pub const HEADLINE_END: &str = "<!-- headline:end -->";

/// The markers of a README block named `name`: `<!-- NAME:begin -->`, `<!-- NAME:end -->`
/// (`headline` gives [`HEADLINE_BEGIN`] / [`HEADLINE_END`]).
pub fn block_markers(name: &str) -> (String, String) {
    (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    )
}

/// The headline and table 1 of a run, for the repository README (`--readme`), between the
/// markers of the block `name` ([`block_markers`]; the main job's is `headline`, a second
/// model family's its own, e.g. `headline-gemma3`).
pub fn headline_block(t: &Tables, link: &str, name: &str) -> String {
    let (begin, end) = block_markers(name);
    format!(
        "{begin}\n*Written by `paper_repro --scale {}`: {} stages that took {} to compute on this machine \
         (this invocation computed {} of them); all tables: [{link}]({link}).*\n\n{}{}\n\
         Table 1 in short: \"ΔNLL vs ELM\" is each row's answer NLL minus the headline ELM's, paired over the \
         same test problems (above 0: the ELM is better). The whole table (parameters without embeddings, KV \
         bytes, training tokens and compute, strict exact match, the share cut off by the generation budget, \
         retention) and the controls are on [the run's page]({link}).\n{end}",
        t.scale,
        t.stages.len(),
        seconds(unique_stage_seconds(t)),
        t.stages.iter().filter(|s| !s.cached).count(),
        headline(t),
        nonempty(&t.main, main_table_short),
    )
}

/// Table 1 with what it pairs against, and its controls.
fn table_one(t: &Tables) -> String {
    let mut s = nonempty(&t.main, main_table);
    if let Some(c) = &t.controls {
        s += &format!(
            "\n\"ΔNLL vs ELM\" is each row's answer NLL minus that of `{}`, the ELM at the headline window, paired over the same test problems. \
             \"own compute\" is the row's wall seconds as run: a training that read the teacher's states from the shared cache did not \
             pay for them (the training throughput section says what the cache saved each training).\n\n{}",
            c.elm,
            controls_table(c)
        );
    }
    if let Some(f) = &t.full_test {
        let sample = t.limits["nll_eval"].as_u64().unwrap_or(0) as usize;
        s += &format!("\n{}", full_test_table(f, sample));
    }
    s
}

/// Compute seconds of the distinct stages of a run (a stage read twice counts once).
/// What table 11's stages took, for the page's header: the grid runs at `long`, and at the
/// other scales only by name, so a reader must be able to take it out of the total.
fn grid_seconds(t: &Tables) -> String {
    let Some(g) = t.grid.as_ref().filter(|g| !g.stage_keys.is_empty()) else {
        return String::new();
    };
    let keys: std::collections::BTreeSet<&String> = g.stage_keys.iter().collect();
    let mut seen = std::collections::BTreeSet::new();
    let total: f64 = t
        .stages
        .iter()
        .filter(|s| keys.contains(&s.key) && seen.insert(&s.key))
        .map(|s| s.seconds)
        .sum();
    if seen.is_empty() {
        // Kept from an earlier run (`--only` leaves the other tables' figures as they were).
        return "; table 11 (the train-K × test-K grid, which this scale runs only when asked for by name: \
                `--only grid`) is not part of this run: its figures are those of the run that last computed it"
            .to_string();
    }
    format!(
        ", of which {} for table 11's {} stages (the train-K × test-K grid{}; its trainings at K = 4 and 8 and of the ELM \
         are table 1's too)",
        seconds(total),
        seen.len(),
        if t.limits["grid"].is_null() {
            ", which this scale runs only when asked for by name: `--only grid`"
        } else {
            ""
        }
    )
}

fn unique_stage_seconds(t: &Tables) -> f64 {
    let mut seen = std::collections::BTreeSet::new();
    t.stages
        .iter()
        .filter(|s| seen.insert(&s.key))
        .map(|s| s.seconds)
        .sum()
}

/// `text` with its headline block replaced by `block` (`None` when it has none).
pub fn replace_headline_block(text: &str, block: &str) -> Option<String> {
    replace_block(text, HEADLINE_BEGIN, HEADLINE_END, block)
}

/// `text` with the span from `begin` to `end` (markers included) replaced by `block`.
pub fn replace_block(text: &str, begin: &str, end: &str, block: &str) -> Option<String> {
    let start = text.find(begin)?;
    let stop = text[start..].find(end)? + start + end.len();
    Some(format!("{}{block}{}", &text[..start], &text[stop..]))
}

/// Markers of the block a `long` run writes into the repository's README (the headline block
/// stays the main job's).
pub const LONG_BEGIN: &str = "<!-- long:begin -->";
pub const LONG_END: &str = "<!-- long:end -->";

/// The `long` run's block: its compute time, the curves' verdict and trends, the seeds'
/// summary; `link` is the run's README relative to the repository's.
pub fn long_block(t: &Tables, link: &str) -> String {
    let mut s = format!(
        "{LONG_BEGIN}\n*Written by `paper_repro --scale long`: {} stages that took {} to compute on this machine \
         (this invocation computed {} of them); all tables: [{link}]({link}).*\n\n",
        t.stages.len(),
        seconds(unique_stage_seconds(t)),
        t.stages.iter().filter(|s| !s.cached).count(),
    );
    if let Some(c) = &t.curves {
        s += &curves_table(c);
        s += "\n";
    }
    if let Some(seeds) = &t.seeds {
        s += &seeds_table(seeds);
        s += "\n";
    }
    s + LONG_END
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headline_block_is_replaced_in_place_and_only_there() {
        let text = format!("intro\n{HEADLINE_BEGIN}\nold\n{HEADLINE_END}\nrest\n");
        let new =
            replace_headline_block(&text, &format!("{HEADLINE_BEGIN}new{HEADLINE_END}")).unwrap();
        assert_eq!(
            new,
            format!("intro\n{HEADLINE_BEGIN}new{HEADLINE_END}\nrest\n")
        );
        assert!(replace_headline_block("no block", "x").is_none());
    }

    #[test]
    fn a_second_family_has_its_own_block_beside_the_headline() {
        let (b, e) = block_markers("headline");
        assert_eq!((b.as_str(), e.as_str()), (HEADLINE_BEGIN, HEADLINE_END));
        let (gb, ge) = block_markers("headline-gemma3");
        let text = format!("{HEADLINE_BEGIN}\nsmol\n{HEADLINE_END}\n{gb}\nold\n{ge}\n");
        let new = replace_block(&text, &gb, &ge, &format!("{gb}\ngemma\n{ge}")).unwrap();
        assert_eq!(
            new,
            format!("{HEADLINE_BEGIN}\nsmol\n{HEADLINE_END}\n{gb}\ngemma\n{ge}\n")
        );
    }
}
