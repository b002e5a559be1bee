//! Tables that read more than one run: the paper's claims against each family's figures, and
//! the two families claim by claim. Both are generated from the runs' `tables.json` (the main
//! job's, and `long/` and `gemma3/` beside it where they exist), never written by hand. A
//! writer like [`crate::readme`]: it reads [`Tables`] and returns Markdown.

use crate::markdown::{float, pct, signed, Table};
use crate::rows::{ControlKind, GradRow, Interval, SolverRow, MAIN_ELM_ROW};
use crate::table_markdown::{curves_rival, gap_by_budget, gap_sureness};
use crate::tables::Tables;
use elm::search::report::AgainstTruth;

/// One family's runs: its main run, and its `long` run where there is one.
pub struct Family<'a> {
    pub name: &'a str,
    pub main: &'a Tables,
    pub long: Option<&'a Tables>,
}

/// The headline ELM's table-1 row: the verdict's (window chosen on validation) where the run
/// has controls, else the study's default-window ELM.
fn headline_elm(t: &Tables) -> Option<&crate::rows::MainRow> {
    t.controls
        .as_ref()
        .and_then(|c| t.main.iter().find(|r| r.model == c.elm))
        .or_else(|| {
            t.same_window
                .as_ref()
                .and_then(|w| t.main.iter().find(|r| r.model == w.elm))
        })
        .or_else(|| t.main.iter().find(|r| r.model == MAIN_ELM_ROW))
}

/// GPPO read against the fully trained starts (table 6b): the family's `long` run's, else its
/// main run's.
fn gppo_against_truth(f: &Family<'_>) -> Option<AgainstTruth> {
    f.long
        .and_then(|l| l.where_to_prune.as_ref().zip(l.fully_trained.as_ref()))
        .or_else(|| {
            f.main
                .where_to_prune
                .as_ref()
                .zip(f.main.fully_trained.as_ref())
        })
        .and_then(|(w, ft)| elm::search::report::against_truth(w, &ft.validation_truth()))
}

/// Table 3's Anderson row with the largest saving over Picard.
fn best_anderson(t: &Tables) -> Option<&SolverRow> {
    t.solver
        .iter()
        .filter(|r| r.solver == "anderson")
        .max_by(|a, b| {
            a.compute_saved_vs_picard
                .total_cmp(&b.compute_saved_vs_picard)
        })
}

/// Table 4's SJFB and unrolled rows, when both ran.
fn sjfb_and_unroll(t: &Tables) -> Option<(&GradRow, &GradRow)> {
    let find = |p: &str| t.grad.iter().find(|r| r.rule.starts_with(p));
    find("SJFB").zip(find("unroll"))
}

/// A paired gap "X minus the ELM" (lower NLL is better) in words.
fn reading(i: &Interval) -> &'static str {
    if i.lo > 0.0 {
        "ELM better"
    } else if i.hi < 0.0 {
        "ELM worse"
    } else {
        "not separable"
    }
}

/// The claims the two families are compared on, each as "X minus the ELM" (answer NLL,
/// paired, test problems) where a run measured it.
fn family_claims(t: &Tables) -> Vec<(&'static str, Option<(Interval, String)>)> {
    let control = |kind: ControlKind| {
        t.controls.as_ref().and_then(|c| {
            c.rows.iter().find(|r| r.kind == kind).map(|r| {
                (
                    r.minus_elm,
                    format!("{} (layers {}–{})", r.control, c.layers.0, c.layers.1),
                )
            })
        })
    };
    // A fixed loop of the same module against the solved ELM at one window: the control where
    // the run has one, else the fixed-K ablation row against the study's ELM (same window).
    let fixed = control(ControlKind::FixedDepth).or_else(|| {
        t.main
            .iter()
            .find(|r| r.model.starts_with("ELM ablation: fixed K"))
            .and_then(|r| {
                r.delta_nll_vs_elm
                    .map(|d| (d, format!("{} against the study's ELM", r.model)))
            })
    });
    let dense = headline_elm(t).and_then(|e| {
        e.delta_nll.map(|d| {
            (
                Interval {
                    value: -d.value,
                    lo: -d.hi,
                    hi: -d.lo,
                },
                e.model.clone(),
            )
        })
    });
    vec![
        ("the LoRA-tuned dense model minus the ELM", dense),
        (
            "the best healed baseline minus the ELM, at the baseline's window, same budget",
            t.same_window.as_ref().map(|w| {
                (
                    w.delta_baseline_minus_elm,
                    format!("{} (layers {}–{})", w.baseline, w.layers.0, w.layers.1),
                )
            }),
        ),
        (
            "equal parameters (the best healed baseline removing M − 1 layers) minus the ELM",
            control(ControlKind::EqualParameters),
        ),
        (
            "a fixed loop of the same module (trained and tested at K) minus the solved ELM",
            fixed,
        ),
        (
            "the closest prior method (Relaxed Recursive Transformers) minus the ELM",
            control(ControlKind::PriorMethod),
        ),
    ]
}

/// The two families claim by claim: each family's paired gap and what it says, and whether
/// they agree (the same reading), disagree, or one did not measure it.
pub fn two_family_table(a: &Family<'_>, b: &Family<'_>) -> String {
    let mut t = Table::new(&[
        "claim (X minus the ELM; above 0: the ELM is better)",
        a.name,
        b.name,
        "families",
    ]);
    let (ca, cb) = (family_claims(a.main), family_claims(b.main));
    for ((claim, x), (_, y)) in ca.iter().zip(&cb) {
        let cell = |v: &Option<(Interval, String)>| match v {
            Some((i, what)) => format!("{} — {} ({what})", signed(i), reading(i)),
            None => "not run".to_string(),
        };
        let agree = match (x, y) {
            (Some((i, _)), Some((j, _))) if reading(i) == reading(j) => "agree",
            (Some(_), Some(_)) => "disagree",
            _ => "not comparable (one family did not run it)",
        };
        t.row(&[claim.to_string(), cell(x), cell(y), agree.to_string()]);
    }
    format!(
        "Generated from both runs' `tables.json` ({}: {} test problems; {}: {} test problems); each cell is that family's own \
         comparison at its own headline window and budget.\n\n{}",
        a.name,
        a.main.limits["nll_eval"],
        b.name,
        b.main.limits["nll_eval"],
        t.into_markdown()
    )
}

/// One claim of the paper: its figure, ours per family, and a verdict word with why.
struct Claim {
    claim: &'static str,
    paper: &'static str,
    ours: Vec<String>,
    verdict: String,
}

/// What a family says on the paper's claims (one cell per claim, in [`paper_claims_table`]'s
/// order).
fn ours(f: &Family<'_>) -> Vec<Option<String>> {
    let t = f.main;
    let dense = t.reference_row();
    let elm = headline_elm(t);
    let removed = dense.zip(elm).map(|(d, e)| {
        format!(
            "{} of the parameters ({} non-embedding), M = {} layers",
            pct(1.0 - e.params as f64 / d.params as f64),
            pct(1.0 - e.non_embedding_params as f64 / d.non_embedding_params as f64),
            t.limits["m"],
        )
    });
    let kv = t.kv.iter().find(|r| r.mode == "one-step").map(|r| {
        format!(
            "{} of the KV bytes saved at M = {} (one-step; multi-step {})",
            pct(1.0 - r.ratio_vs_dense),
            r.m,
            t.kv.iter()
                .find(|m| m.mode == "multi-step" && m.m == r.m)
                .map_or_else(|| "n/a".into(), |m| pct(1.0 - m.ratio_vs_dense)),
        )
    });
    let retention = elm.and_then(|e| {
        e.delta_nll.map(|d| {
            format!(
                "answer NLL {} nats/token above the tuned dense model; flexible EM {} against {} (RP {})",
                signed(&d),
                e.flexible_em.map_or_else(|| "n/a".into(), |i| float(i.value)),
                dense
                    .and_then(|d| d.flexible_em)
                    .map_or_else(|| "n/a".into(), |i| float(i.value)),
                e.rp_flexible.map_or_else(|| "n/a".into(), |i| float(i.value))
            )
        })
    });
    let baselines = t.same_window.as_ref().map(|w| {
        let mut s = format!(
            "best healed baseline minus the ELM {} at {} steps",
            signed(&w.delta_baseline_minus_elm),
            t.limits["main"]["steps"]
        );
        if let Some(c) = f.long.and_then(|l| l.curves.as_ref()) {
            if let Some((n, g)) = curves_rival(c).and_then(|r| gap_by_budget(c, r).last().copied())
            {
                s += &format!(", {} at {n} steps ({})", signed(&g), gap_sureness(&g));
            }
        }
        s
    });
    let anderson = best_anderson(t).map(|r| {
        format!(
            "at most {} fewer block evaluations than Picard (M = {}, δ = {})",
            pct(r.compute_saved_vs_picard),
            r.m,
            r.tol
        )
    });
    let decode = t.kv.iter().find(|r| r.mode == "one-step").map(|r| {
        format!(
            "{} layer evaluations per decoded token against the dense model's {} (M = {}, table 2)",
            float(r.layer_evals_per_token),
            // The dense model's layers: the kept ones plus the window.
            float(r.layer_evals_per_token - r.mean_iterations + r.m as f64),
            r.m
        )
    });
    let sjfb = {
        sjfb_and_unroll(t).map(|(s, u)| {
            format!(
                "{:.2}× the unrolled rule's time per step, {:.2}× its peak memory",
                s.seconds_per_step / u.seconds_per_step.max(1e-12),
                s.peak_rss_bytes as f64 / (u.peak_rss_bytes as f64).max(1.0)
            )
        })
    };
    let gppo = gppo_against_truth(f)
        .map(|a| {
            format!(
                "policy ρ with fully trained starts {}; choice {} after full training against {} for a random start",
                a.policy_spearman.map_or_else(|| "n/a".into(), |r| format!("{r:+.3}")),
                a.choice_nll.map_or_else(|| "n/a".into(), float),
                float(a.random_nll)
            )
        })
        .or_else(|| {
            t.where_to_prune.as_ref().and_then(|w| {
                w.gppo.as_ref().map(|g| {
                    format!(
                        "GPPO's choice ranks {} among the short-training enumeration's starts (no fully trained starts in this run)",
                        g.enum_rank
                    )
                })
            })
        });
    vec![
        removed, kv, retention, baselines, anderson, decode, sjfb, gppo,
    ]
}

/// The paper's claims: its figure, ours on each family, and a verdict word (`reproduced`, `not
/// at this scale`, `contradicted`, `not testable here`) with the reason, decided from the
/// first family's figures (the main study) and checked against the second's.
pub fn paper_claims_table(families: &[Family<'_>]) -> String {
    let per_family: Vec<Vec<Option<String>>> = families.iter().map(ours).collect();
    let main = families[0].main;
    let elm = headline_elm(main);
    let long_gap = families[0]
        .long
        .and_then(|l| l.curves.as_ref())
        .and_then(|c| curves_rival(c).and_then(|r| gap_by_budget(c, r).last().copied()));
    let verdicts: [String; 8] = [
        "reproduced (by construction: M of N layers leave)".into(),
        "reproduced ((N − M + 1)/N of the caches, as the paper counts)".into(),
        match elm.and_then(|e| e.delta_nll) {
            Some(d) if d.lo > 0.0 => {
                "not at this scale (exact match is near zero at 135M–270M, so RP is empty; the NLL gap to the tuned dense model is clear)".into()
            }
            _ => "not testable here (no exact-match signal)".into(),
        },
        match (main.same_window.as_ref(), long_gap) {
            (Some(w), Some((n, g))) if w.delta_baseline_minus_elm.lo > 0.0 && g.lo <= 0.0 => format!(
                "reproduced at the headline budget, not at the largest ({n} steps: {})",
                gap_sureness(&g)
            ),
            (Some(w), _) if w.delta_baseline_minus_elm.lo > 0.0 => "reproduced at the headline budget".into(),
            (Some(w), _) if w.delta_baseline_minus_elm.hi < 0.0 => "contradicted".into(),
            (Some(_), _) => "not at this scale (not separable)".into(),
            (None, _) => "not testable here".into(),
        },
        match best_anderson(main).map(|r| r.compute_saved_vs_picard) {
            Some(x) if x >= crate::paper::ANDERSON_SAVING => "reproduced".into(),
            Some(x) if x > 0.0 => format!(
                "not at this scale (a saving, but {} against {})",
                pct(x),
                pct(crate::paper::ANDERSON_SAVING)
            ),
            Some(_) => "contradicted (no saving here)".into(),
            None => "not testable here".into(),
        },
        "not testable here (the paper's decode figure is not available offline; ours is the work per token)".into(),
        match sjfb_and_unroll(main) {
            Some((s, u)) if s.seconds_per_step < u.seconds_per_step && s.peak_rss_bytes <= u.peak_rss_bytes => "reproduced (faster, no more memory)".into(),
            Some((s, u)) if s.seconds_per_step < u.seconds_per_step => "in part (faster; memory not lower at this size)".into(),
            Some(_) => "contradicted (not faster here)".into(),
            None => "not testable here".into(),
        },
        match gppo_against_truth(&families[0]).map(|a| a.choice_nll.map(|c| c < a.random_nll)) {
            Some(Some(false)) => "contradicted at this budget (its choice is no better than a random start)".into(),
            Some(Some(true)) => "reproduced (its choice beats a random start)".into(),
            Some(None) => "not testable here".into(),
            None => "not testable here (no fully trained starts in these runs)".into(),
        },
    ];
    let paper_figures = crate::paper::CLAIMS;
    let claims: Vec<Claim> = paper_figures
        .iter()
        .zip(verdicts)
        .enumerate()
        .map(|(i, ((claim, paper), verdict))| Claim {
            claim,
            paper,
            ours: per_family
                .iter()
                .map(|f| f[i].clone().unwrap_or_else(|| "not run".into()))
                .collect(),
            verdict,
        })
        .collect();
    let mut header = vec!["claim", "the paper"];
    header.extend(families.iter().map(|f| f.name));
    header.push("verdict (from the first family; the second's column beside it)");
    let mut t = Table::new(&header);
    for c in claims {
        let mut row = vec![c.claim.to_string(), c.paper.to_string()];
        row.extend(c.ours);
        row.push(c.verdict);
        t.row(&row);
    }
    t.into_markdown()
}

/// A family's name in the tables' headers: the model file without its format suffix.
fn family_name(t: &Tables) -> &str {
    // Runs before the model was recorded by file name hold a path.
    let file = t.model.rsplit('/').next().unwrap_or(&t.model);
    file.split(['.', ' ']).next().unwrap_or(file)
}

/// The sections of the main job's page that read several runs: the paper's claims (this
/// run, its `long` run, the second family), then the two families claim by claim. Empty when
/// no other run exists beside this one.
pub fn sections(main: &Tables, long: Option<&Tables>, second: Option<&Tables>) -> String {
    if long.is_none() && second.is_none() {
        return String::new();
    }
    let mut families = vec![Family {
        name: family_name(main),
        main,
        long,
    }];
    if let Some(g) = second {
        families.push(Family {
            name: family_name(g),
            main: g,
            long: None,
        });
    }
    let mut s = format!(
        "## The paper's claims, checked\n\nEach claim of the paper with its figure, ours on each family (this run{}{}), and a verdict \
         word: reproduced, not at this scale, contradicted, or not testable here, with why.\n\n{}\n",
        if long.is_some() { ", its `long` run" } else { "" },
        if second.is_some() { ", the second family's run" } else { "" },
        paper_claims_table(&families)
    );
    if families.len() == 2 {
        s += &format!(
            "## Two families, claim by claim\n\n{}\n",
            two_family_table(&families[0], &families[1])
        );
    }
    s
}
